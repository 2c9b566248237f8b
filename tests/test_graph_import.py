"""Reading ONNX: the clear errors, static shapes, constant folding and BatchNorm folding."""

from __future__ import annotations

import numpy as np
import pytest
from graph_models import assert_close, model, np_bn, np_conv, rand, run
from onnx import helper

from compiler.graph import (
    DynamicShapeError,
    GraphError,
    NotOnnxError,
    ShapeError,
    UnsupportedModelError,
    from_onnx,
)

RNG = np.random.default_rng(3)


def test_not_onnx_files_and_bytes(tmp_path):
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a model\n" * 10)
    with pytest.raises(NotOnnxError, match="notes.onnx"):
        from_onnx(text)
    with pytest.raises(NotOnnxError, match="no such file"):
        from_onnx(tmp_path / "missing.onnx")
    with pytest.raises(NotOnnxError):
        from_onnx(b"\x08\x07\x12\x03abc garbage \xff\xfe")
    with pytest.raises(NotOnnxError, match="takes a path"):
        from_onnx(12345)


def test_unsupported_model_lists_every_node():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="fine"),
             helper.make_node("NonMaxSuppression", ["a"], ["b"], name="nms_1"),
             helper.make_node("Conv", ["a", "w"], ["c"], kernel_shape=[3, 3, 3], name="conv3d"),
             helper.make_node("Pad", ["a", "p"], ["d"], mode="reflect", name="reflect_pad"),
             helper.make_node("MyOp", ["a"], ["e"], name="custom", domain="com.example"),
             helper.make_node("NonMaxSuppression", ["a"], ["f"], name="nms_2")]
    m = model(nodes, {"x": ((1, 2, 4, 4, 4), "float32")}, {"f": (None, "float32")},
              {"w": rand(RNG, (2, 2, 3, 3, 3)), "p": np.zeros(10, np.int64)})
    with pytest.raises(UnsupportedModelError) as err:
        from_onnx(m)
    msg = str(err.value)
    for name in ("nms_1", "nms_2", "conv3d", "reflect_pad", "custom"):
        assert name in msg
    assert "fine" not in msg
    assert "NonMaxSuppression" in msg and "3-d Conv" in msg and "reflect" in msg and "com.example" in msg
    assert len(err.value.problems) == 5


def test_dynamic_shapes_need_input_shapes():
    node = helper.make_node("Relu", ["x"], ["y"])
    m = model([node], {"x": ((1, 8), "float32")}, {"y": (None, "float32")}, dynamic={"x": 0})
    with pytest.raises(DynamicShapeError, match="'x'.*dynamic dimension 0.*'batch'"):
        from_onnx(m)
    g = from_onnx(m, input_shapes={"x": (3, 8)})
    assert g.values["x"].shape == (3, 8) and g.values["y"].shape == (3, 8)
    with pytest.raises(GraphError, match="not inputs of the model"):
        from_onnx(m, input_shapes={"input": (3, 8)})
    with pytest.raises(ShapeError, match="dimension 1 is 8"):
        from_onnx(m, input_shapes={"x": (3, 9)})
    x = rand(RNG, (3, 8))
    (y,) = run(m, {"x": x}, input_shapes={"x": (3, 8)})
    assert_close(y, np.maximum(x, 0))


def test_shape_errors_name_the_node():
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="bad_mm")
    m = model([node], {"a": ((2, 3), "float32"), "b": ((4, 5), "float32")}, {"y": (None, "float32")})
    with pytest.raises(ShapeError, match="bad_mm"):
        from_onnx(m)


def test_shape_chains_of_exported_models_fold_away():
    """x.reshape(x.shape[0], x.shape[1] * x.shape[2]) as exporters write it: Shape → Gather →
    Mul → Unsqueeze → Concat → Reshape; after import only the Reshape remains, its shape constant."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0),
        helper.make_node("Gather", ["s", "i1"], ["d1"], axis=0),
        helper.make_node("Gather", ["s", "i2"], ["d2"], axis=0),
        helper.make_node("Mul", ["d1", "d2"], ["d12"]),
        helper.make_node("Unsqueeze", ["d0", "ax"], ["u0"]),
        helper.make_node("Unsqueeze", ["d12", "ax"], ["u1"]),
        helper.make_node("Concat", ["u0", "u1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Relu", ["r"], ["y"]),
    ]
    inits = {"i0": np.array(0, np.int64), "i1": np.array(1, np.int64), "i2": np.array(2, np.int64),
             "ax": np.array([0], np.int64)}
    m = model(nodes, {"x": ((2, 3, 4), "float32")}, {"y": (None, "float32")}, inits)
    g = from_onnx(m)
    assert [n.op_type for n in g.nodes] == ["Reshape", "Relu"]
    assert g.values["shape"].const.tolist() == [2, 12]
    assert g.values["y"].shape == (2, 12)
    x = rand(RNG, (2, 3, 4))
    (y,) = run(m, {"x": x})
    assert_close(y, np.maximum(x.reshape(2, 12), 0))


def test_constant_nodes_and_constant_subgraphs_fold():
    c = helper.make_tensor("c", 1, [3], [1.0, 2.0, 3.0])
    nodes = [helper.make_node("Constant", [], ["k"], value=c),
             helper.make_node("Mul", ["k", "k"], ["k2"]),         # constant: folded
             helper.make_node("Add", ["x", "k2"], ["y"])]
    m = model(nodes, {"x": ((2, 3), "float32")}, {"y": (None, "float32")})
    g = from_onnx(m)
    assert [n.op_type for n in g.nodes] == ["Add"]
    assert g.values["k2"].const.tolist() == [1.0, 4.0, 9.0]
    x = rand(RNG, (2, 3))
    (y,) = run(m, {"x": x})
    assert_close(y, x + np.array([1.0, 4.0, 9.0]))


def test_batch_norm_folds_into_the_convolution():
    x, w, b = rand(RNG, (1, 3, 6, 6)), rand(RNG, (4, 3, 3, 3)), rand(RNG, (4,))
    g, beta, mean = rand(RNG, (4,)), rand(RNG, (4,)), rand(RNG, (4,))
    var = RNG.uniform(0.5, 1.5, 4).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", "g", "beta", "mean", "var"], ["y"], epsilon=1e-4)]
    m = model(nodes, {"x": (x.shape, "float32")}, {"y": (None, "float32")},
              dict(w=w, b=b, g=g, beta=beta, mean=mean, var=var))
    graph = from_onnx(m)
    assert [n.op_type for n in graph.nodes] == ["Conv"]
    conv = graph.nodes[0]
    assert conv.outputs == ["y"] and len(conv.inputs) == 3
    scale = g / np.sqrt(var.astype(np.float64) + 1e-4)
    assert_close(graph.values[conv.inputs[1]].const, w * scale.reshape(4, 1, 1, 1), rtol=1e-6)
    (y,) = run(m, {"x": x})
    assert_close(y, np_bn(np_conv(x, w, b, pads=(1, 1, 1, 1)), g, beta, mean, var, 1e-4))


def test_batch_norm_stays_when_the_conv_output_has_other_readers():
    x, w = rand(RNG, (1, 2, 5, 5)), rand(RNG, (2, 2, 1, 1))
    g, beta, mean = rand(RNG, (2,)), rand(RNG, (2,)), rand(RNG, (2,))
    var = RNG.uniform(0.5, 1.5, 2).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "beta", "mean", "var"], ["bn"]),
             helper.make_node("Add", ["bn", "c"], ["y"])]
    m = model(nodes, {"x": (x.shape, "float32")}, {"y": (None, "float32")},
              dict(w=w, g=g, beta=beta, mean=mean, var=var))
    graph = from_onnx(m)
    assert [n.op_type for n in graph.nodes] == ["Conv", "Mul", "Add", "Add"]
    (y,) = run(m, {"x": x})
    c = np_conv(x, w)
    assert_close(y, np_bn(c, g, beta, mean, var) + c)


@pytest.mark.parametrize("producer", ["Concat", "Concat_of_one", "MaxPool", "computed_weight_conv"])
def test_batch_norm_after_what_is_not_a_foldable_conv_stays_a_scale_and_shift(producer):
    """DenseNet normalizes a Concat of its layers (BatchNormalization after a Concat of one input
    reached the conv folding and raised IndexError); a pool or a Conv whose weight is computed cannot take it
    either. Each keeps the normalization as x * scale + shift, right."""
    x, w = rand(RNG, (1, 3, 6, 6)), rand(RNG, (3, 3, 1, 1))
    g, beta, mean = rand(RNG, (6,)), rand(RNG, (6,)), rand(RNG, (6,))
    var = RNG.uniform(0.5, 1.5, 6).astype(np.float32)
    if producer == "Concat":
        nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Concat", ["x", "r"], ["c"], axis=1)]
        c = np.concatenate([x, np.maximum(x, 0)], axis=1)
    elif producer == "Concat_of_one":   # DenseNet's first layer: torch.cat([x], 1)
        nodes = [helper.make_node("Concat", ["x", "x"], ["xx"], axis=1), helper.make_node("Concat", ["xx"], ["c"], axis=1)]
        c = np.concatenate([x, x], axis=1)
    elif producer == "MaxPool":
        nodes = [helper.make_node("Concat", ["x", "x"], ["cc"], axis=1),
                 helper.make_node("MaxPool", ["cc"], ["c"], kernel_shape=[2, 2], strides=[1, 1])]
        xx = np.concatenate([x, x], axis=1).astype(np.float64)
        c = np.max(np.stack([xx[:, :, i:i + 5, j:j + 5] for i in (0, 1) for j in (0, 1)]), axis=0)
    else:
        nodes = [helper.make_node("Abs", ["w"], ["wa"]), helper.make_node("Concat", ["wa", "w"], ["w2"], axis=0),
                 helper.make_node("Mul", ["w2", "x_scale"], ["w3"]),
                 helper.make_node("Conv", ["x", "w3"], ["c"], kernel_shape=[1, 1])]
    inits = dict(g=g, beta=beta, mean=mean, var=var)
    inputs = {"x": (x.shape, "float32")}
    feeds = {"x": x}
    if producer == "computed_weight_conv":   # the weight is an input of the model, so never constant
        inputs["w"] = (w.shape, "float32")
        inputs["x_scale"] = ((1,), "float32")
        scale = np.array([1.5], np.float32)
        feeds.update(w=w, x_scale=scale)
        c = np_conv(x, np.concatenate([np.abs(w), w]) * 1.5)
    nodes.append(helper.make_node("BatchNormalization", ["c", "g", "beta", "mean", "var"], ["y"], epsilon=1e-3))
    m = model(nodes, inputs, {"y": (None, "float32")}, inits)
    graph = from_onnx(m)
    assert "BatchNormalization" not in [n.op_type for n in graph.nodes]
    assert [n.op_type for n in graph.nodes][-2:] == ["Mul", "Add"]
    (y,) = run(m, feeds)
    assert_close(y, np_bn(c, g, beta, mean, var, 1e-3))


def test_unsupported_dtypes_are_refused():
    node = helper.make_node("Relu", ["x"], ["y"])
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", 10, [2])],   # float16
                          [helper.make_tensor_value_info("y", 10, [2])])
    with pytest.raises(GraphError, match="data type 10"):
        from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))


@pytest.mark.parametrize("auto_pad", ["NOTSET", "SAME_UPPER"])
def test_a_zero_pad_read_only_by_convolutions_becomes_their_padding(auto_pad):
    """A Pad node before two convolutions (one with padding of its own, or auto_pad) goes; a
    Pad with a non-zero value, or one also read by something else, stays."""
    x, w1, w2 = rand(RNG, (1, 3, 7, 8)), rand(RNG, (4, 3, 3, 3)), rand(RNG, (2, 3, 1, 1))
    pads = np.array([0, 0, 1, 2, 0, 0, 2, 0], np.int64)
    conv1 = dict(kernel_shape=[3, 3], strides=[2, 1], **({"pads": [1, 0, 0, 1]} if auto_pad == "NOTSET" else
                                                          {"auto_pad": auto_pad}))
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"]),
             helper.make_node("Conv", ["p", "w1"], ["a"], **conv1),
             helper.make_node("Conv", ["p", "w2"], ["b"], kernel_shape=[1, 1]),
             helper.make_node("Pad", ["x", "pads", "one"], ["q"]),
             helper.make_node("Conv", ["q", "w2"], ["c"], kernel_shape=[1, 1])]
    m = model(nodes, {"x": (x.shape, "float32")}, {k: (None, "float32") for k in "abc"},
              dict(w1=w1, w2=w2, pads=pads, one=np.array(1.0, np.float32)))
    graph = from_onnx(m)
    assert [n.op_type for n in graph.nodes].count("Pad") == 1
    a, b, c = run(m, {"x": x})
    xp = np.pad(x, ((0, 0), (0, 0), (1, 2), (2, 0)))
    own = (1, 0, 0, 1) if auto_pad == "NOTSET" else (0, 1, 1, 1)    # SAME_UPPER of 10x10, 3x3, strides (2, 1)
    assert_close(a, np_conv(xp, w1, stride=(2, 1), pads=own))
    assert_close(b, np_conv(xp, w2))
    assert_close(c, np_conv(np.pad(x, ((0, 0), (0, 0), (1, 2), (2, 0)), constant_values=1.0), w2))
