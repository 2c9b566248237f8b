"""inline: an elementwise stage that is not the output is substituted into its readers (applied
before every other rule, so the rules see the DAG as it will be lowered)."""

from __future__ import annotations

from .base import StageRule


class Inline(StageRule):
    name = "inline"
    applied_first = True

    def applies(self, ctx, i: int) -> bool:
        return i in ctx.inlinable

    def apply(self, applier, i: int) -> None:
        applier.orig[i].compute_inline()
