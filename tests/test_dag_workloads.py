"""Workloads defined as compute DAGs (`Workload.from_compute`): keys, equality, the records store
(the `workloads.definition` column, JSON-lines export/import) and building and measuring in
spawned build processes that have nothing but the workload's JSON.
"""

from __future__ import annotations

import io
import json
import pickle

import numpy as np
import pytest

import compiler as C
from compiler.ops import OpDef, get_op, random_inputs
from compiler.serialize import dag_to_json
from tuner.candidate import Candidate, MeasureResult
from tuner.measure import BuilderPool, LocalRunner, MeasureOptions
from tuner.records import SQLRecordsStore, StoreError
from tuner.space import SketchSpace, default_candidate
from tuner.workload import Task, Workload, WorkloadError

TARGET = "llvm -mtriple=x86_64-linux-gnu -mcpu=znver3 -num-cores=2"


def scaled_softplus(M=12, N=20, name="scaled_softplus"):
    """log(1 + exp(A)) * B[j], summed over a window of columns 1..3 of each row."""
    A = C.placeholder((M, N), "float32", "A")
    B = C.placeholder((N,), "float32", "B")
    soft = C.compute((M, N), lambda i, j: C.log(C.exp(A[i, j]) + 1.0) * B[j], name="soft")
    k = C.reduce_axis((1, 4), "k")
    out = C.compute((M, N - 4), lambda i, j: C.sum(soft[i, j + k], axis=k), name=name)
    return [A, B], out


def reference(a, b):
    soft = np.log1p(np.exp(a.astype(np.float64))) * b
    return sum(soft[:, 1 + r: soft.shape[1] - 3 + r] for r in range(3)).astype("float32")


@pytest.fixture
def workload():
    inputs, out = scaled_softplus()
    return Workload.from_compute(out, inputs)


# ----------------------------------------------------------------------------- the workload

def test_a_compute_dag_is_a_workload_with_the_compiler_key(workload):
    inputs, out = scaled_softplus()
    assert workload.name == "scaled_softplus" and workload.params == {}
    assert workload.key == C.workload_key([out])
    op = workload.opdef()
    assert op.name == "scaled_softplus" and [t.name for t in op.inputs] == ["A", "B"]
    assert op.flops == 12 * 20 * 4 + 12 * 16 * 3  # soft: exp, add, log, mul; out: one add per step
    arrays = random_inputs(op, np.random.default_rng(0))
    np.testing.assert_allclose(op.reference(*arrays), reference(*arrays), rtol=1e-5)
    assert Task.create(workload, TARGET).flops == op.flops


def test_equality_and_hash_survive_json_and_pickle(workload):
    again = Workload(workload.name, {}, json.loads(json.dumps(workload.to_json()))["definition"])
    for other in (again, pickle.loads(pickle.dumps(workload))):
        assert other == workload and hash(other) == hash(workload)
    assert workload.to_json() == {"name": "scaled_softplus", "params": {}, "definition": workload.definition}
    bigger = Workload.from_compute(scaled_softplus(M=13)[1])
    assert bigger != workload and bigger.name == workload.name
    assert Workload("matmul", {"M": 2, "N": 2, "K": 2}).to_json() == {"name": "matmul",
                                                                      "params": {"M": 2, "N": 2, "K": 2}}


@pytest.mark.parametrize("name,params,expected", [
    ("conv2d_bias_relu", dict(N=1, C=4, H=8, W=8, F=4, KH=3, KW=3, padding=1), None),
    ("dense_gelu", dict(batch=4, in_dim=8, out_dim=8), None),
    ("matmul_int8", dict(M=4, N=8, K=8), dict(M=4, N=8, K=8, transpose_b=False)),
])
def test_an_inventory_opdef_stays_an_inventory_workload(name, params, expected):
    op = get_op(name, **params)
    workload = Workload.from_compute(op)
    assert workload == Workload(name, expected or op.params) and workload.definition is None
    assert workload.key == op.workload_key()


def test_names_that_would_pick_the_wrong_schedule_are_refused():
    inputs, out = scaled_softplus(name="matmul")
    with pytest.raises(WorkloadError, match="cannot be named 'matmul': that is an inventory operator"):
        Workload.from_compute(out, inputs)
    fake = OpDef("dense", inputs, out, {}, 0, None)
    with pytest.raises(WorkloadError, match="an OpDef named 'dense' that is not the inventory's dense"):
        Workload.from_compute(fake)
    stolen = Workload("matmul", {}, Workload.from_compute(out, inputs, name="ok").definition)
    with pytest.raises(WorkloadError, match="cannot be named 'matmul'"):
        stolen.opdef()


def test_a_bad_definition_is_a_workload_error(workload):
    broken = json.loads(json.dumps(workload.definition))
    broken["tensors"][2]["body"]["node"] = "mystery"
    with pytest.raises(WorkloadError, match=r"scaled_softplus.*tensors\[2\]\.body\.node: unknown node type 'mystery'"):
        Workload("scaled_softplus", {}, broken).opdef()
    with pytest.raises(WorkloadError, match="definition must be a JSON object"):
        Workload("x", {}, "{}")
    with pytest.raises(WorkloadError, match="definition is not JSON"):
        Workload("x", {}, {"v": float("nan")})
    A = C.placeholder((3,), "float32", "A")
    two = dag_to_json([C.compute((3,), lambda i: A[i] * 2.0, name="x"),
                       C.compute((3,), lambda i: A[i] + 1.0, name="y")])
    with pytest.raises(WorkloadError, match="a workload has one output tensor, its definition has 2"):
        Workload("two", {}, two).opdef()
    (a, _), out = scaled_softplus()
    with pytest.raises(WorkloadError, match=r"placeholder\(s\) B are read but not listed as inputs"):
        Workload.from_compute(out, [a])
    with pytest.raises(WorkloadError, match="A is not a placeholder that the outputs read"):
        Workload.from_compute(out, [A])


# ----------------------------------------------------------------------------- the records store

def _result(cost):
    return MeasureResult(costs=[cost], measured_by="test")


def test_the_store_keeps_the_definition_and_hands_it_back(db_url, workload):
    task = Task(workload, TARGET)
    plain = Task(Workload("relu", {"shape": [64]}), TARGET)
    with SQLRecordsStore(db_url) as store:
        store.add_records(task, [(default_candidate(workload.key), _result(2e-3)),
                                 (Candidate("trace", {"steps": []}), _result(1e-3))])
        store.add_records(plain, [(default_candidate(plain.workload.key), _result(1e-3))])
        best = store.best(workload.key, TARGET)[0]
        assert best.workload == workload and best.workload.definition == workload.definition
        assert best.workload.opdef().workload_key() == workload.key
        job = store.jobs.get(store.jobs.submit([(task, 1.0, None)], {}, space="sketch", strategy="evolutionary",
                                             scheduler="gradient", trials=10))
        assert job.task.workload == workload
        assert store.best(plain.workload.key, TARGET)[0].workload.definition is None


def test_exported_records_rebuild_their_kernels_without_the_user_code(tmp_path, workload):
    task = Task(workload, TARGET)
    with SQLRecordsStore(f"sqlite:///{tmp_path / 'a.db'}") as a:
        a.add_records(task, [(default_candidate(workload.key), _result(1e-3))])
        a.add_records(Task(Workload("relu", {"shape": [8]}), TARGET),
                      [(Candidate("trace", {"steps": []}), _result(1e-3))])
        text = io.StringIO()
        assert a.export_jsonl(text) == 2
    lines = [json.loads(line) for line in text.getvalue().splitlines()]
    assert [line["v"] for line in lines] == [2, 1]  # only a line with a definition needs version 2
    assert lines[0]["workload"]["definition"] == workload.definition
    with SQLRecordsStore(f"sqlite:///{tmp_path / 'b.db'}") as b:
        assert b.import_jsonl(io.StringIO(text.getvalue())) == 2
        (record,) = b.best(workload.key, TARGET)
        assert record.workload == workload
        op = record.workload.opdef()
        assert op.workload_key() == workload.key


def test_an_import_line_whose_definition_is_not_its_workload_refuses_the_file(tmp_path, workload):
    other = Workload.from_compute(scaled_softplus(N=24)[1])
    line = {"v": 2, "workload_key": workload.key, "workload": other.to_json(), "target": TARGET,
            "candidate": {"kind": "trace", "payload": {"steps": []}},
            "result": {"costs": [1e-3], "error_code": 0}}
    with SQLRecordsStore(f"sqlite:///{tmp_path / 'c.db'}") as store:
        with pytest.raises(StoreError, match=f"line 1: .*is the DAG of workload {other.key}, not of the line's "
                                             f"workload_key {workload.key}"):
            store.import_jsonl(io.StringIO(json.dumps(line)))
        with pytest.raises(StoreError, match=r"line 1: .*unsupported format version 3 .*a newer one wrote it"):
            store.import_jsonl(io.StringIO(json.dumps(dict(line, v=3))))
        broken = json.loads(json.dumps(workload.to_json()))
        broken["definition"]["version"] = 7
        with pytest.raises(StoreError, match="line 1: .*written by a newer tunefarm"):
            store.import_jsonl(io.StringIO(json.dumps(dict(line, workload=broken))))
        assert store.count() == 0


# ----------------------------------------------------------------------------- building and measuring

def test_spawned_build_processes_build_and_check_a_dag_workload(workload):
    """The build processes never saw this module's compute: they rebuild it from the JSON; the
    worker checks each kernel against the naive-schedule reference built the same way."""
    task = Task.create(workload)
    space = SketchSpace(task)
    rng = np.random.default_rng(1)
    cands = [default_candidate(workload.key)] + [space.sample(rng) for _ in range(3)]
    with BuilderPool(n_workers=1, timeout=60) as pool, LocalRunner(MeasureOptions(number=1, repeat=1, min_repeat_ms=0)) as runner:
        built = pool.build(task, cands)
        assert all(b.ok for b in built), [b.error_msg for b in built]
        results = runner.run(task, built)
    assert all(r.ok for r in results), [r.error_msg for r in results]


def test_numpy_scalars_in_workload_params_are_stored_as_plain_json():
    import json

    import numpy as np
    w = Workload("layer_norm", {"shape": (np.int64(8), 32), "eps": np.float32(1e-5)})
    assert json.loads(json.dumps(w.to_json()))["params"] == {"shape": [8, 32], "eps": 1e-05}
    assert w.key == Workload("layer_norm", {"shape": (8, 32), "eps": 1e-5}).key
