"""The per-layer profile: GraphModule.profile (compiler/graph/profile.py), onnxruntime's profile and
its matching to our kernels (tuner/ort_profile.py), and `tunefarm model profile`.

The model is small (a conv, relu, max pool, flatten and gemm) and timings are short: the tests
check what the profile covers and that its figures are consistent, not how fast anything is."""

from __future__ import annotations

import json
import math
import re
import sys
import tempfile

import numpy as np
import pytest
from graph_models import model, rand
from onnx import helper

from compiler import host_lock
from compiler.graph import InputError, build_model, from_onnx
from compiler.graph.profile import anchor_flops, argument_bytes
from compiler.ops import default_schedule, get_op
from compiler.timing import TimingOptions
from tuner.cli import main
from tuner.ort_profile import OrtNode, OrtProfile, match_kernels, name_forms, parse_profile

RNG = np.random.default_rng(5)
N, C, H, F, CLASSES = 1, 8, 8, 16, 10
FAST = TimingOptions(min_samples=3, max_samples=20, min_seconds=0.0, max_seconds=0.02, attempts=1)


def small_cnn():
    """conv (3x3, pad 1, bias) → relu → 2x2 max pool → flatten → gemm: the anchors and a pool."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu1"),
             helper.make_node("MaxPool", ["r"], ["p"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], name="fc", transB=1)]
    inits = dict(w=rand(RNG, (F, C, 3, 3)), b=rand(RNG, (F,)), fw=rand(RNG, (CLASSES, F * (H // 2) ** 2)),
                 fb=rand(RNG, (CLASSES,)))
    return model(nodes, {"x": ((N, C, H, H), "float32")}, {"y": (None, "float32")}, inits)


@pytest.fixture(scope="module")
def built():
    module = build_model(from_onnx(small_cnn()))
    x = rand(np.random.default_rng(0), (N, C, H, H))
    return module, x


def _kernel_with(profile, node):
    (k,) = [k for k in profile.kernels if node in k.nodes]
    return k


def test_profile_covers_every_step_with_consistent_figures(built):
    module, x = built
    (want,) = module.run(x=x)
    p = module.profile({"x": x}, options=FAST)
    assert [k.index for k in p.kernels] == list(range(len(module.steps)))
    for k, step in zip(p.kernels, module.steps):
        assert k.nodes == [n.name for n in step.group.group.nodes]
        assert k.ops == step.group.group.describe() and k.name == step.group.opdef.name
        assert k.source == "default" and k.seconds > 0 and not math.isnan(k.seconds)
        assert k.bytes == argument_bytes(step.group.opdef)
    covered = {n for k in p.kernels for n in k.nodes}
    assert {"conv1", "relu1", "pool1", "fc"} <= covered   # Flatten is a view, no kernel
    assert sum(k.share for k in p.kernels) == pytest.approx(1.0)
    assert p.kernel_seconds == pytest.approx(sum(k.seconds for k in p.kernels))
    # outside the kernels: the run less the native call's span, not less the kernels' medians
    assert p.sequence_seconds > 0 and p.sequence_seconds >= 0.5 * p.kernel_seconds
    assert p.run_seconds > 0 and p.overhead_seconds == p.outside_seconds
    assert abs(p.overhead_seconds) < p.run_seconds
    assert p.threads >= 1
    # the anchors' FLOPs are their multiply-adds (the blocked layout computes the same count here:
    # F fills whole channel blocks), the rest is memory-bound
    conv = _kernel_with(p, "conv1")
    assert conv.flops == 2 * N * F * H * H * C * 3 * 3
    assert conv.gflops == pytest.approx(conv.flops / conv.seconds / 1e9) and conv.gflops > 0
    fc = _kernel_with(p, "fc")
    assert fc.flops == 2 * N * CLASSES * F * (H // 2) ** 2 and fc.gflops > 0
    pool = _kernel_with(p, "pool1")
    assert pool.flops is None and pool.gflops is None
    assert pool.gb_per_s == pytest.approx(pool.bytes / pool.seconds / 1e9) and pool.gb_per_s > 0
    assert [k.seconds for k in p.ranked()] == sorted((k.seconds for k in p.kernels), reverse=True)
    assert len(p.ranked(2)) == 2
    json.dumps(p.to_dict())
    # timing replays the steps on the run's own buffers; a run afterwards is still right
    (again,) = module.run(x=x)
    np.testing.assert_array_equal(again, want)


@pytest.mark.filterwarnings("ignore:.*no tuned schedule")
def test_profile_says_which_schedules_came_from_the_records():
    graph = from_onnx(small_cnn())
    conv_key = build_model(graph).steps[0].group.key

    class OneRecord:   # a schedule provider holding the first kernel's workload only
        def lookup(self, opdef, target):
            return default_schedule(opdef, target) if opdef.workload_key() == conv_key else None

    module = build_model(graph, records=OneRecord())
    p = module.profile({"x": rand(RNG, (N, C, H, H))}, options=FAST)
    assert [k.source for k in p.kernels] == ["records"] + ["default"] * (len(p.kernels) - 1)


def test_profile_checks_its_inputs(built):
    module, x = built
    with pytest.raises(InputError, match="expected shape"):
        module.profile({"x": x[:, :4]}, options=FAST)
    with pytest.raises(InputError, match="missing"):
        module.profile({}, options=FAST)
    with pytest.raises(ValueError, match="repeat"):
        module.profile({"x": x}, repeat=0)


def test_anchor_flops_count_multiply_adds_only():
    mm = get_op("matmul", M=8, N=16, K=32)
    assert anchor_flops(mm) == 2 * 8 * 16 * 32 == mm.flops
    assert anchor_flops(get_op("relu", shape=(16, 32))) is None
    assert argument_bytes(get_op("relu", shape=(16, 32))) == 2 * 16 * 32 * 4


# ----------------------------------------------------------------------------- onnxruntime's side

def _events(runs):
    """A trace as onnxruntime writes it: per run, a model_run and its nodes' kernel_time events."""
    out, ts = [{"cat": "Session", "name": "session_initialization", "ts": 0, "dur": 50}], 100
    for nodes in runs:
        start = ts
        for name, op, dur in nodes:
            out.append({"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur, "args": {"op_name": op}})
            out.append({"cat": "Node", "name": f"{name}_fence_before", "ts": ts, "dur": 0, "args": {"op_name": op}})
            ts += dur + 1
        out.append({"cat": "Session", "name": "model_run", "ts": start - 1, "dur": ts - start + 2})
        ts += 10
    return out


def test_parse_profile_averages_the_runs_after_warm_up():
    runs = [[("conv", "Conv", 500), ("fc", "Gemm", 90)],     # warm-up: not counted
            [("conv", "Conv", 10), ("fc", "Gemm", 4)],
            [("conv", "Conv", 20), ("fc", "Gemm", 6)]]
    prof = parse_profile(_events(runs), warmup=1)
    assert prof.runs == 2
    assert {n.name: (n.op_type, n.seconds) for n in prof.nodes} == {"conv": ("Conv", pytest.approx(15e-6)),
                                                                    "fc": ("Gemm", pytest.approx(5e-6))}
    assert prof.node_seconds == pytest.approx(20e-6)
    assert prof.run_seconds > prof.node_seconds
    with pytest.raises(Exception, match="none after"):
        parse_profile(_events(runs), warmup=3)


def test_onnxruntime_nodes_match_our_kernels_by_node_and_value_names():
    assert name_forms("fused mm/MatMulAddFusion") == ["fused mm/MatMulAddFusion", "mm/MatMulAddFusion", "mm"]
    assert name_forms("r1_nchwc")[-1] == "r1"
    ours = [["conv1", "relu1"], ["pool1"], ["r/from_nchwc"], ["mm", "add", "last"]]
    producers = {"c1": "conv1", "r1": "relu1", "p1": "pool1", "y": "last", "bn": "conv1"}
    theirs = OrtProfile([OrtNode("r1_nchwc", "Conv", 3e-6),           # named after the relu's output
                         OrtNode("bn_nchwc", "Conv", 1e-6),           # a value our BN folding gave conv1
                         OrtNode("pool1", "MaxPool", 2e-6),           # the same name
                         OrtNode("fused mm/MatMulAddFusion", "FusedGemm", 4e-6),
                         OrtNode("ReorderOutput", "ReorderOutput", 5e-6),   # onnxruntime's own
                         OrtNode("flatten", "Flatten", 1e-6)], 20e-6, 3)
    m = match_kernels(theirs, ours, producers)
    assert [[n.name for n in ns] for ns in m.per_kernel] == [["r1_nchwc", "bn_nchwc"], ["pool1"], [],
                                                            ["fused mm/MatMulAddFusion"]]
    assert m.kernel_seconds(0) == pytest.approx(4e-6)
    assert [n.name for n in m.unmatched] == ["ReorderOutput", "flatten"]
    assert m.unmatched_seconds == pytest.approx(6e-6)


# ----------------------------------------------------------------------------- the command line

@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "cnn.onnx"
    path.write_bytes(small_cnn().SerializeToString())
    return path


def test_cli_prints_the_table_slowest_first(model_file, capsys):
    assert main(["model", "profile", str(model_file), "--no-records", "--repeat", "3"]) == 0
    out = capsys.readouterr().out
    assert "default schedules" in out and "GFLOPS" in out and "GB/s" in out
    for node in ("conv1", "pool1", "fc"):
        assert node in out
    assert "whole run" in out and "outside kernels" in out
    ms = [float(re.search(r"(\d+\.\d{4})\*? *\d+\.\d%", line).group(1))
          for line in out.splitlines() if line[:3].strip().isdigit()]
    assert ms and ms == sorted(ms, reverse=True)
    assert main(["model", "profile", str(model_file), "--no-records", "--repeat", "3", "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert len([line for line in out.splitlines() if line[:3].strip().isdigit()]) == 1
    assert "more kernels" in out


def test_cli_json(model_file, capsys):
    assert main(["model", "profile", str(model_file), "--no-records", "--repeat", "3", "--json", "--threads", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["threads"] == 1 and data["sources"]["records"] == 0
    kernels = data["kernels"]
    assert sum(k["share"] for k in kernels) == pytest.approx(1.0)
    assert [k["ms"] for k in kernels] == sorted((k["ms"] for k in kernels), reverse=True)
    assert data["kernels_ms"] == pytest.approx(sum(k["ms"] for k in kernels))
    assert {"conv1", "fc"} <= {n for k in kernels for n in k["nodes"]}
    assert all((k["gflops"] or 0) > 0 or k["gb_per_s"] > 0 for k in kernels)


def test_cli_compare_with_onnxruntime(model_file, capsys, tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("TUNEFARM_LOCK_DIR", host_lock.lock_dir())   # the host's lock stays where it was ...
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))   # ... while onnxruntime's trace goes here
    args = ["model", "profile", str(model_file), "--no-records", "--repeat", "3", "--threads", "1", "--compare"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "onnxrt ms" in out and "onnxruntime: whole run" in out and "unmatched nodes" in out
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    theirs = data["onnxruntime"]
    assert theirs["run_ms"] > 0 and theirs["runs"] == 3
    matched = sum(k["onnxruntime"]["ms"] for k in data["kernels"])
    assert matched + theirs["unmatched_ms"] == pytest.approx(theirs["nodes_ms"])
    conv = next(k for k in data["kernels"] if "conv1" in k["nodes"])
    assert conv["onnxruntime"]["nodes"] and conv["onnxruntime"]["ms"] > 0
    assert list(tmp_path.iterdir()) == []   # the profile and its directory are gone


def test_cli_compare_without_onnxruntime_says_how_to_install(model_file, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)   # import onnxruntime raises ImportError
    assert main(["model", "profile", str(model_file), "--compare"]) == 2
    assert "tunefarm[bench]" in capsys.readouterr().err


def test_cli_bad_input_is_one_line_and_nonzero(model_file, tmp_path, capsys):
    assert main(["model", "profile", str(tmp_path / "missing.onnx")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["model", "profile", str(model_file), "--input-shape", "x=1,3,8,8"]) == 2
    assert "input 'x'" in capsys.readouterr().err
    assert main(["model", "profile", str(model_file), "--input-shape", "x=abc"]) == 2
    assert "expected NAME=D0,D1" in capsys.readouterr().err
    assert main(["model", "profile", str(model_file), "--top", "0"]) == 2
    assert "--top" in capsys.readouterr().err
