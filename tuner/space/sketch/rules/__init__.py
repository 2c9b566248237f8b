"""The sketch rules, one class a module (see base.py for what a rule is):

- inline:           an elementwise stage that is not the output, substituted into its readers;
- root:             the producers of tiled stages materialized at the root instead (one choice
                    for all of them);
- fused_consumer:   the elementwise reader a tile_fused reduction is fused into;
- tile_fused:       a tiled reduction computed inside its reader's register tile;
- tile_cache_write: a tiled output accumulating into a local tile (`@d`: vectorized along
                    another spatial axis);
- tile:             a tiled reduction accumulating in place;
- reduce:           a reduction without reuse: spatial loops, reduction loops, the last axis inside;
- rfactor:          a reduction with little spatial parallelism, its innermost axis factored out;
- elementwise:      an elementwise output, fused parallel outer loops and a vector.

`STAGE_RULES` is their order of preference: a stage's sketch choices are the variants of the
rules that apply to it in this order (the definition's own vector axis before the others), and
the first sketch takes every stage's first choice.
"""

from __future__ import annotations

from .base import SketchContext, StageRule
from .elementwise import Elementwise
from .fused_consumer import FusedConsumer
from .inline import Inline
from .reduce import Reduce
from .rfactor import RFactor
from .root import Root
from .tile import Tile
from .tile_cache_write import TileCacheWrite
from .tile_fused import TileFused

INLINE, ROOT, FUSED_CONSUMER = Inline(), Root(), FusedConsumer()
TILE_FUSED, TILE_CACHE_WRITE, TILE = TileFused(), TileCacheWrite(), Tile()
REDUCE, RFACTOR, ELEMENTWISE = Reduce(), RFactor(), Elementwise()
STAGE_RULES = (INLINE, ROOT, FUSED_CONSUMER, TILE_FUSED, TILE_CACHE_WRITE, TILE, REDUCE, RFACTOR, ELEMENTWISE)


def stage_choices(ctx: SketchContext, i: int) -> list:
    """Stage i's sketch choices, (rule, vector axis or None), in STAGE_RULES' order, the choices
    along the definition's own vector axis first."""
    found = [v for rule in STAGE_RULES for v in rule.variants(ctx, i)]
    return sorted(found, key=lambda v: v[1] is not None)   # stable: the rules' order kept


__all__ = ["STAGE_RULES", "StageRule", "SketchContext", "stage_choices", "INLINE", "ROOT", "FUSED_CONSUMER",
           "TILE_FUSED", "TILE_CACHE_WRITE", "TILE", "REDUCE", "RFACTOR", "ELEMENTWISE"]
