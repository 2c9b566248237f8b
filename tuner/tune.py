"""Tuning as one call: `tune()` for a task, `tune_tasks()` for several under one budget.

Both are thin wrappers of the engine (`tuner.engine`): they own a builder pool and a local
runner unless given them, and return what the engine returns.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import replace

from compiler.measure_options import MeasureOptions

from .cost_model import XGBCostModel
from .engine import (
    DEFAULT_STRATEGY,
    MODEL_GUIDED,
    Callbacks,
    SchedulerResult,
    TaskScheduler,
    TaskTuner,
    TuneResult,
    TuningOptions,
    make_space,
    make_strategy,
    tuning_options,
)
from .engine.scheduler import check_arguments
from .engine.task_tuner import warm_cost_model
from .workload import Task


def tune(task: Task, store, options: TuningOptions | None = None, *, builder=None, runner=None, on_batch=None,
         callbacks: Callbacks | None = None, measure: MeasureOptions | None = None, **overrides) -> TuneResult:
    """Tune `task` for `options.trials` new measurements (or `options.seconds`); every measurement
    goes to `store`. `options`: TuningOptions, or keyword overrides of its fields
    (`tune(task, store, trials=32, space="template")`).

    `on_batch(BatchReport)` is called after every measured batch. `starting_points=False`: a
    guided strategy does not start from the space's default schedule (to study the search).
    `measure`: how the local runner made here times candidates (when no `runner` is given)."""
    opts = tuning_options(options, overrides)
    callbacks = _with_on_batch(callbacks, on_batch)
    with ExitStack() as owned:
        builder, runner = _measuring(owned, builder, runner, store, measure)
        tuner = TaskTuner(task, store, opts, builder=builder, runner=runner, callbacks=callbacks)
        try:
            while tuner.step() is not None:
                pass
            return tuner.finish()
        finally:
            tuner.release()   # (an interrupted run: its builds ahead end before the builder closes)


def tune_tasks(tasks: list, store, options: TuningOptions | None = None, *, weights=None,
               builder=None, runner=None, on_batch=None, callbacks: Callbacks | None = None,
               measure: MeasureOptions | None = None, **overrides) -> SchedulerResult:
    """Tune several tasks under one budget of `options.trials` new measurements, sharing one cost
    model (rows grouped by workload, warm-started from other workloads' records); `options.scheduler`
    picks which task gets each batch. `baseline=False` skips the default schedules (the scheduler
    then starts from the first search batch of every task, as Ansor's does). Task i searches with
    seed `seed + i`. `measure`: as tune() takes it."""
    opts = tuning_options(options, overrides)
    if len(set(tasks)) != len(tasks):
        raise ValueError("the same task is listed twice; give it a larger weight instead")
    if opts.trials is None:
        raise ValueError("tune_tasks needs a trial budget (trials); the scheduler shares it among the tasks")
    trials = opts.trials
    weights = check_arguments(len(tasks), weights, opts.scheduler, trials)
    callbacks = _with_on_batch(callbacks, on_batch)
    with ExitStack() as owned:
        builder, runner = _measuring(owned, builder, runner, store, measure)
        strategy_name = opts.strategy or DEFAULT_STRATEGY[opts.space]
        shared = XGBCostModel() if strategy_name in MODEL_GUIDED else None
        share = -(-trials // len(tasks))   # each task's share of the budget: its search effort (search_effort)
        per_task = replace(opts, strategy=strategy_name, trials=None, seconds=None)
        tuners = [TaskTuner(task, store, replace(per_task, seed=opts.seed + i), builder=builder, runner=runner,
                            cost_model=shared, callbacks=callbacks, expected_trials=share)
                  for i, task in enumerate(tasks)]
        if shared is not None:
            t0 = time.perf_counter()
            warm_cost_model(store, tuners[0].task.target, {t.workload_key for t in tuners},
                            [t.space for t in tuners], model=shared, emulated=tuners[0].emulated,
                            cache=tuners[0].model_cache)
            tuners[0].result.add_time("model", time.perf_counter() - t0)
        used = store.count(job_id=opts.job_id, search_only=True) if opts.job_id is not None else 0
        sched = TaskScheduler(tuners, weights, scheduler=opts.scheduler, trials=trials, seconds=opts.seconds, seed=opts.seed,
                              callbacks=callbacks, used_trials=used)
        return sched.run()


def _measuring(owned: ExitStack, builder, runner, store, measure: MeasureOptions | None):
    """The builder and runner given, else a builder pool and a local runner (timing with `measure`)
    whose calibrations are judged against this host's history in `store` (an SQL records store
    keeps it)."""
    from .measure import BuilderPool, LocalRunner
    from .measure.calibration import StoreSpeedHistory
    from .records import SQLRecordsStore
    if builder is None:
        builder = owned.enter_context(BuilderPool())
    if runner is None:
        history = StoreSpeedHistory(store) if isinstance(store, SQLRecordsStore) else None
        runner = owned.enter_context(LocalRunner(measure, history=history))
    return builder, runner


def _with_on_batch(callbacks: Callbacks | None, on_batch) -> Callbacks:
    if on_batch is None:
        return callbacks or Callbacks()
    extra = [callbacks] if callbacks is not None else []
    return Callbacks(on_batch=on_batch, extra=extra)


__all__ = ["tune", "tune_tasks", "TuneResult", "SchedulerResult", "make_space", "make_strategy",
           "DEFAULT_STRATEGY", "MODEL_GUIDED"]
