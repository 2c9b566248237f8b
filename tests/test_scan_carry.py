"""Scans written as masked reductions computed as running carries (compiler/ops/scan_carry.py,
schedule_rules' scan rule) and product tiles over grouped reads (schedule_tile.tile_group, the
arith rule that makes `(8·fo + fi) // 16` lane-uniform): kernels against float64 numpy at odd
sizes, poisoned outputs, rules firing on DAG shapes they were not written for."""

from __future__ import annotations

import numpy as np
import pytest

import compiler as C
from compiler import arith
from compiler.expr import Binary, Const, Var, walk
from compiler.ops.custom import custom_op
from compiler.ops.default_schedules import default_schedule
from compiler.ops.scan_carry import scan_plan
from compiler.ops.schedule_anchor import anchor_recipe_choices, schedule_anchor_recipe
from compiler.ops.schedule_rules import rule_of
from compiler.ops.schedule_tile import product_tile, tile_group
from compiler.schedule_steps import apply_steps
from compiler.verify import poisoned

TARGET = C.Target.host()


def _inputs(opdef, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for t in opdef.inputs:
        if t.dtype.startswith("int"):
            out.append(rng.integers(-50, 50, t.shape).astype(t.dtype))
        else:
            out.append((rng.uniform(0.5, 1.5, t.shape) * rng.choice([-1, 1], t.shape)).astype(t.dtype))
    return out


def _run(opdef, schedule, arrays):
    kernel = C.build(schedule, opdef.tensors)
    out = poisoned(opdef.output.shape, opdef.output.dtype, 0)
    kernel(*arrays, out)
    return out


def _close(got, ref, tol=1e-5):
    assert np.max(np.abs(got - ref)) <= tol * max(1.0, float(np.max(np.abs(ref))))


def _cumsum(R=13, L=29):
    X = C.placeholder((R, L), "float32", "X")
    k = C.reduce_axis(L, "k")
    return custom_op("user_cumsum", [X], C.compute((R, L), lambda i, j: C.sum(X[i, k], axis=k, where=k <= j), name="cs"))


def test_scan_cumsum_is_a_carry_and_replays():
    opdef = _cumsum()
    assert rule_of(opdef) == "scan"
    s = default_schedule(opdef, TARGET)
    assert s.steps[0] == {"op": "rewrite", "tensor": 0, "name": "scan_carry"}
    (x,) = _inputs(opdef)
    out = _run(opdef, s, [x])
    _close(out, np.cumsum(x.astype(np.float64), 1))
    # the rewrite is a step: the steps replayed on a fresh definition give the same kernel
    fresh = _cumsum()
    _close(_run(fresh, apply_steps([fresh.output], s.steps), [x]), np.cumsum(x.astype(np.float64), 1))
    # the knob's other value computes the masked form as written
    assert anchor_recipe_choices(opdef, TARGET)["carry"] == [True, False]
    plain = schedule_anchor_recipe(opdef, TARGET, {"carry": False})
    assert all(st["op"] != "rewrite" for st in plain.steps)
    _close(_run(opdef, plain, [x]), np.cumsum(x.astype(np.float64), 1))


def test_scan_exclusive_max_along_a_leading_axis():
    """A shape the rule was not written for: an exclusive running max along axis 0 of a 3-D
    tensor, the comparison written the other way round (j > k); the carry's inner axis is the
    contiguous last one (vectors)."""
    L, A, B = 11, 5, 19
    X = C.placeholder((L, A, B), "float32", "X")
    k = C.reduce_axis(L, "k")
    out = C.compute((L, A, B), lambda j, a, b: C.max(X[k, a, b] * 2.0, axis=k, where=j > k), name="xmax")
    opdef = custom_op("user_exclusive_max", [X], out)
    assert scan_plan(out.op) == (0, -1, False)
    s = default_schedule(opdef, TARGET)
    assert any(st["op"] == "vectorize" for st in s.steps)
    (x,) = _inputs(opdef)
    ref = np.full((L, A, B), -np.inf)
    ref[1:] = np.maximum.accumulate(2.0 * x.astype(np.float64), axis=0)[:-1]
    got = _run(opdef, s, [x])
    assert np.array_equal(got[1:], ref[1:].astype(np.float32)) and np.all(np.isneginf(got[0]))


def test_scan_int_min_with_fewer_taps_than_points():
    """int32, exact: a running min over the first 9 taps along 15 output points (the carry stops
    adding where k runs out), with an elementwise stage after it."""
    R, N, K = 7, 15, 9
    X = C.placeholder((R, K), "int32", "X")
    k = C.reduce_axis(K, "k")
    m = C.compute((R, N), lambda i, j: C.min(X[i, k] - 3, axis=k, where=k <= j), name="runmin")
    out = C.compute((R, N), lambda i, j: m[i, j] * 2, name="twice")
    opdef = custom_op("user_runmin", [X], out)
    assert rule_of(opdef) == "scan"
    (x,) = _inputs(opdef)
    got = _run(opdef, default_schedule(opdef, TARGET), [x])
    run = np.minimum.accumulate(x.astype(np.int64) - 3, axis=1)
    ref = np.concatenate([run, np.repeat(run[:, -1:], N - K, axis=1)], axis=1) * 2
    assert np.array_equal(got, ref)


@pytest.mark.parametrize("strict", [False, True])
def test_scan_reverse_sum_along_rows(strict):
    """k >= j (a suffix sum) and k > j (exclusive): a forward carry over the reversed axis, read
    reversed; odd sizes, the scan along the contiguous axis."""
    R, L = 11, 17
    X = C.placeholder((R, L), "float32", "X")
    k = C.reduce_axis(L, "k")
    out = C.compute((R, L), lambda i, j: C.sum(X[i, k] + 1.0, axis=k, where=(k > j) if strict else (j <= k)), name="suffix")
    opdef = custom_op("user_suffix_sum", [X], out)
    assert scan_plan(out.op) == (1, int(strict), True)
    s = default_schedule(opdef, TARGET)
    assert s.steps[0]["name"] == "scan_carry"
    (x,) = _inputs(opdef)
    suffix = np.cumsum((x.astype(np.float64) + 1)[:, ::-1], 1)[:, ::-1]
    ref = np.concatenate([suffix[:, 1:], np.zeros((R, 1))], 1) if strict else suffix
    _close(_run(opdef, s, [x]), ref)


def test_scan_cumprod_as_exp_of_log_sums():
    R, L = 9, 23
    X = C.placeholder((R, L), "float32", "X")
    k = C.reduce_axis(L, "k")
    s_ = C.compute((R, L), lambda i, j: C.sum(C.log(1.0 + X[i, k] * 0.25), axis=k, where=k <= j), name="logsum")
    opdef = custom_op("user_cumprod", [X], C.compute((R, L), lambda i, j: C.exp(s_[i, j]), name="cumprod"))
    (x,) = _inputs(opdef)
    got = _run(opdef, default_schedule(opdef, TARGET), [x])
    _close(got, np.cumprod(1 + x.astype(np.float64) / 4, 1), 1e-5)


def test_scan_plan_leaves_what_is_not_a_scan():
    R, L = 5, 6
    X = C.placeholder((R, L), "float32", "X")
    k, c = C.reduce_axis(L, "k"), C.reduce_axis(2, "c")
    reads_i = C.compute((R, L), lambda i, j: C.sum(X[i, k] * j.astype("float32"), axis=k, where=k <= j), name="a")
    ahead = C.compute((R, L), lambda i, j: C.sum(X[i, k], axis=k, where=k <= j + 1), name="b")
    two = C.compute((R, L), lambda i, j: C.sum(X[i, k] * c.astype("float32"), axis=[k, c], where=k <= j), name="c")
    plain = C.compute((R, L), lambda i, j: C.sum(X[i, k], axis=k), name="d")
    for t in (reads_i, ahead, two, plain):
        assert scan_plan(t.op) is None


# ------------------------------------------------------------------ grouped reads
def _grouped_conv1d(L, Ch, G, KW=3):
    cg = Ch // G
    X, W = C.placeholder((1, L, Ch), "float32", "X"), C.placeholder((KW, cg, Ch), "float32", "W")
    pd = C.compute((1, L + 2, Ch), lambda n, t, c: C.if_then_else((t >= 1) & (t <= L), X[n, t - 1, c], 0.0), name="pad_t")
    r, c = C.reduce_axis(KW, "r"), C.reduce_axis(cg, "c")
    out = C.compute((1, L, Ch), lambda n, t, f: C.sum(pd[n, t + r, (f // cg) * cg + c] * W[r, c, f], axis=[r, c]), name="gconv")
    return custom_op("user_gconv1d", [X, W], out)


@pytest.mark.parametrize("L,Ch,G", [(37, 128, 8), (23, 128, 4)])
def test_grouped_conv1d_nwc_gets_the_product_tile(L, Ch, G):
    opdef = _grouped_conv1d(L, Ch, G)
    red = opdef.output.op
    assert tile_group(red) == Ch // G
    _, _, nr = product_tile(red, TARGET)
    assert (Ch // G) % nr == 0
    s = default_schedule(opdef, TARGET)
    text = str(C.lower(s, opdef.tensors))
    assert "f_i) // " not in text          # the grouped read is one value per vector
    x, w = _inputs(opdef)
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (0, 0)))
    cg, ref = Ch // G, np.zeros((1, L, Ch))
    for f in range(Ch):
        g = f // cg
        for rr in range(3):
            ref[0, :, f] += xp[0, rr:rr + L, g * cg:(g + 1) * cg] @ w[rr, :, f].astype(np.float64)
    _close(_run(opdef, s, [x, w]), ref)


def test_grouped_read_tiles_a_block_diagonal_matmul():
    """A DAG the rule was not written for: a block-diagonal matrix product (groups of 16 columns,
    each its own 16 rows of A's columns)."""
    M, N, g = 19, 48, 16
    A, B = C.placeholder((M, N), "float32", "A"), C.placeholder((g, N), "float32", "B")
    c = C.reduce_axis(g, "c")
    out = C.compute((M, N), lambda i, f: C.sum(A[i, (f // g) * g + c] * B[c, f], axis=c), name="bdiag")
    opdef = custom_op("user_block_diag", [A, B], out)
    assert product_tile(out.op, TARGET) is not None
    a, b = _inputs(opdef)
    ref = np.zeros((M, N))
    for f in range(N):
        ref[:, f] = a[:, (f // g) * g:(f // g + 1) * g].astype(np.float64) @ b[:, f].astype(np.float64)
    _close(_run(opdef, default_schedule(opdef, TARGET), [a, b]), ref)


def _ev(e, env):
    if isinstance(e, Var):
        return env[e]
    if isinstance(e, Const):
        return int(e.value)
    a, b = _ev(e.a, env), _ev(e.b, env)
    ops = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b, "floordiv": lambda: a // b,
           "floormod": lambda: a % b, "min": lambda: min(a, b), "max": lambda: max(a, b)}
    return ops[e.op]()


def test_arith_divides_by_a_part_exactly():
    """floor((m·A + S) / c) and its mod, m | c, S within one block of m: every value checked."""
    fo, fi, g = Var("fo", "int64"), Var("fi", "int64"), Var("g", "int64")
    e = Binary("floordiv", fo * 8 + fi, Const(16, "int64"), "int64")
    assert fi not in list(walk(arith.simplify(e, {fo: (0, 15), fi: (0, 7)})))
    for c, m, off in [(16, 8, 0), (32, 16, 3), (12, 4, -2), (6, 3, 1)]:
        for op in ("floordiv", "floormod"):
            e = Binary(op, fo * m + fi + g * (2 * c) + off, Const(c, "int64"), "int64")
            ranges = {fo: (-5, 9), fi: (0, m - 1), g: (0, 3)}
            se = arith.simplify(e, ranges)
            for a in range(-5, 10):
                for b in range(m):
                    for gg in range(4):
                        x = a * m + b + gg * 2 * c + off
                        assert _ev(se, {fo: a, fi: b, g: gg}) == (x // c if op == "floordiv" else x % c)
