"""Tuning a whole model: its unique fused workloads as tasks under one trial budget.

Shared by `tunefarm model tune` and the job worker's model jobs, so both mean the same thing:

- `model_tasks(graph, target, device_key)`: every unique fused workload of the compiled graph
  (compiler.graph.extract_tasks, for that target: weight layouts, and so keys, depend on it) as a
  tuning Task whose Workload comes from the fused compute itself (`Workload.from_compute`), so the
  records land under the very key `build_model` asks apply-best for; the weight is how many
  times the model runs it.
- `LatencyEstimate`: the model's estimated end-to-end latency, Σ weight × best latency of each
  task, followed batch by batch (a curve of (trials, seconds)); the sum of kernel timings, not a
  timing of the whole model, and called an estimate wherever it is shown.
- `tune_model(...)`: the gradient task scheduler over those tasks, sharing one cost model
  (tuner.tune.tune_tasks), with the estimate attached; returns per-task bests, the scheduler's
  allocation of trials, the curve, and the final (re-measured) estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from compiler.measure_options import MeasureOptions
from compiler.ops import OpDef

from .engine import Callbacks, SchedulerResult, TuningOptions, tuning_options
from .workload import Task, Workload


class ModelTuningError(ValueError):
    """A model whose workloads cannot be tuning tasks (e.g. a workload that does not survive its
    JSON round trip with the same key, which would leave its records unused)."""


@dataclass(frozen=True)
class ModelTuningTask:
    """One unique fused workload of a model as a tuning task."""

    task: Task
    opdef: OpDef         # the fused compute
    weight: int          # occurrences in the model

    @property
    def name(self) -> str:
        return self.opdef.name

    @property
    def key(self) -> str:
        return self.opdef.workload_key()

    @property
    def flops(self) -> int:
        return self.opdef.flops

    def shapes(self) -> str:
        ins = ", ".join("x".join(map(str, t.shape)) for t in self.opdef.inputs)
        return f"{ins} -> {'x'.join(map(str, self.opdef.output.shape))}"


def model_tasks(graph, target, device_key: str = "local") -> list[ModelTuningTask]:
    """The model's tuning tasks, in order of first occurrence. GraphError for a graph the compiler
    cannot lower; ModelTuningError when a workload's key would not come back from its data."""
    from compiler.graph import extract_tasks
    from compiler.target import resolve_target

    target = resolve_target(target)
    out = []
    for mt in extract_tasks(graph, target):
        workload = Workload.from_compute(mt.opdef)
        if workload.key != mt.key:
            raise ModelTuningError(f"workload {mt.opdef.name}: its definition as data has key {workload.key[:12]}, "
                                   f"the model's kernel {mt.key[:12]}; records tuned for it would never be used")
        out.append(ModelTuningTask(Task(workload, str(target), device_key), mt.opdef, mt.weight))
    return out


@dataclass
class LatencyEstimate:
    """Σ weight × best latency over a model's tasks, followed as batches are measured.

    Feed it every BatchReport (`observe`) and the scheduler's heartbeats (`observe_engine`: the
    tasks whose best came from earlier records report no batch). `curve` holds (search trials of
    this run, estimate in seconds), a point each time the estimate changes once every task has a
    valid time; the re-measurement at the end of a run adds the final point (`finish`)."""

    weights: dict                                   # Task -> weight
    best: dict = field(default_factory=dict)        # Task -> best cost (s) so far
    trials: dict = field(default_factory=dict)      # Task -> search trials of this run
    curve: list = field(default_factory=list)       # [(trials, seconds)]

    @classmethod
    def of(cls, tasks: list[ModelTuningTask] | list[tuple]) -> "LatencyEstimate":
        pairs = [(t.task, t.weight) if isinstance(t, ModelTuningTask) else t for t in tasks]
        return cls({task: float(w) for task, w in pairs}, {task: math.inf for task, _ in pairs},
                   {task: 0 for task, _ in pairs})

    @property
    def seconds(self) -> float:
        """The estimate now (inf while some task has no valid time)."""
        return sum(w * self.best[t] for t, w in self.weights.items())

    @property
    def total_trials(self) -> int:
        return sum(self.trials.values())

    def observe(self, report) -> bool:
        """Take one measured batch; True when the estimate changed (a new curve point)."""
        if report.task not in self.weights:
            return False
        if report.kind == "search":
            self.trials[report.task] += len(report.candidates)
        if report.kind == "retime":   # re-measured figures replace the bests in finish()
            return False
        self.best[report.task] = report.result.best_cost
        return self._point()

    def observe_engine(self, engine) -> bool:
        """Take a heartbeat's engine: a TaskScheduler gives every task's best at once."""
        tuners = getattr(engine, "tuners", None)
        if not tuners:
            return False
        for t in tuners:
            if t.task in self.weights:
                self.best[t.task] = t.result.best_cost
        return self._point()

    def finish(self, results: list) -> bool:
        """The re-measured bests (TuneResults, one per task) as the last point."""
        for r in results:
            if r.task in self.weights and math.isfinite(r.best_cost):
                self.best[r.task] = r.best_cost
        return self._point(force=True)

    def _point(self, force: bool = False) -> bool:
        est = self.seconds
        if not math.isfinite(est):
            return False
        if self.curve and not force and math.isclose(self.curve[-1][1], est, rel_tol=1e-12):
            return False
        self.curve.append((self.total_trials, est))
        return True


@dataclass
class ModelTuneResult:
    tasks: list                 # ModelTuningTask, in the order given
    scheduled: SchedulerResult
    estimate: LatencyEstimate

    @property
    def results(self) -> list:
        return self.scheduled.results

    @property
    def estimated_seconds(self) -> float:
        """The final estimate, from the re-measured bests (inf when a task has no valid time)."""
        return sum(t.weight * r.best_cost for t, r in zip(self.tasks, self.results))

    @property
    def default_seconds(self) -> float:
        """The same sum over the default schedules (re-measured beside the bests)."""
        return sum(t.weight * r.baseline_cost for t, r in zip(self.tasks, self.results))

    def allocation(self) -> list[int]:
        """New search trials each task got from the scheduler, in task order."""
        return [r.trials for r in self.results]


def estimate_callbacks(estimate: LatencyEstimate, on_estimate=None) -> Callbacks:
    """Callbacks that keep `estimate` current and call `on_estimate(estimate)` on every change."""
    def changed(moved: bool):
        if moved and on_estimate is not None:
            on_estimate(estimate)
    return Callbacks(on_batch=lambda report: changed(estimate.observe(report)),
                     on_heartbeat=lambda engine: changed(estimate.observe_engine(engine)))


def tune_model(tasks: list[ModelTuningTask], store, options: TuningOptions | None = None, *,
               builder=None, runner=None, callbacks: Callbacks | None = None,
               measure: MeasureOptions | None = None,
               on_estimate=None, **overrides) -> ModelTuneResult:
    """Tune the model's tasks under one budget of `options.trials` new measurements (the gradient
    task scheduler by default, one shared cost model); every measurement goes to `store`.
    `options`: TuningOptions, or keyword overrides of its fields, and `measure`, as tune_tasks
    takes them. `on_estimate(LatencyEstimate)` is called whenever the estimated latency changes, and once more
    with the re-measured figures at the end."""
    from .tune import tune_tasks

    if not tasks:
        raise ModelTuningError("the model has no workloads to tune (every output is a constant or an input)")
    estimate = LatencyEstimate.of(tasks)
    hooks = estimate_callbacks(estimate, on_estimate)
    if callbacks is not None:
        hooks.extra.append(callbacks)
    out = tune_tasks([t.task for t in tasks], store, tuning_options(options, overrides),
                     weights=[t.weight for t in tasks], builder=builder, runner=runner, measure=measure,
                     callbacks=hooks)
    if not out.stopped and estimate.finish(out.results) and on_estimate is not None:
        on_estimate(estimate)
    return ModelTuneResult(list(tasks), out, estimate)


__all__ = ["ModelTuningTask", "ModelTuningError", "LatencyEstimate", "ModelTuneResult", "model_tasks",
           "tune_model", "estimate_callbacks"]
