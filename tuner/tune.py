"""Tuning as one call: `tune()` for a task, `tune_tasks()` for several under one budget.

Both are thin wrappers of the engine (`tuner.engine`): they own a builder pool and a local
runner unless given them, and return what the engine returns.
"""

from __future__ import annotations

from contextlib import ExitStack

from .cost_model import XGBCostModel
from .engine import (
    DEFAULT_STRATEGY,
    MODEL_GUIDED,
    Callbacks,
    SchedulerResult,
    TaskScheduler,
    TaskTuner,
    TuneResult,
    make_space,
    make_strategy,
)
from .engine.scheduler import check_arguments
from .engine.task_tuner import warm_cost_model
from .workload import Task


def tune(task: Task, store, space: str = "sketch", strategy: str | None = None, trials: int = 64,
         seconds: float | None = None, batch_size: int = 8, seed: int = 0, builder=None, runner=None,
         early_stopping: int | None = None, on_batch=None, job_id: int | None = None, top_k: int = 5,
         retime_rounds: int = 3, baseline: bool = True, callbacks: Callbacks | None = None,
         starting_points: bool = True) -> TuneResult:
    """Tune `task` for `trials` new measurements (or `seconds`); every measurement goes to `store`.

    `on_batch(BatchReport)` is called after every measured batch. `starting_points=False`: a
    guided strategy does not start from the space's default schedule (to study the search)."""
    callbacks = _with_on_batch(callbacks, on_batch)
    with ExitStack() as owned:
        builder, runner = _measuring(owned, builder, runner)
        tuner = TaskTuner(task, store, builder=builder, runner=runner, space=space, strategy=strategy,
                          trials=trials, seconds=seconds, batch_size=batch_size, seed=seed,
                          early_stopping=early_stopping, job_id=job_id, top_k=top_k,
                          retime_rounds=retime_rounds, baseline=baseline, callbacks=callbacks,
                          starting_points=starting_points)
        while tuner.step() is not None:
            pass
        return tuner.finish()


def tune_tasks(tasks: list, store, weights=None, scheduler: str = "gradient", space: str = "sketch",
               strategy: str | None = None, trials: int = 64, seconds: float | None = None,
               batch_size: int = 8, seed: int = 0, builder=None, runner=None, job_id: int | None = None,
               top_k: int = 5, retime_rounds: int = 3, baseline: bool = True, on_batch=None,
               callbacks: Callbacks | None = None) -> SchedulerResult:
    """Tune several tasks under one budget of `trials` new measurements, sharing one cost model
    (rows grouped by workload, warm-started from other workloads' records); `scheduler` picks
    which task gets each batch. `baseline=False` skips the default schedules (the scheduler then
    starts from the first search batch of every task, as Ansor's does)."""
    if len(set(tasks)) != len(tasks):
        raise ValueError("the same task is listed twice; give it a larger weight instead")
    weights = check_arguments(len(tasks), weights, scheduler, trials)
    callbacks = _with_on_batch(callbacks, on_batch)
    with ExitStack() as owned:
        builder, runner = _measuring(owned, builder, runner)
        strategy_name = strategy or DEFAULT_STRATEGY[space]
        shared = XGBCostModel() if strategy_name in MODEL_GUIDED else None
        share = -(-trials // len(tasks))   # each task's share of the budget: its search effort (search_effort)
        tuners = [TaskTuner(task, store, builder=builder, runner=runner, space=space, strategy=strategy_name,
                            trials=None, batch_size=batch_size, seed=seed + i, cost_model=shared, job_id=job_id,
                            top_k=top_k, retime_rounds=retime_rounds, baseline=baseline, callbacks=callbacks,
                            expected_trials=share)
                  for i, task in enumerate(tasks)]
        if shared is not None:
            warm_cost_model(store, tuners[0].task.target, {t.workload_key for t in tuners},
                            [t.space for t in tuners], model=shared, emulated=tuners[0].emulated)
        used = store.count(job_id=job_id, search_only=True) if job_id is not None else 0
        sched = TaskScheduler(tuners, weights, scheduler=scheduler, trials=trials, seconds=seconds, seed=seed,
                              callbacks=callbacks, used_trials=used)
        return sched.run()


def _measuring(owned: ExitStack, builder, runner):
    from .measure import BuilderPool, LocalRunner
    if builder is None:
        builder = owned.enter_context(BuilderPool())
    if runner is None:
        runner = owned.enter_context(LocalRunner())
    return builder, runner


def _with_on_batch(callbacks: Callbacks | None, on_batch) -> Callbacks:
    if on_batch is None:
        return callbacks or Callbacks()
    extra = [callbacks] if callbacks is not None else []
    return Callbacks(on_batch=on_batch, extra=extra)


__all__ = ["tune", "tune_tasks", "TuneResult", "SchedulerResult", "make_space", "make_strategy",
           "DEFAULT_STRATEGY", "MODEL_GUIDED"]
