"""tunefarm's tensor compiler: tensor expressions → schedules → loop IR → LLVM → native kernels."""

from . import expr
from .canonical import canonical_text, workload_key
from .errors import (ArgumentError, CompilerError, DTypeError, ExprError, KernelLoadError,
                     LoweringError, ScheduleError, TargetError)
from .expr import (cast, ceil, const, equal, erf, exp, floor, floordiv, floormod, gelu, if_then_else,
                   log, maximum, minimum, not_equal, power, select, sigmoid, sqrt, tanh)
from .expr import abs  # noqa: A004
from .lower import lower
from .schedule import Schedule, Stage, create_schedule
from .tensor import Tensor, compute, placeholder, reduce_axis
from .tensor import max, min, sum  # noqa: A004

__version__ = "0.1.0"
from .runtime import Kernel, TimingResult, build, load_kernel, set_num_threads  # noqa: E402
from .errors import KernelRuntimeError  # noqa: E402
from .target import Target  # noqa: E402
from .export import export_library  # noqa: E402
from .errors import ExportError  # noqa: E402
from .schedule_steps import apply_steps, steps_from_json, steps_to_json  # noqa: E402
