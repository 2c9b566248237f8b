"""The inventory's default schedules said in the sketch space: a sketch and its parameters.

Tuning starts from the best schedule we know. A template's config 0 is its operator's default
schedule; in the sketch space the same recipe is one annotation of one sketch, and this module
finds it, so a guided search measures it first and evolves from it instead of from random
samples. Two recipes are annotations of the sketch space's rules:

- GEMM (matmul, batch_matmul: compiler/ops/schedule_gemm.py): the output tiled mr x nr with the
  accumulators cached at the tile (`tile_cache_write`), k split by 4 and unrolled with the rows,
  the columns a vector, B packed into nr-wide panels, the panels walked outermost (`last_outer`)
  and the tile loops fused and parallel;
- NCHW convolutions with channel vectors (compiler/ops/schedule_conv.py,
  schedule_conv_nchw_channels): the padding at the root, the output tiled FB channels (the
  vector, `tile_cache_write@1`) x YB rows x XB columns, the weights packed along the channels,
  the spatial tiles outside the channel blocks unless the weights dominate (`vec_last`), and the
  reduction either with the taps unrolled inside the channel loop or with the channel loop
  innermost in steps of 4 (`red_perm`), as `taps_unrolled` decides; where the weights dominate,
  the input copied in blocks of 8 channels (`block_input`) and those 8 innermost.

Other defaults (grouped convolutions, column-vector convolutions, epilogues) use loop orders the
sketch rules do not have; `default_sketch_candidate` gives None for them and the search starts
from its samples alone.
"""

from __future__ import annotations

from compiler.ops.schedule_common import want_parallel
from compiler.ops.schedule_conv import RED_UNROLL, channel_tile, channel_vectors_pay, input_channel_block, taps_unrolled, weights_dominate
from compiler.ops.schedule_gemm import gemm_tile

from ...candidate import Candidate
from ..base import SpaceError
from .rules import ROOT, TILE_CACHE_WRITE, StageRule

GEMM_OPS = ("matmul", "batch_matmul")


def default_sketch_candidate(space) -> Candidate | None:
    """The candidate of `space` (a SketchSpace) that is its operator's default schedule on the
    space's target, or None when the default is not one of the space's sketches."""
    name = getattr(space.opdef, "name", "")
    if name in GEMM_OPS:
        found = _gemm(space)
    elif name == "conv2d_nchw":
        found = _conv_channels(space)
    else:
        found = None
    if found is None:
        return None
    sketch_id, params = found
    try:
        return space.make_candidate(sketch_id, params)
    except SpaceError:
        return None


def _find_sketch(space, rules: dict, vec: dict):
    """The id of the sketch with these rules (by stage name: a rules.StageRule) and vector axes,
    or None."""
    names = space.dag.names
    for sk in space.sketches:
        if {names[i]: r for i, r in sk.rules.items()} == rules and sk.vec == vec:
            return sk.id
    return None


def _gemm(space):
    target = space.target
    out = space.dag.output
    if len(space.dag.names) != 1:   # an epilogue stage follows: another recipe
        return None
    sketch_id = _find_sketch(space, {space.dag.names[out]: TILE_CACHE_WRITE}, {})
    if sketch_id is None:
        return None
    op = space.dag.op(out)
    *batch, M, N = [ax.extent for ax in op.axis]
    mr, nr = gemm_tile(M, N, target.vector_lanes(op.dtype), target.capabilities.vector_registers,
                       fmas_per_cycle=target.capabilities.fmas_per_cycle)
    n_batch = len(batch)
    tile = {f"s{d}": [1, 1, 1] for d in range(n_batch)}
    tile[f"s{n_batch}"] = [1, 1, mr]
    tile[f"s{n_batch + 1}"] = [1, 1, nr]
    tile["r0"] = [RED_UNROLL]
    params = {"tile": tile, "last_outer": True, "parallel": n_batch + 2,
              "unroll_inner": True, "auto_unroll": 0, "pack": True}
    return sketch_id, {space.dag.names[out]: params}


def _conv_channels(space):
    opdef, target = space.opdef, space.target
    if opdef.params.get("groups", 1) != 1 or not channel_vectors_pay(opdef, target):
        return None
    names, out = space.dag.names, space.dag.output
    pad = next((i for i, n in enumerate(names) if n == "pad"), None)
    rules: dict[str, StageRule] = {names[out]: TILE_CACHE_WRITE}
    if pad is not None:
        rules["pad"] = ROOT
    sketch_id = _find_sketch(space, rules, {out: 1})
    if sketch_id is None:
        return None
    vl = target.vector_lanes(opdef.output.dtype)
    FB, XB, YB = channel_tile(opdef, target)
    C, KW = opdef.inputs[0].shape[1], opdef.params["KW"]
    rc_step = RED_UNROLL if C % RED_UNROLL == 0 else 1
    tile = {"s0": [1, 1, 1], "s1": [1, 1, FB], "s2": [1, 1, YB], "s3": [1, 1, XB]}
    conv = {"tile": tile, "last_outer": False, "vec_last": not weights_dominate(opdef),
            "parallel": 4 if want_parallel(target, opdef.flops) else 0,
            "unroll_inner": True, "auto_unroll": 0, "pack": True}
    shared = taps_unrolled(opdef, FB // vl, XB, YB, target.capabilities)
    RB = input_channel_block(opdef, target, shared)
    if RB:
        # the input copied in channel blocks: the taps outside, the block's channels innermost
        tile.update(r0=[RB], r1=[1], r2=[1])
        conv["red_perm"] = [1, 2, 0]
        conv["block_input"] = True
    elif shared:
        # channels outside the taps, a row of taps unrolled (a 1x1 kernel: the channels by 4)
        tile.update(r0=[rc_step if KW == 1 else 1], r1=[1], r2=[KW])
        conv["red_perm"] = [0, 1, 2]
    else:
        # the taps outside, the channel loop innermost in unrolled steps
        tile.update(r0=[rc_step], r1=[1], r2=[1])
        conv["red_perm"] = [1, 2, 0]
    params = {names[out]: conv}
    if pad is not None:
        pad_op = space.dag.op(pad)
        outer_rows = len(pad_op.axis) - 1
        size = 1
        for ax in pad_op.axis:
            size *= ax.extent
        params["pad"] = {"inner": "none", "split": 1,
                         "parallel": outer_rows if want_parallel(target, size) else 0}
    return sketch_id, params


__all__ = ["default_sketch_candidate"]
