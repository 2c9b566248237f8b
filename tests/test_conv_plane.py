"""conv2d_nchw's plane-accumulated channel tiles (schedule_conv_nchw_plane) against numpy.

The input-channel reduction is split into chunks above the spatial loops and each chunk's
register tiles are summed into a per-block plane buffer; the cases force several chunks at
small sizes (the rule's chunk, sized from the L2, would be the whole reduction), with tiles that
overhang rows and columns, strides, dilation, padding on some sides only, a batch, with and
without the input copied into channel blocks, and through a fused epilogue.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_conv_channel_vectors import _check_against_reference

from compiler import Target
from compiler.errors import ScheduleError
from compiler.lower import lower
from compiler.ops import get_op
from compiler.ops.schedule_anchor import anchor_recipe_choices, schedule_anchor_recipe
from compiler.ops.schedule_common import lanes
from compiler.ops.schedule_conv_plane import plane_chunk, plane_tiles, schedule_conv_nchw_plane

HOST = Target.host()
VL = lanes(HOST, "float32")

# (params, (FB registers, XB, YB), chunk, input block)
CASES = [
    (dict(N=1, C=24, H=9, W=11, F=4 * VL, KH=3, KW=3, padding=1), (4, 2, 1), 8, 8),        # 3 chunks, overhangs
    (dict(N=2, C=16, H=7, W=7, F=2 * VL, KH=3, KW=3, stride=2, padding=1), (2, 3, 2), 8, 0),  # batch, stride
    (dict(N=1, C=32, H=5, W=6, F=4 * VL, KH=1, KW=1), (2, 4, 1), 16, 8),                    # 1x1
    (dict(N=1, C=16, H=11, W=10, F=2 * VL, KH=3, KW=3, dilation=2, padding=(2, 1, 0, 2)), (1, 5, 2), 4, 0),
    (dict(N=1, C=16, H=6, W=6, F=2 * VL, KH=3, KW=3, padding=1, dtype="int8"), (2, 2, 2), 8, 8),
    (dict(N=1, C=16, H=9, W=11, F=2 * VL, KH=1, KW=1, stride=2), (1, 4, 1), 8, 8),            # a compact copy
    (dict(N=2, C=24, H=10, W=7, F=VL, KH=1, KW=1, stride=(3, 2)), (1, 3, 2), 12, 0),
]


@pytest.mark.parametrize("params,tile,chunk,block", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_plane_tiles_compute_the_convolution_over_several_chunks(params, tile, chunk, block):
    op = get_op("conv2d_nchw", **params)
    fregs, XB, YB = tile
    sch = schedule_conv_nchw_plane(op, HOST, tile=(fregs * VL, XB, YB), input_block=block, chunk=chunk)
    text = str(lower(sch, op.tensors))
    assert "conv2d_nchw_local_rf" in text   # the chunks' tiles are a stage of their own
    _check_against_reference(op, sch, seed=5)


def test_a_chunk_that_does_not_divide_the_input_channels_is_refused():
    op = get_op("conv2d_nchw", N=1, C=24, H=5, W=5, F=2 * VL, KH=3, KW=3, padding=1)
    with pytest.raises(ScheduleError, match="must divide 24"):
        schedule_conv_nchw_plane(op, HOST, tile=(2 * VL, 2, 1), input_block=0, chunk=7)
    with pytest.raises(ScheduleError, match="multiple of the input block 8"):
        schedule_conv_nchw_plane(op, HOST, tile=(2 * VL, 2, 1), input_block=8, chunk=12)


def test_chunks_are_the_most_input_blocks_whose_weights_fit_the_budget():
    """ResNet's res5 3x3: the plane tiles' chunks divide the 512 input channels in whole input
    blocks, the default tile's weights of a chunk fit half the L1, the wide tiles' half the L2,
    and a chunk twice as long would not."""
    op = get_op("conv2d_nchw", N=1, C=512, H=7, W=7, F=512, KH=3, KW=3, padding=1)
    caps = HOST.capabilities
    tiles = plane_tiles(op, HOST)
    assert len(tiles) >= 2
    for i, (_, fb, _, _, chunk) in enumerate(tiles):
        budget = caps.l1d // 2 if i == 0 else caps.l2 // 2
        assert chunk == plane_chunk(op, HOST, fb, budget)
        assert 512 % chunk == 0 and chunk % 8 == 0
        assert fb * chunk * 9 * 4 <= budget or chunk == 8
        assert 2 * fb * chunk * 9 * 4 > budget or chunk == 512


def test_deep_layers_offer_plane_tiles_in_the_recipe_and_wide_maps_do_not():
    """The recipe sketch's tiles: the first plane tile right after the default's register tile;
    none where a block's plane would be too large (a 56x56 map)."""
    deep = get_op("conv2d_nchw", N=1, C=256, H=7, W=7, F=256, KH=3, KW=3, padding=1)
    tiles = anchor_recipe_choices(deep, HOST)["tile"]
    assert tiles[0][0] != "plane" and tiles[1][0] == "plane" and tiles[1] == plane_tiles(deep, HOST)[0]
    assert all(t[1] % VL == 0 and deep.output.shape[1] % t[1] == 0 and 256 % t[4] == 0 for t in tiles if t[0] == "plane")
    shallow = get_op("conv2d_nchw", N=1, C=64, H=56, W=56, F=64, KH=3, KW=3, padding=1)
    assert not plane_tiles(shallow, HOST) and all(t[0] != "plane" for t in anchor_recipe_choices(shallow, HOST)["tile"])


def test_a_fused_epilogue_is_stored_out_of_the_plane():
    """conv2d_bias_relu's recipe with a plane tile: bias and relu applied as the plane is stored."""
    op = get_op("conv2d_bias_relu", N=1, C=64, H=5, W=5, F=2 * VL, KH=3, KW=3, padding=1)
    choices = anchor_recipe_choices(op, HOST)
    plane = next(t for t in choices["tile"] if t[0] == "plane")
    chosen = {k: v[0] for k, v in choices.items()} | {"tile": plane}
    _check_against_reference(op, schedule_anchor_recipe(op, HOST, chosen), seed=2)


def test_the_recipe_sketch_starts_with_a_plane_tile_that_replays_from_its_record():
    """The tuner measures a plane tile among its first candidates, and the candidate, as a record
    keeps it (JSON steps, the rfactor among them), builds and computes without the recipe."""
    from test_spaces import check_builds_and_computes

    from tuner.space import SketchSpace
    from tuner.space.sketch.recipe import RECIPE_PARAMS, RECIPE_SKETCH_ID
    op = get_op("conv2d_nchw", N=1, C=32, H=7, W=7, F=4 * VL, KH=3, KW=3, padding=1)
    starts = [c for c in SketchSpace(op).starting_points() if c.payload["sketch"] == RECIPE_SKETCH_ID]
    planes = [c for c in starts if c.payload["params"][RECIPE_PARAMS]["tile"][0] == "plane"]
    assert planes and any(step["op"] == "rfactor" for step in planes[0].payload["steps"])
    check_builds_and_computes(get_op("conv2d_nchw", **op.params), planes[0], np.random.default_rng(1))
