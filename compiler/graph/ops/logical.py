"""Boolean operators: And, Or, Xor on bool tensors (broadcasting), and the float tests IsNaN and
IsInf, which give bool.

Exported attention masks are built from them at run time (the dynamo exporter writes the
padding mask as And of a causal and a padding mask, and guards Softmax's fully masked rows
with IsNaN), so they are kernels like any elementwise node and fuse with their neighbours
(Where, Cast). Not lives with Cast in elementwise.py.
"""

from __future__ import annotations

import math

import numpy as np

from ... import expr as E
from ..errors import ShapeError
from .base import FLOATS, Kind, Lazy, broadcast, broadcast_shapes, register


def _bool_infer(node, ins, opset):
    dtypes = [v.dtype for v in ins]
    if any(d != "bool" for d in dtypes):
        raise ShapeError(f"{node.op_type} node {node.name!r}: needs bool inputs, got {dtypes}")
    return [(broadcast_shapes(node, *[v.shape for v in ins]), "bool")]


def _xor(a, b):
    return E.not_equal(a, b)


LOGICAL = {"And": (lambda a, b: a & b, np.logical_and),
           "Or": (lambda a, b: a | b, np.logical_or),
           "Xor": (_xor, np.logical_xor)}


def _binary(op_type):
    combine, np_combine = LOGICAL[op_type]

    def lower(node, xs, ins, opset):
        shape = broadcast_shapes(node, *[x.shape for x in xs])
        a, b = (broadcast(x, shape) for x in xs)
        return Lazy(shape, "bool", lambda idx: combine(a(idx), b(idx)))

    def fold(node, arrays, opset):
        return [np_combine(arrays[0], arrays[1])]

    register(op_type, Kind.BROADCAST, _bool_infer, lower, fold, min_opset=7)


for _op in LOGICAL:
    _binary(_op)


def _float_test_infer(node, ins, opset):
    if ins[0].dtype not in FLOATS:
        raise ShapeError(f"{node.op_type} node {node.name!r}: needs a float input, got {ins[0].dtype}")
    return [(ins[0].shape, "bool")]


def _is_nan(x):
    return E.not_equal(x, x)   # the only value unequal to itself (an unordered comparison)


def _is_inf(node):
    """x == +inf and/or x == -inf, as the detect_positive / detect_negative attributes ask."""
    pos, neg = int(node.attrs.get("detect_positive", 1)), int(node.attrs.get("detect_negative", 1))

    def test(x):
        inf = E.const(math.inf, x.dtype)
        if pos and neg:
            return E.equal(E.abs(x), inf)
        if pos:
            return E.equal(x, inf)
        if neg:
            return E.equal(x, E.const(-math.inf, x.dtype))
        return E.const(False, "bool")
    return test


def _np_is_inf(node, a):
    pos, neg = int(node.attrs.get("detect_positive", 1)), int(node.attrs.get("detect_negative", 1))
    return (np.isposinf(a) & bool(pos)) | (np.isneginf(a) & bool(neg))


def _lower_is_nan(node, xs, ins, opset):
    x = xs[0]
    return Lazy(x.shape, "bool", lambda idx: _is_nan(x.read(idx)))


def _lower_is_inf(node, xs, ins, opset):
    x, test = xs[0], _is_inf(node)
    return Lazy(x.shape, "bool", lambda idx: test(x.read(idx)))


register("IsNaN", Kind.ELEMWISE, _float_test_infer, _lower_is_nan, lambda n, a, o: [np.isnan(a[0])], min_opset=9)
register("IsInf", Kind.ELEMWISE, _float_test_infer, _lower_is_inf, lambda n, a, o: [_np_is_inf(n, a[0])],
         min_opset=10)

__all__ = ["LOGICAL"]
