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

    def __post_init__(self):
        """Refuse tensors too large to address, however their shapes were derived: M = N = 2**40
        passes every per-parameter check and still makes a 2**80-element matmul output."""
        for t in self.tensors:
            if math.prod(t.shape) > MAX_ELEMENTS:
                raise ExprError(f"{self.name}: tensor {t.name} of shape {t.shape} has more than 2**60 "
                                "elements; kernels cannot address it")

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
#
# Every check accepts numpy scalars wherever a Python scalar is accepted and returns plain Python
# values: params are serialized to JSON by the tuner, so a numpy scalar must never reach them.

# Kernels address memory with int64 byte offsets: a tensor of 8-byte elements has at most 2**60.
MAX_ELEMENTS = 1 << 60


def is_integer(value) -> bool:
    """A Python or numpy integer; bools are not (True is an int in Python, never a size)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def as_items(value):
    """The elements of a tuple, list or 1-d numpy array as a tuple; None for anything else."""
    if isinstance(value, (tuple, list)) or (isinstance(value, np.ndarray) and value.ndim == 1):
        return tuple(value)
    return None


def check_int(op: str, name: str, value, minimum: int = 1) -> int:
    """An integer (Python or numpy, not a bool) in [minimum, MAX_ELEMENTS] as a Python int."""
    if not is_integer(value) or value < minimum:
        raise ExprError(f"{op}: {name} must be an integer >= {minimum}, got {value!r}")
    if value > MAX_ELEMENTS:
        raise ExprError(f"{op}: {name}={value} is too large; kernels address at most 2**60 elements")
    return int(value)


def check_bool(op: str, name: str, value) -> bool:
    """A flag must be a real bool: truthiness would take the string 'no' (or 'False') as True."""
    if not isinstance(value, (bool, np.bool_)):
        raise ExprError(f"{op}: {name} must be True or False, got {value!r}")
    return bool(value)


def _to_float(value) -> float:
    """`value` as a Python float; an int beyond the float range gives inf, not an OverflowError.

    A float32 (or float16) scalar becomes the shortest decimal that rounds to it, i.e. what the
    user typed: np.float32(1e-5) gives 1e-05, not 9.999999747378752e-06 (same kernels, but a
    different workload key and a surprising number in the params).
    """
    if isinstance(value, np.floating) and value.dtype.itemsize < 8:
        return float(str(value))
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _is_number(value) -> bool:
    """An int or float, Python or numpy; bools are not numbers here."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def check_float(op: str, name: str, value, positive: bool = False) -> float:
    """A finite real number as a Python float (NaN and inf are never a valid epsilon or scale)."""
    what = "a finite positive number" if positive else "a finite number"
    number = _to_float(value) if _is_number(value) else math.nan
    if not math.isfinite(number) or (positive and number <= 0):
        raise ExprError(f"{op}: {name} must be {what}, got {value!r}")
    return number


def check_choice(op: str, name: str, value, choices) -> str:
    """One of a few option strings (an epilogue name, ...)."""
    if not isinstance(value, str) or value not in choices:
        raise ExprError(f"{op}: {name} must be one of {', '.join(choices)}, got {value!r}")
    return str(value)


def check_fill(op: str, value, dtype: str):
    """A fill value (padding) as a Python scalar that `dtype` holds exactly.

    Integer dtypes need an integral value in range: a constant would otherwise wrap (1000 in int8
    is -24) or fail deep inside the compiler (NaN, inf). Float dtypes take any value, NaN and
    ±inf included, but not a finite one beyond the dtype's range (it would silently become inf).
    """
    if not _is_number(value):
        raise ExprError(f"{op}: value must be a number, got {value!r}")
    number = _to_float(value)
    if is_float(dtype):
        top = float(np.finfo(dtype).max)
        if (is_integer(value) or math.isfinite(number)) and not abs(number) <= top:
            raise ExprError(f"{op}: value {value!r} is not representable in {dtype} (finite values "
                            f"up to ±{top:.7g}); use a smaller value, or inf")
        return number
    lo, hi = int(np.iinfo(dtype).min), int(np.iinfo(dtype).max)
    if not (is_integer(value) or number.is_integer()) or not lo <= int(value) <= hi:
        raise ExprError(f"{op}: value {value!r} is not representable in {dtype}; "
                        f"use an integer in [{lo}, {hi}]")
    return int(value)


def check_shape(op: str, shape, name: str = "shape") -> tuple:
    """An int or a non-empty sequence of positive ints, with at most MAX_ELEMENTS elements."""
    dims = (shape,) if is_integer(shape) else as_items(shape)
    if not dims:
        raise ExprError(f"{op}: {name} must be a non-empty tuple of positive ints, got {shape!r}")
    dims = tuple(check_int(op, f"{name}[{d}]", s) for d, s in enumerate(dims))
    if math.prod(dims) > MAX_ELEMENTS:
        raise ExprError(f"{op}: {name} {dims} has more than 2**60 elements; kernels cannot address it")
    return dims


def check_pair(op: str, name: str, value, minimum: int = 1) -> tuple:
    """An int or a 2-sequence of ints (for height, width)."""
    pair = (value, value) if is_integer(value) else as_items(value)
    if pair is None or len(pair) != 2:
        raise ExprError(f"{op}: {name} must be an int or a pair of ints, got {value!r}")
    return tuple(check_int(op, f"{name}", v, minimum) for v in pair)


def check_padding(op: str, padding) -> tuple:
    """int, (ph, pw) or (top, left, bottom, right) -> (top, left, bottom, right)."""
    pads = (padding, padding) if is_integer(padding) else as_items(padding)
    if pads is None or len(pads) not in (2, 4):
        raise ExprError(f"{op}: padding must be an int, (ph, pw) or (top, left, bottom, right), got {padding!r}")
    vals = tuple(check_int(op, "padding", p, 0) for p in pads)
    return vals * 2 if len(vals) == 2 else vals


def check_axis(op: str, axis, ndim: int, name: str = "axis") -> int:
    """An axis in [-ndim, ndim), returned in [0, ndim)."""
    if not is_integer(axis):
        raise ExprError(f"{op}: {name} must be an integer, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ExprError(f"{op}: {name} {axis!r} out of range for a {ndim}-d tensor; use {-ndim}..{ndim - 1}")
    return int(axis) % ndim


def check_dtype_for(op: str, dtype, allowed, name: str = "dtype") -> str:
    """A dtype name, numpy dtype or numpy scalar type (np.float32) among `allowed`, as its name."""
    if isinstance(dtype, np.dtype) or (isinstance(dtype, type) and issubclass(dtype, np.generic)):
        dtype = np.dtype(dtype).name
    if not isinstance(dtype, str) or dtype not in allowed:
        raise ExprError(f"{op}: {name} {dtype!r} not supported; use one of {', '.join(allowed)}")
    return str(dtype)


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
