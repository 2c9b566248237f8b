"""The records store: one abstract interface, one SQL implementation (like Optuna's storages).

Records are the single source of truth of tuning: the search asks `measured_fingerprints` to
resume without measuring a candidate twice, the cost model trains on `history`, the compiler
replays `best`. Every method is one transaction, so a crash never leaves a half-added batch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from contextlib import contextmanager
from typing import IO

from sqlalchemy import func, or_, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from ..candidate import Candidate, MeasureResult
from ..workload import Task, Workload
from . import codec
from .dialect import insert_ignore, upsert
from .engine import first_line, open_engine, resolve_url, shown
from .models import AgentRow, JobRow, RecordRow, TaskRow, WorkloadRow
from .values import JOB_TRANSITIONS, Agent, Job, JobState, Record, StoreError, utcnow


class RecordsStore(ABC):
    """What the tuner, the job service and the compiler need from stored measurements."""

    @abstractmethod
    def ensure_task(self, task: Task) -> int: ...
    @abstractmethod
    def add_records(self, task: Task, measured: Iterable[tuple[Candidate, MeasureResult]],
                    job_id: int | None = None) -> list[int]: ...
    @abstractmethod
    def set_retimed(self, task: Task, costs: dict[str, float]) -> int: ...
    @abstractmethod
    def measured_fingerprints(self, task: Task) -> set[str]: ...
    @abstractmethod
    def best(self, workload_key: str, target: str, k: int = 1, device_key: str | None = None) -> list[Record]: ...
    @abstractmethod
    def history(self, target: str | None = None, workload_key: str | None = None,
                limit: int | None = None) -> list[Record]: ...
    @abstractmethod
    def history_of_structure(self, target: str, structures: list, exclude_keys=(),
                             limit: int = 2000) -> list[Record]: ...
    @abstractmethod
    def count(self, task: Task | None = None, job_id: int | None = None, search_only: bool = False) -> int: ...
    @abstractmethod
    def export_jsonl(self, fileobj: IO[str], workload_key: str | None = None, target: str | None = None) -> int: ...
    @abstractmethod
    def import_jsonl(self, fileobj: IO[str]) -> int: ...
    @abstractmethod
    def create_job(self, task: Task, space: str, strategy: str, trials: int) -> int: ...
    @abstractmethod
    def set_job_state(self, job_id: int, state: str, error: str | None = None) -> Job: ...
    @abstractmethod
    def heartbeat(self, job_id: int) -> JobState: ...
    @abstractmethod
    def get_job(self, job_id: int) -> Job: ...
    @abstractmethod
    def list_jobs(self, state: str | None = None) -> list[Job]: ...
    @abstractmethod
    def upsert_agent(self, name: str, device_key: str, info: dict | None = None) -> None: ...
    @abstractmethod
    def list_agents(self) -> list[Agent]: ...

    def close(self) -> None:  # noqa: B027 - an optional hook, not abstract
        """Release connections; the store is unusable afterwards."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_store(url: str | None = None) -> "SQLRecordsStore":
    """Open `url`, else $TUNEFARM_DB_URL, else ~/.tunefarm/records.db; StoreError if it cannot be."""
    return SQLRecordsStore(resolve_url(url))


class SQLRecordsStore(RecordsStore):
    """Records in SQLite or PostgreSQL through SQLAlchemy; schema upgraded by Alembic on open."""

    def __init__(self, url: str):
        self.url = url
        self._engine = open_engine(url)
        self._keys: dict[Workload, tuple[str, str | None]] = {}

    def __repr__(self):
        return f"SQLRecordsStore({shown(self.url)!r})"

    def close(self) -> None:
        self._engine.dispose()

    @contextmanager
    def _session(self, write: bool = False):
        """One transaction; a database failure becomes StoreError and nothing is committed."""
        try:
            with self._engine.connect() as conn:
                if write:
                    conn = conn.execution_options(tunefarm_write=True)
                with conn.begin(), Session(bind=conn, autoflush=False) as session:
                    yield session
                    session.flush()
        except SQLAlchemyError as e:
            raise StoreError(f"records database {shown(self.url)}: {first_line(e)}") from e

    # ------------------------------------------------------------------ tasks
    def _workload_key(self, workload: Workload) -> tuple[str, str | None]:
        """Key and canonical text, computed once per workload (building the DAG is not free)."""
        if workload not in self._keys:
            from compiler.canonical import canonical_text
            op = workload.opdef()
            self._keys[workload] = (workload.key, canonical_text([op.output]))
        return self._keys[workload]

    def _task_id(self, s: Session, key: str, workload: Workload, target: str, device_key: str,
                 canonical: str | None = None) -> int:
        insert_ignore(s, WorkloadRow.__table__, {"key": key, "name": workload.name, "params": workload.params,
                                                 "canonical": canonical, "definition": workload.definition,
                                                 "created_at": utcnow()}, ["key"])
        where = dict(workload_key=key, target=target, device_key=device_key)
        insert_ignore(s, TaskRow.__table__, where, list(where))
        return s.execute(select(TaskRow.id).filter_by(**where)).scalar_one()

    def _find_task_id(self, s: Session, task: Task) -> int | None:
        key, _ = self._workload_key(task.workload)
        return s.execute(select(TaskRow.id).filter_by(workload_key=key, target=task.target,
                                                      device_key=task.device_key)).scalar_one_or_none()

    def ensure_task(self, task: Task) -> int:
        key, canonical = self._workload_key(task.workload)
        with self._session(write=True) as s:
            return self._task_id(s, key, task.workload, task.target, task.device_key, canonical)

    # ---------------------------------------------------------------- records
    def add_records(self, task, measured, job_id=None) -> list[int]:
        """Store a measured batch in one transaction. Candidates already stored for this task are
        skipped, not duplicated; returns the ids of the rows actually added, in input order."""
        measured = list(measured)
        key, canonical = self._workload_key(task.workload)
        now = utcnow()
        with self._session(write=True) as s:
            task_id = self._task_id(s, key, task.workload, task.target, task.device_key, canonical)
            ids = [insert_ignore(s, RecordRow.__table__, codec.record_values(task_id, job_id, cand, res, now),
                                 ["task_id", "fingerprint"], returning=RecordRow.id)
                   for cand, res in measured]
        return [i for i in ids if i is not None]

    def set_retimed(self, task, costs) -> int:
        """Store re-measured costs (fingerprint -> seconds) of records of `task`; returns how
        many records were updated. One transaction: all of a re-measurement round or none."""
        now = utcnow()
        with self._session(write=True) as s:
            task_id = self._find_task_id(s, task)
            if task_id is None:
                return 0
            n = 0
            for fp, cost in costs.items():
                n += s.execute(update(RecordRow).where(RecordRow.task_id == task_id, RecordRow.fingerprint == fp)
                               .values(retimed_cost=float(cost), retimed_at=now)).rowcount
            return n

    def measured_fingerprints(self, task) -> set[str]:
        """What a resumed run must not measure again."""
        key, _ = self._workload_key(task.workload)
        with self._session() as s:
            rows = s.execute(select(RecordRow.fingerprint).join(TaskRow, RecordRow.task_id == TaskRow.id)
                             .where(TaskRow.workload_key == key, TaskRow.target == task.target,
                                    TaskRow.device_key == task.device_key))
            return {fp for (fp,) in rows}

    def _records(self, s: Session, stmt) -> list[Record]:
        return [codec.to_record(r, t, w) for r, t, w in s.execute(stmt)]

    @staticmethod
    def _joined():
        return (select(RecordRow, TaskRow, WorkloadRow)
                .join(TaskRow, RecordRow.task_id == TaskRow.id)
                .join(WorkloadRow, TaskRow.workload_key == WorkloadRow.key))

    def best(self, workload_key, target, k=1, device_key=None) -> list[Record]:
        """The k fastest valid records for (workload key, target), over all device keys unless
        `device_key` is given.

        Re-measured records come first, by their re-measured cost: the fastest of many noisy
        measurements during tuning is biased low, the interleaved re-measurement is not."""
        stmt = (self._joined()
                .where(TaskRow.workload_key == workload_key, TaskRow.target == target,
                       RecordRow.error_code == 0, RecordRow.mean_cost.is_not(None))
                .order_by(RecordRow.retimed_cost.is_(None), func.coalesce(RecordRow.retimed_cost, RecordRow.mean_cost),
                          RecordRow.id).limit(k))
        if device_key is not None:
            stmt = stmt.where(TaskRow.device_key == device_key)
        with self._session() as s:
            return self._records(s, stmt)

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
        with self._session() as s:
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
        with self._session() as s:
            return self._records(s, stmt)[::-1]

    def count(self, task=None, job_id=None, search_only=False) -> int:
        """Records, of one task and/or one job if given; `search_only` leaves out the baselines
        (the default schedule's records), which no trial budget counts."""
        with self._session() as s:
            stmt = select(func.count(RecordRow.id))
            if task is not None:
                task_id = self._find_task_id(s, task)
                if task_id is None:
                    return 0
                stmt = stmt.where(RecordRow.task_id == task_id)
            if job_id is not None:
                stmt = stmt.where(RecordRow.job_id == job_id)
            if search_only:
                stmt = stmt.where(RecordRow.candidate_kind != "default")
            return s.execute(stmt).scalar_one()

    def export_jsonl(self, fileobj, workload_key=None, target=None) -> int:
        """Write records as JSON lines (oldest first); returns how many."""
        stmt = self._joined().order_by(RecordRow.id).execution_options(yield_per=500)
        if workload_key is not None:
            stmt = stmt.where(TaskRow.workload_key == workload_key)
        if target is not None:
            stmt = stmt.where(TaskRow.target == target)
        n = 0
        with self._session() as s:
            for r, t, w in s.execute(stmt):
                fileobj.write(codec.to_line(codec.to_record(r, t, w)) + "\n")
                n += 1
        return n

    def import_jsonl(self, fileobj) -> int:
        """Add the records of a JSON-lines file; returns how many were new.

        Idempotent (records already stored for their task are skipped). All lines are checked
        before anything is written, and the writing is one transaction: a bad line raises
        StoreError naming it and the database is left as it was.
        """
        parsed = [codec.from_line(line, n) for n, line in enumerate(fileobj, 1) if line.strip()]
        added = 0
        with self._session(write=True) as s:
            task_ids: dict[tuple, int] = {}
            for rec in parsed:
                where = (rec.workload_key, rec.target, rec.device_key)
                if where not in task_ids:
                    task_ids[where] = self._task_id(s, rec.workload_key, rec.workload, rec.target, rec.device_key)
                values = codec.record_values(task_ids[where], None, rec.candidate, rec.result, rec.created_at)
                if insert_ignore(s, RecordRow.__table__, values, ["task_id", "fingerprint"],
                                 returning=RecordRow.id) is not None:
                    added += 1
        return added

    # ------------------------------------------------------------------- jobs
    def create_job(self, task, space, strategy, trials) -> int:
        key, canonical = self._workload_key(task.workload)
        now = utcnow()
        with self._session(write=True) as s:
            task_id = self._task_id(s, key, task.workload, task.target, task.device_key, canonical)
            row = JobRow(task_id=task_id, state=JobState.QUEUED.value, space=space, strategy=strategy,
                         trials=int(trials), created_at=now, updated_at=now)
            s.add(row)
            s.flush()
            return row.id

    def set_job_state(self, job_id, state, error=None) -> Job:
        """Move a job along queued → running → done/failed/cancelled (or queued → cancelled).

        A compare-and-set UPDATE, so two servers racing on one job cannot both win; anything
        else raises StoreError and changes nothing."""
        try:
            new = JobState(state)
        except ValueError:
            raise StoreError(f"unknown job state {state!r}; states are {', '.join(JobState)}") from None
        sources = [old.value for old, targets in JOB_TRANSITIONS.items() if new in targets]
        with self._session(write=True) as s:
            done = s.execute(update(JobRow).where(JobRow.id == job_id, JobRow.state.in_(sources))
                             .values(state=new.value, error=error, updated_at=utcnow()))
            if done.rowcount != 1:
                current = self._job_row(s, job_id).state
                allowed = ", ".join(sorted(JOB_TRANSITIONS[JobState(current)])) or "none (final state)"
                raise StoreError(f"job {job_id}: cannot go from {current} to {new}; allowed: {allowed}")
            return self._job(s, self._job_row(s, job_id))

    def heartbeat(self, job_id) -> JobState:
        """Mark a job alive; returns its state, so a worker learns of a cancellation."""
        with self._session(write=True) as s:
            s.execute(update(JobRow).where(JobRow.id == job_id).values(heartbeat_at=utcnow()))
            return JobState(self._job_row(s, job_id).state)

    def get_job(self, job_id) -> Job:
        with self._session() as s:
            return self._job(s, self._job_row(s, job_id))

    def list_jobs(self, state=None) -> list[Job]:
        stmt = select(JobRow).order_by(JobRow.id)
        if state is not None:
            stmt = stmt.where(JobRow.state == JobState(state).value)
        with self._session() as s:
            return [self._job(s, row) for row in s.execute(stmt).scalars()]

    @staticmethod
    def _job_row(s: Session, job_id: int) -> JobRow:
        row = s.get(JobRow, job_id, populate_existing=True)
        if row is None:
            raise StoreError(f"no job {job_id}")
        return row

    @staticmethod
    def _job(s: Session, row: JobRow) -> Job:
        t = s.get(TaskRow, row.task_id)
        w = s.get(WorkloadRow, t.workload_key)
        return Job(id=row.id, task=Task(codec.to_workload(w), t.target, t.device_key),
                   state=JobState(row.state), space=row.space, strategy=row.strategy, trials=row.trials,
                   created_at=row.created_at, updated_at=row.updated_at, heartbeat_at=row.heartbeat_at,
                   error=row.error)

    # ----------------------------------------------------------------- agents
    def upsert_agent(self, name, device_key, info=None) -> None:
        """Record that agent `name` was seen now; `info=None` keeps the info it had."""
        with self._session(write=True) as s:
            upsert(s, AgentRow.__table__, {"name": name, "device_key": device_key, "info": info or {},
                                           "last_seen": utcnow()}, ["name"], keep=("info",) if info is None else ())

    def list_agents(self) -> list[Agent]:
        with self._session() as s:
            return [Agent(a.name, a.device_key, dict(a.info), a.last_seen)
                    for a in s.execute(select(AgentRow).order_by(AgentRow.name)).scalars()]

