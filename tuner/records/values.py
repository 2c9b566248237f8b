"""The values the records store hands out: records, jobs, agents, and its one error type.

They are plain frozen dataclasses, detached from SQLAlchemy, so a caller (the search loop, the
cost model, the REST layer) never holds a session or triggers a lazy load after the store's
transaction has ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import StrEnum

from ..candidate import Candidate, MeasureResult
from ..workload import Task, Workload


class StoreError(RuntimeError):
    """The store cannot do what was asked: bad URL, unreachable database, bad input, bad transition."""


class UnknownRecord(StoreError):
    """No record has this id."""


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


# queued → running → done / failed / cancelled. A queued job may also be cancelled before it
# starts (a user withdrawing a submission); a failed or cancelled job may be resumed (queued
# again: it continues from its records). Done never changes again. A running job whose lease
# expired is claimed again without leaving `running` (JobQueue.claim).
JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.CANCELLED}),
    JobState.RUNNING: frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELLED}),
    JobState.DONE: frozenset(),
    JobState.FAILED: frozenset({JobState.QUEUED}),
    JobState.CANCELLED: frozenset({JobState.QUEUED}),
}
FINAL_STATES = frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELLED})


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class Record:
    """One measured candidate, with the task it was measured for."""

    workload_key: str
    workload: Workload
    target: str
    device_key: str
    candidate: Candidate
    result: MeasureResult
    job_id: int | None = None
    created_at: datetime = field(default_factory=utcnow)
    id: int | None = None
    retimed_cost: float | None = None  # median of the end-of-run re-measurement, if it had one
    beats_default: bool | None = None  # that re-measurement found it faster than the default beyond the noise

    @property
    def cost(self) -> float:
        """What apply-best ranks by: the re-measured cost when there is one, else the mean."""
        return self.retimed_cost if self.retimed_cost is not None else self.result.mean_cost

    @property
    def task(self) -> Task:
        return Task(self.workload, self.target, self.device_key)

    def gflops(self, flops: float) -> float:
        """Throughput for an operator of `flops` floating-point operations; 0.0 for an error record."""
        if not self.result.ok or not self.result.costs:
            return 0.0
        return flops / self.cost / 1e9


@dataclass(frozen=True)
class JobTask:
    """One task of a job and the progress its worker last wrote (costs in seconds)."""

    position: int
    task: Task
    workload_key: str
    weight: float
    flops: float | None = None
    trials: int = 0
    batches: int = 0
    errors: int = 0                 # measurements of this task in this job that failed
    best_cost: float | None = None
    best_record_id: int | None = None
    baseline_cost: float | None = None
    timings: int = 0                # valid timings of this task in this job (search, baseline, re-timing)
    disturbed_timings: int = 0      # of them, disturbed after the protocol's retries

    @property
    def disturbed_fraction(self) -> float:
        """Share of the task's timings that other processes disturbed (0: a quiet machine)."""
        return self.disturbed_timings / self.timings if self.timings else 0.0

    @property
    def best_gflops(self) -> float | None:
        if self.best_cost is None or not self.flops:
            return None
        return self.flops / self.best_cost / 1e9

    @property
    def speedup(self) -> float | None:
        """How many times faster than the operator's default schedule the best schedule is."""
        if self.best_cost is None or self.baseline_cost is None or self.best_cost <= 0:
            return None
        return self.baseline_cost / self.best_cost


@dataclass(frozen=True)
class Job:
    """A tuning job as stored: its spec, tasks, state, lease and progress."""

    id: int
    state: JobState
    spec: dict
    tasks: tuple[JobTask, ...]
    target: str
    device_key: str
    space: str
    strategy: str
    scheduler: str
    priority: int
    trials: int
    trials_done: int
    attempts: int
    created_at: datetime
    updated_at: datetime
    name: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    heartbeat_at: datetime | None = None
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    error: str | None = None
    errors: int = 0                 # its stored measurements that failed (records with an error code)

    @property
    def task(self) -> Task:
        """The first task (a single-task job's only one)."""
        return self.tasks[0].task


@dataclass(frozen=True)
class JobEvent:
    id: int
    job_id: int
    at: datetime
    kind: str
    message: str
    data: dict | None = None


@dataclass(frozen=True)
class TokenInfo:
    """An API token as stored (never its secret)."""

    id: int
    name: str
    scopes: frozenset[str]
    created_at: datetime
    last_used_at: datetime | None = None
    revoked_at: datetime | None = None


@dataclass(frozen=True)
class Agent:
    """A measuring device as last seen by the farm."""

    name: str
    device_key: str
    info: dict
    last_seen: datetime
