"""Winograd convolution (compiler/ops/winograd.py): the transforms' algebra, the three kernels
with their default schedules against a float64 numpy convolution on sizes no tile divides, and
networks whose 3x3 layers the layout pass turns into them."""

from __future__ import annotations

import numpy as np
import pytest
from graph_models import assert_close, model, np_conv, rand
from onnx import helper

from compiler import compute, placeholder
from compiler.graph import build_model, from_onnx
from compiler.graph.runtime import for_target
from compiler.ops import build_op
from compiler.ops.custom import custom_op
from compiler.ops.winograd import (
    tile_grid,
    transform_weight,
    winograd_gemm,
    winograd_input,
    winograd_matrices,
    winograd_output,
    winograd_tile,
)
from compiler.target import resolve_target
from compiler.verify import poisoned

RNG = np.random.default_rng(17)
TARGET = resolve_target(None)
B = TARGET.vector_lanes("float32")


@pytest.mark.parametrize("m", [2, 4])
def test_the_transforms_compute_a_one_dimensional_correlation(m):
    BT, G, AT = winograd_matrices(m)
    assert BT.shape == (m + 2, m + 2) and G.shape == (m + 2, 3) and AT.shape == (m, m + 2)
    d, g = RNG.standard_normal(m + 2), RNG.standard_normal(3)
    np.testing.assert_allclose(AT @ ((G @ g) * (BT @ d)), [d[i:i + 3] @ g for i in range(m)], rtol=1e-12, atol=1e-12)


def blocked(x):
    N, C, H, W = x.shape
    return np.ascontiguousarray(x.reshape(N, C // B, B, H, W).transpose(0, 1, 3, 4, 2))


CASES = [   # N, C, F, H, W, pads (top, left, bottom, right), m
    (1, 2 * B, B, 9, 11, (1, 1, 1, 1), 2),
    (2, B, 2 * B, 13, 7, (0, 1, 2, 0), 2),     # asymmetric padding, rows and columns no tile divides
    (1, 2 * B, 3 * B, 6, 5, (0, 0, 0, 0), 4),  # no padding: 4 x 3 output in one tile row
    (1, 3 * B, B, 14, 10, (1, 1, 1, 1), 4),
]


@pytest.mark.parametrize("case", CASES)
def test_the_three_kernels_match_a_float64_convolution(case):
    N, C, F, H, W, pads, m = case
    x, w, bias = rand(RNG, (N, C, H, W)), rand(RNG, (F, C, 3, 3)), rand(RNG, (F,))
    OH, OW = H + pads[0] + pads[2] - 2, W + pads[1] + pads[3] - 2
    X = placeholder((N, C // B, H, W, B), "float32", "X")
    V = winograd_input(X, pads, m)
    Vp = placeholder(V.shape, "float32", "V")
    U = placeholder((m + 2, m + 2, F // B, C // B, B, B), "float32", "U")
    M = winograd_gemm(Vp, U)
    Mp, bp = placeholder(M.shape, "float32", "M"), placeholder((F // B, B), "float32", "bias")
    Y = winograd_output(Mp, (N, F // B, OH, OW, B), m)
    out = compute(Y.shape, lambda n, f, h, w_, b: Y[n, f, h, w_, b] + bp[f, b], name="biased")
    assert V.shape[3] == M.shape[3] == N * tile_grid((OH, OW), m)[0] * tile_grid((OH, OW), m)[1]
    v, mm, y = poisoned(V.shape, "float32", 0), poisoned(M.shape, "float32", 0), poisoned(out.shape, "float32", 0)
    build_op(custom_op("wino_in", [X], V), TARGET)(blocked(x), v)
    build_op(custom_op("wino_gemm", [Vp, U], M), TARGET)(v, transform_weight(w, m, B), mm)
    build_op(custom_op("wino_out", [Mp, bp], out), TARGET)(mm, bias.reshape(-1, B), y)
    got = y.transpose(0, 1, 4, 2, 3).reshape(N, F, OH, OW)
    assert_close(got, np_conv(x, w, bias, pads=pads), rtol=1e-5 if m == 2 else 5e-5)


def test_which_convolutions_take_the_winograd_form():
    big = dict(kernel=(3, 3), strides=(1, 1), dilations=(1, 1), groups=1, out_hw=(28, 28))
    assert winograd_tile(64, 64, **big) == 2
    assert winograd_tile(16, 16, **big) == 0                                     # transforms would dominate
    assert winograd_tile(64, 64, **{**big, "strides": (2, 2)}) == 0
    assert winograd_tile(64, 64, **{**big, "dilations": (2, 2)}) == 0
    assert winograd_tile(64, 64, **{**big, "groups": 2}) == 0
    assert winograd_tile(64, 64, **{**big, "kernel": (5, 5)}) == 0
    assert winograd_tile(32, 64, **{**big, "out_hw": (8, 8)}) == 0               # too little work for three kernels


def test_a_network_of_3x3_layers_runs_winograd_and_matches_numpy():
    """Two 3x3 layers of 48 channels (bias and ReLU, then a residual add and ReLU in the
    epilogue) on a size no tile divides; a strided 3x3 and a small unpadded one stay direct."""
    C = F = 48
    p = {"w1": rand(RNG, (F, C, 3, 3), lo=0.02, hi=0.2), "b1": rand(RNG, (F,)),
         "w2": rand(RNG, (F, F, 3, 3), lo=0.02, hi=0.2), "w3": rand(RNG, (32, F, 3, 3), lo=0.02, hi=0.2),
         "w4": rand(RNG, (32, 32, 3, 3), lo=0.02, hi=0.2)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "x"], ["s"]), helper.make_node("Relu", ["s"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3"], ["c3"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c3", "w4"], ["y"], kernel_shape=[3, 3])]
    shape = (1, C, 30, 27)
    graph = from_onnx(model(nodes, {"x": (shape, "float32")}, {"y": (None, "float32")}, p))
    ops = [n.op_type for n in for_target(graph, TARGET).nodes]
    assert ops.count("WinogradGemm") == 2 and ops.count("ConvNCHWc") == 2
    x = rand(RNG, shape)
    (y,) = build_model(graph).run(x=x)
    r1 = np.maximum(np_conv(x, p["w1"], p["b1"], pads=(1, 1, 1, 1)), 0)
    r2 = np.maximum(np_conv(r1, p["w2"], pads=(1, 1, 1, 1)) + x, 0)
    c3 = np_conv(r2, p["w3"], stride=(2, 2), pads=(1, 1, 1, 1))
    assert_close(y, np_conv(c3, p["w4"]), rtol=2e-5)


def test_the_matrix_products_register_tile_is_a_tuning_knob():
    """The tuner's recipe sketch varies the products' register tile (the default first); every
    tile it offers computes the same products."""
    from compiler.ops.schedule_anchor import anchor_recipe_choices, schedule_anchor_recipe
    from compiler.runtime import build
    a, CB, P, FO = 4, 3, 29, 2
    Vp = placeholder((a, a, CB, P, B), "float32", "V")
    U = placeholder((a, a, FO, CB, B, B), "float32", "U")
    op = custom_op("wino_gemm", [Vp, U], winograd_gemm(Vp, U))
    choices = anchor_recipe_choices(op, TARGET)
    tiles = choices["tile"]
    assert len(tiles) >= 2 and len({tuple(t) for t in tiles}) == len(tiles)
    v, u = rand(RNG, Vp.shape), rand(RNG, U.shape)
    want = np.einsum("ijcpb,ijfcbo->ijfpo", v.astype(np.float64), u.astype(np.float64))
    for tile in (tiles[0], tiles[-1]):
        got = poisoned(op.output.shape, "float32", 0)
        build(schedule_anchor_recipe(op, TARGET, {"tile": tile}), op.tensors, TARGET)(v, u, got)
        assert_close(got, want)
