"""The tuning loop: ask the strategy, build in parallel, measure, record, tell.

Records are the source of truth: a run started again on the same task and database reloads
the fingerprints already measured (none is measured twice), counts them against the trial
budget, and seeds the strategy with their results. The cost model is warm-started from the
records of other workloads on the same target.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .candidate import MeasureResult
from .search import STRATEGIES, Budget, EarlyStopping
from .space import SearchSpace
from .workload import Task

DEFAULT_STRATEGY = {"template": "model", "sketch": "evolutionary"}
MODEL_GUIDED = ("model", "evolutionary")


def make_space(kind: str, opdef, target) -> SearchSpace:
    if kind == "template":
        from .space.template import TemplateSpace
        return TemplateSpace(opdef, None, target)
    if kind == "sketch":
        from .space.sketch import SketchSpace
        return SketchSpace(opdef, target)
    raise ValueError(f"unknown space {kind!r}; use 'template' or 'sketch'")


def make_strategy(name: str, space, opdef, target, seed: int, visited, cost_model=None):
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}")
    cls = STRATEGIES[name]
    if name in MODEL_GUIDED:
        # Search effort per batch sized so ranking costs a fraction of measuring the batch
        # (a few hundred feature extractions, ~1 ms each) rather than dominating the run.
        effort = {"model": dict(n_parallel=16, sa_iters=12),
                  "evolutionary": dict(population_size=64, num_generations=2)}[name]
        return cls(space, opdef=opdef, target=target, cost_model=cost_model, rng=seed, visited=visited,
                   **effort)
    return cls(space, rng=seed, visited=visited)


@dataclass
class TuneResult:
    task: Task
    trials: int = 0                 # measured by this run
    resumed_trials: int = 0         # already in the records when it started
    errors: int = 0
    best_cost: float = float("inf")
    best_candidate: object = None
    flops: int = 0
    tune_seconds: float = 0.0
    tuner_seconds: float = 0.0      # strategy + cost model time (ask/tell), not build or run
    history: list = field(default_factory=list)  # (trial index, cost or inf) in measuring order

    @property
    def best_gflops(self) -> float:
        return self.flops / self.best_cost / 1e9 if self.best_cost < float("inf") else 0.0

    @property
    def tuner_overhead_fraction(self) -> float:
        return self.tuner_seconds / self.tune_seconds if self.tune_seconds else 0.0


def tune(task: Task, store, space: str = "sketch", strategy: str | None = None, trials: int = 64,
         seconds: float | None = None, batch_size: int = 8, seed: int = 0, builder=None, runner=None,
         early_stopping: int | None = None, on_batch=None, job_id: int | None = None) -> TuneResult:
    """Tune `task` until the trial or time budget is spent; every measurement goes to `store`."""
    from compiler.target import resolve_target

    from .measure import BuilderPool, LocalRunner

    t_start = time.perf_counter()
    opdef = task.workload.opdef()
    target = resolve_target(task.target)
    strategy_name = strategy or DEFAULT_STRATEGY[space]
    the_space = make_space(space, opdef, target)
    prior = [r for r in store.history(workload_key=opdef.workload_key(), target=task.target)]
    # earlier runs in this kind of space count against the budget; another space's do not
    relevant = [r for r in prior if r.candidate.kind == the_space.kind]
    t0 = time.perf_counter()
    cost_model = _warm_cost_model(store, task, target, the_space) if strategy_name in MODEL_GUIDED else None
    strat = make_strategy(strategy_name, the_space, opdef, target, seed,
                          visited={r.candidate.fingerprint for r in prior}, cost_model=cost_model)
    result = TuneResult(task, resumed_trials=len(relevant), flops=opdef.flops)
    if relevant:
        strat.update([r.candidate for r in relevant], [r.result for r in relevant])
    result.tuner_seconds += time.perf_counter() - t0
    for r in prior:
        if r.result.ok and r.result.mean_cost < result.best_cost:
            result.best_cost, result.best_candidate = r.result.mean_cost, r.candidate
    budget = Budget(trials, seconds, used_trials=len(relevant)).start()
    stopper = EarlyStopping(early_stopping) if early_stopping else None
    own_builder, own_runner = builder is None, runner is None
    builder = builder or BuilderPool()
    runner = runner or LocalRunner()
    try:
        while strat.has_next():
            n = budget.take(batch_size)
            if n <= 0:
                break
            t0 = time.perf_counter()
            batch = strat.next_batch(n)
            result.tuner_seconds += time.perf_counter() - t0
            if not batch:
                break
            builds = builder.build(task, batch)
            results = runner.run(task, builds)
            store.add_records(task, list(zip(batch, results)), job_id=job_id)
            t0 = time.perf_counter()
            strat.update(batch, results)
            result.tuner_seconds += time.perf_counter() - t0
            budget.consume(len(batch))
            _account(result, batch, results)
            if on_batch is not None:
                on_batch(result)
            if stopper is not None and stopper.update(results):
                break
    finally:
        if own_builder:
            builder.close()
        if own_runner:
            runner.close()
    result.tune_seconds = time.perf_counter() - t_start
    return result


def _account(result: TuneResult, batch, results: list[MeasureResult]):
    for cand, res in zip(batch, results):
        result.trials += 1
        if not res.ok:
            result.errors += 1
        elif res.mean_cost < result.best_cost:
            result.best_cost, result.best_candidate = res.mean_cost, cand
        result.history.append((result.resumed_trials + result.trials, res.mean_cost))


def _warm_cost_model(store, task: Task, target, space: SearchSpace, limit: int = 2000):
    """A cost model pre-trained on other workloads' records for this target whose candidates
    have the structure of `space` (same template or sketches); None if there are none."""
    from .cost_model import XGBCostModel, throughputs_from_results
    from .features import features_for
    from .space import SpaceError

    others = [r for r in store.history(target=task.target, limit=limit)
              if r.workload_key != task.workload.opdef().workload_key() and space.same_structure(r.candidate)]
    if not others:
        return None
    feats, thr, groups = [], [], []
    by_key: dict = {}
    for r in others:
        by_key.setdefault(r.workload_key, []).append(r)
    for key, recs in by_key.items():
        try:
            opdef = recs[0].workload.opdef()
        except Exception:  # noqa: BLE001 - a custom workload not registered here: skip it
            continue
        try:
            X = features_for(opdef, [r.candidate for r in recs], target)
        except SpaceError:
            continue
        feats.append(X)
        thr.append(throughputs_from_results([r.result for r in recs], opdef.flops))
        groups.extend([key] * len(recs))
    if not feats:
        return None
    import numpy as np
    model = XGBCostModel()
    model.warm_start(np.concatenate(feats), np.concatenate(thr), groups)
    return model
