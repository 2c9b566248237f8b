"""conv2d_nchw's plane-accumulated channel tiles: the input-channel reduction split above the
spatial loops, its partial sums carried through a per-block buffer.

A channel tile (schedule_conv_nchw_channels) reads its FB-channel weight panel, every input
channel and tap, once per tile; where the tile is wider than a register or two that panel no
longer fits the L2 (ResNet-50's res5 3x3: 590 KB per 32 channels) and every tile of the map
streams it from L3. oneDNN's direct convolutions keep wide tiles (AVX-512: 4 channel blocks x 7
columns, 28 accumulators; per reduction step 4 weight vectors and 7 broadcasts instead of 1 and
7) by splitting the input channels into chunks whose weights stay in L2 and accumulating each
chunk's partial sums in the output. Here, per block of FB output channels (the parallel loop):

    plane[OH][OW][FB] (12.5 KB for 64 channels of a 7x7 map) = 0
    for each chunk of input channels (plane_chunk: its FB-channel weights fit a cache level):
        for each register tile (YB rows x XB columns of the block):
            tile = sum over the chunk's channels and taps        (registers)
            plane[tile] += tile
    the plane stored into the NCHW output, through the epilogue

The tile is an rfactor over the chunks, so it is a buffer of its own indexed by constants (LLVM
keeps it in registers); the input is copied in channel blocks (only the positions a strided
1x1 convolution reads) and the weights packed in panels as the channel tiles do. The same split
with the default's narrow tile and chunks sized to half the L1 has every tile read its weights
from L1 instead of the whole panel from L2 (nchwc's row accumulation does this per row).

The tuner's recipe space offers these tiles beside the register tiles
(conv2d_nchw_recipe_choices); the default schedule does not take them. On znver3 (2 threads,
same runs) the L1-chunked default tile ran ResNet's res4 3x3/2 at 140 GFLOPS against the
default's 116 and the other deep layers within 3 % of it; the wide AVX2 tiles (32 channels x 2
columns) ran 20-40 % below it: the wide blocks are there for 32-register targets.
"""

from __future__ import annotations

import numpy as np

from ..errors import ScheduleError
from ..schedule import Schedule, create_schedule
from ..target import resolve_target
from .schedule_common import divisors, fuse_all, lanes, want_parallel
from .schedule_conv import (
    INPUT_BLOCK,
    accumulate_locally,
    block_input_channels,
    channel_tile,
    channel_vectors_pay,
    conv2d_nchw_choices,
    feasible_tiles,
    input_channel_block,
    input_step,
    materialize_pad,
    pack_weight_panels,
    packing_per_block_pays,
    schedule_conv_nchw,
    subsample_input,
    taps_unrolled,
    unroll_inner_reduction,
    unrolled_fits,
)
from .schedule_winograd import output_tiles, schedule_conv_nchw_winograd, winograd_rewrite_applies

# conv2d_nchw's algorithms (the recipe's first knob where the Winograd rewrite applies): the
# direct form; Winograd with the weights transformed whole, then the matrix products; Winograd
# with each output channel block's weights transformed inside its block (res5's 3x3: 17 MB of
# transformed weights written and read whole, 0.35-0.79x oneDNN; per block 0.88-1.12x)
ALGORITHMS = ("direct", "winograd", "winograd_per_block")
PLANE_BLOCK_REGISTERS = (4, 2)   # channel blocks of a plane tile, in registers
MAX_PLANE_TILES = 3              # plane tiles the tuner tries per convolution
MAX_PLANE_BYTES = 64 << 10       # a block's plane buffer stays well inside the L1 .. L2
# Winograd tiles of the output (per image, summed over the batch) from which the default takes the
# rewrite: the kernel transforms its weights on every call (about 170 flops per input x output
# channel pair), which the matrix products (32 flops per pair and tile) must bury. Same runs on
# znver4, whole-weight rewrite over the direct default, AVX-512 / AVX2 code: 784 tiles (64 ch)
# 1.33x / 1.49x, 196 (128 ch) 1.68x / 1.67x, 49 (256 ch) 1.56x / 1.50x, 49 (512 ch) 1.09x /
# 1.24x, 225 (32 -> 64 ch) 1.46x / 1.89x, 81 (96 -> 48 ch) 1.18x / 1.32x; below it AVX2 code
# lost (36 tiles at 128 ch 0.74x, 25 at 256 ch 1.08x, 16 at 256 ch 0.32x) and res5's 16 tiles
# at 512 ch lost on both (0.53x / 0.58x). The tuner measures the rewrite wherever it applies.
WINOGRAD_DEFAULT_MIN_TILES = 48


def plane_chunk(opdef, target, fb: int, budget: int, block: int = INPUT_BLOCK) -> int:
    """Input channels per chunk of a plane-accumulated tile of `fb` channels: the most that divide
    the input channels (in whole input blocks of `block` where they divide) whose weights for the
    fb channels, every tap, fit `budget` bytes."""
    weight = opdef.inputs[1]
    C = opdef.inputs[0].shape[1]
    step = block if block and C % block == 0 else 1
    per_channel = fb * opdef.params["KH"] * opdef.params["KW"] * np.dtype(weight.dtype).itemsize
    fitting = [d for d in divisors(C) if d % step == 0 and d * per_channel <= budget]
    return max(fitting) if fitting else step


def plane_pays(opdef, target) -> bool:
    """Whether plane tiles are offered at all: a dense, ungrouped conv2d_nchw with channel vectors
    and a reduction of several input blocks, whose plane for a register of channels fits
    MAX_PLANE_BYTES."""
    if opdef.name != "conv2d_nchw" or opdef.inputs[1].ndim != 4 or opdef.params.get("groups", 1) != 1:
        return False
    if not channel_vectors_pay(opdef, target) or opdef.inputs[0].shape[1] < 2 * INPUT_BLOCK:
        return False
    vl = lanes(target, opdef.output.dtype)
    _, F, OH, OW = opdef.output.shape
    return F % vl == 0 and OH * OW * vl * np.dtype(opdef.output.dtype).itemsize <= MAX_PLANE_BYTES


def plane_tiles(opdef, target) -> list:
    """["plane", FB, XB, YB, chunk] tiles worth trying, at most MAX_PLANE_TILES: first the
    default's register tile with chunks whose weights fit half the L1 (each tile of the block
    then reads them from L1, not the whole panel from L2: ResNet's res5 3x3 on znver3 ran
    123-125 GFLOPS against the default's 116, same run), then the best-ranked tiles of
    PLANE_BLOCK_REGISTERS registers of channels (the accumulators, FB/lanes weight vectors and
    a broadcast in the registers), with chunks whose weights fit half the L2: the wide channel
    blocks whose whole panel would not."""
    if not plane_pays(opdef, target):
        return []
    target = resolve_target(target)
    caps = target.capabilities
    vl = lanes(target, opdef.output.dtype)
    _, F, OH, OW = opdef.output.shape
    itemsize = np.dtype(opdef.output.dtype).itemsize
    out: list = []
    fb, xb, yb = channel_tile(opdef, target)
    out.append(["plane", fb, xb, yb, plane_chunk(opdef, target, fb, caps.l1d // 2)])
    for k in PLANE_BLOCK_REGISTERS:
        fb = k * vl
        if F % fb or OH * OW * fb * itemsize > MAX_PLANE_BYTES:
            continue
        ranked = feasible_tiles([fb], vl, [(OW, 8, True), (OH, 4, True)], lambda r, c: (c[0] * c[1] + r, r), caps)
        out += [["plane", vt, *factors, plane_chunk(opdef, target, vt, caps.l2 // 2)] for vt, factors in ranked[:1]]
    unique = [t for i, t in enumerate(out) if t not in out[:i]]
    return unique[:MAX_PLANE_TILES]


def winograd_by_default(opdef, target) -> bool:
    """Whether conv2d_nchw's default schedule is the Winograd rewrite: where the rewrite applies
    (winograd_rewrite_applies) and the output holds WINOGRAD_DEFAULT_MIN_TILES tiles or more."""
    if not winograd_rewrite_applies(opdef, target):
        return False
    rows, cols = output_tiles(opdef)
    return opdef.output.shape[0] * rows * cols >= WINOGRAD_DEFAULT_MIN_TILES


def schedule_conv_nchw_default(opdef, target=None, epilogue=None, fuse_epilogue: bool = True) -> Schedule:
    """conv2d_nchw's schedule without tuning: the Winograd rewrite
    with its weights transformed whole where winograd_by_default says it pays, else the direct
    form of schedule_conv_nchw. An epilogue that is not to be fused (the fallback when a fused one
    makes too much code) takes the direct form, which can store the convolution first."""
    target = resolve_target(target)
    if fuse_epilogue and winograd_by_default(opdef, target):
        return schedule_conv_nchw_winograd(opdef, target, epilogue)
    return schedule_conv_nchw(opdef, target, epilogue, fuse_epilogue)


def conv2d_nchw_recipe_choices(opdef, target) -> dict:
    """conv2d_nchw_choices with plane tiles (plane_tiles): the first two right after the default's
    register tile, so the recipe sketch's starting points measure them in a short search (the
    default's tile with its chunks in L1, the widest channel block that fits the registers);
    and `algorithm` (ALGORITHMS: the direct form, or the Winograd rewrite by
    schedule_conv_nchw_winograd, its weights transformed whole or per block of output channels,
    which the other knobs do not apply to), where the rewrite applies (winograd_rewrite_applies)."""
    choices = conv2d_nchw_choices(opdef, target)
    planes = plane_tiles(opdef, target)
    if choices and planes:
        tiles = choices["tile"]
        choices["tile"] = tiles[:1] + planes[:2] + tiles[1:] + planes[2:]
    if choices and winograd_rewrite_applies(opdef, target):   # the first knob: a short search's first batch tries it
        choices = {"algorithm": list(ALGORITHMS), **choices}
    return choices


def schedule_conv_nchw_recipe(opdef, target=None, epilogue=None, fuse_epilogue: bool = True, tile=None,
                              channel_blocks_first: bool | None = None, input_block: int | None = None,
                              taps: bool | None = None, pack_per_block: bool | None = None,
                              subsample: bool | None = None, algorithm: str = "direct") -> Schedule:
    """schedule_conv_nchw, or schedule_conv_nchw_plane for a ["plane", FB, XB, YB, chunk] tile (whose
    channel blocks always come first: `channel_blocks_first` and `subsample` do not apply), or
    for a Winograd `algorithm` schedule_conv_nchw_winograd (no other choice applies)."""
    if algorithm not in ALGORITHMS:
        raise ScheduleError(f"conv2d_nchw: algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    if algorithm != "direct":
        target = resolve_target(target)
        if not winograd_rewrite_applies(opdef, target):
            raise ScheduleError(f"conv2d_nchw: the Winograd form does not apply to {opdef.params}")
        return schedule_conv_nchw_winograd(opdef, target, epilogue, weights_per_block=algorithm == "winograd_per_block")
    if tile is not None and tile[0] == "plane":
        return schedule_conv_nchw_plane(opdef, target, epilogue, fuse_epilogue, tile=tile[1:4], input_block=input_block,
                                        taps=taps, pack_per_block=pack_per_block, chunk=tile[4])
    return schedule_conv_nchw(opdef, target, epilogue, fuse_epilogue, tile=tile, channel_blocks_first=channel_blocks_first,
                              input_block=input_block, taps=taps, pack_per_block=pack_per_block, subsample=subsample)


def schedule_conv_nchw_plane(opdef, target=None, epilogue=None, fuse_epilogue: bool = True, tile=None,
                             input_block: int | None = None, taps: bool | None = None,
                             pack_per_block: bool | None = None, chunk: int | None = None) -> Schedule:
    """The plane-accumulated schedule (module docstring) with an (FB, XB, YB) register tile.
    `input_block`, `taps`, `pack_per_block` as in schedule_conv_nchw_channels (None: its rules);
    `chunk`: input channels per chunk instead of plane_chunk's (a divisor of them, a multiple of
    the input block)."""
    target = resolve_target(target)
    out = opdef.output
    s = create_schedule(out if epilogue is None else epilogue)
    vl = lanes(target, out.dtype)
    FB, XB, YB = (int(v) for v in (tile or plane_tiles(opdef, target)[0][1:4]))
    _, F, OH, OW = out.shape
    XB, YB = min(XB, OW), min(YB, OH)
    shared = taps_unrolled(opdef, FB // vl, XB, YB, target.capabilities) if taps is None else bool(taps)
    step = input_step(opdef)   # a strided 1x1 convolution copies only the positions it reads
    RB = input_channel_block(opdef, target, shared, bool(step)) if input_block is None else int(input_block)
    C = opdef.inputs[0].shape[1]
    if RB and C % RB:
        RB = 0
    if not RB:
        materialize_pad(s, target)
    if chunk is None:
        chunk = plane_chunk(opdef, target, FB, target.capabilities.l2 // 2, RB)
    elif C % int(chunk) or (RB and int(chunk) % RB):
        raise ScheduleError(f"conv2d_nchw plane tile: a chunk of {chunk} input channels must divide {C}"
                            + (f" and be a multiple of the input block {RB}" if RB else ""))

    # the output: per channel block (parallel), its tiles stored along their rows out of the plane
    st, plane = accumulate_locally(s, out, epilogue, fuse_epilogue, target, order=[0, 2, 3, 1])
    n, f, y, x = st.op.axis
    fo, fi = st.split(f, factor=FB)
    yo, yi = st.split(y, factor=YB)
    xo, xi = st.split(x, factor=XB)
    st.reorder(n, fo, yo, xo, yi, fi, xi)
    st.unroll(yi)
    st.unroll(fi)
    st.vectorize(xi)
    block = fuse_all(st, [n, fo])

    # the plane [n][y][x][f]: the chunks' tiles summed into it (rfactor over the chunks)
    rck, _ = plane.split(plane.op.reduce_axis[0], factor=chunk)
    part = s[s.rfactor(plane.tensor, rck)]
    pn, py, px, pf, pk = plane.leaf_iter_vars
    pyo, pyi = plane.split(py, factor=YB)
    pxo, pxi = plane.split(px, factor=XB)
    plane.reorder(pn, pk, pyo, pxo, pyi, pxi, pf)
    plane.unroll(pyi)
    plane.unroll(pxi)
    plane.vectorize(pf)
    plane.compute_at(st, block)

    # the register tile: one chunk's channels and taps, as a channel tile reduces them
    tk, tn, ty, tx, tf = part.op.axis
    rc, ry, rx = part.op.reduce_axis
    rax = [rc, ry, rx] if shared and not RB else [ry, rx, rc]
    if RB:
        rco, rci = part.split(rc, factor=RB)
        rax = [a if a is not rc else rco for a in rax] + [rci]
    part.reorder(tk, tn, *rax, ty, tx, tf)
    for a in (tk, tn, ty, tx):
        part.unroll(a)
    part.vectorize(tf)
    tile_statements = (FB // vl) * XB * YB
    if RB and not unrolled_fits(tile_statements, RB):
        unroll_inner_reduction(part, [a for a in rax if a.extent == 1])
    else:
        unroll_inner_reduction(part, rax, tile_statements)
    part.compute_at(plane, pxo)

    parallel_for = lambda work: want_parallel(target, work)   # noqa: E731
    if RB:
        block_input_channels(s, part, opdef.inputs[0], RB, parallel_for, step=step)
    elif step:
        subsample_input(s, part, opdef.inputs[0], step, target)
    if pack_per_block is None:
        pack_per_block = packing_per_block_pays(opdef, target, FB)
    if pack_per_block and FB < F:   # each block's panel packed inside its block's iteration
        panel = pack_weight_panels(s, part, opdef.inputs[1], FB, vl, lambda work: False)
        panel.compute_at(st, block)
    else:
        pack_weight_panels(s, part, opdef.inputs[1], FB, vl, parallel_for)
    if want_parallel(target, opdef.flops) and block.extent > 1:
        st.parallel(block)
    return s


__all__ = ["schedule_conv_nchw_plane", "schedule_conv_nchw_recipe", "schedule_conv_nchw_default", "winograd_by_default",
           "conv2d_nchw_recipe_choices", "plane_tiles", "plane_chunk", "plane_pays"]
