"""Normalization operators: numerically stable softmax and layer_norm, as multi-stage DAGs."""

from __future__ import annotations

import numpy as np

from .. import expr as E
from ..tensor import compute, placeholder, reduce_axis
from ..tensor import max as te_max
from ..tensor import sum as te_sum
from .base import FLOAT, OpDef, check_axis, check_dtype_for, check_float, check_shape


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

    Stages layer_norm_mean, layer_norm_var (a second pass over the row: the mean of squared
    deviations from the mean) and layer_norm, all on the row shifted by its first element,
    d = x - x[0]; layer_norm_mean holds the mean of d. A float32 mean of x itself is off by a few
    ulps of |x|: on a constant row the deviations were then that error instead of 0, amplified
    by 1/sqrt(eps) (a row of 1000s came out 1.3 off beta). The mean of d is exactly 0 on a
    constant row, and with a large common offset (x ~ 1000 + noise) the sums see the spread of
    the row, not its offset.
    """
    op = "layer_norm"
    shape = check_shape(op, shape)
    axis = check_axis(op, axis, len(shape))
    dtype = check_dtype_for(op, dtype, FLOAT)
    eps = check_float(op, "eps", eps, positive=True)
    n = shape[axis]
    x = placeholder(shape, dtype, "data")
    gamma = placeholder((n,), dtype, "gamma")
    beta = placeholder((n,), dtype, "beta")
    stat = _keep(shape, axis)
    inv_n = 1.0 / n
    k1, k2 = reduce_axis(n, "k"), reduce_axis(n, "k")

    def shifted(i, at):
        """x[i] - x[first element of the row], with the row position replaced by `at`."""
        return x[_along(i, axis, at)] - x[_along(i, axis, 0)]

    mean = compute(stat, lambda *i: te_sum(shifted(i, k1) * inv_n, axis=k1),
                   name="layer_norm_mean", tag="layer_norm_mean")

    def dev2(i):
        d = shifted(i, k2) - mean[_along(i, axis, 0)]
        return d * d * inv_n

    var = compute(stat, lambda *i: te_sum(dev2(i), axis=k2), name="layer_norm_var", tag="layer_norm_var")

    def norm(*i):
        s = _along(i, axis, 0)
        return (shifted(i, i[axis]) - mean[s]) / E.sqrt(var[s] + eps) * gamma[i[axis]] + beta[i[axis]]

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
