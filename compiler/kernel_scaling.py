"""Measure, on one thread, what compiler.scaling needs to predict a kernel on many.

For a schedule and its argument arrays: the plain kernel's time on one thread (the measurement
protocol, compiler/timing.py: the median of clean samples), and the profiling build's
(compiler/region_clock.py) per-iteration cost and entry count of every parallel region. The
profiling build runs several single calls; each counter slot's figure is its median over them,
so a call a neighbour interrupted moves no slot (a shared 2-core host). The serial part is each
call's time less its regions' spans, the median over the calls: one measurement, so a host whose
speed drifts between two timings cannot turn the drift into serial time. The clock reads' own
cost (compiler/parallel_probe.py) is taken off every iteration and every span.

Both run on one thread: a thread's cost per iteration is what each of N threads would pay, as
long as the data stays in its own caches; the bandwidth bound of compiler.scaling covers the
case where it does not.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

from .buffers import aligned_copy
from .openmp import get_max_threads, set_num_threads
from .parallel_probe import ParallelCosts
from .region_clock import build_clocked
from .runtime import Kernel, build
from .scaling import KernelTiming, RegionTiming
from .timing import TimingOptions

SHORT = TimingOptions(min_samples=5, max_samples=60, min_seconds=0.02, max_seconds=0.3)
CLOCKED_CALLS = (5, 40)    # profiling-build calls: at least, at most
CLOCKED_SECONDS = 0.15     # ... until this long


@contextlib.contextmanager
def one_thread():
    """Parallel loops of this thread's kernels on one thread, the previous count restored."""
    before = get_max_threads()
    set_num_threads(1)
    try:
        yield
    finally:
        set_num_threads(before)


def clocked_rounds(clocked, arrays) -> np.ndarray:
    """The profiling build's counters of several single calls, one row each."""
    timed = [aligned_copy(a) for a in arrays]
    clocked.kernel(*timed)   # warm-up
    rounds: list = []
    t0 = time.perf_counter()
    while len(rounds) < CLOCKED_CALLS[1] and (len(rounds) < CLOCKED_CALLS[0]
                                               or time.perf_counter() - t0 < CLOCKED_SECONDS):
        clocked.clock.reset()
        clocked.kernel(*timed)
        rounds.append(clocked.clock.counters.copy())
    return np.array(rounds)


def clocked_counters(clocked, arrays) -> np.ndarray:
    """The profiling build's counters per call: the median of each slot over several calls."""
    return np.median(clocked_rounds(clocked, arrays), axis=0)


def measure_kernel(schedule, tensors, arrays, costs: ParallelCosts, target=None, name: str = "kernel",
                   plain: Kernel | None = None, options: TimingOptions = SHORT) -> KernelTiming:
    """KernelTiming of `schedule` over `tensors`, run on `arrays` (one per tensor). `plain`: the
    kernel already built from the schedule (built here otherwise)."""
    plain = plain or build(schedule, tensors, target)
    clocked = build_clocked(schedule, tensors, target)
    with one_thread():
        seconds = plain.measure(*arrays, options=options).median
        rounds = clocked_rounds(clocked, arrays)
    return timing_from_rounds(name, seconds, clocked.clock, rounds, costs)


def timing_from_rounds(name: str, seconds: float, clock, rounds: np.ndarray, costs: ParallelCosts) -> KernelTiming:
    """KernelTiming from the profiling build's `rounds` (one row of counters a call).

    Everything but the plain call's `seconds` (kept for people) comes from those calls: the
    serial part is each call less its regions' spans; a team's span (compiler/parallel_teams.py:
    counted on its first region, covering every region of the team) less the clock reads and the
    one-thread fork and barriers is the parallel work, spread over the team's iterations in
    proportion to their measured costs. The reads' own cost (they stop the core from overlapping
    one iteration with the next) lands in the iterations it slows, so the one-thread time the
    prediction starts from and the work it divides are one measurement: no speed-up above the
    thread count, and no share of the host's drift between two timings."""
    rate, pair = costs.ticks_per_second, costs.clock_pair_seconds
    counters = np.median(rounds, axis=0)
    spans = rounds[:, [2 * r.index for r in clock.regions]].sum(axis=1)
    serial = max(float(np.median(rounds[:, clock.call_slot] - spans)) / rate - pair, 0.0)
    clock.counters[:] = counters
    regions = []
    for r in clock.regions:
        entries = max(int(round(clock.entries(r.index))), 0)
        iters = np.maximum(clock.iteration_ticks(r.index) / rate - pair * entries, 0.0)
        regions.append(RegionTiming(r, iters, entries, clock.span_ticks(r.index) / rate))
    teams: dict = {}
    for rt in regions:
        teams.setdefault(rt.region.first if rt.region.first >= 0 else rt.region.index, []).append(rt)
    for members in teams.values():
        reads = pair * sum(rt.entries * (rt.region.extent + 1) for rt in members)
        span = max(members[0].span_seconds - reads, 0.0)
        syncs = {id(rt): rt.entries * (costs.fork_join(1) if rt.region.forks else
                                       costs.barrier(1) if rt.region.waits else 0.0) for rt in members}
        work = max(span - sum(syncs.values()), 0.0)
        measured = sum(rt.compute_seconds for rt in members)
        for rt in members:
            if measured > 0:
                rt.iteration_seconds = rt.iteration_seconds * (work / measured)
            rt.span_seconds = rt.compute_seconds + syncs[id(rt)]
    return KernelTiming(name, seconds, regions, serial)


__all__ = ["measure_kernel", "one_thread", "clocked_counters", "clocked_rounds", "timing_from_rounds"]
