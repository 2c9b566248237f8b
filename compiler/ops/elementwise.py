"""Elementwise operators: broadcasting add/mul, relu, gelu, bias_add."""

from __future__ import annotations

import numpy as np

from .. import expr as E
from ..dtypes import is_float
from ..errors import ExprError
from ..tensor import compute, placeholder
from .base import FLOAT, NUMERIC, OpDef, check_axis, check_dtype_for, check_shape, np_gelu


def broadcast_shape(op, shape_a, shape_b) -> tuple:
    try:
        return tuple(int(s) for s in np.broadcast_shapes(shape_a, shape_b))
    except ValueError:
        raise ExprError(f"{op}: shapes {shape_a} and {shape_b} cannot be broadcast together") from None


def broadcast_read(t, out_idx):
    """Read `t` at the numpy-broadcast position of output index `out_idx` (size-1 dims read 0)."""
    lead = len(out_idx) - t.ndim
    return t[tuple(0 if s == 1 else out_idx[lead + d] for d, s in enumerate(t.shape))]


def _binary(op, fn, np_fn, shape_a, shape_b, dtype):
    shape_a, shape_b = check_shape(op, shape_a, "shape_a"), check_shape(op, shape_b, "shape_b")
    dtype = check_dtype_for(op, dtype, NUMERIC)
    out_shape = broadcast_shape(op, shape_a, shape_b)
    a, b = placeholder(shape_a, dtype, "A"), placeholder(shape_b, dtype, "B")
    out = compute(out_shape, lambda *i: fn(broadcast_read(a, i), broadcast_read(b, i)), name=op,
                  tag="broadcast" if shape_a != shape_b else "elemwise")

    def reference(x, y):
        return np_fn(x, y).astype(dtype)

    return OpDef(op, [a, b], out, dict(shape_a=shape_a, shape_b=shape_b, dtype=dtype),
                 int(np.prod(out_shape)), reference)


def add(shape_a, shape_b=None, dtype="float32") -> OpDef:
    """A + B with numpy broadcasting (shape_b defaults to shape_a)."""
    return _binary("add", lambda x, y: x + y, np.add, shape_a, shape_a if shape_b is None else shape_b, dtype)


def mul(shape_a, shape_b=None, dtype="float32") -> OpDef:
    """A * B with numpy broadcasting (shape_b defaults to shape_a)."""
    return _binary("mul", lambda x, y: x * y, np.multiply, shape_a,
                   shape_a if shape_b is None else shape_b, dtype)


def _unary(op, fn, np_fn, shape, dtype, allowed):
    shape = check_shape(op, shape)
    dtype = check_dtype_for(op, dtype, allowed)
    x = placeholder(shape, dtype, "data")
    out = compute(shape, lambda *i: fn(x[i]), name=op, tag="elemwise")
    return OpDef(op, [x], out, dict(shape=shape, dtype=dtype), int(np.prod(shape)),
                 lambda a: np_fn(a).astype(dtype))


def relu(shape, dtype="float32") -> OpDef:
    zero = 0.0 if is_float(str(dtype)) else 0
    return _unary("relu", lambda v: E.maximum(v, zero), lambda a: np.maximum(a, 0), shape, dtype, NUMERIC)


def gelu(shape, dtype="float32") -> OpDef:
    """Exact GELU, 0.5·x·(1 + erf(x/√2))."""
    return _unary("gelu", E.gelu, np_gelu, shape, dtype, FLOAT)


def bias_add(shape, axis=1, dtype="float32") -> OpDef:
    """out = data + bias broadcast along `axis` (bias: [shape[axis]]), e.g. after conv2d_nchw."""
    op = "bias_add"
    shape = check_shape(op, shape)
    axis = check_axis(op, axis, len(shape))
    dtype = check_dtype_for(op, dtype, NUMERIC)
    x = placeholder(shape, dtype, "data")
    bias = placeholder((shape[axis],), dtype, "bias")
    out = compute(shape, lambda *i: x[i] + bias[i[axis]], name=op, tag="broadcast")

    def reference(a, b):
        bshape = [1] * len(shape)
        bshape[axis] = shape[axis]
        return (a + b.reshape(bshape)).astype(dtype)

    return OpDef(op, [x, bias], out, dict(shape=shape, axis=axis, dtype=dtype), int(np.prod(shape)), reference)
