"""Default schedules of the Winograd convolution's three kernels (compiler.ops.winograd).

- the input transform: the padded input materialized (a vector copy in the blocked layout),
  then per (channel block, tile), in parallel: the a x a tile's rows transformed into a local
  buffer and its columns stored into V, both with the a x a loops unrolled (so each row's
  Select is a constant and the transform is the row's adds) and the B channels one vector;
- the matrix products: register tiles of channel blocks by tiles, as a 1x1 convolution's (the
  weights' vector per block and step, a broadcast of V per tile column), every point of the
  a x a tile and every register tile in one parallel loop;
- the output transform, stored through the fused epilogue: per (image, channel block, tile row,
  tile), in parallel, the rows of Aᵀ M into a local buffer, then the m x m output unrolled.
"""

from __future__ import annotations

import math

import numpy as np

from ..schedule import Schedule, create_schedule
from ..tensor import ComputeOp, topo_order
from .schedule_common import fuse_all, lanes, want_parallel
from .schedule_conv import feasible_tiles, pack_weight_panels, pick_tile, register_tile, schedule_block_copy
from .schedule_conv_nchwc import DENSE_CHAIN_LATENCY, MAX_TILE_BLOCKS, MAX_TILE_CHOICES
from .schedule_elementwise import schedule_injective_stage
from .winograd import DEFAULT_TILE, tile_grid, winograd_tile

WINOGRAD_TAGS = ("winograd_input", "winograd_gemm", "winograd_output")


def schedule_winograd(opdef, target) -> Schedule | None:
    """The schedule of a Winograd kernel's DAG, found by its stages' tags, else None."""
    computes = [op for op in topo_order([opdef.output]) if isinstance(op, ComputeOp)]
    tags = {op.tag for op in computes}
    if is_winograd_gemm(opdef):
        return schedule_winograd_gemm(opdef, target)
    if "winograd_input" in tags and opdef.output.op.tag == "winograd_input":
        return schedule_winograd_input(opdef, target)
    if "winograd_output" in tags and "winograd_output_rows" in tags:
        return schedule_winograd_output(opdef, target)
    return None


def _stage(s, tag: str):
    return next(st for st in s.stages if isinstance(st.op, ComputeOp) and st.op.tag == tag)


def schedule_winograd_input(opdef, target) -> Schedule:
    out = opdef.output
    s = create_schedule(out)
    _schedule_input_transform(s, s[out], target)
    return s


def _schedule_input_transform(s, st, target):
    """V's stage `st`: per (channel block, tile), rows into a local buffer, then columns, both
    unrolled, lanes one vector; the padding inlined into the rows' reads (one border test per
    vector of a block's channels). Materialized, the padded copy was one more pass over the
    input: 16 % of the transforms' time at batch 1 and a fifth at batch 8 (DenseNet's 3x3
    layers, znver5)."""
    pad = next((p for p in s.stages if p.op.name == "pad"), None)
    if pad is not None:
        pad.compute_inline()
    rows = _stage(s, "winograd_input_rows")
    i, j, cb, p, b = st.op.axis
    st.reorder(cb, p, i, j, b)
    tile = fuse_all(st, [cb, p])
    for ax in (i, j):
        st.unroll(ax)
    st.vectorize(b)
    _rows_at_tile(rows, st, tile, target)


def _rows_at_tile(rows, st, tile, target, parallel: bool = True):
    """The first (row) half of a transform, [i, j, *unit, lanes], computed per unit of the stage
    `st` (its loop `tile`, in parallel when the work asks and `parallel`): the a x a loops
    unrolled, the lanes one vector; its buffer is the unit's a x a vectors."""
    ri, rj, *unit, rlanes = rows.op.axis
    rows.reorder(*unit, ri, rj, rlanes)
    rows.compute_at(st, tile)
    for ax in (ri, rj, *unit):
        rows.unroll(ax)
    rows.vectorize(rlanes)
    if parallel and want_parallel(target, int(np.prod(st.op.shape))) and tile.extent > 1:
        st.parallel(tile)


def winograd_gemm_tile(opdef, target) -> tuple:
    """(FOB, XB): output channel blocks and tiles of a register tile of the matrix products,
    picked as a 1x1 convolution's (the weight vector per block and step shared by XB
    broadcasts of V; weights per block C·B·B, at most what the L2 holds)."""
    return _gemm_tile(opdef.output, opdef.inputs[1], target)


def _gemm_tile(M, U, target) -> tuple:
    vl, dims, cost = _gemm_tile_problem(M, U, target)
    _, (FOB, XB) = pick_tile([M.shape[4]], vl, dims, cost, target.capabilities, latency=DENSE_CHAIN_LATENCY)
    return FOB, XB


def winograd_gemm_choices(opdef, target) -> dict:
    """The tuner's knob of the matrix products' schedule (tuner/space/sketch/recipe.py):
    `tile`, the MAX_TILE_CHOICES best register tiles that fit the registers, the default first."""
    vl, dims, cost = _gemm_tile_problem(opdef.output, opdef.inputs[1], target)
    default = list(winograd_gemm_tile(opdef, target))
    others = [list(f) for _, f in feasible_tiles([opdef.output.shape[4]], vl, dims, cost, target.capabilities)]
    return {"tile": ([default] + [t for t in others if t != default])[:MAX_TILE_CHOICES]}


def _gemm_tile_problem(M, U, target) -> tuple:
    _, _, FO, P, FB = M.shape
    block_bytes = math.prod(U.shape[3:]) * np.dtype(U.dtype).itemsize
    blocks = max(1, min(MAX_TILE_BLOCKS, target.capabilities.l2 // block_bytes))
    dims = [(FO, blocks, False), (P, 8, True)]
    cost = lambda r, c: (c[1] + c[0] * r, c[1])   # noqa: E731
    return lanes(target, M.dtype), dims, cost


def is_winograd_gemm(opdef) -> bool:
    computes = [op for op in topo_order([opdef.output]) if isinstance(op, ComputeOp)]
    return len(computes) == 1 and computes[0].tag == "winograd_gemm"


def schedule_winograd_gemm(opdef, target, tile: tuple | None = None) -> Schedule:
    """`tile` (FOB, XB) instead of winograd_gemm_tile's: the tuner's choice."""
    out = opdef.output
    s = create_schedule(out)
    FOB, XB = winograd_gemm_tile(opdef, target) if tile is None else (int(v) for v in tile)
    register_tile(s, out, [(2, FOB), (3, XB)], 4, out.shape[4], target, opdef.flops, outer_order=[2, 3])
    return s


def schedule_winograd_output(opdef, target) -> Schedule:
    """The output transform stored through the fused epilogue (the schedule's output, into which
    winograd_output and the epilogue's other stages are inlined)."""
    out = opdef.output
    s = create_schedule(out)
    wout, rows = _stage(s, "winograd_output"), _stage(s, "winograd_output_rows")
    for st in s.stages:
        if isinstance(st.op, ComputeOp) and st is not s[out] and st is not rows:
            st.compute_inline()
    _schedule_output_transform(s[out], rows, int(wout.op.attrs["tile"]), target)
    return s


def _schedule_output_transform(st, rows, m: int, target):
    """Per (image, channel block, tile row, tile), in parallel: the rows of Aᵀ M into a local
    buffer, then the m x m output of `st` unrolled, the lanes one vector."""
    n, fo, h, w, fb = st.op.axis
    ho, hi = st.split(h, factor=m)
    wo, wi = st.split(w, factor=m)
    st.reorder(n, fo, ho, wo, hi, wi, fb)
    tile = fuse_all(st, [n, fo, ho, wo])
    st.unroll(hi)
    st.unroll(wi)
    st.vectorize(fb)
    _rows_at_tile(rows, st, tile, target)


MAX_TILED_OVER_OUTPUT = 1.5   # outputs the tiles cover, over the output's: past it the tiles compute mostly waste


def winograd_rewrite_applies(opdef, target) -> bool:
    """Whether conv2d_nchw's recipe offers the Winograd rewrite: a float32 convolution that
    winograd_tile takes (dense, 3x3, stride 1, channels and work enough; any dilation, as the
    rewrite's phases) whose channels are whole vectors, with OIHW weights (not pre-packed
    panels), and whose tiles cover at most MAX_TILED_OVER_OUTPUT times its output (a dilation
    of 12 on a 33x33 map: 3 rows per phase, in 2 tiles of 2). Its weights are an input, so the
    kernel transforms them on every call: that pays where the tiles are many (ResNet-50's
    res2-res4 3x3 layers, 784 to 49 tiles of 2x2, ran 1.5-1.9x oneDNN on znver4) and not where
    they are few (res5's 16 tiles: 0.75x; its direct form 1.17x); the tuner measures which."""
    data, weight = opdef.inputs[0], opdef.inputs[1]
    if opdef.name != "conv2d_nchw" or weight.ndim != 4 or opdef.output.dtype != "float32" or data.dtype != "float32":
        return False
    p = opdef.params
    vl = lanes(target, "float32")
    C, F = data.shape[1], weight.shape[0]
    if C % vl or F % vl:
        return False
    out_hw = tuple(opdef.output.shape[2:])
    rows, cols = output_tiles(opdef)
    if rows * cols * DEFAULT_TILE ** 2 > MAX_TILED_OVER_OUTPUT * out_hw[0] * out_hw[1]:
        return False
    return winograd_tile(C, F, (p["KH"], p["KW"]), p["stride"], (1, 1), p.get("groups", 1), out_hw, data.shape[0]) > 0


def output_tiles(opdef) -> tuple:
    """(tile rows, tile columns) of one image of conv2d_nchw's output in the rewrite's
    DEFAULT_TILE tiles, its dilation's phases counted (tile_grid)."""
    return tile_grid(tuple(opdef.output.shape[2:]), DEFAULT_TILE, tuple(opdef.params["dilation"]))


def schedule_conv_nchw_winograd(opdef, target, epilogue=None, weights_per_block: bool = False) -> Schedule:
    """conv2d_nchw (with its elementwise `epilogue`, if any) by the Winograd rewrite in one
    kernel (schedule_winograd_stages), F(2x2, 3x3) in channel blocks of the target's vector."""
    out = opdef.output
    s = create_schedule(out if epilogue is None else epilogue)
    s.rewrite(out, "winograd", tile=DEFAULT_TILE, block=lanes(target, out.dtype))
    schedule_winograd_stages(s, s[out], target, weights_per_block=weights_per_block)
    if epilogue is not None:
        schedule_injective_stage(s[epilogue], target)
    return s


def schedule_winograd_stages(s, conv, target, gemm_tile: tuple | None = None, weights_per_block: bool = False) -> None:
    """Schedule the stages `Schedule.rewrite(..., "winograd")` put in `s` for the stage `conv`
    (the NCHW convolution, now a copy out of the blocked output), in one kernel of parallel
    passes: the data blocked and padded, its transform; the weights copied into panels of
    output channel blocks (transposed in registers, as the direct form's), their transform (per
    input and output channel block, rows then columns, output channels one vector); the matrix
    products in register tiles (`gemm_tile` (FOB, XB) or the default); the output transform; the
    copy to NCHW, inlined into the epilogue when the convolution has one (`conv` is not an
    output). `weights_per_block`: the matrix products' output channel blocks outermost and in
    parallel, each block's weight panel and transform made inside it, serially, where the block
    reads them from the L2 (whole, ResNet-50's res5 3x3 writes and reads 17 MB of transformed
    weights per call)."""
    parallel_for = lambda work: want_parallel(target, work)   # noqa: E731
    schedule_block_copy(_stage(s, "winograd_data_blocked"), parallel_for)
    _schedule_input_transform(s, _stage(s, "winograd_input"), target)
    weight, weight_rows, gemm = _stage(s, "winograd_weight"), _stage(s, "winograd_weight_rows"), _stage(s, "winograd_gemm")
    oihw = next(t for t in weight_rows.op.input_tensors() if t.ndim == 4)
    FOB, XB = _gemm_tile(gemm.tensor, weight.tensor, target) if gemm_tile is None else (int(v) for v in gemm_tile)
    flops = 2 * math.prod(gemm.op.shape) * math.prod(ax.extent for ax in gemm.op.reduce_axis)
    block_loop: list = []
    register_tile(s, gemm.tensor, [(2, FOB), (3, XB)], 4, gemm.op.shape[4], target, flops, outer_order=[2, 3],
                  lead_dim=2 if weights_per_block else None, block_loop=block_loop if weights_per_block else None)
    in_block = bool(block_loop)
    panel = pack_weight_panels(s, weight_rows.tensor, oihw, weight.op.shape[-1], lanes(target, oihw.dtype),
                               (lambda work: False) if in_block else parallel_for)
    i, j, fo, cb, ci, fb = weight.op.axis
    weight.reorder(fo, cb, ci, i, j, fb)
    unit = fuse_all(weight, [fo, cb, ci])
    weight.unroll(i)
    weight.unroll(j)
    weight.vectorize(fb)
    _rows_at_tile(weight_rows, weight, unit, target, parallel=not in_block)
    if in_block:
        stored, loop = block_loop[0]
        weight.compute_at(stored, loop)
        panel.compute_at(stored, loop)
    wout = _stage(s, "winograd_output")
    _schedule_output_transform(wout, _stage(s, "winograd_output_rows"), int(wout.op.attrs["tile"]), target)
    if conv.is_output:
        schedule_injective_stage(conv, target)
    else:
        conv.compute_inline()


__all__ = ["WINOGRAD_TAGS", "schedule_winograd", "schedule_winograd_input", "schedule_winograd_gemm",
           "schedule_winograd_output", "schedule_winograd_stages", "schedule_conv_nchw_winograd", "winograd_rewrite_applies",
           "output_tiles", "winograd_gemm_tile", "winograd_gemm_choices", "is_winograd_gemm"]
