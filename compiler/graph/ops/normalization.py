"""Normalizations of CNNs: LRN (AlexNet, GoogLeNet), InstanceNormalization (style transfer) and
GroupNormalization (diffusion U-Nets, detection heads).

- LRN divides each element by a power of the sum of squares over a window of channels. The
  window is a handful of channels (5 in every zoo model), so its sum is written out term by term
  in one elementwise-shaped stage: one pass over the input, vectorized along the rows like any
  injective stage, no reduction stage and no intermediate tensor.
- InstanceNormalization is GroupNormalization with one channel per group. Both are lowered by
  `group_norm`: the statistics of each (sample, group) over its channels and positions, then
  the normalized output with a per-channel (or, GroupNormalization before opset 21, per-group)
  scale and bias. The stages are tagged `group_norm*`, which compiler/ops/schedule_graph_ops.py
  schedules (statistics in vector lanes, rows in parallel); canonical_ops.flatten_norm_spatial
  hands them the spatial axes as one (a free Reshape), so the lanes run along whole planes.
"""

from __future__ import annotations

import math

import numpy as np

from ... import expr as E
from ...tensor import compute, reduce_axis
from ...tensor import sum as te_sum
from ..errors import ShapeError
from .base import FLOATS, Kind, Lazy, materialize, register

# ----------------------------------------------------------------------------- LRN


def _lrn_params(node):
    size = int(node.attrs.get("size", 0))
    return (size, float(node.attrs.get("alpha", 1e-4)), float(node.attrs.get("beta", 0.75)),
            float(node.attrs.get("bias", 1.0)))


MAX_LRN_SIZE = 128   # the window is written out term by term (networks use 3 to 11)


def _lrn_check(node, opset):
    size = int(node.attrs.get("size", 0))
    if size < 1:
        return "size missing or < 1"
    if size > MAX_LRN_SIZE:
        return f"size {size} > {MAX_LRN_SIZE} (the window is written out term by term)"
    return None


def _lrn_infer(node, ins, opset):
    x = ins[0]
    if len(x.shape) < 3 or x.dtype not in FLOATS:
        raise ShapeError(f"LRN node {node.name!r}: a float input of rank 3 or more (N, C, ...), got {x.shape} {x.dtype}")
    return [(x.shape, x.dtype)]


def inverse_power(t, beta: float):
    """t ** -beta for t > 0: products of square roots for the betas networks use (0.75 in every
    LRN of the model zoos, 0.5, 1), else exp(-beta · log t)."""
    if beta == 0.75:
        r = E.sqrt(t)
        return 1.0 / (r * E.sqrt(r))
    if beta == 0.5:
        return 1.0 / E.sqrt(t)
    if beta == 1.0:
        return 1.0 / t
    if beta == 0.0:
        return E.const(1.0, t.dtype)
    return E.exp(E.log(t) * -beta)


def _lrn_lower(node, xs, ins, opset):
    """y = x · (bias + alpha/size · Σ x[c'..]²)^-beta, the window c - ⌊(size-1)/2⌋ ..
    c + ⌈(size-1)/2⌉ clipped to the channels; each term guarded by its channel's range."""
    size, alpha, beta, bias = _lrn_params(node)
    x = materialize(xs[0], "data")
    C = x.shape[1]
    before = (size - 1) // 2
    after = size - 1 - before
    scale = alpha / size

    def body(*idx):
        c = idx[1]
        total = None
        for off in range(-before, after + 1):
            if not -C < off < C:
                continue   # a window wider than the channels: these terms are never in range
            v = x[(idx[0], c + off) + tuple(idx[2:])]
            sq = v * v
            if off < 0:
                sq = E.if_then_else(c >= -off, sq, 0.0)
            elif off > 0:
                sq = E.if_then_else(c < C - off, sq, 0.0)
            total = sq if total is None else total + sq
        return x[idx] * inverse_power(total * scale + bias, beta)
    return Lazy.of(compute(x.shape, body, name="lrn", tag="lrn"))


def _lrn_fold(node, arrays, opset):
    size, alpha, beta, bias = _lrn_params(node)
    x = arrays[0].astype(np.float64)
    C, before = x.shape[1], (size - 1) // 2
    sq = np.zeros_like(x)
    for c in range(C):
        lo, hi = max(0, c - before), min(C, c + size - before)
        sq[:, c] = (x[:, lo:hi] ** 2).sum(axis=1)
    return [(x / (bias + alpha / size * sq) ** beta).astype(arrays[0].dtype)]


register("LRN", Kind.OPAQUE, _lrn_infer, _lrn_lower, _lrn_fold, check=_lrn_check)


# ----------------------------------------------------------------------------- group norm

def group_norm(x, scale, shift, groups: int, eps: float, name: str = "group_norm"):
    """Each group of channels of x [N, C, *spatial] normalized over its channels and positions,
    then scaled and shifted per channel: `scale(c)`, `shift(c)` give the expressions.

    As layer_norm does, the statistics are taken of x shifted by the group's first element (a
    float32 mean of a row of large values is off by ulps of the values, which 1/sqrt(eps) then
    amplifies on a constant row): stages group_norm_mean, group_norm_var (a second pass: squared
    deviations from the mean), group_norm_rstd = 1/sqrt(var + eps) per (sample, group), and the
    output. Each statistic reduces over the group's channels and the spatial axes, the last
    (unit-stride) one innermost."""
    N, C, *spatial = x.shape
    CG = C // groups
    size = CG * math.prod(spatial)
    inv = 1.0 / size

    def axes():
        return ([reduce_axis(CG, "rc")] if CG > 1 else []) + [reduce_axis(s, f"r{d}") for d, s in enumerate(spatial)]

    def read(n, g, rax):
        """x at the group's channel and position the reduction axes name."""
        c = g * CG + rax[0].var if CG > 1 else g
        return x[(n, c) + tuple(r.var for r in rax[-len(spatial):])]

    def first(n, g):
        return x[(n, g * CG if CG > 1 else g) + (0,) * len(spatial)]

    r1 = axes()
    mean = compute((N, groups), lambda n, g: te_sum((read(n, g, r1) - first(n, g)) * inv, axis=r1),
                   name=f"{name}_mean", tag="group_norm_mean")
    r2 = axes()

    def dev2(n, g):
        d = read(n, g, r2) - first(n, g) - mean[n, g]
        return te_sum(d * d * inv, axis=r2)
    var = compute((N, groups), dev2, name=f"{name}_var", tag="group_norm_var")
    rstd = compute((N, groups), lambda n, g: 1.0 / E.sqrt(var[n, g] + eps), name=f"{name}_rstd",
                   tag="group_norm_rstd")

    def norm(n, c, *pos):
        g = c // CG if CG > 1 else c
        return (x[(n, c) + pos] - first(n, g) - mean[n, g]) * (rstd[n, g] * scale(c)) + shift(c)
    return compute(tuple(x.shape), norm, name=name, tag="group_norm", attrs=dict(eps=eps, groups=groups))


def _norm_infer(node, ins, opset):
    x = ins[0]
    if len(x.shape) < 3 or x.dtype not in FLOATS:
        raise ShapeError(f"{node.op_type} node {node.name!r}: a float input of rank 3 or more (N, C, ...), "
                         f"got {x.shape} {x.dtype}")
    C = x.shape[1]
    G = _groups(node, C)
    want = (G,) if _per_group(node, opset) else (C,)
    for i, what in ((1, "scale"), (2, "bias")):
        v = ins[i] if len(ins) > i else None
        if v is None:
            raise ShapeError(f"{node.op_type} node {node.name!r}: the {what} input is missing")
        if v.shape != want or v.dtype != x.dtype:
            per = "one per group before opset 21" if _per_group(node, opset) else "one per channel"
            raise ShapeError(f"{node.op_type} node {node.name!r}: {what} {v.shape} {v.dtype}, expected {want} "
                             f"{x.dtype} ({per})")
    return [(x.shape, x.dtype)]


def _per_group(node, opset) -> bool:
    """GroupNormalization before opset 21 scales and shifts per group, from 21 per channel."""
    return node.op_type == "GroupNormalization" and opset < 21


def _groups(node, C: int) -> int:
    if node.op_type == "InstanceNormalization":
        return C
    G = int(node.attrs.get("num_groups", 0))
    if G < 1 or C % G:
        raise ShapeError(f"GroupNormalization node {node.name!r}: num_groups={G} does not divide {C} channels")
    return G


def _norm_check(node, opset):
    if node.op_type == "GroupNormalization":
        if "num_groups" not in node.attrs:
            return "no num_groups attribute"
        if int(node.attrs.get("stash_type", 1)) != 1:
            return "stash_type other than float"
    return None


def _norm_lower(node, xs, ins, opset):
    x = materialize(xs[0], "data")
    C = x.shape[1]
    G = _groups(node, C)
    eps = float(node.attrs.get("epsilon", 1e-5))
    gamma, beta = xs[1], xs[2]
    if _per_group(node, opset):
        CG = C // G
        out = group_norm(x, lambda c: gamma.read((c // CG,)), lambda c: beta.read((c // CG,)), G, eps)
    else:
        out = group_norm(x, lambda c: gamma.read((c,)), lambda c: beta.read((c,)), G, eps)
    return Lazy.of(out)


def _norm_fold(node, arrays, opset):
    x = arrays[0].astype(np.float64)
    N, C = x.shape[:2]
    G = _groups(node, C)
    eps = float(node.attrs.get("epsilon", 1e-5))
    rows = x.reshape(N, G, -1)
    mean, var = rows.mean(axis=2, keepdims=True), rows.var(axis=2, keepdims=True)
    y = ((rows - mean) / np.sqrt(var + eps)).reshape(x.shape)
    gamma, beta = (a.astype(np.float64) for a in arrays[1:3])
    if gamma.shape != (C,):
        gamma, beta = np.repeat(gamma, C // G), np.repeat(beta, C // G)
    bshape = (1, C) + (1,) * (x.ndim - 2)
    return [(y * gamma.reshape(bshape) + beta.reshape(bshape)).astype(arrays[0].dtype)]


register("InstanceNormalization", Kind.OPAQUE, _norm_infer, _norm_lower, _norm_fold, check=_norm_check)
register("GroupNormalization", Kind.OPAQUE, _norm_infer, _norm_lower, _norm_fold, check=_norm_check, min_opset=18)

__all__ = ["group_norm", "inverse_power"]
