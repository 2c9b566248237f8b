"""Measure, on one thread, what compiler.scaling needs to predict a kernel on many.

For a schedule and its argument arrays: the plain kernel's time on one thread (the measurement
protocol, compiler/timing.py: the median of clean samples), and the profiling build's
(compiler/region_clock.py) per-iteration cost and entry count of every parallel region. The
profiling build runs several single calls; each counter slot's figure is its median over them,
so a call a neighbour interrupted moves no slot (a shared 2-core host). The clock reads' own
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


def clocked_counters(clocked, arrays) -> np.ndarray:
    """The profiling build's counters per call: the median of each slot over several calls."""
    timed = [aligned_copy(a) for a in arrays]
    clocked.kernel(*timed)   # warm-up
    rounds: list = []
    t0 = time.perf_counter()
    while len(rounds) < CLOCKED_CALLS[1] and (len(rounds) < CLOCKED_CALLS[0]
                                               or time.perf_counter() - t0 < CLOCKED_SECONDS):
        clocked.clock.reset()
        clocked.kernel(*timed)
        rounds.append(clocked.clock.counters.copy())
    return np.median(np.array(rounds), axis=0)


def measure_kernel(schedule, tensors, arrays, costs: ParallelCosts, target=None, name: str = "kernel",
                   plain: Kernel | None = None, options: TimingOptions = SHORT) -> KernelTiming:
    """KernelTiming of `schedule` over `tensors`, run on `arrays` (one per tensor). `plain`: the
    kernel already built from the schedule (built here otherwise)."""
    plain = plain or build(schedule, tensors, target)
    clocked = build_clocked(schedule, tensors, target)
    with one_thread():
        seconds = plain.measure(*arrays, options=options).median
        counters = clocked_counters(clocked, arrays)
    clock, rate, pair = clocked.clock, costs.ticks_per_second, costs.clock_pair_seconds
    regions = []
    for r in clocked.regions:
        clock.counters[:] = counters
        entries = max(int(round(clock.entries(r.index))), 0)
        iters = np.maximum(clock.iteration_ticks(r.index) / rate - pair * entries, 0.0)
        span = max(clock.span_ticks(r.index) / rate - pair * entries * (r.extent + 1), 0.0)
        regions.append(RegionTiming(r, iters, entries, span))
    return KernelTiming(name, seconds, regions)


__all__ = ["measure_kernel", "one_thread", "clocked_counters"]
