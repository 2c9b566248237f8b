"""The job queue in SQL: submit, claim with a lease, renew, finish, cancel, resume, list, events.

Every state change is one conditional UPDATE (compare-and-set on the state and, for a worker,
on its lease), so two workers or two API servers racing on one job cannot both win, and the
loser learns it from the row count instead of overwriting the winner.

Claiming is one statement on PostgreSQL: `UPDATE jobs … FROM (SELECT id … ORDER BY priority
DESC, id LIMIT 1 FOR UPDATE SKIP LOCKED) … RETURNING`, so workers never queue behind each other's
row locks; on SQLite the pick and the update run under the database's single write lock (BEGIN
IMMEDIATE), which serializes claims. A job is claimable when queued, or running with an
expired lease (its worker died): the new claim resumes it from its records. Lease times come
from the claiming worker's clock; hosts of one farm are expected to keep time (NTP).
"""

from __future__ import annotations

import os
import socket
from datetime import datetime, timedelta, timezone

from sqlalchemy import and_, bindparam, exists, func, insert, or_, select, text, update
from sqlalchemy.orm import Session

from ..workload import Task
from .database import Database
from .models import JobEventRow, JobRow, JobTaskRow, RecordRow, TaskRow, WorkloadRow
from .task_cache import TaskInfo
from .values import JOB_TRANSITIONS, Job, JobEvent, JobState, JobTask, StoreError, utcnow

MAX_PAGE = 500

# a job's failed measurements, counted with the job row (the records.job_id index: one range)
_JOB_ERRORS = (select(func.count(RecordRow.id)).where(RecordRow.job_id == JobRow.id, RecordRow.error_code != 0)
               .correlate(JobRow).scalar_subquery().label("errors"))
# whether any of the job's records was re-taken or marked (the ix_records_job_id_retaken partial
# index, its predicate term for term as retakes.RETAKEN_ROWS has it): a polled job reads its
# re-taken windows only when there are some, one statement fewer for almost every poll
_JOB_RETAKEN = (exists(select(RecordRow.id).where(RecordRow.job_id == JobRow.id, RecordRow.job_id.is_not(None),
                                                  text("(records.remeasured OR records.slow_window)")))
                .correlate(JobRow).label("retaken"))
_JOB_TASK_COLUMNS = (JobTaskRow.job_id, JobTaskRow.position, JobTaskRow.task_id, JobTaskRow.weight, JobTaskRow.flops,
                     JobTaskRow.trials, JobTaskRow.batches, JobTaskRow.errors, JobTaskRow.best_cost,
                     JobTaskRow.best_record_id, JobTaskRow.baseline_cost, JobTaskRow.timings, JobTaskRow.disturbed_timings)


def _job_select():
    """Every column of a job and its error count, as plain rows (no ORM identity map: a read
    of a polled job must not pay for change tracking it never uses)."""
    return select(*JobRow.__table__.c, _JOB_ERRORS)


# the statements of a job read, built once: building one and computing its cache key cost
# more CPU than running it (SQLAlchemy memoizes the key on the statement object)
_JOB_BY_ID = _job_select().where(JobRow.id == bindparam("job_id"))
POLLED_JOB_BY_ID = _JOB_BY_ID.add_columns(_JOB_RETAKEN)     # what read_polled reads: the job and "any re-taken?"
_TASKS_OF_JOBS = (select(*_JOB_TASK_COLUMNS).where(JobTaskRow.job_id.in_(bindparam("job_ids", expanding=True)))
                  .order_by(JobTaskRow.job_id, JobTaskRow.position))


class JobQueue:
    """The job queue of a records database (SQLRecordsStore.jobs): jobs over the database's tasks,
    their leases, progress and events."""

    def __init__(self, db: Database):
        self._db = db

    # ------------------------------------------------------------------ submit
    def submit(self, tasks: list[tuple[Task, float, float | None]], spec: dict, *, space: str, strategy: str,
               scheduler: str, trials: int, priority: int = 0, name: str | None = None) -> int:
        """Queue a job over `tasks` [(task, weight, flops)] (all on one target and device key);
        `spec` is the request as submitted, kept so a worker can rebuild everything from it."""
        if not tasks:
            raise StoreError("a job needs at least one task")
        targets = {(t.target, t.device_key) for t, _, _ in tasks}
        if len(targets) != 1:
            raise StoreError(f"the tasks of one job share a target and device key, got {sorted(targets)}")
        (target, device_key), = targets
        now = utcnow()
        keys = [self._db.workload_key(t.workload) for t, _, _ in tasks]
        # Core inserts, not the ORM's unit of work (its flush was a seventh of a submit's CPU)
        with self._db.session(write=True) as s:
            task_ids = [self._db.task_id(s, key, task.workload, task.target, task.device_key, canonical)
                        for (task, _, _), (key, canonical) in zip(tasks, keys)]
            conn = s.connection()
            job_id = conn.execute(insert(JobRow).returning(JobRow.id), dict(
                task_id=task_ids[0], name=name, spec=spec, state=JobState.QUEUED.value, target=target, device_key=device_key,
                space=space, strategy=strategy, scheduler=scheduler, priority=int(priority), trials=int(trials),
                trials_done=0, attempts=0, created_at=now, updated_at=now)).scalar_one()
            conn.execute(insert(JobTaskRow), [
                dict(job_id=job_id, position=pos, task_id=task_id, weight=float(weight),
                     flops=None if flops is None else float(flops), trials=0, batches=0, errors=0)
                for pos, ((_, weight, flops), task_id) in enumerate(zip(tasks, task_ids))])
            _event(s, job_id, "submitted", f"queued with {len(tasks)} task(s), {trials} trials", now=now)
        # committed: the job's first read (the API answers a submit with it) finds its tasks known
        self._db.task_cache.remember(TaskInfo(task_id, key, task.workload, task.target, task.device_key)
                                  for (task, _, _), (key, _), task_id in zip(tasks, keys, task_ids))
        return job_id

    # ------------------------------------------------------------------ workers
    def claim(self, worker: str, lease_seconds: float, device_keys: list[str] | None = None) -> Job | None:
        """Lease the next job (highest priority, then oldest) to `worker`; None when none waits.

        `device_keys`: only jobs measured on these device keys (None: any)."""
        now = utcnow()
        claimable = or_(JobRow.state == JobState.QUEUED.value,
                        and_(JobRow.state == JobState.RUNNING.value, JobRow.lease_expires_at < now))
        pick = select(JobRow.id).where(claimable)
        if device_keys is not None:
            pick = pick.where(JobRow.device_key.in_(sorted(set(device_keys))))
        pick = pick.order_by(JobRow.priority.desc(), JobRow.id).limit(1)
        values = dict(state=JobState.RUNNING.value, lease_owner=worker,
                      lease_expires_at=now + timedelta(seconds=lease_seconds), heartbeat_at=now,
                      attempts=JobRow.attempts + 1, started_at=func.coalesce(JobRow.started_at, now),
                      updated_at=now, error=None)
        with self._db.session(write=True) as s:
            if s.get_bind().dialect.name == "postgresql":
                # one statement: lock the next free row (skipping rows other claims hold), take it,
                # and return who held it before (a reclaim) from the locked subquery
                chosen = pick.add_columns(JobRow.lease_owner.label("previous")).with_for_update(skip_locked=True)
                chosen = chosen.subquery()
                got = s.execute(update(JobRow).where(JobRow.id == chosen.c.id).values(**values)
                                .returning(JobRow.id, chosen.c.previous)
                                .execution_options(synchronize_session=False)).first()
            else:
                # SQLite: this transaction holds the database's only write lock (BEGIN IMMEDIATE),
                # so nothing can change between the pick and the update
                got = s.execute(pick.add_columns(JobRow.lease_owner)).first()
                if got is not None:
                    s.execute(update(JobRow).where(JobRow.id == got[0]).values(**values)
                              .execution_options(synchronize_session=False))
            if got is None:
                return None
            claimed, previous_owner = got
            job = self._job(s, self._job_row(s, claimed))
            if previous_owner is not None:
                _event(s, claimed, "reclaimed", f"lease of {previous_owner} expired; claimed by {worker} "
                       f"(attempt {job.attempts}), resuming from its records", now=now,
                       data={"worker": worker, "previous": previous_owner})
            else:
                _event(s, claimed, "claimed", f"claimed by {worker} (attempt {job.attempts})", now=now,
                       data={"worker": worker})
            return job

    def renew_lease(self, job_id: int, worker: str, lease_seconds: float) -> JobState:
        """Extend `worker`'s lease; returns the job's state. Anything but RUNNING (cancelled by a
        user, or the lease lost to another worker: then the state is returned as it is, and
        `lease_owner` differs) tells the worker to stop."""
        now = utcnow()
        with self._db.session(write=True) as s:
            n = s.execute(update(JobRow).where(JobRow.id == job_id, JobRow.lease_owner == worker,
                                               JobRow.state == JobState.RUNNING.value)
                          .values(lease_expires_at=now + timedelta(seconds=lease_seconds), heartbeat_at=now)
                          .execution_options(synchronize_session=False)).rowcount
            if n == 1:
                return JobState.RUNNING
            row = self._job_row(s, job_id)
            if row.state == JobState.RUNNING.value:  # running, but another worker holds it now
                raise LeaseLost(f"job {job_id}: lease held by {row.lease_owner}, not {worker}")
            return JobState(row.state)

    def record_progress(self, job_id: int, worker: str, position: int, *, trials: int, batches: int,
                        best_cost: float | None, best_record_id: int | None, baseline_cost: float | None,
                        trials_done: int, lease_seconds: float, errors: int = 0, timings: int = 0,
                        disturbed_timings: int = 0, event: tuple[str, str, dict | None] | None = None,
                        more_events: tuple = ()) -> JobState:
        """A task's progress after a batch, and the job's trial count, written with a lease
        renewal in one transaction. Returns what renew_lease returns. `event` (kind, message,
        data), and `more_events` after it, are added in the same transaction, only while the job
        is still running: a batch that ends after the job was cancelled leaves no event after the
        "cancelled" one."""
        now = utcnow()
        with self._db.session(write=True) as s:
            n = s.execute(update(JobRow).where(JobRow.id == job_id, JobRow.lease_owner == worker,
                                               JobRow.state == JobState.RUNNING.value)
                          .values(lease_expires_at=now + timedelta(seconds=lease_seconds), heartbeat_at=now,
                                  trials_done=int(trials_done), updated_at=now)
                          .execution_options(synchronize_session=False)).rowcount
            if n == 1:
                s.execute(update(JobTaskRow).where(JobTaskRow.job_id == job_id, JobTaskRow.position == position)
                          .values(trials=int(trials), batches=int(batches), errors=int(errors), best_cost=best_cost,
                                  best_record_id=best_record_id, baseline_cost=baseline_cost, timings=int(timings),
                                  disturbed_timings=int(disturbed_timings), updated_at=now)
                          .execution_options(synchronize_session=False))
                for kind, message, data in ([event] if event is not None else []) + list(more_events):
                    _event(s, job_id, kind, message, now=now, data=data)
                return JobState.RUNNING
            row = self._job_row(s, job_id)
            if row.state == JobState.RUNNING.value:
                raise LeaseLost(f"job {job_id}: lease held by {row.lease_owner}, not {worker}")
            return JobState(row.state)

    def release_lease(self, job_id: int, worker: str, reason: str) -> bool:
        """`worker` gives its running job back (it is shutting down): the lease ends now, so the
        next claim resumes the job at once instead of after the lease would have expired."""
        now = utcnow()
        with self._db.session(write=True) as s:
            n = s.execute(update(JobRow).where(JobRow.id == job_id, JobRow.lease_owner == worker,
                                               JobRow.state == JobState.RUNNING.value)
                          .values(lease_expires_at=now, updated_at=now)
                          .execution_options(synchronize_session=False)).rowcount
            if n == 1:
                _event(s, job_id, "released", reason, now=now)
            return n == 1

    def reclaim_dead_local_leases(self, hostname: str | None = None) -> list[int]:
        """End now the leases of running jobs whose owner is a worker of this host that is provably
        dead, so the next claim resumes them at once (with its "reclaimed" event) instead of after
        the lease: a `tunefarm serve` restarted after a crash (SIGKILL, OOM) takes its job back in
        seconds, not a lease later. Only owners named `[label@]host:pid` with this host qualify
        (see `lease_owner_process`); anything else is left to expire. A host here is one pid
        namespace: containers sharing a hostname but not their pids need distinct worker names.
        Returns the ids of the jobs whose lease ended."""
        host = hostname or socket.gethostname()
        now = utcnow()
        with self._db.session() as s:
            rows = s.execute(select(JobRow.id, JobRow.lease_owner, JobRow.heartbeat_at)
                             .where(JobRow.state == JobState.RUNNING.value, JobRow.lease_expires_at >= now)).all()
        dead = [(r.id, r.lease_owner, pid) for r in rows
                if (pid := _local_owner_pid(r.lease_owner, host)) is not None and process_gone(pid, r.heartbeat_at)]
        if not dead:
            return []
        ended = []
        with self._db.session(write=True) as s:
            now = utcnow()
            for job_id, owner, pid in dead:
                n = s.execute(update(JobRow).where(JobRow.id == job_id, JobRow.lease_owner == owner,
                                                   JobRow.state == JobState.RUNNING.value)
                              .values(lease_expires_at=now, updated_at=now)
                              .execution_options(synchronize_session=False)).rowcount
                if n == 1:
                    _event(s, job_id, "owner_gone", f"worker {owner} is gone (process {pid} on {host} ended): "
                           "its lease ends now", now=now, data={"worker": owner, "pid": pid})
                    ended.append(job_id)
        return ended

    def finish(self, job_id: int, worker: str, state: str, error: str | None = None) -> bool:
        """`worker` ends its running job as done or failed (or cancelled, when it stopped on its
        own). False when the job was no longer its to end (cancelled meanwhile, or reclaimed)."""
        new = JobState(state)
        if new not in JOB_TRANSITIONS[JobState.RUNNING]:
            raise StoreError(f"a worker ends a job as done, failed or cancelled, not {new}")
        now = utcnow()
        with self._db.session(write=True) as s:
            n = s.execute(update(JobRow).where(JobRow.id == job_id, JobRow.lease_owner == worker,
                                               JobRow.state == JobState.RUNNING.value)
                          .values(state=new.value, error=error, finished_at=now, updated_at=now,
                                  lease_owner=None, lease_expires_at=None)
                          .execution_options(synchronize_session=False)).rowcount
            if n == 1:
                _event(s, job_id, new.value, error or f"{new.value} (worker {worker})", now=now)
            return n == 1

    # ------------------------------------------------------------------ users
    def cancel(self, job_id: int, reason: str = "cancelled by user") -> Job:
        """Cancel a queued or running job (its worker stops after its current batch)."""
        return self._transition(job_id, JobState.CANCELLED, "cancelled", reason,
                                extra={"finished_at": utcnow(), "lease_owner": None, "lease_expires_at": None})

    def resume(self, job_id: int) -> Job:
        """Queue a failed or cancelled job again; it continues from its records (nothing measured
        twice, its earlier trials count against its budget)."""
        return self._transition(job_id, JobState.QUEUED, "resumed", "queued again",
                                extra={"finished_at": None, "error": None, "lease_owner": None,
                                       "lease_expires_at": None})

    def set_state(self, job_id: int, state: str, error: str | None = None) -> Job:
        """Move a job along JOB_TRANSITIONS by hand (admin); StoreError if the move is not allowed."""
        try:
            new = JobState(state)
        except ValueError:
            raise StoreError(f"unknown job state {state!r}; states are {', '.join(JobState)}") from None
        extra: dict = {"error": error}
        if new in (JobState.DONE, JobState.FAILED, JobState.CANCELLED):
            extra.update(finished_at=utcnow(), lease_owner=None, lease_expires_at=None)
        return self._transition(job_id, new, new.value, error or f"set to {new.value}", extra=extra)

    def _transition(self, job_id: int, new: JobState, kind: str, message: str, extra: dict) -> Job:
        sources = [old.value for old, targets in JOB_TRANSITIONS.items() if new in targets]
        now = utcnow()
        with self._db.session(write=True) as s:
            n = s.execute(update(JobRow).where(JobRow.id == job_id, JobRow.state.in_(sources))
                          .values(state=new.value, updated_at=now, **extra)
                          .execution_options(synchronize_session=False)).rowcount
            if n != 1:
                current = JobState(self._job_row(s, job_id).state)
                allowed = ", ".join(sorted(JOB_TRANSITIONS[current])) or "none (final state)"
                raise JobStateError(f"job {job_id} is {current}: cannot go to {new}; allowed: {allowed}",
                                    current=current)
            _event(s, job_id, kind, message, now=now)
            return self._job(s, self._job_row(s, job_id))

    # ------------------------------------------------------------------ reading
    def get(self, job_id: int) -> Job:
        """The job with its tasks' progress and error count; UnknownJob if there is none."""
        with self._db.read() as s:
            return self._job(s, self._job_row(s, job_id))

    def read_polled(self, conn, job_id: int) -> tuple[Job, bool]:
        """(`get` on an open read, Database.read's ReadConnection; whether any of the job's
        measurements was re-taken or marked): what a polled job's page reads first, on the
        connection it reads those on if there are some (store.job_with_retakes)."""
        row = self._job_row(conn, job_id, POLLED_JOB_BY_ID)
        return self._job(conn, row), bool(row.retaken)

    def page(self, state: str | None = None, workload: str | None = None, target: str | None = None,
             before_id: int | None = None, limit: int = 50) -> list[Job]:
        """Jobs newest first, `limit` of them with ids below `before_id` (keyset paging: a page
        costs the same at the millionth job as at the first). `workload`: a workload key or
        operator name one of the job's tasks has."""
        stmt = _job_select().order_by(JobRow.id.desc()).limit(page_size(limit))
        if state is not None:
            try:
                stmt = stmt.where(JobRow.state == JobState(state).value)
            except ValueError:
                raise StoreError(f"unknown job state {state!r}; states are {', '.join(JobState)}") from None
        if target is not None:
            stmt = stmt.where(JobRow.target == target)
        if before_id is not None:
            stmt = stmt.where(JobRow.id < before_id)
        if workload is not None:
            has = (select(JobTaskRow.id).join(TaskRow, JobTaskRow.task_id == TaskRow.id)
                   .join(WorkloadRow, TaskRow.workload_key == WorkloadRow.key)
                   .where(JobTaskRow.job_id == JobRow.id, or_(WorkloadRow.key == workload, WorkloadRow.name == workload)))
            stmt = stmt.where(exists(has))
        with self._db.session() as s:
            return self._jobs(s, s.connection().execute(stmt).all())

    def count_by_state(self) -> dict[str, int]:
        """How many jobs are in each state, every state named (0 where none is)."""
        with self._db.session() as s:
            counts = dict(s.execute(select(JobRow.state, func.count(JobRow.id)).group_by(JobRow.state)).all())
        return {st.value: int(counts.get(st.value, 0)) for st in JobState}

    def add_event(self, job_id: int, kind: str, message: str, data: dict | None = None) -> None:
        """Append an event to job `job_id`'s log (what its page shows), in one transaction."""
        with self._db.session(write=True) as s:
            _event(s, job_id, kind, message, data=data)

    def events(self, job_id: int, after_id: int | None = None, limit: int = 200,
               kind: str | None = None) -> list[JobEvent]:
        """A job's events oldest first, those after event `after_id` (incremental polling), of
        one `kind` when given (a model job's "estimate" events are its latency curve)."""
        stmt = (select(JobEventRow).where(JobEventRow.job_id == job_id).order_by(JobEventRow.id)
                .limit(page_size(limit)))
        if after_id is not None:
            stmt = stmt.where(JobEventRow.id > after_id)
        if kind is not None:
            stmt = stmt.where(JobEventRow.kind == kind)
        with self._db.session() as s:
            self._job_row(s, job_id)
            return [JobEvent(e.id, e.job_id, e.at, e.kind, e.message, e.data) for e in s.execute(stmt).scalars()]

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _job_row(s: Session, job_id: int, stmt=_JOB_BY_ID):
        row = s.connection().execute(stmt, {"job_id": int(job_id)}).first()
        if row is None:
            raise UnknownJob(f"no job {job_id}")
        return row

    def _job(self, s: Session, row) -> Job:
        return self._jobs(s, [row])[0]

    def _jobs(self, s: Session, rows) -> list[Job]:
        """Jobs of rows of `_job_select()` with their tasks: one more statement for the whole page
        (not one per job); the tasks' workloads come from the store's task cache."""
        if not rows:
            return []
        tasks: dict[int, list[JobTask]] = {r.id: [] for r in rows}
        job_tasks = s.connection().execute(_TASKS_OF_JOBS, {"job_ids": list(tasks)}).all()
        infos = self._db.task_cache.get_many(s, {jt.task_id for jt in job_tasks})
        for jt in job_tasks:
            info = infos[jt.task_id]
            tasks[jt.job_id].append(JobTask(
                position=jt.position, task=info.task, workload_key=info.workload_key,
                weight=jt.weight, flops=jt.flops, trials=jt.trials, batches=jt.batches, errors=jt.errors,
                best_cost=jt.best_cost, best_record_id=jt.best_record_id, baseline_cost=jt.baseline_cost,
                timings=jt.timings or 0, disturbed_timings=jt.disturbed_timings or 0))
        return [Job(id=r.id, state=JobState(r.state), spec=dict(r.spec or {}), tasks=tuple(tasks[r.id]),
                    target=r.target, device_key=r.device_key, space=r.space, strategy=r.strategy,
                    scheduler=r.scheduler, priority=r.priority, trials=r.trials, trials_done=r.trials_done,
                    attempts=r.attempts, created_at=r.created_at, updated_at=r.updated_at, name=r.name,
                    started_at=r.started_at, finished_at=r.finished_at, heartbeat_at=r.heartbeat_at,
                    lease_owner=r.lease_owner, lease_expires_at=r.lease_expires_at, error=r.error,
                    errors=int(r.errors))
                for r in rows]


class UnknownJob(StoreError):
    """No job has this id."""


class JobStateError(StoreError):
    """The job is not in a state the requested change starts from."""

    def __init__(self, message: str, current: JobState):
        super().__init__(message)
        self.current = current


class LeaseLost(StoreError):
    """Another worker holds the job's lease now (this worker was presumed dead): stop, write nothing."""


def _event(s: Session, job_id: int, kind: str, message: str, now: datetime | None = None,
           data: dict | None = None) -> None:
    s.connection().execute(insert(JobEventRow), dict(job_id=job_id, at=now or utcnow(), kind=kind, message=message, data=data))


def page_size(limit: int) -> int:
    """`limit` checked against MAX_PAGE: no request reads an unbounded number of rows."""
    if not 1 <= int(limit) <= MAX_PAGE:
        raise StoreError(f"page size must be 1..{MAX_PAGE}, got {limit}")
    return int(limit)


# a process that started less than this after the owner's last heartbeat may still be the owner
# (start times are read to about a second; the owner claims within seconds of its start)
PID_REUSE_MARGIN = timedelta(seconds=5)


def lease_owner_process(owner: str | None) -> tuple[str, int] | None:
    """(host, pid) of a worker named `host:pid` (a worker's default name) or `label@host:pid` (the
    workers `tunefarm serve` starts, named after serve's pid: they die with it); None for any other
    name, whose process cannot be checked."""
    if not owner:
        return None
    host, sep, pid = owner.rpartition("@")[2].rpartition(":")
    return (host, int(pid)) if sep and host and pid.isdigit() and 0 < int(pid) < 2**31 else None


def _local_owner_pid(owner: str | None, host: str) -> int | None:
    found = lease_owner_process(owner)
    return found[1] if found is not None and found[0] == host else None


def process_gone(pid: int, alive_at: datetime | None) -> bool:
    """Whether process `pid` of this host, known alive at `alive_at`, has provably ended: no process
    has the pid, or a zombie has it, or the process that has it started after `alive_at` (the pid
    was reused: a restarted container gives its processes the same pids). In doubt (no /proc, a
    process of another user without its start time) it is alive: a wrong "gone" would run a job twice."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass                      # it exists, owned by someone else
    stat = _proc_stat(pid)
    if stat is None:
        return False
    state, started = stat
    return state in ("Z", "X") or (alive_at is not None and started > alive_at + PID_REUSE_MARGIN)


def _proc_stat(pid: int) -> tuple[str, datetime] | None:
    """A process's state letter and start time from /proc (Linux); None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()    # the command name may hold spaces and ")"
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        started = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")   # field 22: start, in ticks after boot
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return fields[0], datetime.fromtimestamp(started, timezone.utc)
