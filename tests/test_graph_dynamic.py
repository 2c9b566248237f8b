"""Models with symbolic input dimensions run without pinning: each new signature compiled on
first use, kept in a bounded cache, records served across signatures, symbols checked."""

from __future__ import annotations

import numpy as np
import pytest
from graph_models import assert_close, model, rand
from onnx import TensorProto, helper

from compiler.graph import GraphModule, InputError, ShapeSpecializedModel, compile_onnx
from compiler.graph.errors import DynamicShapeError, ShapeError

RNG = np.random.default_rng(11)


def _two_inputs_model():
    """y = relu(reshape(x, [batch, seq * 4]) @ w) + mask, the reshape's shape built from Shape of x
    as exporters write it; x is [batch, seq, 4], mask [batch, 1], both symbolic in `batch`."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0),
        helper.make_node("Unsqueeze", ["d0", "ax"], ["u0"]),
        helper.make_node("Concat", ["u0", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("MatMul", ["r", "w"], ["mm"]),
        helper.make_node("Relu", ["mm"], ["a"]),
        helper.make_node("Add", ["a", "mask"], ["y"]),
    ]
    w = rand(RNG, (12, 5))
    inits = {"i0": np.array(0, np.int64), "ax": np.array([0], np.int64), "minus1": np.array([-1], np.int64),
             "w": w}
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 4])
    mask = helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "dyn", [x, mask], [y],
                              [helper.make_tensor(k, TensorProto.INT64 if v.dtype == np.int64 else TensorProto.FLOAT,
                                                  v.shape, v.flatten().tolist()) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), w


def _reference(x, mask, w):
    return np.maximum(x.reshape(x.shape[0], -1).astype(np.float64) @ w, 0) + mask


def test_each_batch_compiled_on_first_use_and_kept():
    m, w = _two_inputs_model()
    compiled = compile_onnx(m)
    assert isinstance(compiled, ShapeSpecializedModel)
    assert compiled.symbolic == {"x": [0], "mask": [0]}
    for batch in (1, 3, 8, 3, 1):
        x, mask = rand(RNG, (batch, 3, 4)), rand(RNG, (batch, 1))
        (y,) = compiled.run(x=x, mask=mask)
        assert y.shape == (batch, 5)
        assert_close(y, _reference(x, mask, w))
    assert compiled.builds == 3   # 1, 3 and 8, each once
    assert [s["x"] for s in compiled.shapes] == [(8, 3, 4), (3, 3, 4), (1, 3, 4)]


def test_the_cache_is_bounded_least_recently_used_first():
    m, w = _two_inputs_model()
    compiled = ShapeSpecializedModel(m, max_shapes=2)
    for batch in (1, 2, 1, 3):
        compiled.run(x=rand(RNG, (batch, 3, 4)), mask=rand(RNG, (batch, 1)))
    assert sorted(s["x"][0] for s in compiled.shapes) == [1, 3]   # 2 was the least recently used
    x, mask = rand(RNG, (2, 3, 4)), rand(RNG, (2, 1))
    (y,) = compiled.run(x=x, mask=mask)                             # compiled again, still right
    assert_close(y, _reference(x, mask, w))
    assert compiled.builds == 4
    with pytest.raises(ValueError, match="max_shapes"):
        ShapeSpecializedModel(m, max_shapes=0)


def test_a_symbol_is_one_size_and_fixed_dimensions_are_checked():
    m, _ = _two_inputs_model()
    compiled = ShapeSpecializedModel(m)
    with pytest.raises(InputError, match="'batch'.*is 2.*'x' dimension 0 gives 'batch' = 3"):
        compiled.run(x=rand(RNG, (3, 3, 4)), mask=rand(RNG, (2, 1)))
    with pytest.raises(InputError, match="dimension 1 must be 3"):
        compiled.run(x=rand(RNG, (2, 5, 4)), mask=rand(RNG, (2, 1)))
    with pytest.raises(InputError, match="expected rank 3"):
        compiled.run(x=rand(RNG, (2, 12)), mask=rand(RNG, (2, 1)))
    with pytest.raises(InputError, match="dtype float32"):
        compiled.run(x=rand(RNG, (2, 3, 4)).astype(np.float64), mask=rand(RNG, (2, 1)))
    with pytest.raises(InputError, match="missing \\['mask'\\]"):
        compiled.run(x=rand(RNG, (2, 3, 4)))
    assert compiled.builds == 0   # nothing was compiled for a bad call


def test_a_compiled_signature_still_checks_every_call():
    """A shape seen before skips the signature's validation, not the checks: a wrong dtype, a
    non-array or a missing input of that shape is still a clear InputError, and nothing is built."""
    m, w = _two_inputs_model()
    compiled = ShapeSpecializedModel(m)
    x, mask = rand(RNG, (2, 3, 4)), rand(RNG, (2, 1))
    compiled.run(x=x, mask=mask)
    with pytest.raises(InputError, match="dtype float32"):
        compiled.run(x=x.astype(np.float64), mask=mask)
    with pytest.raises(InputError):
        compiled.run(x=x.tolist(), mask=mask)
    with pytest.raises(InputError, match="missing \\['mask'\\]"):
        compiled.run(x=x, other=mask)
    (y,) = compiled.run(x=x, mask=mask)
    assert_close(y, _reference(x, mask, w))
    assert compiled.builds == 1


def test_pinned_shapes_build_ahead_of_time():
    m, w = _two_inputs_model()
    module = compile_onnx(m, input_shapes={"x": (4, 3, 4), "mask": (4, 1)})
    assert isinstance(module, GraphModule)
    x, mask = rand(RNG, (4, 3, 4)), rand(RNG, (4, 1))
    assert_close(module.run(x=x, mask=mask)[0], _reference(x, mask, w))
    partly = compile_onnx(m, input_shapes={"x": (4, 3, 4)})      # mask's batch is still open
    assert isinstance(partly, ShapeSpecializedModel) and partly.symbolic == {"mask": [0]}
    with pytest.raises(ShapeError, match="input_shapes gives \\(4, 5, 4\\)"):
        compile_onnx(m, input_shapes={"x": (4, 5, 4)})


def test_an_input_without_a_rank_must_be_pinned():
    node = helper.make_node("Relu", ["x"], ["y"])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, None)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    m = helper.make_model(helper.make_graph([node], "norank", [x], [y]), opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(DynamicShapeError, match="no shape"):
        compile_onnx(m)
    a = rand(RNG, (2, 3))
    assert_close(compile_onnx(m, input_shapes={"x": (2, 3)}).run(x=a)[0], np.maximum(a, 0))


def test_records_tuned_at_one_signature_serve_another():
    """A decode step's projection does not depend on the cache length: the provider is asked for
    the same workload key at every signature, so a record tuned at one length serves them all."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["past"], ["p"])]
    m = model(nodes, {"x": ((1, 8), "float32"), "past": ((1, 8), "float32")},
              {"y": (None, "float32"), "p": (None, "float32")}, {"w": rand(RNG, (8, 16))}, dynamic={"past": 0})

    class Provider:
        def __init__(self):
            self.keys = []

        def lookup(self, opdef, target):
            self.keys.append((opdef.name, opdef.workload_key()))
            return None

    provider = Provider()
    compiled = ShapeSpecializedModel(m, records=provider)
    with pytest.warns(UserWarning):
        compiled.run(x=rand(RNG, (1, 8)), past=rand(RNG, (3, 8)))
        compiled.run(x=rand(RNG, (1, 8)), past=rand(RNG, (7, 8)))
    first, second = provider.keys[:len(provider.keys) // 2], provider.keys[len(provider.keys) // 2:]
    assert len(first) == len(second) == 2
    assert len(set(first) & set(second)) == 1          # the projection's, asked at both lengths


def test_cli_sets_symbols_by_name_and_runs_open_ones_at_one(tmp_path, capsys):
    from tuner.cli import main
    m, _ = _two_inputs_model()
    path = tmp_path / "dyn.onnx"
    path.write_bytes(m.SerializeToString())
    assert main(["model", "run", str(path), "--no-records", "--repeat", "1", "--dim", "batch=3"]) == 0
    captured = capsys.readouterr()
    assert "MISMATCH" not in captured.out and "note:" not in captured.err
    assert main(["model", "run", str(path), "--no-records", "--repeat", "1"]) == 0
    assert "x[0] (batch), mask[0] (batch) taken as 1" in capsys.readouterr().err
    assert main(["model", "tasks", str(path)]) == 2          # a tuning shape is never guessed
    assert "--input-shape" in capsys.readouterr().err
    assert main(["model", "tasks", str(path), "--dim", "batch=4"]) == 0
    assert main(["model", "run", str(path), "--dim", "batch=zero"]) == 2
    assert "expected SYMBOL=SIZE" in capsys.readouterr().err


def test_a_run_whose_inputs_index_out_of_range_is_a_clear_error_of_the_cli(tmp_path, capsys):
    """`model run` on random inputs at shapes where the model's positions outrun its mask: the
    run's KernelRuntimeError is the command's error (exit 1), naming the node, not a traceback."""
    from tuner.cli import main
    nodes = [helper.make_node("Shape", ["past"], ["ps"], start=1, end=2),
             helper.make_node("Squeeze", ["ps"], ["p"]),
             helper.make_node("Range", ["zero", "p", "one"], ["r"]),
             helper.make_node("Unsqueeze", ["r", "axes"], ["idx"]),
             helper.make_node("GatherND", ["mask", "idx"], ["y"], name="mask_at_positions")]
    consts = {"zero": np.array(0, np.int64), "one": np.array(1, np.int64), "axes": np.array([1], np.int64)}
    m = model(nodes, {"mask": (("s",), "float32"), "past": ((1, "p"), "float32")}, {"y": (None, "float32")},
              consts, opset=18)
    path = tmp_path / "positions.onnx"
    path.write_bytes(m.SerializeToString())
    assert main(["model", "run", str(path), "--no-records", "--repeat", "1", "--dim", "s=2", "--dim", "p=3"]) == 1
    err = capsys.readouterr().err
    assert "error: the run failed: GatherND node 'mask_at_positions': index 2" in err and "Traceback" not in err
    assert main(["model", "run", str(path), "--no-records", "--repeat", "1", "--dim", "s=4", "--dim", "p=3"]) == 0
