"""Register tiles of the channel-blocked convolution (schedule_conv_nchwc.nchwc_tile) for
grouped layers: a tile's output blocks lie in one group, so they share its broadcasts."""

from __future__ import annotations

import numpy as np
import pytest
from graph_models import assert_close, np_conv, rand

from compiler import expr as E
from compiler.ops import default_schedule
from compiler.ops import functions as fn
from compiler.ops.custom import custom_op
from compiler.ops.schedule_anchor import anchor_view
from compiler.ops.schedule_conv_nchwc import nchwc_tile, nchwc_tile_choices
from compiler.runtime import build
from compiler.target import resolve_target
from compiler.tensor import compute, placeholder

RNG = np.random.default_rng(54)
TARGET = resolve_target(None)
B = TARGET.vector_lanes("float32")


def blocked(x):
    N, C, H, W = x.shape
    return np.ascontiguousarray(x.reshape(N, C // B, B, H, W).transpose(0, 1, 3, 4, 2))


def grouped_opdef(C, F, groups, H, W, k, stride, pads):
    X = placeholder((1, C // B, H, W, B), "float32", "x")
    Wt = placeholder((F // B, C // groups // B, k, k, B, B), "float32", "w")
    Bias = placeholder((F // B, B), "float32", "b")
    conv = fn.conv2d_nchwc(X, Wt, stride, pads)
    out = compute(conv.shape, lambda n, f, y, x_, fi: E.maximum(conv[n, f, y, x_, fi] + Bias[f, fi], 0.0),
                  name="epilogue", tag="elemwise")
    return custom_op("grouped_conv_relu", [X, Wt, Bias], out)


# groups of an odd number of output blocks (ShuffleNet v1's 4 x 136 channels are 17 blocks of 8),
# so a 2- or 4-block tile would straddle two groups; 1x1 and 3x3, stride, padding, columns the
# tile does not divide
CASES = [   # C, F, groups, H, W, k, stride, pads
    (4 * 3 * B, 4 * 3 * B, 4, 7, 7, 1, (1, 1), (0, 0, 0, 0)),
    (2 * B, 2 * 5 * B, 2, 9, 11, 3, (1, 1), (1, 1, 1, 1)),
    (3 * 2 * B, 3 * 3 * B, 3, 10, 13, 3, (2, 2), (0, 1, 1, 0)),
]


@pytest.mark.parametrize("case", CASES)
def test_a_grouped_tile_keeps_its_blocks_in_one_group_and_matches_numpy(case):
    C, F, groups, H, W, k, stride, pads = case
    opdef = grouped_opdef(*case)
    view = anchor_view(opdef)
    per_group = F // B // groups
    assert all(per_group % t[0] == 0 for t in [nchwc_tile(view, TARGET), *nchwc_tile_choices(view, TARGET)])
    x, w, bias = rand(RNG, (1, C, H, W)), rand(RNG, (F, C // groups, k, k)), rand(RNG, (F,))
    kernel = build(default_schedule(opdef, TARGET), opdef.tensors, TARGET)
    y = np.full(opdef.output.shape, np.nan, np.float32)
    kernel(blocked(x), fn.pack_conv_weight_nchwc(w, B, B), bias.reshape(F // B, B), y)
    got = y.transpose(0, 1, 4, 2, 3).reshape(1, F, *y.shape[2:4])
    want = np.maximum(np_conv(x.astype(np.float64), w.astype(np.float64), bias.astype(np.float64), stride, pads,
                              groups=groups), 0)
    assert_close(got, want)
