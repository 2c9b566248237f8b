"""rfactor: for a reduction with little spatial parallelism (a long innermost reduction axis,
few output elements for the cores), the innermost reduction split and its inner part factored
out as a vector of partial results."""

from __future__ import annotations

import math

from ..sampling import pick, vector_sizes
from .base import little_parallelism
from .reduce import Reduce


class RFactor(Reduce):
    name = "rfactor"

    def applies(self, ctx, i: int) -> bool:
        return super().applies(ctx, i) and little_parallelism(ctx.dag.op(i), ctx.target)

    def sample(self, space, sketch, i: int, rng) -> dict:
        r = space.dag.op(i).reduce_axis[-1].extent
        return {"factor": pick(rng, vector_sizes(r, space.lanes(i))), "parallel": bool(rng.random() < 0.7)}

    def apply(self, applier, i: int) -> None:
        st, p = applier.orig[i], applier.p(i)
        f = int(p.get("factor", applier.lanes[i]))
        r = st.op.reduce_axis[-1]
        _, ri = st.split(r, factor=f)
        rf = applier.s[applier.s.rfactor(st.tensor, ri, factor_axis=len(st.op.axis))]
        *sp, lane = rf.op.axis
        rf.reorder(*sp, *rf.op.reduce_axis, lane)
        if lane.extent > 1:
            rf.vectorize(lane)
        if p.get("parallel") and sp and math.prod(a.extent for a in sp) > 1:
            rf.parallel(sp[0] if len(sp) == 1 else rf.fuse(*sp))
