"""The records store, on both back-ends it supports.

Every behaviour runs against a SQLite file and against PostgreSQL (127.0.0.1:5432, user postgres):
the module creates its own uniquely named PostgreSQL database and drops it at the end, and each test
gets a fresh schema in it (via search_path), so tests start from an empty database. PostgreSQL tests
are skipped, with the reason, only when the server cannot be reached.
"""

from __future__ import annotations

import io
import json
import socket
import threading
import time

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from conftest import pg_schema_url

from tuner.candidate import Candidate, ErrorCode, MeasureResult
from tuner.records import SQLRecordsStore, StoreError, codec, open_store
from tuner.records import engine as engine_mod
from tuner.records.jobs import POLLED_JOB_BY_ID, UnknownJob
from tuner.records.models import VERSION_TABLE, Base, RecordRow
from tuner.records.retakes import RETAKEN_ROWS
from tuner.workload import Task, Workload

psycopg = pytest.importorskip("psycopg")

TABLES = {"workloads", "tasks", "jobs", "job_tasks", "job_events", "api_tokens", "records", "agents", "calibrations", VERSION_TABLE}
TARGET = "llvm -mtriple=x86_64-linux-gnu -mcpu=znver3 -num-cores=2"
MATMUL = Workload("matmul", {"M": 16, "N": 16, "K": 16})
TASK = Task(MATMUL, TARGET, "local")


def cand(i: int, kind: str = "config") -> Candidate:
    return Candidate(kind, {"template": "matmul", "knobs": {"tile": i}})


def ok(cost: float, by: str = "agent-1") -> MeasureResult:
    return MeasureResult(costs=[cost, cost * 1.1], build_seconds=0.5, run_seconds=0.25, measured_by=by)


def err(code=ErrorCode.WRONG_ANSWER, costs=()) -> MeasureResult:
    return MeasureResult(costs=list(costs), error_code=code, error_msg=f"{code.name} here", measured_by="agent-2")


# ---------------------------------------------------------------------------------- fixtures

@pytest.fixture
def store(db_url):
    with SQLRecordsStore(db_url) as s:
        yield s


def table_names(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


# ---------------------------------------------------------------------------------- schema

def test_migration_creates_schema_and_is_idempotent(empty_db_url):
    db_url = empty_db_url
    assert table_names(db_url) == set()
    with SQLRecordsStore(db_url, upgrade=True) as s:
        s.add_records(TASK, [(cand(1), ok(1e-3))])
    assert TABLES <= table_names(db_url)
    with SQLRecordsStore(db_url, upgrade=True) as s:          # reopen: upgrade to head is a no-op
        assert s.count() == 1
    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        assert conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all() == ["0011"]
    engine.dispose()


def test_postgresql_is_never_migrated_implicitly(pg_database):
    """Servers and workers refuse a PostgreSQL schema that is behind, naming the command that
    upgrades it; SQLite (the embedded default) upgrades itself."""
    url = pg_schema_url(pg_database, upgraded=False)
    with pytest.raises(StoreError, match=r"no tunefarm schema yet; run `tunefarm db upgrade --db"):
        open_store(url)
    assert table_names(url) == set()
    open_store(url, upgrade=True).close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:                  # as if written by the previous tunefarm
        conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = '0002'"))
    with pytest.raises(StoreError, match=r"at schema 0002, this tunefarm needs 0011; run `tunefarm db upgrade"):
        open_store(url)
    with engine.begin() as conn:                  # written by a newer tunefarm
        conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = '0999'"))
    with pytest.raises(StoreError, match="newer than this tunefarm"):
        open_store(url)
    engine.dispose()


def at_revision(url: str, revision: str, *statements: str) -> None:
    """An empty database brought to schema `revision`, as an older tunefarm left it: workload
    'k1' (a matmul), then `statements` (SQL) run."""
    from alembic import command

    from tuner.records.engine import _alembic_config
    engine = sa.create_engine(url)
    cfg = _alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
        conn.execute(sa.text("INSERT INTO workloads (key, name, params, created_at) VALUES "
                             "('k1', 'matmul', '{\"M\": 16}', CURRENT_TIMESTAMP)"))
        for statement in statements:
            conn.execute(sa.text(statement))
    engine.dispose()


def test_upgrade_from_0002_keeps_jobs_and_records(empty_db_url):
    """A database written by the previous release (schema 0002, one task per job) upgrades in
    place: its jobs keep their task (now job_tasks position 0) and their records."""
    at_revision(empty_db_url, "0002",
                "INSERT INTO tasks (id, workload_key, target, device_key) VALUES (7, 'k1', 'llvm', 'local')",
                "INSERT INTO jobs (id, task_id, state, space, strategy, trials, created_at, updated_at) "
                "VALUES (3, 7, 'done', 'sketch', 'model', 64, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)")
    with SQLRecordsStore(empty_db_url, upgrade=True) as s:
        job = s.jobs.get(3)
        assert (job.state, job.trials, len(job.tasks), job.tasks[0].workload_key, job.target) == ("done", 64, 1, "k1", "")
        assert job.tasks[0].task.target == "llvm"


def test_hand_written_migration_matches_models(db_url):
    SQLRecordsStore(db_url).close()
    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diffs = [d for d in compare_metadata(ctx, Base.metadata)
                 if not (d[0] == "remove_table" and d[1].name == VERSION_TABLE)]
    engine.dispose()
    assert diffs == []


# ---------------------------------------------------------------------------------- records

def test_records_round_trip_every_field(store):
    ids = store.add_records(TASK, [(cand(1), ok(2e-3)), (cand(2, "trace"), err(ErrorCode.RUNTIME_ERROR))])
    assert len(ids) == 2
    rec_ok, rec_err = store.history()
    assert rec_ok.id == ids[0] and rec_ok.workload_key == MATMUL.key and rec_ok.workload == MATMUL
    assert (rec_ok.target, rec_ok.device_key, rec_ok.task) == (TARGET, "local", TASK)
    assert rec_ok.candidate == cand(1)
    r = rec_ok.result
    assert (r.costs, r.error_code, r.build_seconds, r.run_seconds, r.measured_by) == ([2e-3, 2.2e-3], 0, 0.5, 0.25, "agent-1")
    assert rec_ok.created_at.tzinfo is not None and abs(time.time() - rec_ok.created_at.timestamp()) < 60
    assert rec_ok.gflops(2e6) == pytest.approx(2e6 / r.mean_cost / 1e9)
    assert rec_err.candidate.kind == "trace"
    assert (rec_err.result.error_code, rec_err.result.error_msg, rec_err.result.costs) == (
        ErrorCode.RUNTIME_ERROR, "RUNTIME_ERROR here", [])
    assert rec_err.gflops(2e6) == 0.0


def test_no_candidate_stored_twice(store):
    first = store.add_records(TASK, [(cand(1), ok(1e-3)), (cand(2), ok(2e-3))])
    again = store.add_records(TASK, [(cand(2), ok(9e-3)), (cand(3), ok(3e-3)), (cand(3), ok(4e-3))])
    assert len(first) == 2 and len(again) == 1 and set(first).isdisjoint(again)
    assert store.count() == 3 and store.count(TASK) == 3
    assert [r.result.costs[0] for r in store.history()] == [1e-3, 2e-3, 3e-3]   # first measurement kept
    other = Task(MATMUL, TARGET, "arm-board")    # same candidate, other task: a new record
    assert len(store.add_records(other, [(cand(1), ok(5e-3))])) == 1
    assert store.count(other) == 1 and store.count(Task(MATMUL, "llvm -mcpu=none")) == 0


def test_ensure_task_is_idempotent(store):
    a = store.ensure_task(TASK)
    assert store.ensure_task(TASK) == a
    assert store.ensure_task(Task(MATMUL, TARGET, "other")) != a
    assert store.count(TASK) == 0


def test_resume_reloads_measured_fingerprints(db_url):
    with SQLRecordsStore(db_url) as s:
        s.add_records(TASK, [(cand(i), ok(1e-3 * (i + 1)) if i % 3 else err()) for i in range(6)])
    with SQLRecordsStore(db_url) as s:              # a restarted tuning run
        measured = s.measured_fingerprints(TASK)
        assert measured == {cand(i).fingerprint for i in range(6)}
        proposals = [cand(i) for i in range(10)]
        fresh = [c for c in proposals if c.fingerprint not in measured]
        assert fresh == proposals[6:]
        s.add_records(TASK, [(c, ok(1e-3)) for c in fresh])
        assert s.count(TASK) == 10
        assert s.measured_fingerprints(Task(MATMUL, TARGET, "elsewhere")) == set()


def test_add_records_is_one_transaction(store):
    store.add_records(TASK, [(cand(0), ok(1e-3))])
    with pytest.raises(StoreError):                 # job 999 does not exist: the batch must not half-land
        store.add_records(TASK, [(cand(1), ok(1e-3)), (cand(2), ok(1e-3))], job_id=999)
    assert store.count() == 1


def test_best_k_ignores_error_records(store):
    other_target = Task(MATMUL, "llvm -mcpu=cortex-a72", "pi")
    store.add_records(TASK, [(cand(1), ok(3e-3)), (cand(2), err(costs=[1e-9])), (cand(3), ok(1e-3)),
                             (cand(4), err(ErrorCode.RUN_TIMEOUT)), (cand(5), ok(2e-3))])
    store.add_records(Task(MATMUL, TARGET, "second-box"), [(cand(6), ok(1.5e-3))])
    store.add_records(other_target, [(cand(7), ok(1e-6))])
    best = store.best(MATMUL.key, TARGET, k=3)
    assert [r.candidate for r in best] == [cand(3), cand(6), cand(5)]
    assert all(r.result.ok for r in best)
    assert store.best(MATMUL.key, TARGET)[0].candidate == cand(3)
    assert len(store.best(MATMUL.key, TARGET, k=100)) == 4
    assert store.best(MATMUL.key, "llvm -mcpu=unknown") == [] and store.best("0" * 32, TARGET) == []


def test_history_for_the_cost_model(store):
    relu = Task(Workload("relu", {"shape": (64,)}), TARGET)
    store.add_records(TASK, [(cand(i), ok(1e-3) if i % 2 else err()) for i in range(6)])
    store.add_records(relu, [(cand(100), ok(1e-4))])
    store.add_records(Task(MATMUL, "llvm -mcpu=x"), [(cand(200), ok(1e-4))])
    everything = store.history()
    assert len(everything) == 8 and [r.id for r in everything] == sorted(r.id for r in everything)
    assert sum(not r.result.ok for r in everything) == 3
    assert len(store.history(target=TARGET)) == 7
    assert len(store.history(workload_key=MATMUL.key)) == 7
    assert len(store.history(target=TARGET, workload_key=MATMUL.key)) == 6
    last = store.history(target=TARGET, limit=2)
    assert [r.candidate for r in last] == [cand(5), cand(100)]


# ---------------------------------------------------------------------------------- JSON lines

def fill(store):
    timed = ok(1e-3).take_timing({"median": 1.05e-3, "min": 1e-3, "spread": 0.1, "count": 2, "disturbed": True,
                                  "lost_fraction": 0.05, "host_busy": 0.9})   # the protocol's summary travels too
    store.add_records(TASK, [(cand(1), ok(3e-3)), (cand(2), err()), (cand(3), timed)])
    store.add_records(Task(Workload("relu", {"shape": [64]}), "llvm -mcpu=cortex-a72", "pi"),
                      [(cand(4, "trace"), ok(1e-5, by="pi-7"))])


def export(store, **filters) -> list[str]:
    f = io.StringIO()
    n = store.export_jsonl(f, **filters)
    lines = f.getvalue().splitlines()
    assert n == len(lines)
    return lines


def test_jsonl_round_trip_between_sqlite_and_postgresql(tmp_path, pg_database):
    with SQLRecordsStore(f"sqlite:///{tmp_path / 'a.db'}") as lite, SQLRecordsStore(pg_schema_url(pg_database)) as pg:
        fill(lite)
        lines = export(lite)
        assert len(lines) == 4 and all(json.loads(line)["v"] == 1 for line in lines)
        assert pg.import_jsonl(io.StringIO("\n".join(lines) + "\n")) == 4
        assert export(pg) == lines
        assert pg.import_jsonl(io.StringIO("\n".join(lines))) == 0      # idempotent
        assert pg.count() == 4
        assert [r.candidate for r in pg.best(MATMUL.key, TARGET, k=5)] == [cand(3), cand(1)]
        assert pg.measured_fingerprints(TASK) == lite.measured_fingerprints(TASK)
        with SQLRecordsStore(f"sqlite:///{tmp_path / 'b.db'}") as back:
            assert back.import_jsonl(io.StringIO("\n".join(export(pg)))) == 4
            assert export(back) == lines


RECORD_FIELDS = ("candidate_kind", "candidate", "fingerprint", "costs", "mean_cost", "error_code", "error_msg", "build_seconds",
                 "run_seconds", "measured_by", "emulated", "created_at", "min_cost", "cost_spread", "samples", "disturbed",
                 "lost_fraction", "host_busy", "slow_window", "remeasured", "slow_index")


def _record_columns(store) -> list[tuple]:
    with store.db.session() as s:
        rows = s.execute(sa.select(*(getattr(RecordRow, c) for c in RECORD_FIELDS)).order_by(RecordRow.id)).all()
    return [tuple(row) for row in rows]


def test_an_import_stores_the_columns_a_measured_batch_stores(tmp_path, store):
    """The bulk import builds rows from the lines without Records: every column it fills is what
    add_records stores for the same measurement (the figure, the protocol's summary, an error's
    NULL figure, an emulated timing, a valid result without costs), in the file's order."""
    with SQLRecordsStore(f"sqlite:///{tmp_path / 'source.db'}") as source:
        fill(source)
        emulated = MeasureResult(costs=[2e-3, 2.2e-3], measured_by="board", emulated=True)
        source.add_records(TASK, [(cand(7), emulated), (cand(8), err(costs=[1e-3])),
                                  (cand(9), MeasureResult(costs=[]))])
        lines = export(source)
        expected = _record_columns(source)
    assert store.import_jsonl(io.StringIO("\n".join(lines))) == 7
    assert _record_columns(store) == expected
    assert export(store) == lines


def test_an_export_writes_each_record_as_its_line(store):
    """The export writes rows straight to lines (no Record built): each line is codec.to_line
    of the record, with its keys in json.dumps(sort_keys=True)'s order and spacing."""
    fill(store)
    store.add_records(TASK, [(cand(7), MeasureResult(costs=[2e-3], measured_by="board", emulated=True))])
    lines = export(store)
    assert lines == [codec.to_line(r) for r in store.history()]
    assert lines == [json.dumps(json.loads(line), sort_keys=True) for line in lines]


def test_export_filters(store):
    fill(store)
    assert len(export(store, workload_key=MATMUL.key)) == 3
    assert len(export(store, target="llvm -mcpu=cortex-a72")) == 1
    assert export(store, workload_key=MATMUL.key, target="llvm -mcpu=cortex-a72") == []


@pytest.mark.parametrize("bad, why", [
    ("{not json", "not JSON"),
    ('["a", "list"]', "must be dict"),
    ('{"workload_key": "k"}', "missing field"),
    ("GOOD|target=5", "target must be str"),
    ("GOOD|error_code=99", "99"),
    ("GOOD|costs=oops", "result.costs must be list"),
    ("GOOD|v=3", "unsupported format version"),
])
def test_malformed_import_changes_nothing(store, bad, why):
    fill(store)
    lines = export(store)
    before = store.count()
    if bad.startswith("GOOD|"):
        field, value = bad[5:].split("=")
        d = json.loads(lines[0])
        d["workload_key"] = "f" * 32                 # would be new records if it got in
        if field in ("error_code", "costs"):
            d["result"][field] = int(value) if value.isdigit() else value
        else:
            d[field] = int(value)
        bad = json.dumps(d)
    other = [line.replace(MATMUL.key, "e" * 32) for line in lines]   # valid and new
    text = "\n".join([other[0], "", other[1], bad, other[2]])
    with pytest.raises(StoreError, match=rf"line 4: .*{why}"):
        store.import_jsonl(io.StringIO(text))
    assert store.count() == before and export(store) == lines


def marked(cost: float, slow_window: bool = False, remeasured: bool = False, index: float | None = None) -> MeasureResult:
    """A result of a window a calibration found slow (device_agent/calibration.py): marked, or taken again."""
    return MeasureResult(costs=[cost], median=cost, minimum=cost, spread=0.0, samples=1, measured_by="agent-9",
                         slow_window=slow_window, remeasured=remeasured, slow_index=index)


def test_slow_window_marks_travel_with_the_records(tmp_path, store):
    """A record's slow-window marks are stored, exported only when set (an unmarked line is as
    before), imported back by the bulk import, and a marked figure ranks after unmarked ones."""
    store.add_records(TASK, [(cand(1), marked(1e-3, slow_window=True, index=0.41)),
                             (cand(2), marked(2e-3, remeasured=True, index=0.55)),
                             (cand(3), marked(3e-3)),
                             (cand(4), marked(4e-3, index=0.9))])          # an index without a mark is not kept
    lines = export(store)
    results = [json.loads(line)["result"] for line in lines]
    assert (results[0]["slow_window"], results[0]["slow_index"], "remeasured" in results[0]) == (True, 0.41, False)
    assert (results[1]["remeasured"], results[1]["slow_index"], "slow_window" in results[1]) == (True, 0.55, False)
    assert not {"slow_window", "remeasured", "slow_index"} & (set(results[2]) | set(results[3]))
    assert lines == [codec.to_line(r) for r in store.history()]          # the API's export writes the same
    got = store.history()
    assert (got[0].result.slow_window, got[0].result.slow_index) == (True, 0.41)
    assert (got[1].result.remeasured, got[1].result.slow_index, got[3].result.slow_index) == (True, 0.55, None)
    assert [r.candidate for r in store.best(MATMUL.key, TARGET, k=4)] == [cand(2), cand(3), cand(4), cand(1)]
    with SQLRecordsStore(f"sqlite:///{tmp_path / 'copy.db'}") as copy:
        assert copy.import_jsonl(io.StringIO("\n".join(lines))) == 4
        assert _record_columns(copy) == _record_columns(store) and export(copy) == lines
        assert [r.result.slow_window for r in codec_lines(lines)] == [True, False, False, False]


def codec_lines(lines):
    return [codec.from_line(line, n) for n, line in enumerate(lines, 1)]


@pytest.mark.parametrize("field, value, why", [
    ("slow_window", "yes", "result.slow_window must be bool"),
    ("remeasured", 1, "result.remeasured must be bool"),
    ("slow_index", -0.5, "result.slow_index must be finite and non-negative"),
    ("slow_index", "low", "result.slow_index must be Real"),
])
def test_malformed_slow_window_marks_are_refused(store, field, value, why):
    store.add_records(TASK, [(cand(1), marked(1e-3, slow_window=True, index=0.4))])
    d = json.loads(export(store)[0])
    d["workload_key"] = "f" * 32
    d["result"][field] = value
    with pytest.raises(StoreError, match=rf"line 1: .*{why}"):
        store.import_jsonl(io.StringIO(json.dumps(d)))


def test_a_jobs_retaken_windows_are_read_from_its_marked_records_only(db_url):
    """job_retakes groups a job's marked records by window (task, worker, the calibration's speed
    index), newest first, counts them per task, and reads them through the partial index that
    holds only marked records."""
    other = Task(Workload("relu", {"shape": [64]}), TARGET, "local")
    with SQLRecordsStore(db_url) as s:
        job = s.jobs.submit([(TASK, 1.0, None), (other, 1.0, None)], {}, space="sketch", strategy="random",
                            scheduler="round_robin", trials=8)
        s.add_records(TASK, [(cand(1), marked(1e-3, remeasured=True, index=0.5)),
                             (cand(2), marked(1e-3, remeasured=True, index=0.5)),
                             (cand(3), marked(1e-3))], job_id=job)
        s.add_records(other, [(cand(4), marked(1e-3, slow_window=True, index=0.3))], job_id=job)
        s.add_records(TASK, [(cand(5), marked(1e-3, remeasured=True, index=0.6))])        # no job
        got = s.job_retakes(job)
        assert not got["capped"]
        windows = got["windows"]
        assert [(w["position"], w["kind"], w["count"], w["slow_index"]) for w in windows] == [
            (1, "slow_window", 1, 0.3), (0, "remeasured", 2, 0.5)]
        assert windows[0]["measured_by"] == "agent-9" and windows[1]["first_at"] <= windows[1]["last_at"]
        assert got["tasks"] == {0: {"remeasured": 2, "slow_window": 0}, 1: {"remeasured": 0, "slow_window": 1}}
        assert s.job_retakes(job, limit=1)["windows"] == windows[:1]
        empty = s.jobs.submit([(TASK, 1.0, None)], {}, space="sketch", strategy="random", scheduler="round_robin", trials=1)
        assert s.job_retakes(empty) == {"windows": [], "tasks": {}, "capped": False}
        assert s.job_with_retakes(job) == (s.jobs.get(job), got)        # what a job's page reads, on one connection
        assert s.job_with_retakes(empty) == (s.jobs.get(empty), s.job_retakes(empty))     # the job row said: none
        with pytest.raises(UnknownJob):
            s.job_with_retakes(empty + 1000)
        with s.db.session() as session:             # the plan: only the partial index's entries are read
            postgres = session.bind.dialect.name == "postgresql"
            if postgres:
                session.execute(sa.text("SET LOCAL enable_seqscan = off"))   # a tiny table: make it show its choice
            for read in (RETAKEN_ROWS, POLLED_JOB_BY_ID):      # the marked records, and the job row's "any of them?"
                stmt = read.params(job_id=job).compile(dialect=session.bind.dialect, compile_kwargs={"literal_binds": True})
                plan = " ".join(str(r) for r in session.execute(sa.text(
                    ("EXPLAIN " if postgres else "EXPLAIN QUERY PLAN ") + str(stmt))).all())
                assert "ix_records_job_id_retaken" in plan, plan


def test_best_ranks_slow_window_records_last_and_finds_them_in_their_own_index(db_url):
    """A record timed in a slow window ranks after every unmarked one, however fast it read, and
    is found when nothing else is valid; its statement reads the partial index of marked records
    (without it, every GET /best read the task's whole cost range to find none)."""
    def tiles(records):
        return [r.candidate.payload["knobs"]["tile"] for r in records]
    with SQLRecordsStore(db_url) as s:
        s.add_records(TASK, [(cand(1), marked(1e-4, slow_window=True, index=0.5)),
                             (cand(2), marked(3e-3)), (cand(3), marked(2e-3)),
                             (cand(4), MeasureResult(costs=[], error_code=4, error_msg="RUNTIME_ERROR"))])
        only_marked = Task(Workload("relu", {"shape": [96]}), TARGET, "local")
        s.add_records(only_marked, [(cand(5), marked(1e-3, slow_window=True, index=0.4))])
        assert tiles(s.best(only_marked.workload.key, TARGET)) == [5]
        statements = []

        def capture(conn, cursor, statement, parameters, context, executemany):
            if "slow_window" in statement and "UNION ALL" in statement:
                statements.append((statement, parameters))
        sa.event.listen(s.db.engine, "before_cursor_execute", capture)
        try:
            assert tiles(s.best(TASK.workload.key, TARGET, k=3)) == [3, 2, 1]
        finally:
            sa.event.remove(s.db.engine, "before_cursor_execute", capture)
        assert statements
        with s.db.engine.connect() as conn:
            postgres = conn.dialect.name == "postgresql"
            if postgres:   # a tiny table: make the planner show the index it would take
                conn.exec_driver_sql("SET enable_seqscan = off")
                conn.exec_driver_sql("SET enable_bitmapscan = off")
            plan = " ".join(str(row[-1]) for st, ps in statements
                            for row in conn.exec_driver_sql(("EXPLAIN " if postgres else "EXPLAIN QUERY PLAN ") + st, ps))
        assert "ix_records_task_id_mean_cost_slow" in plan, plan


# ---------------------------------------------------------------------------------- opening

@pytest.mark.parametrize("url, why", [
    ("notadb://x", "driver"),
    ("this is not a url", "malformed"),
    ("postgresql://postgres:s3cret@127.0.0.1:1/none", "cannot open"),
    ("sqlite:////proc/tunefarm-no-such-dir/records.db", "does not exist"),
    ("sqlite:////proc/records.db", "cannot open"),          # folder exists but nobody can write there
])
def test_bad_urls_fail_fast_and_clearly(url, why):
    t0 = time.monotonic()
    with pytest.raises(StoreError, match=why) as e:
        open_store(url)
    assert time.monotonic() - t0 < 5
    assert "s3cret" not in str(e.value)


def test_silent_server_times_out():
    """A port that accepts connections but never answers: the 3 s connect timeout ends the wait."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(StoreError, match="cannot open"):
            open_store(f"postgresql://postgres@127.0.0.1:{port}/x")
        assert time.monotonic() - t0 < 8


def test_missing_postgresql_database_is_a_store_error(pg_database):
    with pytest.raises(StoreError, match="cannot open"):
        open_store(pg_database.rsplit("/", 1)[0] + "/tunefarm_no_such_db")


def test_not_a_database_file_is_left_alone(tmp_path):
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are my notes, not a database\n" * 100)
    with pytest.raises(StoreError, match="cannot open"):
        open_store(f"sqlite:///{path}")
    assert path.read_bytes() == b"these are my notes, not a database\n" * 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


def test_failed_open_writes_nothing(empty_db_url, tmp_path, monkeypatch):
    db_url = empty_db_url
    real_upgrade = engine_mod.command.upgrade

    def upgrade_then_fail(cfg, rev):
        real_upgrade(cfg, rev)                      # the tables exist inside the transaction…
        raise sa.exc.OperationalError("upgrade", {}, RuntimeError("disk on fire"))

    monkeypatch.setattr(engine_mod.command, "upgrade", upgrade_then_fail)
    with pytest.raises(StoreError, match="disk on fire"):
        SQLRecordsStore(db_url, upgrade=True)
    monkeypatch.undo()
    if db_url.startswith("sqlite"):
        assert list(tmp_path.iterdir()) == []        # the file this open created is gone
    else:
        assert table_names(db_url) == set()          # …and were rolled back


def test_open_store_url_choice(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TUNEFARM_DB_URL", raising=False)
    with open_store() as s:
        assert s.url == f"sqlite:///{tmp_path / 'home' / '.tunefarm' / 'records.db'}"
    assert (tmp_path / "home" / ".tunefarm" / "records.db").is_file()
    monkeypatch.setenv("TUNEFARM_DB_URL", f"sqlite:///{tmp_path / 'env.db'}")
    with open_store() as s:
        assert s.url.endswith("env.db")
    with open_store(f"sqlite:///{tmp_path / 'flag.db'}") as s:    # --db wins over the environment
        assert s.url.endswith("flag.db")


def test_in_memory_sqlite(monkeypatch):
    with open_store("sqlite://") as s:
        s.add_records(TASK, [(cand(1), ok(1e-3))])
        assert s.count() == 1


# ---------------------------------------------------------------------------------- agents

def test_agents_upsert(store):
    store.upsert_agent("pi-1", "rpi4", {"cores": 4})
    seen = store.list_agents()[0].last_seen
    store.upsert_agent("pi-1", "rpi4b")
    store.upsert_agent("x86-1", "local", {"cores": 2})
    a, b = store.list_agents()
    assert (a.name, a.device_key, a.info) == ("pi-1", "rpi4b", {"cores": 4})
    assert a.last_seen >= seen and b.name == "x86-1"


# ---------------------------------------------------------------------------------- concurrency

def test_concurrent_writers_on_one_database(db_url):
    """Two store objects (as two tuner processes would) adding overlapping batches at once."""
    with SQLRecordsStore(db_url) as a, SQLRecordsStore(db_url) as b:
        added: list[int] = []
        errors: list[BaseException] = []

        def writer(store, order):
            try:
                for start in order:
                    added.extend(store.add_records(TASK, [(cand(i), ok(1e-3)) for i in range(start, start + 5)]))
                    store.measured_fingerprints(TASK)
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                errors.append(e)

        starts = list(range(0, 100, 3))
        threads = [threading.Thread(target=writer, args=(a, starts)),
                   threading.Thread(target=writer, args=(b, starts[::-1]))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert a.count() == b.count() == 104
        assert len(added) == len(set(added)) == 104


def test_history_of_structure_selects_in_sql(store):
    """A warm start asks only for records whose candidates come from the same sketches or
    template, and never for the task's own workload."""
    other = Task(Workload("matmul", {"M": 32, "N": 16, "K": 16}), TARGET, "local")
    conv = Task(Workload("relu", {"shape": (8, 8)}), TARGET, "local")
    trace = lambda sk, i: Candidate("trace", {"sketch": sk, "params": {"i": i}, "steps": []})  # noqa: E731
    store.add_records(other, [(trace("a", 1), ok(1.0)), (trace("b", 2), ok(2.0)), (cand(3), ok(3.0)),
                              (trace("a", 4), err())])
    store.add_records(conv, [(trace("a", 5), ok(1.5))])
    store.add_records(TASK, [(trace("a", 6), ok(0.5))])
    got = store.history_of_structure(TARGET, [("trace", "sketch", frozenset({"a"}))], {MATMUL.key})
    assert sorted(r.candidate.payload["params"]["i"] for r in got) == [1, 5]  # valid, sketch a, not TASK's
    both = store.history_of_structure(TARGET, [("trace", "sketch", frozenset({"b"})),
                                               ("config", "template", frozenset({"matmul"}))], ())
    assert sorted(r.candidate.kind for r in both) == ["config", "trace"]
    assert store.history_of_structure(TARGET, [], ()) == []
    assert store.history_of_structure("llvm -mtriple=aarch64-linux-gnu", [("trace", "sketch", frozenset({"a"}))]) == []


# ---------------------------------------------------------------------------------- read path

def _backend_pids(store) -> set[int]:
    with store.db.session() as s:
        return {s.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()}


def _terminate(url: str, pids: set[int]) -> None:
    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql").split("?")[0], autocommit=True) as c:
        for pid in pids:
            c.execute("SELECT pg_terminate_backend(%s)", (pid,))


def test_idle_connection_killed_by_the_server_is_replaced(pg_database, monkeypatch):
    """A pooled connection idle for IDLE_PING_S is pinged before use: one the server closed
    meanwhile (a restart, an idle timeout) is replaced and the caller never sees it."""
    url = pg_schema_url(pg_database)
    with SQLRecordsStore(url) as store:
        store.add_records(TASK, [(cand(1), ok(1e-3))])
        _terminate(pg_database, _backend_pids(store))
        monkeypatch.setattr(engine_mod, "IDLE_PING_S", 0.0)
        assert [r.candidate for r in store.best(MATMUL.key, TARGET)] == [cand(1)]


def test_postgresql_connections_keep_the_apis_statements_prepared(pg_database):
    """Each pooled psycopg connection keeps PREPARED_MAX prepared statements, not psycopg's 100
    (the API's few hundred statement texts pushed each other out: a PREPARE and a DEALLOCATE
    round trip per read)."""
    url = pg_schema_url(pg_database)
    with SQLRecordsStore(url) as store:
        store.add_records(TASK, [(cand(1), ok(1e-3))])
        with store.db.engine.connect() as conn:
            assert conn.connection.dbapi_connection.prepared_max == engine_mod.PREPARED_MAX > 100
        assert [r.candidate for r in store.best(MATMUL.key, TARGET)] == [cand(1)]


def test_busy_connection_killed_by_the_server_fails_once(pg_database, monkeypatch):
    """A connection used a moment ago is not pinged (the round trip was a third of a small API
    read): when the server drops it, the statement in flight fails once as a StoreError, and the
    pool is renewed for the next one."""
    url = pg_schema_url(pg_database)
    monkeypatch.setattr(engine_mod, "IDLE_PING_S", 3600.0)
    with SQLRecordsStore(url) as store:
        store.add_records(TASK, [(cand(1), ok(1e-3))])
        _terminate(pg_database, _backend_pids(store))
        with pytest.raises(StoreError):
            store.best(MATMUL.key, TARGET)
        assert [r.candidate for r in store.best(MATMUL.key, TARGET)] == [cand(1)]


def test_records_name_their_tasks_past_the_task_cache_bound(db_url):
    """Records select only their own columns and look their tasks up in a bounded cache; a cache
    that starts over when full still names every record's workload, target and device key."""
    from tuner.records.task_cache import TaskCache

    tasks = [Task(Workload("matmul", {"M": m, "N": 8, "K": 8}), TARGET, key) for m in (8, 16, 24) for key in ("local", "arm")]
    with SQLRecordsStore(db_url) as store:
        store._task_cache = TaskCache(max_tasks=2)
        for i, task in enumerate(tasks):
            store.add_records(task, [(cand(i), ok(1e-3 * (i + 1)))])
        page = store.records_page(limit=50)
        assert [(r.workload, r.target, r.device_key) for r in page[::-1]] == [(t.workload, t.target, t.device_key) for t in tasks]
        assert [r.candidate for r in page[::-1]] == [cand(i) for i in range(len(tasks))]
        assert store.records_page(device_key="arm", workload_key=tasks[2].workload.key, limit=5)[0].candidate == cand(3)


def test_best_ranks_remeasured_first_over_every_device_key(store):
    """best() merges each task's own index-ordered ranges: re-measured records first by their
    re-measured cost, then the others by mean, over all device keys unless one is given; error
    records never; baseline_record finds the default schedule's record the same way."""
    from tuner.space.base import default_candidate

    arm = Task(MATMUL, TARGET, "arm")
    store.add_records(TASK, [(cand(i), ok(c)) for i, c in ((1, 4e-3), (2, 1e-3), (3, 3e-3), (4, 6e-3))]
                      + [(cand(9), err()), (default_candidate(MATMUL.key), ok(5e-3))])
    store.add_records(arm, [(cand(5), ok(0.5e-3)), (cand(6), ok(2e-3)), (default_candidate(MATMUL.key), ok(7e-3))])
    store.set_retimed(TASK, {cand(4).fingerprint: 2.5e-3, cand(3).fingerprint: 3.5e-3})
    best = store.best(MATMUL.key, TARGET, k=10)
    assert [r.candidate for r in best] == [cand(4), cand(3), cand(5), cand(2), cand(6), cand(1),
                                           default_candidate(MATMUL.key), default_candidate(MATMUL.key)]
    assert [r.device_key for r in best[-2:]] == ["local", "arm"]
    assert [r.candidate for r in store.best(MATMUL.key, TARGET, k=3, device_key="arm")] == [
        cand(5), cand(6), default_candidate(MATMUL.key)]
    assert store.best(MATMUL.key, TARGET, k=1, device_key="nowhere") == [] and store.best("0" * 32, TARGET) == []
    assert store.baseline_record(MATMUL.key, TARGET).result.mean_cost == pytest.approx(5.25e-3)
    assert store.baseline_record(MATMUL.key, TARGET, device_key="arm").device_key == "arm"
    for device_key in (None, "arm", "local"):    # the two in one read: what best() and baseline_record() say
        got = store.best_with_baseline(MATMUL.key, TARGET, device_key=device_key)
        assert got == (store.best(MATMUL.key, TARGET, k=1, device_key=device_key)[0],
                       store.baseline_record(MATMUL.key, TARGET, device_key=device_key))
    assert store.best_with_baseline(MATMUL.key, TARGET, device_key="nowhere") == (None, None)
    only = Task(MATMUL, TARGET, "bare")          # a best but no default measured
    store.add_records(only, [(cand(7), ok(1e-3))])
    assert store.best_with_baseline(MATMUL.key, TARGET, device_key="bare") == (store.best(MATMUL.key, TARGET, device_key="bare")[0], None)


# ---------------------------------------------------------------------------------- at scale

def _counted(store) -> dict[int, int]:
    """{task id: records} counted in SQL, to check the kept counts against."""
    with store.db.session() as s:
        return dict(s.execute(sa.text("SELECT task_id, COUNT(*) FROM records GROUP BY task_id")).all())


def test_record_counts_are_kept_as_records_arrive(store, monkeypatch):
    """Each task's record count follows every insert path (a batch with a candidate stored
    before, an import staged in several pipelined chunks with lines stored before and repeated): the
    store's totals and the workload and target listings sum them and agree with COUNT(*)."""
    import tuner.records.bulk_import as bulk_import
    monkeypatch.setattr(bulk_import, "CHUNK", 3)            # several chunks, each moved while the next is checked
    monkeypatch.setattr(bulk_import, "SQLITE_BATCH", 2)
    fill(store)
    store.add_records(TASK, [(cand(1), ok(2e-3)), (cand(5), ok(4e-3))])          # cand(1) is stored already
    lines = [line.replace(MATMUL.key, "d" * 32) for line in export(store)]
    assert store.import_jsonl(io.StringIO("\n".join(lines + lines[:2] + export(store)))) == 4   # the relu line is not new
    counted = _counted(store)
    assert store.count() == sum(counted.values()) == 9
    assert store.count(TASK) == 4 and store.count(Task(MATMUL, "llvm -mcpu=cortex-a72", "nowhere")) == 0
    relu = Workload("relu", {"shape": [64]}).key
    assert {w["key"]: w["records"] for w in store.list_workloads()} == {MATMUL.key: 4, "d" * 32: 4, relu: 1}
    assert {t["target"]: t["records"] for t in store.list_targets()} == {TARGET: 8, "llvm -mcpu=cortex-a72": 1}


def test_a_task_sample_holds_its_newest_and_fastest_records(store):
    """task_sample bounds what a resumed run learns from: the newest records and the fastest
    valid ones of that one task (not its neighbours on other device keys), oldest first, each once."""
    costs = [1e-3 * (1 + (i * 7) % 13) for i in range(40)]
    store.add_records(TASK, [(cand(i), ok(c) if i % 5 else err()) for i, c in enumerate(costs)])
    store.add_records(Task(MATMUL, TARGET, "board-a"), [(cand(100), ok(1e-6))])
    every = [r for r in store.history() if r.device_key == TASK.device_key]
    sample = store.task_sample(TASK, newest=6, fastest=4)
    fastest = sorted((r for r in every if r.result.ok), key=lambda r: (r.cost, r.id))[:4]
    assert [r.id for r in sample] == sorted({r.id for r in every[-6:] + fastest})
    assert min(r.cost for r in sample if r.result.ok) == min(r.cost for r in every if r.result.ok)
    assert [r.id for r in store.task_sample(TASK)] == [r.id for r in every]      # a small task: all of it
    assert store.task_sample(Task(MATMUL, TARGET, "nowhere")) == []
    assert store.count(TASK, kind="config") == 40 and store.count(TASK, kind="trace") == 0


def test_a_filtered_page_merges_its_tasks_newest_first(store):
    """records_page on a workload's tasks (several device keys) reads each task's index range and
    merges them: the same records, in the same order, as filtering every record by hand, with
    keyset cursors and record filters beside the task filters."""
    for i in range(12):
        key = ("local", "board-a", "board-b")[i % 3]
        store.add_records(Task(MATMUL, TARGET, key), [(cand(100 + i), ok(1e-3 + i * 1e-5) if i % 4 else err())])
    fill(store)
    every = store.history()
    mine = sorted((r for r in every if r.workload_key == MATMUL.key), key=lambda r: -r.id)
    page = store.records_page(workload_key=MATMUL.key, limit=5)
    assert [r.id for r in page] == [r.id for r in mine[:5]]
    after = store.records_page(workload_key=MATMUL.key, before_id=page[-1].id, limit=50)
    assert [r.id for r in page + after] == [r.id for r in mine]
    failed = store.records_page(workload_key=MATMUL.key, target=TARGET, error_code=int(ErrorCode.WRONG_ANSWER))
    assert [r.id for r in failed] == [r.id for r in mine if r.result.error_code == ErrorCode.WRONG_ANSWER]
    boards = store.records_page(workload_key=MATMUL.key, device_key="board-a")
    assert [r.id for r in boards] == [r.id for r in mine if r.device_key == "board-a"]
    assert store.records_page(workload_key="f" * 32) == []


def test_upgrade_to_0006_counts_the_records_already_stored(empty_db_url):
    """A database of schema 0005 with records gets each task's record count at the upgrade."""
    records = [("INSERT INTO records (task_id, candidate_kind, candidate, fingerprint, costs, error_code, error_msg, "
                f"build_seconds, run_seconds, measured_by, created_at) VALUES (7, 'config', '{{}}', 'fp{i}', '[]', 0, '', "
                "0, 0, 'x', CURRENT_TIMESTAMP)") for i in range(3)]
    at_revision(empty_db_url, "0005",
                "INSERT INTO tasks (id, workload_key, target, device_key) VALUES (7, 'k1', 'llvm', 'local'), (8, 'k1', 'llvm', 'pi')",
                *records)
    with SQLRecordsStore(empty_db_url, upgrade=True) as s:
        assert s.count() == 3 and {t["target"]: t["records"] for t in s.list_targets()} == {"llvm": 3}
