"""The tuning engine: one `TaskTuner` per task, a `TaskScheduler` over several.

    tuner = TaskTuner(task, store, TuningOptions(trials=64), builder=builder, runner=runner)
    while tuner.step() is not None:      # one measured batch per step
        ...
    result = tuner.finish()              # re-measure the top candidates, store those times

A job worker, the CLI and model tuning all drive these objects; `tuner.tune.tune()` is the
one-task convenience wrapper.
"""

from .callbacks import BatchReport, Callbacks
from .options import TuningOptions, tuning_options
from .result import TuneResult
from .scheduler import SCHEDULERS, SchedulerResult, TaskScheduler
from .task_tuner import DEFAULT_STRATEGY, MODEL_GUIDED, TaskTuner, make_space, make_strategy

__all__ = ["TuningOptions", "tuning_options", "TaskTuner", "TaskScheduler", "SchedulerResult", "TuneResult", "BatchReport", "Callbacks",
           "SCHEDULERS", "DEFAULT_STRATEGY", "MODEL_GUIDED", "make_space", "make_strategy"]
