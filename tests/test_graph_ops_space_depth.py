"""DepthToSpace (DCR and CRD) and SpaceToDepth against numpy references written here element by
element from the ONNX spec, on random non-zero inputs of odd sizes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from graph_models import assert_close, model, rand, run
from onnx import helper

from compiler.graph import from_onnx
from compiler.graph.errors import ShapeError
from compiler.graph.fuse import fuse

RNG = np.random.default_rng(13)


def np_depth_to_space(x, b, mode):
    N, C, H, W = x.shape
    c_out = C // (b * b)
    y = np.zeros((N, c_out, H * b, W * b), x.dtype)
    for c, i, j in itertools.product(range(c_out), range(H * b), range(W * b)):
        phase = (i % b) * b + j % b
        ch = phase * c_out + c if mode == "DCR" else c * b * b + phase
        y[:, c, i, j] = x[:, ch, i // b, j // b]
    return y


def np_space_to_depth(x, b, mode="DCR"):
    N, C, H, W = x.shape
    y = np.zeros((N, C * b * b, H // b, W // b), x.dtype)
    for ch, i, j in itertools.product(range(C * b * b), range(H // b), range(W // b)):
        phase, c = divmod(ch, C) if mode == "DCR" else reversed(divmod(ch, b * b))
        y[:, ch, i, j] = x[:, c, i * b + phase // b, j * b + phase % b]
    return y


@pytest.mark.parametrize("mode,b,shape", [("DCR", 2, (2, 12, 3, 5)), ("CRD", 2, (1, 8, 5, 3)), ("DCR", 3, (1, 18, 2, 3)),
                                          ("CRD", 3, (2, 9, 3, 1))])
def test_depth_to_space(mode, b, shape):
    x = rand(RNG, shape)
    want = np_depth_to_space(x, b, mode)
    node = helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=b, mode=mode)
    (y,) = run(model([node], {"x": (shape, "float32")}, {"y": (want.shape, "float32")}, opset=13), {"x": x})
    assert_close(y, want)


@pytest.mark.parametrize("mode,b,shape", [("DCR", 2, (2, 3, 6, 4)), ("DCR", 3, (1, 5, 9, 3)), ("CRD", 2, (1, 3, 4, 6))])
def test_space_to_depth_and_back(mode, b, shape):
    x = rand(RNG, shape)
    want = np_space_to_depth(x, b, mode)
    nodes = [helper.make_node("SpaceToDepth", ["x"], ["s"], blocksize=b, mode=mode),
             helper.make_node("DepthToSpace", ["s"], ["y"], blocksize=b, mode=mode)]
    m = model(nodes, {"x": (shape, "float32")}, {"s": (want.shape, "float32"), "y": (shape, "float32")})
    s, y = run(m, {"x": x})
    assert_close(s, want)
    assert_close(y, x)


def test_a_pixel_shuffle_fuses_with_its_activation():
    x = rand(RNG, (1, 8, 3, 4))
    nodes = [helper.make_node("DepthToSpace", ["x"], ["d"], blocksize=2, mode="CRD"), helper.make_node("Relu", ["d"], ["y"])]
    m = model(nodes, {"x": (x.shape, "float32")}, {"y": ((1, 2, 6, 8), "float32")})
    assert [g.describe() for g in fuse(from_onnx(m))] == ["DepthToSpace+Relu"]
    (y,) = run(m, {"x": x})
    assert_close(y, np.maximum(np_depth_to_space(x, 2, "CRD"), 0))


def test_shapes_that_do_not_divide_are_refused():
    node = helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2)
    with pytest.raises(ShapeError, match="not N, C"):
        from_onnx(model([node], {"x": ((1, 6, 2, 2), "float32")}, {"y": (None, "float32")}))
    node = helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2)
    with pytest.raises(ShapeError, match="multiples of 2"):
        from_onnx(model([node], {"x": ((1, 3, 5, 4), "float32")}, {"y": (None, "float32")}))
