"""fused_consumer: the elementwise reader of a tile_fused reduction; that rule schedules it."""

from __future__ import annotations

from .base import StageRule


class FusedConsumer(StageRule):
    name = "fused_consumer"

    def applies(self, ctx, i: int) -> bool:
        return i not in ctx.inlinable and i in ctx.consumer.values()
