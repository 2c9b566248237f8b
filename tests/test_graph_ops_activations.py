"""The activations and elementwise functions exporters write beside the common ones (SELU, CELU,
Mish, Softsign, ThresholdedRelu, PRelu, Sin, Cos, Sign, Round), each a one-node model against a
float64 numpy reference written here, on random non-zero inputs of odd shapes."""

from __future__ import annotations

import numpy as np
import pytest
from graph_models import assert_close, model, rand, run
from onnx import helper

from compiler.graph import build_model, from_onnx
from compiler.graph.fuse import fuse

RNG = np.random.default_rng(11)
SELU_ALPHA, SELU_GAMMA = 1.6732632423543772, 1.0507009873554805


def one_node(op, shapes, out_shape, attrs=None, inits=None, opset=13, dtype="float32"):
    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node(op, names + list(inits or {}), ["y"], **(attrs or {}))
    return model([node], {n: (s, dtype) for n, s in zip(names, shapes)}, {"y": (out_shape, dtype)}, inits, opset)


CASES = [
    ("Selu", {}, lambda a: SELU_GAMMA * np.where(a > 0, a, SELU_ALPHA * (np.exp(a) - 1))),
    ("Selu", {"alpha": 2.0, "gamma": 0.5}, lambda a: 0.5 * np.where(a > 0, a, 2.0 * (np.exp(a) - 1))),
    ("Celu", {}, lambda a: np.maximum(a, 0) + np.minimum(0, np.exp(a) - 1)),
    ("Celu", {"alpha": 0.7}, lambda a: np.maximum(a, 0) + np.minimum(0, 0.7 * (np.exp(a / 0.7) - 1))),
    ("ThresholdedRelu", {}, lambda a: np.where(a > 1.0, a, 0.0)),
    ("ThresholdedRelu", {"alpha": 0.3}, lambda a: np.where(a > 0.3, a, 0.0)),
    ("Softsign", {}, lambda a: a / (1 + np.abs(a))),
    ("Mish", {}, lambda a: a * np.tanh(np.log1p(np.exp(a)))),
    ("Sin", {}, np.sin),
    ("Cos", {}, np.cos),
    ("Sign", {}, np.sign),
]


@pytest.mark.parametrize("op,attrs,ref", CASES, ids=[f"{c[0]}{'-' + str(c[1]) if c[1] else ''}" for c in CASES])
def test_unary(op, attrs, ref):
    x = rand(RNG, (3, 5, 7), hi=4.0)
    (y,) = run(one_node(op, [x.shape], x.shape, attrs, opset=18), {"x0": x})
    assert_close(y, ref(x.astype(np.float64)), rtol=3e-6)


def test_mish_of_large_values_is_the_value():
    """softplus(x) = max(x, 0) + log(1 + exp(-|x|)): no overflow to inf for x = 100."""
    x = np.array([[100.0, -100.0, 30.0, -30.0, 0.5]], np.float32)
    (y,) = run(one_node("Mish", [x.shape], x.shape, opset=18), {"x0": x})
    a = x.astype(np.float64)
    assert_close(y, a * np.tanh(np.logaddexp(a, 0)), rtol=1e-6)


def test_round_is_half_to_even_and_sign_of_zero_and_integers():
    x = np.array([[0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4, -2.6, 7.0]], np.float32)
    (y,) = run(one_node("Round", [x.shape], x.shape, opset=11), {"x0": x})
    assert y.tolist() == [[0.0, 2.0, 2.0, -0.0, -2.0, -2.0, 2.0, -3.0, 7.0]]
    z = np.array([[0.0, 3.0, -2.0]], np.float32)
    (s,) = run(one_node("Sign", [z.shape], z.shape), {"x0": z})
    assert s.tolist() == [[0.0, 1.0, -1.0]]
    i = np.array([[0, 5, -7]], np.int64)
    (si,) = run(one_node("Sign", [i.shape], i.shape, dtype="int64"), {"x0": i})
    assert si.tolist() == [[0, 1, -1]]


@pytest.mark.parametrize("x_shape,slope_shape", [((2, 5, 3, 7), (5, 1, 1)), ((2, 5, 3, 7), (1,)),
                                                  ((3, 7), (7,)), ((2, 5, 3, 7), (2, 5, 3, 7))])
def test_prelu_broadcasts_its_slope(x_shape, slope_shape):
    x, slope = rand(RNG, x_shape, hi=3.0), rand(RNG, slope_shape)
    (y,) = run(one_node("PRelu", [x_shape], x_shape, inits={"s": slope}), {"x0": x})
    a = x.astype(np.float64)
    assert_close(y, np.where(a < 0, a * slope, a))


def test_prelu_and_selu_fuse_into_the_convolution_before_them():
    x, w = rand(RNG, (1, 3, 9, 11)), rand(RNG, (6, 3, 3, 3))
    slope = rand(RNG, (6, 1, 1))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("PRelu", ["c", "s"], ["p"]),
             helper.make_node("Selu", ["p"], ["y"])]
    m = model(nodes, {"x": (x.shape, "float32")}, {"y": ((1, 6, 9, 11), "float32")}, {"w": w, "s": slope})
    graph = from_onnx(m)
    assert [g.describe() for g in fuse(graph)] == ["Conv+PRelu+Selu"]
    (y,) = build_model(graph).run(x=x)
    from graph_models import np_conv
    c = np_conv(x, w, None, (1, 1), (1, 1, 1, 1))
    p = np.where(c < 0, c * slope, c)
    assert_close(y, SELU_GAMMA * np.where(p > 0, p, SELU_ALPHA * (np.exp(p) - 1)))


def test_prelu_refuses_a_slope_that_does_not_broadcast_to_the_input():
    from compiler.graph.errors import ShapeError
    m = one_node("PRelu", [(2, 1, 4)], (2, 1, 4), inits={"s": rand(RNG, (3, 1))})   # would widen the output
    with pytest.raises(ShapeError, match="slope"):
        from_onnx(m)
    m = one_node("PRelu", [(2, 3, 4)], (2, 3, 4), inits={"s": rand(RNG, (2, 3, 4, 1))})
    with pytest.raises(ShapeError, match="cannot be broadcast"):
        from_onnx(m)
