"""And, Or, Xor (bool, broadcasting) and IsNaN, IsInf (float tests giving bool) as kernels, against
numpy, on inputs holding NaN and both infinities; one model for all of them keeps the builds few."""

from __future__ import annotations

import numpy as np
import pytest
from graph_models import model, rand, run
from onnx import helper

from compiler.graph import ShapeError, from_onnx

RNG = np.random.default_rng(5)


def test_logical_ops_and_float_tests():
    a, b, c = RNG.random((2, 3, 4)) > 0.5, RNG.random((3, 1)) > 0.5, RNG.random((4,)) > 0.5
    x = rand(RNG, (3, 7), hi=3.0)
    x[0, 1], x[1, 2], x[2, 3], x[2, 6] = np.nan, np.inf, -np.inf, np.nan
    d = rand(RNG, (5,), dtype="float64")
    d[1], d[3] = -np.inf, np.nan
    nodes = [helper.make_node("And", ["a", "b"], ["and"]),
             helper.make_node("Or", ["a", "c"], ["or"]),
             helper.make_node("Xor", ["b", "c"], ["xor"]),
             helper.make_node("IsNaN", ["x"], ["nan"]),
             helper.make_node("IsInf", ["x"], ["inf"]),
             helper.make_node("IsInf", ["x"], ["pos"], detect_negative=0),
             helper.make_node("IsInf", ["x"], ["neg"], detect_positive=0),
             helper.make_node("IsInf", ["d"], ["inf64"]),
             helper.make_node("IsNaN", ["d"], ["nan64"])]
    feeds = {"a": a, "b": b, "c": c, "x": x, "d": d}
    inputs = {k: (v.shape, str(v.dtype)) for k, v in feeds.items()}
    outs = ["and", "or", "xor", "nan", "inf", "pos", "neg", "inf64", "nan64"]
    got = run(model(nodes, inputs, {o: (None, "bool") for o in outs}, opset=13), feeds)
    want = [a & b, a | c, b ^ c, np.isnan(x), np.isinf(x), np.isposinf(x), np.isneginf(x), np.isinf(d),
            np.isnan(d)]
    for name, g, w in zip(outs, got, want):
        assert g.dtype == np.bool_, name
        np.testing.assert_array_equal(g, w, err_msg=name)


def test_logical_ops_need_bool_and_float_tests_need_floats():
    m = model([helper.make_node("And", ["a", "b"], ["y"], name="int_and")],
              {"a": ((3,), "int64"), "b": ((3,), "int64")}, {"y": (None, "bool")})
    with pytest.raises(ShapeError, match="int_and.*bool"):
        from_onnx(m)
    m = model([helper.make_node("IsNaN", ["a"], ["y"], name="int_isnan")], {"a": ((3,), "int32")},
              {"y": (None, "bool")})
    with pytest.raises(ShapeError, match="int_isnan.*float"):
        from_onnx(m)
