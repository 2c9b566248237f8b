"""What the loop-nest rules (reduce, elementwise, root) share: the last axis vectorized,
unrolled or left to LLVM, and a prefix of outer loops fused and run in parallel."""

from __future__ import annotations

from ..sampling import loop_outer, pick, vector_sizes
from .base import StageRule
from .tiling import AUTO_UNROLL_STEPS

MAX_INNER = 16            # the longest unrolled inner loop


class LoopRule(StageRule):
    """Parameters: `inner` (one of `inner_choices`), `split` (its length), `parallel` (how many
    of the outer loops are fused and run in parallel)."""

    reduction = False     # the stage's reduction loops sit between its outer loops and the inner one

    def sample_inner(self, rng) -> str:
        return "vec" if rng.random() < 0.8 else "none"

    def sample(self, space, sketch, i: int, rng) -> dict:
        op = space.dag.op(i)
        last = op.axis[-1].extent
        inner = self.sample_inner(rng)
        if inner == "vec":
            split = pick(rng, vector_sizes(last, space.lanes(i)))
        elif inner == "unroll":
            split = pick(rng, [f for f in (2, 4, 8, 16) if f < last] + ([last] if last <= MAX_INNER else []) or [1])
        else:
            split = 1
        outer = [ax.extent for ax in loop_outer(op.axis, self.reduction, inner, split)]
        p = {"inner": inner, "split": split, "parallel": space.sample_parallel(outer, rng)}
        if self.reduction:
            p["auto_unroll"] = pick(rng, AUTO_UNROLL_STEPS)
        return p

    @staticmethod
    def split_last(st, axes: list, f: int) -> tuple:
        """(the outer loops, the inner loop) of the last axis split by `f` (whole when it is no
        longer than f): what a reduce or elementwise stage vectorizes or unrolls."""
        outer, last = list(axes[:-1]), axes[-1]
        if f < last.extent:
            lo, li = st.split(last, factor=f)
            return outer + [lo], li
        return outer, last
