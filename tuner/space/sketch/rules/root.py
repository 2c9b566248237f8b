"""root: the producers of tiled stages (a convolution's padding) materialized at the root and
scheduled as elementwise stages, instead of inlined into their readers: the variant sketch of
those producers, one choice for all of them."""

from __future__ import annotations

from .elementwise import Elementwise


class Root(Elementwise):
    name = "root"

    def applies(self, ctx, i: int) -> bool:
        return i in ctx.feeding
