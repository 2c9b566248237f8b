"""Consecutive parallel loops of a kernel run as one team (compiler/parallel_teams.py): one fork,
a barrier between loops, one join; the scaling model sees the same teams.

The kernels here make the second loop read what other threads' chunks of the first wrote (rows
reversed and rotated), so a missing or misplaced barrier shows as wrong numbers."""

from __future__ import annotations

import numpy as np
import pytest

import compiler as C
from compiler.codegen_llvm import generate
from compiler.kernel_scaling import one_thread
from compiler.lower import lower
from compiler.openmp import get_max_threads
from compiler.parallel_probe import ParallelCosts
from compiler.parallel_regions import Region, parallel_regions
from compiler.parallel_teams import Team, barriers_needed, team_plan
from compiler.region_clock import build_clocked
from compiler.scaling import KernelTiming, RegionTiming, predict

ROWS, COLS = 67, 1000    # 67K elements: a team cap of 4 by work; 67 rows divide into no chunk size


def _two_stages(serial_between: bool = False, rows=ROWS, cols=COLS):
    A = C.placeholder((rows, cols), name="A")
    B = C.compute((rows, cols), lambda i, j: A[i, j] * 2.0 + 1.0, name="B")
    mid = B
    if serial_between:
        mid = C.compute((rows, cols), lambda i, j: B[i, j] - 1.0, name="mid")
    out = C.compute((rows, cols), lambda i, j: mid[rows - 1 - i, j] + mid[(i + 5) % rows, j], name="out")
    s = C.create_schedule(out)
    s[B].parallel(s[B].op.axis[0])
    s[out].parallel(s[out].op.axis[0])
    return A, out, s


def _expected(a, serial_between=False):
    b = a.astype(np.float64) * 2.0 + 1.0
    if serial_between:
        b = b - 1.0
    rows = a.shape[0]
    return b[::-1] + b[(np.arange(rows) + 5) % rows]


def _ir(s, args) -> str:
    return str(generate(lower(s, args), C.Target.host()))


def _forks(ir: str) -> int:
    return ir.count('@"GOMP_parallel"(') - ir.count('declare void @"GOMP_parallel"(')


@pytest.mark.parametrize("threads", [1, 2])
def test_consecutive_parallel_stages_run_as_one_team(threads):
    A, out, s = _two_stages()
    plan = team_plan(lower(s, [A, out], "k").body)
    assert plan is not None and sum(isinstance(i, Team) for i in plan[1]) == 1
    ir = _ir(s, [A, out])
    assert _forks(ir) == 1 and "GOMP_barrier" in ir
    k = C.build(s, [A, out])
    before = get_max_threads()
    C.set_num_threads(threads)
    try:
        a = np.random.default_rng(1).standard_normal((ROWS, COLS)).astype(np.float32)
        for _ in range(20):   # a race would show in some of the calls
            got = np.full((ROWS, COLS), np.nan, np.float32)
            k(a, got)
            np.testing.assert_allclose(got, _expected(a), rtol=1e-6, atol=1e-5)
    finally:
        C.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_loop_waits_only_for_the_loops_whose_buffers_it_touches(threads):
    """Two independent copies, then a loop reading both: one barrier, before the third loop;
    its reads cross rows, so without that barrier the numbers would be wrong."""
    A = C.placeholder((ROWS, COLS), name="A")
    Bin = C.placeholder((ROWS, COLS), name="Bin")
    P = C.compute((ROWS, COLS), lambda i, j: A[i, j] * 2.0, name="P")
    Q = C.compute((ROWS, COLS), lambda i, j: Bin[i, j] + 3.0, name="Q")
    out = C.compute((ROWS, COLS), lambda i, j: P[ROWS - 1 - i, j] * Q[(i + 7) % ROWS, j], name="out")
    s = C.create_schedule(out)
    for st in (P, Q, out):
        s[st].parallel(s[st].op.axis[0])
    (team,) = [i for i in team_plan(lower(s, [A, Bin, out], "k").body)[1] if isinstance(i, Team)]
    assert team.barriers == (False, False, True)
    assert [r.waits for r in parallel_regions(lower(s, [A, Bin, out], "k"))] == [False, False, True]
    ir = _ir(s, [A, Bin, out])
    assert _forks(ir) == 1 and ir.count('call void @"GOMP_barrier"()') == 1
    k = C.build(s, [A, Bin, out])
    rng = np.random.default_rng(6)
    a, b = (rng.standard_normal((ROWS, COLS)).astype(np.float32) for _ in range(2))
    want = (a.astype(np.float64) * 2.0)[::-1] * (b.astype(np.float64) + 3.0)[(np.arange(ROWS) + 7) % ROWS]
    before = get_max_threads()
    C.set_num_threads(threads)
    try:
        for _ in range(20):
            got = np.full((ROWS, COLS), np.nan, np.float32)
            k(a, b, got)
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
    finally:
        C.set_num_threads(before)


def test_barriers_follow_reads_and_writes_since_the_last_one():
    """Write after read waits too: a loop that overwrites what an earlier one still reads."""
    A = C.placeholder((ROWS, COLS), name="A")
    P = C.compute((ROWS, COLS), lambda i, j: A[i, j] * 2.0, name="P")
    Q = C.compute((ROWS, COLS), lambda i, j: A[ROWS - 1 - i, j] + 1.0, name="Q")
    out = C.compute((ROWS, COLS), lambda i, j: P[i, j] + Q[i, j], name="out")
    s = C.create_schedule(out)
    for st in (P, Q, out):
        s[st].parallel(s[st].op.axis[0])
    func = lower(s, [A, out], "k")
    (team,) = [i for i in team_plan(func.body)[1] if isinstance(i, Team)]
    assert team.barriers == (False, False, True)      # P and Q only read A: no wait between them
    loops = team.loops
    assert barriers_needed((loops[0], loops[2], loops[1])) == (False, True, True)   # Q overwrites what out read
    assert barriers_needed((loops[2], loops[0])) == (False, True)   # P overwrites what out reads
    with pytest.raises(ValueError):
        Team(loops[:2], (True, False))


def test_a_serial_stage_between_parallel_ones_ends_the_team():
    A, out, s = _two_stages(serial_between=True)
    assert team_plan(lower(s, [A, out], "k").body) is None
    ir = _ir(s, [A, out])
    assert _forks(ir) == 2 and "GOMP_barrier" not in ir
    k = C.build(s, [A, out])
    a = np.random.default_rng(2).standard_normal((ROWS, COLS)).astype(np.float32)
    got = np.full((ROWS, COLS), np.nan, np.float32)
    k(a, got)
    np.testing.assert_allclose(got, _expected(a, serial_between=True), rtol=1e-6, atol=1e-5)


def test_a_checked_index_failing_in_a_team_is_reported_and_the_next_call_runs():
    n, cols = 64, 1024
    A = C.placeholder((8, cols), name="A")
    idx = C.placeholder((n,), "int32", "idx")
    G = C.compute((n, cols), lambda i, j: A[idx[i], j] + 1.0, name="G")
    out = C.compute((n, cols), lambda i, j: G[n - 1 - i, j] * 3.0, name="out")
    s = C.create_schedule(out)
    s[G].parallel(s[G].op.axis[0])
    s[out].parallel(s[out].op.axis[0])
    assert _forks(_ir(s, [A, idx, out])) == 1
    k = C.build(s, [A, idx, out])
    a = np.random.default_rng(3).standard_normal((8, cols)).astype(np.float32)
    good = np.arange(n, dtype=np.int32) % 8
    got = np.full((n, cols), np.nan, np.float32)
    for _ in range(3):
        bad = good.copy()
        bad[41] = 9
        with pytest.raises(C.KernelRuntimeError, match="index 9 is out of range"):
            k(a, bad, got)
    k(a, good, got)
    np.testing.assert_allclose(got, ((a[good] + 1.0) * 3.0)[::-1], rtol=1e-6)


# ----------------------------------------------------------------------------- what the scaling model sees

def test_regions_of_a_team_fork_once_and_share_the_largest_cap():
    A, out, s = _two_stages(rows=ROWS, cols=4 * COLS)
    first, second = parallel_regions(lower(s, [A, out], "k"))
    assert first.forks and not second.forks and second.first == first.index == 0 and second.waits
    assert first.team(64) == second.team(64) == max(first.team_cap, second.team_cap)
    small = Region(1, "j", 64, 4, 1, 0, first=0, threads_cap=16, waits=True)   # a cap-4 loop in a team of 16
    assert small.team(64) == 16 and len(small.chunks(64)) == 16                  # its chunks cut for 4 threads


def test_profiling_build_counts_the_team_span_once_and_every_entry():
    A, out, s = _two_stages()
    clocked = build_clocked(s, [A, out])
    a = np.random.default_rng(4).standard_normal((ROWS, COLS)).astype(np.float32)
    got = np.full((ROWS, COLS), np.nan, np.float32)
    with one_thread():   # as the scaling model runs it: the span holds every iteration
        clocked.kernel(a, got)
    np.testing.assert_allclose(got, _expected(a), rtol=1e-6, atol=1e-5)
    clock = clocked.clock
    assert clock.entries(0) == clock.entries(1) == 1
    assert clock.span_ticks(1) == 0 and clock.span_ticks(0) >= clock.iteration_ticks(0).sum() + clock.iteration_ticks(1).sum()
    assert clock.call_ticks() >= clock.span_ticks(0)


def test_a_teams_later_region_pays_a_barrier_not_a_fork_and_only_where_it_waits():
    lone = Region(0, "i", 64, 64, 1, 0)
    joined = Region(1, "j", 64, 64, 1, 0, first=0, threads_cap=64, waits=True)
    free = Region(2, "k", 64, 64, 1, 0, first=0, threads_cap=64, waits=False)
    fork = lambda team: 5e-6   # noqa: E731
    barrier = lambda team: 1e-6   # noqa: E731
    costs = np.full(64, 1e-6)
    kt = KernelTiming("k", 1.0, [RegionTiming(r, costs, 1) for r in (lone, joined, free)], measured_serial=0.0)
    p = predict(kt, 16, fork, barrier=barrier)
    assert p.losses["fork/join"] == pytest.approx(5e-6 + 1e-6)     # the region that does not wait pays nothing


def test_fork_join_extrapolates_one_release_and_a_barrier_step_a_thread():
    costs = ParallelCosts(1e9, 0.0, {1: 0.5e-6, 2: 1.5e-6}, 2, {1: 0.2e-6, 2: 0.4e-6})
    assert costs.fork_join(1) == pytest.approx(0.5e-6) and costs.fork_join(2) == pytest.approx(1.5e-6)
    # the second thread's 1.0 us: 0.8 us release (once) + 0.2 us barrier step (each thread)
    assert costs.fork_join(16) == pytest.approx(0.5e-6 + 0.8e-6 + 15 * 0.2e-6)
    assert costs.barrier(16) == pytest.approx(0.2e-6 + 15 * 0.2e-6) and costs.barrier(16) <= costs.fork_join(16)
    linear = ParallelCosts(1e9, 0.0, {1: 0.5e-6, 2: 1.5e-6}, 2)    # no barrier figure: linear, an upper bound
    assert linear.fork_join(16) == pytest.approx(0.5e-6 + 15 * 1e-6) and linear.barrier(16) == linear.fork_join(16)


def test_a_measured_team_is_never_predicted_faster_than_its_thread_count():
    from compiler.kernel_scaling import measure_kernel
    from compiler.parallel_probe import measure_parallel_costs

    A, out, s = _two_stages()
    a = np.random.default_rng(5).standard_normal((ROWS, COLS)).astype(np.float32)
    costs = measure_parallel_costs()
    kt = measure_kernel(s, [A, out], [a, np.zeros_like(a)], costs)
    assert kt.serial_seconds >= 0 and kt.regions[1].span_seconds > 0
    for n in (1, 2, 4, 16, 128):
        p = predict(kt, n, costs.fork_join, barrier=costs.barrier)
        assert 0 < p.speedup <= n * (1 + 1e-9)
