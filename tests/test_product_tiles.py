"""The GEMM's register tile for any two-operand reduction (compiler/ops/schedule_tile.py): layouts
tiled by their contiguous axis (NHWC), non-product bodies (squared and absolute differences,
max-plus), several reductions of one output space joined (an LSTM's two GEMMs), each against
float64 numpy on odd sizes with poisoned outputs, and each firing on a DAG it was not written
for (behaviour, not timing)."""

from __future__ import annotations

import re

import numpy as np

import compiler as C
from compiler.lower import lower
from compiler.ops.custom import custom_op
from compiler.ops.default_schedules import default_schedule
from compiler.ops.schedule_anchor import joined_reductions
from compiler.ops.schedule_tile import product_tile, tile_axes, tile_choices
from compiler.tensor import ComputeOp, topo_order
from compiler.verify import poisoned

TARGET = C.Target.host()


def _run(opdef):
    rng = np.random.default_rng(1)
    arrays = [rng.uniform(0.5, 1.5, t.shape).astype(t.dtype) * rng.choice([-1, 1], t.shape).astype(t.dtype)
              for t in opdef.inputs]
    schedule = default_schedule(opdef, TARGET)
    kernel = C.build(schedule, opdef.tensors)
    out = poisoned(opdef.output.shape, opdef.output.dtype, 0)
    kernel(*arrays, out)
    return [a.astype(np.float64) for a in arrays], out, str(lower(schedule, opdef.tensors))


def _close(got, ref):
    assert np.max(np.abs(got - ref)) <= 1e-5 * max(1.0, float(np.max(np.abs(ref))))


def _local_tiles(text) -> list:
    """[elements] of every local buffer the lowered kernel allocates (the register tiles)."""
    return [int(np.prod([int(d) for d in dims.split("x")]))
            for dims in re.findall(r"allocate \w+\[float32 \* ([\dx]+)\], local", text)]


def _reduction(opdef):
    return next(op for op in topo_order([opdef.output]) if isinstance(op, ComputeOp) and op.reduce_axis)


def _tile_size(op) -> int:
    _, mr, nr = product_tile(op, TARGET)
    return mr * nr


def test_tiles_fill_the_registers_and_prefer_a_dividing_row_count():
    lanes, regs = TARGET.vector_lanes("float32"), TARGET.capabilities.vector_registers
    for M, N in ((56, 64), (13, 21), (1024, 1024)):
        mr, nr = tile_choices(M, N, lanes, regs, TARGET.capabilities.fmas_per_cycle)[0]
        nv = -(-nr // lanes)
        assert mr * nv + nv + 1 <= regs   # accumulators, operand vectors and a broadcast fit
    mr, _ = tile_choices(48, 64, 8, 16, 2.0)[0]
    assert 48 % mr == 0


def test_nhwc_conv_vectorizes_channels_tiles_columns_and_copies_its_padding_once():
    """A channels-last 3x3 conv with a padding stage: vectors of output channels (the filter's
    unit-stride rows), a register tile of output columns, the padding materialized once (its
    border test would be a branch per broadcast)."""
    N, H, W, Ci, Co = 2, 9, 11, 5, 19
    X, Wt = C.placeholder((N, H, W, Ci), "float32", "X"), C.placeholder((3, 3, Ci, Co), "float32", "W")
    P = C.compute((N, H + 2, W + 2, Ci), lambda n, y, x, c: C.if_then_else(
        (y >= 1) & (y <= H) & (x >= 1) & (x <= W), X[n, y - 1, x - 1, c], 0.0), name="pad")
    ry, rx, rc = C.reduce_axis(3, "ry"), C.reduce_axis(3, "rx"), C.reduce_axis(Ci, "rc")
    out = C.compute((N, H, W, Co), lambda n, y, x, f: C.sum(P[n, y + ry, x + rx, rc] * Wt[ry, rx, rc, f],
                                                           axis=[ry, rx, rc]), name="conv_nhwc")
    opdef = custom_op("user_conv_nhwc", [X, Wt], out)
    assert tile_axes(_reduction(opdef)) == 2   # the columns
    (x, w), got, text = _run(opdef)
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    ref = sum(np.einsum("nhwc,cf->nhwf", xp[:, a:a + H, b:b + W], w[a, b]) for a in range(3) for b in range(3))
    _close(got, ref)
    assert re.search(r"allocate pad\[float32 \* [\dx]+\], global", text)
    assert _tile_size(_reduction(opdef)) in _local_tiles(text)


def test_non_product_bodies_get_the_register_tile():
    """Squared differences, max-plus and absolute differences: the same tile as a product."""
    M, N, K = 13, 21, 7
    A, B, Bt = C.placeholder((M, K), "float32", "A"), C.placeholder((N, K), "float32", "B"), C.placeholder((K, N), "float32", "Bt")
    k = C.reduce_axis(K, "k")
    cases = {
        "sqdist": ([A, B], C.compute((M, N), lambda i, j: C.sum((A[i, k] - B[j, k]) * (A[i, k] - B[j, k]), axis=k)),
                   lambda a, b: ((a[:, None] - b[None]) ** 2).sum(-1)),
        "maxplus": ([A, Bt], C.compute((M, N), lambda i, j: C.max(A[i, k] + Bt[k, j], axis=k)),
                    lambda a, b: (a[:, :, None] + b[None]).max(1)),
        "l1": ([A, B], C.compute((M, N), lambda i, j: C.sum(C.abs(A[i, k] - B[j, k]), axis=k)),
               lambda a, b: np.abs(a[:, None] - b[None]).sum(-1)),
    }
    for name, (ins, out, ref) in cases.items():
        opdef = custom_op(f"user_{name}", ins, out)
        arrays, got, text = _run(opdef)
        _close(got, ref(*arrays))
        assert _tile_size(_reduction(opdef)) in _local_tiles(text), name


def test_the_tile_fires_on_a_batched_channels_last_3d_shape():
    """Not what it was written for: a batched min-plus over [batch, i, j] and an NDHWC 1x1x1
    convolution's channel mixing with a bias epilogue: the tile axis found, the tile built."""
    G, M, N, K = 3, 5, 17, 6
    A, B = C.placeholder((G, M, K), "float32", "A"), C.placeholder((G, K, N), "float32", "B")
    k = C.reduce_axis(K, "k")
    out = C.compute((G, M, N), lambda g, i, j: C.min(A[g, i, k] + B[g, k, j], axis=k), name="minplus")
    opdef = custom_op("user_minplus", [A, B], out)
    assert tile_axes(_reduction(opdef)) == 1
    (a, b), got, text = _run(opdef)
    _close(got, (a[:, :, :, None] + b[:, None]).min(2))
    assert _tile_size(_reduction(opdef)) in _local_tiles(text)
    D, H, W, Ci, Co = 3, 5, 7, 6, 11
    X, Wt, bias = (C.placeholder((1, D, H, W, Ci), "float32", "X"), C.placeholder((Ci, Co), "float32", "W"),
                   C.placeholder((Co,), "float32", "b"))
    c = C.reduce_axis(Ci, "c")
    mix = C.compute((1, D, H, W, Co), lambda n, z, y, x, f: C.sum(X[n, z, y, x, c] * Wt[c, f], axis=c), name="mix")
    out = C.compute((1, D, H, W, Co), lambda n, z, y, x, f: C.tanh(mix[n, z, y, x, f] + bias[f]), name="mix_tanh")
    opdef = custom_op("user_ndhwc_mix", [X, Wt, bias], out)
    assert tile_axes(_reduction(opdef)) == 3
    (x, w, bb), got, text = _run(opdef)
    _close(got, np.tanh(x @ w + bb))
    assert _tile_size(_reduction(opdef)) in _local_tiles(text)


def test_reductions_of_one_output_space_are_computed_at_one_tile():
    """An LSTM cell's two GEMMs summed with a bias, gates at column offsets; and (not what it was
    written for) three reductions of other bodies joined by a product: each computed at the
    join's register tile, no product materialized whole."""
    Bt, I, H = 7, 5, 6
    X, Hp = C.placeholder((Bt, I), "float32", "x"), C.placeholder((Bt, H), "float32", "h")
    Wx, Wh = C.placeholder((I, 4 * H), "float32", "Wx"), C.placeholder((H, 4 * H), "float32", "Wh")
    b, c0 = C.placeholder((4 * H,), "float32", "b"), C.placeholder((Bt, H), "float32", "c")
    k1, k2 = C.reduce_axis(I, "k1"), C.reduce_axis(H, "k2")
    gx = C.compute((Bt, 4 * H), lambda i, j: C.sum(X[i, k1] * Wx[k1, j], axis=k1), name="gx")
    gh = C.compute((Bt, 4 * H), lambda i, j: C.sum(Hp[i, k2] * Wh[k2, j], axis=k2), name="gh")
    g = C.compute((Bt, 4 * H), lambda i, j: gx[i, j] + gh[i, j] + b[j], name="gates")
    cn = C.compute((Bt, H), lambda i, j: C.sigmoid(g[i, H + j]) * c0[i, j] + C.sigmoid(g[i, j]) * C.tanh(g[i, 2 * H + j]),
                   name="cnew")
    out = C.compute((Bt, H), lambda i, j: C.sigmoid(g[i, 3 * H + j]) * C.tanh(cn[i, j]), name="hnew")
    opdef = custom_op("user_lstm", [X, Hp, Wx, Wh, b, c0], out)
    computes = [op for op in topo_order([out]) if isinstance(op, ComputeOp)]
    assert joined_reductions(computes, [op for op in computes if op.reduce_axis]) is g.op
    (x, h, wx, wh, bb, c), got, text = _run(opdef)
    gg = x @ wx + h @ wh + bb

    def sig(v):
        return 1 / (1 + np.exp(-v))
    _close(got, sig(gg[:, 3 * H:]) * np.tanh(sig(gg[:, H:2 * H]) * c + sig(gg[:, :H]) * np.tanh(gg[:, 2 * H:3 * H])))
    assert not re.search(r"allocate g[xh]\[float32 \* 7x24\]", text)   # each product a tile, not whole
    M, N, K = 9, 13, 4
    A, B, D = (C.placeholder((M, K), "float32", "A"), C.placeholder((K, N), "float32", "B"),
               C.placeholder((N, K), "float32", "D"))
    ka, kb, kc = C.reduce_axis(K, "ka"), C.reduce_axis(K, "kb"), C.reduce_axis(K, "kc")
    p = C.compute((M, N), lambda i, j: C.sum(A[i, ka] * B[ka, j], axis=ka), name="p")
    q = C.compute((M, N), lambda i, j: C.max(A[i, kb] + B[kb, j], axis=kb), name="q")
    r = C.compute((M, N), lambda i, j: C.sum((A[i, kc] - D[j, kc]) * (A[i, kc] - D[j, kc]), axis=kc), name="r")
    out = C.compute((M, N), lambda i, j: p[i, j] * q[i, j] - r[i, j], name="joined")
    opdef = custom_op("user_three_joined", [A, B, D], out)
    computes = [op for op in topo_order([out]) if isinstance(op, ComputeOp)]
    assert joined_reductions(computes, [op for op in computes if op.reduce_axis]) is out.op
    (a, bm, d), got, text = _run(opdef)
    _close(got, (a @ bm) * (a[:, :, None] + bm[None]).max(1) - ((a[:, None] - d[None]) ** 2).sum(-1))
    assert len(_local_tiles(text)) >= 3


def test_the_tile_is_the_recipe_sketchs_knob_and_its_default_the_zero_trial_schedule():
    from compiler.ops.schedule_anchor import anchor_recipe_choices, schedule_anchor_recipe
    M, N, K = 11, 40, 6
    A, B = C.placeholder((M, K), "float32", "A"), C.placeholder((N, K), "float32", "B")
    k = C.reduce_axis(K, "k")
    out = C.compute((M, N), lambda i, j: C.sum(C.abs(A[i, k] - B[j, k]), axis=k), name="l1")
    opdef = custom_op("user_l1_knob", [A, B], out)
    choices = anchor_recipe_choices(opdef, TARGET)
    assert list(choices) == ["tile"] and len(choices["tile"]) > 1
    default = schedule_anchor_recipe(opdef, TARGET, {"tile": choices["tile"][0]})
    assert default.steps == default_schedule(opdef, TARGET).steps
    other = schedule_anchor_recipe(opdef, TARGET, {"tile": choices["tile"][1]})
    kernel = C.build(other, opdef.tensors)
    rng = np.random.default_rng(2)
    a, b = (rng.uniform(-1, 1, t.shape).astype("float32") for t in opdef.inputs)
    got = poisoned(opdef.output.shape, "float32", 0)
    kernel(a, b, got)
    _close(got, np.abs(a[:, None].astype(np.float64) - b[None]).sum(-1))
