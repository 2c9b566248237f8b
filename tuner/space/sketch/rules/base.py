"""What a sketch rule is: when it applies to a stage, what it adds to a sketch, how its
parameters are sampled and how it is applied.

A rule is an object of a `StageRule` class, one module each in this package (MetaSchedule's
`schedule_rule/` in kind): the sketch generator asks every rule which stages it applies to,
a sketch holds the rule chosen for each stage, the space asks that rule for the stage's
parameters and the applier asks it to schedule the stage. A rule's name is its text in sketch
ids (`stage:rule`, kept in the records' candidates), and it is said nowhere else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..dag import SketchDag


@dataclass
class SketchContext:
    """What the generator knows of a DAG when it asks the rules: the stages that may be inlined,
    those tiled (reductions with reuse), each tiled stage's fused consumer, and the producers of
    tiled stages (they take one choice together: inlined, or materialized at the root)."""

    dag: SketchDag
    target: object
    inlinable: set = field(default_factory=set)
    tiled: list = field(default_factory=list)
    consumer: dict = field(default_factory=dict)   # tiled stage -> fused consumer stage
    feeding: list = field(default_factory=list)


class StageRule:
    """One way to schedule one stage. Subclasses set `name` and answer `applies`; `sample` and
    `apply` default to nothing to sample and nothing to do."""

    name = ""
    tiled = False         # a multi-level tiling: its stage's parameters hold a "tile"
    applied_first = False  # applied in a first pass over every stage (inlining), before the rest

    def applies(self, ctx: SketchContext, i: int) -> bool:
        raise NotImplementedError

    def variants(self, ctx: SketchContext, i: int) -> list:
        """The sketch choices this rule offers stage i, as (rule, vector axis or None) pairs."""
        return [(self, None)] if self.applies(ctx, i) else []

    def label(self, vec: int | None) -> str:
        """The rule's text in a sketch id."""
        return self.name if vec is None else f"{self.name}@{vec}"

    def sample(self, space, sketch, i: int, rng) -> dict | None:
        """Random parameters of stage i under this rule (None: it has none)."""
        return None

    def apply(self, applier, i: int) -> None:
        """Schedule stage i (applier: sketch.apply.SketchApplier) with its parameters."""

    def __repr__(self) -> str:
        return f"<rule {self.name}>"


def little_parallelism(op, target) -> bool:
    """A reduction with a long innermost reduction axis and few output elements for the cores."""
    lanes = target.vector_lanes(op.dtype)
    spatial = math.prod(ax.extent for ax in op.axis)
    return op.reduce_axis[-1].extent >= lanes and spatial <= 4 * lanes * target.num_cores
