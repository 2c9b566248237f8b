"""What one task's tuning run found."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Where a run's time goes: loading records and the strategy, the default's one timing, waiting
# for the search's builds and timing them, picking batches (search), the cost model (its warm
# start, kept rows, retraining after each batch), storing records, and the end-of-run re-timing
# (its builds and timings). Builds that ran beside other work are not a phase of their own (their
# wall time is another phase's): `build_overlapped` says how long they took.
PHASES = ("setup", "baseline", "build", "measure", "search", "model", "records", "retime")


@dataclass
class TuneResult:
    task: object                    # Task
    trials: int = 0                 # new measurements of this run (the baseline not included)
    resumed_trials: int = 0         # records of this space already stored when the run started
    errors: int = 0
    best_cost: float = math.inf     # seconds; the re-measured cost once finish() ran
    best_candidate: object = None
    baseline_cost: float = math.inf  # the operator's default schedule (re-measured at the end)
    retimed: dict = field(default_factory=dict)  # fingerprint -> re-measured cost
    flops: int = 0
    tune_seconds: float = 0.0
    tuner_seconds: float = 0.0      # strategy + cost model time (ask/tell), not build or run
    stopped: bool = False           # ended by a stop request
    exhausted: bool = False         # the space (or early stopping) had nothing more to offer
    history: list = field(default_factory=list)  # (trial index, cost or inf) in measuring order
    phase_seconds: dict = field(default_factory=dict)   # where tune_seconds went: PHASES
    timings: int = 0                # valid timings of this run (baseline, search, re-timing)
    disturbed_timings: int = 0      # of them, disturbed by other processes even after retries
    build_overlapped: float = 0.0   # seconds of builds that ran beside other phases (not waited for)
    adopted: int = 0                # candidates not built: their loop program was measured (search.base)

    def add_time(self, phase: str, seconds: float) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; known: {', '.join(PHASES)}")
        self.phase_seconds[phase] = self.phase_seconds.get(phase, 0.0) + seconds

    def time_summary(self) -> str:
        """'setup 0.4 s, build 3.1 s, measure 9.8 s, ...': the phases in order, those that took
        time; then the builds that ran beside them and the candidates a measured twin served."""
        parts = [f"{'re-time' if p == 'retime' else p} {self.phase_seconds[p]:.1f} s" for p in PHASES
                 if self.phase_seconds.get(p)]
        if self.build_overlapped >= 0.05:
            parts.append(f"builds beside them {self.build_overlapped:.1f} s")
        if self.adopted:
            parts.append(f"{self.adopted} twin candidate{'s' if self.adopted != 1 else ''} not built")
        return ", ".join(parts)

    @property
    def disturbed_fraction(self) -> float:
        return self.disturbed_timings / self.timings if self.timings else 0.0

    @property
    def best_gflops(self) -> float:
        return self.flops / self.best_cost / 1e9 if math.isfinite(self.best_cost) else 0.0

    @property
    def baseline_gflops(self) -> float:
        return self.flops / self.baseline_cost / 1e9 if math.isfinite(self.baseline_cost) else 0.0

    @property
    def speedup_over_default(self) -> float:
        """Default schedule's time / best time (both re-measured together at the end when
        finish() ran); NaN when either is unknown."""
        if math.isfinite(self.best_cost) and math.isfinite(self.baseline_cost) and self.best_cost > 0:
            return self.baseline_cost / self.best_cost
        return math.nan

    @property
    def tuner_overhead_fraction(self) -> float:
        return self.tuner_seconds / self.tune_seconds if self.tune_seconds else 0.0
