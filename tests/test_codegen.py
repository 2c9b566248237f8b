"""Properties of the generated code: vector instructions, unrolling, parallel outlining."""

import numpy as np
import pytest

import compiler as C
from compiler.codegen_llvm import generate
from compiler.ops import get_op
from compiler.ops.base import random_inputs
from compiler.ops.schedule_gemm import schedule_gemm


def _ir(s, args):
    return str(generate(C.lower(s, args), C.Target.host()))


def _vector_add(n, lanes):
    A = C.placeholder((n,), name="A")
    B = C.placeholder((n,), name="B")
    out = C.compute((n,), lambda i: A[i] + B[i], name="out")
    s = C.create_schedule(out)
    _, xi = s[out].split(s[out].op.axis[0], factor=lanes)
    s[out].vectorize(xi)
    return s, [A, B, out]


def test_vectorized_loop_emits_vector_loads_and_stores():
    s, args = _vector_add(64, 8)
    ir = _ir(s, args)
    assert "load <8 x float>" in ir
    assert "store <8 x float>" in ir
    assert "masked" not in ir  # 64 divides by 8: no tail mask


def test_vector_tail_uses_masks_and_stays_correct():
    s, args = _vector_add(29, 8)
    assert "llvm.masked.store" in _ir(s, args)
    k = C.build(s, args)
    a, b = np.random.rand(29).astype("f4") + 0.1, np.random.rand(29).astype("f4") + 0.1
    out = np.full(29, np.nan, "f4")
    k(a, b, out)
    np.testing.assert_allclose(out, a + b, rtol=1e-6)


@pytest.mark.parametrize("lanes", [4, 16])
def test_row_chosen_by_a_select_of_a_loaded_index_is_one_contiguous_vector(lanes):
    """t[select(i[a] < 0, i[a] + n, i[a]), c] with c vectorized: the select's branches are uniform
    across the lanes, so the row address stays one pointer and the row is one vector load
    (it was once made a vector of pointers, which LLVM refused)."""
    n, m = 10, 2 * lanes
    T = C.placeholder((n, m), name="T")
    idx = C.placeholder((5, 3), "int64", name="idx")

    def row(a, b, c):
        v = idx[a, b]
        return T[C.if_then_else(v < 0, v + n, v), c]
    out = C.compute((5, 3, m), row, name="out")
    s = C.create_schedule(out)
    _, ci = s[out].split(s[out].op.axis[2], factor=lanes)
    s[out].vectorize(ci)
    assert f"load <{lanes} x float>" in _ir(s, [T, idx, out])
    rng = np.random.default_rng(7)
    t = rng.random((n, m), dtype=np.float32) + 0.5
    i = rng.integers(-n, n, size=(5, 3))
    got = np.full((5, 3, m), np.nan, np.float32)
    C.build(s, [T, idx, out])(t, i, got)
    np.testing.assert_array_equal(got, t[np.where(i < 0, i + n, i)])


def test_unrolled_loop_has_no_loop():
    A = C.placeholder((4,), name="A")
    out = C.compute((4,), lambda i: A[i] * 2.0, name="out")
    s = C.create_schedule(out)
    s[out].unroll(s[out].op.axis[0])
    ir = _ir(s, [A, out])
    assert "phi" not in ir
    assert ir.count("fmul") == 4


def test_parallel_loop_is_outlined_to_libgomp():
    """Threads claim chunks of the loop as they come free (a thread on a shared core takes
    fewer), and every iteration runs once: 37 rows in chunks that do not divide them."""
    A = C.placeholder((37, 16 * 1024), name="A")
    out = C.compute((37, 16 * 1024), lambda i, j: A[i, j] + 1.0, name="out")
    s = C.create_schedule(out)
    s[out].parallel(s[out].op.axis[0])
    ir = _ir(s, [A, out])
    # chunks claimed by an atomic add on the loop's own counter, not libgomp's work-sharing loop
    assert "GOMP_parallel" in ir and "atomicrmw add" in ir and "GOMP_loop" not in ir
    _every_iteration_once(C.build(s, [A, out]), lambda a: a + 1.0, (37, 16 * 1024))


def test_a_parallel_loop_inside_a_serial_one_claims_all_its_chunks_on_each_entry():
    """A parallel loop under a serial loop forks once per outer iteration; its chunk counter
    starts again at 0 each time, so every entry runs all of its chunks (5 entries of 37 rows)."""
    A = C.placeholder((5, 37, 4096), name="A")
    out = C.compute((5, 37, 4096), lambda b, i, j: A[b, i, j] * 2.0 + 1.0, name="out")
    s = C.create_schedule(out)
    s[out].parallel(s[out].op.axis[1])
    ir = _ir(s, [A, out])
    assert ir.count("call void @\"GOMP_parallel\"") == 1
    _every_iteration_once(C.build(s, [A, out]), lambda a: a * 2.0 + 1.0, (5, 37, 4096))


def _every_iteration_once(kernel, expected, shape):
    """The kernel's output is `expected(input)` everywhere, on 1 and 2 threads, call after call."""
    from compiler.openmp import get_max_threads, set_num_threads
    a = np.random.default_rng(3).uniform(0.5, 2.0, shape).astype("f4")
    before = get_max_threads()
    for threads in (1, 2):
        set_num_threads(threads)
        try:
            for _ in range(3):     # the counter starts again at 0 on every call
                o = np.full_like(a, np.nan)
                kernel(a, o)
                np.testing.assert_allclose(o, expected(a), rtol=1e-6)
        finally:
            set_num_threads(before)


@pytest.mark.parametrize("rows, cols, team", [(8, 16, 1), (64, 4096, 16), (3, 1 << 16, 3)])
def test_a_parallel_loop_s_team_follows_its_work(rows, cols, team):
    """One thread per MIN_WORK_PER_THREAD stored elements and per iteration of the loop, at
    most omp_get_max_threads() at run time: 128 additions run on one thread, not on every core
    (the team a 16-core host started for a microsecond kernel cost more than the kernel); the
    results are the same whatever the team."""
    from compiler.codegen_llvm import MIN_WORK_PER_THREAD, parallel_team_cap
    from compiler.loop_ir import For, walk_stmts
    A = C.placeholder((rows, cols), name="A")
    out = C.compute((rows, cols), lambda i, j: A[i, j] * 2.0 + 1.0, name="out")
    s = C.create_schedule(out)
    s[out].parallel(s[out].op.axis[0])
    f = C.lower(s, [A, out])
    loop = next(n for n in walk_stmts(f.body) if isinstance(n, For) and n.kind == "parallel")
    assert parallel_team_cap(loop) == team == min(max(1, rows * cols // MIN_WORK_PER_THREAD), rows)
    assert "omp_get_max_threads" in _ir(s, [A, out])
    a = np.random.default_rng(rows).standard_normal((rows, cols)).astype("f4")
    o = np.full_like(a, np.nan)
    C.build(s, [A, out])(a, o)
    np.testing.assert_allclose(o, a * 2.0 + 1.0, rtol=1e-6)


def test_a_reduction_s_team_counts_its_multiply_adds_at_a_quarter():
    """A batch-1 layer of 784 x 512 multiply-adds parallel over its 512 outputs takes 6 threads
    (onnxruntime's GEMM gives it about as many), not every core."""
    from compiler.codegen_llvm import parallel_team_cap
    from compiler.loop_ir import For, walk_stmts
    X, W = C.placeholder((784,), name="X"), C.placeholder((512, 784), name="W")
    k = C.reduce_axis(784, "k")
    out = C.compute((512,), lambda j: C.sum(X[k] * W[j, k], axis=k), name="out")
    s = C.create_schedule(out)
    s[out].parallel(s[out].op.axis[0])
    loop = next(n for n in walk_stmts(C.lower(s, [X, W, out]).body) if isinstance(n, For) and n.kind == "parallel")
    assert parallel_team_cap(loop) == 6


def _channel_shuffle(blocks: int, rows: int, groups: int = 4, lanes: int = 16):
    """ShuffleNet's channel shuffle between channel-blocked layers [1, blocks, rows, lanes]: each
    lane of an output block reads another block's lane (a gather along the vector)."""
    A = C.placeholder((1, blocks, rows, lanes), name="A")
    per = blocks * lanes // groups

    def src(c, lane):
        ch = (lane % groups) * per + (c * lanes + lane) // groups   # output channel c*lanes+lane
        return ch // lanes, ch % lanes
    out = C.compute((1, blocks, rows, lanes),
                    lambda n, c, r, lane: A[n, src(c, lane)[0], r, src(c, lane)[1]], name="out")

    def reference(a):
        flat = a.transpose(0, 1, 3, 2).reshape(blocks * lanes, rows)          # channel-major
        c_out = np.arange(blocks * lanes)
        ch = (c_out % groups) * per + c_out // groups
        return flat[ch].reshape(blocks, lanes, rows).transpose(0, 2, 1)[None]
    return A, out, reference


def test_a_gathered_element_counts_gather_work_in_a_team():
    """A stored element gathered across the vector's lanes (a channel shuffle) counts GATHER_WORK
    toward its loop's team, an element copied in order one: a 27K-element shuffle takes several
    threads where a copy of as many elements takes one."""
    from compiler.codegen_llvm import GATHER_WORK, MIN_WORK_PER_THREAD, parallel_team_cap
    from compiler.loop_ir import For, walk_stmts
    A, shuffled, _ = _channel_shuffle(34, 49)
    copied = C.compute(A.shape, lambda n, c, r, lane: A[n, c, r, lane] + 1.0, name="copied")
    caps = []
    for out in (shuffled, copied):
        s = C.create_schedule(out)
        st = s[out]
        st.vectorize(st.op.axis[3])
        st.parallel(st.fuse(*st.op.axis[:3]))
        loop = next(n for n in walk_stmts(C.lower(s, [A, out]).body) if isinstance(n, For) and n.kind == "parallel")
        caps.append(parallel_team_cap(loop))
    elements = 34 * 49 * 16
    assert caps == [int(elements * GATHER_WORK) // MIN_WORK_PER_THREAD, 1] and caps[0] > 1


@pytest.mark.parametrize("blocks, rows", [(34, 49), (6, 13), (8, 3)])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_default_channel_shuffle_is_parallel_by_its_gathers_and_matches_numpy(blocks, rows, threads):
    """The default injective schedule weighs a gathered element as GATHER_WORK: ShuffleNet's
    shuffle of 34 blocks of 7x7 (27K elements, under PARALLEL_MIN_WORK) runs in parallel, and the
    result is numpy's at any team size, odd sizes included."""
    from compiler.loop_ir import For, walk_stmts
    from compiler.openmp import get_max_threads, set_num_threads
    from compiler.ops.schedule_elementwise import schedule_injective_stage
    A, out, reference = _channel_shuffle(blocks, rows)
    s = C.create_schedule(out)
    schedule_injective_stage(s[out], C.Target.host())
    lowered = C.lower(s, [A, out])
    parallel = any(isinstance(n, For) and n.kind == "parallel" for n in walk_stmts(lowered.body))
    from compiler.codegen_llvm import GATHER_WORK
    from compiler.ops.schedule_common import PARALLEL_MIN_WORK
    assert parallel == (C.Target.host().num_cores > 1 and blocks * rows * 16 * GATHER_WORK >= PARALLEL_MIN_WORK)
    assert parallel == ((blocks, rows) == (34, 49))
    a = np.random.default_rng(blocks).uniform(0.5, 2.0, A.shape).astype("f4")
    o = np.full_like(a, np.nan)
    kernel = C.build(s, [A, out])
    before = get_max_threads()
    set_num_threads(threads)
    try:
        for _ in range(3):
            kernel(a, o)
            np.testing.assert_array_equal(o, reference(a))
            o.fill(np.nan)
    finally:
        set_num_threads(before)


def test_gemm_micro_kernel_is_fmas_on_registers():
    """The packed register tile must compile to FMAs with unit-stride loads, no gathers."""
    import llvmlite.binding as llvm

    op = get_op("matmul", M=64, N=64, K=64)
    s = schedule_gemm(op)
    t = C.Target.host()
    ir = _ir(s, op.tensors)
    assert "gather" not in ir
    m = llvm.parse_assembly(ir)
    m.triple = t.triple
    pb = llvm.create_pass_builder(t.target_machine(), llvm.create_pipeline_tuning_options(speed_level=3))
    pb.getModulePassManager().run(m, pb)
    asm = t.target_machine().emit_assembly(m)
    assert "vfmadd" in asm or "fmla" in asm


@pytest.mark.parametrize("name,params", [
    ("matmul", dict(M=37, N=45, K=19)),
    ("matmul", dict(M=6, N=16, K=4)),
    ("matmul", dict(M=1, N=7, K=3)),
    ("matmul", dict(M=29, N=33, K=65, transpose_b=True)),
    ("matmul_int8", dict(M=13, N=17, K=31)),
    ("dense", dict(batch=17, in_dim=50, out_dim=33, epilogue="gelu")),
    ("dense", dict(batch=1, in_dim=64, out_dim=100, epilogue="relu")),
    ("batch_matmul", dict(B=3, M=13, N=21, K=9)),
])
def test_gemm_default_schedule_matches_numpy(name, params):
    op = get_op(name, **params)
    k = C.build(schedule_gemm(op), op.tensors)
    ins = random_inputs(op, np.random.default_rng(1))
    out = np.full(op.output.shape, np.nan if op.output.dtype.startswith("float") else -12345,
                  op.output.dtype)
    k(*ins, out)
    ref = op.reference(*ins)
    if op.output.dtype.startswith("int"):
        np.testing.assert_array_equal(out, ref)
    else:
        assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5


def _transposed_tile(n=16):
    """out = Aᵀ @ B with a register tile cached [j][i] (cache_write order; its vector axis i) and
    stored along j, the output's rows: the store reads the stack tile 16 floats apart."""
    A = C.placeholder((24, n), name="A")
    B = C.placeholder((24, n), name="B")
    k = C.reduce_axis(24, "k")
    out = C.compute((n, n), lambda i, j: C.sum(A[k, i] * B[k, j], axis=k), name="out")
    s = C.create_schedule(out)
    acc = s.cache_write(out, "local", order=[1, 0])
    st, cst = s[out], s[acc]
    i, j = st.op.axis
    jo, ji = st.split(j, factor=4)
    st.reorder(jo, i, ji)
    st.unroll(i)
    st.vectorize(ji)            # the store runs along j: the tile's lanes are 16 floats apart
    cst.compute_at(st, jo)
    cj, ci = cst.op.axis
    (kk,) = cst.op.reduce_axis
    cst.reorder(kk, cj, ci)
    cst.unroll(cj)
    cst.vectorize(ci)
    return s, [A, B, out]


def test_a_strided_read_of_a_stack_tile_is_per_lane_not_a_gather():
    """A gather takes the stack tile's address and keeps it out of registers; per-lane loads at
    constant offsets let SROA promote it. The kernel stays correct."""
    s, args = _transposed_tile()
    ir = _ir(s, args)
    assert "gather" not in ir and "scatter" not in ir
    rng = np.random.default_rng(2)
    a = rng.uniform(-1, 1, (24, 16)).astype(np.float32)
    b = rng.uniform(-1, 1, (24, 16)).astype(np.float32)
    out = np.full((16, 16), np.nan, np.float32)
    C.build(s, args)(a, b, out)
    np.testing.assert_allclose(out, a.T.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n,lanes", [(35, 16), (37, 8), (16, 16), (9, 4)])
def test_clamped_unit_stride_reads_are_vector_loads_and_keep_the_clamp(n, lanes):
    """A read whose index is unit-stride in the lanes but for min/max clamps (replicate padding,
    a split's overhang) is a vector load where no clamp bites and, where one does, a masked load
    plus the bound's element: never a gather, and every lane still reads its clamped element."""
    X = C.placeholder((n,), name="X")
    out = C.compute((n,), lambda i: X[C.minimum(C.maximum(i - 2, 0), n - 1)] * 2.0 + X[C.minimum(i + 3, n - 1)],
                    name="out")
    s = C.create_schedule(out)
    _, xi = s[out].split(s[out].op.axis[0], factor=lanes)
    s[out].vectorize(xi)
    ir = _ir(s, [X, out])
    assert "gather" not in ir and (f"load <{lanes} x float>" in ir or f"masked.load.v{lanes}f32" in ir)
    x = np.random.default_rng(3).uniform(0.5, 1.5, n).astype(np.float32)
    y = np.full(n, np.nan, np.float32)
    C.build(s, [X, out])(x, y)
    i = np.arange(n)
    np.testing.assert_allclose(y, x[np.clip(i - 2, 0, n - 1)] * 2.0 + x[np.minimum(i + 3, n - 1)], rtol=1e-6)


@pytest.mark.parametrize("clamp", ["two terms", "crossing bounds"])
def test_clamps_the_edge_path_cannot_take_still_read_the_right_elements(clamp):
    """Clamps on two different terms of one index, or bounds that may cross (max(min(j, i), i + 2)
    is i + 2): the gather of the clamped index, correct."""
    X = C.placeholder((8, 10), name="X")
    if clamp == "two terms":
        out = C.compute((8, 8), lambda i, j: X[C.minimum(i + j, 7), C.minimum(j + 1, 7)], name="out")
    else:
        out = C.compute((8, 8), lambda i, j: X[i, C.maximum(C.minimum(j, i), i + 2)], name="out")
    s = C.create_schedule(out)
    s[out].vectorize(s[out].op.axis[1])
    x = np.random.default_rng(4).uniform(-1, 1, (8, 10)).astype(np.float32)
    y = np.full((8, 8), np.nan, np.float32)
    C.build(s, [X, out])(x, y)
    i, j = np.meshgrid(np.arange(8), np.arange(8), indexing="ij")
    want = x[np.minimum(i + j, 7), np.minimum(j + 1, 7)] if clamp == "two terms" else x[i, np.maximum(np.minimum(j, i), i + 2)]
    np.testing.assert_allclose(y, want)
