"""LRN, InstanceNormalization and GroupNormalization (opset 18 per-group and opset 21 per-channel
affine), each a one-node model against a float64 numpy reference written here, on random
non-zero inputs of odd shapes."""

from __future__ import annotations

import numpy as np
import pytest
from graph_models import assert_close, model, rand, run
from onnx import helper

from compiler.graph import from_onnx
from compiler.graph.errors import ShapeError, UnsupportedModelError

RNG = np.random.default_rng(5)


def one_node(op, x_shape, attrs=None, inits=None, opset=13):
    node = helper.make_node(op, ["x", *(inits or {})], ["y"], **(attrs or {}))
    return model([node], {"x": (x_shape, "float32")}, {"y": (x_shape, "float32")}, inits, opset)


def np_lrn(x, size, alpha, beta, bias):
    a = x.astype(np.float64)
    C = a.shape[1]
    lo_off, hi_off = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = np.zeros_like(a)
    for c in range(C):
        for cc in range(c - lo_off, c + hi_off + 1):
            if 0 <= cc < C:
                sq[:, c] += a[:, cc] ** 2
    return a / (bias + alpha / size * sq) ** beta


@pytest.mark.parametrize("shape,size,alpha,beta,bias", [
    ((2, 9, 5, 7), 5, 1e-4, 0.75, 1.0),          # AlexNet's and GoogLeNet's LRN, odd planes
    ((1, 7, 3, 5), 5, 0.5, 0.75, 2.0),           # alpha large enough that the window matters
    ((2, 6, 4, 3), 4, 0.3, 0.6, 1.5),            # even window (one more channel after), a general beta
    ((1, 3, 5, 5), 7, 0.4, 0.5, 1.0),            # window wider than the channels
    ((2, 5, 11), 3, 0.2, 1.0, 0.5),              # 3-d data
])
def test_lrn(shape, size, alpha, beta, bias):
    x = rand(RNG, shape, hi=2.0)
    attrs = dict(size=size, alpha=alpha, beta=beta, bias=bias)
    (y,) = run(one_node("LRN", shape, attrs), {"x": x})
    assert_close(y, np_lrn(x, size, alpha, beta, bias), rtol=3e-6)


def np_group_norm(x, groups, gamma, beta, eps):
    a = x.astype(np.float64)
    N, C = a.shape[:2]
    rows = a.reshape(N, groups, -1)
    mu = rows.mean(axis=2, keepdims=True)
    var = ((rows - mu) ** 2).mean(axis=2, keepdims=True)
    y = ((rows - mu) / np.sqrt(var + eps)).reshape(a.shape)
    bshape = (1, C) + (1,) * (a.ndim - 2)
    return y * gamma.astype(np.float64).reshape(bshape) + beta.astype(np.float64).reshape(bshape)


@pytest.mark.parametrize("shape", [(2, 5, 7, 9), (3, 4, 13), (1, 3, 2, 3, 5), (2, 6, 40, 1)])
def test_instance_normalization(shape):
    x = rand(RNG, shape, hi=3.0) + 5.0      # an offset: the statistics see the spread, not the offset
    C = shape[1]
    g, b = rand(RNG, (C,)), rand(RNG, (C,))
    (y,) = run(one_node("InstanceNormalization", shape, {"epsilon": 1e-4}, {"g": g, "b": b}), {"x": x})
    assert_close(y, np_group_norm(x, C, g, b, 1e-4), rtol=2e-5)


@pytest.mark.parametrize("opset,shape,groups", [(21, (2, 6, 5, 7), 3), (21, (1, 8, 9, 9), 8), (21, (2, 4, 33), 1),
                                                (18, (2, 6, 5, 7), 2), (18, (3, 9, 4, 5), 3)])
def test_group_normalization(opset, shape, groups):
    x = rand(RNG, shape, hi=3.0)
    C = shape[1]
    per = groups if opset < 21 else C           # opset 18: one scale and bias per group
    g, b = rand(RNG, (per,)), rand(RNG, (per,))
    m = one_node("GroupNormalization", shape, {"epsilon": 1e-5, "num_groups": groups}, {"g": g, "b": b}, opset)
    (y,) = run(m, {"x": x})
    gc, bc = (np.repeat(v, C // groups) if per != C else v for v in (g, b))
    assert_close(y, np_group_norm(x, groups, gc, bc, 1e-5), rtol=2e-5)


def test_group_normalization_with_scale_and_bias_as_inputs():
    """Scale and bias fed at run time (as ONNX's own tests do) are read per channel or per group."""
    x = rand(RNG, (2, 6, 3, 5))
    g, b = rand(RNG, (3,)), rand(RNG, (3,))
    node = helper.make_node("GroupNormalization", ["x", "g", "b"], ["y"], num_groups=3, epsilon=1e-5)
    m = model([node], {"x": (x.shape, "float32"), "g": ((3,), "float32"), "b": ((3,), "float32")},
              {"y": (x.shape, "float32")}, opset=18)
    (y,) = run(m, {"x": x, "g": g, "b": b})
    assert_close(y, np_group_norm(x, 3, np.repeat(g, 2), np.repeat(b, 2), 1e-5), rtol=2e-5)


def test_a_constant_plane_normalizes_to_the_bias():
    x = np.full((1, 2, 6, 6), 1000.0, np.float32)
    x[0, 1] = rand(RNG, (6, 6)) + 1000.0
    g, b = np.array([2.0, 3.0], np.float32), np.array([0.25, -0.5], np.float32)
    (y,) = run(one_node("InstanceNormalization", x.shape, {"epsilon": 1e-5}, {"g": g, "b": b}), {"x": x})
    assert np.all(y[0, 0] == np.float32(0.25))
    assert_close(y[0, 1:], np_group_norm(x, 2, g, b, 1e-5)[0, 1:], rtol=1e-4)


def test_bad_normalizations_are_refused_with_a_reason():
    x_shape = (1, 6, 4, 4)
    g = rand(RNG, (6,))
    with pytest.raises(ShapeError, match="num_groups=4 does not divide 6"):
        from_onnx(one_node("GroupNormalization", x_shape, {"num_groups": 4}, {"g": g, "b": g}, 21))
    with pytest.raises(ShapeError, match=r"scale \(6,\).*expected \(2,\)"):
        from_onnx(one_node("GroupNormalization", x_shape, {"num_groups": 2}, {"g": g, "b": g}, 18))
    with pytest.raises(UnsupportedModelError, match="stash_type"):
        from_onnx(one_node("GroupNormalization", x_shape, {"num_groups": 2, "stash_type": 11}, {"g": g, "b": g}, 21))
    with pytest.raises(UnsupportedModelError, match="size"):
        from_onnx(one_node("LRN", x_shape, {"alpha": 1e-4}))
