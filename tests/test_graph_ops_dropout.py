"""Dropout at inference: the output is the input, the mask output (exported by the onnx zoo's
VGG-19, SqueezeNet and AlexNet whether or not anything reads it) a constant all-true tensor."""

from __future__ import annotations

import numpy as np
import pytest
from graph_models import assert_close, model, rand, run
from onnx import helper

from compiler.graph import from_onnx
from compiler.graph.errors import ShapeError

RNG = np.random.default_rng(2)


@pytest.mark.parametrize("opset", [7, 10, 12, 13])
def test_an_unread_mask_does_not_refuse_the_model(opset):
    x = rand(RNG, (2, 5, 3))
    nodes = [helper.make_node("Dropout", ["x"], ["d", "mask"], **({"ratio": 0.5} if opset < 12 else {})),
             helper.make_node("Relu", ["d"], ["y"])]
    m = model(nodes, {"x": (x.shape, "float32")}, {"y": (x.shape, "float32")}, opset=opset)
    graph = from_onnx(m)
    assert graph.values["mask"].const is not None
    (y,) = run(m, {"x": x})
    assert_close(y, np.maximum(x, 0))


def test_a_read_mask_is_all_true_and_a_mask_output_too():
    x = rand(RNG, (3, 7))
    nodes = [helper.make_node("Dropout", ["x", "ratio"], ["d", "mask"]),
             helper.make_node("Where", ["mask", "d", "zero"], ["y"])]
    m = model(nodes, {"x": (x.shape, "float32")}, {"y": (x.shape, "float32"), "mask": (x.shape, "bool")},
              {"ratio": np.array(0.3, np.float32), "zero": np.array(0.0, np.float32)})
    y, mask = run(m, {"x": x})
    assert_close(y, x)
    assert mask.dtype == np.bool_ and mask.shape == x.shape and mask.all()


def test_the_mask_before_opset_10_has_the_data_type():
    x = rand(RNG, (2, 4))
    nodes = [helper.make_node("Dropout", ["x"], ["d", "mask"]), helper.make_node("Neg", ["d"], ["y"])]
    m = model(nodes, {"x": (x.shape, "float32")}, {"y": (x.shape, "float32"), "mask": (x.shape, "float32")}, opset=9)
    y, mask = run(m, {"x": x})
    assert_close(y, -x)
    assert mask.dtype == np.float32 and (mask == 1).all()


def test_training_mode_drops_only_with_a_zero_ratio():
    x = rand(RNG, (2, 6))

    def dropout(ratio):
        nodes = [helper.make_node("Dropout", ["x", "ratio", "training"], ["d", "mask"]),
                 helper.make_node("Abs", ["d"], ["y"])]
        return model(nodes, {"x": (x.shape, "float32")}, {"y": (x.shape, "float32")},
                     {"ratio": np.array(ratio, np.float32), "training": np.array(True)}, opset=13)
    (y,) = run(dropout(0.0), {"x": x})
    assert_close(y, np.abs(x))
    with pytest.raises(ShapeError, match="training_mode=True with a non-zero ratio"):
        from_onnx(dropout(0.1))
