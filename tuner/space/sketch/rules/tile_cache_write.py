"""tile_cache_write: a tiled output with no fusible reader accumulates into a local tile
(cache_write) computed at the output's last S1 loop. Its variants vectorize the accumulators
along another spatial axis (`@d`: a convolution's output channels, the NCHWc default's vectors)."""

from __future__ import annotations

from .tiling import TiledRule


class TileCacheWrite(TiledRule):
    name = "tile_cache_write"

    def applies(self, ctx, i: int) -> bool:
        return i in ctx.tiled and i not in ctx.consumer and ctx.dag.is_output(i)

    def variants(self, ctx, i: int) -> list:
        if not self.applies(ctx, i):
            return []
        return [(self, None)] + [(self, d) for d in ctx.dag.vector_axes(i)]

    def apply(self, applier, i: int) -> None:
        st = applier.orig[i]
        n = len(st.op.axis)
        vec = applier.sk.vec.get(i, n - 1)
        order = [d for d in range(n) if d != vec] + [vec]   # accumulators: the vector axis last
        acc = applier.s[applier.s.cache_write(st.tensor, "local", order=order)]
        self.tile_attached(applier, i, acc, st, order)
