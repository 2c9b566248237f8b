"""Predict a kernel's time on N threads from what one thread measures (issue 58).

A kernel is serial code and parallel regions (compiler/parallel_regions.py). From one thread we
know (compiler/kernel_scaling.py measures them): the kernel's time, each region's per-iteration
cost (a profiling build, compiler/region_clock.py) and how often it forks, and this machine's
fork/join cost (compiler/parallel_probe.py). On N threads:

- the serial part takes what it took (Amdahl);
- a region runs on team = min(N, team cap) threads and hands out the contiguous chunks the
  generated code makes for that team (about extent / (team · 4) iterations each); the
  dynamic schedule gives the next chunk to whichever thread comes free, so one entry takes the
  makespan of that greedy list schedule over the measured per-iteration costs (the ceil of the
  chunk count over the team, and uneven iterations, both show up here: a region of 3 chunks
  can never go more than 3x faster);
- each entry pays the fork/join of its team (ParallelCosts.fork_join: measured at 1 and 2
  threads, extrapolated as libgomp works); a region that a running team enters (the later loops
  of a team, compiler/parallel_teams.py) pays a barrier instead where it waits for the loops
  before it (ParallelCosts.barrier), nothing where it does not, and runs on its team's threads,
  in the chunks its own cap makes;
- a region whose data cannot stay in its team's private caches (the bytes of the buffers it
  touches exceed team · the host's L2 per core) takes at least bytes / (team · per-core
  bandwidth): ManyCoreHost states that per-core bandwidth for the machine being predicted,
  since it cannot be measured on this one.

Every prediction also says where the time beyond the ideal T1/N goes (serial, fork/join, team
cap, chunks, bandwidth) and which region loses most, so a kernel that cannot scale says why.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from .parallel_regions import Region

THREADS = (4, 8, 16, 32, 64, 128)
LOSSES = ("serial", "fork/join", "team cap", "chunks", "bandwidth")   # fork/join: a team's barriers too


@dataclass(frozen=True)
class ManyCoreHost:
    """What the predicted machine is assumed to give each core (it is not this one).

    Defaults: a current two-socket-class server core with every core streaming gets about
    5 GB/s of DRAM bandwidth (8-12 DDR5 channels, 250-450 GB/s STREAM triad, shared by 56-96
    cores: Sapphire/Emerald Rapids, Genoa), and 2 MiB of private L2 (Sapphire/Emerald Rapids;
    Genoa has 1 MiB)."""

    gbps_per_core: float = 5.0
    l2_bytes_per_core: int = 2 << 20

    def to_dict(self) -> dict:
        return {"gbps_per_core": self.gbps_per_core, "l2_mib_per_core": self.l2_bytes_per_core / (1 << 20)}


@dataclass
class RegionTiming:
    """One region measured on one thread: seconds per iteration (summed over a call's entries)."""

    region: Region
    iteration_seconds: np.ndarray
    entries: int                  # forks per call, as counted by the profiling build
    span_seconds: float = 0.0     # its GOMP_parallel calls' time in one call (clock reads removed)

    @property
    def compute_seconds(self) -> float:
        return float(self.iteration_seconds.sum())


@dataclass
class KernelTiming:
    """A kernel measured on one thread: its (plain build's) time and its regions."""

    name: str
    seconds: float
    regions: list = field(default_factory=list)   # RegionTiming
    measured_serial: float | None = None   # the profiling build's call outside its regions (None: not measured)

    @property
    def serial_seconds(self) -> float:
        """The kernel's time outside its regions: measured in the profiling build's own calls,
        else the plain call's time less the regions' spans (never below zero: separate timings
        differ by the host's noise)."""
        if self.measured_serial is not None:
            return self.measured_serial
        return max(0.0, self.seconds - sum(r.span_seconds for r in self.regions))

    @property
    def one_thread_seconds(self) -> float:
        """The one-thread time predictions are compared with: the serial part and the spans of
        the same measurement (the plain call's time when the serial part was not measured)."""
        if self.measured_serial is None:
            return self.seconds
        return self.measured_serial + sum(r.span_seconds for r in self.regions)


@dataclass
class RegionPrediction:
    index: int
    team: int
    chunks: int                 # per entry
    seconds: float              # all entries, fork/join included
    losses: dict                # {loss: seconds over the ideal}

    def to_dict(self) -> dict:
        return {"index": self.index, "team": self.team, "chunks": self.chunks, "ms": self.seconds * 1e3,
                "losses_ms": {k: v * 1e3 for k, v in self.losses.items()}}


@dataclass
class Prediction:
    """A kernel's predicted time on `threads` threads and where it loses."""

    threads: int
    t1: float
    seconds: float
    regions: list               # RegionPrediction
    losses: dict                # {loss: seconds}, summed over regions and the serial part

    @property
    def speedup(self) -> float:
        return self.t1 / self.seconds if self.seconds > 0 else float(self.threads)

    @property
    def efficiency(self) -> float:
        return self.speedup / self.threads

    def limit(self) -> str:
        """The largest loss and, for a region's loss, the region: 'chunks (region 1)'."""
        if not self.losses or max(self.losses.values()) <= 0:
            return "-"
        kind = max(self.losses, key=lambda k: self.losses[k])
        if kind == "serial":
            return kind
        worst = max(self.regions, key=lambda r: r.losses.get(kind, 0.0))
        return f"{kind} (region {worst.index}: {worst.chunks} chunks on {worst.team})"


def makespan(costs: np.ndarray, chunks: list, team: int) -> float:
    """Time until the last of `chunks` ([(first, end)] over per-iteration `costs`) is done when
    `team` threads each take the next chunk as they come free (the generated code's dynamic schedule)."""
    if not chunks:
        return 0.0
    prefix = np.concatenate(([0.0], np.cumsum(costs)))
    free = [0.0] * min(team, len(chunks))
    for lo, hi in chunks:
        t = heapq.heappop(free)
        heapq.heappush(free, t + float(prefix[hi] - prefix[lo]))
    return max(free)


def predict_region(rt: RegionTiming, threads: int, fork_join, host: ManyCoreHost, barrier=None) -> RegionPrediction:
    """One region on `threads` threads; `fork_join(team)` gives seconds per fork, `barrier(team)`
    per barrier (fork_join's when None)."""
    r = rt.region
    team = r.team(threads)
    chunks = r.chunks(threads)
    entries = max(rt.entries, 1)
    per_entry = rt.iteration_seconds / entries
    compute = rt.compute_seconds
    worked = entries * makespan(per_entry, chunks, team)
    bound = 0.0
    if r.bytes > team * host.l2_bytes_per_core:
        bound = r.bytes / (team * host.gbps_per_core * 1e9)
    if r.forks:
        forks = entries * fork_join(team)
    else:   # a team's later region: a barrier where it waits (at fork/join's cost without a figure)
        forks = entries * ((fork_join if barrier is None else barrier)(team) if r.waits else 0.0)
    seconds = max(worked, bound) + forks
    losses = {"fork/join": forks, "team cap": compute / team - compute / threads,
              "chunks": worked - compute / team, "bandwidth": max(0.0, bound - worked)}
    return RegionPrediction(r.index, team, len(chunks), seconds, losses)


def predict(kt: KernelTiming, threads: int, fork_join, host: ManyCoreHost = ManyCoreHost(),
            barrier=None) -> Prediction:
    """The kernel on `threads` threads (see the module docstring); `barrier(team)`: seconds per
    barrier (fork_join's when None)."""
    regions = [predict_region(rt, threads, fork_join, host, barrier) for rt in kt.regions]
    serial = kt.serial_seconds
    losses = {k: 0.0 for k in LOSSES}
    losses["serial"] = serial - serial / threads
    for rp in regions:
        for k, v in rp.losses.items():
            losses[k] += v
    return Prediction(threads, kt.one_thread_seconds, serial + sum(rp.seconds for rp in regions), regions, losses)


def combined_speedup(predictions: list) -> float:
    """Speed-up of kernels run one after another (a model): the sum of their one-thread times
    over the sum of their predicted times, so each kernel weighs by its time."""
    t1 = sum(p.t1 for p in predictions)
    tn = sum(p.seconds for p in predictions)
    return t1 / tn if tn > 0 else 0.0


__all__ = ["ManyCoreHost", "RegionTiming", "KernelTiming", "Prediction", "RegionPrediction", "makespan",
           "predict", "predict_region", "combined_speedup", "THREADS", "LOSSES"]
