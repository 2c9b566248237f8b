"""The schedule a user's compute gets with no record and no hand-written default
(compiler/ops/schedule_anchor.py): vectors, threads and register tiles derived from the compute
alone, never the naive loop nest, and results equal to float64 numpy on odd sizes that divide no
tile."""

from __future__ import annotations

import numpy as np
import pytest

import compiler as C
from compiler.lower import lower
from compiler.ops import build_op, default_schedule
from compiler.ops.custom import custom_op
from compiler.verify import poisoned

RNG = np.random.default_rng(5)


def exp_matmul_bias(M=37, N=45, K=19):
    A, B, D = C.placeholder((M, K), "float32", "A"), C.placeholder((N, K), "float32", "B"), C.placeholder((M,), "float32", "D")
    k = C.reduce_axis(K, "k")
    P = C.compute((M, N), lambda i, j: C.sum(C.exp(A[i, k]) * B[j, k], axis=k), name="exp_matmul")
    out = C.compute((M, N), lambda i, j: P[i, j] + D[i], name="exp_matmul_bias")
    return [A, B, D], out, lambda a, b, d: np.exp(a) @ b.T + d[:, None]


def matmul_at_b(M=33, N=70, K=21):
    A, B = C.placeholder((K, M), "float32", "A"), C.placeholder((K, N), "float32", "B")
    k = C.reduce_axis(K, "k")
    return [A, B], C.compute((M, N), lambda i, j: C.sum(A[k, i] * B[k, j], axis=k), name="at_b"), lambda a, b: a.T @ b


def conv1d(Ci=7, Co=11, L=53, KW=3):
    X, W = C.placeholder((1, Ci, L + KW - 1), "float32", "X"), C.placeholder((Co, Ci, KW), "float32", "W")
    c, r = C.reduce_axis(Ci, "c"), C.reduce_axis(KW, "r")
    out = C.compute((1, Co, L), lambda n, f, t: C.sum(X[n, c, t + r] * W[f, c, r], axis=[c, r]), name="conv1d")
    return [X, W], out, lambda x, w: sum(np.einsum("ct,fc->ft", x[0, :, r:r + L], w[:, :, r]) for r in range(KW))[None]


def attention_scores(H=3, S=29, D=12):
    Q, K = C.placeholder((H, S, D), "float32", "Q"), C.placeholder((H, S, D), "float32", "K")
    d = C.reduce_axis(D, "d")
    qk = C.compute((H, S, S), lambda h, i, j: C.sum(Q[h, i, d] * K[h, j, d], axis=d), name="qk")
    out = C.compute((H, S, S), lambda h, i, j: qk[h, i, j] * 0.125, name="scores")
    return [Q, K], out, lambda q, k: q @ k.transpose(0, 2, 1) * 0.125


def rmsnorm(R=37, H=50):
    X, G = C.placeholder((R, H), "float32", "X"), C.placeholder((H,), "float32", "G")
    h = C.reduce_axis(H, "h")
    ss = C.compute((R,), lambda i: C.sum(X[i, h] * X[i, h], axis=h), name="sumsq")
    out = C.compute((R, H), lambda i, j: X[i, j] / C.sqrt(ss[i] / H + 1e-6) * G[j], name="rmsnorm")
    return [X, G], out, lambda x, g: x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6) * g


def column_mean_abs(R=301, H=83):
    X = C.placeholder((R, H), "float32", "X")
    r = C.reduce_axis(R, "r")
    total = C.compute((H,), lambda j: C.sum(C.abs(X[r, j]), axis=r), name="col_sum_abs")
    return [X], C.compute((H,), lambda j: total[j] * (1.0 / R), name="col_mean_abs"), lambda x: np.abs(x).mean(axis=0)


def grouped_matmul(G=3, M=17, K=23, N=40):
    A, B = C.placeholder((G, M, K), "float32", "A"), C.placeholder((G, K, N), "float32", "B")
    k = C.reduce_axis(K, "k")
    return [A, B], C.compute((G, M, N), lambda g, i, j: C.sum(A[g, i, k] * B[g, k, j], axis=k), name="gmm"), lambda a, b: a @ b


def padded_box_filter(Ch=5, H=13, W=35, K=3):
    """A 3x3 box filter over zero padding (AveragePool with count_include_pad): a reduction
    reading a pad stage, on a row the vector does not divide."""
    from compiler.ops.transform import pad_tensor
    X = C.placeholder((1, Ch, H, W), "float32", "X")
    P = pad_tensor(X, (0, 0, 1, 1), (0, 0, 1, 1))
    ry, rx = C.reduce_axis(K, "ry"), C.reduce_axis(K, "rx")
    out = C.compute((1, Ch, H, W), lambda n, c, y, x: C.sum(P[n, c, y + ry, x + rx] * (1.0 / 9), axis=[ry, rx]), name="box")

    def reference(x):
        xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        return sum(xp[:, :, i:i + H, j:j + W] for i in range(K) for j in range(K)) / 9
    return [X], out, reference


CASES = {f.__name__: f for f in (exp_matmul_bias, matmul_at_b, conv1d, attention_scores, rmsnorm, column_mean_abs,
                                 grouped_matmul, padded_box_filter)}


@pytest.mark.parametrize("name", list(CASES))
def test_a_users_compute_gets_vectors_and_threads_and_is_right(name):
    inputs, out, reference = CASES[name]()
    op = custom_op(name, inputs, out)
    target = C.Target.host()
    text = str(lower(default_schedule(op, target), op.tensors))
    assert "vectorized for" in text, text   # not the naive nest
    arrays = [RNG.uniform(-1.0, 1.0, t.shape).astype(t.dtype) for t in op.inputs]
    got = poisoned(op.output.shape, op.output.dtype, 0)
    build_op(op, target)(*arrays, got)
    want = np.asarray(reference(*[a.astype(np.float64) for a in arrays])).reshape(got.shape)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * float(np.max(np.abs(want))))


@pytest.mark.parametrize("name, packed", [("exp_matmul_bias", "B_packed"), ("attention_scores", "K_packed")])
def test_an_operand_walked_across_its_rows_is_packed(name, packed):
    """Bᵀ and Kᵀ: the output's last axis walks the operand's leading axis; the operand is copied
    into blocks of the vector first (as the GEMM's panels), not gathered in the inner loop."""
    inputs, out, _ = CASES[name]()
    op = custom_op(name, inputs, out)
    assert any(st.name == packed for st in default_schedule(op, C.Target.host()).stages)


def test_padding_a_reduction_reads_is_materialized_not_inlined():
    """Inlined, the padding's border test and clamped index sit in every tap and make its vector
    loads gathers; the default materializes it once (a row copy) and the taps read it plainly."""
    inputs, out, _ = padded_box_filter()
    op = custom_op("box", inputs, out)
    s = default_schedule(op, C.Target.host())
    assert any(st.name == "pad" and not st.is_inline for st in s.stages)


def test_padding_of_an_axis_the_vector_does_not_run_along_stays_inlined():
    """A channel-blocked 3x3/2 max pool: its padding pads rows and columns, the vector runs along
    the channel block, so the border test is one per vector; inlined, no copy of the input
    (materialized, the copy took two thirds of ResNet-18's pool), and still right."""
    from compiler.ops.transform import pad_tensor
    X = C.placeholder((1, 2, 9, 11, 8), "float32", "X")
    P = pad_tensor(X, (0, 0, 1, 1, 0), (0, 0, 1, 1, 0), value=float("-inf"))
    ry, rx = C.reduce_axis(3, "ry"), C.reduce_axis(3, "rx")
    out = C.compute((1, 2, 5, 6, 8), lambda n, c, y, x, b: C.max(P[n, c, 2 * y + ry, 2 * x + rx, b], axis=[ry, rx]),
                    name="pool")
    op = custom_op("pool", [X], out)
    s = default_schedule(op, C.Target.host())
    assert all(st.is_inline for st in s.stages if st.name == "pad")
    x = RNG.uniform(-1.0, 1.0, X.shape).astype(np.float32)
    got = poisoned(out.shape, out.dtype, 0)
    build_op(op, C.Target.host())(x, got)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-np.inf)
    want = np.max([xp[:, :, i:i + 9:2, j:j + 11:2] for i in range(3) for j in range(3)], axis=0)
    np.testing.assert_array_equal(got, want)


def test_rows_summed_along_their_unit_stride_axis_are_not_packed():
    """RMSNorm's rows serve one output each: no copy, the sum runs along the row."""
    inputs, out, _ = rmsnorm()
    op = custom_op("rmsnorm", inputs, out)
    assert not any(st.name.endswith("_packed") for st in default_schedule(op, C.Target.host()).stages)


@pytest.mark.parametrize("rows, length", [(13, 70), (4, 33), (1, 257), (9, 32)])
@pytest.mark.parametrize("kind", ["sum_exp", "max"])
def test_rows_reduced_along_their_unit_stride_axis_keep_lane_partials(rows, length, kind):
    """A row sum of exp and a row maximum: partial results per vector lane, four rows in flight,
    then each row's lanes combined; lengths that leave a tail of the vector, row counts that
    leave a tail of four."""
    X = C.placeholder((rows, length), "float32", "X")
    h = C.reduce_axis(length, "h")
    if kind == "sum_exp":
        out = C.compute((rows,), lambda i: C.sum(C.exp(X[i, h] * 0.5), axis=h), name="row_sum_exp")
    else:
        out = C.compute((rows,), lambda i: C.max(X[i, h], axis=h), name="row_max")
    op = custom_op(kind, [X], out)
    target = C.Target.host()
    lane_partials = rows > 1 and length >= 2 * target.vector_lanes()   # one row: a whole-tensor reduction, one chain
    assert any(st.name.endswith("_rf") for st in default_schedule(op, target).stages) == lane_partials
    x = RNG.uniform(-3.0, 3.0, (rows, length)).astype(np.float32)
    got = poisoned(out.shape, "float32", 0)
    build_op(op, target)(x, got)
    want = np.exp(x.astype(np.float64) * 0.5).sum(axis=1) if kind == "sum_exp" else x.max(axis=1)
    np.testing.assert_allclose(got, want, rtol=2e-6)


def _global_pool(shape):
    """A global average pool of a channel-blocked [N, C/B, H, W, B] value (efficientnet's squeeze)."""
    n, cb, h, w, b = shape
    A = C.placeholder(shape, name="A")
    ry, rx = C.reduce_axis(h, "ry"), C.reduce_axis(w, "rx")
    out = C.compute((n, cb, 1, 1, b), lambda i, c, y, x, lane: C.sum(A[i, c, ry, rx, lane] * (1.0 / (h * w)), axis=[ry, rx]),
                    name="global_pool")
    return custom_op("global_pool", [A], out)


@pytest.mark.parametrize("shape, split", [((1, 2, 112, 112), True), ((1, 2, 113, 121), True),
                                          ((1, 7, 14, 14), False), ((1, 8, 56, 56), False)])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_reduction_with_few_outputs_splits_its_input_across_threads(shape, split, threads):
    """Two vectors of output over 112x112 rows are one thread's work: the outermost reduction
    loop is cut into parts summed in parallel (rfactor), then added up; rows that do not divide
    into the parts (113) are guarded. Few outputs over little input, and outputs enough for
    every core, are left as they were. Results are float64 numpy's at any team size. The channel
    block is the host's vector (16 floats of AVX-512 are one vector, two of AVX2)."""
    from compiler.loop_ir import For, walk_stmts
    from compiler.openmp import get_max_threads, set_num_threads
    from compiler.ops.schedule_common import lanes
    target = C.Target.host()
    target.num_cores = 2
    shape = (*shape, lanes(target, "float32"))
    op = _global_pool(shape)
    s = default_schedule(op, target)
    partial = any(st.op.name.endswith("_rf") for st in s.stages)
    loops = [n for n in walk_stmts(lower(s, op.tensors).body) if isinstance(n, For) and n.kind == "parallel"]
    assert partial == split
    if split:
        assert loops
    a = RNG.uniform(0.5, 2.0, shape).astype("f4")
    want = a.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    kernel = C.build(s, op.tensors, target)
    before = get_max_threads()
    set_num_threads(threads)
    try:
        for _ in range(3):
            out = poisoned(want.shape, "float32", 0)
            kernel(a, out)
            np.testing.assert_allclose(out, want, rtol=1e-5)
    finally:
        set_num_threads(before)
