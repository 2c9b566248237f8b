"""What this machine charges for a parallel region, measured with code made for the purpose.

Four small native probes, compiled here from LLVM IR and called as kernels:

- the cycle counter's rate (ticks per second, against time.perf_counter over tens of
  milliseconds; the counter is the invariant TSC on x86), to turn a profiling build's ticks
  (compiler/region_clock.py) into seconds;
- the cost of the profiling build's own clock reads around one iteration (two reads and the
  add into a slot, nothing between): subtracted from every timed iteration;
- fork/join: one GOMP_parallel of an empty region handing out team · CHUNKS_PER_THREAD empty
  chunks, each claimed by an atomic add on the region's counter (reset before the fork),
  exactly the generated code's protocol (team start, chunk claims, the closing barrier;
  codegen_llvm._emit_counted_chunks), repeated back to back as a model's kernels run, at a team of
  1 and of 2. It is measured with an empty body on purpose: anything in the body would be work,
  and work is what the scaling model counts separately.
- a barrier inside a running team (what a team's later loops pay, compiler/parallel_teams.py):
  one region of many GOMP_barrier calls back to back, its fork/join taken off, per barrier.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from .codegen_llvm import CHUNKS_PER_THREAD, COUNTER_STRIDE
from .runtime import ArgSpec, Kernel, compile_module
from .target import resolve_target

BARRIER_LOOP_IR = """
; params[1] barriers back to back, on every thread of the region that calls it
define internal void @tf_probe_barrier_loop(ptr %data) {
entry:
  %reps_at = getelementptr i64, ptr %data, i64 1
  %reps = load i64, ptr %reps_at
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%next, %loop]
  call void @GOMP_barrier()
  %next = add i64 %i, 1
  %more = icmp slt i64 %next, %reps
  br i1 %more, label %loop, label %done
done:
  ret void
}
"""

PROBE_IR = ("""
declare i64 @llvm.readcyclecounter()
declare void @GOMP_parallel(ptr, ptr, i32, i32)
declare i32 @omp_get_num_threads()
declare void @GOMP_barrier()

define i32 @tf_probe_ticks(ptr noalias %out, ptr %record) {
  %t = call i64 @llvm.readcyclecounter()
  store i64 %t, ptr %out
  ret i32 0
}

define i32 @tf_probe_clock_pairs(ptr noalias %params, ptr noalias %slots, ptr %record) {
entry:
  %n = load i64, ptr %params
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%next, %loop]
  %t0 = call i64 @llvm.readcyclecounter()
  %t1 = call i64 @llvm.readcyclecounter()
  %slot = getelementptr i64, ptr %slots, i64 %i
  %old = load volatile i64, ptr %slot
  %d = sub i64 %t1, %t0
  %new = add i64 %old, %d
  store volatile i64 %new, ptr %slot
  %next = add i64 %i, 1
  %more = icmp slt i64 %next, %n
  br i1 %more, label %loop, label %done
done:
  ret i32 0
}

define internal void @tf_probe_region(ptr %data) {
entry:
  %iters_at = getelementptr i64, ptr %data, i64 2
  %iters = load i64, ptr %iters_at
  %counter = getelementptr i64, ptr %data, i64 COUNTER
  %nth32 = call i32 @omp_get_num_threads()
  %nth = sext i32 %nth32 to i64
  %per = mul i64 %nth, CHUNKS
  %up = add i64 %iters, %per
  %up1 = sub i64 %up, 1
  %chunk = sdiv i64 %up1, %per
  %last = add i64 %iters, %chunk
  %last1 = sub i64 %last, 1
  %chunks = sdiv i64 %last1, %chunk
  br label %claim
claim:
  %c = atomicrmw add ptr %counter, i64 1 monotonic
  %more = icmp slt i64 %c, %chunks
  br i1 %more, label %body, label %done
body:
  %lo = mul i64 %c, %chunk
  %l = load volatile i64, ptr %iters_at
  br label %claim
done:
  ret void
}

""" + BARRIER_LOOP_IR + """
define i32 @tf_probe_barriers(ptr noalias %params, ptr noalias %out, ptr %record) {
entry:
  %team64 = load i64, ptr %params
  %team = trunc i64 %team64 to i32
  %t0 = call i64 @llvm.readcyclecounter()
  call void @GOMP_parallel(ptr @tf_probe_barrier_loop, ptr %params, i32 %team, i32 0)
  %t1 = call i64 @llvm.readcyclecounter()
  %d = sub i64 %t1, %t0
  store i64 %d, ptr %out
  ret i32 0
}

define i32 @tf_probe_forks(ptr noalias %params, ptr noalias %out, ptr %record) {
entry:
  %team64 = load i64, ptr %params
  %team = trunc i64 %team64 to i32
  %reps_at = getelementptr i64, ptr %params, i64 1
  %reps = load i64, ptr %reps_at
  %counter = getelementptr i64, ptr %params, i64 COUNTER
  %t0 = call i64 @llvm.readcyclecounter()
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%next, %loop]
  store i64 0, ptr %counter
  call void @GOMP_parallel(ptr @tf_probe_region, ptr %params, i32 %team, i32 0)
  %next = add i64 %i, 1
  %more = icmp slt i64 %next, %reps
  br i1 %more, label %loop, label %done
done:
  %t1 = call i64 @llvm.readcyclecounter()
  %d = sub i64 %t1, %t0
  store i64 %d, ptr %out
  ret i32 0
}
""").replace("CHUNKS", str(CHUNKS_PER_THREAD)).replace("COUNTER", str(COUNTER_STRIDE))


@dataclass
class ParallelCosts:
    """This machine's costs of running a region, in seconds."""

    ticks_per_second: float
    clock_pair_seconds: float     # one timed iteration's own clock reads (subtracted)
    fork_join_seconds: dict       # {team: seconds per region} for the teams measured (1, 2)
    cores: int                    # threads the fork/join figures could use (the host's)
    barrier_seconds: dict = field(default_factory=dict)   # {team: seconds per barrier}; empty: fork/join's

    def fork_join(self, team: int) -> float:
        """Fork/join of a region on `team` threads, measured at 1 and 2 and extrapolated by what
        libgomp does. It starts a warm team by one release that every waiting thread sees at
        once (a generation counter, a futex wake for those asleep): a cost the second thread adds
        once, not again with each further thread. It joins the team on a centralised barrier:
        each thread decrements one shared counter in turn, so that part grows by one cache-line
        transfer a thread. The barrier probe measures that second part alone; the rest of the
        second thread's cost is the release. So fork_join(n) = fork_join(1) + release + n - 1
        barrier steps. Without a barrier figure, the second thread's whole cost is extrapolated
        linearly (an upper bound). A shared 2-vCPU host gives noisy second-thread costs: each is
        the lowest of repeats."""
        one = self.fork_join_seconds[1]
        two = self.fork_join_seconds.get(2, one)
        second = max(two - one, 0.0)
        if not self.barrier_seconds or 2 not in self.barrier_seconds:
            return one + second * (max(team, 1) - 1)
        step = min(self.barrier_step(), second)
        return one + (second - step) * (team > 1) + step * (max(team, 1) - 1)

    def barrier_step(self) -> float:
        """What each thread beyond the first adds to a barrier (its turn at the shared counter)."""
        one = self.barrier_seconds.get(1, 0.0)
        return max(self.barrier_seconds.get(2, one) - one, 0.0)

    def barrier(self, team: int) -> float:
        """A barrier of a running team on `team` threads: measured at 1 and 2, extrapolated
        linearly (libgomp's barrier is the join's: every thread's decrement of one counter in
        turn, the last one's release), never above a fork/join."""
        if not self.barrier_seconds:
            return self.fork_join(team)
        return min(self.barrier_seconds[1] + self.barrier_step() * (max(team, 1) - 1), self.fork_join(team))

    def to_dict(self) -> dict:
        return {"ticks_per_second": self.ticks_per_second, "clock_pair_ns": self.clock_pair_seconds * 1e9,
                "fork_join_us": {str(k): v * 1e6 for k, v in self.fork_join_seconds.items()},
                "fork_join_slope_us_per_thread": (self.fork_join(2) - self.fork_join(1)) * 1e6,
                "barrier_us": {str(k): v * 1e6 for k, v in self.barrier_seconds.items()},
                "barrier_slope_us_per_thread": (self.barrier(2) - self.barrier(1)) * 1e6}


class Probes:
    """The probes of PROBE_IR compiled for `target`, each a Kernel (bench/chunk_claims.py times
    its fork/join probe beside another chunk protocol)."""

    def __init__(self, target):
        obj = compile_module(PROBE_IR, target)
        self.ticks = Kernel("tf_probe_ticks", obj, [ArgSpec("out", (1,), "int64")], target)
        self.pairs = Kernel("tf_probe_clock_pairs", obj, [ArgSpec("params", (1,), "int64", False),
                                                          ArgSpec("slots", (4096,), "int64")], target)
        # params: team, regions, iterations; the chunk counter a cache line on, as a kernel's
        self.forks = Kernel("tf_probe_forks", obj, [ArgSpec("params", (2 * COUNTER_STRIDE,), "int64"),
                                                    ArgSpec("out", (1,), "int64")], target)
        self.barriers = Kernel("tf_probe_barriers", obj, [ArgSpec("params", (3,), "int64", False),
                                                          ArgSpec("out", (1,), "int64")], target)


TEAM_BARRIERS_IR = """
declare void @GOMP_parallel(ptr, ptr, i32, i32)
declare void @GOMP_barrier()

""" + BARRIER_LOOP_IR + """
define i32 @tf_team_barriers(ptr noalias %params, ptr %record) {
entry:
  %team64 = load i64, ptr %params
  %team = trunc i64 %team64 to i32
  call void @GOMP_parallel(ptr @tf_probe_barrier_loop, ptr %params, i32 %team, i32 0)
  ret i32 0
}
"""


def team_barrier_kernel(target) -> Kernel:
    """A kernel of one parallel region of a team of params[0] threads passing params[1] barriers
    back to back: what a team's synchronisation costs, timed from outside like any kernel. No
    cycle counter (unlike the probes above, which the scaling model reads on x86): an Arm board's
    cycle counter is not readable from user space, and the measuring worker calibrates with this
    (device_agent/calibration.py) on every device."""
    obj = compile_module(TEAM_BARRIERS_IR, target)
    return Kernel("tf_team_barriers", obj, [ArgSpec("params", (2,), "int64", False)], target)


def ticks_per_second(probes: Probes, seconds: float = 0.05) -> float:
    out = np.zeros(1, np.int64)
    rates = []
    for _ in range(3):
        probes.ticks(out)
        t0, c0 = time.perf_counter(), int(out[0])
        while time.perf_counter() - t0 < seconds:
            pass
        probes.ticks(out)
        t1, c1 = time.perf_counter(), int(out[0])
        rates.append((c1 - c0) / (t1 - t0))
    return statistics.median(rates)


def clock_pair_ticks(probes: Probes) -> float:
    """Ticks one timed iteration's clock reads add: the median over 4096 empty iterations, the
    lowest of a few runs (a run a neighbour interrupted only adds)."""
    slots = np.zeros(4096, np.int64)
    best = float("inf")
    for _ in range(5):
        slots[:] = 0
        probes.pairs(np.array([4096], np.int64), slots)
        best = min(best, float(np.median(slots)))
    return best


def fork_join_ticks(probes: Probes, team: int, reps: int = 50, repeats: int = 200) -> float:
    """Ticks per empty region on `team` threads: the lowest of `repeats` runs of `reps` regions
    back to back (the pool warm, as between a model's kernels). The lowest, not the median: on
    a shared 2-core host a neighbour's busy thread makes the second thread of a team wait for its
    core (libgomp's barrier then waits a scheduler tick), which is contention, not the cost of
    the region; a run of few regions now and then finds the core free."""
    out = np.zeros(1, np.int64)
    params = np.zeros(2 * COUNTER_STRIDE, np.int64)
    params[:3] = team, reps, team * CHUNKS_PER_THREAD
    probes.forks(params, out)   # warm-up: the team exists
    runs = []
    for _ in range(repeats):
        probes.forks(params, out)
        runs.append(int(out[0]) / reps)
    return min(runs)


def barrier_ticks(probes: Probes, team: int, fork_join: float, reps: int = 100, repeats: int = 100) -> float:
    """Ticks per barrier of a running team on `team` threads: one region of `reps` barriers, its
    fork/join (`fork_join` ticks) taken off, the lowest of `repeats` runs (as fork_join_ticks)."""
    out = np.zeros(1, np.int64)
    params = np.array([team, reps, 0], np.int64)
    probes.barriers(params, out)   # warm-up
    runs = []
    for _ in range(repeats):
        probes.barriers(params, out)
        runs.append(max(int(out[0]) - fork_join, 0.0) / reps)
    return min(runs)


def measure_parallel_costs(target=None, teams=(1, 2)) -> ParallelCosts:
    """Measure this machine's ticks rate, clock-read cost and fork/join at `teams` (those the
    host has threads for: a team larger than the cores would measure time-sharing)."""
    from .openmp import get_max_threads

    target = resolve_target(target)
    probes = Probes(target)
    rate = ticks_per_second(probes)
    cores = get_max_threads()
    fork_join = {t: fork_join_ticks(probes, t) / rate for t in teams if t <= max(cores, 1)}
    barrier = {t: barrier_ticks(probes, t, fork_join[t] * rate) / rate for t in fork_join}
    return ParallelCosts(rate, clock_pair_ticks(probes) / rate, fork_join, cores, barrier)


__all__ = ["ParallelCosts", "measure_parallel_costs", "team_barrier_kernel"]
