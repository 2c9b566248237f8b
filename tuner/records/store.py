"""The records store: one abstract interface, one SQL implementation (like Optuna's storages).

Records are the single source of truth of tuning: the search asks `measured_fingerprints` to
resume without measuring a candidate twice, the cost model trains on `history`, the compiler
replays `best`, the REST API pages through `records_page`. The job queue (jobs.py) and the API
tokens (tokens.py) are stores of their own on the same database (database.py), reached as
`store.jobs` and `store.tokens`. Every method is one transaction, so a crash never leaves a
half-added batch.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import IO

from sqlalchemy import and_, bindparam, func, or_, select, union_all, update
from sqlalchemy.orm import Session

from ..candidate import Candidate, MeasureResult
from ..workload import Task, Workload
from . import codec, retakes
from .bulk_import import import_lines
from .database import Database
from .dialect import insert_ignore, upsert
from .engine import resolve_url, shown
from .jobs import JobQueue, UnknownJob, page_size
from .models import AgentRow, CalibrationRow, JobRow, JobTaskRow, RecordRow, TaskRow, WorkloadRow
from .tokens import TokenStore
from .values import Agent, Job, Record, StoreError, UnknownRecord, utcnow

SAMPLE_NEWEST = 1024        # a resumed run's view of its task: the newest records ...
SAMPLE_FASTEST = 256        # ... and the fastest valid ones (task_sample)
EXPORT_ROWS = 2000          # rows an export fetches and writes at a time
MAX_MEASUREMENTS = 5000     # a job's measurements per page: compact rows for charts, not records


class RecordsStore(ABC):
    """What the tuner, the job service and the compiler need from stored measurements.

    The contract every implementation keeps (SQLRecordsStore is the one here):
    - A task is (workload, target, device key); a record is one measured candidate of a task,
      unique by (task, candidate fingerprint). Records are never changed once added, except by a
      re-measurement (`set_retimed`), and never deleted.
    - Every method is one transaction: it happens entirely or not at all, and what it returns is
      what was committed. Writers in other threads or processes may interleave between two calls;
      a reader sees each call's writes whole, never half a batch.
    - Any failure of the storage itself (unreachable, refused, corrupt input) raises StoreError
      (values.py) with a message naming the database, and nothing is written.
    - Costs are seconds per call; "valid" means measured without an error code. The ranking by
      speed ("best"): records re-measured at the end of their task (and not found slower than
      the default there) first, by their re-measured cost, since the fastest of many noisy
      measurements is biased low; then the others by their tuning-time cost; last, those timed in
      a window whose calibration found the measuring worker slow; ties by insertion order.
      `best`, `baseline_record` and the tuner's running best all rank this way.
    """

    @abstractmethod
    def ensure_task(self, task: Task) -> int:
        """The id of `task`'s row, made if it is new. Idempotent; concurrent calls for one new task
        from several processes all return the same id."""

    @abstractmethod
    def add_records(self, task: Task, measured: Iterable[tuple[Candidate, MeasureResult]],
                    job_id: int | None = None) -> list[int]:
        """Store a measured batch of `task` (made if new), tagged with the service job `job_id`.
        A candidate already stored for the task is skipped, not duplicated or updated (so a batch
        sent twice adds nothing the second time). Returns the ids of the rows actually added, in
        input order; ids grow with insertion."""

    @abstractmethod
    def set_retimed(self, task: Task, costs: dict[str, float], spreads: dict[str, float] | None = None,
                    beats_default: dict[str, bool] | None = None) -> int:
        """Record the end-of-task re-measurement: `costs` (fingerprint -> seconds) of records of
        `task`, with the spread of their per-round figures and whether each beat the default
        beyond the noise (absent: unknown, as for the default itself). Fingerprints the task does
        not hold are ignored. Returns how many records were updated; a later call overwrites."""

    @abstractmethod
    def measured_fingerprints(self, task: Task) -> set[str]:
        """Fingerprints of every record of `task`, valid or not: what a resumed run must not
        measure again."""

    @abstractmethod
    def task_sample(self, task: Task, newest: int = SAMPLE_NEWEST, fastest: int = SAMPLE_FASTEST) -> list[Record]:
        """What a resumed run's strategy and cost model learn from, bounded however many records the
        task holds: its `newest` most recent records and its `fastest` valid ones, oldest first,
        each once; every record when the task holds fewer; [] for an unknown task."""

    @abstractmethod
    def best(self, workload_key: str, target: str, k: int = 1, device_key: str | None = None) -> list[Record]:
        """The k best valid records (the class's ranking) of `workload_key` on `target`, over all
        device keys unless `device_key` is given; fewer (or []) when fewer exist; [] for k < 1."""

    @abstractmethod
    def baseline_record(self, workload_key: str, target: str, device_key: str | None = None) -> Record | None:
        """The best valid record (the same ranking) of the workload's default schedule on
        `target` (over all device keys unless `device_key`), or None: what a speed-up is against."""

    @abstractmethod
    def history(self, target: str | None = None, workload_key: str | None = None,
                limit: int | None = None) -> list[Record]:
        """Valid and error records, filtered by target and workload when given, oldest first;
        with `limit`, the most recent `limit` of them (still oldest first)."""

    @abstractmethod
    def history_of_structure(self, target: str, structures: list, exclude_keys=(),
                             limit: int = 2000) -> list[Record]:
        """The most recent valid records (up to `limit`, oldest first) on `target` of workloads
        other than `exclude_keys` whose candidates have one of `structures` ((candidate kind,
        payload field, values), see SearchSpace.structure): a cost model's warm start."""

    @abstractmethod
    def count(self, task: Task | None = None, job_id: int | None = None, search_only: bool = False,
              kind: str | None = None) -> int:
        """Records, of one task and/or one job when given; `search_only` leaves out the default
        schedule's records (no trial budget counts them); `kind` counts only candidates of that
        kind ("config", "trace"). 0 for an unknown task."""

    @abstractmethod
    def export_jsonl(self, fileobj: IO[str], workload_key: str | None = None, target: str | None = None) -> int:
        """Write the records (filtered when asked) to `fileobj` as JSON lines, oldest first, one
        self-contained line each (its task and workload in it); returns how many. Memory stays flat
        however many records there are."""

    @abstractmethod
    def import_jsonl(self, fileobj: IO[str]) -> int:
        """Add the records of JSON lines as `export_jsonl` writes them (tasks and workloads made as
        named); returns how many were new. Idempotent: records already stored are skipped. All or
        nothing: a bad line raises StoreError naming its line number and nothing is added."""

    @abstractmethod
    def upsert_agent(self, name: str, device_key: str, info: dict | None = None) -> None:
        """Record that farm agent `name` (of `device_key`) was seen now; `info=None` keeps the
        device description it had. Idempotent by name."""

    @abstractmethod
    def list_agents(self) -> list[Agent]:
        """Every agent ever seen, by name."""

    def close(self) -> None:  # noqa: B027 - an optional hook, not abstract
        """Release connections; the store is unusable afterwards."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_store(url: str | None = None, upgrade: bool | None = None) -> "SQLRecordsStore":
    """Open `url`, else $TUNEFARM_DB_URL, else ~/.tunefarm/records.db; StoreError if it cannot be.
    SQLite is migrated on open; PostgreSQL must already be at this version's schema (`tunefarm db
    upgrade`, or `upgrade=True`), see engine.open_engine."""
    return SQLRecordsStore(resolve_url(url), upgrade=upgrade)


class SQLRecordsStore(RecordsStore):
    """Records in SQLite or PostgreSQL through SQLAlchemy (schema upgraded by Alembic on open),
    and the two other stores of that database: `jobs` (the job queue, jobs.JobQueue) and `tokens`
    (API tokens, tokens.TokenStore). Closing it closes the database they share."""

    def __init__(self, url: str, upgrade: bool | None = None):
        self.db = Database(url, upgrade=upgrade)
        self.jobs = JobQueue(self.db)
        self.tokens = TokenStore(self.db)

    @property
    def url(self) -> str:
        return self.db.url

    def __repr__(self):
        return f"SQLRecordsStore({shown(self.url)!r})"

    def close(self) -> None:
        self.db.close()

    def ensure_task(self, task: Task) -> int:
        return self.db.ensure_task(task)

    # ---------------------------------------------------------------- records
    def add_records(self, task, measured, job_id=None) -> list[int]:
        """Store a measured batch in one transaction. Candidates already stored for this task are
        skipped, not duplicated; returns the ids of the rows actually added, in input order."""
        measured = list(measured)
        key, canonical = self.db.workload_key(task.workload)
        now = utcnow()
        with self.db.session(write=True) as s:
            task_id = self.db.task_id(s, key, task.workload, task.target, task.device_key, canonical)
            ids = [insert_ignore(s, RecordRow.__table__, codec.record_values(task_id, job_id, cand, res, now),
                                 ["task_id", "fingerprint"], returning=RecordRow.id)
                   for cand, res in measured]
            added = [i for i in ids if i is not None]
            _count_added(s, {task_id: len(added)})
        return added

    def set_retimed(self, task, costs, spreads=None, beats_default=None) -> int:
        """Store re-measured costs (fingerprint -> seconds) of records of `task`, with the spread
        of their per-round figures and whether each beat the default beyond the noise (absent:
        NULL, as for the default itself); returns how many records were updated. One
        transaction: all of a re-measurement or none."""
        now = utcnow()
        spreads, beats_default = spreads or {}, beats_default or {}
        with self.db.session(write=True) as s:
            task_id = self.db.find_task_id(s, task)
            if task_id is None:
                return 0
            n = 0
            for fp, cost in costs.items():
                spread, beats = spreads.get(fp), beats_default.get(fp)
                n += s.execute(update(RecordRow).where(RecordRow.task_id == task_id, RecordRow.fingerprint == fp)
                               .values(retimed_cost=float(cost), retimed_at=now,
                                       retimed_spread=None if spread is None else float(spread),
                                       beats_default=None if beats is None else bool(beats))).rowcount
            return n

    def measured_fingerprints(self, task) -> set[str]:
        """What a resumed run must not measure again."""
        key, _ = self.db.workload_key(task.workload)
        with self.db.session() as s:
            rows = s.execute(select(RecordRow.fingerprint).join(TaskRow, RecordRow.task_id == TaskRow.id)
                             .where(TaskRow.workload_key == key, TaskRow.target == task.target,
                                    TaskRow.device_key == task.device_key))
            return {fp for (fp,) in rows}

    def task_sample(self, task, newest=SAMPLE_NEWEST, fastest=SAMPLE_FASTEST) -> list[Record]:
        """What a resumed run's strategy and cost model learn from, bounded however many records
        the task holds: its `newest` most recent records and its `fastest` valid ones (the best
        among them), oldest first; the whole task when it holds fewer. Two index ranges of the
        task ((task_id, id) and (task_id, mean_cost)), never a scan of it."""
        with self.db.session() as s:
            task_id = self.db.find_task_id(s, task)
            if task_id is None:
                return []
            mine = select(*codec.RECORD_COLUMNS).where(RecordRow.task_id == task_id)
            recent = s.connection().execute(mine.order_by(RecordRow.id.desc()).limit(max(0, int(newest)))).all()
            best = s.connection().execute(mine.where(RecordRow.mean_cost.is_not(None))
                                          .order_by(RecordRow.mean_cost, RecordRow.id).limit(max(0, int(fastest)))).all()
            rows = {r[0]: r for r in recent + best}                    # RECORD_COLUMNS[0]: id
            return self._to_records(s, [rows[i] for i in sorted(rows)])

    def _records(self, s: Session, stmt) -> list[Record]:
        # Core statements of columns: run on the session's connection, past the ORM's result
        # machinery (a tenth of an API read), which they do not use
        return self._to_records(s, s.connection().execute(stmt).all())

    def _to_records(self, s: Session, rows, page_rows: bool = False) -> list:
        """Records of rows of codec.RECORD_COLUMNS, their tasks looked up (one statement for the
        misses); `page_rows`: codec.PageRows of rows of codec.PAGE_COLUMNS."""
        tasks = self.db.task_cache.get_many(s, {r[1] for r in rows})      # RECORD_COLUMNS[1]: task_id
        if page_rows:
            return [codec.PageRow(r, tasks[r[1]]) for r in rows]
        return [codec.to_record(r, tasks[r[1]]) for r in rows]

    @staticmethod
    def _joined(page_rows: bool = False):
        """The record columns (codec.PAGE_COLUMNS' if `page_rows`), joined with their task so
        statements can filter on it."""
        columns = codec.PAGE_COLUMNS if page_rows else codec.RECORD_COLUMNS
        return select(*columns).join(TaskRow, RecordRow.task_id == TaskRow.id)

    def best(self, workload_key, target, k=1, device_key=None) -> list[Record]:
        """The k fastest valid records for (workload key, target), over all device keys unless
        `device_key` is given.

        Re-measured records come first, by their re-measured cost: the fastest of many noisy
        measurements during tuning is biased low, the interleaved re-measurement is not."""
        return self._best(workload_key, target, device_key, int(k), None)

    def _best(self, workload_key: str, target: str, device_key: str | None, k: int,
              fingerprint: str | None) -> list[Record]:
        """best()'s ranking over the tasks of (workload key, target[, device key]), see _ranked."""
        if k < 1:
            return []
        with self.db.read() as s:
            return self._ranked(s, self._task_ids(s, workload_key, target, device_key), k, fingerprint)

    def best_with_baseline(self, workload_key: str, target: str,
                           device_key: str | None = None) -> tuple[Record | None, Record | None]:
        """(best(k=1), baseline_record()) of (workload key, target[, device key]) in one read:
        one connection and one lookup of the tasks for both (GET /best asks for the two on every
        request; apart, they were two pool checkouts and the tasks looked up twice). The
        baseline is not looked for when there is no best."""
        from ..space.base import default_candidate
        with self.db.read() as s:
            task_ids = self._task_ids(s, workload_key, target, device_key)
            best = self._ranked(s, task_ids, 1, None)
            if not best:
                return None, None
            baseline = self._ranked(s, task_ids, 1, default_candidate(workload_key).fingerprint)
        return best[0], (baseline[0] if baseline else None)

    @staticmethod
    def _task_ids(s: Session, workload_key: str, target: str, device_key: str | None) -> list[int]:
        where = {"workload_key": workload_key, "target": target}
        if device_key is not None:
            where["device_key"] = device_key
        return list(s.connection().execute(_tasks_of(device_key is not None), where).scalars())

    def _ranked(self, s: Session, task_ids: list[int], k: int, fingerprint: str | None) -> list[Record]:
        """The k best valid records of the tasks `task_ids` as best() ranks them (only candidate
        `fingerprint`'s when given): each task's k best from its own index ranges (one statement
        per task, see _best_of_task), merged here. One statement over all the tasks' records
        would have to sort every record of them: 54 ms for a task of 50 000 records, against a
        millisecond this way."""
        conn = s.connection()
        rows = []
        for task_id in task_ids:
            params = {"task_id": task_id, "limit": k}
            if fingerprint is not None:
                params["fingerprint"] = fingerprint
            rows += conn.execute(_best_of_task(fingerprint is not None), params).all()
        # a re-measured record first, by its re-measured cost; then by mean; ties by id
        rows.sort(key=_best_order)
        return self._to_records(s, [r[:len(codec.RECORD_COLUMNS)] for r in rows[:k]])

    def history(self, target=None, workload_key=None, limit=None) -> list[Record]:
        """Valid and error records, oldest first; with `limit`, the most recent `limit` of them."""
        stmt = self._joined()
        if target is not None:
            stmt = stmt.where(TaskRow.target == target)
        if workload_key is not None:
            stmt = stmt.where(TaskRow.workload_key == workload_key)
        if limit is None:
            stmt = stmt.order_by(RecordRow.id)
        else:
            stmt = stmt.order_by(RecordRow.id.desc()).limit(limit)
        with self.db.session() as s:
            records = self._records(s, stmt)
        return records if limit is None else records[::-1]

    def history_of_structure(self, target, structures, exclude_keys=(), limit=2000) -> list[Record]:
        """The most recent valid records (up to `limit`) on `target` of other workloads than
        `exclude_keys` whose candidates have one of `structures` — (candidate kind, payload
        field, values), see SearchSpace.structure — selected in SQL: a cost model's warm start
        lowers only what it can use."""
        if not structures:
            return []
        field_ok = [(RecordRow.candidate_kind == kind)
                    & RecordRow.candidate["payload"][name].as_string().in_(sorted(values))
                    for kind, name, values in structures]
        stmt = (self._joined().where(TaskRow.target == target, RecordRow.mean_cost.is_not(None), or_(*field_ok)))
        if exclude_keys:
            stmt = stmt.where(TaskRow.workload_key.not_in(sorted(exclude_keys)))
        stmt = stmt.order_by(RecordRow.id.desc()).limit(limit)
        with self.db.session() as s:
            return self._records(s, stmt)[::-1]

    def count(self, task=None, job_id=None, search_only=False, kind=None) -> int:
        """Records, of one task and/or one job if given; `search_only` leaves out the baselines
        (the default schedule's records), which no trial budget counts; `kind` counts only
        candidates of that kind ("config", "trace")."""
        with self.db.session() as s:
            if job_id is None and not search_only and kind is None:   # the tasks' counts: no scan of the records
                total = select(func.coalesce(func.sum(TaskRow.record_count), 0))
                if task is not None:
                    key, _ = self.db.workload_key(task.workload)
                    total = total.where(TaskRow.workload_key == key, TaskRow.target == task.target,
                                        TaskRow.device_key == task.device_key)
                return int(s.execute(total).scalar_one())
            stmt = select(func.count(RecordRow.id))
            if task is not None:
                task_id = self.db.find_task_id(s, task)
                if task_id is None:
                    return 0
                stmt = stmt.where(RecordRow.task_id == task_id)
            if job_id is not None:
                stmt = stmt.where(RecordRow.job_id == job_id)
            if search_only:
                stmt = stmt.where(RecordRow.candidate_kind != "default")
            if kind is not None:
                stmt = stmt.where(RecordRow.candidate_kind == kind)
            return s.execute(stmt).scalar_one()

    def records_page(self, workload_key: str | None = None, target: str | None = None,
                     device_key: str | None = None, job_id: int | None = None, error_code: int | None = None,
                     before_id: int | None = None, limit: int = 50, page_rows: bool = False) -> list:
        """Records newest first, filtered, `limit` of them with ids below `before_id` (keyset
        paging over indexed columns: no page costs more at a million records than at 100).
        `page_rows`: codec.PageRows (for a page that is shown, not used) instead of Records.

        Filters on the task (workload key, target, device key) that leave at most
        MAX_TASK_RANGES tasks read each task's newest records from the (task_id, id) index and
        merge them: one statement over the join would walk the records by id, newest first,
        past every record of other tasks (a workload whose records are old: most of the table)."""
        given = _given_filters(workload_key, target, device_key, job_id, error_code)
        params = {**given, "limit": page_size(limit)}
        if before_id is not None:
            params["before_id"] = int(before_id)
        on_task = tuple(name for name in _TASK_FILTERS if name in given)
        with self.db.read() as s:
            conn = s.connection()
            if on_task:
                task_ids = conn.execute(_matching_tasks(on_task), {**{n: given[n] for n in on_task},
                                                                    "limit": MAX_TASK_RANGES + 1}).scalars().all()
                if len(task_ids) <= MAX_TASK_RANGES:
                    stmt = _newest_of_task(tuple(n for n in given if n not in on_task), before_id is not None, page_rows)
                    rows = [row for task_id in task_ids for row in conn.execute(stmt, {**params, "task_id": task_id})]
                    rows.sort(key=lambda row: row[0], reverse=True)    # RECORD_COLUMNS[0]: the id
                    return self._to_records(s, rows[:params["limit"]], page_rows)
            stmt = _newest_records(tuple(given), before_id is not None, page_rows)
            return self._to_records(s, conn.execute(stmt, params).all(), page_rows)

    def get_record(self, record_id: int) -> Record:
        with self.db.session() as s:
            got = self._records(s, self._joined().where(RecordRow.id == record_id))
        if not got:
            raise UnknownRecord(f"no record {record_id}")
        return got[0]

    def export_jsonl(self, fileobj, workload_key=None, target=None) -> int:
        """Write records as JSON lines (oldest first); returns how many."""
        stmt = (select(*codec.EXPORT_COLUMNS).join(TaskRow, RecordRow.task_id == TaskRow.id).order_by(RecordRow.id)
                .execution_options(yield_per=EXPORT_ROWS))
        if workload_key is not None:
            stmt = stmt.where(TaskRow.workload_key == workload_key)
        if target is not None:
            stmt = stmt.where(TaskRow.target == target)
        n = 0
        tails: dict[int, str] = {}
        with self.db.session(stream=True) as s:
            for rows in s.connection().execute(stmt).partitions():      # Core: no ORM row processing
                tasks = self.db.task_cache.get_many(s, {r[1] for r in rows})      # EXPORT_COLUMNS[1]: task_id
                for task_id, task in tasks.items():
                    if task_id not in tails:
                        tails[task_id] = codec.line_tail(task.workload_key, task.workload, task.target)
                fileobj.write("".join(codec.row_to_line(r, tails[r[1]], tasks[r[1]].device_key) + "\n" for r in rows))
                n += len(rows)
        return n

    def import_jsonl(self, fileobj) -> int:
        """Add the records of a JSON-lines file; returns how many were new.

        Idempotent (records already stored for their task are skipped). One transaction through
        a staging table (bulk_import: COPY on PostgreSQL), flat memory however long the file: a bad
        line raises StoreError naming it and the database is left as it was.
        """
        with self.db.session(write=True) as s:
            added = import_lines(s, fileobj, self.db.task_id)
            _count_added(s, added)
        return sum(added.values())

    # ----------------------------------------------------------------- agents
    def upsert_agent(self, name, device_key, info=None) -> None:
        """Record that agent `name` was seen now; `info=None` keeps the info it had."""
        with self.db.session(write=True) as s:
            upsert(s, AgentRow.__table__, {"name": name, "device_key": device_key, "info": info or {},
                                           "last_seen": utcnow()}, ["name"], keep=("info",) if info is None else ())

    def list_agents(self) -> list[Agent]:
        with self.db.session() as s:
            return [Agent(a.name, a.device_key, dict(a.info), a.last_seen)
                    for a in s.execute(select(AgentRow).order_by(AgentRow.name)).scalars()]


    # ----------------------------------------------------------- calibrations
    def add_calibration(self, device_key: str, host: str, calibration: dict, state: str,
                        speed_index: float | None = None) -> int:
        """Store one calibration of a measuring worker of `device_key` on `host`
        (device_agent.calibration.calibrate's dict) with its verdict; returns its id."""
        values = {"device_key": device_key, "host": host, "version": int(calibration["version"]),
                  "threads": int(calibration["threads"]), "created_at": utcnow(),
                  **{m: float(calibration[m]) for m in ("fma_1", "fma_n", "stream_1", "stream_n")},
                  "sync_n": None if calibration.get("sync_n") is None else float(calibration["sync_n"]),
                  "disturbed": list(calibration.get("disturbed") or []),
                  "speed_index": None if speed_index is None else float(speed_index), "state": str(state)}
        with self.db.session(write=True) as s:
            row = CalibrationRow(**values)
            s.add(row)
            s.flush()
            return int(row.id)

    def calibrations(self, device_key: str, host: str | None = None, limit: int = 25,
                     version: int | None = None, threads: int | None = None) -> list[dict]:
        """The newest `limit` calibrations of `device_key` (on `host` if given; of one calibration
        `version` and thread count if given), oldest first, as dicts of the table's columns: a
        device's history (one range of the (device_key, host, id) index)."""
        stmt = select(CalibrationRow).where(CalibrationRow.device_key == device_key)
        if host is not None:
            stmt = stmt.where(CalibrationRow.host == host)
        if version is not None:
            stmt = stmt.where(CalibrationRow.version == int(version))
        if threads is not None:
            stmt = stmt.where(CalibrationRow.threads == int(threads))
        stmt = stmt.order_by(CalibrationRow.id.desc()).limit(max(0, int(limit)))
        with self.db.session() as s:
            rows = s.execute(stmt).scalars().all()
            out = [{c.name: getattr(r, c.name) for c in CalibrationRow.__table__.columns} for r in rows]
        return out[::-1]

    # --- reads for the API
    # What the REST layer (tuner.service.api) reads beyond the tuner's own methods. Each is
    # keyset-paged or capped and runs on indexed columns: several API servers share the database
    # with the workers, and no request may cost more at 100 000 records than a page of them.

    def ping(self) -> None:
        """One round trip to the database (readiness); StoreError when it does not answer."""
        self.db.ping()

    def records_after(self, after_id: int | None = None, limit: int = 500, workload_key: str | None = None,
                      target: str | None = None) -> list[Record]:
        """Records oldest first with ids above `after_id`: the streamed export's pages, in
        export_jsonl's order, each its own short transaction instead of one held for the whole file."""
        stmt = self._joined().order_by(RecordRow.id).limit(page_size(limit))
        if after_id is not None:
            stmt = stmt.where(RecordRow.id > after_id)
        if workload_key is not None:
            stmt = stmt.where(TaskRow.workload_key == workload_key)
        if target is not None:
            stmt = stmt.where(TaskRow.target == target)
        with self.db.session() as s:
            return self._records(s, stmt)

    def baseline_record(self, workload_key: str, target: str, device_key: str | None = None) -> Record | None:
        """The fastest valid measurement of the workload's default schedule on `target` (over all
        device keys unless `device_key`), or None. Found by the default candidate's fingerprint,
        so it is a lookup in the (task_id, fingerprint) unique index, not a scan of the task."""
        from ..space.base import default_candidate
        got = self._best(workload_key, target, device_key, 1, default_candidate(workload_key).fingerprint)
        return got[0] if got else None

    def list_workloads(self, after_key: str | None = None, limit: int = 50, name: str | None = None) -> list[dict]:
        """Workloads by key, `limit` of them after `after_key` (keyset), each a dict with key,
        name, params, is_compute (defined as a compute DAG) and records (how many are stored).
        The DAG definitions themselves are not read: a page stays small."""
        from sqlalchemy import Text, cast
        is_compute = (WorkloadRow.definition.is_not(None) & (cast(WorkloadRow.definition, Text) != "null")).label("is_compute")
        stmt = (select(WorkloadRow.key, WorkloadRow.name, WorkloadRow.params, is_compute)
                .order_by(WorkloadRow.key).limit(page_size(limit)))
        if after_key is not None:
            stmt = stmt.where(WorkloadRow.key > after_key)
        if name is not None:
            stmt = stmt.where(WorkloadRow.name == name)
        with self.db.session() as s:
            rows = s.execute(stmt).all()
            keys = [r.key for r in rows]
            counts = dict(s.execute(select(TaskRow.workload_key, func.sum(TaskRow.record_count))
                                    .where(TaskRow.workload_key.in_(keys)).group_by(TaskRow.workload_key)).all()) if keys else {}
        return [{"key": r.key, "name": r.name, "params": dict(r.params or {}), "is_compute": bool(r.is_compute),
                 "records": int(counts.get(r.key, 0))} for r in rows]

    def list_targets(self, after: str | None = None, limit: int = 50) -> list[dict]:
        """Distinct targets in order, `limit` of them after `after` (keyset), each a dict with
        target, tasks, workloads, device_keys (sorted) and records (how many are stored)."""
        stmt = (select(TaskRow.target, func.count(TaskRow.id).label("tasks"),
                       func.count(func.distinct(TaskRow.workload_key)).label("workloads"))
                .group_by(TaskRow.target).order_by(TaskRow.target).limit(page_size(limit)))
        if after is not None:
            stmt = stmt.where(TaskRow.target > after)
        with self.db.session() as s:
            rows = s.execute(stmt).all()
            targets = [r.target for r in rows]
            keys: dict[str, list[str]] = {t: [] for t in targets}
            counts: dict[str, int] = {}
            if targets:
                for t, key in s.execute(select(TaskRow.target, TaskRow.device_key).distinct()
                                        .where(TaskRow.target.in_(targets)).order_by(TaskRow.target, TaskRow.device_key)):
                    keys[t].append(key)
                counts = dict(s.execute(select(TaskRow.target, func.sum(TaskRow.record_count))
                                        .where(TaskRow.target.in_(targets)).group_by(TaskRow.target)).all())
        return [{"target": r.target, "tasks": int(r.tasks), "workloads": int(r.workloads), "device_keys": keys[r.target],
                 "records": int(counts.get(r.target, 0))} for r in rows]

    def recent_measurements(self, seconds: float = 60.0, cap: int = 20_000, chunk: int = 2_000) -> tuple[int, dict[int, int], bool]:
        """(measurements stored in the last `seconds`, how many of them failed by error code,
        whether the `cap` on rows read was hit so the numbers are a lower bound).

        Walks the newest records backwards by primary key in chunks and stops at the first
        chunk with nothing recent: an idle farm costs one chunk, a busy one at most `cap` rows,
        and no index on created_at is needed. Records imported with old timestamps are not
        counted (they were not measured now)."""
        from datetime import timedelta
        cutoff = utcnow() - timedelta(seconds=seconds)
        count, before, scanned = 0, None, 0
        errors: dict[int, int] = {}
        with self.db.session() as s:
            while scanned < cap:
                want = min(chunk, cap - scanned)
                stmt = (select(RecordRow.id, RecordRow.error_code, RecordRow.created_at)
                        .order_by(RecordRow.id.desc()).limit(want))
                if before is not None:
                    stmt = stmt.where(RecordRow.id < before)
                rows = s.execute(stmt).all()
                scanned += len(rows)
                recent = [r for r in rows if r.created_at >= cutoff]
                for r in recent:
                    count += 1
                    if r.error_code != 0:
                        errors[r.error_code] = errors.get(r.error_code, 0) + 1
                if not recent or len(rows) < want:
                    return count, errors, False
                before = rows[-1].id
        return count, errors, True

    # --- reads for the dashboard
    # What the web dashboard (tuner.service.dashboard) reads through the API: a job's measurements
    # for its charts, records in other orders than newest first, and the best record of every task.
    # Each is one bounded statement on indexed columns (or one per page), like the reads above.

    def job_with_retakes(self, job_id: int) -> tuple[Job, dict]:
        """A job (UnknownJob if there is none) and its `job_retakes`, on one connection: what a
        job's page polls every 2 s."""
        with self.db.read() as conn:
            job, retaken = self.jobs.read_polled(conn, job_id)
            return job, (retakes.job_retakes(conn, job_id) if retaken else retakes.none_retaken())

    def job_retakes(self, job_id: int, limit: int = 200) -> dict:
        """The job's measurements taken again after a slow window, or marked: grouped by window,
        newest first, and counted per task (tuner.records.retakes.job_retakes says what it holds)."""
        with self.db.read() as conn:
            return retakes.job_retakes(conn, job_id, limit)

    def job_measurements(self, job_id: int, after_id: int | None = None, limit: int = 1000) -> tuple[datetime, list[dict]]:
        """(the job's creation time, its records oldest first with ids above `after_id`), each a
        dict with id, created_at, position (of its task in the job), mean_cost (None for an
        error), flops (of its task), error_code and candidate_kind. One statement: the job row by
        primary key, left-joined to its records (records.job_id index) and their job_tasks row, so
        an unknown job (UnknownJob) and a job without records (an empty list) are told apart."""
        if not 1 <= int(limit) <= MAX_MEASUREMENTS:
            raise StoreError(f"measurements page size must be 1..{MAX_MEASUREMENTS}, got {limit}")
        on = RecordRow.job_id == JobRow.id
        if after_id is not None:
            on = and_(on, RecordRow.id > after_id)
        stmt = (select(JobRow.created_at.label("job_created"), RecordRow.id, RecordRow.created_at, JobTaskRow.position,
                       RecordRow.mean_cost, JobTaskRow.flops, RecordRow.error_code, RecordRow.candidate_kind)
                .select_from(JobRow)
                .outerjoin(RecordRow, on)
                .outerjoin(JobTaskRow, and_(JobTaskRow.job_id == JobRow.id, JobTaskRow.task_id == RecordRow.task_id))
                .where(JobRow.id == job_id)
                .order_by(RecordRow.id).limit(int(limit)))
        with self.db.session() as s:
            rows = s.execute(stmt).all()
        if not rows:
            raise UnknownJob(f"no job {job_id}")
        created = rows[0].job_created
        return created, [{"id": r.id, "created_at": r.created_at, "position": r.position, "mean_cost": r.mean_cost,
                          "flops": r.flops, "error_code": r.error_code, "candidate_kind": r.candidate_kind}
                         for r in rows if r.id is not None]

    def records_sorted(self, order: str, workload_key: str | None = None, target: str | None = None,
                       device_key: str | None = None, job_id: int | None = None, error_code: int | None = None,
                       after_id: int | None = None, after_cost: float | None = None, limit: int = 50,
                       page_rows: bool = False) -> list:
        """Records in `order`, after a keyset cursor (records_page is newest first; `page_rows` as there):

        - "oldest": ids ascending, those above `after_id`;
        - "fastest": valid records of `workload_key` (required) by mean cost ascending, ties by
          id, after the (after_cost, after_id) cursor. Served by the (task_id, mean_cost) index:
          the workload's few tasks are looked up first, then each is an index range. Error records
          have no cost and are not in this order."""
        if order not in ("oldest", "fastest"):
            raise StoreError(f"unknown record order {order!r}; records_sorted knows oldest and fastest")
        stmt = self._joined(page_rows).limit(page_size(limit))
        for name, value in _given_filters(workload_key, target, device_key, job_id, error_code).items():
            stmt = stmt.where(_FILTERS[name] == value)
        if order == "oldest":
            stmt = stmt.order_by(RecordRow.id)
            if after_id is not None:
                stmt = stmt.where(RecordRow.id > after_id)
        else:
            if workload_key is None:
                raise StoreError("records by cost need a workload key (the order is served per task by an index)")
            if (after_cost is None) != (after_id is None):
                raise StoreError("the cost cursor is a pair: give both after_cost and after_id, or neither")
            stmt = stmt.where(RecordRow.mean_cost.is_not(None)).order_by(RecordRow.mean_cost, RecordRow.id)
            if after_cost is not None:
                stmt = stmt.where(or_(RecordRow.mean_cost > after_cost,
                                      (RecordRow.mean_cost == after_cost) & (RecordRow.id > after_id)))
        with self.db.read() as s:
            return self._to_records(s, s.connection().execute(stmt).all(), page_rows)

    def best_per_task(self, after_task_id: int | None = None, limit: int = 50,
                      target: str | None = None) -> list[TaskBest]:
        """Tasks by id after `after_task_id` (keyset), on `target` if given, each with its best
        valid record as best() ranks them and the default schedule's record (None when not measured).

        Three statements for the whole page: the tasks with the id of their best record as
        correlated subqueries, ranked as `best()` ranks (a re-measured record first, by its
        re-measured cost: the (task_id, retimed_cost) index; else by the tuning-time mean: the
        (task_id, mean_cost) index; else, a record timed in a slow window, by its mean: the
        partial index of those; one index range per task, never a scan of the records);
        those records by primary key; the baselines by their fingerprint (the (task_id,
        fingerprint) unique index)."""
        from ..space.base import default_candidate
        # mean_cost is NULL for every failed measurement (codec.mean_cost_column), so no error_code
        # test: an equality on it would tempt a planner into the (error_code, id) index instead
        best_retimed = (select(RecordRow.id).where(RecordRow.task_id == TaskRow.id, _verified(),
                                                   RecordRow.mean_cost.is_not(None))
                        .order_by(RecordRow.retimed_cost, RecordRow.id).limit(1).correlate(TaskRow).scalar_subquery())

        def best_mean(marked: bool):
            return (select(RecordRow.id).where(RecordRow.task_id == TaskRow.id, RecordRow.mean_cost.is_not(None),
                                               _in_slow_window(marked))
                    .order_by(RecordRow.mean_cost, RecordRow.id).limit(1).correlate(TaskRow).scalar_subquery())
        best_id = func.coalesce(best_retimed, best_mean(False), best_mean(True))
        stmt = (select(TaskRow, WorkloadRow, best_id.label("best_id"))
                .join(WorkloadRow, TaskRow.workload_key == WorkloadRow.key)
                .order_by(TaskRow.id).limit(page_size(limit)))
        if after_task_id is not None:
            stmt = stmt.where(TaskRow.id > after_task_id)
        if target is not None:
            stmt = stmt.where(TaskRow.target == target)
        with self.db.session() as s:
            rows = s.execute(stmt).all()
            ids = [r.best_id for r in rows if r.best_id is not None]
            best = {rec.id: rec for rec in self._records(s, self._joined().where(RecordRow.id.in_(ids)))} if ids else {}
            baselines: dict[int, Record] = {}
            if rows:
                # (task id, its default's fingerprint) pairs: the unique index's own key, nothing
                # else a planner could prefer (with `mean_cost IS NOT NULL` beside them, SQLite
                # walked each task's (task_id, mean_cost) range instead: 0.4 s at 1 M records)
                pairs = [(r.TaskRow.id, default_candidate(r.TaskRow.workload_key).fingerprint) for r in rows]
                stmt = select(*codec.RECORD_COLUMNS).where(or_(*(and_(RecordRow.task_id == task_id, RecordRow.fingerprint == fp)
                                                                 for task_id, fp in pairs)))
                found = [b for b in s.connection().execute(stmt).all() if b.mean_cost is not None]
                tasks = self.db.task_cache.get_many(s, {b.task_id for b in found})
                for b in found:
                    baselines[b.task_id] = codec.to_record(b, tasks[b.task_id])
        return [TaskBest(r.TaskRow.id, r.TaskRow.workload_key, codec.to_workload(r.WorkloadRow), r.TaskRow.target,
                         r.TaskRow.device_key, best.get(r.best_id), baselines.get(r.TaskRow.id)) for r in rows]


@dataclass(frozen=True)
class TaskBest:
    """A task with its fastest valid record and its default schedule's record (best_per_task)."""

    task_id: int
    workload_key: str
    workload: Workload
    target: str
    device_key: str
    best: Record | None
    baseline: Record | None


# The statements of the API's hot record reads, built once per shape with bound parameters:
# building a statement and computing its cache key cost more CPU than running it (SQLAlchemy
# memoizes the key on the statement object).
_FILTERS = {"workload_key": TaskRow.workload_key, "target": TaskRow.target, "device_key": TaskRow.device_key,
            "job_id": RecordRow.job_id, "error_code": RecordRow.error_code}


@functools.lru_cache(maxsize=128)
def _newest_records(filters: tuple[str, ...], before: bool, page_rows: bool):
    """records_page's statement: records with the `filters` (names of _FILTERS), below
    `before_id` if `before`, newest first, `limit` of them (PAGE_COLUMNS if `page_rows`)."""
    stmt = SQLRecordsStore._joined(page_rows).order_by(RecordRow.id.desc()).limit(bindparam("limit"))
    for name in filters:
        stmt = stmt.where(_FILTERS[name] == bindparam(name))
    if before:
        stmt = stmt.where(RecordRow.id < bindparam("before_id"))
    return stmt


def _count_added(s: Session, added: dict) -> None:
    """Add `added` ({task id: records}) to the tasks' record counts, in the records' transaction."""
    for task_id, n in added.items():
        if n:
            s.execute(update(TaskRow).where(TaskRow.id == task_id).values(record_count=TaskRow.record_count + n))


_TASK_FILTERS = ("workload_key", "target", "device_key")
MAX_TASK_RANGES = 32   # tasks a filtered records page reads as index ranges of their own (records_page)


@functools.lru_cache(maxsize=8)
def _matching_tasks(filters: tuple[str, ...]):
    """The ids of the tasks with the `filters` (names in _TASK_FILTERS), at most `limit`."""
    stmt = select(TaskRow.id).limit(bindparam("limit"))
    for name in filters:
        stmt = stmt.where(_FILTERS[name] == bindparam(name))
    return stmt


@functools.lru_cache(maxsize=16)
def _newest_of_task(filters: tuple[str, ...], before: bool, page_rows: bool):
    """records_page's statement for one task: its records with the `filters` (job_id,
    error_code), below `before_id` if `before`, newest first, `limit` of them: a range of the
    (task_id, id) index (PAGE_COLUMNS if `page_rows`)."""
    stmt = select(*(codec.PAGE_COLUMNS if page_rows else codec.RECORD_COLUMNS)).where(RecordRow.task_id == bindparam("task_id"))
    for name in filters:
        stmt = stmt.where(_FILTERS[name] == bindparam(name))
    if before:
        stmt = stmt.where(RecordRow.id < bindparam("before_id"))
    return stmt.order_by(RecordRow.id.desc()).limit(bindparam("limit"))


@functools.lru_cache(maxsize=2)
def _tasks_of(by_device_key: bool):
    """The tasks of (workload key, target[, device key]): the tasks' unique index."""
    stmt = select(TaskRow.id).where(TaskRow.workload_key == bindparam("workload_key"), TaskRow.target == bindparam("target"))
    if by_device_key:
        stmt = stmt.where(TaskRow.device_key == bindparam("device_key"))
    return stmt.order_by(TaskRow.id)


def _best_order(r):
    """best()'s order: verified re-measured records by re-measured cost, then the unmarked rest by
    figure, then records timed in a slow window (RecordRow.slow_window) by figure."""
    verified = r.retimed_cost is not None and r.beats_default is not False
    return (not verified, bool(r.slow_window) and not verified, r.retimed_cost if verified else r.mean_cost, r.id)


def _verified(yes: bool = True):
    """Records whose re-measured cost ranks them (yes) or not: re-measured, and not found slower
    than the default beyond the noise (beats_default False ranks by the tuning-time figure,
    after every verified record, so apply-best builds the default instead)."""
    if yes:
        return (RecordRow.retimed_cost.is_not(None)) & (RecordRow.beats_default.is_not(False))
    return (RecordRow.retimed_cost.is_(None)) | (RecordRow.beats_default.is_(False))


def _in_slow_window(yes: bool = True):
    """Records timed in a window a calibration found slow (yes) or not; `IS true` as SQLAlchemy
    renders it on each back-end, the predicate of their partial index (migration 0010)."""
    return RecordRow.slow_window.is_(True) if yes else RecordRow.slow_window.is_not(True)


@functools.lru_cache(maxsize=2)
def _best_of_task(by_fingerprint: bool):
    """A task's `limit` best valid records as best() ranks them, as rows of RECORD_COLUMNS plus
    mean_cost: the re-measured ones by re-measured cost (the (task_id, retimed_cost) index),
    then the others by mean (the (task_id, mean_cost) index), those timed in a slow window last
    (their figures came from a worker a calibration found slow), each an index range read in
    order and cut at `limit`. With `fingerprint`: only that candidate (baseline_record). mean_cost is
    NULL for every failed measurement (codec.mean_cost_column), so no error_code test: an
    equality on it tempts a planner into the (error_code, id) index."""
    def ranked(retimed: bool, marked: bool = False):
        cost = RecordRow.retimed_cost if retimed else RecordRow.mean_cost
        stmt = (select(*codec.RECORD_COLUMNS)
                .where(RecordRow.task_id == bindparam("task_id"), RecordRow.mean_cost.is_not(None),
                       _verified(retimed)))
        if not retimed:   # a slow window's figures rank after every other record's
            stmt = stmt.where(_in_slow_window(marked))
        if by_fingerprint:
            stmt = stmt.where(RecordRow.fingerprint == bindparam("fingerprint"))
        # each part a subquery: SQLite allows no ORDER BY / LIMIT on a bare member of a UNION
        return select(stmt.order_by(cost, RecordRow.id).limit(bindparam("limit")).subquery())
    return union_all(ranked(True), ranked(False), ranked(False, marked=True))


def _given_filters(workload_key, target, device_key, job_id, error_code) -> dict:
    """The record filters a caller gave, by their names in _FILTERS (None: not filtered)."""
    given = {"workload_key": workload_key, "target": target, "device_key": device_key, "job_id": job_id,
             "error_code": None if error_code is None else int(error_code)}
    return {name: value for name, value in given.items() if value is not None}
