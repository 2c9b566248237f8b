"""TuningOptions: what a tuning run does, stated once with its defaults.

`tune()`, `tune_tasks()`, `tune_model()` and `TaskTuner` take one value of it (and, for
convenience, keyword overrides of its fields: `tune(task, store, trials=32)` is
`tune(task, store, TuningOptions(trials=32))`), so a default changes in one place and every
entry point validates the same way. What a run is measured with (the builder pool, the runner
and its MeasureOptions) and who listens (callbacks) are objects passed beside it, not options.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class TuningOptions:
    space: str = "sketch"              # "sketch" (from the compute) or "template" (AutoTVM-style knobs)
    strategy: str | None = None        # None: the space's default (engine.DEFAULT_STRATEGY)
    trials: int | None = 64            # new measurements; None: no limit of its own (a scheduler's task)
    seconds: float | None = None       # wall-time budget
    batch_size: int = 8                # candidates built and measured together
    seed: int = 0
    early_stopping: int | None = None  # stop after this many trials without a better one (0, None: never)
    top_k: int = 5                     # candidates re-timed against the default at the end
    retime_rounds: int = 3
    baseline: bool = True              # measure the default schedule first
    starting_points: bool = True       # a guided search starts from the default's neighbours
    job_id: int | None = None          # the service job the records belong to

    def __post_init__(self):
        if self.trials is not None and self.trials < 0:
            raise ValueError(f"trials must be >= 0, got {self.trials}")
        if self.batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {self.batch_size}")
        if self.top_k < 0 or self.retime_rounds < 0:
            raise ValueError("top_k and retime_rounds must be >= 0")


FIELDS = frozenset(f.name for f in fields(TuningOptions))


def tuning_options(options: TuningOptions | None, overrides: dict) -> TuningOptions:
    """`options` (default: TuningOptions()) with `overrides` of its fields; TypeError naming an
    override that is no field (a misspelt keyword must not be ignored)."""
    unknown = set(overrides) - FIELDS
    if unknown:
        raise TypeError(f"unknown tuning option(s) {', '.join(sorted(unknown))}; TuningOptions has {', '.join(sorted(FIELDS))}")
    base = options if options is not None else TuningOptions()
    return replace(base, **overrides) if overrides else base


__all__ = ["TuningOptions", "tuning_options"]
