"""conv2d_nchw vectorized over output channels (schedule_conv_nchw_channels) against numpy.

The variant the default schedule picks where channel vectors pay (ResNet's layers on AVX-512):
the tile overhangs rows and columns that no tile divides, strides and dilations become broadcast
addresses, groups split the channel vector, and both reduction orders (taps unrolled inside the
channel loop, or the channel loop innermost) are covered. The cases run on any host: the
schedule sizes its vectors from the host's target, whatever it is.
"""

from __future__ import annotations

import numpy as np
import pytest

from compiler import Target
from compiler.ops import get_op, random_inputs
from compiler.ops.schedule_common import lanes
from compiler.ops.schedule_conv import (
    channel_tile,
    channel_vectors_pay,
    input_channel_block,
    schedule_conv_nchw_channels,
    taps_unrolled,
)
from compiler.runtime import build

HOST = Target.host()
VL = lanes(HOST, "float32")

CASES = [
    dict(N=1, C=VL, H=9, W=11, F=2 * VL, KH=3, KW=3, padding=1),              # rows and columns overhang
    dict(N=2, C=VL + 3, H=13, W=7, F=VL, KH=3, KW=3, stride=2, padding=1),    # batch, stride, odd channels
    dict(N=1, C=VL, H=15, W=15, F=VL, KH=3, KW=3, dilation=2, padding=2),
    dict(N=1, C=2 * VL, H=7, W=7, F=4 * VL, KH=1, KW=1),
    dict(N=1, C=VL, H=10, W=10, F=3 * VL, KH=1, KW=1, stride=2),
    dict(N=1, C=2 * VL, H=8, W=9, F=2 * VL, KH=3, KW=3, padding=1, groups=2),   # a group's channels = one vector
    dict(N=1, C=VL, H=12, W=13, F=2 * VL, KH=5, KW=5, stride=2, padding=(2, 1, 2, 0)),
    dict(N=1, C=VL, H=9, W=9, F=VL, KH=3, KW=3, padding=1, dtype="int8"),
    dict(N=1, C=VL, H=6, W=20, F=VL, KH=7, KW=7, stride=2, padding=3),
    # weights outweigh the input (res4/res5-like): the input is copied into channel blocks
    dict(N=1, C=40, H=7, W=7, F=8 * VL, KH=1, KW=1),
    dict(N=1, C=16, H=9, W=9, F=12 * VL, KH=1, KW=1, stride=2),
    dict(N=2, C=24, H=6, W=5, F=2 * VL, KH=3, KW=3, stride=2, padding=1),
    dict(N=1, C=24, H=5, W=6, F=4 * VL, KH=3, KW=3, padding=(1, 0, 2, 1)),
    dict(N=1, C=16, H=4, W=4, F=2 * VL, KH=3, KW=3, padding=1, dtype="int8"),
    dict(N=1, C=3, H=19, W=21, F=2 * VL, KH=7, KW=7, stride=2, padding=3),   # an RGB stem
    # ResNet's res3 3x3: on AVX-512 a 28-accumulator tile, the taps outside a rolled channel block
    # (unrolled_fits: unrolled, it was too much code to build); on AVX2 the taps unrolled
    dict(N=1, C=128, H=28, W=28, F=128, KH=3, KW=3, padding=1),
    dict(N=1, C=16, H=12, W=12, F=4 * VL, KH=3, KW=3, padding=1),
    # 1x1 weights in whole registers both ways: packed by register transposes (schedule_transposed_panels)
    dict(N=1, C=3 * VL, H=7, W=7, F=4 * VL, KH=1, KW=1),
    dict(N=2, C=2 * VL, H=9, W=11, F=2 * VL, KH=1, KW=1, stride=2),
]


def _poisoned(op):
    dtype = np.dtype(op.output.dtype)
    if dtype.kind == "f":
        return np.full(op.output.shape, np.nan, dtype)
    return np.full(op.output.shape, np.iinfo(dtype).min + 3, dtype)


@pytest.mark.parametrize("params", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_channel_vectors_match_the_reference(params):
    op = get_op("conv2d_nchw", **params)
    _check_against_reference(op, schedule_conv_nchw_channels(op, HOST), seed=3)


def _check_against_reference(op, schedule, seed: int):
    """Random inputs, a poisoned output, the kernel of `schedule` against the op's reference."""
    arrays = random_inputs(op, np.random.default_rng(seed))
    out = _poisoned(op)
    build(schedule, op.tensors, HOST)(*arrays, out)
    want = op.reference(*arrays)
    if out.dtype.kind in "iu":
        np.testing.assert_array_equal(out, want)
    else:
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def _tile(op):
    FB, XB, YB = channel_tile(op, HOST)
    return FB // VL, XB, YB


def test_both_reduction_orders_are_among_the_cases():
    """The cases exercise the taps-unrolled order and the channel-innermost one."""
    seen = {taps_unrolled(op, *_tile(op), HOST.capabilities) for op in (get_op("conv2d_nchw", **p) for p in CASES)}
    assert seen == {True, False}


def test_input_channel_blocks_are_among_the_cases():
    """Some cases copy the input into channel blocks (weights dominating), others not. (A 3x3
    layer is blocked only where its tile leaves no room to unroll the taps, as on AVX-512's 28
    accumulators: the sketch and template tests cover the 3x3 copy on every host.)"""
    ops = [get_op("conv2d_nchw", **p) for p in CASES]
    blocked = [op for op in ops if input_channel_block(op, HOST, taps_unrolled(op, *_tile(op), HOST.capabilities))]
    assert 1 in {op.params["KH"] for op in blocked}
    assert len(blocked) < len(ops)


def test_channel_vectors_are_chosen_for_deep_layers_and_short_registers_rgb_stem():
    deep = get_op("conv2d_nchw", N=1, C=4 * VL, H=14, W=14, F=4 * VL, KH=3, KW=3, padding=1)
    stem = get_op("conv2d_nchw", N=1, C=3, H=224, W=224, F=64, KH=7, KW=7, stride=2, padding=3)
    odd = get_op("conv2d_nchw", N=1, C=4 * VL, H=14, W=14, F=VL + 1, KH=3, KW=3, padding=1)
    depthwise = get_op("depthwise_conv2d_nchw", N=1, C=4 * VL, H=14, W=14, KH=3, KW=3, padding=1)
    assert channel_vectors_pay(deep, HOST)
    # a 3-channel reduction per tap: channel vectors only where registers are short
    assert channel_vectors_pay(stem, HOST) == (VL <= 8)
    assert not channel_vectors_pay(odd, HOST)         # the channels fill no whole register
    assert not channel_vectors_pay(depthwise, HOST)


DEPTHWISE_CASES = [
    ("depthwise_conv2d_nchw", dict(N=1, C=2 * VL, H=9, W=7, KH=3, KW=3, padding=1)),
    ("depthwise_conv2d_nchw", dict(N=2, C=VL, H=12, W=11, KH=3, KW=3, stride=2, padding=(1, 0, 1, 1))),
    ("depthwise_conv2d_nchw", dict(N=1, C=VL, H=10, W=10, KH=5, KW=3, dilation=2, padding=2)),
    ("conv2d_nchw", dict(N=1, C=3 * VL, H=7, W=7, F=3 * VL, KH=3, KW=3, padding=1, groups=3 * VL)),
    ("conv2d_nchw", dict(N=1, C=VL, H=15, W=13, F=VL, KH=3, KW=3, stride=2, padding=1, groups=VL)),
    ("depthwise_conv2d_nchw", dict(N=1, C=VL, H=6, W=6, KH=3, KW=3, padding=1, dtype="int8")),
    # a 7-tap row around the whole register tile would be too much straight-line code: the row
    # stays a loop (unrolled_fits; this layer failed to build on AVX-512, found by a model fuzzer)
    ("conv2d_nchw", dict(N=2, C=2 * VL, H=11, W=29, F=2 * VL, KH=7, KW=7, padding=(1, 0, 2, 1), groups=2 * VL)),
]


@pytest.mark.parametrize("name, params", DEPTHWISE_CASES, ids=[f"dw{i}" for i in range(len(DEPTHWISE_CASES))])
def test_depthwise_channel_vectors_match_the_reference(name, params):
    """Depthwise convolutions vectorized over channels (input and weights copied in channel
    blocks, the tile stored along its rows), as the default picks them for short rows and strides."""
    from compiler.ops.schedule_conv import depthwise_channel_vectors, schedule_depthwise_channels
    op = get_op(name, **params)
    assert depthwise_channel_vectors(op, HOST)
    _check_against_reference(op, schedule_depthwise_channels(op, HOST), seed=5)


def test_depthwise_keeps_column_vectors_on_long_unit_stride_rows():
    from compiler.ops.schedule_conv import depthwise_channel_vectors
    long_rows = get_op("depthwise_conv2d_nchw", N=1, C=VL, H=8, W=8 * VL, KH=3, KW=3, padding=1)
    strided = get_op("depthwise_conv2d_nchw", N=1, C=VL, H=8, W=16 * VL, KH=3, KW=3, padding=1, stride=2)
    two_each = get_op("depthwise_conv2d_nchw", N=1, C=VL, H=8, W=8, KH=3, KW=3, padding=1, multiplier=2)
    assert not depthwise_channel_vectors(long_rows, HOST)
    assert depthwise_channel_vectors(strided, HOST)
    assert not depthwise_channel_vectors(two_each, HOST)


def test_long_unit_stride_rows_with_short_reductions_keep_column_vectors():
    """Channel tiles transpose their stores; where rows are long whole registers and the
    reduction short (MobileNetV2's 1x1 expansions), column vectors store whole lines instead."""
    rows = 8 * VL
    expand = get_op("conv2d_nchw", N=1, C=VL, H=4, W=rows, F=6 * VL, KH=1, KW=1)
    long_reduction = get_op("conv2d_nchw", N=1, C=256, H=4, W=rows, F=2 * VL, KH=1, KW=1)
    window = get_op("conv2d_nchw", N=1, C=4 * VL, H=4, W=rows, F=2 * VL, KH=3, KW=3, padding=1)
    strided = get_op("conv2d_nchw", N=1, C=VL, H=4, W=2 * rows, F=2 * VL, KH=1, KW=1, stride=2)
    short_rows = get_op("conv2d_nchw", N=1, C=VL, H=4, W=VL + VL // 2, F=2 * VL, KH=1, KW=1)
    assert not channel_vectors_pay(expand, HOST)
    assert channel_vectors_pay(long_reduction, HOST) and channel_vectors_pay(window, HOST)
    assert channel_vectors_pay(strided, HOST) and channel_vectors_pay(short_rows, HOST)


def test_whole_register_1x1_weights_are_packed_by_transposes():
    """Among the cases, a 1x1 layer whose channels fill whole registers packs its weights through a
    local register tile (a cache_write of the panel), a 3x3 layer row by row."""
    def transposed(params):
        op = get_op("conv2d_nchw", **params)
        steps = schedule_conv_nchw_channels(op, HOST).steps
        return any(st["op"] == "cache_write" and st.get("order") == [0, 4, 1, 2, 3] for st in steps)
    assert transposed(CASES[-2]) and transposed(CASES[-1])
    assert not transposed(CASES[-4])



def test_a_channel_block_wider_than_a_register_keeps_its_weight_panel_within_half_the_l2():
    """ResNet-50's res5 3x3 (512 input channels): a tile's panel of C·KH·KW·FB weights is read
    again for every row, so the block is as wide as fits half the L2, and one register when none
    wider does; the same layer with fewer input channels may take two registers."""
    caps = HOST.capabilities
    for C in (512, 64):
        op = get_op("conv2d_nchw", N=1, C=C, H=7, W=7, F=4 * VL, KH=3, KW=3, padding=1)
        FB, _, _ = channel_tile(op, HOST)
        panel = C * 3 * 3 * FB * 4
        assert FB == VL or panel <= caps.l2 // 2, (C, FB, panel, caps.l2)
    deep = get_op("conv2d_nchw", N=1, C=caps.l2 // (2 * 9 * 4 * VL) + 1, H=7, W=7, F=4 * VL, KH=3, KW=3, padding=1)
    assert channel_tile(deep, HOST)[0] == VL  # two registers' panel is over half the L2


RECIPE_CASES = [
    dict(N=1, C=16, H=9, W=11, F=2 * VL, KH=3, KW=3, stride=2, padding=1),     # deep enough for an input copy
    dict(N=1, C=24, H=7, W=7, F=4 * VL, KH=1, KW=1, stride=2),
    dict(N=1, C=3, H=13, W=15, F=VL, KH=7, KW=7, stride=2, padding=3),           # an RGB stem
]


@pytest.mark.parametrize("params", RECIPE_CASES, ids=["3x3s2", "1x1s2", "stem"])
def test_every_choice_of_the_nchw_recipe_computes_the_convolution(params):
    """conv2d_nchw's recipe (conv2d_nchw_choices, the tuner's recipe sketch): its first values are
    the default schedule itself, and tiles of either vector axis, and every walk order, input copy,
    taps order and panel packing it offers compute the reference on sizes no tile divides."""
    from compiler.lower import lower
    from compiler.ops import default_schedule
    from compiler.ops.schedule_anchor import anchor_recipe_choices, schedule_anchor_recipe
    op = get_op("conv2d_nchw", **params)
    choices = anchor_recipe_choices(op, HOST)
    default = {k: v[0] for k, v in choices.items()}
    assert str(lower(schedule_anchor_recipe(op, HOST, default), op.tensors)) == str(lower(default_schedule(op, HOST), op.tensors))
    assert {t[0] for t in choices["tile"]} >= {"channels", "columns"} and len(choices["tile"]) == len({tuple(t) for t in choices["tile"]})
    tiles = choices["tile"]
    picked = [tiles[1], next(t for t in tiles if t[0] != tiles[0][0]), tiles[-1]]   # both vector axes
    variants = [{**default, "tile": t} for i, t in enumerate(picked) if t not in picked[:i]]
    variants += [{**default, knob: v} for knob, values in choices.items() if knob != "tile" for v in values[1:]]
    variants += [{**default, "tile": choices["tile"][-1], "channel_blocks_first": not default["channel_blocks_first"]}]
    for i, chosen in enumerate(variants):
        _check_against_reference(op, schedule_anchor_recipe(op, HOST, chosen), seed=i)


STRIDED_POINTWISE = [
    dict(N=2, C=2 * VL, H=9, W=11, F=2 * VL, KH=1, KW=1, stride=2),        # odd sizes: the last row and column kept
    dict(N=1, C=24, H=10, W=13, F=VL, KH=1, KW=1, stride=(3, 2)),          # input channels no block divides
    dict(N=1, C=2 * VL, H=7, W=7, F=2 * VL, KH=1, KW=1, stride=2, groups=2),
]


@pytest.mark.parametrize("params", STRIDED_POINTWISE, ids=["odd", "3x2", "groups"])
def test_a_strided_1x1_convolution_reads_a_compact_copy_of_its_input(params):
    """A strided 1x1 convolution without padding copies only the input positions it reads
    (subsample_input, cache_read's stride), channel-blocked or not, with channel or column
    vectors, and still computes the reference; asked not to, it reads the input itself."""
    from compiler.lower import lower
    from compiler.ops.schedule_conv import input_step, schedule_conv_nchw
    op = get_op("conv2d_nchw", **params)
    sh, sw = op.params["stride"]
    assert input_step(op) == {a: v for a, v in ((2, sh), (3, sw)) if v > 1}
    N, Cin, H, W = op.inputs[0].shape
    compact = f"{N}x{Cin}x{-(-H // sh)}x{-(-W // sw)}"
    variants = [schedule_conv_nchw(op, HOST, tile=["columns", *_column(op)])]
    if (op.output.shape[1] // op.params["groups"]) % VL == 0:
        variants += [schedule_conv_nchw_channels(op, HOST, input_block=b) for b in (0, 8) if op.params["groups"] == 1 or not b]
    for i, sch in enumerate(variants):
        text = str(lower(sch, op.tensors))
        shapes = [line.split("[float32 * ")[1].split("]")[0] for line in text.splitlines() if "allocate data_" in line]
        assert shapes and all(s == compact or s.count("x") == 4 for s in shapes), shapes   # compact, or compact and blocked
        _check_against_reference(op, sch, seed=10 + i)
    if (op.output.shape[1] // op.params["groups"]) % VL == 0:
        whole = schedule_conv_nchw_channels(op, HOST, subsample=False, input_block=0)
        assert "allocate data_" not in str(lower(whole, op.tensors))
        _check_against_reference(op, whole, seed=9)
    padded = get_op("conv2d_nchw", **{**params, "padding": 1})
    assert not input_step(padded)          # a padded border is read too: nothing to leave out
    _check_against_reference(padded, schedule_conv_nchw(padded, HOST), seed=8)


def _column(op):
    from compiler.ops.schedule_conv import column_tile
    return column_tile(op, HOST)


def test_a_depthwise_layer_vectorized_over_channels_has_no_recipe():
    from compiler.ops.schedule_anchor import anchor_recipe_choices
    op = get_op("conv2d_nchw", N=1, C=2 * VL, H=7, W=7, F=2 * VL, KH=3, KW=3, padding=1, groups=2 * VL)
    assert not anchor_recipe_choices(op, HOST)


def test_large_weights_are_packed_one_channel_block_at_a_time():
    """Weights over PANEL_PER_BLOCK_BYTES with channel blocks outermost: each block's panel is
    packed inside its block's (parallel) iteration into a buffer of one block, not all of them
    into a second copy of the weights first; the result is unchanged."""
    from compiler.lower import lower
    from compiler.ops.schedule_conv import PANEL_PER_BLOCK_BYTES, packing_per_block_pays
    params = dict(N=1, C=96 * VL, H=6, W=6, F=48 * VL, KH=1, KW=1, stride=2)   # res5 1x1/2-like
    op = get_op("conv2d_nchw", **params)
    FB = channel_tile(op, HOST)[0]
    assert op.inputs[1].shape[0] * op.inputs[1].shape[1] * 4 > PANEL_PER_BLOCK_BYTES and packing_per_block_pays(op, HOST, FB)
    per_block = schedule_conv_nchw_channels(op, HOST)
    whole = schedule_conv_nchw_channels(op, HOST, pack_per_block=False)
    ir_block, ir_whole = str(lower(per_block, op.tensors)), str(lower(whole, op.tensors))
    assert ir_block != ir_whole
    _check_against_reference(op, per_block, seed=4)
    _check_against_reference(op, whole, seed=4)


@pytest.mark.parametrize("lanes_", [4, 8, 16])
@pytest.mark.parametrize("rows", [(2, 3 * 16), (4, 1024 + 64), (2, 3 * 16 * 9)], ids=["short", "long", "medium"])
def test_weight_panels_are_transposed_exactly(lanes_, rows):
    """schedule_transposed_panels copies [F, C·taps] weights into [F/block][C·taps][block]
    panels bit for bit, in tiles of transpose_tile(lanes) (4 and 8 wide) and in both walks: short source rows
    (row groups inside a step of input channels) and rows of 4 KB or more (input channels
    inside a row group), here with more than one tile of input channels per panel."""
    from compiler import compute, placeholder
    from compiler.ops.schedule_conv import LONG_PANEL_ROW_BYTES, schedule_transposed_panels
    from compiler.schedule import create_schedule

    blocks, C = rows
    F = blocks * 16
    W = placeholder((F, C, 1, 1), "float32", "W")
    P = compute((blocks, C, 1, 1, 16), lambda fo, c, y, x, fi: W[fo * 16 + fi, c, y, x], name="packed")
    s = create_schedule(P)
    schedule_transposed_panels(s, P, lanes_, lambda work: True)
    assert (C * 4 >= LONG_PANEL_ROW_BYTES) == (rows[1] == 1024 + 64)     # the long case takes the row-group walk
    w = np.random.default_rng(5).uniform(-1, 1, (F, C, 1, 1)).astype("float32")
    out = np.full((blocks, C, 1, 1, 16), np.nan, "float32")
    build(s, [W, P], HOST)(w, out)
    np.testing.assert_array_equal(out, w.reshape(blocks, 16, C, 1, 1).transpose(0, 2, 3, 4, 1))
