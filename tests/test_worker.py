"""Job workers running real tuning jobs: to done, cancelled at the next batch, failed with the
reason, and resumed after their worker was SIGKILLed, with no candidate measured twice and the
job's budget kept across attempts. SQLite and PostgreSQL; real worker processes where a worker
must die."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from compiler.target import Target
from tuner.records import JobState, SQLRecordsStore
from tuner.records.values import utcnow
from tuner.service.spec import JobSpec, resolve
from tuner.service.worker import JobWorker
from tuner.workload import Task

MATMUL = {"op": "matmul", "params": {"M": 32, "N": 32, "K": 32}}


def submit(store, trials=8, batch_size=4, workloads=(MATMUL,), **kw) -> int:
    spec = JobSpec(workloads=list(workloads), trials=trials, batch_size=batch_size, space="template",
                   strategy="random", top_k=2, measure={"number": 1, "repeat": 1, "min_repeat_ms": 0}, **kw)
    job = resolve(spec)
    return store.jobs.submit(job.store_rows(), spec.model_dump(mode="json"), space=spec.space, strategy=job.strategy,
                             scheduler=spec.scheduler, trials=spec.trials, priority=spec.priority, name=spec.name)


def submit_unresolved(store, target: str) -> int:
    """A 'local' job for `target` stored past resolve(), which refuses a target this host cannot run: what a
    server on another machine than the worker's could queue. The worker's own check must still catch it."""
    spec = JobSpec(workloads=[MATMUL], trials=8, batch_size=4, space="template", strategy="random", top_k=2,
                   measure={"number": 1, "repeat": 1, "min_repeat_ms": 0}, target=target)
    job = resolve(spec.model_copy(update={"target": None}))
    rows = [(Task.create(t.workload, target, t.device_key), w, f) for t, w, f in job.store_rows()]
    return store.jobs.submit(rows, spec.model_dump(mode="json"), space=spec.space, strategy=job.strategy,
                             scheduler=spec.scheduler, trials=spec.trials, priority=spec.priority, name=spec.name)


def child_pids(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def job_records(store, job_id):
    return [r for r in store.history() if r.job_id == job_id]


@pytest.fixture
def store(db_url):
    with SQLRecordsStore(db_url) as s:
        yield s


def wait_for(cond, timeout=60.0, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return False


def test_worker_runs_a_two_task_job_to_done(store):
    relu = {"op": "conv2d_nchw", "params": {"N": 1, "C": 4, "H": 8, "W": 8, "F": 8, "KH": 3, "KW": 3}, "weight": 2}
    jid = submit(store, trials=12, workloads=(MATMUL, relu))
    with JobWorker(store, name="w1", build_workers=1) as worker:
        assert worker.run_once() == jid
        job = store.jobs.get(jid)
    assert job.state == JobState.DONE, job.error
    assert job.trials_done == 12 and job.finished_at is not None and job.lease_owner is None
    recs = job_records(store, jid)
    search = [r for r in recs if r.candidate.kind != "default"]
    assert len(search) == 12 and len(recs) == 14                       # + one baseline per task
    assert sum(jt.trials for jt in job.tasks) == 12
    assert sum(jt.errors for jt in job.tasks) == len([r for r in recs if not r.result.ok])
    for jt in job.tasks:
        assert jt.best_cost is not None and jt.baseline_cost is not None and jt.speedup > 0
        assert jt.best_gflops > 0 and jt.batches >= 1
    events = store.jobs.events(jid)
    kinds = [e.kind for e in events]
    assert kinds[:2] == ["submitted", "claimed"] and kinds[-1] == "done" and kinds.count("baseline") == 2
    baseline = {e.data["position"]: e.data["cost"] for e in events if e.kind == "baseline"}
    assert all(e.data["cost"] < baseline[e.data["position"]] for e in events if e.kind == "best")   # beat the default
    times = {e.data["position"]: e.data for e in events if e.kind == "time"}   # where each task's time went
    assert sorted(times) == [0, 1]
    for t in times.values():
        phases = t["phase_seconds"]
        assert {"setup", "baseline", "build", "measure", "search"} <= set(phases) and all(v >= 0 for v in phases.values())
        assert sum(phases.values()) <= t["tune_seconds"] * 1.01 + 0.01
    with JobWorker(store, name="w1") as idle:
        assert idle.run_once() is None                                 # nothing else queued


def test_cancel_is_seen_at_the_next_batch(store):
    jid = submit(store, trials=400, batch_size=2)
    with JobWorker(store, name="w1", build_workers=1) as worker:
        t = threading.Thread(target=worker.run_once)
        t.start()
        assert wait_for(lambda: store.jobs.get(jid).trials_done >= 2)
        store.jobs.cancel(jid)
        at_cancel = len(job_records(store, jid))
        t.join(timeout=60)
        assert not t.is_alive()
    job = store.jobs.get(jid)
    assert job.state == JobState.CANCELLED and job.trials_done < 400
    assert len(job_records(store, jid)) <= at_cancel + 2                 # at most the batch in flight
    assert [e.kind for e in store.jobs.events(jid)][-1] == "cancelled"
    # resumed: the job continues where it stopped and keeps its budget of 400 over both attempts
    store.jobs.resume(jid)
    assert store.jobs.get(jid).state == JobState.QUEUED


def test_a_job_that_cannot_run_here_fails_with_the_reason_and_the_worker_goes_on(store):
    bad = submit_unresolved(store, "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1")
    good = submit(store, trials=4)
    with JobWorker(store, name="w1", build_workers=1) as worker:
        assert worker.run_once() == bad
        job = store.jobs.get(bad)
        assert job.state == JobState.FAILED and "aarch64" in job.error and job_records(store, bad) == []
        assert worker.run_once() == good and store.jobs.get(good).state == JobState.DONE


def test_farm_job_without_a_tracker_fails_clearly(store):
    jid = submit(store, device_key="rpi4", target=str(Target.host()))
    with JobWorker(store, name="w1") as local, JobWorker(store, name="w2", device_keys=["rpi4"]) as farm:
        assert local.run_once() is None               # a local worker does not take it
        assert farm.run_once() == jid
    job = store.jobs.get(jid)
    assert job.state == JobState.FAILED and "no tracker" in job.error


@pytest.mark.slow
def test_killed_worker_job_is_reclaimed_and_finishes_without_duplicates(db_url):
    """SIGKILL a real `tunefarm worker` process mid-job; after its lease expires another worker
    resumes the job from its records: every candidate measured once, the budget kept."""
    with SQLRecordsStore(db_url) as store:
        jid = submit(store, trials=24, batch_size=2)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "tuner.cli", "worker", "--db", db_url, "--name", "doomed",
                             "--lease", "3", "--once"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        with SQLRecordsStore(db_url) as store:
            assert wait_for(lambda: store.jobs.get(jid).trials_done >= 4 or proc.poll() is not None, timeout=120)
            assert proc.poll() is None, proc.stderr.read().decode()
            children = child_pids(proc.pid)          # its build processes and measuring worker
            assert len(children) >= 2
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            assert wait_for(lambda: not any(os.path.exists(f"/proc/{c}") for c in children), timeout=10), \
                "the killed worker's build processes or measuring worker outlived it"
            before = store.jobs.get(jid)
            assert before.state == JobState.RUNNING and before.lease_owner == "doomed"
            assert wait_for(lambda: store.jobs.get(jid).lease_expires_at < utcnow(), timeout=10)
            with JobWorker(store, name="rescuer", lease_seconds=10, build_workers=1) as rescuer:
                assert rescuer.run_once() == jid
            job = store.jobs.get(jid)
            assert job.state == JobState.DONE and job.attempts == 2, job.error
            recs = job_records(store, jid)
            fps = [r.candidate.fingerprint for r in recs]
            assert len(fps) == len(set(fps))                                       # nothing measured twice
            assert len([r for r in recs if r.candidate.kind != "default"]) == 24    # budget over both attempts
            assert job.trials_done == 24
            kinds = [e.kind for e in store.jobs.events(jid)]
            assert kinds.count("claimed") == 1 and "reclaimed" in kinds and kinds[-1] == "done"
    finally:
        if proc.poll() is None:
            proc.kill()
