"""The tuning loop end to end: real builds, real measurements, real databases."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import compiler as C
from compiler.ops import build_op
from compiler.ops.base import random_inputs
from tuner.apply_best import ApplyHistoryBest
from tuner.cli import main
from tuner.measure import BuilderPool, LocalRunner
from tuner.records import open_store
from tuner.space import instantiate
from tuner.tune import tune
from tuner.workload import Task, Workload

PARAMS = dict(M=24, N=20, K=16)


@pytest.fixture(scope="module")
def machinery():
    """One builder pool and one measuring worker for the module (process start-up is the slow part)."""
    with BuilderPool(n_workers=2, timeout=60) as builder, LocalRunner(number=1, repeat=2, min_repeat_ms=1) as runner:
        yield builder, runner


def _task():
    return Task.create(Workload("matmul", PARAMS))


@pytest.mark.parametrize("space,strategy", [("template", "random"), ("sketch", "random"),
                                            ("template", "model"), ("sketch", "evolutionary")])
def test_tune_records_every_trial_and_resumes_without_repeats(tmp_path, machinery, space, strategy):
    builder, runner = machinery
    store = open_store(f"sqlite:///{tmp_path / 'r.db'}")
    task = _task()
    first = tune(task, store, space=space, strategy=strategy, trials=6, batch_size=3,
                 builder=builder, runner=runner)
    assert first.trials == 6 and store.count(task) == 6
    assert first.best_gflops > 0
    again = tune(task, store, space=space, strategy=strategy, trials=9, batch_size=3,
                 builder=builder, runner=runner)
    assert again.resumed_trials == 6 and again.trials == 3
    fps = [r.candidate.fingerprint for r in store.history(workload_key=task.workload.key)]
    assert len(fps) == len(set(fps)) == 9


def test_tune_on_postgresql(db_url, machinery):
    builder, runner = machinery
    store = open_store(db_url)
    task = _task()
    res = tune(task, store, space="sketch", strategy="random", trials=4, batch_size=2,
               builder=builder, runner=runner)
    assert res.trials == 4 and store.count(task) == 4
    assert store.best(task.workload.key, task.target, k=1)[0].result.ok


def test_apply_best_builds_the_best_record_and_ignores_other_targets(tmp_path, machinery):
    builder, runner = machinery
    store = open_store(f"sqlite:///{tmp_path / 'r.db'}")
    task = _task()
    tune(task, store, space="sketch", strategy="random", trials=4, batch_size=4, builder=builder, runner=runner)
    opdef = task.workload.opdef()
    best = ApplyHistoryBest(store).best_record(opdef, C.Target.host())
    assert best is not None
    expected, args = instantiate(opdef, best.candidate)
    with ApplyHistoryBest(store) as provider:
        kernel = build_op(opdef)
        assert provider.lookup(opdef, C.Target.host()) is not None
    assert kernel.source == str(C.lower(expected, args, "main"))
    ins = random_inputs(opdef, np.random.default_rng(3))
    out = np.full(opdef.output.shape, np.nan, np.float32)
    kernel(*ins, out)
    np.testing.assert_allclose(out, opdef.reference(*ins), rtol=1e-4)

    other = C.Target.from_string("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell -num-cores=2")
    assert ApplyHistoryBest(store).lookup(opdef, other) is None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ApplyHistoryBest(store):
            build_op(opdef, other)
    assert any("default schedule" in str(w.message) for w in caught)


def test_cli_tune_best_and_records_round_trip(tmp_path, capsys):
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    args = ["--param", "M=16", "--param", "N=16", "--param", "K=16", "--db", db]
    assert main(["tune", "matmul", *args, "--trials", "4", "--batch", "4", "--space", "template",
                 "--strategy", "random", "--plain", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "4 trials measured now" in out and "tuned kernel:" in out and "check OK" in out
    assert main(["best", "matmul", *args]) == 0
    out = capsys.readouterr().out
    assert "GFLOPS" in out and "for (" in out
    dump = tmp_path / "records.jsonl"
    assert main(["records", "export", str(dump), "--db", db]) == 0
    lines = dump.read_text().splitlines()
    assert len(lines) == 4 and all(json.loads(line) for line in lines)
    db2 = f"sqlite:///{tmp_path / 'other.db'}"
    assert main(["records", "import", str(dump), "--db", db2]) == 0
    assert main(["best", "matmul", *args[:-1], db2]) == 0


def test_cli_rejects_bad_input_cleanly(tmp_path, capsys):
    assert main(["tune", "nosuchop", "--db", f"sqlite:///{tmp_path / 'x.db'}"]) == 2
    assert "unknown operator" in capsys.readouterr().err
    assert main(["tune", "matmul", "--db", "notadb://x"]) == 2
    assert "notadb" in capsys.readouterr().err
    assert main(["tune", "matmul", "--param", "M=0", "--db", f"sqlite:///{tmp_path / 'x.db'}"]) == 2
    assert main(["tune", "matmul", "--param", "M=16", "--param", "N=16", "--param", "K=16",
                 "--strategy", "nope", "--db", f"sqlite:///{tmp_path / 'x.db'}"]) == 2
    assert "unknown strategy" in capsys.readouterr().err


def test_warm_start_uses_records_of_the_same_structure_only(tmp_path, machinery):
    """Records of other workloads warm the cost model only when their candidates come from the
    same sketches (or template): a matmul's model learns from another matmul, not from a conv."""
    from compiler.target import resolve_target
    from tuner.tune import _warm_cost_model, make_space

    builder, runner = machinery
    store = open_store(f"sqlite:///{tmp_path / 'r.db'}")
    sibling = Task.create(Workload("matmul", dict(M=32, N=24, K=16)))
    conv = Task.create(Workload("conv2d_nchw", dict(N=1, C=4, H=8, W=8, F=4, KH=3, KW=3, padding=[1, 1])))
    for t, n in ((sibling, 16), (conv, 8)):
        tune(t, store, space="sketch", strategy="random", trials=n, batch_size=8, builder=builder, runner=runner)
    task = _task()
    target = resolve_target(task.target)
    space = make_space("sketch", task.workload.opdef(), target)
    model = _warm_cost_model(store, task, target, space)
    assert model is not None and model.trained
    assert set(model._hg.tolist()) == {sibling.workload.key}
    # nothing of a template's structure in the store: no warm start for a template search
    assert _warm_cost_model(store, task, target, make_space("template", task.workload.opdef(), target)) is None
    store.close()
