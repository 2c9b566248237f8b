"""Algorithm rewrites: another compute DAG for the same values, chosen by a schedule step.

A schedule chooses how a stage's loops run; some speed-ups change what is computed instead, for
the same result: a 3x3 convolution by Winograd's minimal filtering (compiler/ops/winograd.py)
multiplies 2.25x less. TVM offers such an algorithm as a separate operator implementation that
is tuned as a task of its own; here it is one more step of a schedule (`Schedule.rewrite`), so
the tuner's space for the operator holds it beside the direct form's tiles, a record of it
replays like any other, and apply-best, models and the CLI need nothing new.

A rewrite is a function `(op, **params) -> Tensor` that returns the new output for a stage's
ComputeOp: a DAG over the same placeholders whose values equal the stage's at every point (up
to float rounding), or raises ScheduleError when it does not apply to `op`. The operator
modules register theirs (`register_rewrite`) when `compiler.ops` is imported, which every
definition a rewrite applies to was made by, so this module (the schedule's) imports none of them.
"""

from __future__ import annotations

from .errors import ScheduleError

_REWRITES: dict = {}


def register_rewrite(name: str, fn) -> None:
    """Make `fn(op, **params) -> Tensor` the rewrite called `name` (steps refer to it by name)."""
    if name in _REWRITES and _REWRITES[name] is not fn:
        raise ScheduleError(f"a rewrite named {name!r} is registered already")
    _REWRITES[name] = fn


def rewrite_function(name: str):
    """The rewrite registered as `name`; ScheduleError naming the known ones otherwise."""
    fn = _REWRITES.get(name)
    if fn is None:
        raise ScheduleError(f"unknown rewrite {name!r}; known: {', '.join(sorted(_REWRITES)) or 'none'}")
    return fn


__all__ = ["register_rewrite", "rewrite_function"]
