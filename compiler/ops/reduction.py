"""Reductions over one or more axes: reduce_sum, reduce_max, reduce_min."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..dtypes import is_float
from ..errors import ExprError
from ..expr import Expr
from ..tensor import compute, placeholder, reduce_axis
from ..tensor import max as te_max
from ..tensor import min as te_min
from ..tensor import sum as te_sum
from .base import NUMERIC, OpDef, as_items, check_axis, check_bool, check_dtype_for, check_shape, is_integer

# kind -> (the tensor language's reduction, numpy's)
_COMBINERS: dict[str, tuple[Callable[..., Expr], Callable[..., Any]]] = {
    "sum": (te_sum, np.sum), "max": (te_max, np.max), "min": (te_min, np.min)}


def _reduce(kind, shape, axis, keepdims, dtype) -> OpDef:
    op = f"reduce_{kind}"
    shape = check_shape(op, shape)
    dtype = check_dtype_for(op, dtype, NUMERIC)
    keepdims = check_bool(op, "keepdims", keepdims)
    nd = len(shape)
    axes = _reduced_axes(op, axis, nd)
    keep = [d for d in range(nd) if d not in axes]
    if keepdims:
        out_shape = tuple(1 if d in axes else shape[d] for d in range(nd))
    else:
        # A full reduction gives shape (1,), not a 0-d tensor: kernels take array arguments.
        out_shape = tuple(shape[d] for d in keep) or (1,)
    data = placeholder(shape, dtype, "data")
    raxes = {d: reduce_axis(shape[d], f"r{d}") for d in axes}
    te_fn, np_fn = _COMBINERS[kind]

    def body(*idx):
        if keepdims:
            src = [raxes[d] if d in raxes else idx[d] for d in range(nd)]
        else:
            pos = dict(zip(keep, idx))
            src = [raxes[d] if d in raxes else pos[d] for d in range(nd)]
        return te_fn(data[tuple(src)], axis=list(raxes.values()))

    out = compute(out_shape, body, name=op, tag=op)

    def reference(x):
        if kind == "sum" and is_float(dtype):  # float64 accumulation
            r = np.sum(x.astype(np.float64), axis=axes)
        elif kind == "sum":  # integer sums wrap in the dtype, like the kernel does
            r = np.sum(x, axis=axes, dtype=dtype)
        else:
            r = np_fn(x, axis=axes)
        return np.asarray(r).astype(dtype).reshape(out_shape)

    params = dict(shape=shape, axis=axes, keepdims=keepdims, dtype=dtype)
    return OpDef(op, [data], out, params, int(np.prod(shape)), reference)


def _reduced_axes(op, axis, nd) -> tuple:
    """None (all axes), an axis, or a sequence of distinct axes -> sorted tuple in [0, nd)."""
    if axis is None:
        return tuple(range(nd))
    raw = (axis,) if is_integer(axis) else as_items(axis)
    if raw is None:
        raise ExprError(f"{op}: axis must be an int, a tuple of ints or None, got {axis!r}")
    axes = tuple(sorted(check_axis(op, a, nd) for a in raw))
    if not axes or len(set(axes)) != len(axes):
        raise ExprError(f"{op}: axis {axis!r} must name distinct axes (at least one)")
    return axes


def reduce_sum(shape, axis=None, keepdims=False, dtype="float32") -> OpDef:
    """Sum over `axis` (int, tuple, or None for all axes)."""
    return _reduce("sum", shape, axis, keepdims, dtype)


def reduce_max(shape, axis=None, keepdims=False, dtype="float32") -> OpDef:
    return _reduce("max", shape, axis, keepdims, dtype)


def reduce_min(shape, axis=None, keepdims=False, dtype="float32") -> OpDef:
    return _reduce("min", shape, axis, keepdims, dtype)
