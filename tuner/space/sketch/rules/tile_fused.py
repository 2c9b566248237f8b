"""tile_fused: a tiled reduction whose only reader is an elementwise stage reading it point for
point (dense's epilogue, a user's `C * 2 + D[j]`): that reader is tiled S0 S1 S2 S3 and the
reduction computed at its last S1 loop (R0 S2 R1 S3 inside), the epilogue fused into the
register tile. The reader takes fused_consumer."""

from __future__ import annotations

from .tiling import TiledRule


class TileFused(TiledRule):
    name = "tile_fused"

    def applies(self, ctx, i: int) -> bool:
        return i in ctx.tiled and i in ctx.consumer

    def apply(self, applier, i: int) -> None:
        self.tile_attached(applier, i, applier.orig[i], applier.orig[applier.sk.consumer[i]])
