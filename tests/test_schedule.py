"""Schedule primitives: every error case leaves the schedule untouched; every primitive computes the
same results as numpy (outputs poisoned first); recorded steps replay on a fresh definition."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

import compiler as C
from compiler.errors import LoweringError, ScheduleError
from compiler.loop_ir import For, Prefetch, format_expr, walk_stmts
from compiler.lower import lower
from compiler.schedule_steps import STEP_FIELDS, apply_steps, steps_from_json, steps_to_json

_names = iter(range(10**6))


# ----------------------------------------------------------------------------- helpers

def snapshot(s):
    """Everything a primitive may change, in comparable form."""
    return (copy.deepcopy(s.steps), [id(st) for st in s.stages], dict((id(k), id(v)) for k, v in s._stage_of.items()),
            [(st.name, id(st.op), id(st.tensor), [id(iv) for iv in st.leaf_iter_vars],
              [id(iv) for iv in st.all_iter_vars], [id(r) for r in st.relations],
              {id(iv): k for iv, k in st.annotations.items()},
              tuple(id(x) for x in st.attach), st.auto_unroll_max_step,
              [(id(t), id(iv), o) for t, iv, o in st.prefetches]) for st in s.stages])


def expect_error(s, fn, match):
    """`fn` raises ScheduleError matching `match` and leaves the schedule exactly as it was."""
    before = snapshot(s)
    leaves = {st.name: [iv.name for iv in st.leaf_iter_vars] for st in s.stages}
    with pytest.raises(ScheduleError, match=match):
        fn()
    assert snapshot(s) == before
    assert {st.name: [iv.name for iv in st.leaf_iter_vars] for st in s.stages} == leaves


def poison(shape, dtype):
    return np.full(shape, np.nan if np.dtype(dtype).kind == "f" else -99, dtype)


def run(s, args, arrays):
    """Build `s`, call it with `arrays` for the inputs and poisoned outputs; return the outputs."""
    k = C.build(s, args, name=f"s{next(_names)}")
    outs = [poison(t.shape, t.dtype) for t in args[len(arrays):]]
    k(*arrays, *outs)
    return outs


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def matmul(M=37, K=29, N=45, names=("A", "B", "C")):
    A = C.placeholder((M, K), "float32", names[0])
    B = C.placeholder((K, N), "float32", names[1])
    k = C.reduce_axis(K, "k")
    out = C.compute((M, N), lambda i, j: C.sum(A[i, k] * B[k, j], axis=k), name=names[2])
    return A, B, out


def chain(n=45, names=("X", "P", "Q", "R", "Out")):
    """X -> P = X+1 -> Q = P*2 -> R = exp(Q*0.1) -> Out = R - X   (elementwise chain, 2-D)."""
    X = C.placeholder((n, 6), "float32", names[0])
    P = C.compute((n, 6), lambda i, j: X[i, j] + 1.0, name=names[1])
    Q = C.compute((n, 6), lambda i, j: P[i, j] * 2.0, name=names[2])
    R = C.compute((n, 6), lambda i, j: C.exp(Q[i, j] * 0.1), name=names[3])
    out = C.compute((n, 6), lambda i, j: R[i, j] - X[i, j], name=names[4])
    return X, P, Q, R, out


def chain_ref(x):
    return np.exp((x + 1) * 2 * 0.1) - x


def stencil(n=37):
    """B = A*2 on n+2 points; Out[i] = B[i] + B[i+1] + B[i+2]: a producer with a halo."""
    A = C.placeholder((n + 2,), "float32", "A")
    B = C.compute((n + 2,), lambda i: A[i] * 2.0, name="B")
    out = C.compute((n,), lambda i: B[i] + B[i + 1] + B[i + 2], name="Out")
    return A, B, out


def stencil_ref(a):
    b = a * 2
    return b[:-2] + b[1:-1] + b[2:]


def loops_of(s, args):
    f = lower(s, args)
    return [(st.var.name, st.extent, st.kind) for st in walk_stmts(f.body) if isinstance(st, For)]


# ----------------------------------------------------------------------------- error cases

@pytest.fixture
def mm():
    A, B, out = matmul()
    s = C.create_schedule(out)
    return s, s[out], (A, B, out)


def test_split_errors(mm):
    s, st, _ = mm
    i, j, k = st.root_iter_vars
    st.split(i, factor=8)
    expect_error(s, lambda: st.split(i, factor=4), "not a loop of stage C any more")
    expect_error(s, lambda: st.split(j, factor=0), "positive integer")
    expect_error(s, lambda: st.split(j, nparts=0), "positive integer")
    expect_error(s, lambda: st.split(j, factor=-2), "positive integer")
    expect_error(s, lambda: st.split(j, factor=2.5), "positive integer")
    expect_error(s, lambda: st.split(j, factor=True), "positive integer")
    expect_error(s, lambda: st.split(j, factor=4, nparts=2), "exactly one")
    expect_error(s, lambda: st.split(j), "exactly one")
    expect_error(s, lambda: st.split("nope", factor=2), "no axis named 'nope'")


def test_tile_errors_are_atomic(mm):
    s, st, _ = mm
    i, j, k = st.root_iter_vars
    expect_error(s, lambda: st.tile(i, i, 4, 4), "same axis")
    expect_error(s, lambda: st.tile(i, j, 4, 0), "positive integers")
    expect_error(s, lambda: st.tile(i, "nope", 4, 4), "no axis named")
    st.split(j, factor=5)
    expect_error(s, lambda: st.tile(i, j, 4, 4), "not a loop")


def test_fuse_errors(mm):
    s, st, _ = mm
    i, j, k = st.root_iter_vars
    expect_error(s, lambda: st.fuse(i, k), "not consecutive")
    expect_error(s, lambda: st.fuse(j, i), "not consecutive")     # outermost first
    expect_error(s, lambda: st.fuse(j, k), "reduction axis with a spatial")
    expect_error(s, lambda: st.fuse(i), "at least two")
    expect_error(s, lambda: st.fuse(i, i), "not consecutive")
    st.fuse(i, j)
    expect_error(s, lambda: st.fuse(i, j), "not a loop")


def test_reorder_errors(mm):
    s, st, (A, B, out) = mm
    i, j, k = st.root_iter_vars
    other = C.create_schedule(matmul()[2])
    expect_error(s, lambda: st.reorder(j, "nope"), "no axis named 'nope'")
    expect_error(s, lambda: st.reorder(j, other.stages[0].root_iter_vars[0]), "is not an axis of stage C")
    expect_error(s, lambda: st.reorder(j, 3), "is not an axis")
    expect_error(s, lambda: st.reorder(j, i, j), "listed twice")
    st.split(k, factor=4)
    expect_error(s, lambda: st.reorder(k, i), "not a loop")


def test_annotation_errors(mm):
    s, st, _ = mm
    i, j, k = st.root_iter_vars
    expect_error(s, lambda: st.vectorize(k), "reduction axis")
    expect_error(s, lambda: st.parallel(k), "reduction axis")
    st.vectorize(j)
    expect_error(s, lambda: st.parallel(j), "already marked vectorize")
    expect_error(s, lambda: st.unroll(j), "already marked vectorize")
    expect_error(s, lambda: st.auto_unroll(-1), r"\[0, 4096\]")
    expect_error(s, lambda: st.auto_unroll(5000), r"\[0, 4096\]")
    expect_error(s, lambda: st.auto_unroll(2.0), r"\[0, 4096\]")
    st.vectorize(j)     # the same annotation again is harmless


def test_placement_errors():
    X, P, Q, R, out = chain()
    Y = C.placeholder((45, 6), "float32", "Y")
    side = C.compute((45, 6), lambda i, j: Y[i, j] * 3.0, name="Side")
    both = C.compute((45, 6), lambda i, j: out[i, j] + side[i, j], name="Both")
    k = C.reduce_axis(6, "k")
    red = C.compute((45,), lambda i: C.sum(both[i, k], axis=k), name="Red")
    s = C.create_schedule(red)
    sp, sq, sr, so, sside, sboth, sred = (s[t] for t in (P, Q, R, out, side, both, red))
    i_out = so.root_iter_vars[0]
    expect_error(s, lambda: sside.compute_at(so, i_out), "Out does not read Side")
    expect_error(s, lambda: sred.compute_at(sboth, sboth.root_iter_vars[0]), "is an output")
    expect_error(s, lambda: sp.compute_at(sp, sp.root_iter_vars[0]), "cannot be computed at itself")
    expect_error(s, lambda: sp.compute_at(so, sred.root_iter_vars[0]), "is not an axis of stage Out")
    expect_error(s, lambda: sp.compute_at(P, i_out), "must be a stage")
    expect_error(s, lambda: sred.compute_inline(), "output")
    s2 = C.create_schedule([both, red])
    expect_error(s2, lambda: s2[both].compute_inline(), "output")
    expect_error(s2, lambda: s2[both].compute_at(s2[red], s2[red].root_iter_vars[0]), "output")
    # a reduction cannot be inlined
    k2 = C.reduce_axis(6, "k2")
    rowsum = C.compute((45,), lambda i: C.sum(X[i, k2], axis=k2), name="RowSum")
    scaled = C.compute((45,), lambda i: rowsum[i] * 2.0, name="Scaled")
    s3 = C.create_schedule(scaled)
    expect_error(s3, lambda: s3[rowsum].compute_inline(), "reduction and cannot be inlined")
    # inline after loop transformations, inline a stage something is attached at
    sq.split(sq.root_iter_vars[0], factor=4)
    expect_error(s, lambda: sq.compute_inline(), "already has loop transformations")
    sp.compute_at(sr, sr.root_iter_vars[0])
    expect_error(s, lambda: sr.compute_inline(), "P is computed at R")
    # an inlined stage has no loops
    sside.compute_inline()
    for fn in (lambda: sside.split(sside.root_iter_vars[0], factor=2), lambda: sside.vectorize(sside.root_iter_vars[1]),
               lambda: sside.fuse(*sside.root_iter_vars), lambda: sside.reorder(*sside.root_iter_vars[::-1]),
               lambda: sside.compute_root(), lambda: sp.compute_at(sside, sside.root_iter_vars[0])):
        expect_error(s, fn, "inlined")


def test_cache_errors(mm):
    s, st, (A, B, out) = mm
    i, j, k = st.root_iter_vars
    expect_error(s, lambda: s.cache_write(A), "not computed by this schedule")
    expect_error(s, lambda: s.cache_write(out, "shared"), "scope must be")
    for bad in ([0], [0, 0], [1, 2], "10", [0, True]):
        expect_error(s, lambda bad=bad: s.cache_write(out, "local", order=bad), "permutation")
    expect_error(s, lambda: s.cache_read(A, "shared", [out]), "scope must be")
    expect_error(s, lambda: s.cache_read(A, "global", []), "at least one reader")
    expect_error(s, lambda: s.cache_read(A, "global", [out], block={2: 4}), "block axis 2 out of range")
    expect_error(s, lambda: s.cache_read(A, "global", [out], block={1: 0}), "positive integer")
    expect_error(s, lambda: s.cache_read(A, "global", [out], block={"x": 4}), "block must map")
    X2 = C.placeholder((3,), "float32", "X2")
    other = C.compute((3,), lambda i: X2[i] + 1.0, name="Other")
    expect_error(s, lambda: s.cache_read(A, "global", [other]), "not computed by this schedule")
    st.split(i, factor=4)
    expect_error(s, lambda: s.cache_write(out), "before any loop transformation")
    A2, B2, out2 = matmul()
    s2 = C.create_schedule(out2)
    s2[out2].vectorize(s2[out2].root_iter_vars[1])
    expect_error(s2, lambda: s2.cache_write(out2), "before any loop transformation")
    X, P, Q, R, o = chain()
    s3 = C.create_schedule(o)
    expect_error(s3, lambda: s3.cache_read(P, "global", [s3[R]]), "R does not read P")


def test_vectorize_more_than_64_lanes_fails_at_lowering():
    A = C.placeholder((100, 3), "float32", "A")
    out = C.compute((100, 3), lambda i, j: A[i, j] + 1.0, name="Out")
    s = C.create_schedule(out)
    s[out].reorder(s[out].root_iter_vars[1], s[out].root_iter_vars[0])
    s[out].vectorize(s[out].root_iter_vars[0])         # accepted: bound inference decides the extent
    before = snapshot(s)
    with pytest.raises(ScheduleError, match="100 iterations, more than 64 lanes"):
        lower(s, [A, out])
    with pytest.raises(ScheduleError):
        C.build(s, [A, out], name="too_wide")
    assert snapshot(s) == before
    # 64 lanes are fine
    s2 = C.create_schedule(out)
    _, inner = s2[out].split(s2[out].root_iter_vars[0], nparts=2)
    s2[out].reorder(s2[out].root_iter_vars[1], inner)
    s2[out].vectorize(inner)
    (y,) = run(s2, [A, out], [a := rnd(100, 3)])
    np.testing.assert_allclose(y, a + 1)


def test_stage_inside_vectorized_loop_fails_at_lowering():
    A, B, out = stencil()
    s = C.create_schedule(out)
    so = s[out]
    o, i = so.split(so.root_iter_vars[0], factor=8)
    so.vectorize(i)
    s[B].compute_at(so, i)
    before = snapshot(s)
    with pytest.raises(ScheduleError, match="B is computed inside the vectorized loop"):
        lower(s, [A, out])
    assert snapshot(s) == before
    # two vectorized loops, parallel inside vector
    X = C.placeholder((16, 16), "float32", "X")
    Y = C.compute((16, 16), lambda i, j: X[i, j] * 2.0, name="Y")
    s2 = C.create_schedule(Y)
    s2[Y].vectorize(s2[Y].root_iter_vars[0])
    s2[Y].vectorize(s2[Y].root_iter_vars[1])
    with pytest.raises(ScheduleError, match="more than one vectorized loop"):
        lower(s2, [X, Y])
    s3 = C.create_schedule(Y)
    s3[Y].vectorize(s3[Y].root_iter_vars[0])
    s3[Y].parallel(s3[Y].root_iter_vars[1])
    with pytest.raises(ScheduleError, match="parallel loop inside the vectorized loop"):
        lower(s3, [X, Y])


def test_attach_point_split_later_fails_at_lowering():
    A, B, out = stencil()
    s = C.create_schedule(out)
    so = s[out]
    s[B].compute_at(so, so.root_iter_vars[0])
    so.split(so.root_iter_vars[0], factor=4)
    with pytest.raises(ScheduleError, match="no longer a loop of Out"):
        lower(s, [A, out])


def test_errors_do_not_record_steps(mm):
    s, st, _ = mm
    i, j, k = st.root_iter_vars
    st.split(i, factor=8)
    steps = copy.deepcopy(s.steps)
    for fn in (lambda: st.split(i, factor=2), lambda: st.vectorize(k), lambda: st.fuse(j, k),
               lambda: st.tile(j, j, 2, 2), lambda: s.cache_write(st.tensor)):
        with pytest.raises(ScheduleError):
            fn()
    assert s.steps == steps
    assert json.loads(json.dumps(s.steps)) == s.steps


# ----------------------------------------------------------------------------- correctness

@pytest.fixture(scope="module")
def mm_data():
    a, b = rnd(37, 29, seed=1), rnd(29, 45, seed=2)
    return a, b, a.astype(np.float64) @ b.astype(np.float64)


def _check_mm(s, args, mm_data):
    a, b, ref = mm_data
    (y,) = run(s, list(args), [a, b])
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("how", ["factor", "nparts", "factor_bigger_than_extent", "reduce_axis", "nested"])
def test_split_correct(how, mm_data):
    A, B, out = matmul()
    s = C.create_schedule(out)
    st = s[out]
    i, j, k = st.root_iter_vars
    if how == "factor":
        st.split(i, factor=8)                     # 37 = 4*8 + 5
        st.split(j, factor=7)                     # 45 = 6*7 + 3
    elif how == "nparts":
        st.split(i, nparts=5)                     # inner ceil(37/5) = 8, 40 > 37
        st.split(j, nparts=4)
    elif how == "factor_bigger_than_extent":
        st.split(j, factor=64)
    elif how == "reduce_axis":
        ko, ki = st.split(k, factor=6)            # 29 = 4*6 + 5
        st.reorder(i, ko, j, ki)
    else:
        jo, ji = st.split(j, factor=16)
        jio, jii = st.split(ji, factor=4)
        st.split(jo, nparts=2)
        st.vectorize(jii)
    _check_mm(s, [A, B, out], mm_data)


def test_split_extents_in_lowered_loops():
    A, B, out = matmul()
    s = C.create_schedule(out)
    st = s[out]
    st.split(st.root_iter_vars[0], factor=8)
    st.split(st.root_iter_vars[1], nparts=4)
    loops = dict((n, e) for n, e, _ in loops_of(s, [A, B, out]))
    assert loops["i_o"] == 5 and loops["i_i"] == 8 and loops["j_o"] == 4 and loops["j_i"] == 12


def test_fuse_correct(mm_data):
    A, B, out = matmul()
    s = C.create_schedule(out)
    st = s[out]
    i, j, k = st.root_iter_vars
    f = st.fuse(i, j)
    fo, fi = st.split(f, factor=8)
    st.reorder(fo, k, fi)
    st.vectorize(fi)
    _check_mm(s, [A, B, out], mm_data)
    assert f.extent == 37 * 45
    # fusing reduction axes
    X = C.placeholder((5, 6, 7), "float32", "X")
    r1, r2 = C.reduce_axis(6, "r1"), C.reduce_axis(7, "r2")
    tot = C.compute((5,), lambda a: C.sum(X[a, r1, r2], axis=[r1, r2]), name="Tot")
    s2 = C.create_schedule(tot)
    rf = s2[tot].fuse(r1, r2)
    s2[tot].split(rf, factor=5)
    x = rnd(5, 6, 7)
    (y,) = run(s2, [X, tot], [x])
    np.testing.assert_allclose(y, x.sum((1, 2)), rtol=1e-5, atol=1e-5)


def test_reorder_correct(mm_data):
    A, B, out = matmul()
    s = C.create_schedule(out)
    st = s[out]
    i, j, k = st.root_iter_vars
    st.reorder(k, j, i)                          # reduction outermost
    _check_mm(s, [A, B, out], mm_data)
    assert [n for n, _, _ in loops_of(s, [A, B, out])][-3:] == ["k", "j", "i"]


@pytest.mark.parametrize("factors", [(8, 8), (5, 7), (64, 3)])
def test_tile_correct(factors, mm_data):
    A, B, out = matmul()
    s = C.create_schedule(out)
    st = s[out]
    i, j, k = st.root_iter_vars
    io, jo, ii, ji = st.tile(i, j, *factors)
    assert st.leaf_iter_vars == [io, jo, ii, ji, k]
    st.reorder(io, jo, k, ii, ji)
    st.parallel(io)
    if ji.extent <= 64:
        st.vectorize(ji)
    _check_mm(s, [A, B, out], mm_data)


def test_unroll_and_auto_unroll_correct(mm_data):
    A, B, out = matmul()
    s = C.create_schedule(out)
    st = s[out]
    i, j, k = st.root_iter_vars
    ko, ki = st.split(k, factor=4)
    jo, ji = st.split(j, factor=8)
    st.reorder(i, jo, ko, ki, ji)
    st.unroll(ki)
    st.vectorize(ji)
    kinds = {n: kind for n, _, kind in loops_of(s, [A, B, out])}
    assert kinds["k_i"] == "unrolled" and kinds["j_i"] == "vectorized"
    _check_mm(s, [A, B, out], mm_data)

    A, B, out = matmul()
    s = C.create_schedule(out)
    st = s[out]
    i, j, k = st.root_iter_vars
    io, ii = st.split(i, factor=4)
    jo, ji = st.split(j, factor=3)
    st.reorder(io, jo, k, ii, ji)
    st.auto_unroll(12)
    kinds = {n: kind for n, _, kind in loops_of(s, [A, B, out])}
    assert kinds["i_i"] == kinds["j_i"] == "unrolled" and kinds["k"] == "serial" and kinds["i_o"] == "serial"
    _check_mm(s, [A, B, out], mm_data)
    assert {"op": "auto_unroll", "stage": 0, "max_step": 12} in s.steps


@pytest.mark.parametrize("factor", [4, 8, 5, 64])
def test_compute_at_with_overhanging_splits(factor):
    A, B, out = stencil(37)
    s = C.create_schedule(out)
    so = s[out]
    o, i = so.split(so.root_iter_vars[0], factor=factor)
    s[B].compute_at(so, o)
    if factor <= 8:
        so.vectorize(i)
    a = rnd(39, seed=3)
    (y,) = run(s, [A, out], [a])
    np.testing.assert_allclose(y, stencil_ref(a), rtol=1e-6)
    # the producer's region is the tile plus the halo, not the whole tensor
    f = lower(s, [A, out])
    from compiler.loop_ir import Allocate
    (alloc,) = [st for st in walk_stmts(f.body) if isinstance(st, Allocate)]
    assert alloc.buffer.shape == (min(factor, 37) + 2,)


def test_compute_at_2d_tiles_and_inner_axis():
    X, P, Q, R, out = chain(45)
    s = C.create_schedule(out)
    so = s[out]
    io, jo, ii, ji = so.tile(*so.root_iter_vars, 8, 4)      # 45 and 6 both overhang
    s[R].compute_at(so, jo)
    s[Q].compute_at(s[R], s[R].root_iter_vars[1])
    s[P].compute_at(s[Q], s[Q].root_iter_vars[0])
    x = rnd(45, 6, seed=4)
    (y,) = run(s, [X, out], [x])
    np.testing.assert_allclose(y, chain_ref(x), rtol=1e-5, atol=1e-6)


def test_compute_at_outside_the_readers_loops_is_a_lowering_error():
    X, P, Q, R, out = chain(45)
    s = C.create_schedule(out)
    so = s[out]
    io, jo, ii, ji = so.tile(*so.root_iter_vars, 8, 4)
    s[R].compute_at(so, jo)
    s[P].compute_at(so, ii)       # P's reader Q is at root, outside Out's loops
    with pytest.raises(LoweringError, match="P is read by Q, which is not inside loop i_i of Out"):
        lower(s, [X, out])


def test_compute_inline_chains():
    X, P, Q, R, out = chain(45)
    x = rnd(45, 6, seed=5)
    for inline in ([P], [Q], [P, Q], [P, Q, R], [R, Q, P]):
        s = C.create_schedule(out)
        for t in inline:
            s[t].compute_inline()
        assert {st.name for st in s.stages if st.is_inline} == {t.name for t in inline}
        f = lower(s, [X, out])
        assert not any(b.name in {t.name for t in inline} for b in _allocs(f))
        (y,) = run(s, [X, out], [x])
        np.testing.assert_allclose(y, chain_ref(x), rtol=1e-5, atol=1e-6)


def _allocs(f):
    from compiler.loop_ir import Allocate
    return [st.buffer for st in walk_stmts(f.body) if isinstance(st, Allocate)]


def test_compute_inline_into_reduction_and_where():
    X = C.placeholder((12, 10), "float32", "X")
    sq = C.compute((12, 10), lambda i, j: X[i, j] * X[i, j], name="Sq")
    k = C.reduce_axis(10, "k")
    tot = C.compute((12,), lambda i: C.sum(sq[i, k], axis=k, where=sq[i, k] > 0.5), name="Tot")
    s = C.create_schedule(tot)
    s[sq].compute_inline()
    x = rnd(12, 10, seed=6)
    (y,) = run(s, [X, tot], [x])
    x2 = x.astype(np.float64) ** 2
    np.testing.assert_allclose(y, np.where(x2 > 0.5, x2, 0).sum(1), rtol=1e-5)


def test_cache_write_correct(mm_data):
    A, B, out = matmul()
    s = C.create_schedule(out)
    cache = s.cache_write(out, "local")
    assert [st.name for st in s.stages] == ["C_local", "C"] and s[cache].scope == "local"
    so, sc = s[out], s[cache]
    io, jo, ii, ji = so.tile(*so.root_iter_vars, 4, 8)
    so.vectorize(ji)
    so.parallel(io)
    sc.compute_at(so, jo)
    ci, cj, ck = sc.root_iter_vars
    sc.reorder(ck, ci, cj)
    sc.vectorize(cj)
    _check_mm(s, [A, B, out], mm_data)
    (buf,) = _allocs(lower(s, [A, B, out]))
    assert buf.shape == (4, 8) and buf.scope == "local"
    # the user's definition is unchanged: the schedule's stage got a new (copy) operation
    assert s.outputs == [out] and out.op is not s[out].op and isinstance(out.op.body, C.tensor.Reduce)


@pytest.mark.parametrize("block", [None, {1: 16}, {1: 8}, {0: 5, 1: 7}, {0: 4}])
def test_cache_read_block_layouts(block, mm_data):
    A, B, out = matmul()                          # B is 29x45: 16, 8 and 7 do not divide 45, 5 not 29
    s = C.create_schedule(out)
    packed = s.cache_read(B, "global", [out], block=block)
    if block:
        nb = {a: -(-B.shape[a] // f) for a, f in block.items()}
        expect = tuple([nb[a] for a in sorted(block)] + [d for a, d in enumerate(B.shape) if a not in block]
                       + [block[a] for a in sorted(block)])
        assert packed.shape == expect
    so = s[out]
    i, j, k = so.root_iter_vars
    jo, ji = so.split(j, factor=8)
    so.reorder(i, jo, k, ji)
    so.vectorize(ji)
    s[packed].parallel(s[packed].root_iter_vars[0])
    _check_mm(s, [A, B, out], mm_data)


def test_cache_read_padding_is_zero():
    X = C.placeholder((5, 7), "float32", "X")
    k = C.reduce_axis(7, "k")
    out = C.compute((5,), lambda i: C.sum(X[i, k], axis=k), name="RowSum")
    s = C.create_schedule(out)
    packed = s.cache_read(X, "global", out, block={1: 4})     # one reader, not in a list
    assert packed.shape == (2, 5, 4)
    x = rnd(5, 7, seed=7)
    (y,) = run(s, [X, out], [x])
    np.testing.assert_allclose(y, x.sum(1), rtol=1e-5, atol=1e-6)


def _filter_bank(F=20, Cin=3, KH=3, KW=2, Y=6):
    """out[f, y] = sum over (c, kh, kw) of W[f, c, kh, kw] * X[c, y + kh, kw]: a conv's weights."""
    W = C.placeholder((F, Cin, KH, KW), "float32", "W")
    X = C.placeholder((Cin, Y + KH - 1, KW), "float32", "X")
    c, kh, kw = C.reduce_axis(Cin, "c"), C.reduce_axis(KH, "kh"), C.reduce_axis(KW, "kw")
    out = C.compute((F, Y), lambda f, y: C.sum(W[f, c, kh, kw] * X[c, y + kh, kw], axis=[c, kh, kw]), name="Out")
    return W, X, out


@pytest.mark.parametrize("block, shape", [({0: 8}, (3, 18, 8)), ({0: 4}, (5, 18, 4)), ({}, (20, 18))])
def test_cache_read_merge_joins_axes(block, shape):
    W, X, out = _filter_bank()                     # 20 filters: 8 does not divide them
    s = C.create_schedule(out)
    packed = s.cache_read(W, "global", [out], block=block, merge=[1, 3])
    assert packed.shape == shape
    assert s.steps[-1]["merge"] == [1, 3]
    w, x = rnd(20, 3, 3, 2, seed=1), rnd(3, 8, 2, seed=2)
    (y,) = run(s, [W, X, out], [w, x])
    ref = np.einsum("fckw,cykw->fy", w.astype(np.float64), np.lib.stride_tricks.sliding_window_view(
        x.astype(np.float64), 3, axis=1).transpose(0, 1, 3, 2)[:, :6])
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    # the copy's source address is the merged index itself: no division left in the lowered copy
    W2, X2, out2 = _filter_bank()
    fresh = apply_steps(out2, steps_from_json(steps_to_json(s.steps)))
    assert str(lower(fresh, [W2, X2, out2])) == str(lower(s, [W, X, out]))
    if block == {0: 8}:
        st = s[packed]
        fo, k, fi = st.op.axis
        ko, ki = st.split(k, factor=6)
        st.reorder(fo, ko, fi, ki)
        st.vectorize(ki)
        text = str(lower(s, [W, X, out]))
        (copy,) = [line for line in text.splitlines() if line.strip().startswith("W_packed[")]
        assert "//" not in copy and "%" not in copy, copy
        (y2,) = run(s, [W, X, out], [w, x])
        np.testing.assert_allclose(y2, y, rtol=1e-6)


def test_cache_read_merge_errors():
    W, X, out = _filter_bank()
    s = C.create_schedule(out)
    for bad, match in (([1], "merge must be"), ("ab", "merge must be"), ([2, 1], "not a range"),
                       ([1, 1], "not a range"), ([0, 4], "not a range"), ([0, 2], "includes a blocked axis")):
        expect_error(s, lambda bad=bad: s.cache_read(W, "global", [out], block={0: 8}, merge=bad), match)


def _pointwise_strided(F=5, Cin=6, H=7, W=9, sh=2, sw=3):
    """A 1x1 convolution with strides (sh, sw): out[f, y, x] = sum_c W[f, c] * X[c, y*sh, x*sw]."""
    X = C.placeholder((Cin, H, W), "float32", "X")
    Wt = C.placeholder((F, Cin), "float32", "Wt")
    c = C.reduce_axis(Cin, "c")
    OH, OW = (H - 1) // sh + 1, (W - 1) // sw + 1
    out = C.compute((F, OH, OW), lambda f, y, x: C.sum(Wt[f, c] * X[c, y * sh, x * sw], axis=c), name="Out")
    return X, Wt, out


@pytest.mark.parametrize("block, shape", [(None, (6, 4, 3)), ({0: 4}, (2, 4, 3, 4))])
def test_cache_read_stride_copies_only_the_positions_read(block, shape):
    X, Wt, out = _pointwise_strided()               # 7 rows at stride 2: 4 kept; 9 columns at stride 3: 3
    s = C.create_schedule(out)
    sub = s.cache_read(X, "global", [out], block=block, stride={1: 2, 2: 3})
    assert sub.shape == shape and s.steps[-1]["stride"] == {"1": 2, "2": 3}
    x, w = rnd(6, 7, 9, seed=3), rnd(5, 6, seed=4)
    (y,) = run(s, [X, Wt, out], [x, w])
    ref = np.einsum("fc,cyx->fyx", w.astype(np.float64), x[:, ::2, ::3].astype(np.float64))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    X2, W2, out2 = _pointwise_strided()
    fresh = apply_steps(out2, steps_from_json(steps_to_json(s.steps)))
    assert str(lower(fresh, [X2, W2, out2])) == str(lower(s, [X, Wt, out]))
    reads = [line for line in str(lower(s, [X, Wt, out])).splitlines() if "X_" in line and "Out[" in line]
    # the reader indexes the compact copy directly: no division left but the channel block's
    assert reads and all(line.count("//") == (1 if block else 0) for line in reads), reads


def test_cache_read_stride_refuses_positions_it_would_not_hold():
    X, Wt, out = _pointwise_strided(sh=2, sw=1)
    s = C.create_schedule(out)
    expect_error(s, lambda: s.cache_read(X, "global", [out], stride={2: 2}), "not all multiples of 2")
    expect_error(s, lambda: s.cache_read(X, "global", [out], stride={1: 4}), "not all multiples of 4")
    expect_error(s, lambda: s.cache_read(X, "global", [out], stride={3: 2}), "stride axis 3 out of range")
    expect_error(s, lambda: s.cache_read(X, "global", [out], stride={1: 0}), "positive integer")
    expect_error(s, lambda: s.cache_read(X, "global", [out], stride=[1, 2]), "stride must map")
    # a window wider than one tap reads every row: nothing to leave out
    A = C.placeholder((8,), "float32", "A")
    r = C.reduce_axis(2, "r")
    win = C.compute((4,), lambda i: C.sum(A[i * 2 + r], axis=r), name="Win")
    sw = C.create_schedule(win)
    expect_error(sw, lambda: sw.cache_read(A, "global", [win], stride={0: 2}), "not all multiples")
    # a one-long reduction from 1 reads the odd positions: its lo counts, not just its extent
    r1 = C.reduce_axis((1, 2), "r1")
    odd = C.compute((4,), lambda i: C.sum(A[i * 2 + r1], axis=r1), name="Odd")
    so = C.create_schedule(odd)
    expect_error(so, lambda: so.cache_read(A, "global", [odd], stride={0: 2}), "not all multiples")


# ----------------------------------------------------------------------------- steps and replay

def _rich_schedule(names=("A", "B", "C")):
    """A schedule using most primitives: cache_read with blocks, cache_write, tile, fuse, annotations."""
    A, B, out = matmul(names=names)
    relu = C.compute(out.shape, lambda i, j: C.maximum(out[i, j], 0.0), name=names[2] + "_relu")
    scaled = C.compute(out.shape, lambda i, j: relu[i, j] * 0.5, name=names[2] + "_scaled")
    s = C.create_schedule(scaled)
    bp = s.cache_read(B, "global", [out], block={1: 8})
    cache = s.cache_write(out, "local")
    s[relu].compute_inline()
    so = s[scaled]
    io, jo, ii, ji = so.tile(*so.root_iter_vars, 4, 8)
    f = so.fuse(io, jo)
    so.parallel(f)
    so.vectorize(ji)
    s[out].compute_at(so, f)
    sc = s[cache]
    sc.compute_at(so, f)
    ci, cj, ck = sc.root_iter_vars
    ko, ki = sc.split(ck, factor=4)
    sc.reorder(ko, ki, ci, cj)
    sc.unroll(ki)
    sc.auto_unroll(16)
    s[bp].parallel(s[bp].root_iter_vars[0])
    return s, [A, B, scaled]


def test_steps_are_json(mm_data):
    s, args = _rich_schedule()
    text = steps_to_json(s.steps)
    assert json.loads(text) == s.steps and steps_from_json(text) == s.steps
    ops = [st["op"] for st in s.steps]
    assert ops[:3] == ["cache_read", "cache_write", "compute_inline"]
    assert set(ops) <= set(STEP_FIELDS)
    assert s.steps[0] == {"op": "cache_read", "tensor": "input1", "scope": "global", "readers": [0],
                          "block": {"1": 8}}


def test_replay_gives_identical_ir_and_results(mm_data):
    s, args = _rich_schedule()
    text = steps_to_json(s.steps)
    s2, args2 = _rich_schedule()                  # only to get a fresh definition with the same names
    fresh = apply_steps(args2[2], steps_from_json(text))
    assert fresh.steps == s.steps
    assert str(lower(fresh, args2)) == str(lower(s, args))
    a, b, ref = mm_data
    (y1,) = run(s, args, [a, b])
    (y2,) = run(fresh, args2, [a, b])
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_allclose(y1, np.maximum(ref, 0) * 0.5, rtol=1e-4, atol=1e-4)


def test_replay_on_differently_named_definition(mm_data):
    s, args = _rich_schedule()
    A, B, out = matmul(names=("Lhs", "Rhs", "Prod"))
    relu = C.compute(out.shape, lambda x, y: C.maximum(out[x, y], 0.0), name="r")
    scaled = C.compute(out.shape, lambda x, y: relu[x, y] * 0.5, name="sc")
    fresh = apply_steps([scaled], s.steps)
    assert fresh.steps == s.steps
    # same loop structure up to names
    shape = [(e, k) for _, e, k in loops_of(fresh, [A, B, scaled])]
    assert shape == [(e, k) for _, e, k in loops_of(s, args)]
    a, b, ref = mm_data
    (y,) = run(fresh, [A, B, scaled], [a, b])
    np.testing.assert_allclose(y, np.maximum(ref, 0) * 0.5, rtol=1e-4, atol=1e-4)


def test_replay_each_primitive():
    """Every primitive's recorded step replays to the same lowered IR."""
    def variants():
        yield lambda s, t: s[t[2]].split(s[t[2]].root_iter_vars[0], nparts=3)
        yield lambda s, t: s[t[2]].fuse(*s[t[2]].root_iter_vars[:2])
        yield lambda s, t: s[t[2]].reorder(*s[t[2]].root_iter_vars[::-1])
        yield lambda s, t: s[t[2]].unroll(s[t[2]].root_iter_vars[2])
        yield lambda s, t: s[t[2]].parallel(s[t[2]].root_iter_vars[0])
        yield lambda s, t: s[t[2]].vectorize(s[t[2]].split(s[t[2]].root_iter_vars[1], factor=8)[1])
        yield lambda s, t: s[t[2]].auto_unroll(8)
        yield lambda s, t: s.cache_write(t[2])
        yield lambda s, t: s.cache_read(t[0], "local", [t[2]])
        yield lambda s, t: s[t[2]].tile(*s[t[2]].root_iter_vars[:2], 3, 5)
    for fn in variants():
        t1 = matmul(M=9, K=7, N=10)
        s1 = C.create_schedule(t1[2])
        fn(s1, t1)
        t2 = matmul(M=9, K=7, N=10)
        s2 = apply_steps(t2[2], json.loads(json.dumps(s1.steps)))
        assert s2.steps == s1.steps
        assert str(lower(s2, list(t2))) == str(lower(s1, list(t1)))
    # placement steps on the chain
    for fn in (lambda s, t: s[t[1]].compute_inline(),
               lambda s, t: s[t[3]].compute_at(s[t[4]], s[t[4]].root_iter_vars[0]),
               lambda s, t: (s[t[3]].compute_at(s[t[4]], s[t[4]].root_iter_vars[0]), s[t[3]].compute_root())):
        t1, t2 = chain(10), chain(10)
        s1 = C.create_schedule(t1[4])
        fn(s1, t1)
        s2 = apply_steps(t2[4], s1.steps)
        assert str(lower(s2, [t2[0], t2[4]])) == str(lower(s1, [t1[0], t1[4]]))


@pytest.mark.parametrize("steps, match", [
    ([{"op": "split", "stage": 5, "axis": 0, "factor": 4}], r"step 0: stage index 5 out of range"),
    ([{"op": "split", "stage": 0, "axis": 9, "factor": 4}], r"step 0: axis index 9 out of range for stage C"),
    ([{"op": "split", "stage": 0, "axis": -1, "factor": 4}], "out of range"),
    ([{"op": "split", "stage": "0", "axis": 0, "factor": 4}], "must be an integer index"),
    ([{"op": "split", "stage": True, "axis": 0, "factor": 4}], "must be an integer index"),
    ([{"op": "bogus", "stage": 0, "axis": 0}], r"unknown op 'bogus'"),
    ([{"stage": 0, "axis": 0}], "unknown op None"),
    (["split"], "expected a dict"),
    ([{"op": "split", "stage": 0}], "missing field"),
    ([{"op": "vectorize", "stage": 0, "axis": 1, "lanes": 8}], "unexpected field"),
    ([{"op": "split", "stage": 0, "axis": 0, "factor": 4},
      {"op": "split", "stage": 0, "axis": 0, "factor": 2}], r"step 1 \(split\): split: axis 'i' is not a loop"),
    ([{"op": "split", "stage": 0, "axis": 0, "factor": 0}], r"step 0 \(split\).*positive integer"),
    ([{"op": "vectorize", "stage": 0, "axis": 2}], r"step 0 \(vectorize\).*reduction axis"),
    ([{"op": "fuse", "stage": 0, "axes": 0}], "axes must be a list"),
    ([{"op": "fuse", "stage": 0, "axes": [0, 2]}], "not consecutive"),
    ([{"op": "compute_at", "stage": 0, "parent": 0, "axis": 0}], "computed at itself"),
    ([{"op": "compute_inline", "stage": 0}], "output"),
    ([{"op": "cache_read", "tensor": "input7", "scope": "global", "readers": [0]}], "input7 out of range"),
    ([{"op": "cache_read", "tensor": "weights", "scope": "global", "readers": [0]}], "stage index or 'input<i>'"),
    ([{"op": "cache_read", "tensor": "input0", "scope": "global", "readers": 0}], "readers must be a list"),
    ([{"op": "cache_read", "tensor": "input0", "scope": "global", "readers": [0], "block": {"a": 2}}],
     "block axes must be integers"),
    ([{"op": "cache_write", "tensor": 3, "scope": "local"}], "tensor index 3 out of range"),
    ([{"op": "auto_unroll", "stage": 0, "max_step": -5}], r"\[0, 4096\]"),
])
def test_replay_errors(steps, match):
    A, B, out = matmul(M=8, K=8, N=8)
    with pytest.raises(ScheduleError, match=match):
        apply_steps(out, steps)


def test_replay_on_a_different_definition_fails_clearly():
    s, _ = _rich_schedule()
    X = C.placeholder((8, 8), "float32", "X")
    Y = C.compute((8, 8), lambda i, j: X[i, j] + 1.0, name="Y")
    with pytest.raises(ScheduleError, match=r"step 0 \(cache_read\)"):
        apply_steps(Y, s.steps)
    with pytest.raises(ScheduleError, match="step 2"):
        apply_steps(Y, [{"op": "split", "stage": 0, "axis": 0, "factor": 2},
                        {"op": "split", "stage": 0, "axis": 3, "factor": 2},
                        {"op": "vectorize", "stage": 1, "axis": 0}])


@pytest.mark.parametrize("text", ["not json", "{\"op\": \"split\"}", "[1, 2]", "", None])
def test_steps_from_json_errors(text):
    with pytest.raises(ScheduleError):
        steps_from_json(text)


def test_steps_to_json_rejects_non_json():
    with pytest.raises(ScheduleError):
        steps_to_json([{"op": "split", "stage": object()}])


def test_apply_steps_accepts_json_text_and_is_exported():
    A, B, out = matmul(M=8, K=8, N=8)
    s = C.apply_steps(out, '[{"op": "split", "stage": 0, "axis": 0, "factor": 4}]')
    assert [iv.name for iv in s[out].leaf_iter_vars] == ["i_o", "i_i", "j", "k"]
    assert C.apply_steps is apply_steps
    with pytest.raises(ScheduleError):
        apply_steps(out, {"op": "split"})


def test_lowering_errors_are_typed():
    A, B, out = matmul(M=8, K=8, N=8)
    s = C.create_schedule(out)
    with pytest.raises(LoweringError, match="not in the argument list"):
        lower(s, [A, out])


@pytest.mark.parametrize("extent,factor,combiner", [(1001, 8, "sum"), (64, 16, "max"), (37, 37, "min")])
def test_rfactor_vectorized_partial_reductions(extent, factor, combiner):
    """rfactor turns a reduction with little spatial parallelism into lanes of partial results."""
    A = C.placeholder((3, extent), "float32", "A")
    k = C.reduce_axis(extent, "k")
    red = {"sum": C.sum, "max": C.max, "min": C.min}[combiner]
    S = C.compute((3,), lambda i: red(A[i, k], axis=k), name="S")
    s = C.create_schedule(S)
    _, ki = s[S].split(s[S].op.reduce_axis[0], factor=factor)
    rf = s.rfactor(S, ki)
    lane, i = s[rf].op.axis
    s[rf].reorder(i, s[rf].op.reduce_axis[0], lane)
    s[rf].vectorize(lane)
    kernel = C.build(s, [A, S])
    a = np.random.default_rng(0).uniform(0.1, 1.0, (3, extent)).astype("float32")
    out = np.full(3, np.nan, "float32")
    kernel(a, out)
    ref = {"sum": np.sum, "max": np.max, "min": np.min}[combiner](a.astype(np.float64), axis=1)
    np.testing.assert_allclose(out, ref, rtol=1e-5)
    replayed = apply_steps([S], s.steps)
    assert str(C.lower(replayed, [A, S])) == str(C.lower(s, [A, S]))


def test_rfactor_rejects_spatial_axes_and_transformed_stages():
    A = C.placeholder((4, 8), "float32", "A")
    k = C.reduce_axis(8, "k")
    S = C.compute((4,), lambda i: C.sum(A[i, k], axis=k), name="S")
    s = C.create_schedule(S)
    with pytest.raises(ScheduleError, match="spatial"):
        s.rfactor(S, s[S].op.axis[0])
    s[S].split(s[S].op.axis[0], factor=2)
    with pytest.raises(ScheduleError, match="before anything"):
        s.rfactor(S, s[S].op.reduce_axis[0])
    E = C.compute((4,), lambda i: A[i, 0] * 2.0, name="E")
    with pytest.raises(ScheduleError, match="not a reduction"):
        C.create_schedule(E).rfactor(E, "i")


def test_cache_write_in_another_layout_computes_the_same_and_replays():
    """A cache laid out [j][i] (order=[1, 0]): the register tile's vector axis made contiguous
    whatever the output's layout; the steps replay it on a fresh definition."""
    A, B, out = matmul()
    s = C.create_schedule(out)
    acc = s.cache_write(out, "local", order=[1, 0])
    assert tuple(acc.shape) == (out.shape[1], out.shape[0])
    st, cst = s[out], s[acc]
    i, j = st.op.axis
    io, ii = st.split(i, factor=4)
    jo, ji = st.split(j, factor=8)
    st.reorder(io, jo, ii, ji)
    cst.compute_at(st, jo)
    cj, ci = cst.op.axis        # the cache's own order: j first
    (k,) = cst.op.reduce_axis
    cst.reorder(k, cj, ci)
    cst.vectorize(ci)
    step = next(x for x in s.steps if x["op"] == "cache_write")
    assert step["order"] == [1, 0]
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, tuple(A.shape)).astype(np.float32)
    b = rng.uniform(-1, 1, tuple(B.shape)).astype(np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)
    got = np.full(tuple(out.shape), np.nan, np.float32)
    C.build(s, [A, B, out])(a, b, got)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    A2, B2, out2 = matmul()
    replayed = apply_steps([out2], steps_from_json(steps_to_json(s.steps)))
    got = np.full(tuple(out2.shape), np.nan, np.float32)
    C.build(replayed, [A2, B2, out2])(a, b, got)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert [x.get("order") for x in replayed.steps if x["op"] == "cache_write"] == [[1, 0]]


# ----------------------------------------------------------------------------- prefetch

def test_prefetch_correct_and_replayed(mm_data):
    """A prefetch changes no value: the lines iteration ko + 3 reads of A (4 floats: one line)
    and of B (4 rows of an 8-column panel) are asked for at the top of iteration ko."""
    A, B, out = matmul()
    s = C.create_schedule(out)
    st = s[out]
    i, j, k = st.root_iter_vars
    jo, ji = st.split(j, factor=8)
    ko, ki = st.split(k, factor=4)
    st.reorder(i, jo, ko, ki, ji)
    st.vectorize(ji)
    st.prefetch(A, ko, 3)
    st.prefetch(B, ko, 2)
    f = lower(s, [A, B, out])
    fetched = [(p.buffer.name, format_expr(p.index)) for p in walk_stmts(f.body) if isinstance(p, Prefetch)]
    assert fetched[0] == ("A", "(((i * 29) + (k_o * 4)) + 12)")
    # B's rows (ko+2)*4 .. +3 at columns jo*8 .. +7: 3 x 45 + 8 floats past the first, 9 lines of 16
    # (twice: the last column tile, which overhangs N, is a peeled copy of the loop)
    assert [b for b, _ in fetched] == (["A"] + ["B"] * 9) * 2
    _check_mm(s, [A, B, out], mm_data)
    assert {"op": "prefetch", "stage": 0, "tensor": "input0", "axis": 5, "offset": 3} in s.steps
    A2, B2, out2 = matmul()
    fresh = apply_steps(out2, steps_from_json(steps_to_json(s.steps)))
    assert str(lower(fresh, [A2, B2, out2])) == str(f)


def test_prefetch_errors(mm):
    s, st, (A, B, out) = mm
    i, j, k = st.root_iter_vars
    other = C.placeholder((3,), "float32", "Other")
    for bad in (0, 4097, 2.0, True):
        expect_error(s, lambda bad=bad: st.prefetch(A, k, bad), r"offset must be an integer in \[1, 4096\]")
    expect_error(s, lambda: st.prefetch(other, k, 1), "does not read Other")
    expect_error(s, lambda: st.prefetch(A, "nope", 1), "nope")


def test_prefetch_of_a_region_too_large_or_vectorized_fails_at_lowering():
    A, B, out = matmul(M=8, K=64, N=256)
    s = C.create_schedule(out)
    i, j, k = s[out].root_iter_vars
    s[out].reorder(i, k, j)
    s[out].prefetch(B, i, 1)        # all of B each iteration of i: 1024 lines
    with pytest.raises(ScheduleError, match="reads 1024 cache lines of B, more than 16"):
        lower(s, [A, B, out])
    A, B, out = matmul(M=8, K=64, N=16)
    s = C.create_schedule(out)
    i, j, k = s[out].root_iter_vars
    s[out].reorder(i, k, j)
    s[out].vectorize(j)
    s[out].prefetch(B, j, 1)
    with pytest.raises(ScheduleError, match="vectorized"):
        lower(s, [A, B, out])
    A, B, out = matmul()
    s = C.create_schedule(out)
    i, j, k = s[out].root_iter_vars
    s[out].prefetch(A, k, 1)
    s[out].split(k, factor=4)       # the loop the prefetch was at is gone: refused, not dropped
    with pytest.raises(ScheduleError, match="split or fused after the prefetch"):
        lower(s, [A, B, out])


def test_prefetch_of_a_gathered_tensor_is_refused_at_lowering():
    """A later iteration's data-dependent index is not yet checked: prefetching through it is
    refused, not emitted (its check would fire on an index no iteration reads)."""
    A = C.placeholder((64,), "float32", "A")
    idx = C.placeholder((8,), "int64", "Idx")
    out = C.compute((8,), lambda i: A[idx[i]], name="G")
    s = C.create_schedule(out)
    s[out].prefetch(A, s[out].root_iter_vars[0], 1)
    with pytest.raises(ScheduleError, match="data-dependent"):
        lower(s, [A, idx, out])
