"""Default schedule of conv2d_nchwc: the channel-blocked convolution a model's layers run in.

The output [N, F/FB, OH, OW, FB] is computed in register tiles of XB columns of up to
MAX_TILE_BLOCKS channel blocks (FB lanes, the vector): each reduction step is a weight vector
per block (the vector after the previous step's in the [F/FB, C/CB, KH, KW, CB, FB] weights)
and XB input broadcasts, which in blocked data are consecutive floats of one line; the tile is
stored as whole vectors. No transposing copies: the padded input is materialized (a vector
copy in this layout) and the weights come packed. A depthwise tile is XB x YB of one block and
reads an input vector per accumulator and tap instead of broadcasts, all unit stride, its
padded input computed per tile (pad_at_tile).

Where a dense tile's weights (its blocks' share of every input channel and tap) overflow half
the L1 and the tile would read them from L2 faster than L2 delivers (row_chunk), the reduction is
split instead: a row of output blocks accumulates in an L1 buffer over chunks of input blocks
whose weights fit there (row_accumulated_tile), each register tile of the row reading the
chunk's weights from L1 rather than the whole reduction's from L2.

What conv2d_nchw's channel-vector schedules spend per layer on layout (the input copied into
channel blocks, the tile stored transposed into NCHW rows) disappears when a model keeps its
activations blocked between layers (compiler.graph.layout).
"""

from __future__ import annotations

import math

import numpy as np

from ..schedule import Schedule, create_schedule
from ..target import resolve_target
from .schedule_common import fuse_all, lanes, largest_divisor, parallel_loop, want_parallel
from .schedule_conv import FMA_LATENCY, MAX_UNROLLED_STEP, accumulate_locally, feasible_tiles, pick_tile, register_tile
from .schedule_elementwise import schedule_pad_stage

MAX_TILE_BLOCKS = 4  # channel blocks of a dense tile
DENSE_CHAIN_LATENCY = 6  # cycles between a dense tile's updates of one accumulator, as measured
MAX_TILE_CHOICES = 8  # register tiles the tuner tries per convolution (nchwc_tile_choices)
L2_WEIGHT_STREAM = 16  # bytes a cycle of weights a register tile may read from L2 (row_chunk)


def nchwc_tile(opdef, target) -> tuple:
    """(FOB, XB, YB): channel blocks, columns and rows of a register tile.

    A dense tile is one row of XB columns of FOB blocks, blocks outermost: per step LLVM keeps
    the XB broadcasts live across the blocks and loads one weight vector at a time, so the tile
    holds FOB·XB accumulators + XB broadcasts + 1 weight in vector registers (what pick_tile is
    given: beyond that it spills, as 28-accumulator tiles did on Emerald Rapids, 60-140 GFLOPS
    against 180-290 for 14-21 in one row; 3 x 4 and 2 x 6 tiles on Zen 3's 16 registers too).
    Chains of updates are rated at DENSE_CHAIN_LATENCY cycles, not the FMA's 4: on Zen 3 the
    8-accumulator tiles that latency says are enough ran below 12-accumulator ones (4 blocks x
    3 columns: ResNet's 14x14 3x3 layers 1.11-1.14x, its 28->14 stride-2 layer 1.25-1.35x, the
    rest even within noise), as a C micro-kernel of each did (2 x 4: 97-177 GFLOPS, 4 x 3:
    150-186, same runs). The tile's blocks of weights fit the L2, as the tiles after it in its
    row and column read them again (4 blocks of ResNet's 512-channel 3x3 layer, 590 KB, came
    from L3 for every tile on Zen 3's 512 KB L2; 1 block x 7 columns ran 1.28x faster, 2 x 4 as
    fast). A depthwise tile, one block, loads an input vector per accumulator instead and keeps
    its rows."""
    vl, dims, cost, latency = _tile_problem(opdef, target)
    _, factors = pick_tile([opdef.output.shape[4]], vl, dims, cost, target.capabilities, latency=latency)
    return _as_tile(opdef, factors)


def nchwc_tile_choices(opdef, target) -> list:
    """The (FOB, XB, YB) tiles whose accumulators and operands fit the target's registers, as
    nchwc_tile ranks them, nchwc_tile's own first, the MAX_TILE_CHOICES best: the tile the tuner
    varies (the rest, down to 1 x 1, leave FMAs idle; a short search would waste trials there)."""
    vl, dims, cost, _ = _tile_problem(opdef, target)
    default = nchwc_tile(opdef, target)
    others = [_as_tile(opdef, f) for _, f in feasible_tiles([opdef.output.shape[4]], vl, dims, cost, target.capabilities)]
    return ([default] + [t for t in others if t != default])[:MAX_TILE_CHOICES]


def _as_tile(opdef, factors) -> tuple:
    if opdef.params["depthwise"]:
        return tuple(factors)
    if opdef.params.get("group_window"):
        return (1, *factors)
    return (*factors, 1)


def _tile_problem(opdef, target) -> tuple:
    """(lanes, dims, cost, latency) of nchwc_tile's pick_tile: see nchwc_tile."""
    out = opdef.output
    vl = lanes(target, out.dtype)
    _, FO, OH, OW, FB = out.shape
    if opdef.params["depthwise"]:
        dims = [(1, 1, False), (OW, 8, True), (OH, 4, True)]
        cost = lambda r, c: (c[1] * c[2] * r + r, 2 * r)   # noqa: E731
        return vl, dims, cost, FMA_LATENCY
    weight = opdef.inputs[1]
    block_bytes = math.prod(weight.shape[1:]) * np.dtype(weight.dtype).itemsize
    blocks = max(1, min(MAX_TILE_BLOCKS, target.capabilities.l2 // block_bytes))
    if opdef.params.get("group_window"):
        # each block walks its own window (its skipped steps whole steps of the tile): one block,
        # its accumulators from columns and rows (a 7x7 map's 7 columns alone leave FMAs idle)
        dims = [(OW, 16, True), (OH, 4, True)]
        cost = lambda r, c: (c[0] * c[1] + r, c[0] * c[1])   # noqa: E731
        return vl, dims, cost, DENSE_CHAIN_LATENCY
    # a tile's blocks share its broadcasts only within one group: blocks of a grouped convolution
    # divide a group's output blocks (ShuffleNet's 17 blocks of 8 lanes per group: 1 block)
    groups = int(opdef.params.get("groups", 1) or 1)
    dims = [(FO // groups if groups > 1 and FO % groups == 0 else FO, blocks, False), (OW, 8, True)]
    cost = lambda r, c: (c[1] + c[0] * r, c[1])   # noqa: E731
    return vl, dims, cost, DENSE_CHAIN_LATENCY


def schedule_blocked_pad(st, target):
    """The padded copy of blocked data, [N, C/CB, H, W, CB] with the border in H and W only: a
    line of CB channels is one vector, loaded or zeroed by one border test on its row and column
    (schedule_pad_stage's scalar row loop left to LLVM tested every element: 0.3 ms for a 4.8 MB
    input, three times the depthwise convolution reading it); rows fused, in parallel."""
    *outer, x, line = st.op.axis
    st.vectorize(line)
    return parallel_loop(st, outer, None, target, int(math.prod(st.op.shape)))


def schedule_conv_nchwc(opdef, target=None, epilogue=None, fuse_epilogue: bool = True, tile: tuple | None = None,
                        row: bool | None = None) -> Schedule:
    """Register tiles over (rows, columns) of nchwc_tile's channel blocks, channel blocks
    outermost (each block's weights read once; the input, smaller than L2 in the layers that
    reuse it, is re-read per block); the reduction as defined (input channel blocks, taps, then
    the block's channels innermost and unrolled: consecutive broadcasts). `epilogue` as in
    schedule_conv_nchw. The tuner's choices (conv2d_nchwc_choices): `tile` (FOB, XB, YB) instead
    of nchwc_tile's, `row` to accumulate rows (row_accumulated_tile) where the tile allows it or
    not at all, instead of row_chunk's rule."""
    target = resolve_target(target)
    out = opdef.output
    s = create_schedule(out if epilogue is None else epilogue)
    FOB, XB, YB = nchwc_tile(opdef, target) if tile is None else (int(v) for v in tile)
    FB = out.shape[4]
    pad = next((st for st in s.stages if st.op.name == "pad"), None)
    at_tile = pad is not None and opdef.params["depthwise"]
    if pad is not None and not at_tile:
        (schedule_blocked_pad if opdef.params["data_block"] else schedule_pad_stage)(pad, target)
    chunk = row_chunk(opdef, target, FOB, XB, YB) if row is None else (row_chunk_size(opdef, target, FOB, XB, YB) if row else 0)
    if chunk:
        row_accumulated_tile(s, out, FOB, XB, chunk, target, opdef.flops, epilogue, fuse_epilogue)
        return s
    # Plain NCHW data (a network's first convolution): the innermost reduction is the taps of a
    # row, and the tile's columns read overlapping windows of them (stride < taps); unrolled,
    # LLVM kept the shared broadcasts live across taps and spilled the tile: ResNet's 7x7/2
    # stem with its bias and ReLU 3.3 ms, as a loop 1.46 (Zen 3; onnxruntime 2.2).
    acc = register_tile(s, out, [(1, FOB), (2, YB), (3, XB)], 4, FB, target, opdef.flops, outer_order=[1, 2, 3],
                        epilogue=epilogue, fuse_epilogue=fuse_epilogue,
                        unroll_reduction=bool(opdef.params["data_block"]) or opdef.params["depthwise"])
    if at_tile:
        pad_at_tile(pad, acc)
    return s


def row_chunk(opdef, target, FOB: int, XB: int, YB: int) -> int:
    """Input channel blocks per chunk of a row-accumulated convolution (row_accumulated_tile), or
    0 where the register tile keeps the whole reduction: where row_chunk_size allows it and the
    tile would read its weights from L2 faster than L2_WEIGHT_STREAM bytes a cycle (one weight
    vector per block and step, every XB FMAs of a block). Zen 3's AVX2 4 x 3 tile asked 21 bytes
    a cycle: row accumulation ran ResNet's 3x3 layers 1.1-1.35x faster; Zen 4's AVX-512 tiles of
    4 x 4 and 2 x 7 ask 16 and 9, and it ran them 0.8-0.97x."""
    weight = opdef.inputs[1]
    FB = weight.shape[-1]
    stream = FB * np.dtype(weight.dtype).itemsize * target.capabilities.fmas_per_cycle / XB
    return row_chunk_size(opdef, target, FOB, XB, YB) if stream > L2_WEIGHT_STREAM else 0


def row_chunk_size(opdef, target, FOB: int, XB: int, YB: int) -> int:
    """Input channel blocks per chunk where row accumulation can pay at all, else 0: a dense
    tile of one row over blocked data, in a row of several tiles (they share the chunk's
    weights), whose weights (FOB blocks of every input channel and tap) overflow half the L1.
    The chunk is the most input blocks whose weights fit there, dividing the input blocks."""
    p = opdef.params
    if p["depthwise"] or p.get("group_window") or not p["data_block"] or YB != 1:
        return 0
    OW = opdef.output.shape[3]
    weight = opdef.inputs[1]
    _, CBLK, KH, KW, CB, FB = weight.shape
    per_block = FOB * KH * KW * CB * FB * np.dtype(weight.dtype).itemsize
    budget = target.capabilities.l1d // 2
    if OW < 2 * XB or CBLK * per_block <= budget:
        return 0
    return largest_divisor(CBLK, max(1, budget // per_block))


def row_accumulated_tile(s, out, FOB: int, XB: int, chunk: int, target, work: int, epilogue, fuse_epilogue: bool):
    """A row of FOB output channel blocks accumulated in an L1 buffer, input channels in chunks:
    per chunk of `chunk` input blocks, the row's register tiles of XB columns each load their
    accumulators, run the chunk's taps and channels, and store them back, so the chunk's weights
    (under half the L1, row_chunk) are read from L1 by every tile of the row instead of the
    whole reduction's from L2 by each tile (ResNet's 3x3 layers, 295 KB of weights per tile at
    256 channels; onnxruntime's NCHWc kernels take one input block per call the same way). The
    row's buffer has whole tiles (a split's overhang computed with clamped reads, not tested in
    the micro-kernel); the row is then stored through the epilogue."""
    st, row_st = accumulate_locally(s, out, epilogue, fuse_epilogue, target)
    n, fo, y, x, fb = st.op.axis
    foo, foi = st.split(fo, factor=FOB)
    xo, xi = st.split(x, factor=XB)
    st.reorder(n, foo, y, foi, xo, xi, fb)
    st.unroll(xi)
    st.vectorize(fb)
    row = fuse_all(st, [n, foo, y])
    # the row buffer sums the chunks' register tiles (rfactor over the chunks): each tile is a
    # buffer of its own, indexed by constants, so LLVM keeps it in registers; accumulating in the
    # row buffer itself (indexed by the tile's column) put a load and a store around every FMA
    rc_chunk, _ = row_st.split(row_st.op.reduce_axis[0], factor=chunk)
    tile_st = s[s.rfactor(row_st.tensor, rc_chunk)]
    rn, rfo, ry_, rx_, rfb, rk = row_st.leaf_iter_vars
    rxo, rxi = row_st.split(rx_, factor=XB)
    row_st.reorder(rn, ry_, rk, rxo, rfo, rxi, rfb)
    row_st.unroll(rfo)
    row_st.unroll(rxi)
    row_st.vectorize(rfb)
    row_st.compute_at(st, row)
    tk, tn, tfo, ty, tx, tfb = tile_st.op.axis
    rc_in, ry, rx, rci = tile_st.op.reduce_axis
    # the block's channels unrolled around the tile as far as unrolled_fits allows (AVX-512's
    # 4 x 6 tile times 16 channels was twice the code the lowering builds), the rest a loop
    channels = largest_divisor(rci.extent, max(1, MAX_UNROLLED_STEP // (FOB * XB)))
    rci_loop, rci = tile_st.split(rci, factor=channels)
    tile_st.reorder(tk, tn, ty, rc_in, ry, rx, rci_loop, rci, tfo, tx, tfb)
    for a in (tfo, tx, rci):
        tile_st.unroll(a)
    for a in (tk, tn, ty, rc_in, ry, rx):
        if a.extent == 1:
            tile_st.unroll(a)
    tile_st.vectorize(tfb)
    tile_st.compute_at(row_st, rxo)
    if want_parallel(target, work) and row.extent > 1:
        st.parallel(row)
    return row_st


def pad_at_tile(pad, acc):
    """A depthwise tile's padded input computed just before the tile, inside the parallel tile
    loop: (YB + KH - 1) x (XB + KW - 1) lines of one channel block, written and read in L1.
    Materialized whole, the padded copy was a pass over memory costing twice the convolution
    (144 channels at 56x56: 0.15-0.18 ms against 0.11-0.12 this way; 96 at 112x112 stride 2:
    0.20 against 0.135); inlined, every tap's load tested the border (stride 1: slower still)."""
    _, parent, loop = acc.attach
    pad.compute_at(parent, loop)
    pad.vectorize(pad.op.axis[-1])


def conv2d_nchwc_choices(opdef, target) -> dict:
    """The choices schedule_conv_nchwc takes as arguments, each knob's values with the default
    first: `tile`, every register tile that fits (nchwc_tile_choices), and `row`, whether to
    accumulate rows, where some tile allows it. The tuner's recipe space
    (tuner/space/recipe.py) samples them."""
    target = resolve_target(target)
    tiles = nchwc_tile_choices(opdef, target)
    choices: dict[str, list] = {"tile": [list(t) for t in tiles]}
    if any(row_chunk_size(opdef, target, *t) for t in tiles):
        FOB, XB, YB = tiles[0]
        default = bool(row_chunk(opdef, target, FOB, XB, YB))
        choices["row"] = [default, not default]
    return choices


__all__ = ["schedule_conv_nchwc", "schedule_blocked_pad", "nchwc_tile", "nchwc_tile_choices", "row_chunk",
           "row_chunk_size", "row_accumulated_tile", "conv2d_nchwc_choices"]
