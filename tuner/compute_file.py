"""A compute defined in a Python file: what `tunefarm tune --compute FILE.py` tunes.

The file is the user's own script on their own machine, so it is executed here, in this process,
as `python FILE.py` would run it (its directory is importable while it runs), except that
`__name__` is "__tunefarm_compute__": an `if __name__ == "__main__":` block does not run. It
must define a function `workload()` taking no arguments and returning one of

- the output Tensor: the kernel's arguments are the placeholders it reads, in topological order;
- a list [input, ..., output] of Tensors, which fixes the order of the kernel's arguments (the
  convention of TVM's auto_scheduler workloads);
- an OpDef: an inventory operator (`get_op("conv2d_bias_relu", ...)`) stays that operator, with
  its default schedule and templates; another OpDef gives a workload named after it.

    import compiler as C
    from compiler.ops.functions import bias_add, conv2d_nchw

    def workload():
        x = C.placeholder((1, 64, 56, 56), "float32", "x")
        w = C.placeholder((64, 64, 3, 3), "float32", "w")
        b = C.placeholder((64,), "float32", "b")
        y = bias_add(conv2d_nchw(x, w, padding=1), b, activation="relu", name="conv_block")
        return [x, w, b, y]

A workload returned as tensors is named after the file (`conv_block.py` → "conv_block"). What is
stored and sent to build processes is the DAG's JSON definition (compiler.serialize): nothing of
the file is needed after this call.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

from compiler.ops import INVENTORY, OpDef
from compiler.tensor import Tensor

from .workload import Workload, WorkloadError

RUN_NAME = "__tunefarm_compute__"
EXPECTED = "the output Tensor, a list [input, ..., output] of Tensors, or an OpDef"


def load_compute_file(path) -> Workload:
    """The workload the compute file at `path` defines; WorkloadError (naming the file, and the
    line where there is one) when it cannot be read, does not compile, raises, or defines
    nothing usable."""
    path = Path(path)
    try:
        source = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise WorkloadError(f"cannot read compute file {path}: {getattr(e, 'strerror', None) or e}") from None
    try:
        code = compile(source, str(path), "exec")
    except SyntaxError as e:
        raise WorkloadError(f"{path}:{e.lineno}: syntax error: {e.msg}") from None
    namespace = {"__name__": RUN_NAME, "__file__": str(path)}
    _run(path, "running the file", lambda: exec(code, namespace))
    fn = namespace.get("workload")
    if not callable(fn):
        raise WorkloadError(f"{path} defines no function workload(); define `def workload():` returning "
                            f"{EXPECTED}")
    return _workload(path, _run(path, "workload()", fn))


def _run(path: Path, what: str, fn):
    """fn() with the file's directory importable; what it raises becomes a WorkloadError that
    names the innermost line of the file on the way to the error."""
    folder = str(path.parent.resolve())
    sys.path.insert(0, folder)
    try:
        return fn()
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's code may raise anything
        lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == str(path)]
        where = f"{path}:{lines[-1]}" if lines else str(path)
        raise WorkloadError(f"{where}: {what} raised {type(e).__name__}: {e}") from None
    finally:
        if folder in sys.path:  # unless the file took it off itself
            sys.path.remove(folder)


def _workload(path: Path, result) -> Workload:
    inputs: list[Tensor] | None
    output: OpDef | Tensor
    name: str | None
    if isinstance(result, OpDef):
        inputs, output, name = None, result, None
    elif isinstance(result, Tensor):
        inputs, output, name = None, result, path.stem
    elif isinstance(result, (list, tuple)) and result and all(isinstance(t, Tensor) for t in result):
        *inputs, output = result
        name = path.stem
    else:
        raise WorkloadError(f"{path}: workload() returned {type(result).__name__}; expected {EXPECTED}")
    if name in INVENTORY:
        raise WorkloadError(f"{path}: the workload is named after the file, and {name!r} is an inventory "
                            "operator; rename the file")
    try:
        return Workload.from_compute(output, inputs or None, name)
    except WorkloadError as e:
        raise WorkloadError(f"{path}: {e}") from None


__all__ = ["load_compute_file"]
