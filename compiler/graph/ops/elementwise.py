"""Elementwise and broadcast ONNX operators: arithmetic, activations, comparisons, Where, Cast,
and BatchNormalization where it could not be folded into a convolution.

Each lowers to an expression over its operands' reads (`Lazy`), so any chain of them fuses into
one stage; the same function computes the value at compile time (`fold`) when every input is a
constant (shape arithmetic, scaled weights).
"""

from __future__ import annotations

import math

import numpy as np

from ... import expr as E
from ...dtypes import is_float
from ..errors import ShapeError
from .base import FLOATS, Kind, Lazy, broadcast, broadcast_shapes, const_input, register, same_dtype

# ----------------------------------------------------------------------------- unary


def _infer_same(node, ins, opset):
    return [(ins[0].shape, ins[0].dtype)]


def _float_only(node, ins, opset):
    if ins[0].dtype not in FLOATS:
        raise ShapeError(f"{node.op_type} node {node.name!r}: needs a float input, got {ins[0].dtype}")
    return _infer_same(node, ins, opset)


def _unary(op_type, expr_fn, np_fn, float_only=True, attrs_fn=None):
    """Register a one-input elementwise operator: expr_fn(x_expr, node) and np_fn(x, node)."""
    def lower(node, xs, ins, opset):
        x = xs[0]
        return Lazy(x.shape, x.dtype, lambda idx: expr_fn(x.read(idx), node))

    def fold(node, arrays, opset):
        return [np.asarray(np_fn(arrays[0], node)).astype(arrays[0].dtype)]

    register(op_type, Kind.ELEMWISE, _float_only if float_only else _infer_same, lower, fold)


def _f(node, key, default):
    return float(node.attrs.get(key, default))


_unary("Relu", lambda x, n: E.maximum(x, 0), lambda a, n: np.maximum(a, 0), float_only=False)
_unary("Sigmoid", lambda x, n: E.sigmoid(x), lambda a, n: 1.0 / (1.0 + np.exp(-a)))
_unary("Tanh", lambda x, n: E.tanh(x), lambda a, n: np.tanh(a))
_unary("Exp", lambda x, n: E.exp(x), lambda a, n: np.exp(a))
_unary("Log", lambda x, n: E.log(x), lambda a, n: np.log(a))
_unary("Sqrt", lambda x, n: E.sqrt(x), lambda a, n: np.sqrt(a))
_unary("Erf", lambda x, n: E.erf(x), lambda a, n: np.vectorize(math.erf)(a) if a.size else a)
_unary("Abs", lambda x, n: E.abs(x), lambda a, n: np.abs(a), float_only=False)
_unary("Neg", lambda x, n: -x, lambda a, n: -a, float_only=False)
_unary("Floor", lambda x, n: E.floor(x), lambda a, n: np.floor(a))
_unary("Ceil", lambda x, n: E.ceil(x), lambda a, n: np.ceil(a))
_unary("Reciprocal", lambda x, n: 1.0 / x, lambda a, n: 1.0 / a)
_unary("LeakyRelu", lambda x, n: E.if_then_else(x < 0, x * _f(n, "alpha", 0.01), x),
       lambda a, n: np.where(a < 0, a * _f(n, "alpha", 0.01), a))
_unary("Elu", lambda x, n: E.if_then_else(x < 0, (E.exp(x) - 1.0) * _f(n, "alpha", 1.0), x),
       lambda a, n: np.where(a < 0, (np.exp(a) - 1) * _f(n, "alpha", 1.0), a))
_unary("HardSigmoid",
       lambda x, n: E.maximum(E.minimum(x * _f(n, "alpha", 0.2) + _f(n, "beta", 0.5), 1.0), 0.0),
       lambda a, n: np.clip(a * _f(n, "alpha", 0.2) + _f(n, "beta", 0.5), 0, 1))
_unary("HardSwish", lambda x, n: x * E.maximum(E.minimum(x * (1.0 / 6.0) + 0.5, 1.0), 0.0),
       lambda a, n: a * np.clip(a / 6.0 + 0.5, 0, 1))
_unary("Softplus", lambda x, n: E.log(E.exp(x) + 1.0), lambda a, n: np.log1p(np.exp(a)))
_unary("Softsign", lambda x, n: x / (E.abs(x) + 1.0), lambda a, n: a / (np.abs(a) + 1))
_unary("ThresholdedRelu", lambda x, n: E.if_then_else(x > _f(n, "alpha", 1.0), x, 0.0),
       lambda a, n: np.where(a > _f(n, "alpha", 1.0), a, 0))
_unary("Sin", lambda x, n: E.sin(x), lambda a, n: np.sin(a))
_unary("Cos", lambda x, n: E.cos(x), lambda a, n: np.cos(a))
_unary("Round", lambda x, n: E.round(x), lambda a, n: np.round(a))   # half to even, both
_unary("Sign", lambda x, n: E.if_then_else(x > 0, E.const(1, x.dtype), E.if_then_else(x < 0, E.const(-1, x.dtype), x)),
       lambda a, n: np.sign(a), float_only=False)

# SELU's constants as ONNX writes them (float32 values of the paper's alpha and lambda)
SELU_ALPHA, SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875


def _selu(x, node):
    alpha, gamma = _f(node, "alpha", SELU_ALPHA), _f(node, "gamma", SELU_GAMMA)
    return E.if_then_else(x > 0, x * gamma, (E.exp(x) * alpha - alpha) * gamma)


def _np_selu(a, node):
    alpha, gamma = _f(node, "alpha", SELU_ALPHA), _f(node, "gamma", SELU_GAMMA)
    return np.where(a > 0, a * gamma, (np.exp(a) * alpha - alpha) * gamma)


def _celu(x, node):
    """max(0, x) + min(0, alpha · (exp(x / alpha) - 1))."""
    alpha = _f(node, "alpha", 1.0)
    return E.maximum(x, 0.0) + E.minimum((E.exp(x * (1.0 / alpha)) - 1.0) * alpha, 0.0)


def _np_celu(a, node):
    alpha = _f(node, "alpha", 1.0)
    return np.maximum(a, 0) + np.minimum(alpha * (np.exp(a / alpha) - 1), 0)


def _mish(x, node):
    """x · tanh(softplus(x)), softplus as max(x, 0) + log(1 + exp(-|x|)): exp never overflows, so
    a large x gives x, not x · tanh(log(inf))."""
    return x * E.tanh(E.maximum(x, 0.0) + E.log(E.exp(-E.abs(x)) + 1.0))


_unary("Selu", _selu, _np_selu)
_unary("Celu", _celu, _np_celu)
_unary("Mish", _mish, lambda a, n: a * np.tanh(np.logaddexp(a, 0)))


def _gelu(x, node):
    if node.attrs.get("approximate", "none") == "tanh":
        return 0.5 * x * (1.0 + E.tanh((x + 0.044715 * x * x * x) * math.sqrt(2.0 / math.pi)))
    return E.gelu(x)


def _np_gelu(a, node):
    if node.attrs.get("approximate", "none") == "tanh":
        return 0.5 * a * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * a ** 3)))
    return 0.5 * a * (1.0 + np.vectorize(math.erf)(a / math.sqrt(2.0)))


_unary("Gelu", _gelu, _np_gelu)


# ----------------------------------------------------------------------------- binary and variadic

def _infer_broadcast(node, ins, opset):
    return [(broadcast_shapes(node, *[v.shape for v in ins]), same_dtype(node, ins))]


def _infer_compare(node, ins, opset):
    return [(broadcast_shapes(node, *[v.shape for v in ins]), "bool")]


def _variadic(op_type, combine, np_combine, kind=Kind.BROADCAST, infer=_infer_broadcast):
    """Register an n-ary broadcasting operator folding its operands left to right."""
    def lower(node, xs, ins, opset):
        shape = broadcast_shapes(node, *[x.shape for x in xs])
        reads = [broadcast(x, shape) for x in xs]
        dtype = "bool" if infer is _infer_compare else xs[0].dtype

        def read(idx):
            acc = reads[0](idx)
            for r in reads[1:]:
                acc = combine(acc, r(idx))
            return acc
        return Lazy(shape, dtype, read)

    def fold(node, arrays, opset):
        acc = arrays[0]
        for a in arrays[1:]:
            acc = np_combine(acc, a)
        return [np.asarray(acc).astype(arrays[0].dtype if infer is not _infer_compare else bool)]

    register(op_type, kind, infer, lower, fold)


def _np_div(a, b):
    return np.trunc(a / b).astype(a.dtype) if a.dtype.kind in "iu" else a / b


def _div(a, b):
    return a / b if is_float(a.dtype) else _int_div(a, b)


def _int_div(a, b):
    """ONNX integer Div truncates toward zero; the compiler's // floors."""
    q = a // b
    return E.if_then_else(E.not_equal(a % b, 0) & E.not_equal(a < 0, b < 0), q + 1, q)


_variadic("Add", lambda a, b: a + b, np.add)
_variadic("Sub", lambda a, b: a - b, np.subtract)
_variadic("Mul", lambda a, b: a * b, np.multiply)
_variadic("Div", _div, _np_div)
_variadic("Sum", lambda a, b: a + b, np.add)
_variadic("Max", E.maximum, np.maximum)
_variadic("Min", E.minimum, np.minimum)
_variadic("Equal", E.equal, np.equal, infer=_infer_compare)
_variadic("Less", lambda a, b: a < b, np.less, infer=_infer_compare)
_variadic("Greater", lambda a, b: a > b, np.greater, infer=_infer_compare)
_variadic("LessOrEqual", lambda a, b: a <= b, np.less_equal, infer=_infer_compare)
_variadic("GreaterOrEqual", lambda a, b: a >= b, np.greater_equal, infer=_infer_compare)

def _prelu_infer(node, ins, opset):
    """PRelu's slope broadcasts to the input's shape (unidirectionally: the output is X's shape);
    exporters write a per-channel slope as [C, 1, 1]."""
    x, slope = ins
    if x.dtype not in FLOATS or slope.dtype != x.dtype:
        raise ShapeError(f"PRelu node {node.name!r}: float input and slope of one dtype, got {x.dtype}, {slope.dtype}")
    if broadcast_shapes(node, x.shape, slope.shape) != tuple(x.shape):
        raise ShapeError(f"PRelu node {node.name!r}: slope {slope.shape} does not broadcast to the input {x.shape}")
    return [(x.shape, x.dtype)]


def _prelu_lower(node, xs, ins, opset):
    x, slope = xs
    s = broadcast(slope, x.shape)
    return Lazy(x.shape, x.dtype, lambda idx: E.if_then_else(x.read(idx) < 0, x.read(idx) * s(idx), x.read(idx)))


register("PRelu", Kind.BROADCAST, _prelu_infer, _prelu_lower,
         lambda n, a, o: [np.where(a[0] < 0, a[0] * a[1], a[0]).astype(a[0].dtype)])


def _mean_lower(node, xs, ins, opset):
    from .base import OPS
    lower_sum = OPS["Sum"].lower
    assert lower_sum is not None
    total = lower_sum(node, xs, ins, opset)
    n = float(len(xs))
    return Lazy(total.shape, total.dtype, lambda idx: total.read(idx) / n)


def _mean_fold(node, arrays, opset):
    return [(sum(arrays) / len(arrays)).astype(arrays[0].dtype)]


register("Mean", Kind.BROADCAST, _infer_broadcast, _mean_lower, _mean_fold)


def _pow_lower(node, xs, ins, opset):
    """x ** y; a constant exponent 2, 1, 0.5 or -1 becomes a product, the value, sqrt or a reciprocal
    (the transformer's variance and layer norm use x**2 and x**0.5)."""
    x, y = xs
    shape = broadcast_shapes(node, x.shape, y.shape)
    rx, ry = broadcast(x, shape), broadcast(y, shape)
    exponent = ins[1].const
    if exponent is not None and exponent.size == 1:
        e = float(exponent.reshape(-1)[0])
        special = {2.0: lambda v: v * v, 1.0: lambda v: v, 0.5: E.sqrt, -1.0: lambda v: 1.0 / v,
                   3.0: lambda v: v * v * v}
        if e in special:
            f = special[e]
            return Lazy(shape, x.dtype, lambda idx: f(rx(idx)))
    if ins[1].dtype != ins[0].dtype:
        return Lazy(shape, x.dtype, lambda idx: E.power(rx(idx), ry(idx).astype(x.dtype)))
    return Lazy(shape, x.dtype, lambda idx: E.power(rx(idx), ry(idx)))


def _pow_infer(node, ins, opset):
    if ins[0].dtype not in FLOATS:
        raise ShapeError(f"Pow node {node.name!r}: needs a float base, got {ins[0].dtype}")
    return [(broadcast_shapes(node, ins[0].shape, ins[1].shape), ins[0].dtype)]


register("Pow", Kind.BROADCAST, _pow_infer, _pow_lower,
         lambda n, a, o: [np.power(a[0], a[1]).astype(a[0].dtype)])


# ----------------------------------------------------------------------------- Clip, Where, Cast

def _clip_bounds(node, ins, opset):
    if opset < 11:
        lo, hi = node.attrs.get("min"), node.attrs.get("max")
        return (None if lo is None else float(lo)), (None if hi is None else float(hi))
    lo = const_input(node, ins, 1, "min") if len(ins) > 1 and ins[1] is not None else None
    hi = const_input(node, ins, 2, "max") if len(ins) > 2 and ins[2] is not None else None
    return (None if lo is None else lo.reshape(-1)[0].item()), (None if hi is None else hi.reshape(-1)[0].item())


def _clip_lower(node, xs, ins, opset):
    x = xs[0]
    lo, hi = _clip_bounds(node, ins, opset)

    def read(idx):
        v = x.read(idx)
        if lo is not None:
            v = E.maximum(v, lo)
        if hi is not None:
            v = E.minimum(v, hi)
        return v
    return Lazy(x.shape, x.dtype, read)


def _clip_fold(node, arrays, opset):
    lo = hi = None
    if opset < 11:
        lo, hi = node.attrs.get("min"), node.attrs.get("max")
    else:
        lo = arrays[1] if len(arrays) > 1 else None
        hi = arrays[2] if len(arrays) > 2 else None
    return [np.clip(arrays[0], lo, hi).astype(arrays[0].dtype)]


register("Clip", Kind.ELEMWISE, _infer_same, _clip_lower, _clip_fold)


def _where_infer(node, ins, opset):
    if ins[0].dtype != "bool":
        raise ShapeError(f"Where node {node.name!r}: the condition must be bool, got {ins[0].dtype}")
    return [(broadcast_shapes(node, *[v.shape for v in ins]), same_dtype(node, ins[1:]))]


def _where_lower(node, xs, ins, opset):
    shape = broadcast_shapes(node, *[x.shape for x in xs])
    c, a, b = (broadcast(x, shape) for x in xs)
    return Lazy(shape, xs[1].dtype, lambda idx: E.if_then_else(c(idx), a(idx), b(idx)))


register("Where", Kind.BROADCAST, _where_infer, _where_lower,
         lambda n, a, o: [np.where(a[0], a[1], a[2]).astype(a[1].dtype)])

# ONNX TensorProto data types the compiler has
ONNX_DTYPES = {1: "float32", 11: "float64", 3: "int8", 6: "int32", 7: "int64", 9: "bool"}


def _cast_to(node):
    to = int(node.attrs.get("to", 0))
    if to not in ONNX_DTYPES:
        raise ShapeError(f"Cast node {node.name!r}: to={to} is not a dtype tunefarm compiles "
                         f"({', '.join(ONNX_DTYPES.values())})")
    return ONNX_DTYPES[to]


def _cast_check(node, opset):
    to = int(node.attrs.get("to", 0))
    return None if to in ONNX_DTYPES else f"Cast to ONNX data type {to}, which tunefarm does not compile"


def _cast_lower(node, xs, ins, opset):
    x, to = xs[0], _cast_to(node)
    if x.dtype == to:   # exporters cast a mask that is already bool to bool
        return Lazy(x.shape, to, x.read)
    if to == "bool":
        return Lazy(x.shape, to, lambda idx: E.not_equal(x.read(idx), 0))
    if x.dtype == "bool":
        return Lazy(x.shape, to, lambda idx: E.if_then_else(x.read(idx), E.const(1, to), E.const(0, to)))
    return Lazy(x.shape, to, lambda idx: x.read(idx).astype(to))


register("Cast", Kind.ELEMWISE, lambda n, ins, o: [(ins[0].shape, _cast_to(n))], _cast_lower,
         lambda n, a, o: [a[0].astype(_cast_to(n))], check=_cast_check)


def _not_lower(node, xs, ins, opset):
    x = xs[0]
    return Lazy(x.shape, "bool", lambda idx: ~x.read(idx))


register("Not", Kind.ELEMWISE, _infer_same, _not_lower, lambda n, a, o: [np.logical_not(a[0])])


# ----------------------------------------------------------------------------- BatchNormalization

def bn_scale_shift(node, ins):
    """(scale, shift) per channel with y = x · scale + shift, from the constant statistics, in
    float64 then the input's dtype."""
    gamma, beta, mean, var = (const_input(node, ins, i, w).astype(np.float64)
                              for i, w in ((1, "scale"), (2, "B"), (3, "mean"), (4, "var")))
    eps = float(node.attrs.get("epsilon", 1e-5))
    scale = gamma / np.sqrt(var + eps)
    return scale, beta - mean * scale


def _bn_check(node, opset):
    if node.attrs.get("training_mode", 0):
        return "training_mode=1 (only inference is compiled)"
    if len([o for o in node.outputs if o]) > 1:
        return "running statistics as outputs (training mode)"
    if opset < 9 and node.attrs.get("spatial", 1) != 1:
        return "spatial=0"
    return None


def _bn_infer(node, ins, opset):
    x = ins[0]
    if len(x.shape) < 2:
        raise ShapeError(f"BatchNormalization node {node.name!r}: input rank {len(x.shape)} < 2")
    for i in range(1, 5):
        const_input(node, ins, i, ("", "scale", "B", "mean", "var")[i])
        if ins[i].shape != (x.shape[1],):
            raise ShapeError(f"BatchNormalization node {node.name!r}: input {ins[i].name!r} has shape "
                             f"{ins[i].shape}, expected ({x.shape[1]},)")
    return [(x.shape, x.dtype)]


def _bn_lower(node, xs, ins, opset):
    """y = x · scale[c] + shift[c] with both folded from the statistics at compile time; the two
    vectors are the only constants a kernel needs, passed like weights (`bn_params`)."""
    raise ShapeError(f"BatchNormalization node {node.name!r}: must be rewritten by fold_batch_norm before lowering")


def _bn_fold(node, arrays, opset):
    x, gamma, beta, mean, var = (a.astype(np.float64) for a in arrays[:5])
    eps = float(node.attrs.get("epsilon", 1e-5))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * gamma.reshape(shape) + beta.reshape(shape)
    return [y.astype(arrays[0].dtype)]


register("BatchNormalization", Kind.BROADCAST, _bn_infer, _bn_lower, _bn_fold, check=_bn_check)

__all__ = ["ONNX_DTYPES", "bn_scale_shift"]
