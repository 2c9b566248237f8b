"""reduce: a reduction without reuse (row sums, pooling, softmax's max): spatial loops outside,
reduction loops, the last spatial axis inside (vectorized or unrolled)."""

from __future__ import annotations

from ..sampling import loop_outer, pick
from .loops import LoopRule


class Reduce(LoopRule):
    name = "reduce"
    reduction = True

    def applies(self, ctx, i: int) -> bool:
        return ctx.dag.is_reduce(i) and i not in ctx.tiled and i not in ctx.consumer.values()

    def sample_inner(self, rng) -> str:
        return pick(rng, ["vec", "unroll", "none"])

    def apply(self, applier, i: int) -> None:
        st, p = applier.orig[i], applier.p(i)
        axes, red = list(st.op.axis), list(st.op.reduce_axis)
        last = axes[-1]
        inner, f = p.get("inner", "none"), int(p.get("split", 1))
        outer = loop_outer(axes, self.reduction, inner, f)
        if inner != "none" and last.extent > 1 and f > 1:
            outer, li = self.split_last(st, axes, f)
            st.reorder(*outer, *red, li)
            if inner == "vec":
                st.vectorize(li)
            else:
                st.unroll(li)
        applier.parallel_prefix(st, outer, p.get("parallel", 0))
        if p.get("auto_unroll"):
            st.auto_unroll(int(p["auto_unroll"]))
