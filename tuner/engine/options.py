"""TuningOptions: what a tuning run does, stated once with its defaults.

`tune()`, `tune_tasks()`, `tune_model()` and `TaskTuner` take one value of it (and, for
convenience, keyword overrides of its fields: `tune(task, store, trials=32)` is
`tune(task, store, TuningOptions(trials=32))`), so a default changes in one place and every
entry point validates the same way. Each field is an `option` (compiler.option_fields): its help
and bounds make the command line's flags and the REST API's request fields (tuner.option_forms).
What a run is measured with (the builder pool, the runner and its MeasureOptions) and who listens
(callbacks) are objects passed beside it, not options.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from compiler.option_fields import check_options, option

SPACES = ("sketch", "template")
STRATEGY_NAMES = ("random", "grid", "genetic", "model", "evolutionary")   # tuner.search.STRATEGIES' keys
SCHEDULERS = ("gradient", "round-robin")


@dataclass(frozen=True)
class TuningOptions:
    space: str = option("sketch", "search space: from the compute alone (sketch) or the operator's knobs (template)",
                        choices=SPACES)
    strategy: str | None = option(None, "search strategy (default: evolutionary for sketches, model for templates)",
                                  choices=STRATEGY_NAMES)
    scheduler: str = option("gradient", "how several tasks share the budget: gradient (Ansor's rule) or round-robin",
                            choices=SCHEDULERS)
    # None: no limit of its own (a scheduler's task, which the scheduler's budget ends)
    trials: int | None = option(64, "new measurements (earlier records are reused, never measured again)", ge=0)
    seconds: float | None = option(None, "time budget in seconds", gt=0)
    batch_size: int = option(8, "candidates built and measured per round", ge=1, flag="--batch")
    seed: int = option(0, "seed of the search (task i of several searches with seed + i)", ge=0)
    early_stopping: int | None = option(None, "stop a task after this many trials without a better one", ge=0)
    top_k: int = option(5, "candidates re-measured with the default schedule at the end of each task", ge=0)
    retime_rounds: int = option(3, "rounds of that re-measurement", ge=0)
    baseline: bool = option(True, "measure the default schedule first")
    starting_points: bool = option(True, "a guided search starts from the default's neighbours")
    job_id: int | None = option(None, "the service job the records belong to", ge=0)

    def __post_init__(self):
        check_options(self)


FIELDS = frozenset(f.name for f in fields(TuningOptions))


def tuning_options(options: TuningOptions | None, overrides: dict) -> TuningOptions:
    """`options` (default: TuningOptions()) with `overrides` of its fields; TypeError naming an
    override that is no field (a misspelt keyword must not be ignored)."""
    unknown = set(overrides) - FIELDS
    if unknown:
        raise TypeError(f"unknown tuning option(s) {', '.join(sorted(unknown))}; TuningOptions has {', '.join(sorted(FIELDS))}")
    base = options if options is not None else TuningOptions()
    return replace(base, **overrides) if overrides else base


__all__ = ["TuningOptions", "tuning_options", "SPACES", "STRATEGY_NAMES", "SCHEDULERS"]
