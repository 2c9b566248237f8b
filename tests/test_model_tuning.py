"""Tuning a whole model (tuner.model_tuning, `tunefarm model tune`): the tasks a small ONNX model
becomes, their records under the keys build_model looks up, the kernels built from those records
(checked by their lowered loop program), outputs still right, the estimated latency followed,
and bad models refused before anything is written."""

from __future__ import annotations

import math

import numpy as np
import pytest
from graph_models import assert_close, model, rand
from onnx import helper
from test_graph_models import mlp

import compiler
from compiler.graph import build_model, extract_tasks, from_onnx
from compiler.target import Target
from tuner.apply_best import ApplyHistoryBest
from tuner.measure import BuilderPool, LocalRunner, MeasureOptions
from tuner.model_tuning import LatencyEstimate, model_tasks, tune_model
from tuner.records import open_store
from tuner.space import instantiate

RNG = np.random.default_rng(11)


@pytest.fixture(scope="module")
def machinery():
    with BuilderPool(n_workers=2, timeout=60) as builder, LocalRunner(MeasureOptions(number=1, repeat=2, min_repeat_ms=1)) as runner:
        yield builder, runner


def two_layer_repeat(batch=4, d=16):
    """Two identical Gemm + Relu layers (one workload of weight 2), then a Softmax."""
    p = {"w0": rand(RNG, (d, d)), "b0": rand(RNG, (d,)), "w1": rand(RNG, (d, d)), "b1": rand(RNG, (d,))}
    n = helper.make_node
    nodes = [n("Gemm", ["x", "w0", "b0"], ["h0"], transB=1), n("Relu", ["h0"], ["a0"]),
             n("Gemm", ["a0", "w1", "b1"], ["h1"], transB=1), n("Relu", ["h1"], ["a1"]),
             n("Softmax", ["a1"], ["y"], axis=-1)]
    return model(nodes, {"x": ((batch, d), "float32")}, {"y": (None, "float32")}, p), p


def np_two_layer(x, p):
    a = x.astype(np.float64)
    for i in range(2):
        a = np.maximum(a @ p[f"w{i}"].T.astype(np.float64) + p[f"b{i}"], 0)
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_model_tasks_are_the_extracted_workloads_with_their_weights():
    m, _ = two_layer_repeat()
    graph = from_onnx(m)
    target = Target.host()
    tasks = model_tasks(graph, target)
    extracted = extract_tasks(graph, target)
    assert [t.key for t in tasks] == [t.key for t in extracted]
    assert [(t.name, t.weight) for t in tasks] == [("fused_gemm_relu", 2), ("softmax", 1)]
    for t in tasks:   # the task's workload, rebuilt from its data, is the kernel build_model asks for
        assert t.task.workload.key == t.key and t.task.target == str(target)
    assert tasks[1].task.workload.definition is None   # an inventory operator stays one (its templates apply)


def _lowered(schedule_and_tensors, name: str) -> str:
    schedule, tensors = schedule_and_tensors
    return str(compiler.lower(schedule, tensors, name))


@pytest.mark.slow
def test_tuned_model_records_drive_build_model_and_outputs_stay_right(tmp_path, machinery):
    builder, runner = machinery
    m, p = two_layer_repeat()
    graph = from_onnx(m)
    target = Target.host()
    tasks = model_tasks(graph, target)
    store = open_store(f"sqlite:///{tmp_path / 'records.db'}")
    seen = []
    try:
        out = tune_model(tasks, store, trials=12, batch_size=3, builder=builder, runner=runner, top_k=2,
                         retime_rounds=1, on_estimate=lambda est: seen.append(est.seconds))
        # the budget was spent, and the allocation says on what
        assert out.scheduled.trials == 12 and sum(out.allocation()) == 12
        assert all(n > 0 for n in out.allocation())     # the warm-up round gives every task a batch
        # the estimate: finite from the baselines on, its last point the re-measured Σ w·best
        assert seen and math.isfinite(seen[0]) and out.estimate.curve[0][0] == 0
        assert out.estimate.curve[-1] == (12, pytest.approx(out.estimated_seconds))
        assert out.estimated_seconds == pytest.approx(sum(t.weight * r.best_cost for t, r in zip(tasks, out.results)))
        assert out.estimated_seconds <= out.default_seconds * 1.5
        for t, r in zip(tasks, out.results):   # records under the model's keys: baseline + the task's trials
            recs = store.history(workload_key=t.key, target=str(target))
            assert len(recs) == 1 + r.trials and {rec.workload_key for rec in recs} == {t.key}
        provider = ApplyHistoryBest(store)
        module = build_model(graph, target, records=provider)
        assert set(module.sources.values()) == {"records"} and set(module.sources) == {t.key for t in tasks}
        for step in module.steps:   # each kernel is the lowering of its workload's best record
            opdef = step.group.opdef
            best = provider.best_record(opdef, target)
            name = step.kernel.name
            assert step.kernel.source == _lowered(instantiate(opdef, best.candidate, target), name)
            if best.candidate.kind != "default":
                from compiler.ops import default_schedule
                assert step.kernel.source != str(compiler.lower(default_schedule(opdef, target), opdef.tensors, name))
        for seed in range(2):
            x = rand(np.random.default_rng(seed), (4, 16))
            (y,) = module.run(x=x)
            assert_close(y, np_two_layer(x, p))
    finally:
        store.close()


def test_latency_estimate_waits_for_every_task_and_follows_the_bests():
    class R:   # a TuneResult as far as the estimate reads it
        def __init__(self, task, cost):
            self.task, self.best_cost = task, cost

    class Report:
        def __init__(self, task, cost, n, kind="search"):
            self.task, self.result, self.candidates, self.kind = task, R(task, cost), (None,) * n, kind

    est = LatencyEstimate.of([("a", 2), ("b", 1)])
    assert not est.observe(Report("a", 1.0, 0, "baseline")) and est.curve == []   # b unknown yet
    assert est.observe(Report("b", 3.0, 0, "baseline")) and est.curve == [(0, 5.0)]
    assert not est.observe(Report("b", 3.0, 4))          # no change, no point; trials still counted
    assert est.observe(Report("a", 0.5, 4)) and est.curve[-1] == (8, 4.0)
    assert not est.observe(Report("a", 9.0, 0, "retime"))  # re-measurement waits for finish()
    assert est.finish([R("a", 0.6), R("b", 2.0)]) and est.curve[-1] == (8, pytest.approx(3.2))


# ----------------------------------------------------------------------------- the command line

def test_cli_model_tune_then_run_uses_the_records(tmp_path, capsys):
    from tuner.cli import main
    m, _ = mlp(batch=4, sizes=(24, 16, 16, 10))
    path = tmp_path / "mlp.onnx"
    path.write_bytes(m.SerializeToString())
    db = f"sqlite:///{tmp_path / 'records.db'}"
    assert main(["model", "tune", str(path), "--trials", "4", "--batch", "2", "--top-k", "1", "--db", db,
                 "--plain"]) == 0
    out = capsys.readouterr().out
    assert "4 unique workloads" in out and "estimated latency" in out
    assert "estimated end-to-end latency" in out and "4 trials" in out
    for name in ("fused_gemm_relu", "fused_matmul_add_tanh", "fused_gemm_sigmoid", "softmax"):
        assert name in out
    assert main(["model", "run", str(path), "--db", db, "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "4 from records, 0 default schedules" in out and "MISMATCH" not in out


def test_cli_model_tune_refuses_bad_models_and_writes_nothing(tmp_path, capsys):
    from tuner.cli import main
    db_path = tmp_path / "records.db"
    db = f"sqlite:///{db_path}"
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\x01 not a model at all")
    assert main(["model", "tune", str(bad), "--trials", "4", "--db", db]) == 2
    assert "is not an ONNX model" in capsys.readouterr().err
    odd = tmp_path / "odd.onnx"
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("FancyOp", ["r"], ["y"], name="fancy1")]
    odd.write_bytes(model(nodes, {"x": ((2, 3), "float32")}, {"y": (None, "float32")}).SerializeToString())
    assert main(["model", "tune", str(odd), "--trials", "4", "--db", db]) == 2
    err = capsys.readouterr().err
    assert "FancyOp" in err and "fancy1" in err
    dyn = tmp_path / "dyn.onnx"
    dyn.write_bytes(model([helper.make_node("Relu", ["x"], ["y"])], {"x": ((1, 4), "float32")},
                          {"y": (None, "float32")}, dynamic={"x": 0}).SerializeToString())
    assert main(["model", "tune", str(dyn), "--trials", "4", "--db", db]) == 2
    assert "--input-shape" in capsys.readouterr().err
    assert not db_path.exists()   # refused before the records were opened
