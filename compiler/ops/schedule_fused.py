"""Default schedules of the operators with fused epilogues: conv2d_bias_relu and dense_gelu.

A fused operator is scheduled like its anchor (the convolution, the GEMM) with the epilogue as
the stage that owns the register tile: the anchor's reduction is computed per tile into a local
buffer (the reduction stage itself, attached at the tile loop, where the plain operator uses a
cache_write), and bias + activation are applied as the tile is stored. The product never makes a
round trip through memory, which is the point of tuning the operator as one workload.

- conv2d_bias_relu: schedule_conv's NCHW recipe, same tile choice (vector over the output
  column, unrolled over channels and rows), same handling of padding and column strides.
- dense_gelu: dense's compute with epilogue="gelu", which schedule_gemm already fuses.
"""

from __future__ import annotations

from dataclasses import replace

from ..schedule import Schedule, create_schedule
from ..target import resolve_target
from .schedule_common import fuse_all, lanes, want_parallel
from .schedule_conv import (
    MAX_UNROLLED_TAPS,
    pick_tile,
    prepare_conv_input,
    split_output_tile,
    unroll_inner_reduction,
    vector_tiles,
    weights_dominate,
)
from .schedule_gemm import schedule_gemm


def schedule_conv_bias_relu(opdef, target=None) -> Schedule:
    """conv2d_nchw's register tiles, with the epilogue stage as the tile's output."""
    target = resolve_target(target)
    out = opdef.output
    s = create_schedule(out)
    conv = next(st for st in s.stages if st.op.reduce_axis)
    vl = lanes(target, out.dtype)
    _, F, OH, OW = out.shape
    KW, groups = opdef.params["KW"], opdef.params["groups"]
    # the tile choice of schedule_conv_nchw: see its cost model
    taps = KW if KW <= MAX_UNROLLED_TAPS else 1
    XB, (FB, YB) = pick_tile(vector_tiles(OW, vl), vl, [(F, min(F // groups, 16), True), (OH, 8, False)],
                              lambda r, c: (c[0] + c[1] * r, c[1] * r * taps if c[0] > 1 else 1),
                              target.capabilities)
    # data and weight decide the loop order, not the bias
    order = [1, 2, 3] if weights_dominate(replace(opdef, inputs=opdef.inputs[:2])) else [3, 2, 1]

    st = s[out]
    unrolled = [(1, FB), (2, YB)]
    tile_dims, inner, outer_loops = split_output_tile(st, unrolled, 3, XB, order)
    for d, _ in unrolled:
        st.unroll(inner[d])
    st.vectorize(inner[3])
    # the convolution per tile: [reduce loops] [unrolled channels and rows] [vector of columns]
    cax, rax = list(conv.op.axis), list(conv.op.reduce_axis)
    conv.reorder(*[cax[d] for d in range(len(cax)) if d not in tile_dims], *rax, *[cax[d] for d in tile_dims])
    for d, _ in unrolled:
        conv.unroll(cax[d])
    conv.vectorize(cax[3])
    unroll_inner_reduction(conv, rax, -(-XB // vl) * FB * YB)
    loop = fuse_all(st, outer_loops)
    conv.compute_at(st, loop)
    if want_parallel(target, opdef.flops) and loop.extent > 1:
        st.parallel(loop)

    prepare_conv_input(s, conv, opdef, target)
    return s


def schedule_dense_gelu(opdef, target=None) -> Schedule:
    """dense's GEMM schedule. schedule_gemm recognizes dense's [N, K] weight (which it packs
    along N) by the operator's name, so it is handed the same definition under dense's name."""
    return schedule_gemm(replace(opdef, name="dense"), target)


__all__ = ["schedule_conv_bias_relu", "schedule_dense_gelu"]
