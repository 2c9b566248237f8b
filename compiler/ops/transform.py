"""Data movement operators: transpose and constant padding (also the pad stage of conv/pool)."""

from __future__ import annotations

import numpy as np

from .. import expr as E
from ..errors import ExprError
from ..tensor import compute, placeholder
from .base import NUMERIC, OpDef, as_items, check_dtype_for, check_fill, check_int, check_shape, is_integer


def pad_tensor(data, pad_before, pad_after, value=0.0, name="pad"):
    """A separate `pad` stage, so a schedule can inline or materialize it.

    Select evaluates both branches, so the read index is clamped into the input: the border
    value is chosen by the condition, never by an out-of-bounds load. `value` must be one the
    dtype holds exactly (see check_fill).
    """
    shape = data.shape
    fill = E.const(check_fill(name, value, data.dtype), data.dtype)
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
    """An int for every axis, or one per axis."""
    items = (pads,) * ndim if is_integer(pads) else as_items(pads)
    if items is None or len(items) != ndim:
        raise ExprError(f"{op}: {what} needs {ndim} non-negative ints, got {pads!r}")
    return tuple(check_int(op, what, p, 0) for p in items)


def pad(shape, pad_before, pad_after, value=0.0, dtype="float32") -> OpDef:
    """Constant padding of an N-d tensor (numpy.pad with mode='constant')."""
    op = "pad"
    shape = check_shape(op, shape)
    dtype = check_dtype_for(op, dtype, NUMERIC)
    before = _norm_pads(op, pad_before, len(shape), "pad_before")
    after = _norm_pads(op, pad_after, len(shape), "pad_after")
    value = check_fill(op, value, dtype)
    data = placeholder(shape, dtype, "data")
    out = pad_tensor(data, before, after, value)

    def reference(x):
        return np.pad(x, list(zip(before, after)), mode="constant", constant_values=value).astype(dtype)

    return OpDef(op, [data], out, dict(shape=shape, pad_before=before, pad_after=after, value=value, dtype=dtype),
                 flops=0, reference=reference)


def _permutation(op, axes, nd) -> tuple:
    """None (reverse) or a permutation of the axes, negative ones allowed -> tuple in [0, nd)."""
    if axes is None:
        return tuple(reversed(range(nd)))
    items = as_items(axes)
    if items is None or not all(is_integer(a) and -nd <= a < nd for a in items) \
            or sorted(int(a) % nd for a in items) != list(range(nd)):
        raise ExprError(f"{op}: axes {axes!r} is not a permutation of 0..{nd - 1}; "
                        f"give each of the {nd} axes once, e.g. {tuple(reversed(range(nd)))}")
    return tuple(int(a) % nd for a in items)


def transpose(shape, axes=None, dtype="float32") -> OpDef:
    """out = numpy.transpose(x, axes); axes=None reverses them."""
    op = "transpose"
    shape = check_shape(op, shape)
    dtype = check_dtype_for(op, dtype, NUMERIC)
    nd = len(shape)
    axes = _permutation(op, axes, nd)
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
