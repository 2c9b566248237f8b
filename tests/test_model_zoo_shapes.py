"""bench/model_zoo.py's deployed shapes (issue 54), without timing anything: the keys, the inputs
of the torch-defined models at a batch and sequence length, and the light zoo's symbolic batch
(onnxruntime runs the rewritten file at batch 3 and each row equals the batch-1 answer)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def zoo():
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("model_zoo", ROOT / "bench" / "model_zoo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_keys(zoo):
    assert zoo.key_of("light_resnet50", "onnx", 8, 128) == "light_resnet50/onnx/b8"
    assert zoo.key_of("resnet18", "dynamo", 1, 512) == "resnet18/dynamo/b1"          # no sequence axis
    assert zoo.key_of("bert_base", "torchscript", 8, 128) == "bert_base/torchscript/b8"
    assert zoo.key_of("llama_decode", "dynamo", 1, 32) == "llama_decode/dynamo/b1/s32"


def test_feeds(zoo):
    bert = zoo.model_feeds("bert_base", 2, 40)
    assert bert["input_ids"].shape == (2, 40) and bert["input_ids"].dtype == np.int64
    assert bert["attention_mask"][0, -4:].sum() == 0 and bert["attention_mask"][0, :-4].all()
    assert bert["attention_mask"][1].all()
    decode = zoo.model_feeds("llama_decode", 3, 128)
    inputs, _, axes = zoo.io_names("llama_decode")
    assert list(decode) == inputs
    assert decode["attention_mask"].shape == (3, 128) and decode["position_ids"].tolist() == [[127]] * 3
    assert decode["past_key_0"].shape == (3, 4, 127, 64) and axes["past_key_0"] == {0: "batch", 2: "past"}
    assert zoo.model_feeds("vit_b16_mha", 2, 128)["input"].shape == (2, 3, 224, 224)


def test_light_symbolic_batch(zoo, tmp_path):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    import onnx
    path = str(tmp_path / "alexnet.onnx")
    zoo.light_model("bvlc_alexnet", path)
    rewritten = zoo.symbolic_batch(path)
    assert len(rewritten) == 1                  # the Reshape to [1, 9216] before the classifier
    model = onnx.load(path)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    x = zoo.model_inputs(model, batch=3)["data_0"]
    assert x.shape == (3, 3, 224, 224)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (batched,) = session.run(None, {"data_0": x})
    assert batched.shape == (3, 1000)
    (row,) = session.run(None, {"data_0": x[1:2]})
    np.testing.assert_allclose(batched[1:2], row, rtol=1e-4, atol=1e-6)
