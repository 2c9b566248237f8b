"""Elementwise operators: broadcasting add/mul, relu, gelu, bias_add; the computes are the tensor
functions of functions.py."""

from __future__ import annotations

import numpy as np

from ..tensor import placeholder
from . import functions as fn
from .base import FLOAT, NUMERIC, OpDef, check_axis, check_dtype_for, check_shape, np_gelu
from .functions import broadcast_shape


def _binary(op, tensor_fn, np_fn, shape_a, shape_b, dtype):
    shape_a, shape_b = check_shape(op, shape_a, "shape_a"), check_shape(op, shape_b, "shape_b")
    dtype = check_dtype_for(op, dtype, NUMERIC)
    out_shape = broadcast_shape(op, shape_a, shape_b)
    a, b = placeholder(shape_a, dtype, "A"), placeholder(shape_b, dtype, "B")
    out = tensor_fn(a, b)

    def reference(x, y):
        return np_fn(x, y).astype(dtype)

    return OpDef(op, [a, b], out, dict(shape_a=shape_a, shape_b=shape_b, dtype=dtype),
                 int(np.prod(out_shape)), reference)


def add(shape_a, shape_b=None, dtype="float32") -> OpDef:
    """A + B with numpy broadcasting (shape_b defaults to shape_a)."""
    return _binary("add", fn.add, np.add, shape_a, shape_a if shape_b is None else shape_b, dtype)


def mul(shape_a, shape_b=None, dtype="float32") -> OpDef:
    """A * B with numpy broadcasting (shape_b defaults to shape_a)."""
    return _binary("mul", fn.multiply, np.multiply, shape_a, shape_a if shape_b is None else shape_b, dtype)


def _unary(op, tensor_fn, np_fn, shape, dtype, allowed):
    shape = check_shape(op, shape)
    dtype = check_dtype_for(op, dtype, allowed)
    x = placeholder(shape, dtype, "data")
    return OpDef(op, [x], tensor_fn(x), dict(shape=shape, dtype=dtype), int(np.prod(shape)),
                 lambda a: np_fn(a).astype(dtype))


def relu(shape, dtype="float32") -> OpDef:
    return _unary("relu", fn.relu, lambda a: np.maximum(a, 0), shape, dtype, NUMERIC)


def gelu(shape, dtype="float32") -> OpDef:
    """Exact GELU, 0.5·x·(1 + erf(x/√2))."""
    return _unary("gelu", fn.gelu, np_gelu, shape, dtype, FLOAT)


def bias_add(shape, axis=1, dtype="float32") -> OpDef:
    """out = data + bias broadcast along `axis` (bias: [shape[axis]]), e.g. after conv2d_nchw."""
    op = "bias_add"
    shape = check_shape(op, shape)
    axis = check_axis(op, axis, len(shape))
    dtype = check_dtype_for(op, dtype, NUMERIC)
    x = placeholder(shape, dtype, "data")
    bias = placeholder((shape[axis],), dtype, "bias")
    out = fn.bias_add(x, bias, axis)

    def reference(a, b):
        bshape = [1] * len(shape)
        bshape[axis] = shape[axis]
        return (a + b.reshape(bshape)).astype(dtype)

    return OpDef(op, [x, bias], out, dict(shape=shape, axis=axis, dtype=dtype), int(np.prod(shape)), reference)
