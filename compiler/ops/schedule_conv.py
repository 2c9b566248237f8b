"""Default schedules for conv2d_nchw, conv2d_nhwc and depthwise_conv2d_nchw: register tiles.

A convolution is computed in output tiles whose accumulators stay in vector registers for the
whole reduction (cache_write into a local tile computed at the tile loop, the reduction loops
outside the unrolled tile axes and the vector axis): each reduction step is a few loads and
FB·YB·XB/lanes FMAs.

- NHWC: the vector axis is the output channel f (unit stride in the output and the weights); a
  tile is YB rows × XB columns × FB channels, each input element one scalar broadcast whatever
  the stride or dilation. The HWIO weights are packed into [F/FB][KH][KW][C][FB] panels so a
  tile's weights are one sequential stream. With groups, f is split by the channels per group
  first, so the group's input channel offset is a loop variable, not a per-lane gather.
- NCHW (and depthwise): channels are unit stride nowhere, so the vector axis is the output
  column x; a tile is FB channels × YB rows × XB columns, weights are broadcasts, inputs unit-
  stride vector loads. For a column stride s > 1 the padded input is first copied into
  [.., h, w % s, w // s] order (two blocked cache_reads) so those loads stay unit-stride.

Tile choice (pick_tile): the vector length is 1 or 2 full registers dividing the axis (or 7
of 8 lanes for 7/14/28-wide rows); as many accumulators as the target's register file holds
beside the operands (12 of AVX2's 16 registers, 28 of 32), scored by a small throughput model
(FMAs per cycle of the target's pipes, loads per step, FMA latency). A vector
axis that overhangs the output makes every micro-kernel load a clamped gather (3-5x slower), so
it never does when avoidable; unrolled channel (and NHWC row/column) axes may overhang, their
clamps are scalar. Tiles are walked channel-block outermost when the weights outweigh the
input (and always for depthwise, whose channels share no input), else spatially, so the larger
operand streams from memory once. The padding stage is materialized at the root.
"""

from __future__ import annotations

import numpy as np

from ..schedule import Schedule, create_schedule
from ..target import resolve_target
from .schedule_common import divisors, fuse_all, lanes, parallel_loop, want_parallel
from .schedule_elementwise import schedule_injective_stage, schedule_pad_stage

RED_UNROLL = 4  # a long innermost reduction loop is unrolled by this
FMA_LATENCY = 4  # cycles
LOADS_PER_CYCLE = 2  # load ports of the x86 and Neoverse cores the cpu table lists
MAX_UNROLLED_TAPS = 8  # a reduction loop this short is unrolled whole
SHORT_VECTOR_LANES = 8  # registers this short take channel vectors for a few input channels (channel_vectors_pay)
LONG_ROW_REGISTERS = 6  # an output row this many registers long keeps column vectors (depthwise, short reductions)
SHORT_REDUCTION = 256  # multiply-adds per output below which long rows keep column vectors (channel_vectors_pay)
INPUT_BLOCK = 8  # channels per block of a channel-vector conv's NCHWc input copy (input_channel_block)
MAX_UNROLLED_PACK = 72  # statements of a weight-panel copy's unrolled inner loops (8 channels x 3x3)
MAX_UNROLLED_STEP = 128  # vector statements of an unrolled reduction step around a tile (unrolled_fits)


def vector_tiles(extent: int, vl: int) -> list:
    """Candidate vector lengths along an output axis: 2 or 1 full registers when they divide
    the axis, a divisor of at least half a register (7 of 8 lanes for a 28- or 7-wide row), or
    else one register with an overhanging tail. Accumulators of other lengths (24, 28 lanes) do
    not stay in registers: LLVM splits the loop-carried vector into pieces each step."""
    out = [k * vl for k in (2, 1) if extent % (k * vl) == 0]
    if extent <= vl:
        out.append(extent)
    else:
        best = max((d for d in divisors(extent) if d <= vl), default=1)
        if 2 * best >= vl:
            out.append(best)
    return out or [vl]


def pick_tile(vec_tiles: list, vl: int, dims: list, cost, caps, latency: int = FMA_LATENCY) -> tuple:
    """(vector length, unroll factors of the non-vector tile axes `dims`).

    `dims` = [(extent, cap, may_overhang)]: a factor ≤ cap, a divisor of the extent unless the
    axis may overhang the output (its reads are clamped scalars, not gathers; the extra rows are
    wasted work). Among tiles whose accumulators fit the target's accumulator registers and whose
    accumulators + live operands fit its vector registers (`caps`, the target's capabilities),
    the most useful FMAs per cycle win, then the least work wasted on overhanging rows and
    columns (on AVX2 a 7x7 map's 8-channel x 7-column tile, 7 chains just hiding the FMA latency,
    ran 3x3 layers 18-27% faster than a 16 x 4 one that wastes an eighth; 1x1 layers -8..+8%),
    then the most accumulators, then the fewest live operand
    registers (what is left is LLVM's: with 32 registers a 16 x 1 channel x row tile runs 20-50%
    faster than a 4 x 4 one of as many accumulators), then the fewest loads;
    `cost(vregs, factors)` gives (loads, live vector registers) per reduction step; `latency`:
    the cycles an accumulator waits between updates (FMA_LATENCY, or what a schedule measured).
    """
    best, best_key = (vec_tiles[0], [1] * len(dims)), None
    for key, vt, combo in _feasible_tiles(vec_tiles, vl, dims, cost, caps, latency):
        if best_key is None or key > best_key:
            best, best_key = (vt, list(combo)), key
    return best


def feasible_tiles(vec_tiles: list, vl: int, dims: list, cost, caps) -> list:
    """Every (vector length, factors) pick_tile weighs (the tiles whose accumulators and live
    operands fit the registers), best first by its ranking: the tuner's choices of a tile."""
    ranked = sorted(_feasible_tiles(vec_tiles, vl, dims, cost, caps, FMA_LATENCY), key=lambda t: t[0], reverse=True)
    return [(vt, list(combo)) for _, vt, combo in ranked]


def _feasible_tiles(vec_tiles, vl, dims, cost, caps, latency):
    for vt in vec_tiles:
        vregs = -(-vt // vl)
        for combo in _combos(dims):
            acc, useful = vregs, float(vregs)
            for c, (ext, _, _) in zip(combo, dims):
                acc *= c
                useful *= ext / -(-ext // c)
            loads, live = cost(vregs, combo)
            if acc > caps.accumulator_registers or acc + live + 1 > caps.vector_registers:
                continue
            # a step issues acc FMAs and `loads` loads, as many per cycle as the core starts, and
            # each accumulator waits `latency` cycles for its previous update
            cycles = max(acc / caps.fmas_per_cycle, loads / LOADS_PER_CYCLE, latency)
            yield (round(useful / cycles, 3), round(useful / acc, 3), acc, -live, -loads, vt, combo), vt, combo


def _combos(dims):
    if not dims:
        yield ()
        return
    (ext, cap, overhang), rest = dims[0], dims[1:]
    for d in range(1, min(cap, ext) + 1):
        if ext % d == 0 or overhang:
            for tail in _combos(rest):
                yield (d,) + tail


def unroll_inner_reduction(stage, rax, tile_statements: int = 1):
    """Unroll the innermost non-trivial reduction loop (a 3-tap row fully, a long channel loop
    by 4): fewer loop branches between the tile's FMAs, +10-15% on 1x1 convolutions. Only while
    the unrolled step, `tile_statements` vector FMAs per iteration, stays within
    MAX_UNROLLED_STEP (unrolled_fits): a 7-tap row around a 24-accumulator depthwise tile was
    too much code to build."""
    inner = [a for a in rax if a.extent > 1]
    for a in rax:
        if a.extent == 1:
            stage.unroll(a)
    if not inner:
        return
    a = inner[-1]
    if a.extent <= MAX_UNROLLED_TAPS:
        if unrolled_fits(tile_statements, a.extent):
            stage.unroll(a)
    elif a.extent % RED_UNROLL == 0 and unrolled_fits(tile_statements, RED_UNROLL):
        _, ai = stage.split(a, factor=RED_UNROLL)
        stage.unroll(ai)


def unrolled_fits(tile_statements: int, steps: int) -> bool:
    """Whether `steps` iterations of a reduction loop unrolled around a register tile of
    `tile_statements` vector FMAs stay within MAX_UNROLLED_STEP statements, the bound the
    tuner's spaces keep too. Also the inner channel loop of an input copied in channel blocks
    (red_block): AVX-512's 28-accumulator tile unrolled 8 times came to 22k expression nodes,
    past what the lowering compiles (res3's 128-channel 3x3 failed to build on znver4); a
    rolled loop of 28 FMAs a step loses nothing to its branch."""
    return tile_statements * steps <= MAX_UNROLLED_STEP


def weights_dominate(opdef) -> bool:
    """Walk the output-channel tiles outermost when the weights are the bigger operand (deep
    layers: 9.4 MB of 3x3x512x512 weights against a 100 KB input), so each channel block's
    weights are read from memory once while every spatial tile uses them from L2; otherwise
    the spatial tiles go outermost and the whole (smaller) weight tensor stays in L2."""
    data, weight = opdef.inputs
    return weight.shape[0] * int(_prod(weight.shape[1:])) > int(_prod(data.shape))


def _prod(xs):
    p = 1
    for x in xs:
        p *= x
    return p


def materialize_pad(s, target):
    for st in s.stages:
        if st.op.name == "pad":
            schedule_pad_stage(st, target)


def schedule_conv_nchw(opdef, target=None, epilogue=None, fuse_epilogue: bool = True, tile=None,
                       channel_blocks_first: bool | None = None, input_block: int | None = None,
                       taps: bool | None = None, pack_per_block: bool | None = None,
                       subsample: bool | None = None) -> Schedule:
    """conv2d_nchw and depthwise_conv2d_nchw: vector over x, unrolled over f and y (or, where
    channel_vectors_pay, schedule_conv_nchw_channels).

    `epilogue`: the output of a fused compute (compiler/ops/schedule_anchor.py), one elementwise
    stage of the convolution's shape reading it (bias, residual add, activation); the register
    tiles are stored through it instead of into the convolution's own output (or, without
    `fuse_epilogue`, into the convolution's output, the epilogue a pass of its own).

    The tuner's choices (conv2d_nchw_choices; None: this module's rule): `tile`, ["channels", FB,
    XB, YB] or ["columns", XB, FB, YB], the vector axis and the register tile;
    `channel_blocks_first`, the channel tiles outermost (weights read once) or the spatial ones;
    `input_block`, the channels of a channel tile's NCHWc input copy (0: none); `taps`, whether a
    channel tile unrolls the taps inside the channel loop (taps_unrolled); `pack_per_block`,
    whether its weight panels are packed per channel block (packing_per_block_pays);
    `subsample`, whether a strided 1x1 convolution's channel tile reads a compact copy of the
    input positions it uses (input_step; column tiles always do)."""
    target = resolve_target(target)
    mode = tile[0] if tile is not None else None
    if mode == "channels" or (mode is None and (channel_vectors_pay(opdef, target) or opdef.inputs[1].ndim == 5)):
        return schedule_conv_nchw_channels(opdef, target, epilogue, fuse_epilogue, tile=tile[1:] if tile else None,
                                           channel_blocks_first=channel_blocks_first, input_block=input_block,
                                           taps=taps, pack_per_block=pack_per_block, subsample=subsample)
    if mode is None and depthwise_channel_vectors(opdef, target):
        return schedule_depthwise_channels(opdef, target, epilogue, fuse_epilogue)
    out = opdef.output
    s = create_schedule(out if epilogue is None else epilogue)
    XB, FB, YB = column_tile(opdef, target) if tile is None else (int(v) for v in tile[1:])
    if channel_blocks_first is None:
        channel_blocks_first = opdef.name != "conv2d_nchw" or weights_dominate(opdef)
    order = [1, 2, 3] if channel_blocks_first else [3, 2, 1]
    acc = register_tile(s, out, [(1, FB), (2, YB)], 3, XB, target, opdef.flops, outer_order=order,
                        epilogue=epilogue, fuse_epilogue=fuse_epilogue)
    prepare_conv_input(s, acc, opdef, target)
    return s


def _column_tile_problem(opdef, target) -> tuple:
    """pick_tile's arguments for a column-vector tile: (vector lengths, lanes, dims, cost)."""
    out = opdef.output
    vl = lanes(target, out.dtype)
    N, F, OH, OW = out.shape
    KW = opdef.params["KW"]
    groups = opdef.params.get("groups", 1)
    fpg = F // groups if opdef.name == "conv2d_nchw" else opdef.params.get("multiplier", 1)
    # per step: FB weight broadcasts and YB·xregs input vectors, kept live across the FB channels
    # for each of the KW unrolled taps; rows that overhang cost more than their waste (more row
    # pointers live), channels do not
    taps = KW if KW <= MAX_UNROLLED_TAPS else 1
    return (vector_tiles(OW, vl), vl, [(F, min(fpg, 16), True), (OH, 8, False)],
            lambda r, c: (c[0] + c[1] * r, c[1] * r * taps if c[0] > 1 else 1))


def column_tile(opdef, target) -> tuple:
    """(XB, FB, YB) of a column-vector tile: columns (the vector), channels and rows."""
    vec, vl, dims, cost = _column_tile_problem(opdef, target)
    XB, (FB, YB) = pick_tile(vec, vl, dims, cost, target.capabilities)
    return XB, FB, YB


MAX_NCHW_TILE_CHOICES = 6  # register tiles of each vector axis the tuner tries (conv2d_nchw_choices)


def conv2d_nchw_choices(opdef, target) -> dict:
    """The choices schedule_conv_nchw takes, each knob's values with the default first (the
    tuner's recipe sketch samples them, tuner/space/sketch/recipe.py): `tile`, the default's
    register tile, then the other tiles of its vector axis that fit the registers as pick_tile
    ranks them, then the best of the other axis (MAX_NCHW_TILE_CHOICES each); the walk order of
    the tiles; for channel tiles, the NCHWc input copy, the taps' unrolling and packing the
    weights per channel block, each None (the rule, which depends on the tile) or forced. Empty
    for a depthwise convolution vectorized over channels (its schedule takes no choices)."""
    target = resolve_target(target)
    prepacked = opdef.inputs[1].ndim == 5
    channels_default = prepacked or channel_vectors_pay(opdef, target)
    if opdef.name != "conv2d_nchw" or (not channels_default and depthwise_channel_vectors(opdef, target)):
        return {}
    vl = lanes(target, opdef.output.dtype)
    groups = opdef.params.get("groups", 1)
    chans = []
    if prepacked or (opdef.output.shape[1] // groups) % vl == 0:
        fb = opdef.inputs[1].shape[-1] if prepacked else None
        # the choices include the 2-register channel blocks the default leaves out for their panel's
        # size (channel_tile): with the panels packed per block, res5's 3x3 ran 126-130 GFLOPS with a
        # 32 x 7 x 1 tile against 124-127 with the default's 16 x 7 x 1 (cascadelake's 1 MB L2)
        chans = _tile_choices("channels", channel_tile(opdef, target, fb),
                              _channel_tile_problem(opdef, target, fb, panel_in_l2=False), target)
    cols = []
    if not prepacked:
        cols = _tile_choices("columns", column_tile(opdef, target), _column_tile_problem(opdef, target), target)
    first, second = (chans, cols) if channels_default else (cols, chans)
    choices: dict[str, list] = {"tile": first + second}
    dominate = weights_dominate(opdef)
    choices["channel_blocks_first"] = [dominate, not dominate]
    if chans:   # each forced value the opposite of the rule's for the first channel tile
        C = opdef.inputs[0].shape[1]
        fb, xb, yb = (int(v) for v in chans[0][1:])
        shared = taps_unrolled(opdef, fb // vl, xb, yb, target.capabilities)
        if groups == 1 and C % INPUT_BLOCK == 0 and C > INPUT_BLOCK:
            rule = input_channel_block(opdef, target, shared, bool(input_step(opdef)))
            choices["input_block"] = [None, 0 if rule else INPUT_BLOCK]
        choices["taps"] = [None, not shared]
        if input_step(opdef):
            choices["subsample"] = [None, False]
        if not prepacked:
            choices["pack_per_block"] = [None, not packing_per_block_pays(opdef, target, fb)]
    return choices


def _tile_choices(axis: str, default: tuple, problem: tuple, target) -> list:
    """[axis, *tile] of the default tile, then the other tiles pick_tile's `problem` (vector
    lengths, lanes, dims, cost) finds feasible, as it ranks them, MAX_NCHW_TILE_CHOICES in all."""
    vec, vl, dims, cost = problem
    out = [[axis, *default]]
    for vt, factors in feasible_tiles(vec, vl, dims, cost, target.capabilities):
        tile = [axis, vt, *factors]
        if tile not in out:
            out.append(tile)
    return out[:MAX_NCHW_TILE_CHOICES]


def channel_vectors_pay(opdef, target) -> bool:
    """Whether conv2d_nchw vectorizes over output channels (schedule_conv_nchw_channels) rather
    than output columns: when a group's output channels fill whole registers and its input
    channels make a reduction of at least a register's length. Measured on a 2-core AVX-512
    host (rocketlake, ResNet-50's 18 layers past the stem against oneDNN): 1.01-1.56x with
    channel vectors against 0.52-1.19x with column vectors; the 3-channel stem, where a 3-long
    reduction per tap cannot hide its loop, kept column vectors there (1.13x). With registers
    of 8 lanes or fewer, a few input channels suffice when the window makes the reduction a
    register long: column vectors then need two loads per 16 columns for every broadcast weight,
    and the RGB stem (7x7/2) ran 115 GFLOPS with column vectors against 178 with channel vectors
    (oneDNN 165; znver3, 2 threads). But where output rows are unit-stride whole registers, at
    least LONG_ROW_REGISTERS of them, and the reduction is short (under SHORT_REDUCTION
    multiply-adds per output), a channel tile's stores (each channel's few columns, transposed
    out of the registers) cost more than its FMAs hide, and column vectors store whole lines:
    MobileNetV2's 1x1 layers at 112x112 and 56x56 ran 110-160 GFLOPS with columns against 86-126
    (16->96, 24->144, 96->24, 144->24), ResNet's 64->256 at 56x56 128 against 118; with 256
    input channels or a 3x3 window the channel tile keeps up (121 against 115, 156 against 149;
    znver3, 2 threads)."""
    if opdef.name != "conv2d_nchw":
        return False
    vl = lanes(target, opdef.output.dtype)
    groups = opdef.params.get("groups", 1)
    F, C = opdef.output.shape[1], opdef.inputs[0].shape[1]
    if (F // groups) % vl:
        return False
    window = opdef.params["KH"] * opdef.params["KW"]
    OW = opdef.output.shape[3]
    if (opdef.params["stride"][1] == 1 and OW % vl == 0 and OW >= LONG_ROW_REGISTERS * vl
            and (C // groups) * window < SHORT_REDUCTION):
        return False   # long unit-stride rows, a short reduction: the transposed stores dominate
    return C // groups >= vl or (vl <= SHORT_VECTOR_LANES and (C // groups) * window >= vl)


def schedule_conv_nchw_channels(opdef, target=None, epilogue=None, fuse_epilogue: bool = True, tile=None,
                                channel_blocks_first: bool | None = None, input_block: int | None = None,
                                taps: bool | None = None, pack_per_block: bool | None = None,
                                subsample: bool | None = None) -> Schedule:
    """conv2d_nchw with the output channels as the vector axis (NCHWc-style): a tile is FB
    channels (1 or 2 registers) x XB columns x YB rows, each reduction step FB/lanes weight
    vectors and XB*YB input broadcasts. Every lane is used whatever the image width (a 7-wide
    row fills 7 of 16 lanes when the columns are the vector), and a stride or dilation is only
    another broadcast address. The OIHW weights are packed into [F/FB][C][KH][KW][FB] panels
    (unit-stride weight vectors), the accumulators laid out [y][x][f] (cache_write order) so each
    is a register, and the tile is stored along its rows (unit-stride stores of XB columns; the
    code generator reads the register tile across its channel vectors lane by lane, which LLVM
    turns into shuffles). Storing channel vectors instead is a 16-lane scatter per vector: 0.89x
    oneDNN against 1.09x on res2's 64->256 1x1, where 64 channels give a short reduction.

    Reduction order (taps_unrolled): when a row of taps' inputs fits in the registers beside the
    accumulators, the taps are unrolled inside the channel loop and a broadcast serves up to KW
    taps (res5's 7x7 maps: 1.10x oneDNN against 1.01x on rocketlake); otherwise LLVM would still
    share them and spill the accumulators (res4 3x3 on rocketlake: 0.47x), so the channel loop
    goes innermost (ry, rx, rc: 1.02x)."""
    target = resolve_target(target)
    out = opdef.output
    s = create_schedule(out if epilogue is None else epilogue)
    vl = lanes(target, out.dtype)
    groups = opdef.params.get("groups", 1)
    fpg = out.shape[1] // groups
    prepacked = opdef.inputs[1].ndim == 5   # conv2d_nchw_packed: the weights come in FB blocks
    if tile is None:
        FB, XB, YB = channel_tile(opdef, target, opdef.inputs[1].shape[-1] if prepacked else None)
    else:
        FB, XB, YB = (int(v) for v in tile)
    if channel_blocks_first is None:
        channel_blocks_first = weights_dominate(opdef)
    order = [1, 2, 3] if channel_blocks_first else [2, 3, 1]
    shared = taps_unrolled(opdef, FB // vl, XB, YB, target.capabilities) if taps is None else bool(taps)
    step = input_step(opdef) if subsample is None or subsample else None
    RB = input_channel_block(opdef, target, shared, bool(step)) if input_block is None else int(input_block)
    red_order = None if shared and not RB else [1, 2, 0]
    if not RB:
        materialize_pad(s, target)
    if pack_per_block is None:
        pack_per_block = packing_per_block_pays(opdef, target, FB)
    per_block = channel_blocks_first and pack_per_block and not prepacked and FB < fpg
    block_loop: list = []
    acc = register_tile(s, out, [(2, YB), (3, XB)], 1, FB, target, opdef.flops, outer_order=order,
                        vec_group=fpg if groups > 1 else 0, red_order=red_order, store_dim=3, epilogue=epilogue,
                        fuse_epilogue=fuse_epilogue, red_block=RB, block_loop=block_loop if per_block else None)
    parallel_for = lambda work: want_parallel(target, work)   # noqa: E731
    if RB:
        block_input_channels(s, acc, opdef.inputs[0], RB, parallel_for, step=step)
    elif step:
        subsample_input(s, acc, opdef.inputs[0], step, target)
    if not prepacked:
        if block_loop:   # each block's panel packed inside its block's iteration, serially
            panel = pack_weight_panels(s, acc, opdef.inputs[1], FB, vl, lambda work: False)
            stored, loop = block_loop[0]
            panel.compute_at(stored, loop)
        else:
            pack_weight_panels(s, acc, opdef.inputs[1], FB, vl, parallel_for)
    return s


PANEL_PER_BLOCK_BYTES = 1 << 20   # weights above this are packed per channel block (packing_per_block_pays)


def packing_per_block_pays(opdef, target, fb: int) -> bool:
    """Whether a channel tile's weight panels are packed inside the loop over channel blocks, one
    block's panel at a time into a buffer that stays in cache, rather than all of them into a
    second copy of the weights before the convolution: where the weights are large (over
    PANEL_PER_BLOCK_BYTES), that copy is written to memory and read back, three passes over
    the weights instead of one (res5's 1x1/2 downsample, 8 MB of weights: a fifth of its time
    went to packing). The blocks then are the parallel loop, so there must be several per core."""
    weight = opdef.inputs[1]
    nbytes = int(_prod(weight.shape)) * np.dtype(weight.dtype).itemsize
    blocks = opdef.output.shape[1] // fb
    return nbytes > PANEL_PER_BLOCK_BYTES and blocks >= 4 * resolve_target(target).num_cores


def depthwise_channel_vectors(opdef, target) -> bool:
    """Whether a depthwise convolution (depthwise_conv2d_nchw with one filter per channel, or
    conv2d_nchw with a group per channel, as ONNX models say it) is vectorized over its
    channels (schedule_depthwise_channels): when the channels fill whole registers, unless the
    output rows are long and unit-stride (at least LONG_ROW_REGISTERS registers), where column
    vectors use every lane and need no copies: with a 9-tap reduction, the channel tile's
    input copy and transposed store cost as much as its FMAs. MobileNetV2's layers on znver3
    (2 threads): 112x112 stride 1 ran 59 GFLOPS with columns against 13 with channels, 56x56
    50 against 42; 28x28 24 against 44, 14x14 23 against 36, 7x7 22 against 29, and every
    stride-2 layer 7-11 against 14-20."""
    C = opdef.inputs[0].shape[1]
    if opdef.name == "depthwise_conv2d_nchw":
        one_each = opdef.params.get("multiplier", 1) == 1
    else:
        one_each = opdef.name == "conv2d_nchw" and opdef.params.get("groups", 1) == C == opdef.output.shape[1]
    vl = lanes(target, opdef.output.dtype)
    long_rows = opdef.params["stride"][1] == 1 and opdef.output.shape[3] >= LONG_ROW_REGISTERS * vl
    return one_each and C % vl == 0 and not long_rows


def schedule_depthwise_channels(opdef, target=None, epilogue=None, fuse_epilogue: bool = True) -> Schedule:
    """A depthwise convolution vectorized over channels, as the libraries do (NCHWc): the input
    copied into [C/lanes][N][H][W][lanes] blocks (padding inside the copy), the weights into
    [C/lanes][1][KH][KW][lanes] panels, and a tile of XB columns x YB rows of one channel vector
    whose every tap is one weight vector and XB*YB unit-stride input vectors. With the columns
    as the vector (schedule_conv_nchw), MobileNetV2's 7x7 and 14x14 maps filled 7 of 8 lanes or
    overhung, one broadcast weight per tap and channel: 23 GFLOPS. The tile is stored along its
    rows like schedule_conv_nchw_channels'."""
    target = resolve_target(target)
    out = opdef.output
    s = create_schedule(out if epilogue is None else epilogue)
    vl = lanes(target, out.dtype)
    _, F, OH, OW = out.shape
    _, (XB, YB) = pick_tile([vl], vl, [(OW, 8, True), (OH, 4, True)], lambda r, c: (c[0] * c[1] + r, r),
                            target.capabilities)
    acc = register_tile(s, out, [(2, YB), (3, XB)], 1, vl, target, opdef.flops, outer_order=[1, 2, 3],
                        store_dim=3, epilogue=epilogue, fuse_epilogue=fuse_epilogue)
    parallel_for = lambda work: want_parallel(target, work)   # noqa: E731
    block_input_channels(s, acc, opdef.inputs[0], vl, parallel_for)
    pack_weight_panels(s, acc, opdef.inputs[1], vl, vl, parallel_for)
    return s


def input_channel_block(opdef, target, taps_shared: bool, subsampled: bool = False) -> int:
    """Channels per block of the NCHWc copy of a channel-vector conv's input (0: no copy).

    Where the weights dominate (res4, res5: 7x7 and 14x14 maps, 256-2048 channels) a tile's
    broadcasts walk the input one channel plane apart (196 bytes on a 7x7 map), each touching a
    new cache line for a few floats, and the whole input is re-read from beyond L2 for every
    channel block. Copied once into [C/RB][N][H][W][RB] blocks of a register's lanes, the
    reduction's inner RB channels (INPUT_BLOCK, 32 bytes of float32 on every target, unrolled)
    read consecutive floats: with prepacked weights, res5's 1x1
    2048>512 ran 123 GFLOPS against 65 (oneDNN 106; znver3, 2 threads), res4's 3x3 132 against
    84. Not where the input is the bigger operand (res2, res3: the copy costs what it saves),
    nor for grouped convolutions, nor where the taps share their broadcasts in registers
    (taps_unrolled with a window wider than 1x1), which orders the reduction its own way.
    A strided 1x1 convolution's input is `subsampled` (subsample_input) whatever the operands'
    sizes, and blocking that copy costs nothing more: res3's 1x1/2 downsample ran 147-160
    GFLOPS blocked against 111-118 (oneDNN 118-122; cascadelake, 2 threads)."""
    KH, KW = opdef.params["KH"], opdef.params["KW"]
    C = opdef.inputs[0].shape[1]
    if opdef.params.get("groups", 1) != 1 or C % INPUT_BLOCK or C == INPUT_BLOCK:
        return 0
    if subsampled:
        return INPUT_BLOCK
    if not weights_dominate(opdef):
        return 0
    if taps_shared and KH * KW > 1:
        return 0
    return INPUT_BLOCK


def block_input_channels(s, acc, data, block: int, want_parallel_for, step: dict | None = None):
    """The conv's (padded) input copied into [C/block][N][H][W][block] for `acc`, the padding
    inlined into the copy (`step`, input_step's {axis: stride}: only the positions a strided 1x1
    convolution reads). The copy walks each block's rows with the channels unrolled inside
    the columns: 'block' reads one plane apart that the next column reuses, one contiguous
    store. `want_parallel_for(work)` decides its parallel loop. Shared with the conv template."""
    pad = next((st for st in s.stages if st.op.name == "pad"), None)
    src = pad.tensor if pad is not None else data
    st = s[s.cache_read(src, "global", [acc], block={1: block}, stride=step)]
    if pad is not None:
        pad.compute_inline()
    return schedule_block_copy(st, want_parallel_for)


def schedule_block_copy(st, want_parallel_for):
    """A copy blocked along one axis ([outer block, *rows, columns, inner block]): the inner
    block unrolled inside the column loop, the outer block and rows fused (parallel when
    `want_parallel_for(elements)`). Shared with the sketch space's block_input."""
    ob, *middle, ib = st.op.axis
    st.unroll(ib)
    rows = [ob] + middle[:-1]
    loop = st.fuse(*rows) if len(rows) > 1 else rows[0]
    if loop.extent > 1 and want_parallel_for(int(_prod(st.op.shape))):
        st.parallel(loop)
    return st


PACK_CHANNEL_STEP = 8  # input channels a weight-panel copy reads per output channel


def pack_weight_panels(s, acc, weight, block: int, lanes: int, want_parallel_for):
    """OIHW weights copied into [F/block][C][KH][KW][block] panels for `acc`, by
    schedule_weight_panels (`lanes`: the target's vector length for the weights' dtype). Shared
    with the conv template."""
    packed = s.cache_read(weight, "global", [acc], block={0: block}, merge=panel_merge(weight, block, lanes))
    return schedule_weight_panels(s, packed, lanes, want_parallel_for)


def panel_merge(weight, block: int, lanes: int) -> list | None:
    """cache_read's `merge` for a KxK filter's weight panels ([1, last]: input channels and taps
    joined, [F/block][C·KH·KW][block]) where the joined axis and the block are whole registers
    of 4-byte elements, so schedule_transposed_panels transposes the copy lanes x lanes in
    registers as it does a 1x1 filter's; None otherwise (1x1 filters need no joining). Row by
    row, res5's 3x3 weights (9.4 MB) were copied at 5 GB/s, a third of the layer's time with
    the panels packed per call; transposed, 12 GB/s (cascadelake, 2 threads; a plain memcpy
    there: 9-10 GB/s on one thread)."""
    taps = int(_prod(weight.shape[2:]))
    if (weight.ndim < 3 or taps == 1 or lanes <= 1 or block % lanes or (weight.shape[1] * taps) % lanes
            or np.dtype(weight.dtype).itemsize != 4):
        return None
    return [1, weight.ndim - 1]


def schedule_weight_panels(s, packed, lanes: int, want_parallel_for):
    """The copy of weights into panels (`packed`, a cache_read blocked along the output
    channels): transposed in register tiles (schedule_transposed_panels) where the filter is
    1x1 and the tiles are whole registers of 4-byte elements, else row by row
    (schedule_panel_copy). Shared with the sketch space's packing."""
    st = s[packed]
    fo, c, *taps, fi = st.op.axis
    if (all(a.extent == 1 for a in taps) and lanes > 1 and c.extent % lanes == 0 and fi.extent % lanes == 0
            and np.dtype(packed.dtype).itemsize == 4):
        return schedule_transposed_panels(s, packed, lanes, want_parallel_for)
    return schedule_panel_copy(st, want_parallel_for)


def schedule_transposed_panels(s, packed, lanes: int, want_parallel_for):
    """A 1x1 convolution's [F, C] weights into [F/block][C][block] panels, t x t at a time
    (t = transpose_tile(lanes)): a tile is read as t vectors of consecutive input channels, one
    per output channel, into a local tile (cache_write laid out [output channel][input channel],
    which LLVM keeps in registers), and written as t vectors of consecutive output channels read
    across it, which LLVM turns into shuffles. Row by row (schedule_panel_copy) every element
    was one scalar store, and the copy was half of a deep 1x1 layer's time with its weights
    packed per call: res5's 2048>512 ran 101 GFLOPS that way and 143 this way, 1024>256 161
    and 184 (prepacked: 207; oneDNN 157; znver4, 2 threads).

    Tiles walk the row groups of one step of input channels, except in a 1x1 filter's rows of
    LONG_PANEL_ROW_BYTES or more, where they walk the input channels of one group of t rows:
    such rows lie in the same L1 sets, and a step across a block of them evicted each line
    before its next tile read it (res5's 2048>512 and 1x1/2 downsample, 8 and 4 KB rows: 152-153
    -> 181-188 GFLOPS, znver4, 2 threads). Merged KxK panels (panel_merge) keep the first
    walk: res4's 3x3 layers read slower the other way, but in runs where the same kernels on
    prepacked weights read slower too, so that is not settled."""
    ndim = len(packed.shape)
    local = s.cache_write(packed, "local", order=[0, ndim - 1, *range(1, ndim - 1)])
    st, lst = s[packed], s[local]
    fo, c, *taps, fi = st.op.axis
    tile = transpose_tile(lanes)
    co, ci = st.split(c, factor=tile)
    fio, fii = st.split(fi, factor=tile)
    row_bytes = c.extent * np.dtype(packed.dtype).itemsize
    if taps and row_bytes >= LONG_PANEL_ROW_BYTES:     # taps: the 1x1 filter's unit axes, absent when merged
        st.reorder(fo, fio, co, *taps, ci, fii)
        loop, at = st.fuse(fo, fio), co
    else:
        st.reorder(fo, co, fio, *taps, ci, fii)
        loop, at = st.fuse(fo, co), fio
    for a in (*taps, ci):
        st.unroll(a)
    st.vectorize(fii)
    if loop.extent > 1 and want_parallel_for(int(_prod(packed.shape))):
        st.parallel(loop)
    lst.compute_at(st, at)
    lfo, lfi, lc, *ltaps = lst.op.axis
    for a in (lfo, lfi, *ltaps):
        lst.unroll(a)
    lst.vectorize(lc)
    return st


TRANSPOSE_TILE = 8      # lanes of a weight-panel transpose at most (transpose_tile)
LONG_PANEL_ROW_BYTES = 4096   # source rows this long alias in L1 (schedule_transposed_panels)


def transpose_tile(lanes: int) -> int:
    """The side of schedule_transposed_panels' register tiles: the vector length, at most
    TRANSPOSE_TILE. LLVM transposes 8 x 8 tiles in a few shuffles per vector but 16 x 16 ones
    (AVX-512) in permutes whose index vectors it rematerializes: packing 2048x512 weights took
    0.19 ms that way, 0.09-0.11 ms in 8 x 8 tiles (numpy's copy of them on one thread: 0.1 ms;
    znver4, 2 threads), and 30 % of res5's 1x1 layers went to that packing."""
    return min(lanes, TRANSPOSE_TILE)


def schedule_panel_copy(st, want_parallel_for):
    """A copy blocked along the source's outermost axis ([outer block, c, *rest, lanes]): each
    of the block's rows reads PACK_CHANNEL_STEP steps of c and all of `rest`, consecutive
    floats of the source, into stores a block apart (unrolled when small); the outer block and
    the c steps fused (parallel when `want_parallel_for(elements)`). Vectorizing the lanes would
    gather a block of source rows per vector. Shared with the sketch space's packing."""
    fo, c, *rest, fi = st.op.axis
    step = PACK_CHANNEL_STEP if c.extent % PACK_CHANNEL_STEP == 0 and c.extent > PACK_CHANNEL_STEP else c.extent
    co, ci = st.split(c, factor=step) if step < c.extent else (None, c)
    st.reorder(*[a for a in (fo, co) if a is not None], fi, ci, *rest)
    if step * int(_prod([a.extent for a in rest])) <= MAX_UNROLLED_PACK:
        for a in (ci, *rest):
            st.unroll(a)
    loop = st.fuse(fo, co) if co is not None else fo
    if loop.extent > 1 and want_parallel_for(int(_prod(st.op.shape))):
        st.parallel(loop)
    return st


def channel_tile(opdef, target, fb: int | None = None) -> tuple:
    """(FB, XB, YB) of schedule_conv_nchw_channels' register tile: channels (the vector), columns
    and rows. Per step: YB·XB input broadcasts (one live at a time) and FB/lanes weight vectors
    (all live). `fb` fixes the channel block (weights already packed in blocks of fb).

    A tile's weight panel (C/groups·KH·KW·FB) is read again for every row of the map, so a
    channel block wider than one register takes it only while the panel fits half the L2 (the
    rest holds the input rows and the weights being packed): ResNet-50's res5 3x3 layers, 512
    input channels, took 32-channel tiles whose 590 KB panels came from L3 every row of Zen 4's
    1 MB L2, at 86-110 GFLOPS against 134-140 with 16-channel tiles, same runs (oneDNN 138-188);
    res4's 3x3 and res5's 1x1 layers, 262-295 KB panels, ran the same either way."""
    tiles, vl, dims, cost = _channel_tile_problem(opdef, target, fb)
    FB, (XB, YB) = pick_tile(tiles, vl, dims, cost, target.capabilities)
    return FB, XB, YB


def _channel_tile_problem(opdef, target, fb: int | None = None, panel_in_l2: bool = True) -> tuple:
    """pick_tile's arguments for channel_tile: (channel vector lengths, lanes, dims, cost);
    `panel_in_l2`: channel blocks wider than a register only while their panel fits half the L2."""
    out = opdef.output
    vl = lanes(target, out.dtype)
    _, F, OH, OW = out.shape
    groups = opdef.params.get("groups", 1)
    if fb:
        tiles = [fb]
    else:
        data, weight = opdef.inputs[0], opdef.inputs[1]
        taps = opdef.params["KH"] * opdef.params["KW"]
        row_bytes = (data.shape[1] // groups) * taps * np.dtype(weight.dtype).itemsize   # one channel's panel
        # vector_tiles always offers one register or less, so one candidate is left
        tiles = [t for t in vector_tiles(F // groups, vl)
                 if t <= vl or not panel_in_l2 or t * row_bytes <= target.capabilities.l2 // 2]
    return tiles, vl, [(OW, 8, True), (OH, 4, True)], lambda r, c: (c[0] * c[1] + r, r)


def taps_unrolled(opdef, fregs: int, XB: int, YB: int, caps) -> bool:
    """Whether a channel-vector tile reduces with the taps unrolled inside the channel loop (see
    schedule_conv_nchw_channels): when the registers left beside the accumulators, the weight
    vectors and a broadcast hold a row of taps' inputs for one output. LLVM keeps what else the
    unrolled row shares when it fits and reloads the rest (a broadcast is one load). A tile that
    leaves fewer spills its accumulators instead (res4 3x3 on AVX-512's 28-accumulator tile:
    0.47x). Measured on znver3 (2 threads, against oneDNN): res3 3x3/2 1.08x with the taps
    unrolled against 0.83x, res5 3x3/2 0.92x against 0.66-0.76x, res4 3x3 1.04x against 0.97x,
    where the inputs the row shares (9-12) did not all fit."""
    KW = opdef.params["KW"]
    if KW > MAX_UNROLLED_TAPS:
        return False
    free = caps.vector_registers - fregs * XB * YB - fregs - 1
    return KW <= free


def input_step(opdef) -> dict:
    """{2: sh, 3: sw}, the strides of a 1x1 convolution without padding that reads every
    sh-th row or sw-th column of its NCHW input: the positions a compact copy holds (its reads
    are then those of a unit-stride convolution), which such a convolution reads by default
    (subsample_input), as oneDNN's 'reduce to unit stride' does: the copy is a quarter of the
    input at stride 2 and its rows are read whole; every read of the input otherwise takes one
    float of each pair. ResNet-50's res4 1x1/2 downsample ran 119-135 GFLOPS strided against
    151-173 on a subsampled input (its copy: ~6 % of the layer's time; oneDNN 130-149;
    cascadelake, 2 threads). {} for any other convolution."""
    p = opdef.params
    sh, sw = p["stride"]
    if p["KH"] != 1 or p["KW"] != 1 or any(p["padding"]) or (sh, sw) == (1, 1):
        return {}
    return {a: st for a, st in ((2, sh), (3, sw)) if st > 1}


def subsample_input(s, acc, data, step: dict, target):
    """`data` copied into the compact [N, C, H/sh, W/sw] that `acc` reads (input_step), the copy
    scheduled like a padding stage (parallel rows, the row loop left to LLVM)."""
    schedule_pad_stage(s[s.cache_read(data, "global", [acc], stride=step)], target)


def prepare_conv_input(s, acc, opdef, target):
    """The NCHW conv's input as its micro-kernel `acc` reads it: for a strided 1x1 convolution a
    compact copy of the positions it reads (subsample_input), de-interleaved columns for any
    other column stride above 1, else the padded input materialized."""
    sw = opdef.params["stride"][1]
    step = input_step(opdef)
    if step:
        subsample_input(s, acc, opdef.inputs[0], step, target)
    elif sw > 1:
        deinterleave_padded_columns(s, acc, opdef.inputs[0], sw, target)
    else:
        materialize_pad(s, target)


def deinterleave_columns(s, acc, data, sw: int, pad):
    """Make stride-`sw` column reads unit-stride: the (padded) input is copied once into
    [..., h, w % sw, w // sw] order, two blocked cache_reads ([W/sw, .., sw], then its first
    axis moved last), so output column x, tap rx reads column x + (rx // sw) of phase rx % sw.
    Without it every input vector of the micro-kernel is a gather (3x slower). Returns the
    stage of the copy for the caller to schedule (shared with the tuner's conv templates)."""
    src = pad.tensor if pad is not None else data
    phases = s.cache_read(src, "global", [acc], block={src.ndim - 1: sw})
    packed = s.cache_read(phases, "global", [acc], block={0: phases.shape[0]})
    if pad is not None:
        pad.compute_inline()
    s[phases].compute_inline()
    return s[packed]


def deinterleave_padded_columns(s, acc, data, sw: int, target):
    """deinterleave_columns of the conv's pad stage (if any), the copy scheduled like a pad."""
    pad = next((st for st in s.stages if st.op.name == "pad"), None)
    schedule_pad_stage(deinterleave_columns(s, acc, data, sw, pad), target)


def schedule_conv_nhwc(opdef, target=None) -> Schedule:
    """conv2d_nhwc: vector over f, unrolled over y and x."""
    target = resolve_target(target)
    out = opdef.output
    s = create_schedule(out)
    materialize_pad(s, target)
    vl = lanes(target, out.dtype)
    N, OH, OW, F = out.shape
    groups = opdef.params.get("groups", 1)
    fpg = F // groups
    # per step: YB·XB input broadcasts (one live at a time) and fregs weight vectors (all live)
    FB, (XB, YB) = pick_tile(vector_tiles(fpg if groups > 1 else F, vl), vl,
                              [(OW, 8, True), (OH, 4, True)],
                              lambda r, c: (c[0] * c[1] + r, r), target.capabilities)
    order = [3, 1, 2] if weights_dominate(opdef) else [1, 2, 3]
    acc = register_tile(s, out, [(1, YB), (2, XB)], 3, FB, target, opdef.flops, outer_order=order,
                        vec_group=fpg if groups > 1 else 0)
    # HWIO weights packed into [F/FB][KH][KW][C][FB] panels: a tile's weights become one
    # sequential stream instead of KH·KW·C lines F·4 bytes apart (2x on 28x28x128 layers)
    packed = s.cache_read(opdef.inputs[1], "global", [acc], block={3: FB})
    pst = s[packed]
    *rows, lane = pst.op.axis
    pst.vectorize(lane)
    parallel_loop(pst, rows, None, target, int(_prod(packed.shape)))
    return s


def split_output_tile(st, unrolled, vec_dim: int, vec_factor: int, outer_order, vec_group: int = 0,
                      outer_of: dict | None = None, lead_dim: int | None = None):
    """Split the output stage's axes into [other axes, outer tile loops] [tile axes, vector axis].

    `unrolled` = [(dim, factor)] of the register tile's unrolled axes; `outer_order` orders the
    outer tile loops by dim; `lead_dim`'s outer tile loop, if it has one, goes before all the
    others. Returns (tile dims, {dim: inner loop}, outer loops); `outer_of`, when given, is
    filled with {dim: its outer tile loop}. Shared by the default schedules and the tuner's
    convolution templates.
    """
    axes = list(st.op.axis)
    outer, inner, pre = {}, {}, []
    for dim, factor in unrolled + [(vec_dim, vec_factor)]:
        ax = axes[dim]
        if dim == vec_dim and vec_factor < vec_group < ax.extent and vec_group % vec_factor == 0:
            group, ax = st.split(ax, factor=vec_group)
            pre.append(group)
        if factor < ax.extent:
            outer[dim], inner[dim] = st.split(ax, factor=factor)
        else:
            outer[dim], inner[dim] = None, ax
    if outer_of is not None:
        outer_of.update({d: loop for d, loop in outer.items() if loop is not None})
    tile_dims = [d for d, _ in unrolled] + [vec_dim]
    outer_loops = [axes[d] for d in range(len(axes)) if d not in tile_dims] + pre
    outer_loops += [outer[d] for d in outer_order if outer[d] is not None]
    if lead_dim is not None and outer.get(lead_dim) is not None:
        outer_loops.remove(outer[lead_dim])
        outer_loops.insert(0, outer[lead_dim])
    st.reorder(*outer_loops, *[inner[d] for d in tile_dims])
    return tile_dims, inner, outer_loops


def accumulate_locally(s, out, epilogue, fuse_epilogue: bool, target, order=None):
    """(stored stage, accumulating stage): `out` computed in a local buffer (`order`: its axes'
    layout) and stored through `epilogue` (`out` inlined into it), or stored into `out` with the
    epilogue a pass of its own when not `fuse_epilogue`."""
    acc = s.cache_write(out, "local", order=order)
    if epilogue is not None and epilogue is not out:
        if fuse_epilogue:
            s[out].compute_inline()
            out = epilogue
        else:
            schedule_injective_stage(s[epilogue], target)
    return s[out], s[acc]


def register_tile(s, out, unrolled, vec_dim: int, vec_factor: int, target, work, outer_order=None,
                  vec_group: int = 0, store_dim: int | None = None, red_order=None, epilogue=None,
                  fuse_epilogue: bool = True, red_block: int = 0, unroll_reduction: bool = True,
                  block_loop: list | None = None, lead_dim: int | None = None):
    """Tile the output: [n, outer tiles (parallel)] [tile: unrolled axes, vector axis], with the
    reduction computed at the innermost tile loop into a local buffer laid out with the vector
    axis last (so each vector of accumulators is one register).

    `vec_group`: split the vector axis by this first (channels per group, which the vector tile
    divides), so `f // group` simplifies to the outer loop instead of a per-lane gather index.
    `store_dim`: the axis the tile is stored along, vectorized (default: the vector axis); the
    unit-stride axis of the output when the vector axis is not. `red_order`: the reduction
    loops' order as positions in the definition's (default: as defined). `red_block`: split
    the first reduction loop (the channels) by this and put its inner part innermost, unrolled
    (the input is copied in blocks of as many channels: input_channel_block). `epilogue`: an
    elementwise stage of `out`'s shape that is the schedule's output; the tile is stored
    through it (`out`, now a copy of the tile, is inlined into it); without `fuse_epilogue` the
    tile is stored into `out` and the epilogue is an elementwise pass of its own (for tiles whose
    unrolled store would be too much straight-line code with the epilogue in it).
    `unroll_reduction=False`: the reduction loops stay loops (see schedule_conv_nchwc).
    `block_loop` (a list): where the vector axis's tile loop is the outermost tile loop, the
    loops down to it are fused into the parallel loop and the other tile loops into a serial
    one inside it, and (stored stage, parallel loop) is appended, for a producer to be computed
    once per vector block (pack_per_block); else the list stays empty. `lead_dim`: that dim's
    tile loop outermost instead (before the untiled axes too) and the block loop, as above."""
    ndim = len(out.shape)
    order = [d for d in range(ndim) if d != vec_dim] + [vec_dim]
    st, cst = accumulate_locally(s, out, epilogue, fuse_epilogue, target, order)
    outer_of: dict = {}
    tile_dims, inner, outer_loops = split_output_tile(st, unrolled, vec_dim, vec_factor,
                                                      outer_order or [d for d, _ in unrolled] + [vec_dim],
                                                      vec_group, outer_of=outer_of, lead_dim=lead_dim)
    store = vec_dim if store_dim is None else store_dim
    for d in tile_dims:
        if d != store:
            st.unroll(inner[d])
    if store != vec_dim:   # store rows along the output's unit-stride axis
        st.reorder(*[inner[d] for d in tile_dims if d != store], inner[store])
    st.vectorize(inner[store])
    # the reduction: [reduce loops] [unrolled tile axes] [vector axis]
    cax = [cst.op.axis[order.index(d)] for d in range(ndim)]   # by the output's dimension
    rax = list(cst.op.reduce_axis)
    if red_order is not None:
        rax = [rax[i] for i in red_order]
    if red_block:   # the first reduction loop (channels) split, its inner part innermost
        rc = cst.op.reduce_axis[0]
        rco, rci = cst.split(rc, factor=red_block)
        rax = [rco if a is rc else a for a in rax] + [rci]
    rest = [cax[d] for d in range(len(cax)) if d not in tile_dims]
    cst.reorder(*rest, *rax, *[cax[d] for d in tile_dims])
    for d, _ in unrolled:
        cst.unroll(cax[d])
    cst.vectorize(cax[vec_dim])
    tile_statements = -(-vec_factor // lanes(target, out.dtype))
    for _, factor in unrolled:
        tile_statements *= factor
    if not unroll_reduction:
        unroll_inner_reduction(cst, [a for a in rax if a.extent == 1])
    elif red_block and not unrolled_fits(tile_statements, red_block):
        unroll_inner_reduction(cst, [a for a in rax if a.extent == 1])   # the channel block stays a loop
    else:
        unroll_inner_reduction(cst, rax, tile_statements)
    lead = lead_dim if lead_dim is not None else (vec_dim if outer_order and outer_order[0] == vec_dim else None)
    lead_outer = outer_of.get(lead) if lead is not None else None
    if block_loop is not None and lead_outer is not None:
        cut = outer_loops.index(lead_outer) + 1
        head, tail = fuse_all(st, outer_loops[:cut]), fuse_all(st, outer_loops[cut:])
        cst.compute_at(st, tail if tail is not None else head)
        if want_parallel(target, work) and head.extent > 1:
            st.parallel(head)
        block_loop.append((st, head))
        return cst
    # one loop over all tiles: parallel, and the reduction is computed inside it
    loop = fuse_all(st, outer_loops)
    cst.compute_at(st, loop)
    if want_parallel(target, work) and loop.extent > 1:
        st.parallel(loop)
    return cst


__all__ = ["schedule_conv_nchw", "conv2d_nchw_choices", "column_tile",
           "schedule_conv_nchw_channels", "packing_per_block_pays", "accumulate_locally", "register_tile", "depthwise_channel_vectors",
           "schedule_depthwise_channels", "input_channel_block", "block_input_channels", "input_step",
           "subsample_input",
           "pack_weight_panels", "panel_merge", "schedule_block_copy", "schedule_panel_copy", "schedule_weight_panels",
           "schedule_transposed_panels", "channel_vectors_pay", "channel_tile",
           "taps_unrolled", "unrolled_fits", "schedule_conv_nhwc", "split_output_tile", "deinterleave_columns",
           "deinterleave_padded_columns", "prepare_conv_input", "pick_tile", "vector_tiles",
           "weights_dominate", "materialize_pad", "unroll_inner_reduction", "feasible_tiles"]
