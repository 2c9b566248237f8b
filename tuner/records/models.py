"""SQLAlchemy models of the records store: workloads, tasks, jobs (with their tasks and events),
records, agents, API tokens.

Only portable column types (JSON, Text, Float, Integer, timestamps) so one schema serves the
embedded SQLite file and a shared PostgreSQL server. The schema itself is created by Alembic
(`migrations/versions`), never by `create_all`: the hand-written migration and these classes must
agree, and a test compares them.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Alembic's own bookkeeping table; named for us so a database shared with another Alembic-managed
# application does not mix version numbers.
VERSION_TABLE = "tunefarm_alembic_version"

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator):
    """A timestamp that always comes back timezone-aware in UTC.

    PostgreSQL keeps the zone (timestamptz); SQLite keeps text without one. Storing UTC and
    re-attaching the zone on the way out makes both back-ends return the same values.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class WorkloadRow(Base):
    """An operator at concrete shapes, keyed by its workload key (hash of the canonical text)."""

    __tablename__ = "workloads"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    params: Mapped[dict] = mapped_column(JSON)
    canonical: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # the compute DAG as JSON for workloads defined as data (NULL: an inventory operator)
    definition: Mapped[dict | None] = mapped_column(JSON, nullable=True)


class TaskRow(Base):
    """A workload on a target, measured on devices of one device key."""

    __tablename__ = "tasks"
    __table_args__ = (UniqueConstraint("workload_key", "target", "device_key"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_key: Mapped[str] = mapped_column(ForeignKey("workloads.key"))
    target: Mapped[str] = mapped_column(Text)
    device_key: Mapped[str] = mapped_column(String(255))
    # the task's records, kept as they are added (a listing sums these, never counts records)
    record_count: Mapped[int] = mapped_column(Integer, server_default="0")


class JobRow(Base):
    """A tuning job: its submitted spec over one or more tasks (JobTaskRow), its state along
    values.JOB_TRANSITIONS and, while running, the lease of the worker that runs it."""

    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint("state IN ('queued', 'running', 'done', 'failed', 'cancelled')", name="state"),
        Index("ix_jobs_state_priority_id", "state", "priority", "id"),   # the next job to claim
        Index("ix_jobs_state_id", "state", "id"),                        # newest first, by state
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)   # the first task
    name: Mapped[str | None] = mapped_column(Text, nullable=True)
    spec: Mapped[dict] = mapped_column(JSON, server_default=text("'{}'"))
    state: Mapped[str] = mapped_column(String(16))
    target: Mapped[str] = mapped_column(Text, server_default="")
    device_key: Mapped[str] = mapped_column(String(255), server_default="local")
    space: Mapped[str] = mapped_column(Text)
    strategy: Mapped[str] = mapped_column(String(64))
    scheduler: Mapped[str] = mapped_column(String(32), server_default="gradient")
    priority: Mapped[int] = mapped_column(Integer, server_default="0")
    trials: Mapped[int] = mapped_column(Integer)
    trials_done: Mapped[int] = mapped_column(Integer, server_default="0")
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    lease_owner: Mapped[str | None] = mapped_column(String(255), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)


class JobTaskRow(Base):
    """One task of a job, with its weight and the progress the worker last wrote."""

    __tablename__ = "job_tasks"
    __table_args__ = (UniqueConstraint("job_id", "position"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(Integer)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    weight: Mapped[float] = mapped_column(Float)
    flops: Mapped[float | None] = mapped_column(Float, nullable=True)   # of the operator, for GFLOPS
    trials: Mapped[int] = mapped_column(Integer, server_default="0")
    batches: Mapped[int] = mapped_column(Integer, server_default="0")
    errors: Mapped[int] = mapped_column(Integer, server_default="0")     # failed measurements
    timings: Mapped[int] = mapped_column(Integer, server_default="0")    # valid timings (search, baseline, re-measurement)
    disturbed_timings: Mapped[int] = mapped_column(Integer, server_default="0")  # of them, disturbed after retries
    best_cost: Mapped[float | None] = mapped_column(Float, nullable=True)
    best_record_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    baseline_cost: Mapped[float | None] = mapped_column(Float, nullable=True)
    updated_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class JobEventRow(Base):
    """Something that happened to a job (claimed, new best, lease lost, failed, ...)."""

    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job_id_id", "job_id", "id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict | None] = mapped_column(JSON, nullable=True)


class TokenRow(Base):
    """A bearer token of the REST API: only its SHA-256 is stored, with comma-separated scopes."""

    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


# the records a job page's "re-taken measurements" read (ix_records_job_id_retaken's predicate)
RETAKEN = "job_id IS NOT NULL AND (remeasured OR slow_window)"


class RecordRow(Base):
    """One measured candidate. `mean_cost` is the record's figure in seconds: the measurement
    protocol's median (compiler/timing.py; records from before it hold the mean of their
    repeats, hence the name). It is NULL for an error record, so ordering by it and filtering
    `IS NOT NULL` is how the best valid records are found on any back-end."""

    __tablename__ = "records"
    __table_args__ = (
        UniqueConstraint("task_id", "fingerprint"),
        Index("ix_records_task_id_mean_cost", "task_id", "mean_cost"),
        Index("ix_records_task_id_id", "task_id", "id"),          # a task's records, newest first
        Index("ix_records_error_code_id", "error_code", "id"),    # records of one error code, newest first
        # a task's best re-measured record; only re-measured records are indexed (migration 0007)
        Index("ix_records_task_id_retimed_cost", "task_id", "retimed_cost",
              postgresql_where=text("retimed_cost IS NOT NULL"), sqlite_where=text("retimed_cost IS NOT NULL")),
        # a job's records; records outside a job (imported, measured by a plain run) are not indexed
        Index("ix_records_job_id", "job_id", postgresql_where=text("job_id IS NOT NULL"),
              sqlite_where=text("job_id IS NOT NULL")),
        # a job's records taken again after a slow window, or marked (migration 0009): the few a job
        # page lists on every poll
        Index("ix_records_job_id_retaken", "job_id", "id", postgresql_where=text(RETAKEN),
              sqlite_where=text(RETAKEN)),
        # a task's records timed in a slow window, by figure (migration 0010): best() ranks them
        # last, in a statement of their own; the predicate as SQLAlchemy spells `IS true` on each
        Index("ix_records_task_id_mean_cost_slow", "task_id", "mean_cost",
              postgresql_where=text("slow_window IS true"), sqlite_where=text("slow_window IS 1")),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"))
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True)
    candidate_kind: Mapped[str] = mapped_column(String(16))
    candidate: Mapped[dict] = mapped_column(JSON)
    fingerprint: Mapped[str] = mapped_column(String(64))   # looked up with its task: the (task_id, fingerprint) index
    costs: Mapped[list] = mapped_column(JSON)
    mean_cost: Mapped[float | None] = mapped_column(Float, nullable=True)
    error_code: Mapped[int] = mapped_column(Integer)
    error_msg: Mapped[str] = mapped_column(Text)
    build_seconds: Mapped[float] = mapped_column(Float)
    run_seconds: Mapped[float] = mapped_column(Float)
    measured_by: Mapped[str] = mapped_column(String(255))
    # timed under an instruction-set emulator (a qemu-user board): labelled everywhere, and never
    # mixed with native timings in the cost model
    emulated: Mapped[bool] = mapped_column(Boolean, server_default=false(), default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # median cost of the interleaved re-measurement at the end of a run (top candidates only)
    retimed_cost: Mapped[float | None] = mapped_column(Float, nullable=True)
    retimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # the measurement protocol's summary (NULL: a record from before it, or an error)
    min_cost: Mapped[float | None] = mapped_column(Float, nullable=True)
    cost_spread: Mapped[float | None] = mapped_column(Float, nullable=True)
    samples: Mapped[int | None] = mapped_column(Integer, nullable=True)
    disturbed: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    lost_fraction: Mapped[float | None] = mapped_column(Float, nullable=True)
    host_busy: Mapped[float | None] = mapped_column(Float, nullable=True)
    # the re-measurement's spread of per-round figures, and whether it beat the default beyond the
    # noise (NULL: the default itself, or not re-measured); False ranks after the default
    retimed_spread: Mapped[float | None] = mapped_column(Float, nullable=True)
    beats_default: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    # timed in a window whose closing calibration found the measuring worker slow, and no healthy
    # worker could measure it again (device_agent/calibration.py): ranked after every unmarked record
    slow_window: Mapped[bool] = mapped_column(Boolean, server_default=false(), default=False)
    # measured again in a fresh worker after its first worker's window calibrated slow (the figure is
    # the fresh worker's); with either mark, the speed index of the calibration that found it slow
    remeasured: Mapped[bool] = mapped_column(Boolean, server_default=false(), default=False)
    slow_index: Mapped[float | None] = mapped_column(Float, nullable=True)


class CalibrationRow(Base):
    """One calibration of a measuring worker (device_agent/calibration.py): the speeds of the fixed
    calibration kernels, per device key and host; a device's history is what a new calibration is
    judged against."""

    __tablename__ = "calibrations"
    __table_args__ = (Index("ix_calibrations_device_key_host_id", "device_key", "host", "id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    device_key: Mapped[str] = mapped_column(String(255))
    host: Mapped[str] = mapped_column(String(255))
    version: Mapped[int] = mapped_column(Integer)
    threads: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    fma_1: Mapped[float] = mapped_column(Float)          # GFLOPS of the FMA tile, one thread
    fma_n: Mapped[float] = mapped_column(Float)          # ... on `threads`
    stream_1: Mapped[float] = mapped_column(Float)       # GB/s of the stream, one thread
    stream_n: Mapped[float] = mapped_column(Float)
    sync_n: Mapped[float | None] = mapped_column(Float, nullable=True)   # M barriers/s of the team (none on 1 thread)
    disturbed: Mapped[list] = mapped_column(JSON)        # the metrics other processes disturbed
    speed_index: Mapped[float | None] = mapped_column(Float, nullable=True)   # against the history before it
    state: Mapped[str] = mapped_column(String(16))       # healthy, slow or unknown


class AgentRow(Base):
    """A measuring device as last seen."""

    __tablename__ = "agents"
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    device_key: Mapped[str] = mapped_column(String(255), index=True)
    info: Mapped[dict] = mapped_column(JSON)
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime)
