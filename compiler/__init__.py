"""tunefarm's tensor compiler: tensor expressions → schedules → loop IR → LLVM → native kernels.

The pure-Python front end (expressions, tensors, schedules, lowering, targets) is imported here;
the names that need numpy or llvmlite (build, Kernel, export_library, ...) are loaded on first
use (PEP 562), so `import compiler.target_string` — the farm's tracker reads target strings with
it — runs this file without pulling in either. (The front end stays eager because the function
`compiler.lower` shares its name with the submodule `compiler.lower`: importing that submodule
first would leave the module where `C.lower(...)` expects the function.)
"""

from importlib import import_module

from . import expr
from .canonical import canonical_text, workload_key
from .errors import (
    ArgumentError,
    CompilerError,
    DTypeError,
    ExportError,
    ExprError,
    KernelLoadError,
    KernelRuntimeError,
    LoweringError,
    ScheduleError,
    TargetError,
)
from .expr import (
    abs,  # noqa: A004
    cast,
    ceil,
    checked_index,
    const,
    equal,
    erf,
    exp,
    floor,
    floordiv,
    floormod,
    gelu,
    if_then_else,
    log,
    maximum,
    minimum,
    not_equal,
    power,
    select,
    sigmoid,
    sqrt,
    tanh,
)
from .lower import lower
from .schedule import Schedule, Stage, create_schedule
from .schedule_steps import apply_steps, steps_from_json, steps_to_json
from .target import Target
from .tensor import Tensor, compute, max, min, placeholder, reduce_axis, sum  # noqa: A004

__version__ = "0.1.0"

# name -> the submodule that defines it, imported on first access
_LAZY = {"Kernel": "runtime", "TimingResult": "runtime", "build": "runtime", "load_kernel": "runtime",
         "set_num_threads": "runtime", "export_library": "export", "aligned_empty": "buffers"}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "expr", "canonical_text", "workload_key",
    "ArgumentError", "CompilerError", "DTypeError", "ExportError", "ExprError", "KernelLoadError",
    "KernelRuntimeError", "LoweringError", "ScheduleError", "TargetError",
    "abs", "cast", "ceil", "checked_index", "const", "equal", "erf", "exp", "floor", "floordiv", "floormod", "gelu",
    "if_then_else", "log", "maximum", "minimum", "not_equal", "power", "select", "sigmoid", "sqrt", "tanh",
    "lower", "Schedule", "Stage", "create_schedule", "apply_steps", "steps_from_json", "steps_to_json",
    "Target", "Tensor", "compute", "placeholder", "reduce_axis", "max", "min", "sum",
    *_LAZY,
]
