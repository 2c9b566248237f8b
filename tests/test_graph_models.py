"""Whole small models end to end against numpy: an MLP and a ResNet-like network; the CLI; a
fused workload tuned by the tuner and found again by apply-best when the model is built."""

from __future__ import annotations

import numpy as np
import pytest
from graph_models import assert_close, model, np_bn, np_conv, np_pool, np_softmax, rand
from onnx import helper

from compiler.graph import build_model, extract_tasks, from_onnx

RNG = np.random.default_rng(5)


def mlp(batch=4, sizes=(48, 32, 32, 10)):
    """Gemm (transB, as torch's Linear) + Relu, MatMul + Add + Tanh, Gemm + Sigmoid, Softmax."""
    p = {}
    p["w0"], p["b0"] = rand(RNG, (sizes[1], sizes[0])), rand(RNG, (sizes[1],))
    p["w1"], p["b1"] = rand(RNG, (sizes[1], sizes[2])), rand(RNG, (sizes[2],))
    p["w2"], p["b2"] = rand(RNG, (sizes[3], sizes[2])), rand(RNG, (sizes[3],))
    nodes = [helper.make_node("Gemm", ["x", "w0", "b0"], ["h0"], transB=1),
             helper.make_node("Relu", ["h0"], ["a0"]),
             helper.make_node("MatMul", ["a0", "w1"], ["h1"]),
             helper.make_node("Add", ["h1", "b1"], ["h1b"]),
             helper.make_node("Tanh", ["h1b"], ["a1"]),
             helper.make_node("Gemm", ["a1", "w2", "b2"], ["h2"], transB=1),
             helper.make_node("Sigmoid", ["h2"], ["a2"]),
             helper.make_node("Softmax", ["a2"], ["y"], axis=-1)]
    m = model(nodes, {"x": ((batch, sizes[0]), "float32")}, {"y": (None, "float32")}, p)
    return m, p


def test_mlp_end_to_end():
    m, p = mlp()
    graph = from_onnx(m)
    tasks = extract_tasks(graph)
    assert [t.opdef.name for t in tasks] == ["fused_gemm_relu", "fused_matmul_add_tanh", "fused_gemm_sigmoid", "softmax"]
    x = rand(RNG, (4, 48))
    (y,) = build_model(graph).run(x=x)
    a0 = np.maximum(x.astype(np.float64) @ p["w0"].T + p["b0"], 0)
    a1 = np.tanh(a0 @ p["w1"] + p["b1"])
    a2 = 1 / (1 + np.exp(-(a1 @ p["w2"].T + p["b2"])))
    assert_close(y, np_softmax(a2, -1))


def resnet_like(C=8, H=16, classes=5):
    """Stem conv 7x7/2 + BN + relu, max pool 3x3/2, a basic block, a downsampling block (1x1/2
    shortcut), global average pool, flatten, fully connected."""
    p, nodes = {}, []

    def conv_bn(x, y, cin, cout, k, s, relu, name):
        p[f"{name}_w"] = rand(RNG, (cout, cin, k, k))
        for what in ("g", "b", "m"):
            p[f"{name}_{what}"] = rand(RNG, (cout,))
        p[f"{name}_v"] = RNG.uniform(0.5, 1.5, cout).astype(np.float32)
        nodes.append(helper.make_node("Conv", [x, f"{name}_w"], [f"{name}_c"], kernel_shape=[k, k], strides=[s, s],
                                      pads=[k // 2] * 4, name=name))
        nodes.append(helper.make_node("BatchNormalization", [f"{name}_c"] + [f"{name}_{w}" for w in "gbmv"],
                                      [y if not relu else f"{name}_bn"]))
        if relu:
            nodes.append(helper.make_node("Relu", [f"{name}_bn"], [y]))

    conv_bn("x", "stem", 3, C, 7, 2, True, "stem")
    nodes.append(helper.make_node("MaxPool", ["stem"], ["pool"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    conv_bn("pool", "b1a", C, C, 3, 1, True, "b1a")
    conv_bn("b1a", "b1b", C, C, 3, 1, False, "b1b")
    nodes += [helper.make_node("Add", ["b1b", "pool"], ["b1s"]), helper.make_node("Relu", ["b1s"], ["b1"])]
    conv_bn("b1", "b2a", C, 2 * C, 3, 2, True, "b2a")
    conv_bn("b2a", "b2b", 2 * C, 2 * C, 3, 1, False, "b2b")
    conv_bn("b1", "b2d", C, 2 * C, 1, 2, False, "b2d")
    nodes += [helper.make_node("Add", ["b2b", "b2d"], ["b2s"]), helper.make_node("Relu", ["b2s"], ["b2"]),
              helper.make_node("GlobalAveragePool", ["b2"], ["gap"]), helper.make_node("Flatten", ["gap"], ["flat"]),
              helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["y"], transB=1)]
    p["fc_w"], p["fc_b"] = rand(RNG, (classes, 2 * C)), rand(RNG, (classes,))
    return model(nodes, {"x": ((1, 3, H, H), "float32")}, {"y": (None, "float32")}, p, opset=11), p


def np_resnet_like(x, p):
    def conv_bn(v, name, s, relu):
        k = p[f"{name}_w"].shape[-1]
        y = np_bn(np_conv(v, p[f"{name}_w"], stride=(s, s), pads=(k // 2,) * 4), *(p[f"{name}_{w}"] for w in "gbmv"))
        return np.maximum(y, 0) if relu else y
    stem = conv_bn(x, "stem", 2, True)
    pool = np_pool(stem, (3, 3), (2, 2), (1, 1, 1, 1), "max")
    b1 = np.maximum(conv_bn(conv_bn(pool, "b1a", 1, True), "b1b", 1, False) + pool, 0)
    b2 = np.maximum(conv_bn(conv_bn(b1, "b2a", 2, True), "b2b", 1, False) + conv_bn(b1, "b2d", 2, False), 0)
    return b2.mean(axis=(2, 3)) @ p["fc_w"].T + p["fc_b"]


@pytest.mark.slow
def test_resnet_like_end_to_end():
    m, p = resnet_like()
    graph = from_onnx(m)
    assert not any(n.op_type == "BatchNormalization" for n in graph.nodes)
    names = [t.opdef.name for t in extract_tasks(graph)]
    # the two residual sums fused into their convolutions' epilogues (NCHW or, where the
    # channels fill the target's blocks, the blocked layout's), and one pooling kernel
    assert len([n for n in names if n.startswith(("fused_conv_add_relu", "fused_convnchwc_add_relu"))]) == 2
    assert "max_pool2d" in names or "fused_maxpoolnchwc" in names
    module = build_model(graph)
    assert module.plan.total_bytes < module.plan.unshared_bytes
    for seed in range(2):
        x = rand(np.random.default_rng(seed), (1, 3, 16, 16))
        (y,) = module.run(x=x)
        assert_close(y, np_resnet_like(x, p))


def test_cli_model_tasks_and_run(tmp_path, capsys):
    from tuner.cli import main
    m, _ = mlp()
    path = tmp_path / "mlp.onnx"
    path.write_bytes(m.SerializeToString())
    assert main(["model", "tasks", str(path)]) == 0
    out = capsys.readouterr().out
    assert "4 unique workloads" in out and "fused_gemm_relu" in out and "softmax" in out
    assert main(["model", "run", str(path), "--no-records", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "tunefarm:" in out and "4 default schedules" in out
    assert "MISMATCH" not in out


def test_cli_reports_bad_models_in_one_line(tmp_path, capsys):
    from tuner.cli import main
    bad = tmp_path / "bad.onnx"
    bad.write_text("not a model")
    assert main(["model", "tasks", str(bad)]) == 2
    assert "is not an ONNX model" in capsys.readouterr().err
    node = helper.make_node("Relu", ["x"], ["y"])
    dyn = tmp_path / "dyn.onnx"
    dyn.write_bytes(model([node], {"x": ((1, 4), "float32")}, {"y": (None, "float32")},
                          dynamic={"x": 0}).SerializeToString())
    assert main(["model", "tasks", str(dyn)]) == 2
    assert "--input-shape" in capsys.readouterr().err
    assert main(["model", "tasks", str(dyn), "--input-shape", "x=3,4"]) == 0


@pytest.mark.slow
def test_tuned_records_of_a_fused_workload_are_used_by_build_model(tmp_path):
    """The whole path: a model's fused workload tuned by the tuner (sketch space) is found by
    apply-best when the model is built, and the model still computes the right thing."""
    from tuner.apply_best import ApplyHistoryBest
    from tuner.records import open_store
    from tuner.tune import tune
    from tuner.workload import Task, Workload
    m, p = mlp(batch=8, sizes=(32, 16, 16, 10))
    graph = from_onnx(m)
    first = extract_tasks(graph)[0]
    store = open_store(f"sqlite:///{tmp_path / 'records.db'}")
    try:
        task = Task.create(Workload.from_compute(first.opdef))
        result = tune(task, store, trials=4, batch_size=4, retime_rounds=1, top_k=2)
        assert result is not None
        module = build_model(graph, records=ApplyHistoryBest(store))
        assert module.sources[first.key] == "records"
        x = rand(RNG, (8, 32))
        (y,) = module.run(x=x)
        (want,) = build_model(graph).run(x=x)
        assert_close(y, want, rtol=1e-5)
    finally:
        store.close()


def encoder_layer(S=8, D=16, H=2, F=32):
    """A transformer encoder layer as exporters write it: fused QKV MatMul + Split, Reshape and
    Transpose into heads, scaled scores, Softmax, the output projection, residual adds,
    LayerNormalization, and an erf GELU spelled out (Div, Erf, Add, Mul, Mul)."""
    p = {"wqkv": rand(RNG, (D, 3 * D)), "bqkv": rand(RNG, (3 * D,)), "wo": rand(RNG, (D, D)), "bo": rand(RNG, (D,)),
         "g1": rand(RNG, (D,)), "b1": rand(RNG, (D,)), "w1": rand(RNG, (D, F)), "bf1": rand(RNG, (F,)),
         "w2": rand(RNG, (F, D)), "bf2": rand(RNG, (D,)), "g2": rand(RNG, (D,)), "b2": rand(RNG, (D,)),
         "heads": np.array([1, S, H, D // H], np.int64), "merged": np.array([1, S, D], np.int64),
         "scale": np.array(np.sqrt(D // H), np.float32), "sqrt2": np.array(np.sqrt(2.0), np.float32),
         "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)}
    n = helper.make_node
    nodes = [n("MatMul", ["x", "wqkv"], ["qkv0"]), n("Add", ["qkv0", "bqkv"], ["qkv"]),
             n("Split", ["qkv"], ["q", "k", "v"], axis=2, num_outputs=3)]
    for t in "qkv":
        nodes += [n("Reshape", [t, "heads"], [f"{t}h"]),
                  n("Transpose", [f"{t}h"], [f"{t}t"], perm=[0, 2, 3, 1] if t == "k" else [0, 2, 1, 3])]
    nodes += [n("MatMul", ["qt", "kt"], ["s0"]), n("Div", ["s0", "scale"], ["s"]), n("Softmax", ["s"], ["a"], axis=-1),
              n("MatMul", ["a", "vt"], ["c"]), n("Transpose", ["c"], ["ct"], perm=[0, 2, 1, 3]),
              n("Reshape", ["ct", "merged"], ["cm"]), n("MatMul", ["cm", "wo"], ["o0"]), n("Add", ["o0", "bo"], ["o"]),
              n("Add", ["x", "o"], ["r1"]), n("LayerNormalization", ["r1", "g1", "b1"], ["l1"], axis=-1),
              n("MatMul", ["l1", "w1"], ["f0"]), n("Add", ["f0", "bf1"], ["f"]),
              n("Div", ["f", "sqrt2"], ["fd"]), n("Erf", ["fd"], ["fe"]), n("Add", ["fe", "one"], ["fa"]),
              n("Mul", ["f", "fa"], ["fm"]), n("Mul", ["fm", "half"], ["gelu"]),
              n("MatMul", ["gelu", "w2"], ["f2"]), n("Add", ["f2", "bf2"], ["f2b"]), n("Add", ["l1", "f2b"], ["r2"]),
              n("LayerNormalization", ["r2", "g2", "b2"], ["y"], axis=-1)]
    return model(nodes, {"x": ((1, S, D), "float32")}, {"y": (None, "float32")}, p, opset=18), p


def np_encoder_layer(x, p, S=8, D=16, H=2):
    from graph_models import np_erf

    def ln(v, g, b):
        mu, var = v.mean(-1, keepdims=True), v.var(-1, keepdims=True)
        return (v - mu) / np.sqrt(var + 1e-5) * g + b
    x = x.astype(np.float64)
    qkv = x @ p["wqkv"] + p["bqkv"]
    q, k, v = (t.reshape(1, S, H, D // H).transpose(0, 2, 1, 3) for t in np.split(qkv, 3, axis=2))
    a = np_softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(D // H), -1)
    c = (a @ v).transpose(0, 2, 1, 3).reshape(1, S, D)
    l1 = ln(x + c @ p["wo"] + p["bo"], p["g1"], p["b1"])
    f = l1 @ p["w1"] + p["bf1"]
    gelu = 0.5 * f * (1 + np_erf(f / np.sqrt(2)))
    return ln(l1 + gelu @ p["w2"] + p["bf2"], p["g2"], p["b2"])


def test_transformer_encoder_layer_end_to_end():
    m, p = encoder_layer()
    graph = from_onnx(m)
    names = [t.opdef.name for t in extract_tasks(graph)]
    # the erf GELU (its input read twice) is a closed diamond: the FFN's first MatMul takes it
    assert "fused_matmul_add_add" in names and "fused_matmul_add_div_erf_add_mul_and_1_more" in names
    assert "softmax" in names and not any(n.startswith("fused_div") for n in names)
    x = rand(RNG, (1, 8, 16))
    (y,) = build_model(graph).run(x=x)
    assert_close(y, np_encoder_layer(x, p), rtol=2e-5)


@pytest.mark.parametrize("a_shape", [(40, 24), (2, 20, 24)])
def test_matmul_weights_come_in_the_panels_the_gemm_would_pack(a_shape):
    """A MatMul's constant B [K, N] is laid out once at build time in the GEMM schedule's column
    panels (N = 70: the last panel zero-padded), and the product, bias and relu stay right."""
    from compiler.graph.runtime import for_target
    p = {"w": rand(RNG, (24, 70)), "b": rand(RNG, (70,))}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["y"])]
    m = model(nodes, {"x": (a_shape, "float32")}, {"y": (None, "float32")}, p)
    graph = from_onnx(m)
    (mm,) = [n for n in for_target(graph, None).nodes if n.op_type == "MatMul"]
    nb = mm.attrs["weight_block"]
    (task,) = extract_tasks(graph)
    assert tuple(task.opdef.inputs[1].shape) == (-(-70 // nb), 24, nb)
    module = build_model(graph)
    for seed in range(2):
        x = rand(np.random.default_rng(seed), a_shape)
        (y,) = module.run(x=x)
        assert_close(y, np.maximum(x.astype(np.float64) @ p["w"] + p["b"], 0))


@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
def test_a_batch_1_layer_reads_its_weights_in_one_block_per_core(op):
    """A one-row product's constant B comes in panels as wide as the columns one core streams
    (schedule_gemv's chunk), so each core's part of B is contiguous; the kernel is still the
    streaming one-row schedule, and the answer is right."""
    from compiler.graph.runtime import for_target
    from compiler.ops import default_schedule
    from compiler.ops.schedule_common import PARALLEL_MIN_WORK
    from compiler.ops.schedule_gemm import gemv_panel_columns
    from compiler.target import resolve_target
    target = resolve_target(None)
    N = 16 * target.vector_lanes("float32")
    K = max(96, -(-PARALLEL_MIN_WORK // (2 * N)))   # worth both cores with 8 lanes as with 16
    p = {"w": rand(RNG, (K, N) if op == "MatMul" else (N, K)), "b": rand(RNG, (N,))}
    if op == "MatMul":
        nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])]
    else:
        nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)]
    m = model(nodes, {"x": ((1, K), "float32")}, {"y": (None, "float32")}, p)
    graph = from_onnx(m)
    (prod,) = [n for n in for_target(graph, target).nodes if n.op_type == op]
    chunk = gemv_panel_columns(K, N, target.vector_lanes("float32"), target.num_cores)
    if target.num_cores > 1:
        assert chunk is not None and chunk < N
    if chunk is None:
        assert "weight_block" not in prod.attrs
    else:
        assert prod.attrs["weight_block"] == chunk
        (task,) = extract_tasks(graph, target)
        assert tuple(task.opdef.inputs[1].shape) == (N // chunk, K, chunk)
    module = build_model(graph)
    (step,) = module.steps
    # the one-row schedule: its output row is split into the chunks, never into GEMM tiles
    steps = default_schedule(step.group.opdef, target).steps
    assert any(st.get("op") == "split" and st.get("factor") == (chunk or N) for st in steps)
    w = p["w"].astype(np.float64) if op == "MatMul" else p["w"].T.astype(np.float64)
    x = rand(RNG, (1, K))
    (y,) = module.run(x=x)
    assert_close(y, x.astype(np.float64) @ w + p["b"])
