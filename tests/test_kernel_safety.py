"""Kernels are right or fail cleanly: regression tests for what an outside cross-check found.

Anything that used to crash, hang or abort the process runs in a subprocess here, so a
regression is a failed test and not a dead test run.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import compiler as C
from compiler.errors import ArgumentError, DTypeError, ExprError, LoweringError, ScheduleError
from compiler.ops import build_op, get_op, random_inputs

REPO = Path(__file__).resolve().parents[1]


def run_isolated(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter; a crash shows as a non-zero return code."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def _run_op(op, inputs):
    out = np.full(op.output.shape, np.nan if op.output.dtype.startswith("float") else 7, op.output.dtype)
    build_op(op)(*inputs, out)
    return out


# ----------------------------------------------------------------------------- float max / min

@pytest.mark.parametrize("kind", ["reduce_max", "reduce_min"])
@pytest.mark.parametrize("rows,k", [(8, 10), (8, 11), (8, 13), (8, 14), (8, 15), (8, 16)])
def test_max_min_reductions_are_exact(kind, rows, k):
    """LLVM 22 vectorized llvm.maxnum reductions wrongly (max abs err 0.21 at (8, 10))."""
    op = get_op(kind, shape=(rows, k), axis=1)
    x = random_inputs(op, np.random.default_rng(k))
    np.testing.assert_array_equal(_run_op(op, x), op.reference(*x))


@pytest.mark.parametrize("func", ["exp", "tanh"])
@pytest.mark.parametrize("combiner", ["max", "min"])
@pytest.mark.parametrize("k", [5, 7, 9, 12, 15])
def test_max_min_of_a_math_function_naive_schedule(func, combiner, k):
    """`C[i] = max_k exp(A[i, k])` skipped elements k = 4..6 on (4, 7)."""
    A = C.placeholder((4, k), "float32", "A")
    r = C.reduce_axis(k, "r")
    red = C.max if combiner == "max" else C.min
    out = C.compute((4,), lambda i: red(getattr(C, func)(A[i, r]), axis=r), name="out")
    kern = C.build(C.create_schedule(out), [A, out])
    a = np.random.default_rng(k).uniform(-2, 2, (4, k)).astype(np.float32)
    got = np.full(4, np.nan, np.float32)
    kern(a, got)
    ref = getattr(np, func)(a.astype(np.float64))
    np.testing.assert_allclose(got, ref.max(1) if combiner == "max" else ref.min(1), rtol=1e-5)


def test_softmax_widths_that_aborted_llvm_build_and_are_right():
    """softmax (3, 36..39) aborted the process ("VPlan cost model and legacy cost model disagreed")."""
    proc = run_isolated("""
        import numpy as np
        from compiler.ops import build_op, get_op, random_inputs
        for n in (36, 37, 38, 39):
            for name, params in (("softmax", dict(shape=(3, n))), ("reduce_max", dict(shape=(3, n), axis=1)),
                                 ("reduce_min", dict(shape=(8, n), axis=1))):
                op = get_op(name, **params)
                x = random_inputs(op, np.random.default_rng(n))
                out = np.full(op.output.shape, np.nan, np.float32)
                build_op(op)(*x, out)
                np.testing.assert_allclose(out, op.reference(*x), rtol=1e-5, atol=1e-7)
        print("ok")
    """)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


def _nan_row_data():
    x = np.random.default_rng(0).uniform(0.1, 1.0, (4, 9)).astype(np.float32)
    x[1, 3] = np.nan
    x[2, :] = np.nan
    return x


@pytest.mark.parametrize("kind", ["reduce_max", "reduce_min"])
def test_reductions_propagate_nan_like_numpy(kind):
    op = get_op(kind, shape=(4, 9), axis=1)
    x = _nan_row_data()
    out = _run_op(op, [x])
    ref = np.max(x, axis=1) if kind == "reduce_max" else np.min(x, axis=1)
    np.testing.assert_array_equal(out, ref)  # NaN where numpy has NaN, also the all-NaN row
    assert np.isnan(out[1]) and np.isnan(out[2]) and not np.isnan(out[[0, 3]]).any()


def test_relu_and_max_pool_propagate_nan():
    x = np.array([1.0, np.nan, -2.0, 3.0] * 4, np.float32)
    out = _run_op(get_op("relu", shape=(16,)), [x])
    np.testing.assert_array_equal(out, np.maximum(x, 0))
    op = get_op("max_pool2d", N=1, C=1, H=4, W=4, kernel=2, stride=2)
    d = np.random.default_rng(1).uniform(0.1, 1, (1, 1, 4, 4)).astype(np.float32)
    d[0, 0, 0, 1] = np.nan
    out = _run_op(op, [d])
    assert np.isnan(out[0, 0, 0, 0]) and not np.isnan(out.ravel()[1:]).any()


@pytest.mark.parametrize("vectorized", [False, True])
@pytest.mark.parametrize("fn", ["maximum", "minimum"])
def test_elementwise_maximum_minimum_nan_semantics(fn, vectorized):
    A = C.placeholder((16,), "float32", "A")
    B = C.placeholder((16,), "float32", "B")
    out = C.compute((16,), lambda i: getattr(C, fn)(A[i], B[i]), name="out")
    s = C.create_schedule(out)
    if vectorized:
        s[out].vectorize(s[out].op.axis[0])
    k = C.build(s, [A, B, out])
    a = np.arange(16, dtype=np.float32)
    b = np.full(16, 5, np.float32)
    a[2], b[7], a[9], b[9] = np.nan, np.nan, np.nan, np.nan
    got = np.full(16, -1, np.float32)
    k(a, b, got)
    np.testing.assert_array_equal(got, getattr(np, fn)(a, b))


# ----------------------------------------------------------------------------- integer division

@pytest.mark.parametrize("dtype", ["int8", "int32", "int64"])
def test_integer_division_by_zero_and_overflow_give_numpy_results(dtype):
    """x // 0, x % 0 and INT_MIN // -1 killed the process with SIGFPE."""
    proc = run_isolated(f"""
        import numpy as np, compiler as C
        dt = "{dtype}"
        a = C.placeholder((64,), dt, "a"); b = C.placeholder((64,), dt, "b")
        for vec in (False, True):
            q = C.compute((64,), lambda i: a[i] // b[i], name="q")
            r = C.compute((64,), lambda i: a[i] % b[i], name="r")
            s = C.create_schedule([q, r])
            if vec:
                for t in (q, r):
                    _, inner = s[t].split(s[t].op.axis[0], factor=8)
                    s[t].vectorize(inner)
            k = C.build(s, [a, b, q, r])
            info = np.iinfo(dt)
            rng = np.random.default_rng(0)
            x = rng.integers(info.min, info.max, 64, dtype=dt, endpoint=True)
            y = rng.integers(-3, 4, 64, dtype=dt)
            x[:4], y[:4], y[4:8] = info.min, -1, 0
            qq, rr = np.full(64, 7, dt), np.full(64, 7, dt)
            k(x, y, qq, rr)
            with np.errstate(all="ignore"):
                assert np.array_equal(qq, x // y) and np.array_equal(rr, x % y), (vec, qq, x // y)
        print("ok")
    """)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


def test_constant_zero_divisor_is_rejected_at_definition():
    A = C.placeholder((8,), "int32", "A")
    for fn in (lambda i: A[i] // 0, lambda i: A[i] % 0, lambda i: C.floordiv(A[i], 0)):
        with pytest.raises(ExprError, match="constant 0"):
            C.compute((8,), fn)


# ----------------------------------------------------------------------------- constants and casts

def test_integer_constants_must_fit_their_dtype():
    A8 = C.placeholder((8,), "int8", "A8")
    A32 = C.placeholder((8,), "int32", "A32")
    with pytest.raises(DTypeError, match="1000 does not fit int8"):
        C.compute((8,), lambda i: A8[i] + 1000)
    with pytest.raises(DTypeError, match="does not fit int32"):
        C.compute((8,), lambda i: A32[i] * 2**40)
    with pytest.raises(DTypeError, match="not an integer"):
        C.const(1.5, "int32")
    out = C.compute((8,), lambda i: A8[i] + 127)  # the edge of the range is fine
    assert out.dtype == "int8"


def test_nan_or_out_of_range_constant_cast_to_int_is_an_error():
    with pytest.raises(DTypeError, match="cannot cast the constant nan"):
        C.const(float("nan")).astype("int32")
    with pytest.raises(DTypeError, match="does not fit int8"):
        C.cast("int8", C.const(300.0))


def test_float_to_int_casts_saturate_at_run_time():
    A = C.placeholder((6,), "float32", "A")
    out = C.compute((6,), lambda i: A[i].astype("int32"), name="out")
    k = C.build(C.create_schedule(out), [A, out])
    got = np.full(6, 7, np.int32)
    k(np.array([np.nan, 1e20, -1e20, 2.9, -2.9, np.inf], np.float32), got)
    assert got.tolist() == [0, 2**31 - 1, -2**31, 2, -2, 2**31 - 1]


# ----------------------------------------------------------------------------- axes in expressions

def test_axes_work_in_index_arithmetic():
    F = C.placeholder((8, 8), "float32", "F")
    k = C.reduce_axis(4, "k")
    out = C.compute((8,), lambda i: C.sum(F[i, 2 * k] + F[i, k + 1], axis=k), name="out")
    ry = C.reduce_axis(3, "ry")
    win = C.compute((6,), lambda y: C.sum(F[y + ry, y], axis=ry), name="win")
    kern = C.build(C.create_schedule([out, win]), [F, out, win])
    f = np.random.default_rng(0).uniform(0.1, 1, (8, 8)).astype(np.float32)
    o, w = np.full(8, np.nan, np.float32), np.full(6, np.nan, np.float32)
    kern(f, o, w)
    np.testing.assert_allclose(o, f[:, 0:8:2].sum(1) + f[:, 1:5].sum(1), rtol=1e-6)
    np.testing.assert_allclose(w, [f[y:y + 3, y].sum() for y in range(6)], rtol=1e-6)


def test_reduce_axis_or_foreign_axis_outside_its_reduction_is_an_expr_error():
    F = C.placeholder((8, 8), "float32", "F")
    k = C.reduce_axis(8, "k")
    with pytest.raises(ExprError, match="k is not an axis of this compute"):
        C.compute((8,), lambda i: F[i, k])
    other = C.compute((8,), lambda i: F[i, 0], name="other")
    with pytest.raises(ExprError, match="i is not an axis"):
        C.compute((8,), lambda j: F[j, 0] + F[other.op.axis[0], 0])


# ----------------------------------------------------------------------------- reads in bounds

def test_reads_that_can_leave_their_tensor_are_lowering_errors():
    A = C.placeholder((8,), "float32", "A")
    for shift in (1, 10**9, -1):
        out = C.compute((8,), lambda i: A[i + shift], name="out")
        with pytest.raises(LoweringError, match=r"read A\[.*\] can leave the tensor"):
            C.build(C.create_schedule(out), [A, out])


def test_guarded_reads_are_proven_in_bounds():
    A = C.placeholder((8,), "float32", "A")
    out = C.compute((8,), lambda i: C.if_then_else(i < 7, A[i + 1], 0.0)
                    + C.if_then_else(i >= 1, A[i - 1], 0.0), name="out")
    k = C.build(C.create_schedule(out), [A, out])
    a = np.arange(1, 9, dtype=np.float32)
    got = np.full(8, np.nan, np.float32)
    k(a, got)
    np.testing.assert_array_equal(got, np.r_[a[1:], 0] + np.r_[0, a[:-1]])


def test_reads_proven_in_bounds_through_scaled_and_one_variable_guards():
    """Found by the fuzzer: valid guarded reads that the first bounds proof refused."""
    A = C.placeholder((7,), "float32", "A")
    a = np.arange(1, 8, dtype=np.float32)
    got = np.full(8, np.nan, np.float32)
    out = C.compute((8,), lambda i: C.if_then_else(i < 3, A[2 * i + 1], 0.0), name="out")
    C.build(C.create_schedule(out), [A, out])(a, got)
    np.testing.assert_array_equal(got, [2, 4, 6, 0, 0, 0, 0, 0])
    out = C.compute((8,), lambda i: C.if_then_else(i >= 2, A[(i - 2) // 3], 0.0), name="out")
    C.build(C.create_schedule(out), [A, out])(a, got)
    np.testing.assert_array_equal(got, [0, 0, 1, 1, 1, 2, 2, 2])
    B = C.placeholder((30,), "float32", "B")
    k = C.reduce_axis(15, "k")
    total = C.compute((1,), lambda i: C.sum(B[2 * k + 1], axis=k), name="total")
    s = C.create_schedule(total)
    _, ki = s[total].split(s[total].op.reduce_axis[0], factor=2)  # 15 = 8 x 2 with a guarded tail
    s.rfactor(total, ki)
    b = np.arange(30, dtype=np.float32)
    t = np.full(1, np.nan, np.float32)
    C.build(s, [B, total])(b, t)
    assert t[0] == b[1::2].sum()
    halves = C.placeholder((18,), "float32", "halves")
    r = C.reduce_axis(36, "r")
    pairs = C.compute((1,), lambda i: C.sum(halves[r // 2], axis=r), name="pairs")
    s = C.create_schedule(pairs)
    _, ri = s[pairs].split(s[pairs].op.reduce_axis[0], factor=16)  # 36 = 3 x 16, guarded: r // 2 < 18
    s.rfactor(pairs, ri)
    h = np.arange(18, dtype=np.float32)
    t = np.full(1, np.nan, np.float32)
    C.build(s, [halves, pairs])(h, t)
    assert t[0] == 2 * h.sum()
    bad = C.compute((8,), lambda i: C.if_then_else(i < 4, A[2 * i + 1], 0.0), name="bad")
    with pytest.raises(LoweringError, match="can leave the tensor"):
        C.build(C.create_schedule(bad), [A, bad])


def test_a_guard_on_a_block_number_bounds_the_index_it_blocks():
    """`c // 8 >= 6` is `c >= 48`: a concat's branch test on a channel block guards a read at
    `min(c - 48, 4)` (the model fuzzer's finding on 8-lane targets); the bound is not widened
    past the block, so a read that the block's last lanes take outside stays refused."""
    A = C.placeholder((5,), "float32", "A")
    a = np.arange(1, 6, dtype=np.float32)
    got = np.full(53, np.nan, np.float32)
    out = C.compute((53,), lambda c: C.if_then_else(c // 8 >= 6, A[C.min(c - 48, 4)], 0.0), name="out")
    C.build(C.create_schedule(out), [A, out])(a, got)
    np.testing.assert_array_equal(got, np.r_[np.zeros(48, np.float32), a])
    got = np.full(53, np.nan, np.float32)
    out = C.compute((53,), lambda c: C.if_then_else(c // 8 < 6, 0.0, A[C.min(c - 48, 4)]), name="out")
    C.build(C.create_schedule(out), [A, out])(a, got)
    np.testing.assert_array_equal(got, np.r_[np.zeros(48, np.float32), a])
    low = C.compute((53,), lambda c: C.if_then_else(c // 8 <= 0, A[c], 0.0), name="low")
    with pytest.raises(LoweringError, match="can leave the tensor"):   # c in 0..7, A has 5
        C.build(C.create_schedule(low), [A, low])
    wide = C.compute((56,), lambda c: C.if_then_else(c // 8 >= 6, A[c - 48], 0.0), name="wide")
    with pytest.raises(LoweringError, match="can leave the tensor"):   # c - 48 in 0..7
        C.build(C.create_schedule(wide), [A, wide])


def test_a_conjunction_reads_its_right_side_only_where_the_left_side_holds():
    """`i < 7 && A[i + 1] > 0` is a guard; rfactor of a split reduction puts its bound first, so a
    `where` that reads with the reduction index never reads past the tensor (found by the fuzzer)."""
    A = C.placeholder((8,), "float32", "A")
    out = C.compute((8,), lambda i: C.if_then_else((i < 7) & (A[i + 1] > 0.0), 1.0, 0.0), name="out")
    s = C.create_schedule(out)
    _, inner = s[out].split(out.op.axis[0], factor=4)
    s[out].vectorize(inner)
    a = np.array([1, -1, 2, -2, 3, -3, 4, -4], np.float32)
    got = np.full(8, np.nan, np.float32)
    C.build(s, [A, out])(a, got)
    np.testing.assert_array_equal(got, np.r_[(a[1:] > 0).astype(np.float32), 0])
    B = C.placeholder((11,), "int32", "B")
    X = C.placeholder((11,), "float32", "X")
    r = C.reduce_axis(11, "r")
    low = C.compute((1,), lambda i: C.min(X[r], axis=r, where=C.not_equal(B[10 - r], -2)), name="low")
    s = C.create_schedule(low)
    _, ri = s[low].split(s[low].op.reduce_axis[0], factor=8)  # 11 = 2 x 8 with a guarded tail
    s.rfactor(low, ri)
    b = np.array([1, -2, 3, 4, -2, 5, 6, 7, 8, 9, 10], np.int32)
    x = np.arange(11, 0, -1).astype(np.float32)
    t = np.full(1, np.nan, np.float32)
    C.build(s, [B, X, low])(b, x, t)
    assert t[0] == x[b[::-1] != -2].min()


def test_padded_depthwise_conv_default_schedule_is_proven_in_bounds():
    """The packed, padded input of a depthwise conv reads `max(j - 1, 0)` under `j < 16`
    (fuzzer seed 91): refusing it would leave the operator without its default schedule."""
    op = get_op("depthwise_conv2d_nchw", N=2, C=2, H=11, W=15, KH=5, KW=3, stride=(3, 3), padding=(0, 1, 0, 0),
                multiplier=3)
    x = random_inputs(op, np.random.default_rng(91))
    np.testing.assert_allclose(_run_op(op, x), op.reference(*x), rtol=1e-5, atol=1e-6)


def test_vectorized_select_with_a_uniform_condition_and_a_reading_branch():
    """Found by the fuzzer (seed 298): invalid LLVM IR (a broadcast between the branches and the phi)."""
    A = C.placeholder((3,), "int64", "A")
    B = C.placeholder((4, 15), "int64", "B")
    out = C.compute((4, 15), lambda i, j: C.if_then_else(C.equal(i % 2, 0), A[i % 3], B[i, j]), name="out")
    s = C.create_schedule(out)
    s[out].vectorize(out.op.axis[1])
    k = C.build(s, [A, B, out])
    a, b = np.array([5, 6, 7]), np.arange(60).reshape(4, 15)
    got = np.full((4, 15), -1, np.int64)
    k(a, b, got)
    np.testing.assert_array_equal(got, np.where((np.arange(4) % 2 == 0)[:, None], a[np.arange(4) % 3][:, None], b))


def test_data_dependent_indices_are_checked_not_clamped():
    """An index read from data that leaves its tensor is an error, never a clamped row
    (tests/test_index_checks.py covers the rest)."""
    A = C.placeholder((8,), "float32", "A")
    idx = C.placeholder((5,), "int32", "idx")
    out = C.compute((5,), lambda i: A[idx[i]], name="out")
    k = C.build(C.create_schedule(out), [A, idx, out])
    a = np.arange(8, dtype=np.float32)
    got = np.full(5, np.nan, np.float32)
    for bad in (100, -5, 8):
        with pytest.raises(C.KernelRuntimeError, match=rf"out: A\[int64\(idx\[i\]\)\] dimension 0: index {bad} is out of range \[0, 8\)"):
            k(a, np.array([0, 3, bad, 1, 7], np.int32), got)
    k(a, np.array([0, 3, 5, 1, 7], np.int32), got)
    np.testing.assert_array_equal(got, a[[0, 3, 5, 1, 7]])


# ----------------------------------------------------------------------------- unrolling and memory

def test_unbounded_unroll_is_a_schedule_error():
    for n in (20_000, 200_000):
        A = C.placeholder((n,), "float32", "A")
        out = C.compute((n,), lambda i: A[i] * 2.0 + 1.0, name="out")
        s = C.create_schedule(out)
        s[out].unroll(s[out].op.axis[0])
        with pytest.raises(ScheduleError, match="unroll"):
            C.build(s, [A, out])


def test_local_buffer_in_an_unrolled_loop_is_allocated_once():
    """A 32 KiB buffer computed inside a loop unrolled 300 times overflowed the stack."""
    proc = run_isolated("""
        import numpy as np, compiler as C
        A = C.placeholder((300, 8192), "float32", "A")
        T = C.compute((300, 8192), lambda i, j: A[i, j] * 2.0, name="T")
        out = C.compute((300,), lambda i: T[i, 0] + T[i, 8191], name="out")
        s = C.create_schedule(out)
        s[T].compute_at(s[out], s[out].op.axis[0])
        s[out].unroll(s[out].op.axis[0])
        k = C.build(s, [A, out])
        a = np.random.default_rng(0).uniform(0.1, 1, (300, 8192)).astype(np.float32)
        got = np.full(300, np.nan, np.float32)
        k(a, got)
        np.testing.assert_allclose(got, 2 * a[:, 0] + 2 * a[:, -1], rtol=1e-6)
        print("ok")
    """)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


def test_many_large_local_buffers_go_to_the_heap_not_the_stack():
    """Twenty 32 KiB tiles per thread would be 640 KiB of stack; past the budget they are heap."""
    A = C.placeholder((4, 20, 8192), "float32", "A")

    def tile(t):
        return C.compute((4, 8192), lambda i, j: A[i, t, j] * float(t + 1), name=f"T{t}")
    stages = [tile(t) for t in range(20)]
    out = C.compute((4,), lambda i: sum(T[i, 8191] for T in stages), name="out")
    s = C.create_schedule(out)
    s[out].parallel(s[out].op.axis[0])
    for T in stages:
        s[T].compute_at(s[out], s[out].op.axis[0])
    k = C.build(s, [A, out])
    a = np.random.default_rng(0).uniform(0.1, 1, (4, 20, 8192)).astype(np.float32)
    got = np.full(4, np.nan, np.float32)
    k(a, got)
    np.testing.assert_allclose(got, (a[:, :, -1] * np.arange(1, 21)).sum(1), rtol=1e-5)


@pytest.mark.parametrize("where", ["root", "per thread", "per thread in a team"])
def test_failed_scratch_allocation_raises_kernel_runtime_error(where):
    """aligned_alloc was not checked and the kernel's status never read: a segfault. In a team
    (compiler/parallel_teams.py: a parallel copy P, then the parallel reduction), the thread that
    cannot allocate returns at once: the others must not wait for it, nor take its chunks' bounds
    for the next loop's."""
    attach = "s[T].compute_at(s[out], s[out].op.axis[0])" if where != "root" else ""
    team = where.endswith("team")
    proc = run_isolated(f"""
        import resource, numpy as np, compiler as C
        from compiler.codegen_llvm import generate
        A = C.placeholder((4, 64), "float32", "A")
        P = C.compute((4, 64), lambda i, j: A[i, j] + 1.0, name="P") if {team} else A
        T = C.compute((4, 1 << 28), lambda i, j: P[i, j % 64] * 2.0, name="T")   # 4 GiB, or 1 GiB a thread
        r = C.reduce_axis(1 << 28, "r")
        out = C.compute((4,), lambda i: C.sum(T[i, r], axis=r), name="out")
        s = C.create_schedule(out)
        s[out].parallel(s[out].op.axis[0])
        if {team}:
            s[P].parallel(s[P].op.axis[0])
        {attach}
        forks = str(generate(C.lower(s, [A, out]), C.Target.host())).count('call void @"GOMP_parallel"(')
        assert forks == 1 or not {team}
        k = C.build(s, [A, out])
        resource.setrlimit(resource.RLIMIT_AS, (800 << 20, resource.getrlimit(resource.RLIMIT_AS)[1]))
        got = np.full(4, np.nan, np.float32)
        for _ in range(3):  # nothing leaked or left half-done: it fails the same way every time
            try:
                k(np.ones((4, 64), np.float32), got)
            except C.KernelRuntimeError as e:
                assert "out of memory" in str(e) and e.status == 1
            else:
                raise SystemExit("no error")
        print("ok")
    """)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


# ----------------------------------------------------------------------------- calling kernels

def _scale_kernel(target=None, parallel=True):
    A = C.placeholder((256, 256), "float32", "A")
    B = C.compute((256, 256), lambda i, j: A[i, j] * 2.0, name="B")
    s = C.create_schedule(B)
    if parallel:
        s[B].parallel(s[B].op.axis[0])
    return C.build(s, [A, B], target=target, name="scale")


def test_a_fresh_kernel_is_safe_to_call_from_several_threads():
    """Its lazy loader raced: four threads calling a fresh kernel at once segfaulted."""
    proc = run_isolated("""
        import threading, numpy as np, compiler as C
        A = C.placeholder((256, 256), "float32", "A")
        B = C.compute((256, 256), lambda i, j: A[i, j] * 2.0, name="B")
        s = C.create_schedule(B); s[B].parallel(s[B].op.axis[0])
        blob = C.build(s, [A, B], name="scale").to_bytes()
        a = np.random.default_rng(0).uniform(0.1, 1, (256, 256)).astype(np.float32)
        for _ in range(10):
            k = C.load_kernel(blob)
            outs = [np.full_like(a, np.nan) for _ in range(4)]
            threads = [threading.Thread(target=k, args=(a, o)) for o in outs]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert all(np.array_equal(o, a * 2) for o in outs)
        print("ok")
    """)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


@pytest.mark.parametrize("triple", ["x86_64-pc-windows-msvc", "x86_64-apple-darwin", "aarch64-apple-darwin"])
def test_kernels_in_another_object_format_are_refused_before_loading(triple):
    """LLVM aborted the process ("Incompatible object format") on a COFF or Mach-O object."""
    proc = run_isolated(f"""
        import numpy as np, compiler as C
        A = C.placeholder((16,), "float32", "A")
        B = C.compute((16,), lambda i: A[i] * 2.0, name="B")
        k = C.build(C.create_schedule(B), [A, B], target="llvm -mtriple={triple}")
        for kern in (k, C.load_kernel(k.to_bytes())):
            try:
                kern(np.ones(16, np.float32), np.ones(16, np.float32))
            except C.KernelLoadError as e:
                print("refused:", e)
            else:
                raise SystemExit("ran")
    """)
    assert proc.returncode == 0 and proc.stdout.count("refused:") == 2, proc.stderr[-2000:]


def test_outputs_overlapping_other_arguments_are_refused():
    k = _scale_kernel(parallel=False)
    a = np.random.default_rng(0).uniform(0.1, 1, (512, 256)).astype(np.float32)
    with pytest.raises(ArgumentError, match="overlaps argument A"):
        k(a[:256], a[:256])
    with pytest.raises(ArgumentError, match="overlaps"):
        k(a[:256], a[128:384])
    k(a[:256], a[256:])  # disjoint halves of one array are fine
    np.testing.assert_array_equal(a[256:], 2 * a[:256])


def test_read_only_inputs_are_accepted_read_only_outputs_are_not():
    k = _scale_kernel(parallel=False)
    a = np.random.default_rng(0).uniform(0.1, 1, (256, 256)).astype(np.float32)
    a.flags.writeable = False
    out = np.full((256, 256), np.nan, np.float32)
    k(a, out)
    np.testing.assert_array_equal(out, a * 2)
    with pytest.raises(ArgumentError, match="read-only"):
        k(out, a)
    assert [spec.written for spec in k.args] == [False, True]
    assert [spec.written for spec in C.load_kernel(k.to_bytes()).args] == [False, True]


@pytest.mark.parametrize("name", ["free", "aligned_alloc", "tanh", "tanhf", "GOMP_parallel", "omp_get_thread_num"])
def test_kernel_names_of_runtime_functions_are_refused(name):
    A = C.placeholder((4,), "float32", "A")
    B = C.compute((4,), lambda i: C.tanh(A[i]), name="B")
    with pytest.raises(ArgumentError, match="reserved"):
        C.build(C.create_schedule(B), [A, B], name=name)


def test_fork_after_parallel_kernels_runs_the_child_on_one_thread():
    """libgomp's pool does not survive fork: the child's next parallel kernel hung forever."""
    proc = run_isolated("""
        import os, time, warnings, numpy as np, compiler as C
        A = C.placeholder((256, 256), "float32", "A")
        B = C.compute((256, 256), lambda i, j: A[i, j] * 2.0, name="B")
        s = C.create_schedule(B); s[B].parallel(s[B].op.axis[0])
        k = C.build(s, [A, B], name="scale")
        a = np.ones((256, 256), np.float32); b = np.empty_like(a)
        k(a, b)
        pid = os.fork()
        if pid == 0:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                k(a, b); k(a, b)
            ok = (b == 2).all() and sum("forked" in str(w.message) for w in caught) == 1
            os._exit(0 if ok else 3)
        deadline = time.time() + 30
        while time.time() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                print("child status", os.waitstatus_to_exitcode(status))
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            print("child hung")
        k(a, b)  # the parent keeps all its threads
        print("parent ok", (b == 2).all())
    """)
    assert "child status 0" in proc.stdout and "parent ok True" in proc.stdout, proc.stdout + proc.stderr[-2000:]
