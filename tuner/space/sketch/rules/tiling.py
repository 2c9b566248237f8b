"""What the three multi-level tiling rules (tile, tile_cache_write, tile_fused) share: their
parameters and the attached form of the tiling (an output tiled S0 S1 S2 S3, the reduction
computed at its last S1 loop)."""

from __future__ import annotations

import math

from ..sampling import outer_order, pick
from .base import StageRule

AUTO_UNROLL_STEPS = (0, 16, 64, 512)
RED_AS_DEFINED_P = 0.6    # how often a tile's reduction loops keep the definition's order


class TiledRule(StageRule):
    """A reduction with data reuse, tiled "SSRSRS": each spatial axis split into 4 levels, each
    reduction axis into 2, ordered S0 S1 R0 S2 R1 S3 (the outer S0 S1 levels may take the last
    axis first). Its parameters: the tile, the outer order, how many outer loops run in
    parallel, the micro-kernel's unrolling, the reduction order, and where the sketch allows,
    packing the reused operand and copying the input in blocks."""

    tiled = True

    def applies(self, ctx, i: int) -> bool:
        return i in ctx.tiled

    def sample(self, space, sketch, i: int, rng) -> dict:
        op = space.dag.op(i)
        vec = sketch.vec.get(i)
        tile = space.sample_tile(i, rng, vec)
        outer = [-(-ax.extent // math.prod(tile[f"s{d}"])) for d, ax in enumerate(op.axis)]
        last_outer = bool(rng.random() < 0.5)
        vec_last = vec is not None and bool(rng.random() < 0.5)
        outer = outer_order(outer, last_outer, vec if vec_last else None)
        p = {"tile": tile, "last_outer": last_outer, "parallel": space.sample_parallel(outer, rng),
             "unroll_inner": bool(rng.random() < 0.7), "auto_unroll": pick(rng, AUTO_UNROLL_STEPS)}
        if vec is not None:
            p["vec_last"] = vec_last
        n_red = len(op.reduce_axis)
        if n_red > 1:  # mostly as defined; else one reduction axis moved innermost
            perm = list(range(n_red))
            if rng.random() >= RED_AS_DEFINED_P:
                perm.append(perm.pop(int(rng.integers(n_red - 1))))
            p["red_perm"] = perm
        if i in sketch.pack:
            p["pack"] = bool(rng.random() < 0.5)
        if i in sketch.block_in:
            p["block_input"] = bool(rng.random() < 0.5)
        return p

    @staticmethod
    def tile_attached(applier, i: int, red, out, order=None) -> None:
        """`out` (the output copy or the fused consumer) tiled S0 S1 S2 S3 and stored along its
        last axis; the reduction `red` computed at its last S1 loop as R0 S2 R1 S3. `order`: the
        cache's dimensions (red's axes) as dimensions of `out`, its vector axis last."""
        p = applier.p(i)
        n_sp = len(out.op.axis)
        order = order or list(range(n_sp))
        tiles = [applier.tile_of(i, f"s{d}", 3) for d in range(n_sp)]
        sp = [applier.split_levels(out, ax, t) for ax, t in zip(out.op.axis, tiles)]
        outer = applier.outer_first(i, sp, p)
        out.reorder(*[l[k] for k in range(2) for l in outer], *[l[k] for k in range(2, 4) for l in sp])
        if sp[-1][3].extent > 1:
            out.vectorize(sp[-1][3])
        if i in applier.sk.vec:
            applier.unroll_store(out, [l[3] for l in sp[:-1]])
        red.compute_at(out, outer[-1][1])
        applier.parallel_prefix(out, [l[0] for l in outer], p.get("parallel", 0))
        inner = [red.split(red.op.axis[k], factor=tiles[d][2]) for k, d in enumerate(order)]
        rd = applier.red_order(p, [red.split(ax, factor=applier.tile_of(i, f"r{d}", 1)[0])
                                   for d, ax in enumerate(red.op.reduce_axis)])
        red.reorder(*[r[0] for r in rd], *[x[0] for x in inner], *[r[1] for r in rd], *[x[1] for x in inner])
        applier.micro_kernel(i, red, [x[1] for x in inner], [r[1] for r in rd], p)
        applier.block_input(i, red)
        applier.pack(i, red)
