"""What an operator definition is, parameter checks shared by all operators, and test inputs.

An operator constructor takes concrete shapes/options and returns an `OpDef`: the placeholders,
the output tensor of its compute DAG (no schedule), and a numpy reference for checking kernels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..canonical import workload_key
from ..dtypes import ALL_DTYPES, is_float, is_int
from ..errors import ExprError
from ..tensor import Tensor


class UnknownOpError(ExprError, KeyError):
    """An operator name that is not in the inventory (a KeyError for lookups, a ValueError for users)."""

    def __str__(self):  # KeyError would print the message quoted
        return str(self.args[0]) if self.args else ""


@dataclass
class OpDef:
    """One operator instance: compute DAG + numpy reference + display data."""

    name: str
    inputs: list
    output: Tensor
    params: dict
    flops: int
    reference: Callable = field(repr=False)

    @property
    def tensors(self) -> list:
        """Kernel arguments in order: the inputs, then the output."""
        return [*self.inputs, self.output]

    def __iter__(self):
        """Allows `A, B, C = matmul(...)` and `*ins, out = op`."""
        return iter(self.tensors)

    def workload_key(self) -> str:
        return workload_key([self.output])


# ----------------------------------------------------------------------------- parameter checks

def check_int(op: str, name: str, value, minimum: int = 1) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ExprError(f"{op}: {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_shape(op: str, shape, name: str = "shape") -> tuple:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)) or not shape:
        raise ExprError(f"{op}: {name} must be a non-empty tuple of positive ints, got {shape!r}")
    return tuple(check_int(op, f"{name}[{d}]", s) for d, s in enumerate(shape))


def check_pair(op: str, name: str, value, minimum: int = 1) -> tuple:
    """An int or a 2-sequence of ints (for height, width)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (value, value)
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ExprError(f"{op}: {name} must be an int or a pair of ints, got {value!r}")
    return tuple(check_int(op, f"{name}", v, minimum) for v in value)


def check_padding(op: str, padding) -> tuple:
    """int, (ph, pw) or (top, left, bottom, right) -> (top, left, bottom, right)."""
    if isinstance(padding, (int, np.integer)) and not isinstance(padding, bool):
        padding = (padding, padding)
    if not isinstance(padding, (tuple, list)) or len(padding) not in (2, 4):
        raise ExprError(f"{op}: padding must be an int, (ph, pw) or (top, left, bottom, right), got {padding!r}")
    vals = tuple(check_int(op, "padding", p, 0) for p in padding)
    return vals * 2 if len(vals) == 2 else vals


def check_axis(op: str, axis, ndim: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -ndim <= axis < ndim:
        raise ExprError(f"{op}: axis {axis!r} out of range for a {ndim}-d tensor")
    return int(axis) % ndim


def check_dtype_for(op: str, dtype, allowed) -> str:
    name = str(getattr(dtype, "name", dtype))
    if name not in allowed:
        raise ExprError(f"{op}: dtype {name!r} not supported; use one of {', '.join(allowed)}")
    return name


FLOAT = ("float32", "float64")
NUMERIC = ("float32", "float64", "int8", "int32", "int64")


def lowest(dtype: str):
    """The smallest finite value of a dtype (padding value that max ignores)."""
    return float(np.finfo(dtype).min) if is_float(dtype) else int(np.iinfo(dtype).min)


def conv_out_size(op: str, what: str, size: int, kernel: int, stride: int, pad: int, dilation: int = 1) -> int:
    eff = (kernel - 1) * dilation + 1
    if size + pad < eff:
        raise ExprError(f"{op}: {what} kernel extent {eff} (kernel {kernel}, dilation {dilation}) "
                        f"is larger than the padded input {size + pad}")
    return (size + pad - eff) // stride + 1


def window_index(o, s, r, d):
    """Input coordinate o*s + r*d, without multiplications by 1 (simpler index expressions)."""
    r = r.var
    return (o * s if s != 1 else o) + (r * d if d != 1 else r)


def np_window(xp, axis_h, ry, rx, dil, stride, OH, OW):
    """The [.., OH, OW ..] slice of the padded input that kernel tap (ry, rx) multiplies."""
    ys, xs = ry * dil[0], rx * dil[1]
    sl = [slice(None)] * xp.ndim
    sl[axis_h] = slice(ys, ys + (OH - 1) * stride[0] + 1, stride[0])
    sl[axis_h + 1] = slice(xs, xs + (OW - 1) * stride[1] + 1, stride[1])
    return xp[tuple(sl)]


# ----------------------------------------------------------------------------- test inputs

def random_inputs(opdef: OpDef, rng: np.random.Generator) -> list:
    """Random non-zero arrays for each input (zeros hide indexing bugs): floats in ±[0.1, 1], ints in ±[1, 4]."""
    out = []
    for t in opdef.inputs:
        sign = rng.choice(np.array([-1, 1]), size=t.shape)
        if is_float(t.dtype):
            arr = sign * rng.uniform(0.1, 1.0, size=t.shape)
        elif is_int(t.dtype):
            arr = sign * rng.integers(1, 5, size=t.shape)
        elif t.dtype == "bool":
            arr = rng.integers(0, 2, size=t.shape)
        else:  # pragma: no cover - dtypes are validated at construction
            raise ExprError(f"random_inputs: unexpected dtype {t.dtype} (known: {ALL_DTYPES})")
        out.append(np.ascontiguousarray(arr.astype(t.dtype)))
    return out


def np_gelu(x: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU in float64; numpy has no erf and scipy is not a dependency."""
    x = np.asarray(x, np.float64)
    return 0.5 * x * (1.0 + np.vectorize(math.erf, otypes=[np.float64])(x / math.sqrt(2.0)))
