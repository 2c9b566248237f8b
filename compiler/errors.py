"""Exception types of the compiler.

Every failure a user can provoke with bad input raises one of these, with a message that names
the problem; nothing reaches LLVM or native code in an invalid state.
"""


class CompilerError(Exception):
    """Base class of every error the compiler raises on purpose."""


class DTypeError(CompilerError, TypeError):
    """An unsupported dtype or dtype combination in an expression."""


class ExprError(CompilerError, ValueError):
    """A malformed tensor expression (wrong number of indices, reduce in the wrong place, ...)."""


class DagFormatError(ExprError):
    """A compute definition stored as data (compiler.serialize) that is malformed; the message
    names the field (`tensors[2].body.args[0]: ...`)."""


class ScheduleError(CompilerError, ValueError):
    """A schedule primitive was called with arguments that make no sense for the stage."""


class TargetError(CompilerError, ValueError):
    """A target string that cannot be parsed or names an unknown triple/cpu."""


class ArgumentError(CompilerError, TypeError):
    """Arrays passed to a kernel do not match its argument spec (shape, dtype, layout)."""


class LoweringError(CompilerError):
    """The schedule is valid step by step but cannot be lowered as a whole."""


class KernelLoadError(CompilerError):
    """A serialized kernel could not be loaded (corrupt bytes, other target, missing symbol)."""


class KernelRuntimeError(CompilerError, RuntimeError):
    """A kernel reported a failure while running: its scratch memory could not be allocated, or
    an index read from data was out of range (its outputs must not be used then).

    `status` is the kernel's return code, a bit set (see compiler.codegen_llvm). For an index
    error, `check` is the compiler.index_checks.IndexCheck that fired (its site and valid range)
    and `value` the offending index; a model's runtime adds `node` and `op_type` (the ONNX
    node's name and type) and `call` (the failing step); `kernel_index`, which of the kernels
    timed together (runtime.measure_together) failed."""

    kernel_index: int | None = None

    def __init__(self, message: str, status: int = 0, *, check=None, value: int | None = None,
                 node: str | None = None, op_type: str | None = None, call: int | None = None):
        super().__init__(message)
        self.status = status
        self.check = check
        self.value = value
        self.node = node
        self.op_type = op_type
        self.call = call


class ExportError(CompilerError):
    """Kernels could not be exported as a shared library (no C compiler, link failure, bad names)."""
