"""tile: a reduction with data reuse (an input read that does not depend on every spatial axis:
matmul, convolutions) tiled in place, accumulating in its own output: the variant sketch of a
tiled output, and the only form of a tiled stage that is not the output."""

from __future__ import annotations

from .tiling import TiledRule


class Tile(TiledRule):
    name = "tile"

    def applies(self, ctx, i: int) -> bool:
        return i in ctx.tiled and i not in ctx.consumer

    def apply(self, applier, i: int) -> None:
        st, p = applier.orig[i], applier.p(i)
        sp = [applier.split_levels(st, ax, applier.tile_of(i, f"s{d}", 3)) for d, ax in enumerate(st.op.axis)]
        rd = [applier.split_levels(st, ax, applier.tile_of(i, f"r{d}", 1)) for d, ax in enumerate(st.op.reduce_axis)]
        outer = applier.outer_first(i, sp, p)
        rd = applier.red_order(p, rd)
        order = [l[0] for l in outer] + [l[1] for l in outer] + [l[0] for l in rd] + [l[2] for l in sp] + \
            [l[1] for l in rd] + [l[3] for l in sp]
        st.reorder(*order)
        applier.micro_kernel(i, st, [l[3] for l in sp], [l[1] for l in rd], p)
        applier.parallel_prefix(st, [l[0] for l in outer], p.get("parallel", 0))
        applier.pack(i, st)
