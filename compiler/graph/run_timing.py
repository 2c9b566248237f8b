"""One way to time whole-model runs against each other: what `tunefarm model run`, `model profile`
and the benchmarks all report.

A speed-up is the ratio of two things timed in the same process, one after the other, on the same
threads. Each side is timed by the measurement protocol (compiler/timing.py: batched samples, the
median of the clean ones, each checked for time lost to other processes, under the host's
exclusive timing lock), after a warm-up call (a run that took LONG_RUN_S or more in its first
round gets none after it), for `rounds` rounds, the sides alternating, with a
pause between them: another runtime's thread pool spins for a while after its last call
(onnxruntime's intra-op threads, OpenMP's team), and a side timed in that window runs on cores
still taken by the other. Measured on a 2-core host, a 4-layer ViT-B ran 139 ms right after an
onnxruntime call and 84 ms after a 0.1 s pause; single calls alternated back to back read it
0.66x onnxruntime where this protocol read 0.96x, same process, same kernels.

`round_ratio` is the median over rounds of each round's ratio: a host whose speed shifts between
rounds moves both sides of a round, not one side of the overall medians.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import host_lock
from ..timing import Timing, TimingOptions, time_samples

PAUSE_S = 0.1   # between two sides: longer than onnxruntime's and libgomp's spin-wait after a call
ATTEMPTS = 2    # per round (run_options)
LONG_RUN_S = 0.2   # a run this long is timed without a warm-up call after its first round


@dataclass
class RunTimes:
    """One side's timings: the median of its rounds' medians (ms), and each round's."""

    ms: float
    rounds_ms: list = field(default_factory=list)
    disturbed: bool = False       # a round's timing lost time to other processes, even after retries
    host_busy: float = 0.0        # the most CPUs' worth of other work seen during a round
    timings: list = field(default_factory=list, repr=False)


def run_options(repeat: int = 5, min_seconds: float = 0.05) -> TimingOptions:
    """The protocol's options for a whole run: at least `repeat` clean samples over at least
    `min_seconds` per round, in two attempts: a round is one of several, alternated, and a shared
    host that disturbed a second attempt at a seconds-long run disturbed a fourth as well (a
    batch-8 VGG-19 shape took 4.5 minutes to time); a round still disturbed says so."""
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    return TimingOptions(min_samples=repeat, min_seconds=min_seconds, attempts=ATTEMPTS)


def time_call(fn: Callable[[], object], options: TimingOptions | None = None, lock: bool = True,
              warm_up: bool = True) -> Timing:
    """`fn()` timed by the protocol after one warm-up call, holding the host's timing lock; a
    warm-up that lasted a sample sets the calls per sample (one) without another probing call.
    `warm_up=False`: the caller knows a call lasts a sample and more (LONG_RUN_S) and that `fn`
    ran before; a sample is then one call, with no warm-up (what a cold cache costs a
    seconds-long run is lost in it)."""
    opts = options or run_options()

    def run_batch(n):
        for _ in range(n):
            fn()

    def timed():
        if not warm_up:
            return time_samples(run_batch, opts, calls=1)
        t0 = time.perf_counter()
        fn()
        warm = time.perf_counter() - t0
        return time_samples(run_batch, opts, calls=1 if warm >= opts.min_sample_s else None)

    if not lock:
        return timed()
    with host_lock.exclusive():
        return timed()


def time_interleaved(runs: dict, rounds: int = 5, repeat: int = 5, pause_s: float = PAUSE_S) -> dict:
    """{name: RunTimes} of each callable in `runs`, timed one after the other for `rounds` rounds
    (see the module docstring)."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    opts = run_options(repeat)
    timings: dict = {name: [] for name in runs}
    for _ in range(rounds):
        for name, fn in runs.items():
            # a side whose last round's calls took LONG_RUN_S or more is not warmed up again
            warm_up = not timings[name] or timings[name][-1].median < LONG_RUN_S
            timings[name].append(time_call(fn, opts, warm_up=warm_up))
            time.sleep(pause_s)
    return {name: RunTimes(ms=statistics.median(t.median for t in ts) * 1e3,
                           rounds_ms=[t.median * 1e3 for t in ts], disturbed=any(t.disturbed for t in ts),
                           host_busy=max(t.host_busy for t in ts), timings=ts)
            for name, ts in timings.items()}


def round_ratio(times: dict, reference: str, ours: str) -> float:
    """The median over rounds of reference / ours (> 1: ours is faster)."""
    return statistics.median(r / o for r, o in zip(times[reference].rounds_ms, times[ours].rounds_ms))


__all__ = ["RunTimes", "run_options", "time_call", "time_interleaved", "round_ratio", "PAUSE_S"]
