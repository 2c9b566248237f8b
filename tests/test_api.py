"""The REST API (tuner.service.api) on real databases: a SQLite file and PostgreSQL.

Most tests drive the app in process with FastAPI's TestClient (which runs the lifespan, so the
app opens and closes its own store); one starts uvicorn on a free loopback port and talks HTTP
to it. A second store object on the same database seeds data and counts what was stored, so
"nothing stored" is checked in the database, not in the API's answers.
"""

from __future__ import annotations

import io
import json
import socket
import threading
import time

import httpx
import numpy as np
import pytest
import uvicorn
from api_env import make_env
from fastapi.testclient import TestClient
from sqlalchemy import create_engine

import compiler as C
from compiler.target import resolve_target
from tuner.candidate import Candidate, ErrorCode, MeasureResult
from tuner.cli.remote import busy_machine_note
from tuner.engine import make_space
from tuner.space.base import default_candidate
from tuner.workload import Task, Workload

TARGET = "llvm -mtriple=x86_64-linux-gnu -mcpu=znver3 -num-cores=2"
SMALL = Workload("matmul", {"M": 16, "N": 16, "K": 16})
TASK = Task(SMALL, TARGET, "local")
MATMUL_JOB = {"workloads": [{"op": "matmul", "params": {"M": 32, "N": 32, "K": 32}}], "trials": 8, "space": "template"}


def cand(i: int) -> Candidate:
    return Candidate("config", {"template": "matmul", "knobs": {"tile": i}})


def ok(cost: float) -> MeasureResult:
    return MeasureResult(costs=[cost, cost * 1.1], build_seconds=0.5, run_seconds=0.25, measured_by="agent-1")


def err(code=ErrorCode.WRONG_ANSWER) -> MeasureResult:
    return MeasureResult(costs=[], error_code=code, error_msg=f"{code.name} here", measured_by="agent-2")




# ---------------------------------------------------------------------------------- jobs

def test_submit_list_show_events_cancel_resume(env):
    r = env.post("/api/v1/jobs", json={**MATMUL_JOB, "name": "first", "priority": 3})
    assert r.status_code == 201, r.text
    job = r.json()
    assert r.headers["location"].endswith(f"/api/v1/jobs/{job['id']}")
    assert job["state"] == "queued" and job["trials"] == 8 and job["trials_done"] == 0 and job["progress"] == 0.0
    assert job["spec"]["workloads"][0]["op"] == "matmul" and job["strategy"] == "model"
    (task,) = job["tasks"]
    assert task["workload"]["name"] == "matmul" and task["weight"] == 1.0 and task["flops"] == 2 * 32**3
    assert task["workload"]["is_compute"] is False and task["best_gflops"] is None and task["speedup"] is None
    second = env.post("/api/v1/jobs", json={"workloads": [{"op": "add", "params": {"shape_a": [64]}}], "trials": 4}).json()

    page = env.get("/api/v1/jobs").json()
    assert [j["id"] for j in page["items"]] == [second["id"], job["id"]] and page["next_before"] is None
    assert page["items"][0]["spec"] is None          # lists leave the spec out
    assert [j["id"] for j in env.get("/api/v1/jobs", params={"workload": "matmul"}).json()["items"]] == [job["id"]]
    assert [j["id"] for j in env.get("/api/v1/jobs", params={"workload": task["workload"]["key"]}).json()["items"]] == [job["id"]]
    assert env.get("/api/v1/jobs", params={"state": "running"}).json()["items"] == []
    assert len(env.get("/api/v1/jobs", params={"target": job["target"]}).json()["items"]) == 2
    one = env.get("/api/v1/jobs", params={"limit": 1}).json()
    assert [j["id"] for j in one["items"]] == [second["id"]] and one["next_before"] == second["id"]
    assert [j["id"] for j in env.get("/api/v1/jobs", params={"limit": 1, "before": one["next_before"]}).json()["items"]] == [job["id"]]

    shown = env.get(f"/api/v1/jobs/{job['id']}").json()
    assert shown["name"] == "first" and shown["priority"] == 3 and shown["attempts"] == 0 and shown["lease_owner"] is None

    events = env.get(f"/api/v1/jobs/{job['id']}/events").json()
    assert [e["kind"] for e in events["items"]] == ["submitted"]
    last = events["next_after"]
    assert env.get(f"/api/v1/jobs/{job['id']}/events", params={"after": last}).json() == {"items": [], "next_after": last}

    assert env.post(f"/api/v1/jobs/{job['id']}/cancel").json()["state"] == "cancelled"
    r = env.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert r.status_code == 409 and r.json()["state"] == "cancelled" and "cancelled" in r.json()["detail"]
    assert env.post(f"/api/v1/jobs/{job['id']}/resume").json()["state"] == "queued"
    new = env.get(f"/api/v1/jobs/{job['id']}/events", params={"after": last}).json()
    assert [e["kind"] for e in new["items"]] == ["cancelled", "resumed"] and new["next_after"] > last


def test_job_progress_is_shown_per_task(env):
    job_id = env.post("/api/v1/jobs", json=MATMUL_JOB).json()["id"]
    claimed = env.store.jobs.claim("worker-1", 60)
    assert claimed.id == job_id
    env.store.jobs.record_progress(job_id, "worker-1", 0, trials=4, batches=1, best_cost=1e-5, best_record_id=None,
                                   baseline_cost=4e-5, trials_done=4, lease_seconds=60)
    job = env.get(f"/api/v1/jobs/{job_id}").json()
    assert job["state"] == "running" and job["progress"] == 0.5 and job["attempts"] == 1
    assert job["lease_owner"] == "worker-1" and job["started_at"] and job["heartbeat_at"]
    (task,) = job["tasks"]
    assert task["speedup"] == pytest.approx(4.0) and task["best_gflops"] == pytest.approx(2 * 32**3 / 1e-5 / 1e9)
    assert task["baseline_cost"] == 4e-5 and task["trials"] == 4
    assert task["timings"] == 0 and task["disturbed_fraction"] == 0.0 and busy_machine_note(job["tasks"]) == ""


def test_a_job_measured_on_a_busy_machine_says_so(env):
    job_id = env.post("/api/v1/jobs", json=MATMUL_JOB).json()["id"]
    env.store.jobs.claim("worker-1", 60)
    env.store.jobs.record_progress(job_id, "worker-1", 0, trials=4, batches=1, best_cost=1e-5, best_record_id=None,
                                   baseline_cost=4e-5, trials_done=4, lease_seconds=60, timings=8, disturbed_timings=2)
    job = env.get(f"/api/v1/jobs/{job_id}").json()
    (task,) = job["tasks"]
    assert task["timings"] == 8 and task["disturbed_fraction"] == pytest.approx(0.25)
    note = busy_machine_note(job["tasks"])   # what `tunefarm jobs show` prints under the tasks
    assert "busy machine" in note and "25 %" in note


BAD_SPECS = [
    ({"workloads": [{"op": "no_such_op"}]}, "workloads.0", "unknown operator"),
    ({"workloads": [{"op": "matmul", "params": {"M": "big", "N": 4, "K": 4}}]}, "workloads.0", "M must be an integer"),
    ({"workloads": [{"op": "matmul", "params": {"M": 4, "N": 4}}]}, "workloads.0", "K"),
    ({"workloads": [{"op": "matmul", "params": {"M": 4, "N": 4, "K": 4}}], "target": "cuda -arch=sm_80"}, "target", "cuda"),
    ({"workloads": [{"compute": {"tensors": "not a dag"}, "name": "mine"}]}, "workloads.0", "compute definition"),
    ({"workloads": [{"compute": {"version": 1, "format": "x", "inputs": [], "outputs": [], "tensors": []}, "name": "mine"}]},
     "workloads.0", ""),
    ({"workloads": [{"compute": "__import__('os').system('true')", "name": "mine"}]}, "workloads.0.compute", ""),
    ({"workloads": [{"op": "matmul", "params": {"M": 4, "N": 4, "K": 4}}], "trials": 0}, "trials", ""),
    ({"workloads": [{"op": "matmul", "params": {"M": 4, "N": 4, "K": 4}}], "trials": -5}, "trials", ""),
    ({"workloads": [{"op": "matmul", "params": {"M": 4, "N": 4, "K": 4}}], "trials": 10**12}, "trials", ""),
    ({"workloads": [{"op": "matmul", "params": {"M": 4, "N": 4, "K": 4}}], "space": "magic"}, "space", ""),
    ({"workloads": [{"op": "matmul", "compute": {}}]}, "workloads.0", "exactly one"),
    ({"workloads": []}, "workloads", ""),
    ({"workloads": [{"op": "matmul", "params": {"M": 4, "N": 4, "K": 4}}], "device_key": "a b/c"}, "device_key", ""),
    ({"workloads": [{"op": "matmul", "params": {"M": 4, "N": 4, "K": 4}}], "surprise": 1}, "surprise", ""),
]


def field_of(body: dict) -> str:
    """The field a 4xx names: ours directly, pydantic's as the issue's location without 'body'."""
    if isinstance(body["detail"], str):
        return body["field"]
    return ".".join(str(p) for p in body["detail"][0]["loc"][1:])


@pytest.mark.parametrize("spec,field,words", BAD_SPECS, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD_SPECS)])
def test_bad_submission_names_the_field_and_stores_nothing(sqlite_env, spec, field, words):
    env = sqlite_env
    r = env.post("/api/v1/jobs", json=spec)
    assert r.status_code == 422, r.text
    body = r.json()
    assert field_of(body) == field
    assert words in json.dumps(body["detail"])
    assert env.n_jobs() == 0 and env.store.count() == 0


def test_bad_submissions_on_both_databases(env):
    for spec, _, _ in BAD_SPECS[:5]:
        assert env.post("/api/v1/jobs", json=spec).status_code == 422
    for raw in (b"{not json", b'{"workloads": [{"op": "matmul"}]', b"[]", b""):
        r = env.client.post("/api/v1/jobs", content=raw, headers={**env.h(), "Content-Type": "application/json"})
        assert r.status_code == 422 and isinstance(r.json()["detail"], list), raw
    # text the database cannot hold (a lone surrogate, a NUL) is a 422, never a 500
    for name in (r'"\ud800"', r'"nul\u0000here"'):
        body = ('{"name": %s, "workloads": [{"op": "matmul", "params": {"M": 4, "N": 4, "K": 4}}]}' % name).encode()
        r = env.client.post("/api/v1/jobs", content=body, headers={**env.h(), "Content-Type": "application/json"})
        assert r.status_code in (201, 422), r.text
    assert env.get("/api/v1/records", params={"target": "nul\x00"}).status_code in (200, 422)
    assert env.n_jobs() <= 1 and env.store.count() == 0


def test_unknown_job_and_finished_job(env):
    for method, path in [("get", "/api/v1/jobs/424242"), ("post", "/api/v1/jobs/424242/cancel"),
                         ("post", "/api/v1/jobs/424242/resume"), ("get", "/api/v1/jobs/424242/events")]:
        r = getattr(env, method)(path)
        assert r.status_code == 404 and r.json() == {"detail": "no job 424242", "field": "job_id"}
    for bad in ("0", "-1", "abc", str(2**70)):
        assert env.get(f"/api/v1/jobs/{bad}").status_code == 422
    job_id = env.post("/api/v1/jobs", json=MATMUL_JOB).json()["id"]
    env.store.jobs.set_state(job_id, "running")
    env.store.jobs.set_state(job_id, "done")
    before = env.store.jobs.events(job_id)
    for action in ("cancel", "resume"):
        r = env.post(f"/api/v1/jobs/{job_id}/{action}")
        assert r.status_code == 409 and r.json()["state"] == "done" and r.json()["field"] == "state"
        assert "job %d is done" % job_id in r.json()["detail"]
    assert env.store.jobs.get(job_id).state == "done" and env.store.jobs.events(job_id) == before


# ---------------------------------------------------------------------------------- security

def test_tokens_and_scopes(env):
    url = "/api/v1/jobs"
    r = env.client.post(url, json=MATMUL_JOB)
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer") and r.json()["field"] == "Authorization"
    for secret in ("tf_not-a-real-token", "nonsense"):
        r = env.client.post(url, json=MATMUL_JOB, headers={"Authorization": f"Bearer {secret}"})
        assert r.status_code == 401 and 'error="invalid_token"' in r.headers["www-authenticate"]
    r = env.client.post(url, json=MATMUL_JOB, headers={"Authorization": f"Basic {env.tokens['admin']}"})
    assert r.status_code == 401
    r = env.post(url, scope="read", json=MATMUL_JOB)
    assert r.status_code == 403 and "'read'" in r.json()["detail"] and 'scope="submit"' in r.headers["www-authenticate"]
    r = env.post("/api/v1/records/import", scope="read", content=b"")
    assert r.status_code == 403
    assert env.n_jobs() == 0

    assert env.client.get(url).status_code == 401                       # reads need a token too
    assert env.client.get("/metrics").status_code == 401
    assert env.get(url, scope="read").status_code == 200
    assert env.get("/metrics", scope="read").status_code == 200
    assert env.client.get("/healthz").status_code == 200 and env.client.get("/readyz").status_code == 200

    job_id = env.post(url, scope="submit", json=MATMUL_JOB).json()["id"]
    assert env.post(f"/api/v1/jobs/{job_id}/cancel", scope="read").status_code == 403
    assert env.store.jobs.get(job_id).state == "queued"
    revoked = next(t for t in env.store.tokens.list_all() if t.name == "test-submit")
    env.store.tokens.revoke(revoked.id)
    assert env.post(f"/api/v1/jobs/{job_id}/cancel", scope="submit").status_code == 401
    assert env.store.jobs.get(job_id).state == "queued"
    used = {t.name: t.last_used_at for t in env.store.tokens.list_all()}
    assert used["test-read"] is not None and used["test-admin"] is None     # touched after use, never an unused one


def test_public_read(tmp_path):
    store, app, tokens = make_env(f"sqlite:///{tmp_path / 'public.db'}", public_read=True)
    with store, TestClient(app) as client:
        assert client.get("/api/v1/jobs").status_code == 200
        assert client.get("/api/v1/records").status_code == 200
        assert client.get("/metrics").status_code == 200
        assert client.get("/api/v1/jobs", headers={"Authorization": "Bearer tf_wrong"}).status_code == 401
        assert client.post("/api/v1/jobs", json=MATMUL_JOB).status_code == 401
        r = client.post("/api/v1/jobs", json=MATMUL_JOB, headers={"Authorization": f"Bearer {tokens['read']}"})
        assert r.status_code == 403
        assert sum(store.jobs.count_by_state().values()) == 0


def test_body_too_large(tmp_path):
    store, app, tokens = make_env(f"sqlite:///{tmp_path / 'small.db'}", max_body_bytes=4096)
    headers = {"Authorization": f"Bearer {tokens['admin']}"}
    big = {**MATMUL_JOB, "name": "x" * 5000}
    with store, TestClient(app) as client:
        r = client.post("/api/v1/jobs", json=big, headers=headers)                  # Content-Length says so
        assert r.status_code == 413 and "4096" in r.json()["detail"]

        def chunks():                                                                # no Content-Length: counted
            body = json.dumps(big).encode()
            for i in range(0, len(body), 1000):
                yield body[i:i + 1000]
        r = client.post("/api/v1/jobs", content=chunks(), headers={**headers, "Content-Type": "application/json"})
        assert r.status_code == 413
        lines = "".join(json.dumps({"junk": i}) + "\n" for i in range(400)).encode()
        assert client.post("/api/v1/records/import", content=lines, headers=headers).status_code == 413
        assert client.post("/api/v1/records/import", content=iter([lines]), headers=headers).status_code == 413
        assert client.post("/api/v1/jobs", json=MATMUL_JOB, headers=headers).status_code == 201   # a small one still goes
        assert sum(store.jobs.count_by_state().values()) == 1 and store.count() == 0


# ---------------------------------------------------------------------------------- records

def seed(store, n: int, job_id=None) -> list[int]:
    """n records of TASK: every 7th an error."""
    return store.add_records(TASK, [(cand(i), err() if i % 7 == 0 else ok(1e-3 + i * 1e-6)) for i in range(n)], job_id=job_id)


def test_record_pages_with_cursors_over_more_than_500(env):
    ids = seed(env.store, 1200)
    seen, before, pages = [], None, 0
    while True:
        params = {"limit": 500} if before is None else {"limit": 500, "before": before}
        page = env.get("/api/v1/records", params=params).json()
        seen += [r["id"] for r in page["items"]]
        pages += 1
        before = page["next_before"]
        if before is None:
            break
    assert seen == sorted(ids, reverse=True) and pages == 3
    assert env.get("/api/v1/records", params={"limit": 501}).status_code == 422
    assert env.get("/api/v1/records", params={"limit": 0}).status_code == 422

    errors = env.get("/api/v1/records", params={"error_code": 5, "limit": 500}).json()["items"]
    assert len(errors) == len(range(0, 1200, 7)) and all(r["result"]["error_name"] == "WRONG_ANSWER" for r in errors)
    assert errors[0]["result"]["mean_cost"] is None and errors[0]["cost"] is None and errors[0]["result"]["costs"] == []
    key = SMALL.key
    assert len(env.get("/api/v1/records", params={"workload_key": key, "device_key": "local", "target": TARGET}).json()["items"]) == 50
    assert env.get("/api/v1/records", params={"device_key": "elsewhere"}).json() == {"items": [], "next_before": None}
    assert env.get("/api/v1/records", params={"job_id": 1}).json()["items"] == []


def test_a_jobs_view_says_when_and_why_its_measurements_were_retaken(env):
    """A job's own view lists the windows of its measurements that a measuring worker's closing
    calibration found slow (re-measured in a fresh worker, or kept but marked), newest first, with
    the speed index and the reason in words, and counts them per task; lists leave them out."""
    job_id = env.post("/api/v1/jobs", json=MATMUL_JOB).json()["id"]
    task = env.store.jobs.get(job_id).tasks[0].task

    def slow(i, **marks):
        return cand(i), MeasureResult(costs=[1e-3], median=1e-3, minimum=1e-3, spread=0.0, samples=1,
                                      measured_by="agent-7", **marks)
    assert env.get(f"/api/v1/jobs/{job_id}").json()["retaken"] == []
    env.store.add_records(task, [slow(1, remeasured=True, slow_index=0.52), slow(2, remeasured=True, slow_index=0.52),
                                 slow(3)], job_id=job_id)
    env.store.add_records(task, [slow(4, slow_window=True, slow_index=0.31)], job_id=job_id)
    job = env.get(f"/api/v1/jobs/{job_id}").json()
    marked, again = job["retaken"]
    assert (marked["kind"], marked["count"], marked["slow_index"], marked["measured_by"], marked["position"]) == (
        "slow_window", 1, 0.31, "agent-7", 0)
    assert "0.31 of this device's usual speed" in marked["reason"] and "marked" in marked["reason"]
    assert (again["kind"], again["count"], again["slow_index"]) == ("remeasured", 2, 0.52)
    assert "measured again in a fresh worker process" in again["reason"] and again["first_at"] <= again["last_at"]
    assert (job["tasks"][0]["remeasured"], job["tasks"][0]["slow_window"], job["retaken_capped"]) == (2, 1, False)
    listed = env.get("/api/v1/jobs").json()["items"][0]
    assert listed["retaken"] is None and listed["tasks"][0]["remeasured"] == 0
    records = env.get("/api/v1/records", params={"job_id": job_id}).json()["items"]
    assert [(r["result"]["slow_window"], r["result"]["remeasured"], r["result"]["slow_index"]) for r in records] == [
        (True, False, 0.31), (False, False, None), (False, True, 0.52), (False, True, 0.52)]


def test_get_record_and_records_of_a_job(env):
    job_id = env.post("/api/v1/jobs", json=MATMUL_JOB).json()["id"]
    (rid,) = env.store.add_records(TASK, [(cand(1), ok(2e-3))], job_id=job_id)
    rec = env.get(f"/api/v1/records/{rid}").json()
    assert rec["candidate"] == {"kind": "config", "payload": {"template": "matmul", "knobs": {"tile": 1}}}
    assert rec["result"]["costs"] == [2e-3, 2e-3 * 1.1] and rec["result"]["measured_by"] == "agent-1"
    assert rec["result"]["build_seconds"] == 0.5 and rec["job_id"] == job_id and rec["workload"]["key"] == SMALL.key
    assert rec["cost"] == pytest.approx(2.1e-3) and rec["created_at"]
    assert [r["id"] for r in env.get("/api/v1/records", params={"job_id": job_id}).json()["items"]] == [rid]
    r = env.get("/api/v1/records/987654")
    assert r.status_code == 404 and r.json()["field"] == "record_id"


def test_export_streams_pages_and_import_round_trips(env, tmp_path):
    n = 1100
    seed(env.store, n)
    other = Task(Workload("matmul", {"M": 8, "N": 8, "K": 8}), TARGET, "local")
    env.store.add_records(other, [(cand(1), ok(1e-4))])
    pages = []
    real = env.client.app.state.store.records_after

    def spy(*a, **kw):
        pages.append(kw.get("after_id"))
        return real(*a, **kw)
    env.client.app.state.store.records_after = spy
    with env.client.stream("GET", "/api/v1/records/export", headers=env.h("read"), params={"workload_key": SMALL.key}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        text = "".join(r.iter_text())
    lines = text.splitlines()
    assert len(lines) == n and len(pages) == 4           # 500 + 500 + 100, then an empty page
    assert json.loads(lines[0])["workload_key"] == SMALL.key
    mine = io.StringIO()
    env.store.export_jsonl(mine, workload_key=SMALL.key)
    assert mine.getvalue() == text                          # the same lines as the store's own export

    store2, app2, tokens2 = make_env(f"sqlite:///{tmp_path / 'other.db'}")
    h2 = {"Authorization": f"Bearer {tokens2['submit']}"}
    with store2, TestClient(app2) as c2:
        r = c2.post("/api/v1/records/import", content=text.encode(), headers={**h2, "Content-Type": "application/x-ndjson"})
        assert r.status_code == 200 and r.json() == {"added": n}
        assert c2.post("/api/v1/records/import", content=text.encode(), headers=h2).json() == {"added": 0}
        bad = lines[0] + "\n{broken\n"
        r = c2.post("/api/v1/records/import", content=bad.encode(), headers=h2)
        assert r.status_code == 422 and r.json()["field"] == "body" and "line 2" in r.json()["detail"]
        r = c2.post("/api/v1/records/import", content=b"\xff\xfe not utf-8", headers=h2)
        assert r.status_code == 422 and "UTF-8" in r.json()["detail"]
        assert store2.count() == n
        exported = c2.get("/api/v1/records/export", headers={"Authorization": f"Bearer {tokens2['read']}"}).text
        assert len(exported.splitlines()) == n
    # nothing half-imported: a file with a good line then a bad one adds nothing
    fresh_text = json.dumps({**json.loads(lines[0]), "workload_key": other.workload.key, "workload": other.workload.to_json(),
                             "candidate": cand(999).to_json()})
    r = env.post("/api/v1/records/import", content=(fresh_text + "\nnot json\n").encode())
    assert r.status_code == 422 and env.store.count() == n + 1


# ---------------------------------------------------------------------------------- best, catalogue

def test_best_has_gflops_speedup_and_loop_ir(env):
    workload = Workload("matmul", {"M": 32, "N": 32, "K": 32})
    target = str(resolve_target(None))
    task = Task(workload, target, "local")
    key = workload.key
    config = make_space("template", workload.opdef(), target).sample(np.random.default_rng(0))
    env.store.add_records(task, [(default_candidate(key), ok(4e-5)), (config, ok(1e-5)), (cand(3), err())])
    best = env.get("/api/v1/best", params={"workload_key": key, "target": target})
    assert best.status_code == 200, best.text
    b = best.json()
    flops = 2 * 32**3
    assert b["candidate"] == config.to_json() and b["flops"] == flops
    assert b["gflops"] == pytest.approx(flops / 1.05e-5 / 1e9)
    assert b["baseline"]["candidate"]["kind"] == "default" and b["speedup"] == pytest.approx(4.0)
    assert b["loop_ir"].startswith("func main(") and "for (" in b["loop_ir"] and b["loop_ir_error"] is None
    again = env.get("/api/v1/best", params={"workload_key": key, "target": target, "device_key": "local"}).json()
    assert again["loop_ir"] == b["loop_ir"]
    r = env.get("/api/v1/best", params={"workload_key": key, "target": target, "device_key": "rpi4"})
    assert r.status_code == 404 and "rpi4" in r.json()["detail"]
    r = env.get("/api/v1/best", params={"workload_key": "0" * 32, "target": target})
    assert r.status_code == 404 and r.json()["field"] == "workload_key"
    assert env.get("/api/v1/best", params={"target": target}).status_code == 422
    # a best record whose candidate does not apply any more still answers, with the reason
    (rid,) = env.store.add_records(Task(SMALL, TARGET, "local"), [(cand(5), ok(1e-6))])
    odd = env.get("/api/v1/best", params={"workload_key": SMALL.key, "target": TARGET}).json()
    assert odd["record"]["id"] == rid and odd["loop_ir"] is None and odd["loop_ir_error"] and odd["baseline"] is None
    assert odd["speedup"] is None


def softplus_dag() -> dict:
    A = C.placeholder((8, 12), "float32", "A")
    out = C.compute((8, 12), lambda i, j: C.log(C.exp(A[i, j]) + 1.0), name="softplus_dag")
    return Workload.from_compute(out, [A]).definition


def test_workloads_and_targets(env):
    seed(env.store, 20)
    env.store.add_records(Task(SMALL, "llvm -mcpu=other", "rpi4"), [(cand(1), ok(1e-3))])
    r = env.post("/api/v1/jobs", json={"workloads": [{"compute": softplus_dag(), "name": "softplus_dag"}], "trials": 4})
    assert r.status_code == 201, r.text
    dag_key = r.json()["tasks"][0]["workload"]["key"]
    assert r.json()["tasks"][0]["workload"]["is_compute"] is True

    items = env.get("/api/v1/workloads").json()["items"]
    by_key = {w["key"]: w for w in items}
    assert by_key[SMALL.key] == {"key": SMALL.key, "name": "matmul", "params": {"M": 16, "N": 16, "K": 16},
                                 "is_compute": False, "records": 21}
    assert by_key[dag_key]["is_compute"] is True and by_key[dag_key]["records"] == 0
    first = env.get("/api/v1/workloads", params={"limit": 1}).json()
    rest = env.get("/api/v1/workloads", params={"limit": 1, "after": first["next_after"]}).json()
    assert [w["key"] for w in first["items"] + rest["items"]] == sorted(by_key)
    assert [w["key"] for w in env.get("/api/v1/workloads", params={"name": "softplus_dag"}).json()["items"]] == [dag_key]

    targets = {t["target"]: t for t in env.get("/api/v1/targets").json()["items"]}
    assert targets[TARGET] == {"target": TARGET, "tasks": 1, "workloads": 1, "device_keys": ["local"], "records": 20}
    assert targets["llvm -mcpu=other"]["device_keys"] == ["rpi4"] and targets["llvm -mcpu=other"]["records"] == 1
    page = env.get("/api/v1/targets", params={"limit": 1}).json()
    assert len(page["items"]) == 1 and page["next_after"] == page["items"][0]["target"]


def test_farm_from_the_store_and_an_unreachable_tracker(env, tmp_path):
    env.store.upsert_agent("agent-a", "x86-avx512", {"cpu": "znver4", "cores": 2})
    env.store.upsert_agent("agent-b", "x86-avx512")
    farm = env.get("/api/v1/farm").json()
    assert farm["source"] == "store" and [a["name"] for a in farm["agents"]] == ["agent-a", "agent-b"]
    assert farm["agents"][0]["info"] == {"cpu": "znver4", "cores": 2} and farm["agents"][0]["last_seen_seconds_ago"] >= 0
    assert farm["keys"] == [{"device_key": "x86-avx512", "agents": 2, "queued": None, "in_flight": None, "completed": None,
                             "degraded": None}]
    with socket.socket() as s:          # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store, app, tokens = make_env(f"sqlite:///{tmp_path / 'farm.db'}", tracker=f"127.0.0.1:{port}", public_read=True)
    with store, TestClient(app) as client:
        r = client.get("/api/v1/farm")
        assert r.status_code == 503 and "tracker" in r.json()["detail"] and r.headers["retry-after"]


# ---------------------------------------------------------------------------------- operations

def test_metrics(env):
    job_id = env.post("/api/v1/jobs", json=MATMUL_JOB).json()["id"]
    env.post("/api/v1/jobs", json=MATMUL_JOB)
    env.store.jobs.set_state(job_id, "running")
    env.store.add_records(TASK, [(cand(i), ok(1e-3)) for i in range(6)] + [(cand(100), err()), (cand(101), err(ErrorCode.RUN_TIMEOUT))])
    env.get(f"/api/v1/jobs/{job_id}")
    env.get("/api/v1/jobs/99999")
    text = env.get("/metrics").text
    for line in ['tunefarm_jobs{state="queued"} 1.0', 'tunefarm_jobs{state="running"} 1.0', 'tunefarm_jobs{state="done"} 0.0',
                 "tunefarm_queue_depth 1.0", f"tunefarm_trials_per_second {8 / 60}",
                 'tunefarm_measurement_errors{code="WRONG_ANSWER"} 1.0', 'tunefarm_measurement_errors{code="RUN_TIMEOUT"} 1.0',
                 'tunefarm_measurement_errors{code="COMPILE_ERROR"} 0.0', "tunefarm_store_up 1.0",
                 'tunefarm_http_request_duration_seconds_count{method="GET",route="/api/v1/jobs/{job_id}",status="200"} 1.0',
                 'tunefarm_http_request_duration_seconds_count{method="GET",route="/api/v1/jobs/{job_id}",status="404"} 1.0',
                 'tunefarm_http_request_duration_seconds_count{method="POST",route="/api/v1/jobs",status="201"} 2.0']:
        assert line in text, line


def test_recent_measurements_are_bounded(sqlite_env):
    store = sqlite_env.store
    store.add_records(TASK, [(cand(i), ok(1e-3) if i % 2 else err()) for i in range(40)])
    assert store.recent_measurements(60) == (40, {int(ErrorCode.WRONG_ANSWER): 20}, False)
    count, errors, capped = store.recent_measurements(60, cap=25, chunk=10)
    assert count == 25 and capped is True
    assert store.recent_measurements(60, cap=1000, chunk=7) == (40, {5: 20}, False)
    assert store.recent_measurements(0.0)[0] == 0


def test_store_reads_for_the_api(env):
    """The reads added for the API, directly: baseline by fingerprint, oldest-first pages, catalogue."""
    store = env.store
    assert store.baseline_record(SMALL.key, TARGET) is None
    ids = store.add_records(TASK, [(default_candidate(SMALL.key), ok(5e-3)), (cand(1), ok(1e-3)), (cand(2), err())])
    assert store.baseline_record(SMALL.key, TARGET).id == ids[0]
    assert store.baseline_record(SMALL.key, TARGET, device_key="other") is None
    assert [r.id for r in store.records_after(limit=2)] == ids[:2]
    assert [r.id for r in store.records_after(after_id=ids[1])] == ids[2:]
    assert store.records_after(target="nowhere") == []
    (w,) = store.list_workloads()
    assert w == {"key": SMALL.key, "name": "matmul", "params": SMALL.params, "is_compute": False, "records": 3}
    assert store.list_workloads(after_key=SMALL.key) == []
    assert store.list_targets() == [{"target": TARGET, "tasks": 1, "workloads": 1, "device_keys": ["local"], "records": 3}]
    store.ping()


def test_numbers_json_cannot_carry_are_null():
    """Responses are serialized once, without a validator per number: a non-finite value (a
    timing that overflowed, a NaN mean) still comes out as null, never as invalid JSON."""
    from tuner.service.api.respond import json_response as respond
    from tuner.service.api.schemas import ResultOut

    out = ResultOut(costs=[1e-3, float("inf")], mean_cost=float("nan"), error_code=0, error_msg="", measured_by="a")
    body = json.loads(respond(out).body)
    assert body["costs"] == [1e-3, None] and body["mean_cost"] is None


def test_database_down_is_503(tmp_path):
    store, app, tokens = make_env(f"sqlite:///{tmp_path / 'down.db'}", public_read=True)
    with store, TestClient(app) as client:
        good = app.state.store.db.engine
        app.state.store.db.engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:9/none",
                                                connect_args={"connect_timeout": 1})
        try:
            for path in ("/api/v1/jobs", "/api/v1/records", "/api/v1/jobs/1", "/api/v1/workloads", "/readyz"):
                r = client.get(path)
                assert r.status_code == 503 and r.headers["retry-after"] == "5", path
            r = client.post("/api/v1/jobs", json=MATMUL_JOB, headers={"Authorization": f"Bearer {tokens['admin']}"})
            assert r.status_code == 503
            metrics = client.get("/metrics")
            assert metrics.status_code == 200 and "tunefarm_store_up 0.0" in metrics.text
        finally:
            app.state.store.db.engine.dispose()
            app.state.store.db.engine = good
        assert client.get("/readyz").json() == {"status": "ready", "database": "sqlite"}


def test_openapi_document(sqlite_env):
    doc = sqlite_env.client.get("/openapi.json").json()
    paths = doc["paths"]
    for path in ("/api/v1/jobs", "/api/v1/jobs/{job_id}", "/api/v1/jobs/{job_id}/cancel", "/api/v1/jobs/{job_id}/resume",
                 "/api/v1/jobs/{job_id}/events", "/api/v1/records", "/api/v1/records/{record_id}", "/api/v1/records/export",
                 "/api/v1/records/import", "/api/v1/best", "/api/v1/workloads", "/api/v1/targets", "/api/v1/farm",
                 "/healthz", "/readyz", "/metrics"):
        assert path in paths, path
    assert "JobSpec" in doc["components"]["schemas"] and doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert set(paths["/api/v1/jobs"]["post"]["responses"]) >= {"201", "401", "403", "413", "422", "503"}
    assert sqlite_env.client.get("/docs").status_code == 200


# ---------------------------------------------------------------------------------- a real server

def test_real_server_over_http(db_url):
    store, app, tokens = make_env(db_url, max_body_bytes=64 << 10)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        base = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {tokens['submit']}"}
        with httpx.Client(base_url=base, headers=headers, timeout=10) as http:
            assert http.get("/healthz").json() == {"status": "ok"}
            r = http.post("/api/v1/jobs", json=MATMUL_JOB)
            assert r.status_code == 201
            job_id = r.json()["id"]
            assert http.get(f"/api/v1/jobs/{job_id}").json()["state"] == "queued"
            assert http.post(f"/api/v1/jobs/{job_id}/cancel").json()["state"] == "cancelled"
            r = http.post("/api/v1/records/import", content=b"x" * (100 << 10))
            assert r.status_code == 413
            assert "tunefarm_jobs" in http.get("/metrics").text
        assert store.jobs.get(job_id).state == "cancelled"
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        store.close()
    assert not thread.is_alive()


def test_read_token_checks_are_cached_briefly_and_writes_always_ask_the_database(db_url):
    """A token verified for a read is trusted for the cache's few seconds (no database round trip
    per request); a write asks the database, and a revoked token is forgotten at once."""
    import time as _time

    from tuner.records import SQLRecordsStore
    from tuner.service.api.auth import TokenCache
    with SQLRecordsStore(db_url) as store:
        secret, info = store.tokens.create("cached", "submit")
        cache = TokenCache(seconds=0.3)
        assert cache.verify(store, secret).id == info.id
        store.tokens.revoke(info.id)
        assert cache.verify(store, secret).id == info.id              # a read within the window
        assert cache.verify(store, secret, fresh=True) is None        # a write: refused, and forgotten
        assert cache.verify(store, secret) is None
        other, other_info = store.tokens.create("cached-2", "read")
        cache.verify(store, other)
        _time.sleep(0.35)
        store.tokens.revoke(other_info.id)
        assert cache.verify(store, other) is None                     # past the window: asked again
        assert cache.verify(store, "tf_unknown") is None


def test_a_records_page_is_the_json_its_models_would_be(db_url):
    """Records pages are written as text from the store's page rows (api/record_page.py: the
    candidate as the database holds it), not from Records and their models: the page validates
    as a RecordPage (the schema in the OpenAPI document) and is the JSON the same records' models
    give, on SQLite and PostgreSQL, for a timed, a failed (unknown code too), an emulated, a
    re-measured (at the end of a run, and after a slow window), a slow-window and a DAG workload's
    record, in each order and with each order's cursors."""
    from tuner.records import open_store
    from tuner.service.api.record_page import record_page_response
    from tuner.service.api.schemas import RecordOut, RecordPage
    relu = Workload("relu", {"shape": [64, 2]})
    x = C.placeholder((4,), name="x")
    dag = Workload.from_compute(C.compute((4,), lambda i: x[i] * 2.0, name="twice"), name="twice")
    timed = MeasureResult(costs=[1e-3, 1.1e-3], build_seconds=0.5, run_seconds=0.2, measured_by="a1").take_timing(
        {"median": 1.05e-3, "min": 1e-3, "spread": 0.1, "count": 2, "disturbed": False, "lost_fraction": 0.0})
    wrong = MeasureResult(costs=[], error_code=ErrorCode.WRONG_ANSWER, error_msg='wrong \u2013 "quoted"')
    store = open_store(db_url)
    try:
        store.add_records(Task(relu, "llvm", "local"), [(Candidate("config", {"t": [1, 2], "s": 'é"q'}), timed)])
        store.add_records(Task(relu, "llvm", "board"), [(Candidate("trace", {"s": "x"}), wrong)])
        store.add_records(Task(relu, "llvm", "local"), [(Candidate("config", {}), MeasureResult(costs=[], error_code=77))])
        store.add_records(Task(relu, "llvm", "local"), [   # timed in a slow window: marked, or taken again
            (Candidate("config", {"slow": 1}), MeasureResult(costs=[3e-3], slow_window=True, slow_index=0.41)),
            (Candidate("config", {"slow": 2}), MeasureResult(costs=[3e-3], remeasured=True, slow_index=0.6))])
        dag_task, dag_default = Task(dag, "llvm -mcpu=x", "pi"), default_candidate(dag.key)
        store.add_records(dag_task, [(dag_default, MeasureResult(costs=[2e-3, 3e-3], emulated=True))])
        assert store.set_retimed(dag_task, {dag_default.fingerprint: 1.9e-3}, beats_default={dag_default.fingerprint: True}) == 1
        if db_url.startswith("sqlite"):   # SQLite's JSON text can hold Infinity (PostgreSQL's jsonb refuses it)
            store.add_records(Task(relu, "llvm", "local"), [(Candidate("config", {"inf": 1}), MeasureResult(costs=[1e-3, float("inf")]))])
        reads = [lambda **kw: store.records_page(limit=50, **kw),
                 lambda **kw: store.records_page(workload_key=relu.key, limit=2, **kw),
                 lambda **kw: store.records_sorted("oldest", limit=50, **kw),
                 lambda **kw: store.records_sorted("fastest", workload_key=dag.key, **kw)]
        for read in reads:
            rows, records = read(page_rows=True), read()
            assert rows and [r.id for r in rows] == [r.id for r in records]
            last = rows[-1]
            for cursors in ({"next_before": last.id}, {"next_before": None}, {"next_after": last.id},
                            {"next_after": last.id, "next_after_cost": last.mean_cost or 2e-3}):
                fast = json.loads(record_page_response(rows, **cursors).body)
                slow = json.loads(RecordPage(items=[RecordOut.of(r) for r in records], **cursors).model_dump_json())
                assert fast == slow == json.loads(RecordPage.model_validate(fast).model_dump_json())
        items = json.loads(record_page_response(store.records_page(page_rows=True)).body)["items"]
        assert sorted(str(i["result"]["error_name"]) for i in items)[-2:] == ["None", "WRONG_ANSWER"]
        assert [i["result"]["costs"] for i in items if i["candidate"]["payload"] == {"inf": 1}] in ([], [[1e-3, None]])
        assert [i["cost"] for i in items if i["workload"]["is_compute"]] == [1.9e-3]
        assert all(i["created_at"].endswith("Z") for i in items)
    finally:
        store.close()


def test_an_api_process_settles_its_heap_before_it_serves():
    """settle_heap (called by `tunefarm serve` in each API process before it serves) leaves the
    loaded modules in the permanent generation, so a full collection no longer walks them (40-50
    ms a collection, a request's p99), /best's lowering already imported, and the young
    generation's threshold raised; cycles made afterwards are still collected."""
    import subprocess
    import sys
    code = ("import gc, sys, weakref\n"
            "from tuner.service.api.app import create_app\n"
            "from tuner.service.api.heap import GC_YOUNG_THRESHOLD, settle_heap\n"
            "settle_heap()\n"
            "class Node: pass\n"
            "a, b = Node(), Node(); a.b, b.a = b, a; gone = weakref.ref(a); del a, b\n"
            "gc.collect()\n"
            "print('compiler.lower' in sys.modules, gc.get_freeze_count() > 50_000,"
            " gc.get_threshold()[0] == GC_YOUNG_THRESHOLD, gone() is None)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout.split()
    assert out == ["True", "True", "True", "True"]
