"""The API reads the web dashboard needs, on SQLite and PostgreSQL: a job's measurements for its
charts, records oldest and fastest first, a record's loop IR, the best record of every task, and
error counts in job lists. On SQLite the query plans are checked too: every statement these reads
run searches records through an index, none scans the table.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from api_env import make_env
from fastapi.testclient import TestClient
from sqlalchemy import event
from test_api import MATMUL_JOB, TARGET, cand, err, ok

from compiler.target import resolve_target
from tuner.candidate import ErrorCode, MeasureResult
from tuner.engine import make_space
from tuner.records.store import MAX_MEASUREMENTS
from tuner.space.base import default_candidate
from tuner.workload import Task, Workload


def job_task(job: dict, position: int = 0) -> Task:
    t = job["tasks"][position]
    return Task(Workload(t["workload"]["name"], t["workload"]["params"]), t["target"], t["device_key"])


# ---------------------------------------------------------------------------------- measurements

def test_job_measurements_are_compact_incremental_and_per_task(env):
    spec = {**MATMUL_JOB, "workloads": [{"op": "matmul", "params": {"M": 32, "N": 32, "K": 32}},
                                        {"op": "matmul", "params": {"M": 16, "N": 16, "K": 16}}]}
    job = env.post("/api/v1/jobs", json=spec).json()
    other = env.post("/api/v1/jobs", json=MATMUL_JOB).json()
    first, second = job_task(job, 0), job_task(job, 1)
    flops = 2 * 32**3
    assert job["tasks"][0]["flops"] == flops
    empty = env.get(f"/api/v1/jobs/{job['id']}/measurements").json()
    assert empty == {"items": [], "next_after": None}

    key = first.workload.key
    ids = env.store.add_records(first, [(default_candidate(key), ok(4e-5)), (cand(1), ok(1e-5)), (cand(2), err())], job_id=job["id"])
    ids += env.store.add_records(second, [(cand(3), ok(2e-6))], job_id=job["id"])
    env.store.add_records(job_task(other), [(cand(9), ok(1e-5))], job_id=other["id"])     # not this job's
    env.store.add_records(first, [(cand(10), ok(1e-5))])                                   # no job at all

    page = env.get(f"/api/v1/jobs/{job['id']}/measurements").json()
    items = page["items"]
    assert [m["id"] for m in items] == ids and page["next_after"] == ids[-1]
    assert [m["position"] for m in items] == [0, 0, 0, 1]
    assert [m["kind"] for m in items] == ["default", "config", "config", "config"]
    assert items[0]["cost"] == pytest.approx(4.2e-5) and items[0]["gflops"] == pytest.approx(flops / 4.2e-5 / 1e9)
    assert items[2] == {**items[2], "cost": None, "gflops": None, "error_code": int(ErrorCode.WRONG_ANSWER)}
    assert items[3]["gflops"] == pytest.approx(2 * 16**3 / 2.1e-6 / 1e9)      # the flops of its own task
    assert all(0 <= m["seconds"] < 600 for m in items)

    two = env.get(f"/api/v1/jobs/{job['id']}/measurements", params={"limit": 2}).json()
    assert [m["id"] for m in two["items"]] == ids[:2] and two["next_after"] == ids[1]
    rest = env.get(f"/api/v1/jobs/{job['id']}/measurements", params={"after": two["next_after"]}).json()
    assert [m["id"] for m in rest["items"]] == ids[2:]
    idle = env.get(f"/api/v1/jobs/{job['id']}/measurements", params={"after": ids[-1]}).json()
    assert idle == {"items": [], "next_after": ids[-1]}     # polling with nothing new keeps the cursor

    r = env.get("/api/v1/jobs/424242/measurements")
    assert r.status_code == 404 and r.json()["field"] == "job_id"
    assert env.get(f"/api/v1/jobs/{job['id']}/measurements", params={"limit": MAX_MEASUREMENTS + 1}).status_code == 422
    assert env.get(f"/api/v1/jobs/{job['id']}/measurements", params={"limit": MAX_MEASUREMENTS}).status_code == 200
    assert env.client.get(f"/api/v1/jobs/{job['id']}/measurements").status_code == 401


def test_job_lists_count_failed_measurements(env):
    job = env.post("/api/v1/jobs", json=MATMUL_JOB).json()
    quiet = env.post("/api/v1/jobs", json={**MATMUL_JOB, "name": "quiet"}).json()
    env.store.add_records(job_task(job), [(cand(1), err()), (cand(2), err(ErrorCode.RUN_TIMEOUT)), (cand(3), ok(1e-5))],
                          job_id=job["id"])
    by_id = {j["id"]: j for j in env.get("/api/v1/jobs").json()["items"]}
    assert by_id[job["id"]]["errors"] == 2 and by_id[quiet["id"]]["errors"] == 0
    assert env.get(f"/api/v1/jobs/{job['id']}").json()["errors"] == 2
    assert env.store.jobs.get(job["id"]).errors == 2


# ---------------------------------------------------------------------------------- record orders

SMALL = Workload("matmul", {"M": 16, "N": 16, "K": 16})
OTHER = Workload("matmul", {"M": 8, "N": 8, "K": 8})


def seed_costs(store) -> dict:
    """Records of SMALL on two device keys with tied costs, errors, and some of OTHER."""
    a = store.add_records(Task(SMALL, TARGET, "local"), [(cand(i), err() if i % 5 == 0 else ok(1e-3 * (1 + i % 4))) for i in range(20)])
    b = store.add_records(Task(SMALL, TARGET, "rpi4"), [(cand(i), ok(1e-3 * (1 + i % 3))) for i in range(6)])
    c = store.add_records(Task(OTHER, TARGET, "local"), [(cand(i), ok(1e-6)) for i in range(5)])
    return {"a": a, "b": b, "c": c}


def walk(env, params: dict, cursor_keys: tuple[str, ...]) -> tuple[list[dict], int]:
    seen, cursor, pages = [], {}, 0
    while True:
        page = env.get("/api/v1/records", params={**params, **cursor}).json()
        seen += page["items"]
        pages += 1
        nxt = {k: page.get(f"next_{k}") for k in cursor_keys}
        if any(v is None for v in nxt.values()):
            return seen, pages
        cursor = nxt


def test_records_oldest_and_fastest_first(env):
    ids = seed_costs(env.store)
    everything = sorted(ids["a"] + ids["b"] + ids["c"])
    seen, pages = walk(env, {"order": "oldest", "limit": 7}, ("after",))
    assert [r["id"] for r in seen] == everything and pages == len(everything) // 7 + 1

    fast, _ = walk(env, {"order": "fastest", "workload_key": SMALL.key, "limit": 4}, ("after", "after_cost"))
    key = [(r["result"]["mean_cost"], r["id"]) for r in fast]
    assert key == sorted(key) and len(fast) == 16 + 6               # valid records of both device keys; no errors
    assert {r["workload"]["key"] for r in fast} == {SMALL.key}
    rpi = env.get("/api/v1/records", params={"order": "fastest", "workload_key": SMALL.key, "device_key": "rpi4", "limit": 500}).json()
    assert sorted(r["id"] for r in rpi["items"]) == ids["b"] and "next_after" not in rpi     # the last page has no cursor
    first = env.get("/api/v1/records", params={"order": "fastest", "workload_key": SMALL.key, "limit": 3}).json()
    assert first["next_after"] == first["items"][-1]["id"] and first["next_after_cost"] == first["items"][-1]["result"]["mean_cost"]
    assert "next_before" in first and first["next_before"] is None
    assert env.get("/api/v1/records", params={"order": "fastest", "workload_key": SMALL.key, "error_code": 5}).json()["items"] == []

    # the default order's response is as it always was: no cursors of the other orders
    newest = env.get("/api/v1/records", params={"limit": 2}).json()
    assert set(newest) == {"items", "next_before"} and newest["next_before"] == everything[-2]
    oldest = env.get("/api/v1/records", params={"order": "oldest", "limit": 2, "job_id": 1}).json()
    assert oldest == {"items": [], "next_before": None}


@pytest.mark.parametrize("params,field", [
    ({"order": "fastest"}, "workload_key"),
    ({"order": "fastest", "workload_key": SMALL.key, "after_cost": 0.001}, "after"),
    ({"order": "fastest", "workload_key": SMALL.key, "after": 3}, "after_cost"),
    ({"order": "oldest", "before": 3}, "before"),
    ({"order": "oldest", "after_cost": 0.5}, "after_cost"),
    ({"after": 3}, "after"),
    ({"after_cost": 0.5}, "after_cost"),
])
def test_record_order_cursors_are_checked(sqlite_env, params, field):
    r = sqlite_env.get("/api/v1/records", params=params)
    assert r.status_code == 422 and r.json()["field"] == field, r.text


def test_record_order_rejects_bad_values(sqlite_env):
    for params in ({"order": "slowest"}, {"order": "fastest", "workload_key": SMALL.key, "after": 1, "after_cost": "nan"},
                   {"order": "fastest", "workload_key": SMALL.key, "after": 1, "after_cost": "inf"},
                   {"order": "fastest", "workload_key": SMALL.key, "after": 1, "after_cost": -1}):
        assert sqlite_env.get("/api/v1/records", params=params).status_code == 422, params


# ---------------------------------------------------------------------------------- loop IR, best of every task

def real_records(store, workload: Workload, target: str, device_key: str = "local", costs=(4e-5, 1e-5, 2e-5)) -> list[int]:
    space = make_space("template", workload.opdef(), target)
    rng = np.random.default_rng(0)
    configs, seen = [], set()
    while len(configs) < len(costs) - 1:
        c = space.sample(rng)
        if c.fingerprint not in seen:
            seen.add(c.fingerprint)
            configs.append(c)
    pairs = [(default_candidate(workload.key), ok(costs[0]))] + [(c, ok(cost)) for c, cost in zip(configs, costs[1:])]
    return store.add_records(Task(workload, target, device_key), pairs + [(cand(77), err())])


def test_record_loop_ir(env):
    target = str(resolve_target(None))
    ids = real_records(env.store, Workload("matmul", {"M": 32, "N": 32, "K": 32}), target)
    for rid in ids[:3]:
        got = env.get(f"/api/v1/records/{rid}/ir").json()
        assert got["record_id"] == rid and got["loop_ir"].startswith("func main(") and got["loop_ir_error"] is None
    (odd,) = env.store.add_records(Task(SMALL, TARGET, "local"), [(cand(5), ok(1e-6))])
    got = env.get(f"/api/v1/records/{odd}/ir").json()
    assert got["loop_ir"] is None and got["loop_ir_error"]
    r = env.get("/api/v1/records/987654/ir")
    assert r.status_code == 404 and r.json()["field"] == "record_id"


def test_best_of_every_task(env):
    target = str(resolve_target(None))
    mm = Workload("matmul", {"M": 32, "N": 32, "K": 32})
    ids = real_records(env.store, mm, target)                                  # default 4e-5, best 1e-5
    real_records(env.store, mm, target, device_key="rpi4", costs=(8e-5, 2e-5))
    env.store.add_records(Task(SMALL, "llvm -mcpu=other", "local"), [(cand(1), err())])   # no valid record
    env.post("/api/v1/jobs", json=MATMUL_JOB)         # a queued job's task: no records at all (the same task as mm's)

    page = env.get("/api/v1/best/all").json()
    rows = page["items"]
    assert page["next_after"] is None and [r["task_id"] for r in rows] == sorted(r["task_id"] for r in rows) and len(rows) == 3
    best = next(r for r in rows if r["device_key"] == "local" and r["target"] == target)
    flops = 2 * 32**3
    assert best["record_id"] == ids[1] and best["kind"] == "config" and best["workload"]["key"] == mm.key
    assert best["cost"] == pytest.approx(1.05e-5) and best["gflops"] == pytest.approx(flops / 1.05e-5 / 1e9)
    assert best["baseline_record_id"] == ids[0] and best["speedup"] == pytest.approx(4.0) and best["flops"] == flops
    rpi = next(r for r in rows if r["device_key"] == "rpi4")
    assert rpi["speedup"] == pytest.approx(4.0) and rpi["record_id"] != best["record_id"]
    none = next(r for r in rows if r["target"] == "llvm -mcpu=other")
    assert none["record_id"] is None and none["gflops"] is None and none["speedup"] is None

    one = env.get("/api/v1/best/all", params={"limit": 1}).json()
    two = env.get("/api/v1/best/all", params={"limit": 1, "after": one["next_after"]}).json()
    assert one["next_after"] == rows[0]["task_id"] and two["items"][0]["task_id"] == rows[1]["task_id"]
    only = env.get("/api/v1/best/all", params={"target": "llvm -mcpu=other"}).json()["items"]
    assert [r["target"] for r in only] == ["llvm -mcpu=other"]
    assert env.get("/api/v1/best/all", params={"limit": 501}).status_code == 422


def test_best_of_every_task_ranks_as_best_does(env):
    """A re-measured record outranks the tuning-time means (the end-of-run re-timing is what
    apply-best trusts): /best/all names the same record as /best."""
    target = str(resolve_target(None))
    mm = Workload("matmul", {"M": 32, "N": 32, "K": 32})
    ids = real_records(env.store, mm, target)                          # means: default 4e-5, 1e-5, 2e-5
    task = Task(mm, target, "local")
    third = env.store.get_record(ids[2])
    env.store.set_retimed(task, {third.candidate.fingerprint: 1.5e-5})  # re-timed: the one to use
    best = env.get("/api/v1/best", params={"workload_key": mm.key, "target": target}).json()
    row = env.get("/api/v1/best/all").json()["items"][0]
    assert best["record"]["id"] == row["record_id"] == ids[2] and row["cost"] == pytest.approx(1.5e-5)


def test_best_of_every_task_ranks_a_slow_window_record_last_as_best_does(env):
    """A record timed in a window its calibration found slow ranks after every unmarked one, however
    fast it read, on /best/all as on /best; a task with nothing else names it."""
    target = str(resolve_target(None))
    mm = Workload("matmul", {"M": 32, "N": 32, "K": 32})
    ids = real_records(env.store, mm, target)                          # means: default 4e-5, 1e-5, 2e-5
    env.store.add_records(Task(mm, target, "local"), [(cand(7), MeasureResult(costs=[2e-6], slow_window=True, slow_index=0.4))])
    marked_only = env.store.add_records(Task(SMALL, target, "local"),
                                        [(cand(8), MeasureResult(costs=[3e-6], slow_window=True, slow_index=0.5))])
    rows = {r["workload"]["key"]: r for r in env.get("/api/v1/best/all").json()["items"]}
    for key, want in ((mm.key, ids[1]), (SMALL.key, marked_only[0])):
        best = env.get("/api/v1/best", params={"workload_key": key, "target": target}).json()["record"]
        assert rows[key]["record_id"] == best["id"] == want


def test_openapi_has_the_dashboard_reads(sqlite_env):
    paths = sqlite_env.client.get("/openapi.json").json()["paths"]
    for path in ("/api/v1/jobs/{job_id}/measurements", "/api/v1/records/{record_id}/ir", "/api/v1/best/all"):
        assert path in paths, path
    params = {p["name"] for p in paths["/api/v1/records"]["get"]["parameters"]}
    assert {"order", "after", "after_cost", "before"} <= params
    assert "/" not in paths                                     # the dashboard's page is not an API operation


# ---------------------------------------------------------------------------------- bounded: query plans

def test_dashboard_reads_search_records_by_index(tmp_path):
    """Every statement of the dashboard's reads, explained by SQLite: records are searched through an
    index (SEARCH ... USING INDEX / PRIMARY KEY), never scanned; the best-of and fastest-first reads
    walk the (task_id, mean_cost) index."""
    store, app, tokens = make_env(f"sqlite:///{tmp_path / 'plans.db'}")
    with store, TestClient(app) as client:
        headers = {"Authorization": f"Bearer {tokens['submit']}"}
        job = client.post("/api/v1/jobs", json=MATMUL_JOB, headers=headers).json()
        store.add_records(job_task(job), [(cand(i), ok(1e-3 + i * 1e-6) if i % 4 else err()) for i in range(200)], job_id=job["id"])
        store.add_records(Task(SMALL, TARGET, "local"), [(cand(i), ok(1e-3)) for i in range(200)])
        engine = app.state.store.db.engine

        def plans(url: str, params: dict) -> list[str]:
            statements = []

            def capture(conn, cursor, statement, parameters, context, executemany):
                if " records" in statement and statement.lstrip().upper().startswith("SELECT"):
                    statements.append((statement, parameters))

            event.listen(engine, "before_cursor_execute", capture)
            try:
                assert client.get(url, params=params, headers=headers).status_code == 200, url
            finally:
                event.remove(engine, "before_cursor_execute", capture)
            assert statements, url
            with engine.connect() as conn:
                return [" | ".join(row[-1] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + st, ps)) for st, ps in statements]

        for url, params, index in [(f"/api/v1/jobs/{job['id']}/measurements", {"after": 5}, None), ("/api/v1/jobs", {}, None),
                                   ("/api/v1/records", {"order": "fastest", "workload_key": SMALL.key, "after": 3, "after_cost": 1e-3},
                                    "ix_records_task_id_mean_cost"),
                                   ("/api/v1/records", {"order": "oldest", "after": 10}, None),
                                   ("/api/v1/best/all", {}, "ix_records_task_id_mean_cost"),
                                   ("/api/v1/best/all", {}, "ix_records_task_id_retimed_cost")]:
            explained = plans(url, params)
            for plan in explained:
                assert not re.search(r"(^|\| )SCAN records\b", plan), (url, plan)
            if index:
                assert any(index in plan for plan in explained), (url, explained)
