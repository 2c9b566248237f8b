"""The job queue in SQL (tuner/records/jobs.py) on SQLite and PostgreSQL: submit, claim with
leases, progress, cancel, resume, reclaim after a worker died, listing with keyset pages, events,
and claims racing from many threads (each job claimed exactly once)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import sqlalchemy as sa

from tuner.records import JobState, SQLRecordsStore, StoreError
from tuner.records.jobs import JobStateError, LeaseLost, UnknownJob
from tuner.records.models import JobRow, TaskRow
from tuner.workload import Task, Workload

TARGET = "llvm -mtriple=x86_64-linux-gnu -mcpu=znver3 -num-cores=2"


def task(m: int, device_key: str = "local") -> Task:
    return Task(Workload("matmul", {"M": m, "N": 16, "K": 16}), TARGET, device_key)


def submit(store, *tasks, trials=10, priority=0, name=None, device_key="local") -> int:
    tasks = tasks or (task(16, device_key),)
    return store.jobs.submit([(t, 1.0 + i, 1e6) for i, t in enumerate(tasks)], {"trials": trials}, space="sketch",
                             strategy="random", scheduler="gradient", trials=trials, priority=priority, name=name)


@pytest.fixture
def store(db_url):
    with SQLRecordsStore(db_url) as s:
        yield s


def expire_lease(store, job_id: int) -> None:
    """As if the lease ran out (its worker died a minute ago)."""
    with store.db.session(write=True) as s:
        row = s.get(JobRow, job_id)
        row.lease_expires_at = row.lease_expires_at - timedelta(minutes=10)


def test_submit_and_show(store):
    jid = submit(store, task(16), task(32), trials=40, name="two matmuls")
    job = store.jobs.get(jid)
    assert (job.state, job.trials, job.trials_done, job.attempts, job.name) == (JobState.QUEUED, 40, 0, 0, "two matmuls")
    assert (job.target, job.device_key, job.space, job.strategy, job.scheduler) == (TARGET, "local", "sketch",
                                                                                     "random", "gradient")
    assert [jt.task for jt in job.tasks] == [task(16), task(32)]
    assert [jt.weight for jt in job.tasks] == [1.0, 2.0]
    assert job.spec == {"trials": 40}
    assert [e.kind for e in store.jobs.events(jid)] == ["submitted"]
    with pytest.raises(UnknownJob, match="no job 999"):
        store.jobs.get(999)
    with pytest.raises(StoreError, match="share a target"):
        store.jobs.submit([(task(16), 1, None), (task(32, "arm"), 1, None)], {}, space="sketch", strategy="random",
                          scheduler="gradient", trials=1)


def test_claim_order_lease_progress_and_finish(store):
    low, high, other_key = submit(store, priority=0), submit(store, priority=5), submit(store, device_key="rpi4")
    first = store.jobs.claim("w1", 30, ["local"])
    assert first.id == high and first.state == JobState.RUNNING and first.lease_owner == "w1" and first.attempts == 1
    assert first.started_at is not None and first.lease_expires_at > first.started_at
    second = store.jobs.claim("w2", 30, ["local"])
    assert second.id == low
    assert store.jobs.claim("w3", 30, ["local"]) is None              # the rpi4 job waits for a farm worker
    assert store.jobs.claim("w3", 30).id == other_key                 # any key
    assert store.jobs.renew_lease(high, "w1", 30) == JobState.RUNNING
    with pytest.raises(LeaseLost):
        store.jobs.renew_lease(high, "w2", 30)
    assert store.jobs.record_progress(high, "w1", 0, trials=8, batches=1, best_cost=1e-3, best_record_id=None,
                                      baseline_cost=2e-3, trials_done=8, lease_seconds=30, errors=2,
                                      event=("best", "best 1 GFLOPS", {"cost": 1e-3})) == JobState.RUNNING
    job = store.jobs.get(high)
    assert job.trials_done == 8 and job.tasks[0].trials == 8 and job.tasks[0].speedup == pytest.approx(2.0)
    assert job.tasks[0].errors == 2
    assert job.tasks[0].best_gflops == pytest.approx(1e6 / 1e-3 / 1e9)
    assert store.jobs.finish(high, "w1", "done") is True
    assert store.jobs.finish(high, "w1", "done") is False             # not running any more
    done = store.jobs.get(high)
    assert done.state == JobState.DONE and done.finished_at is not None and done.lease_owner is None
    assert [e.kind for e in store.jobs.events(high)] == ["submitted", "claimed", "best", "done"]
    assert store.jobs.events(high)[2].data == {"cost": 1e-3}
    with pytest.raises(StoreError, match="done, failed or cancelled"):
        store.jobs.finish(low, "w2", "queued")


def test_cancel_is_seen_by_the_worker_and_resume_continues(store):
    jid = submit(store)
    store.jobs.claim("w1", 30)
    cancelled = store.jobs.cancel(jid)
    assert cancelled.state == JobState.CANCELLED and cancelled.lease_owner is None
    assert store.jobs.renew_lease(jid, "w1", 30) == JobState.CANCELLED      # the worker learns it …
    assert store.jobs.record_progress(jid, "w1", 0, trials=1, batches=1, best_cost=1e-3, best_record_id=None,
                                      baseline_cost=None, trials_done=1, lease_seconds=30,
                                      event=("best", "a batch that ended after the cancel", None)) == JobState.CANCELLED
    assert store.jobs.get(jid).trials_done == 0                        # … and writes nothing, no event either
    assert store.jobs.finish(jid, "w1", "done") is False
    with pytest.raises(JobStateError, match="is cancelled: cannot go to cancelled") as e:
        store.jobs.cancel(jid)
    assert e.value.current == JobState.CANCELLED
    assert store.jobs.resume(jid).state == JobState.QUEUED
    again = store.jobs.claim("w2", 30)
    assert again.id == jid and again.attempts == 2
    store.jobs.finish(jid, "w2", "done")
    with pytest.raises(JobStateError, match="is done: cannot go to queued; allowed: none"):
        store.jobs.resume(jid)
    with pytest.raises(JobStateError, match="is done"):
        store.jobs.cancel(jid)
    kinds = [e.kind for e in store.jobs.events(jid)]
    assert kinds == ["submitted", "claimed", "cancelled", "resumed", "claimed", "done"]
    first_two = store.jobs.events(jid, limit=2)
    assert [e.kind for e in store.jobs.events(jid, after_id=first_two[-1].id)] == kinds[2:]


def test_expired_lease_is_reclaimed_and_the_old_worker_is_told(store):
    jid = submit(store)
    store.jobs.claim("dead-worker", 30)
    assert store.jobs.claim("w2", 30) is None          # lease still valid
    expire_lease(store, jid)
    job = store.jobs.claim("w2", 30)
    assert job.id == jid and job.lease_owner == "w2" and job.attempts == 2 and job.state == JobState.RUNNING
    with pytest.raises(LeaseLost, match="held by w2"):
        store.jobs.record_progress(jid, "dead-worker", 0, trials=1, batches=1, best_cost=None, best_record_id=None,
                                   baseline_cost=None, trials_done=1, lease_seconds=30)
    assert store.jobs.finish(jid, "dead-worker", "failed", error="late") is False
    events = store.jobs.events(jid)
    assert events[-1].kind == "reclaimed" and events[-1].data == {"worker": "w2", "previous": "dead-worker"}


def test_release_lease_hands_the_job_over_at_once(store):
    jid = submit(store)
    store.jobs.claim("w1", 300)
    assert store.jobs.release_lease(jid, "w1", "shutting down") is True
    time.sleep(0.01)
    assert store.jobs.claim("w2", 30).id == jid


def test_listing_newest_first_with_keyset_pages_and_filters(store):
    ids = [submit(store, task(16 + (i % 3))) for i in range(25)]
    other = store.jobs.submit([(Task(Workload("relu", {"shape": [64]}), TARGET, "local"), 1, None)], {},
                              space="sketch", strategy="random", scheduler="gradient", trials=1)
    page1 = store.jobs.page(limit=10)
    assert [j.id for j in page1] == [other] + ids[::-1][:9]
    page2 = store.jobs.page(limit=10, before_id=page1[-1].id)
    assert [j.id for j in page2] == ids[::-1][9:19]
    assert [j.id for j in store.jobs.page(workload="relu")] == [other]
    key16 = task(16).workload.key
    assert [j.id for j in store.jobs.page(workload=key16)] == ids[::3][::-1]
    store.jobs.claim("w", 30)
    assert [j.state for j in store.jobs.page(state="running")] == [JobState.RUNNING]
    assert store.jobs.count_by_state() == {"queued": 25, "running": 1, "done": 0, "failed": 0, "cancelled": 0}
    assert store.jobs.page(target="llvm -mcpu=other") == []
    with pytest.raises(StoreError, match="unknown job state"):
        store.jobs.page(state="paused")
    with pytest.raises(StoreError, match="page size"):
        store.jobs.page(limit=501)


def test_set_job_state_checks_transitions(store):
    jid = submit(store)
    with pytest.raises(JobStateError, match="queued: cannot go to done"):
        store.jobs.set_state(jid, "done")
    with pytest.raises(StoreError, match="unknown job state"):
        store.jobs.set_state(jid, "paused")
    store.jobs.claim("w", 30)
    assert store.jobs.set_state(jid, "failed", error="tracker lost").error == "tracker lost"
    with pytest.raises(UnknownJob):
        store.jobs.set_state(12345, "running")


def test_concurrent_claims_take_each_job_exactly_once(db_url):
    """8 threads with their own store objects (as 8 worker processes would) claim 40 jobs."""
    with SQLRecordsStore(db_url) as s:
        jobs = {submit(s, task(16)) for _ in range(40)}
    claimed: list[int] = []
    errors: list[BaseException] = []

    def worker(n: int):
        try:
            with SQLRecordsStore(db_url) as s:
                while (job := s.jobs.claim(f"w{n}", 60)) is not None:
                    claimed.append(job.id)
                    assert s.jobs.finish(job.id, f"w{n}", "done")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(claimed) == sorted(jobs)                   # each once, none lost
    with SQLRecordsStore(db_url) as s:
        assert s.jobs.count_by_state()["done"] == 40
        assert all(j.attempts == 1 for j in s.jobs.page(limit=50))


def test_claim_is_one_statement_with_skip_locked_on_postgresql(pg_database):
    """The claim's SQL on PostgreSQL: one UPDATE … FROM (SELECT … FOR UPDATE SKIP LOCKED)."""
    from conftest import pg_schema_url
    url = pg_schema_url(pg_database)
    statements: list[str] = []
    with SQLRecordsStore(url) as s:
        submit(s)
        sa.event.listen(s.db.engine, "before_cursor_execute",
                        lambda conn, cursor, stmt, *a: statements.append(stmt))
        assert s.jobs.claim("w", 30) is not None
    updates = [st for st in statements if st.lstrip().upper().startswith("UPDATE JOBS")]
    assert len(updates) == 1 and "FOR UPDATE SKIP LOCKED" in updates[0] and "RETURNING" in updates[0]
    assert not any(st.lstrip().upper().startswith("SELECT") and "FROM jobs" in st and "FOR UPDATE" not in st
                   and "job_tasks" not in st and statements.index(st) < statements.index(updates[0])
                   for st in statements)


def test_the_queue_is_a_store_of_its_own_on_the_records_database(db_url):
    """Records, jobs and tokens are three stores on one database: a queue opened on the database
    alone sees the jobs submitted through a records store's `jobs`, over the same task rows."""
    from tuner.records.database import Database
    from tuner.records.jobs import JobQueue
    with SQLRecordsStore(db_url) as store:
        jid = submit(store, task(48))
        store.ensure_task(task(48))             # the job's task row, not a second one
        with store.db.session() as s:
            assert s.execute(sa.select(sa.func.count()).select_from(TaskRow)).scalar_one() == 1
        db = Database(db_url)
        try:
            assert [jt.task for jt in JobQueue(db).get(jid).tasks] == [task(48)]
            assert JobQueue(db).claim("w1", 30.0).id == jid
            assert store.jobs.get(jid).state == JobState.RUNNING
        finally:
            db.close()
