"""elementwise: an elementwise output: fused outer loops in parallel, the last axis split and
vectorized."""

from __future__ import annotations

from ..sampling import loop_outer
from .loops import LoopRule


class Elementwise(LoopRule):
    name = "elementwise"

    def applies(self, ctx, i: int) -> bool:
        return i not in ctx.inlinable and i not in ctx.consumer.values() and not ctx.dag.is_reduce(i)

    def apply(self, applier, i: int) -> None:
        if i in applier.inlined_into_copy:   # a producer that block_input copied through
            return
        st, p = applier.orig[i], applier.p(i)
        axes = list(st.op.axis)
        last = axes[-1]
        inner, f = p.get("inner", "none"), int(p.get("split", 1))
        outer = loop_outer(axes, self.reduction, inner, f)
        if inner == "vec" and last.extent > 1 and f > 1:
            outer, li = self.split_last(st, axes, f)
            st.vectorize(li)
        applier.parallel_prefix(st, outer, p.get("parallel", 0))
