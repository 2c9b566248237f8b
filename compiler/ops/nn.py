"""Normalization operators: numerically stable softmax and layer_norm, as multi-stage DAGs."""

from __future__ import annotations

import numpy as np

from .. import expr as E
from ..errors import ExprError
from ..tensor import compute, placeholder, reduce_axis
from ..tensor import max as te_max
from ..tensor import sum as te_sum
from .base import FLOAT, OpDef, check_axis, check_dtype_for, check_shape


def _keep(shape, axis):
    """Shape of a per-row statistic: the reduced axis kept with size 1 (never a 0-d tensor)."""
    return tuple(1 if d == axis else s for d, s in enumerate(shape))


def _along(idx, axis, value):
    """The index tuple `idx` with position `axis` replaced by `value`."""
    return tuple(value if d == axis else i for d, i in enumerate(idx))


def softmax(shape, axis=-1, dtype="float32") -> OpDef:
    """exp(x - max) / sum(exp(x - max)); stages softmax_max, softmax_exp, softmax_sum, softmax."""
    op = "softmax"
    shape = check_shape(op, shape)
    axis = check_axis(op, axis, len(shape))
    dtype = check_dtype_for(op, dtype, FLOAT)
    x = placeholder(shape, dtype, "data")
    stat = _keep(shape, axis)
    k1, k2 = reduce_axis(shape[axis], "k"), reduce_axis(shape[axis], "k")
    mx = compute(stat, lambda *i: te_max(x[_along(i, axis, k1)], axis=k1), name="softmax_max", tag="softmax_max")
    ex = compute(shape, lambda *i: E.exp(x[i] - mx[_along(i, axis, 0)]), name="softmax_exp", tag="elemwise")
    sm = compute(stat, lambda *i: te_sum(ex[_along(i, axis, k2)], axis=k2), name="softmax_sum", tag="softmax_sum")
    out = compute(shape, lambda *i: ex[i] / sm[_along(i, axis, 0)], name="softmax", tag="elemwise")

    def reference(a):
        a = a.astype(np.float64)
        e = np.exp(a - a.max(axis=axis, keepdims=True))
        return (e / e.sum(axis=axis, keepdims=True)).astype(dtype)

    n = int(np.prod(shape))
    return OpDef(op, [x], out, dict(shape=shape, axis=axis, dtype=dtype), 5 * n, reference)


def layer_norm(shape, axis=-1, eps=1e-5, dtype="float32") -> OpDef:
    """(x - mean) / sqrt(var + eps) * gamma + beta over one axis (gamma, beta: [shape[axis]]).

    Two-pass variance (mean first) for accuracy; stages layer_norm_mean, layer_norm_var, layer_norm.
    """
    op = "layer_norm"
    shape = check_shape(op, shape)
    axis = check_axis(op, axis, len(shape))
    dtype = check_dtype_for(op, dtype, FLOAT)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ExprError(f"{op}: eps must be a positive number, got {eps!r}")
    eps = float(eps)
    n = shape[axis]
    x = placeholder(shape, dtype, "data")
    gamma = placeholder((n,), dtype, "gamma")
    beta = placeholder((n,), dtype, "beta")
    stat = _keep(shape, axis)
    inv_n = 1.0 / n
    k1, k2 = reduce_axis(n, "k"), reduce_axis(n, "k")
    mean = compute(stat, lambda *i: te_sum(x[_along(i, axis, k1)] * inv_n, axis=k1),
                   name="layer_norm_mean", tag="layer_norm_mean")

    def dev2(i):
        d = x[_along(i, axis, k2)] - mean[_along(i, axis, 0)]
        return d * d * inv_n

    var = compute(stat, lambda *i: te_sum(dev2(i), axis=k2), name="layer_norm_var", tag="layer_norm_var")

    def norm(*i):
        s = _along(i, axis, 0)
        return (x[i] - mean[s]) / E.sqrt(var[s] + eps) * gamma[i[axis]] + beta[i[axis]]

    out = compute(shape, norm, name="layer_norm", tag="elemwise", attrs=dict(eps=eps))

    def reference(a, g, b):
        a = a.astype(np.float64)
        m = a.mean(axis=axis, keepdims=True)
        v = ((a - m) ** 2).mean(axis=axis, keepdims=True)
        bshape = [1] * len(shape)
        bshape[axis] = n
        y = (a - m) / np.sqrt(v + eps) * g.astype(np.float64).reshape(bshape) + b.astype(np.float64).reshape(bshape)
        return y.astype(dtype)

    total = int(np.prod(shape))
    return OpDef(op, [x, gamma, beta], out, dict(shape=shape, axis=axis, eps=eps, dtype=dtype), 8 * total, reference)
