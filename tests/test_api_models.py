"""Model jobs over REST (POST /api/v1/jobs/model): an ONNX file uploaded as the body, tuned by a
real job worker, shown with its tasks, the scheduler's allocation and the estimated latency
curve; refusals (not ONNX, unsupported op, unpinned dynamic shape, over the size limit) are
4xx with a reason and store nothing. On a SQLite file and on PostgreSQL, like test_api.py."""

from __future__ import annotations

import re

import httpx
import numpy as np
import pytest
from api_env import make_env
from fastapi.testclient import TestClient
from graph_models import assert_close, model, rand
from onnx import helper
from test_model_tuning import np_two_layer, two_layer_repeat

from compiler.graph import build_model, from_onnx
from compiler.target import Target
from tuner.apply_best import ApplyHistoryBest
from tuner.model_tuning import model_tasks
from tuner.service.worker import JobWorker

URL = "/api/v1/jobs/model"
OCTETS = {"Content-Type": "application/octet-stream"}


def upload(env, data: bytes, scope="submit", **params):
    return env.client.post(URL, content=data, params=params, headers={**env.h(scope), **OCTETS})


@pytest.mark.slow
def test_a_model_job_is_tuned_by_a_worker_and_shows_allocation_and_curve(env):
    m, p = two_layer_repeat()
    data = m.SerializeToString()
    r = upload(env, data, trials=6, batch_size=3, top_k=1, file_name="two_layers.onnx")
    assert r.status_code == 201, r.text
    job = r.json()
    assert r.headers["location"].endswith(f"/api/v1/jobs/{job['id']}")
    assert job["state"] == "queued" and job["trials"] == 6 and job["scheduler"] == "gradient"
    mdl = job["model"]
    assert mdl["file_name"] == "two_layers.onnx" and mdl["bytes"] == len(data) and mdl["kernels"] == 3
    assert mdl["input_shapes"] == {"x": [4, 16]} and mdl["curve"] == [] and mdl["estimated_seconds"] is None
    graph = from_onnx(m)
    tasks = model_tasks(graph, Target.host())
    assert [(t["workload"]["key"], t["weight"]) for t in job["tasks"]] == [(t.key, t.weight) for t in tasks]
    assert job["spec"]["workloads"][0]["compute"] and job["spec"]["workloads"][1]["op"] == "softmax"
    assert [a["workload"] for a in mdl["allocation"]] == ["fused_gemm_relu", "softmax"]

    with JobWorker(env.store, name="w1", build_workers=1) as worker:
        assert worker.run_once() == job["id"]
    done = env.get(f"/api/v1/jobs/{job['id']}").json()
    assert done["state"] == "done", done["error"]
    mdl = done["model"]
    alloc = mdl["allocation"]
    assert sum(a["trials"] for a in alloc) == done["trials_done"] == 6 and all(a["trials"] > 0 for a in alloc)
    assert sum(a["share"] for a in alloc) == pytest.approx(1.0)
    want = sum(t["weight"] * t["best_cost"] for t in done["tasks"])
    assert mdl["estimated_seconds"] == pytest.approx(want)
    assert mdl["default_seconds"] == pytest.approx(sum(t["weight"] * t["baseline_cost"] for t in done["tasks"]))
    curve = mdl["curve"]
    assert curve[0]["trials"] == 0 and curve[-1]["final"] and curve[-1]["seconds"] == pytest.approx(want)
    assert [c["trials"] for c in curve] == sorted(c["trials"] for c in curve)
    events = env.get(f"/api/v1/jobs/{job['id']}/events", params={"limit": 500}).json()["items"]
    assert sum(e["kind"] == "estimate" for e in events) == len(curve)
    listed = env.get("/api/v1/jobs").json()["items"][0]
    assert listed["model"]["estimated_seconds"] == pytest.approx(want) and listed["model"]["curve"] == []

    # the records are under the model's keys: the model built from them uses them, and computes the right thing
    module = build_model(graph, records=ApplyHistoryBest(env.store))
    assert set(module.sources.values()) == {"records"}
    x = rand(np.random.default_rng(3), (4, 16))
    (y,) = module.run(x=x)
    assert_close(y, np_two_layer(x, p))


def test_model_uploads_that_cannot_run_are_422_naming_what_and_store_nothing(sqlite_env):
    env = sqlite_env
    r = upload(env, b"\x08\x01 certainly not a model")
    assert r.status_code == 422 and r.json()["field"] == "model" and "not an ONNX model" in r.json()["detail"]
    r = upload(env, b"")
    assert r.status_code == 422 and "empty" in r.json()["detail"]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("FancyOp", ["r"], ["y"], name="fancy1")]
    odd = model(nodes, {"x": ((2, 3), "float32")}, {"y": (None, "float32")}).SerializeToString()
    r = upload(env, odd)
    assert r.status_code == 422 and r.json()["field"] == "model"
    assert "FancyOp" in r.json()["detail"] and "fancy1" in r.json()["detail"]
    dyn = model([helper.make_node("Relu", ["x"], ["y"])], {"x": ((1, 4), "float32")}, {"y": (None, "float32")},
                dynamic={"x": 0}).SerializeToString()
    r = upload(env, dyn)
    assert r.status_code == 422 and r.json()["field"] == "input_shape" and "'x'" in r.json()["detail"]
    r = upload(env, dyn, input_shape="x=three,4")
    assert r.status_code == 422 and r.json()["field"] == "input_shape"
    r = upload(env, dyn, input_shape="y=3,4")
    assert r.status_code == 422 and r.json()["field"] == "input_shape" and "not inputs of the model" in r.json()["detail"]
    r = env.client.post(URL, files={"file": ("m.onnx", dyn)}, headers=env.h("submit"))
    assert r.status_code == 422 and "raw request body" in r.json()["detail"]
    assert upload(env, dyn, scope="read", input_shape="x=3,4").status_code == 403
    assert upload(env, dyn, trials=0, input_shape="x=3,4").status_code == 422
    for bad in (dict(repeat=0), dict(timeout=601), dict(strategy="annealing"), dict(min_repeat_ms="nan")):
        r = upload(env, dyn, input_shape="x=3,4", **bad)   # the measurement and tuning options' bounds, the API's caps
        assert r.status_code == 422 and next(iter(bad)) in str(r.json()), (bad, r.json())
    assert env.n_jobs() == 0 and env.store.count() == 0
    r = upload(env, dyn, input_shape="x=3,4")         # pinned, it goes
    assert r.status_code == 201 and r.json()["model"]["input_shapes"] == {"x": [3, 4]}
    assert env.n_jobs() == 1


def test_model_upload_over_the_model_limit_is_413_with_the_reason(tmp_path):
    m, _ = two_layer_repeat(d=32)
    data = m.SerializeToString()
    assert 4096 < len(data) < 64_000
    store, app, tokens = make_env(f"sqlite:///{tmp_path / 'limit.db'}", max_body_bytes=4096,
                                  max_model_bytes=len(data) - 1)
    headers = {"Authorization": f"Bearer {tokens['submit']}", **OCTETS}
    with store, TestClient(app) as client:
        r = client.post(URL, content=data, headers=headers)                       # Content-Length says so
        assert r.status_code == 413
        assert r.json()["detail"].startswith(f"ONNX model larger than {len(data) - 1} bytes")
        assert "--max-model-bytes" in r.json()["detail"]
        r = client.post(URL, content=iter([data[:3000], data[3000:]]), headers=headers)   # chunked: counted
        assert r.status_code == 413 and "ONNX model" in r.json()["detail"]
        assert sum(store.jobs.count_by_state().values()) == 0
    store, app, tokens = make_env(f"sqlite:///{tmp_path / 'limit2.db'}", max_body_bytes=4096,
                                  max_model_bytes=len(data))
    headers = {"Authorization": f"Bearer {tokens['submit']}", **OCTETS}
    with store, TestClient(app) as client:     # the model limit, not the JSON body limit, applies to models
        assert client.post(URL, content=data, headers=headers).status_code == 201
        big = {"workloads": [{"op": "relu", "params": {"shape": [8]}}], "name": "x" * 5000}
        assert client.post("/api/v1/jobs", json=big, headers=headers).status_code == 413


def test_the_openapi_document_describes_the_upload(sqlite_env):
    doc = sqlite_env.client.get("/openapi.json").json()
    op = doc["paths"][URL]["post"]
    assert "application/octet-stream" in op["requestBody"]["content"]
    assert {"413", "422"} <= set(op["responses"])
    params = {p["name"]: p for p in op["parameters"]}
    assert set(params) >= {"trials", "input_shape", "target", "device_key", "strategy", "repeat", "timeout"}
    assert params["trials"]["schema"]["default"] == 2000 and params["trials"]["schema"]["maximum"] == 100_000
    assert params["repeat"]["description"] == "clean samples a figure needs at least"
    assert "model" in doc["components"]["schemas"]["JobOut"]["properties"]


class _InProcessTransport(httpx.BaseTransport):
    """httpx requests answered by the app through its TestClient: starlette's TestClient is built on
    httpx2 where that is installed (huggingface_hub brings it with the bench extra), whose
    transport an httpx client cannot use directly."""

    def __init__(self, client):
        self.client = client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        r = self.client.request(request.method, str(request.url), headers=dict(request.headers), content=request.read())
        return httpx.Response(r.status_code, headers=dict(r.headers), content=r.content, request=request)


def test_tunefarm_submit_model_sends_the_file_and_shows_the_reason_of_a_refusal(sqlite_env, tmp_path, monkeypatch, capsys):
    """`tunefarm submit --model FILE.onnx` through the Python client (on the app in process)."""
    from tuner.cli import main, remote
    from tuner.service.client import ServiceClient
    env = sqlite_env
    monkeypatch.setattr(remote, "_client", lambda args: ServiceClient("http://testserver", token=env.tokens["submit"],
                                                                      transport=_InProcessTransport(env.client)))
    m, _ = two_layer_repeat()
    good = tmp_path / "two.onnx"
    good.write_bytes(m.SerializeToString())
    assert main(["submit", "--model", str(good), "--trials", "6", "--name", "cli model", "--strategy", "random",
                 "--repeat", "3", "--min-repeat-ms", "5"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"job \d+ queued: 2 task\(s\), 6 trials", out)
    (job,) = env.store.jobs.page()
    assert job.name == "cli model" and job.spec["model"]["file_name"] == "two.onnx" and job.trials == 6
    assert job.spec["strategy"] == "random" and job.strategy == "random"
    assert job.spec["measure"]["repeat"] == 3 and job.spec["measure"]["min_repeat_ms"] == 5
    dyn = tmp_path / "dyn.onnx"
    dyn.write_bytes(model([helper.make_node("Relu", ["x"], ["y"])], {"x": ((1, 4), "float32")},
                          {"y": (None, "float32")}, dynamic={"x": 0}).SerializeToString())
    assert main(["submit", "--model", str(dyn)]) == 1
    assert "422" in (err := capsys.readouterr().err) and "--input-shape" in err
    assert main(["submit", "--model", str(dyn), "--input-shape", "x=2,4"]) == 0
    assert main(["jobs", "show", str(job.id + 1)]) == 0
    assert "model test: 1 kernels per run" in capsys.readouterr().out
    assert main(["submit", "--model", str(tmp_path / "missing.onnx")]) == 2
    assert main(["submit", "relu", "--model", str(good)]) == 2
    assert len(env.store.jobs.page()) == 2
