"""Data movement operators: transpose and constant padding (also the pad stage of conv/pool)."""

from __future__ import annotations

import numpy as np

from .. import expr as E
from ..dtypes import is_float
from ..errors import ExprError
from ..tensor import compute, placeholder
from .base import NUMERIC, OpDef, check_dtype_for, check_int, check_shape


def pad_tensor(data, pad_before, pad_after, value=0.0, name="pad"):
    """A separate `pad` stage, so a schedule can inline or materialize it.

    Select evaluates both branches, so the read index is clamped into the input: the border
    value is chosen by the condition, never by an out-of-bounds load.
    """
    shape = data.shape
    if is_float(data.dtype):
        fill = E.const(float(value), data.dtype)
    else:
        if float(value) != int(value):
            raise ExprError(f"{name}: pad value {value!r} is not representable in {data.dtype}")
        fill = E.const(int(value), data.dtype)
    out_shape = tuple(s + b + a for s, b, a in zip(shape, pad_before, pad_after))

    def body(*idx):
        conds, src = [], []
        for i, s, b, a in zip(idx, shape, pad_before, pad_after):
            j = i - b if b else i
            if b:
                conds.append(i >= b)
                j = E.maximum(j, 0)
            if a:
                conds.append(i < b + s)
                j = E.minimum(j, s - 1)
            src.append(j)
        read = data[tuple(src)]
        if not conds:
            return read
        cond = conds[0]
        for c in conds[1:]:
            cond = cond & c
        return E.if_then_else(cond, read, fill)

    return compute(out_shape, body, name=name, tag="pad")


def _norm_pads(op, pads, ndim, what):
    if isinstance(pads, int) and not isinstance(pads, bool):
        pads = (pads,) * ndim
    if not isinstance(pads, (tuple, list)) or len(pads) != ndim:
        raise ExprError(f"{op}: {what} needs {ndim} non-negative ints, got {pads!r}")
    return tuple(check_int(op, what, p, 0) for p in pads)


def pad(shape, pad_before, pad_after, value=0.0, dtype="float32") -> OpDef:
    """Constant padding of an N-d tensor (numpy.pad with mode='constant')."""
    op = "pad"
    shape = check_shape(op, shape)
    dtype = check_dtype_for(op, dtype, NUMERIC)
    before = _norm_pads(op, pad_before, len(shape), "pad_before")
    after = _norm_pads(op, pad_after, len(shape), "pad_after")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ExprError(f"{op}: value must be a number, got {value!r}")
    data = placeholder(shape, dtype, "data")
    out = pad_tensor(data, before, after, value)

    def reference(x):
        return np.pad(x, list(zip(before, after)), mode="constant", constant_values=value).astype(dtype)

    return OpDef(op, [data], out, dict(shape=shape, pad_before=before, pad_after=after, value=value, dtype=dtype),
                 flops=0, reference=reference)


def transpose(shape, axes=None, dtype="float32") -> OpDef:
    """out = numpy.transpose(x, axes); axes=None reverses them."""
    op = "transpose"
    shape = check_shape(op, shape)
    dtype = check_dtype_for(op, dtype, NUMERIC)
    nd = len(shape)
    axes = tuple(reversed(range(nd))) if axes is None else tuple(axes)
    valid = all(isinstance(a, int) and not isinstance(a, bool) and -nd <= a < nd for a in axes)
    if not valid or sorted(a % nd for a in axes) != list(range(nd)):
        raise ExprError(f"{op}: axes {axes!r} is not a permutation of 0..{nd - 1}")
    axes = tuple(a % nd for a in axes)
    data = placeholder(shape, dtype, "data")
    out_shape = tuple(shape[a] for a in axes)

    def body(*idx):
        src = [None] * nd
        for i, a in zip(idx, axes):
            src[a] = i
        return data[tuple(src)]

    out = compute(out_shape, body, name="transpose", tag="injective")
    return OpDef(op, [data], out, dict(shape=shape, axes=axes, dtype=dtype), flops=0,
                 reference=lambda x: np.transpose(x, axes).copy())
