"""GatherND, GatherElements, ScatterND, Tile and Trilu as kernels (inputs that are not
constants), against onnx's reference evaluator: negative indices, batch_dims, reductions,
broadcast-free odd shapes of ranks 1-4. Several nodes share one model to keep the builds few."""

from __future__ import annotations

import numpy as np
import pytest
from graph_models import assert_close, model, rand, run
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from compiler.errors import KernelRuntimeError
from compiler.graph import ShapeError, UnsupportedModelError, build_model, compile_onnx, from_onnx

RNG = np.random.default_rng(11)


def indices(shape, n, dtype="int64"):
    """Random indices into an axis of extent n, negative ones (from the end) included."""
    return RNG.integers(-n, n, shape).astype(dtype)


def check(nodes, inputs, outputs, feeds, opset=18, exact=True):
    """Every output of the compiled model against onnx's reference evaluator on the same model."""
    m = model(nodes, {k: (v.shape, str(v.dtype)) for k, v in inputs.items()}, outputs, opset=opset)
    got = run(m, feeds)
    want = ReferenceEvaluator(m).run(None, feeds)
    for name, g, w in zip(outputs, got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (name, g.dtype, g.shape, w.dtype, w.shape)
        if exact:
            np.testing.assert_array_equal(g, w, err_msg=name)
        else:
            assert_close(g, w)


def test_gather_nd_batch_dims_and_negative_indices():
    feeds = {"a": rand(RNG, (3, 4, 5)), "ia": indices((2, 2), 3),          # k=2 of rank 3
             "b": rand(RNG, (2, 3, 4, 5)), "ib": indices((2, 3, 2), 3, "int32"),   # batch_dims 1, k 2
             "c": rand(RNG, (6,)), "ic": indices((4, 1), 6),              # rank 1, whole tuples
             "d": RNG.random((1, 8)) > 0.5, "id": indices((1, 1, 8, 2), 1)}   # a mask's bool data
    feeds["id"][..., 1] = indices((1, 1, 8), 8)
    feeds["ib"][..., 1] = indices((2, 3), 4, "int32")
    feeds["ia"][:, 1] = indices(2, 4)
    nodes = [helper.make_node("GatherND", ["a", "ia"], ["ya"]),
             helper.make_node("GatherND", ["b", "ib"], ["yb"], batch_dims=1),
             helper.make_node("GatherND", ["c", "ic"], ["yc"]),
             helper.make_node("GatherND", ["d", "id"], ["yd"])]
    outputs = {"ya": ((2, 5), "float32"), "yb": ((2, 3, 5), "float32"), "yc": ((4,), "float32"),
               "yd": ((1, 1, 8), "bool")}
    check(nodes, feeds, outputs, feeds)


def test_gather_elements_every_axis_and_smaller_indices():
    feeds = {"a": rand(RNG, (3, 4)), "ia": indices((3, 6), 4),
             "b": rand(RNG, (2, 3, 4)), "ib": indices((2, 3, 4), 2, "int32"),
             "c": rand(RNG, (5,)), "ic": indices((7,), 5)}
    nodes = [helper.make_node("GatherElements", ["a", "ia"], ["ya"], axis=1),
             helper.make_node("GatherElements", ["b", "ib"], ["yb"], axis=-3),
             helper.make_node("GatherElements", ["c", "ic"], ["yc"])]
    check(nodes, feeds, {"ya": ((3, 6), "float32"), "yb": ((2, 3, 4), "float32"), "yc": ((7,), "float32")}, feeds)

    # indices smaller than the data outside the axis (torch.gather's form): numpy's reference
    x, i = rand(RNG, (4, 5, 6)), indices((2, 5, 3), 6)
    m = model([helper.make_node("GatherElements", ["x", "i"], ["y"], axis=2)],
              {"x": (x.shape, "float32"), "i": (i.shape, "int64")}, {"y": (None, "float32")})
    (y,) = run(m, {"x": x, "i": i})
    np.testing.assert_array_equal(y, np.take_along_axis(x[:2, :, :], np.where(i < 0, i + 6, i), axis=2))


def test_scatter_nd_replaces_and_reduces():
    data = rand(RNG, (4, 5, 6))
    rows = np.array([[-1], [1]], np.int64)                           # k=1, a negative index
    cells = np.array([[0, 2], [3, -1], [2, 2]], np.int64)            # k=2
    dup = np.array([[[1, 2, 3], [1, 2, 3]], [[0, 0, 0], [-1, -1, -1]]], np.int64)   # k=3, a duplicate
    feeds = {"x": data, "r": rows, "ur": rand(RNG, (2, 5, 6)), "c": cells, "uc": rand(RNG, (3, 6)),
             "d": dup, "ud": rand(RNG, (2, 2)), "m": RNG.random((3, 4)) > 0.5,
             "mi": np.array([[2, 0], [0, -1]], np.int64), "mu": np.array([True, False])}
    nodes = [helper.make_node("ScatterND", ["x", "r", "ur"], ["y_rows"]),
             helper.make_node("ScatterND", ["x", "c", "uc"], ["y_cells"]),
             helper.make_node("ScatterND", ["x", "d", "ud"], ["y_add"], reduction="add"),
             helper.make_node("ScatterND", ["x", "d", "ud"], ["y_max"], reduction="max"),
             helper.make_node("ScatterND", ["x", "d", "ud"], ["y_min"], reduction="min"),
             helper.make_node("ScatterND", ["m", "mi", "mu"], ["y_bool"])]
    outputs = {k: ((4, 5, 6), "float32") for k in ("y_rows", "y_cells", "y_add", "y_max", "y_min")}
    outputs["y_bool"] = ((3, 4), "bool")
    check(nodes, feeds, outputs, feeds, exact=False)


def test_scatter_nd_refuses_mul_at_run_time_and_bad_updates():
    x, i, u = rand(RNG, (4, 3)), np.array([[1]], np.int64), rand(RNG, (1, 3))
    ins = {"x": (x.shape, "float32"), "i": (i.shape, "int64"), "u": (u.shape, "float32")}
    node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction="mul", name="scatter_mul")
    with pytest.raises(UnsupportedModelError, match="scatter_mul.*mul"):
        from_onnx(model([node], ins, {"y": (None, "float32")}, opset=18))
    node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"], name="bad_scatter")
    ins["u"] = ((1, 4), "float32")
    with pytest.raises(ShapeError, match="bad_scatter.*updates"):
        from_onnx(model([node], ins, {"y": (None, "float32")}, opset=18))


def test_tile_and_trilu():
    feeds = {"a": rand(RNG, (3,)), "b": rand(RNG, (2, 1, 3)), "c": rand(RNG, (1, 2, 3, 2)),
             "t": rand(RNG, (2, 4, 5)), "s": rand(RNG, (5, 3))}
    reps = {"ra": np.array([3], np.int64), "rb": np.array([2, 3, 1], np.int64),
            "rc": np.array([2, 1, 1, 3], np.int64), "k1": np.array(1, np.int64), "km": np.array(-2, np.int64)}
    nodes = [helper.make_node("Tile", ["a", "ra"], ["ya"]),
             helper.make_node("Tile", ["b", "rb"], ["yb"]),
             helper.make_node("Tile", ["c", "rc"], ["yc"]),
             helper.make_node("Trilu", ["t"], ["upper"]),
             helper.make_node("Trilu", ["t", "k1"], ["lower_k1"], upper=0),
             helper.make_node("Trilu", ["s", "km"], ["upper_km"]),
             helper.make_node("Trilu", ["s", "k1"], ["lower_s"], upper=0)]
    m = model(nodes, {k: (v.shape, "float32") for k, v in feeds.items()},
              {n: (None, "float32") for n in ("ya", "yb", "yc", "upper", "lower_k1", "upper_km", "lower_s")},
              reps, opset=14)
    got = run(m, feeds)
    want = [np.tile(feeds["a"], 3), np.tile(feeds["b"], (2, 3, 1)), np.tile(feeds["c"], (2, 1, 1, 3)),
            np.triu(feeds["t"]), np.tril(feeds["t"], 1), np.triu(feeds["s"], -2), np.tril(feeds["s"], 1)]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_tile_repeats_must_be_constant():
    node = helper.make_node("Tile", ["x", "r"], ["y"], name="the_tile")
    m = model([node], {"x": ((2, 3), "float32"), "r": ((2,), "int64")}, {"y": (None, "float32")})
    with pytest.raises(ShapeError, match="the_tile.*repeats.*constant") as err:
        from_onnx(m)
    assert err.value.needs_constant == "r"


@pytest.mark.parametrize("op", ["GatherND", "GatherElements", "ScatterND"])
def test_an_index_outside_its_axis_stops_the_run_naming_the_node(op):
    """ONNX's indices lie in [-n, n); one outside is the run's KernelRuntimeError naming the node
    and the value, never a clamped or wrapped element."""
    x = rand(RNG, (3, 4))
    bad = {"GatherND": np.array([[1, 4]], np.int64), "GatherElements": np.array([[0, -5, 1, 2]] * 3, np.int64),
           "ScatterND": np.array([[-4]], np.int64)}[op]
    ins = {"x": (x.shape, "float32"), "i": (bad.shape, "int64")}
    feeds = {"x": x, "i": bad}
    inputs = ["x", "i"]
    if op == "ScatterND":
        ins["u"], feeds["u"], inputs = ((1, 4), "float32"), rand(RNG, (1, 4)), ["x", "i", "u"]
    attrs = {"axis": 1} if op == "GatherElements" else {}
    m = model([helper.make_node(op, inputs, ["y"], name="the_index_op", **attrs)], ins, {"y": (None, "float32")},
              opset=13)
    module = build_model(from_onnx(m))
    value = {"GatherND": 4, "GatherElements": -5, "ScatterND": -4}[op]
    with pytest.raises(KernelRuntimeError, match=rf"{op} node 'the_index_op'.*index {value}\b.*out of range"):
        module.run(**feeds)
    good = dict(feeds, i=np.zeros_like(bad))
    module.run(**good)


@pytest.mark.parametrize("op", ["Gather", "GatherND", "GatherElements", "ScatterND"])
def test_an_index_into_an_axis_of_one_element_is_checked(op):
    """An axis of one element takes the indices 0 and -1 only; the index arithmetic that wraps a
    negative index must not fold the check away with the wrap (`i % 1` is 0 for any i): index 1
    read element 0 without a word."""
    x = rand(RNG, (1, 3)) if op != "GatherElements" else rand(RNG, (3, 1))
    shape = {"Gather": (2,), "GatherND": (2, 1), "GatherElements": (3, 1), "ScatterND": (1, 1)}[op]
    ins = {"x": (x.shape, "float32"), "i": (shape, "int64")}
    inputs, attrs = ["x", "i"], ({"axis": 1} if op == "GatherElements" else {})
    if op == "ScatterND":
        ins["u"], inputs = ((1, 3), "float32"), ["x", "i", "u"]
    m = model([helper.make_node(op, inputs, ["y"], name="unit_axis", **attrs)], ins, {"y": (None, "float32")},
              opset=13)
    module = build_model(from_onnx(m))
    u = rand(RNG, (1, 3))
    for value in (1, -2, 7):
        feeds = {"x": x, "i": np.full(shape, value, np.int64)}
        if op == "ScatterND":
            feeds["u"] = u
        with pytest.raises(KernelRuntimeError, match=rf"{op} node 'unit_axis'.*index {value}\b.*out of range \[-1, 1\)"):
            module.run(**feeds)
    ref = ReferenceEvaluator(m)
    for value in (0, -1):
        feeds = {"x": x, "i": np.full(shape, value, np.int64)}
        if op == "ScatterND":
            feeds["u"] = u
        (got,) = module.run(**feeds)
        np.testing.assert_array_equal(got, ref.run(None, feeds)[0])


def test_indices_made_from_shapes_are_checked_against_the_data_they_index():
    """A decoder's mask gathered at positions 0..past (a Range over a shape): where the mask is
    shorter than past + 1, the run fails naming the node, as onnxruntime's does, and never
    reads past the mask, whatever shape the model is specialised for."""
    nodes = [helper.make_node("Shape", ["past"], ["ps"], start=2, end=3),
             helper.make_node("Add", ["ps", "one"], ["tot"]),
             helper.make_node("Squeeze", ["tot"], ["tots"]),
             helper.make_node("Range", ["zero", "tots", "step"], ["r"]),
             helper.make_node("Unsqueeze", ["r", "ax1"], ["r1"]),
             helper.make_node("Mul", ["r1", "zero"], ["b0"]),
             helper.make_node("Concat", ["b0", "r1"], ["idx"], axis=1),
             helper.make_node("GatherND", ["mask", "idx"], ["g"], name="mask_at_positions"),
             helper.make_node("Cast", ["g"], ["y"], to=TensorProto.FLOAT)]
    consts = {"one": np.array([1], np.int64), "zero": np.array(0, np.int64), "step": np.array(1, np.int64),
              "ax1": np.array([1], np.int64)}
    m = model(nodes, {"mask": (("b", "s"), "int64"), "past": (("b", 1, "p", 4), "float32")},
              {"y": (None, "float32")}, consts, opset=18)
    compiled = compile_onnx(m)
    for s, p in ((1, 1), (2, 2), (3, 7)):
        feeds = {"mask": np.arange(1, s + 1, dtype=np.int64)[None], "past": rand(RNG, (1, 1, p, 4))}
        with pytest.raises(KernelRuntimeError, match=rf"GatherND node 'mask_at_positions'.*index {s}\b"):
            compiled.run(**feeds)
    feeds = {"mask": np.arange(1, 5, dtype=np.int64)[None], "past": rand(RNG, (1, 1, 3, 4))}
    (got,) = compiled.run(**feeds)
    np.testing.assert_array_equal(got, [1.0, 2.0, 3.0, 4.0])
