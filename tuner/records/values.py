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


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


# queued → running → done / failed / cancelled. A queued job may also be cancelled before it
# starts (a user withdrawing a submission); terminal states never change again.
JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.CANCELLED}),
    JobState.RUNNING: frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELLED}),
    JobState.DONE: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


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
class Job:
    """A tuning job as stored: its task, search set-up, state and liveness."""

    id: int
    task: Task
    state: JobState
    space: str
    strategy: str
    trials: int
    created_at: datetime
    updated_at: datetime
    heartbeat_at: datetime | None = None
    error: str | None = None


@dataclass(frozen=True)
class Agent:
    """A measuring device as last seen by the farm."""

    name: str
    device_key: str
    info: dict
    last_seen: datetime
