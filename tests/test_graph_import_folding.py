"""Constant subgraphs fold at import whatever their operators (onnx's reference evaluator where
tunefarm has no numpy fold), so only nodes that run as kernels can refuse a model; and the
attention-mask construction exported transformers carry runs as kernels."""

from __future__ import annotations

import numpy as np
import pytest
from graph_models import assert_close, model, rand, run
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from compiler.graph import ShapeError, UnsupportedModelError, from_onnx

RNG = np.random.default_rng(17)


def ops(graph) -> list:
    return [n.op_type for n in graph.nodes]


def test_a_swin_shifted_window_mask_built_by_scatter_nd_folds():
    """Swin-T writes img_mask[:, h, w, :] = cnt for 9 window regions as ScatterND nodes on
    constants; the mask then meets run-time data. ScatterND with reduction mul (no kernel for
    it) folds the same way."""
    nodes, prev = [], "zeros"
    inits = {"zeros": np.zeros((1, 4, 4, 1), np.float32)}
    for r, (h, w) in enumerate([(slice(0, 2), slice(0, 2)), (slice(0, 2), slice(2, 4)), (slice(2, 4), slice(0, 4))]):
        hh, ww = np.meshgrid(np.arange(4)[h], np.arange(4)[w], indexing="ij")
        idx = np.stack([np.zeros_like(hh), hh, ww], -1).astype(np.int64)
        inits[f"idx{r}"], inits[f"upd{r}"] = idx, np.full(idx.shape[:-1] + (1,), r + 1, np.float32)
        nodes.append(helper.make_node("ScatterND", [prev, f"idx{r}", f"upd{r}"], [f"mask{r}"]))
        prev = f"mask{r}"
    inits["two"] = np.full((1,), 2.0, np.float32)
    inits["cell"] = np.array([[0, 1, 1, 0]], np.int64)
    nodes += [helper.make_node("ScatterND", [prev, "cell", "two"], ["scaled"], reduction="mul"),
              helper.make_node("Add", ["x", "scaled"], ["y"])]
    m = model(nodes, {"x": ((1, 4, 4, 1), "float32")}, {"y": (None, "float32")}, inits, opset=18)
    g = from_onnx(m)
    assert ops(g) == ["Add"]
    x = rand(RNG, (1, 4, 4, 1))
    (y,) = run(m, {"x": x})
    np.testing.assert_array_equal(y, ReferenceEvaluator(m).run(None, {"x": x})[0])


def test_levit_attention_biases_gathered_by_gather_nd_fold():
    """A LeViT indexes its constant attention-bias table with GatherND of constant offsets; only
    the Add to the run-time scores stays."""
    table = rand(RNG, (2, 5))
    offsets = RNG.integers(-5, 5, (2, 4, 4, 1)).astype(np.int64)
    nodes = [helper.make_node("GatherND", ["table", "offsets"], ["bias"], batch_dims=1),
             helper.make_node("Add", ["scores", "bias"], ["y"])]
    m = model(nodes, {"scores": ((1, 2, 4, 4), "float32")}, {"y": (None, "float32")},
              {"table": table, "offsets": offsets}, opset=13)
    g = from_onnx(m)
    assert ops(g) == ["Add"]
    s = rand(RNG, (1, 2, 4, 4))
    (y,) = run(m, {"scores": s})
    assert_close(y, ReferenceEvaluator(m).run(None, {"scores": s})[0])


def test_any_constant_node_folds_even_of_dtypes_kernels_do_not_take():
    """CumSum, Mod and a float16 / uint8 round trip are no kernels of tunefarm; on constants they
    fold (the float16 and uint8 values feed only folded nodes). A MatMul of two constants, a
    kernel op without a numpy fold, folds too."""
    a, b = rand(RNG, (3, 4)), rand(RNG, (4, 2))
    half = numpy_helper.from_array(np.array([[1.5], [-2.0], [0.25]], np.float16), "half")
    nodes = [helper.make_node("CumSum", ["a", "axis"], ["cs"]),
             helper.make_node("Cast", ["cs"], ["cs16"], to=TensorProto.FLOAT16),
             helper.make_node("Cast", ["cs16"], ["cs32"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["counts"], ["bytes"], to=TensorProto.UINT8),
             helper.make_node("Mod", ["bytes", "three"], ["mod8"]),
             helper.make_node("Cast", ["mod8"], ["mod"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["cs32", "b"], ["ab"]),
             helper.make_node("Cast", ["half"], ["h32"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "ab"], ["y0"]),
             helper.make_node("Mul", ["y0", "mod"], ["y1"]),
             helper.make_node("Add", ["y1", "h32"], ["y"])]
    m = model(nodes, {"x": ((3, 2), "float32")}, {"y": (None, "float32")},
              {"a": a, "b": b, "axis": np.array(1, np.int64), "counts": np.array([[7], [8], [250]], np.int64),
               "three": np.array(3, np.uint8)}, opset=14)
    m.graph.initializer.append(half)
    m.graph.node.insert(0, helper.make_node("Identity", ["half"], ["unused16"]))
    g = from_onnx(m)
    assert ops(g) == ["Add", "Mul", "Add"]
    x = rand(RNG, (3, 2))
    (y,) = run(m, {"x": x})
    assert_close(y, ReferenceEvaluator(m).run(None, {"x": x})[0])


def test_only_nodes_that_run_as_kernels_are_refused_all_at_once():
    nodes = [helper.make_node("CumSum", ["c", "axis"], ["folded"], name="folds"),
             helper.make_node("CumSum", ["x", "axis"], ["a"], name="cumsum_x"),
             helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16, name="to_half"),
             helper.make_node("RandomUniform", [], ["noise"], shape=[2, 3], name="noise"),
             helper.make_node("Cast", ["c"], ["c16"], to=TensorProto.FLOAT16, name="const_half"),
             helper.make_node("Add", ["x", "folded"], ["b"]),
             helper.make_node("Add", ["b", "noise"], ["y"])]
    m = model(nodes, {"x": ((2, 3), "float32")}, {"y": (None, "float32"), "a": (None, "float32")},
              {"c": rand(RNG, (2, 3)), "axis": np.array(0, np.int64)})
    m.graph.output.append(helper.make_tensor_value_info("x16", TensorProto.FLOAT16, None))
    with pytest.raises(UnsupportedModelError) as err:
        from_onnx(m)
    names = {p[1] for p in err.value.problems}
    assert names == {"cumsum_x", "to_half", "noise"}, err.value.problems


def test_a_folded_value_of_a_dtype_kernels_lack_is_refused_where_a_kernel_reads_it():
    nodes = [helper.make_node("Cast", ["c"], ["c16"], to=TensorProto.FLOAT16),
             helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16),
             helper.make_node("Add", ["x16", "c16"], ["y16"], name="half_add"),
             helper.make_node("Cast", ["y16"], ["y"], to=TensorProto.FLOAT)]
    m = model(nodes, {"x": ((3,), "float32")}, {"y": (None, "float32")}, {"c": rand(RNG, (3,))})
    with pytest.raises(UnsupportedModelError, match="Cast"):
        from_onnx(m)
    # folded float16 constants read by a kernel (the Where's condition is a run-time value)
    nodes = [helper.make_node("Cast", ["c"], ["c16"], to=TensorProto.FLOAT16),
             helper.make_node("Cast", ["d"], ["d16"], to=TensorProto.FLOAT16),
             helper.make_node("Where", ["keep", "c16", "d16"], ["y16"], name="half_where"),
             helper.make_node("Cast", ["y16"], ["y"], to=TensorProto.FLOAT)]
    m = model(nodes, {"keep": ((3,), "bool")}, {"y": (None, "float32")}, {"c": rand(RNG, (3,)), "d": rand(RNG, (3,))})
    with pytest.raises(UnsupportedModelError, match="half_where.*float16") as err:
        from_onnx(m)
    assert len(err.value.problems) == 1


def test_a_constant_node_the_evaluator_cannot_compute_is_refused_with_the_reason():
    nodes = [helper.make_node("MyOp", ["c"], ["k"], name="custom_const", domain="com.example"),
             helper.make_node("Add", ["x", "k"], ["y"])]
    m = model(nodes, {"x": ((3,), "float32")}, {"y": (None, "float32")}, {"c": rand(RNG, (3,))})
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedModelError, match="custom_const") as err:
        from_onnx(m)
    assert len(err.value.problems) == 1


@pytest.mark.parametrize("mask", ["padded", "random", "ones", "zeros"])
def test_the_exported_attention_mask_runs_as_kernels(mask):
    """The dynamo exporter's padding mask: Cast(mask → bool) → GatherND of each key's flag → And
    with a constant causal mask → Where(0, -inf) added to the scores → Softmax, whose fully
    masked rows are NaN, zeroed by IsNaN → Where. A mask of zeros masks every row."""
    L = 6
    causal = np.tril(np.ones((L, L), bool)).reshape(1, 1, L, L)
    idx = np.stack([np.zeros(L, np.int64), np.arange(L)], -1).reshape(1, 1, 1, L, 2)
    nodes = [helper.make_node("Cast", ["mask"], ["mask_b"], to=TensorProto.BOOL),
             helper.make_node("GatherND", ["mask_b", "idx"], ["keys"]),
             helper.make_node("And", ["causal", "keys"], ["allowed"]),
             helper.make_node("Where", ["allowed", "zero", "minf"], ["bias"]),
             helper.make_node("Add", ["scores", "bias"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
             helper.make_node("IsNaN", ["p"], ["nan"]),
             helper.make_node("Where", ["nan", "zero", "p"], ["y"])]
    inits = {"causal": causal, "idx": idx, "zero": np.array(0.0, np.float32), "minf": np.array(-np.inf, np.float32)}
    m = model(nodes, {"scores": ((1, 2, L, L), "float32"), "mask": ((1, L), "int64")}, {"y": (None, "float32")},
              inits, opset=18)
    assert sorted(ops(from_onnx(m))) == sorted(["Cast", "GatherND", "And", "Where", "Add", "Softmax", "IsNaN", "Where"])
    flags = {"padded": [1, 1, 1, 1, 0, 0], "ones": [1] * L, "zeros": [0] * L,
             "random": [0, 1, 1, 0, 1, 0]}[mask]
    feeds = {"scores": rand(RNG, (1, 2, L, L), hi=4.0), "mask": np.array([flags], np.int64)}
    (y,) = run(m, feeds)
    with np.errstate(invalid="ignore"):   # the reference's softmax of a fully masked row
        want = ReferenceEvaluator(m).run(None, feeds)[0]
    assert not np.isnan(y).any()
    assert_close(y, want)
    if mask == "zeros":
        assert not y.any()


def test_folded_initializers_keep_their_arrays():
    """A constant the importer computes is an ordinary constant Value (shape, dtype, array)."""
    nodes = [helper.make_node("Trilu", ["c"], ["t"], upper=0), helper.make_node("Mul", ["x", "t"], ["y"])]
    c = rand(RNG, (3, 3))
    m = model(nodes, {"x": ((3, 3), "float32")}, {"y": (None, "float32")}, {"c": c}, opset=14)
    g = from_onnx(m)
    assert ops(g) == ["Mul"]
    t = g.values["t"]
    assert t.dtype == "float32" and t.shape == (3, 3)
    np.testing.assert_array_equal(t.const, np.tril(c))


def test_range_of_shapes_folds_and_of_run_time_values_is_a_shape_error():
    """Range's length is its shape: from Shape → Gather it is a constant; from data it is a
    ShapeError naming the input that would have to be constant."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
             helper.make_node("Range", ["zero", "n", "step"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "rf"], ["y"])]
    inits = {"zero": np.array(0, np.int64), "one": np.array(1, np.int64), "step": np.array(2, np.int64)}
    m = model(nodes, {"x": ((2, 6), "float32")}, {"y": (None, "float32")}, inits)
    with pytest.raises(Exception, match="broadcast"):
        from_onnx(m)   # 3 values against 6 columns: the length came from the shape
    inits["step"] = np.array(1, np.int64)
    m = model(nodes, {"x": ((2, 6), "float32")}, {"y": (None, "float32")}, inits)
    assert ops(from_onnx(m)) == ["Add"]
    nodes[2] = helper.make_node("Range", ["zero", "lim", "step"], ["r"], name="data_range")
    m = model(nodes[2:], {"x": ((2, 6), "float32"), "lim": ((), "int64")}, {"y": (None, "float32")}, inits)
    with pytest.raises(ShapeError, match="data_range.*limit.*run time") as err:
        from_onnx(m)
    assert err.value.needs_constant == "lim"
