"""Rules for any DAG's default schedule (compiler/ops/schedule_rules.py, stride_phases.py): each
rule's kernels against float64 numpy on odd sizes, and each rule firing on DAGs it was not
written for (behaviour, not timing)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import compiler as C
from compiler.ops.custom import custom_op
from compiler.ops.default_schedules import default_schedule
from compiler.ops.schedule_anchor import anchor_recipe_choices, schedule_anchor_recipe
from compiler.ops.schedule_rules import rule_of
from compiler.ops.stride_phases import stride_phase_plan
from compiler.verify import poisoned

TARGET = C.Target.host()


def _run(opdef, schedule, seed=0):
    rng = np.random.default_rng(seed)
    arrays = [rng.uniform(0.5, 1.5, t.shape).astype(t.dtype) * rng.choice([-1, 1], t.shape).astype(t.dtype)
              for t in opdef.inputs]
    kernel = C.build(schedule, opdef.tensors)
    out = poisoned(opdef.output.shape, opdef.output.dtype, 0)
    kernel(*arrays, out)
    return arrays, out


def _close(got, ref):
    assert np.max(np.abs(got - ref)) <= 1e-5 * max(1.0, float(np.max(np.abs(ref))))


def _steps(schedule):
    return [st["op"] for st in schedule.steps]


# ------------------------------------------------------------------ stride phases
def _conv_transpose(Ci=5, Co=3, H=7, W=6, K=3, S=2, P=1):
    """A transposed convolution as a user writes one: zero-stuffing, padding, the flipped kernel."""
    X, Wt = C.placeholder((1, Ci, H, W), "float32", "X"), C.placeholder((Ci, Co, K, K), "float32", "W")
    ZH, ZW = (H - 1) * S + 1, (W - 1) * S + 1
    z = C.compute((1, Ci, ZH, ZW), lambda n, c, y, x: C.if_then_else(
        C.equal(y % S, 0) & C.equal(x % S, 0), X[n, c, y // S, x // S], 0.0), name="stuff")
    q = K - 1 - P
    pd = C.compute((1, Ci, ZH + 2 * q, ZW + 2 * q), lambda n, c, y, x: C.if_then_else(
        (y >= q) & (y < ZH + q) & (x >= q) & (x < ZW + q), z[n, c, y - q, x - q], 0.0), name="pad")
    OH, OW = (H - 1) * S - 2 * P + K, (W - 1) * S - 2 * P + K
    c, ry, rx = C.reduce_axis(Ci, "c"), C.reduce_axis(K, "ry"), C.reduce_axis(K, "rx")
    out = C.compute((1, Co, OH, OW), lambda n, f, y, x: C.sum(
        pd[n, c, y + ry, x + rx] * Wt[c, f, K - 1 - ry, K - 1 - rx], axis=[c, ry, rx]), name="convt")
    return custom_op("user_conv_transpose", [X, Wt], out)


def _conv_transpose_ref(x, w, S, P):
    _, Ci, H, W = x.shape
    _, Co, K, _ = w.shape
    full = np.zeros((Co, (H - 1) * S + K, (W - 1) * S + K))
    for i in range(H):
        for j in range(W):
            full[:, i * S:i * S + K, j * S:j * S + K] += np.einsum("c,cfab->fab", x[0, :, i, j], w)
    return full[None, :, P:full.shape[1] - P, P:full.shape[2] - P]


@pytest.mark.parametrize("S,K,P", [(2, 3, 1), (3, 4, 0)])
def test_stride_phases_conv_transpose(S, K, P):
    opdef = _conv_transpose(S=S, K=K, P=P)
    assert rule_of(opdef) == "stride_phases"
    s = default_schedule(opdef, TARGET)
    assert "rewrite" in _steps(s)
    names = [st.name for st in s.stages]
    assert sum(re.fullmatch(r"convt_p\d\d", n) is not None for n in names) == S * S
    assert "stuff" not in names       # the zero-stuffing is gone: no multiply by a known zero
    arrays, out = _run(opdef, s)
    _close(out, _conv_transpose_ref(*[a.astype(np.float64) for a in arrays], S, P))


def test_stride_phases_fires_on_a_1d_upsampling_filter():
    """Not a convolution the rule was written for: a stride-3 1-D upsampling written with the
    test on `t - r + 1` (a negative reduce coefficient), a bias read inside the product, and a
    row axis the phases leave alone."""
    R, L, K, S = 3, 11, 5, 3
    X, Wt = C.placeholder((R, L), "float32", "X"), C.placeholder((K,), "float32", "W")
    T = L * S
    r = C.reduce_axis(K, "r")
    up = C.compute((R, T + K), lambda i, t: C.if_then_else(
        C.equal((t - 1) % S, 0) & (t >= 1) & (t < T), X[i, (t - 1) // S], 0.0), name="up")
    out = C.compute((R, T), lambda i, t: C.sum(Wt[r] * up[i, t - r + K - 1] * 2.0, axis=r), name="filt")
    opdef = custom_op("user_upsample_filter", [X, Wt], out)
    plan = stride_phase_plan(out.op)
    assert plan is not None and plan[0][:3] == (1, 0, 3)
    s = default_schedule(opdef, TARGET)
    assert "rewrite" in _steps(s)
    (x, w), got = _run(opdef, s, seed=1)
    up_ref = np.zeros((R, T + K))
    up_ref[:, 1:T:S] = x[:, :len(range(1, T, S))]
    ref = np.stack([sum(2.0 * w[k] * up_ref[:, t - k + K - 1] for k in range(K)) for t in range(T)], axis=1)
    _close(got, ref)


def test_stride_phases_leave_what_is_not_a_zero_factor():
    X = C.placeholder((4, 9), "float32", "X")
    r = C.reduce_axis(3, "r")
    z = C.compute((4, 11), lambda i, t: C.if_then_else(C.equal(t % 2, 0), X[i, t % 9], 0.0), name="z")
    as_max = C.compute((4, 9), lambda i, t: C.max(z[i, t + r], axis=r), name="m")          # a max: zeros count
    added = C.compute((4, 9), lambda i, t: C.sum(z[i, t + r] + 1.0, axis=r), name="a")     # not a factor
    assert stride_phase_plan(as_max.op) is None and stride_phase_plan(added.op) is None


def test_stride_phases_are_the_recipe_sketch_start():
    """The zero-trial schedule is what the search starts from: the recipe's default choices give
    the default schedule's steps, and the other value of the knob (no phases) is correct too."""
    opdef = _conv_transpose()
    choices = anchor_recipe_choices(opdef, TARGET)
    assert choices == {"phases": [True, False]}
    default = default_schedule(opdef, TARGET)
    assert schedule_anchor_recipe(opdef, TARGET, {"phases": True}).steps == default.steps
    plain = schedule_anchor_recipe(opdef, TARGET, {"phases": False})
    assert "rewrite" not in _steps(plain)
    arrays, out = _run(opdef, plain)
    _close(out, _conv_transpose_ref(*[a.astype(np.float64) for a in arrays], 2, 1))


# ------------------------------------------------------------------ row fusion
def _softmax(R=37, H=45):
    X = C.placeholder((R, H), "float32", "X")
    k1, k2 = C.reduce_axis(H, "k1"), C.reduce_axis(H, "k2")
    m = C.compute((R,), lambda i: C.max(X[i, k1], axis=k1), name="rowmax")
    e = C.compute((R, H), lambda i, j: C.exp(X[i, j] - m[i]), name="e")
    s = C.compute((R,), lambda i: C.sum(e[i, k2], axis=k2), name="rowsum")
    return custom_op("user_softmax", [X], C.compute((R, H), lambda i, j: e[i, j] / s[i], name="sm"))


def test_row_fusion_softmax():
    opdef = _softmax(H=181)   # rows of at least two widths of lanes on any host, up to 64 lanes
    assert rule_of(opdef) == "row_fusion"
    s = default_schedule(opdef, TARGET)
    assert "rfactor" in _steps(s) and "compute_at" in _steps(s)
    (x,), got = _run(opdef, s)
    x = x.astype(np.float64)
    e = np.exp(x - x.max(1, keepdims=True))
    _close(got, e / e.sum(1, keepdims=True))


def test_row_fusion_fires_on_a_3d_two_pass_norm():
    """Not softmax: two row axes (batch, token), a mean, a two-pass variance read through a
    row-shaped stage, a bias over columns, an odd row length."""
    B, T, H = 2, 5, 67
    X, G = C.placeholder((B, T, H), "float32", "X"), C.placeholder((H,), "float32", "G")
    k1, k2 = C.reduce_axis(H, "k1"), C.reduce_axis(H, "k2")
    total = C.compute((B, T), lambda b, t: C.sum(X[b, t, k1], axis=k1), name="total")
    mean = C.compute((B, T), lambda b, t: total[b, t] * (1.0 / H), name="mean")
    sq = C.compute((B, T), lambda b, t: C.sum((X[b, t, k2] - mean[b, t]) * (X[b, t, k2] - mean[b, t]), axis=k2), name="sq")
    out = C.compute((B, T, H), lambda b, t, j: (X[b, t, j] - mean[b, t]) / C.sqrt(sq[b, t] / H + 1e-5) * G[j], name="norm")
    opdef = custom_op("user_norm3d", [X, G], out)
    assert rule_of(opdef) == "row_fusion"
    for choices in ({}, {"lane_vectors": 1, "buffer_expensive": False}, {"fuse_rows": False}):
        s = schedule_anchor_recipe(opdef, TARGET, choices) if choices else default_schedule(opdef, TARGET)
        (x, g), got = _run(opdef, s)
        x, g = x.astype(np.float64), g.astype(np.float64)
        mu = x.mean(-1, keepdims=True)
        _close(got, (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g)


def test_row_fusion_leaves_products_and_column_statistics():
    A, B = C.placeholder((8, 16), "float32", "A"), C.placeholder((16, 8), "float32", "B")
    k, r = C.reduce_axis(16, "k"), C.reduce_axis(8, "r")
    mm = C.compute((8, 8), lambda i, j: C.sum(A[i, k] * B[k, j], axis=k), name="mm")
    assert rule_of(custom_op("user_mm_relu", [A, B], C.compute((8, 8), lambda i, j: C.maximum(mm[i, j], 0.0)))) is None
    col = C.compute((16,), lambda j: C.sum(A[r, j], axis=r), name="col")   # a statistic of columns
    assert rule_of(custom_op("user_center_cols", [A], C.compute((8, 16), lambda i, j: A[i, j] - col[j]))) is None
