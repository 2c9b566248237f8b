"""Response models of the REST API: the OpenAPI document is the contract, so every response has one.

They are built from the store's frozen values (tuner.records.values) by the `of` constructors
here, never from SQL rows, so the API shows exactly what the store hands out. Floats that may be
non-finite in stored data (an error record's mean cost, an imported NaN) are sent as null: JSON
has no Infinity, and a schema that says `number` must not see one. A workload's compute DAG is
never echoed in lists (it can be large): `is_compute` says it has one.
"""

from __future__ import annotations

import math
from dataclasses import fields
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from device_agent.calibration import SLOW_RATIO

from ...candidate import ErrorCode
from ...records.values import Agent, Job, JobEvent, JobState, JobTask, Record

# a number JSON cannot carry (inf, NaN) is written as null: pydantic's default ser_json_inf_nan="null"
# (no per-value validator: a Python callback per number was a third of building a page of records)
Num = float | None
State = Literal["queued", "running", "done", "failed", "cancelled"]


# ------------------------------------------------------------------------------------ errors

class ValidationIssue(BaseModel):
    """One problem pydantic found in the request (FastAPI's format)."""

    model_config = ConfigDict(extra="allow")
    loc: list[str | int]
    msg: str
    type: str


class ErrorOut(BaseModel):
    """Every error response: `detail` says what is wrong (a list of issues for request validation,
    FastAPI's format), `field` names the request field when one is to blame, `state` is a job's
    current state when that is why a change was refused."""

    detail: str | list[ValidationIssue]
    field: str | None = None
    state: State | None = None


# ------------------------------------------------------------------------------------ shared

class WorkloadRef(BaseModel):
    """A workload without its (possibly large) compute DAG."""

    key: str
    name: str
    params: dict[str, Any]
    is_compute: bool = Field(description="defined as a compute DAG (JSON) rather than an inventory operator")


def workload_ref(key: str, workload) -> WorkloadRef:
    return WorkloadRef(key=key, name=workload.name, params=dict(workload.params), is_compute=workload.definition is not None)


class CandidateOut(BaseModel):
    kind: str = Field(description="config (template), trace (sketch) or default (the operator's default schedule)")
    payload: dict[str, Any]


# ------------------------------------------------------------------------------------ jobs

class JobTaskOut(BaseModel):
    """One task of a job with the progress its worker last wrote (costs in seconds)."""

    position: int
    workload: WorkloadRef
    target: str
    device_key: str
    weight: float
    flops: Num = None
    trials: int
    batches: int
    errors: int = Field(0, description="failed measurements of this task, as its worker counted them")
    best_cost: Num = None
    best_gflops: Num = None
    best_record_id: int | None = None
    baseline_cost: Num = Field(default=None, description="the default schedule's cost")
    speedup: Num = Field(default=None, description="baseline_cost / best_cost")
    timings: int = Field(0, description="valid timings of this task in this job (search, baseline, end-of-run re-timing)")
    disturbed_fraction: float = Field(0.0, ge=0, le=1, description="share of those timings that other processes on the "
                                      "host disturbed even after retries (0 on a quiet machine): figures measured on a "
                                      "busy machine")
    remeasured: int = Field(0, description="records of this task measured again in a fresh worker after a slow window "
                            "(in a job's own view; 0 in lists)")
    slow_window: int = Field(0, description="records of this task kept but marked: timed in a slow window no healthy "
                             "worker could take again (in a job's own view; 0 in lists)")

    @classmethod
    def of(cls, t: JobTask, retaken: dict | None = None) -> JobTaskOut:
        counts = (retaken or {}).get(t.position) or {}
        return cls(position=t.position, workload=workload_ref(t.workload_key, t.task.workload), target=t.task.target,
                   device_key=t.task.device_key, weight=t.weight, flops=t.flops, trials=t.trials, batches=t.batches,
                   errors=t.errors,
                   best_cost=t.best_cost, best_gflops=t.best_gflops, best_record_id=t.best_record_id,
                   baseline_cost=t.baseline_cost, speedup=t.speedup, timings=t.timings,
                   disturbed_fraction=t.disturbed_fraction, remeasured=counts.get("remeasured", 0),
                   slow_window=counts.get("slow_window", 0))


class RetakenOut(BaseModel):
    """One window of a job's measurements that the measuring worker's closing calibration found
    slow: its records measured again in a fresh worker, or (no healthy worker to be had) kept but
    marked and ranked after every unmarked record."""

    position: int | None = Field(default=None, description="the task's position in the job")
    measured_by: str = Field(description="the agent (or 'local') whose worker was slow")
    kind: Literal["remeasured", "slow_window"]
    count: int = Field(description="records of the window")
    slow_index: Num = Field(default=None, description="the calibration's speed index: the share of the device's usual "
                            "speed it ran at (below 0.8 is slow)")
    first_at: datetime
    last_at: datetime
    reason: str = Field(description="what happened and why, in words")

    @classmethod
    def of(cls, w: dict) -> RetakenOut:
        index = w.get("slow_index")
        speed = f"at {index:.2f} of this device's usual speed" if index is not None else "slow"
        if w["kind"] == "remeasured":
            reason = (f"the measuring worker calibrated {speed} after this window (slow: below {SLOW_RATIO:g}); "
                      f"the window was measured again in a fresh worker process")
        else:
            reason = (f"the measuring worker calibrated {speed} after this window, and fresh workers were slow too "
                      f"(the device is degraded): the figures are kept but marked, and rank after every unmarked one")
        return cls(position=w.get("position"), measured_by=w["measured_by"], kind=w["kind"], count=w["count"],
                   slow_index=finite(index), first_at=w["first_at"], last_at=w["last_at"], reason=reason)


class CurvePoint(BaseModel):
    """One point of a model job's estimated end-to-end latency (Σ weight × best of its tasks)."""

    trials: int = Field(description="the job's search trials when the estimate was written")
    seconds: float
    final: bool = Field(False, description="the estimate from the bests re-measured at the end of the run")


class AllocationOut(BaseModel):
    """What the task scheduler gave one task of a model job."""

    position: int
    workload: str
    weight: float
    trials: int
    batches: int
    share: Num = Field(default=None, description="this task's share of the job's search trials so far")


class ModelJobOut(BaseModel):
    """A model job's model, the scheduler's allocation and the estimated latency (seconds).

    The estimate is the sum over the tasks of weight × best kernel latency: kernel timings added
    up, not a timing of the whole model (`tunefarm model run` times that)."""

    name: str
    file_name: str | None = None
    bytes: int
    sha256: str
    nodes: int
    kernels: int
    input_shapes: dict[str, list[int]]
    estimated_seconds: Num = Field(default=None, description="Σ weight × best cost, once every task has one")
    default_seconds: Num = Field(default=None, description="Σ weight × default schedule's cost")
    speedup: Num = Field(default=None, description="default_seconds / estimated_seconds")
    allocation: list[AllocationOut]
    curve: list[CurvePoint] = Field(default_factory=list, description="the estimate as it fell, oldest first (a "
                                    "point each time it moved by 1 %, and the final one); only in a job's own view")

    @classmethod
    def of(cls, job: Job, curve: list[JobEvent] | None = None) -> ModelJobOut | None:
        source = (job.spec or {}).get("model")
        if not source:
            return None

        def weighted(attr):
            costs = [getattr(t, attr) for t in job.tasks]
            if any(c is None for c in costs):
                return None
            return sum(t.weight * c for t, c in zip(job.tasks, costs))

        est, base = weighted("best_cost"), weighted("baseline_cost")
        total = sum(t.trials for t in job.tasks)
        allocation = [AllocationOut(position=t.position, workload=t.task.workload.name, weight=t.weight, trials=t.trials,
                                    batches=t.batches, share=t.trials / total if total else None) for t in job.tasks]
        points = [CurvePoint(trials=int(e.data["trials"]), seconds=float(e.data["seconds"]),
                             final=bool(e.data.get("final", False)))
                  for e in curve or [] if e.data and "seconds" in e.data]
        return cls(**source, estimated_seconds=est, default_seconds=base,
                   speedup=base / est if est and base else None, allocation=allocation, curve=points)


class JobOut(BaseModel):
    """A job: state, progress, per-task best and baseline, lease, timings and error."""

    id: int
    name: str | None = None
    state: State
    target: str
    device_key: str
    space: str
    strategy: str
    scheduler: str
    priority: int
    trials: int
    trials_done: int
    progress: float = Field(description="trials_done / trials, 0..1")
    attempts: int = Field(description="how many times a worker claimed it")
    error: str | None = None
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    heartbeat_at: datetime | None = None
    tasks: list[JobTaskOut]
    spec: dict[str, Any] | None = Field(default=None, description="the submitted spec (in a job's own view, not in lists)")
    errors: int = Field(description="how many of its stored measurements failed")
    model: ModelJobOut | None = Field(default=None, description="a model job's model, allocation and estimated "
                                                                "latency (null for other jobs)")
    retaken: list[RetakenOut] | None = Field(default=None, description="when the job's measurements were re-taken (or "
                                             "marked) and why, newest window first (in a job's own view; null in lists)")
    retaken_capped: bool = Field(default=False, description="the job has more marked records than the view reads: "
                                 "`retaken` lists its newest windows only")

    @classmethod
    def of(cls, job: Job, with_spec: bool = True, curve: list[JobEvent] | None = None,
           retaken: dict | None = None) -> JobOut:
        """`retaken`: the store's job_retakes (a job's own view)."""
        progress = min(1.0, job.trials_done / job.trials) if job.trials > 0 else 0.0
        per_task = retaken["tasks"] if retaken else None
        return cls(**_stored_as_shown(job), state=JobState(job.state).value, progress=progress,
                   tasks=[JobTaskOut.of(t, per_task) for t in job.tasks], spec=job.spec if with_spec else None,
                   model=ModelJobOut.of(job, curve),
                   retaken=[RetakenOut.of(w) for w in retaken["windows"]] if retaken else None,
                   retaken_capped=bool(retaken and retaken["capped"]))


_SHOWN_OTHERWISE = frozenset({"state", "tasks", "spec"})   # JobOut.of converts these


def _stored_as_shown(job: Job) -> dict:
    """The stored job's fields that JobOut shows as they are (by name: a field added to both is
    shown without another line here)."""
    return {f.name: getattr(job, f.name) for f in fields(job)
            if f.name in JobOut.model_fields and f.name not in _SHOWN_OTHERWISE}


class JobPage(BaseModel):
    """Jobs newest first; pass `next_before` as `before` for the next page (null: no more)."""

    items: list[JobOut]
    next_before: int | None = None


class EventOut(BaseModel):
    id: int
    job_id: int
    at: datetime
    kind: str
    message: str
    data: dict[str, Any] | None = None

    @classmethod
    def of(cls, e: JobEvent) -> EventOut:
        return cls(id=e.id, job_id=e.job_id, at=e.at, kind=e.kind, message=e.message, data=e.data)


class EventPage(BaseModel):
    """A job's events oldest first; poll again with `after=next_after`."""

    items: list[EventOut]
    next_after: int | None = Field(default=None, description="the last event's id (or the `after` given, when nothing is new)")


# ------------------------------------------------------------------------------------ records

class ResultOut(BaseModel):
    costs: list[Num] = Field(description="seconds per timing; empty for an error")
    mean_cost: Num = None
    error_code: int
    error_name: str | None = Field(default=None, description="the ErrorCode's name, when this tunefarm knows the code")
    error_msg: str
    build_seconds: Num = None
    run_seconds: Num = None
    measured_by: str
    emulated: bool = Field(default=False, description="timed by an agent that runs emulated (an aarch64 board under "
                           "qemu-user): the emulator's speed, not the device's; never compared with native timings")
    slow_window: bool = Field(default=False, description="timed in a window whose closing calibration found the measuring "
                              "worker slow, and no healthy worker could take it again: kept, but ranked after every "
                              "unmarked record")
    remeasured: bool = Field(default=False, description="measured again in a fresh worker after its first worker's "
                             "window calibrated slow (the figure is the fresh worker's)")
    slow_index: Num = Field(default=None, description="with slow_window or remeasured: the speed index (share of the "
                            "device's usual speed) of the calibration that found the window slow")


_ERROR_NAMES = {int(c): c.name for c in ErrorCode}


def error_name(code: int) -> str | None:
    """The ErrorCode's name; None for a code added by a newer tunefarm."""
    return _ERROR_NAMES.get(code)


class RecordOut(BaseModel):
    """One measured candidate with its task, result and timings."""

    id: int
    workload: WorkloadRef
    target: str
    device_key: str
    job_id: int | None = None
    candidate: CandidateOut
    result: ResultOut
    retimed_cost: Num = Field(default=None, description="median of the end-of-run re-measurement, if it had one")
    cost: Num = Field(default=None, description="what best-of ranks by: retimed_cost, else the mean")
    created_at: datetime

    @classmethod
    def of(cls, r: Record) -> RecordOut:
        """The model of record_json(r): one spelling of a record's fields for both."""
        return cls.model_validate(record_json(r))


def record_json(r: Record) -> dict:
    """A record's RecordOut fields as plain data, which RecordOut.of validates (a records page
    writes the same fields from its rows: record_page). Floats that are not finite are null and
    times are UTC with a Z, as pydantic writes them."""
    res = r.result
    code = int(res.error_code)
    ok = res.ok and bool(res.costs)
    wl = r.workload
    return {"id": r.id,
            "workload": {"key": r.workload_key, "name": wl.name, "params": dict(wl.params), "is_compute": wl.definition is not None},
            "target": r.target, "device_key": r.device_key, "job_id": r.job_id,
            "candidate": {"kind": r.candidate.kind, "payload": r.candidate.payload},
            "result": {"costs": [finite(c) for c in res.costs], "mean_cost": finite(res.mean_cost) if ok else None,
                       "error_code": code, "error_name": error_name(code), "error_msg": res.error_msg,
                       "build_seconds": finite(res.build_seconds), "run_seconds": finite(res.run_seconds),
                       "measured_by": res.measured_by, "emulated": bool(res.emulated),
                       "slow_window": bool(res.slow_window), "remeasured": bool(res.remeasured),
                       "slow_index": finite(res.slow_index) if res.slow_window or res.remeasured else None},
            "retimed_cost": finite(r.retimed_cost), "cost": finite(r.cost) if ok else None,
            "created_at": utc_text(r.created_at)}


def finite(x) -> float | None:
    """x as a float; None for None and for what is not finite (JSON has neither NaN nor Infinity)."""
    return float(x) if x is not None and math.isfinite(x) else None


def utc_text(at: datetime) -> str:
    """ISO 8601 in UTC with a Z, as pydantic writes a datetime. A time already in UTC (what the
    databases return) is written without converting it, a fifth of a records page's formatting."""
    if at.utcoffset() != _NO_OFFSET:
        at = at.astimezone(timezone.utc)
    return f"{at.replace(tzinfo=None).isoformat()}Z"


_NO_OFFSET = timedelta(0)


def _none(value) -> bool:
    return value is None


class RecordPage(BaseModel):
    """Records in the requested order. Newest first (the default): pass `next_before` as `before`
    for the next page (null: no more). Oldest first: `next_after` as `after`. Fastest first:
    `next_after_cost` as `after_cost` and `next_after` as `after`. The cursors of the other
    orders are left out of the response."""

    items: list[RecordOut]
    next_before: int | None = None
    next_after: int | None = Field(default=None, exclude_if=_none, description="order=oldest|fastest: the next page's `after`")
    next_after_cost: float | None = Field(default=None, exclude_if=_none,
                                          description="order=fastest: the next page's `after_cost` (the last record's mean cost)")


class ImportOut(BaseModel):
    added: int = Field(description="records that were new (the others were already stored)")


class BestOut(BaseModel):
    """The best record of (workload, target): its throughput, speed-up and lowered code."""

    workload: WorkloadRef
    target: str
    record: RecordOut
    candidate: CandidateOut
    flops: Num = Field(default=None, description="floating-point operations of the workload")
    gflops: Num = None
    baseline: RecordOut | None = Field(default=None, description="the default schedule's record, if measured")
    baseline_gflops: Num = None
    speedup: Num = Field(default=None, description="baseline cost / best cost")
    loop_ir: str | None = Field(default=None, description="the best schedule lowered to loop IR")
    loop_ir_error: str | None = Field(default=None, description="why the loop IR could not be made")


# ------------------------------------------------------------------------------------ dashboard

class MeasurementOut(BaseModel):
    """One measured candidate of a job, compact: what a convergence chart needs and no more."""

    id: int = Field(description="the record's id")
    seconds: float = Field(description="when it was stored, in seconds since the job was created")
    position: int | None = Field(description="position of its task in the job")
    cost: Num = Field(description="mean seconds per run; null for an error")
    gflops: Num = Field(description="from the task's flop count; null for an error")
    error_code: int
    kind: str = Field(description="candidate kind: config, trace, or default (the baseline)")


class MeasurementPage(BaseModel):
    """A job's measurements oldest first; poll again with `after=next_after`."""

    items: list[MeasurementOut]
    next_after: int | None = Field(default=None, description="the last item's id (or the `after` given, when nothing is new)")


class RecordIROut(BaseModel):
    """A record's schedule lowered to loop IR, or why it could not be."""

    record_id: int
    loop_ir: str | None = None
    loop_ir_error: str | None = None


class TaskBestOut(BaseModel):
    """A task (workload × target × device key) with its best valid record (re-measured first, as /best ranks)."""

    task_id: int
    workload: WorkloadRef
    target: str
    device_key: str
    record_id: int | None = Field(default=None, description="null: no valid record yet")
    kind: str | None = Field(default=None, description="the best record's candidate kind")
    cost: Num = Field(default=None, description="the best record's cost (re-measured, else mean)")
    flops: Num = None
    gflops: Num = None
    baseline_record_id: int | None = None
    baseline_cost: Num = Field(default=None, description="the default schedule's cost")
    speedup: Num = Field(default=None, description="baseline_cost / cost")


class TaskBestPage(BaseModel):
    """Tasks by id; pass `next_after` as `after` for the next page (null: no more)."""

    items: list[TaskBestOut]
    next_after: int | None = None


# ------------------------------------------------------------------------------------ catalogue

class WorkloadOut(WorkloadRef):
    records: int


class WorkloadPage(BaseModel):
    """Workloads by key; pass `next_after` as `after` for the next page (null: no more)."""

    items: list[WorkloadOut]
    next_after: str | None = None


class TargetOut(BaseModel):
    target: str
    tasks: int
    workloads: int
    device_keys: list[str]
    records: int


class TargetPage(BaseModel):
    """Targets in order; pass `next_after` as `after` for the next page (null: no more)."""

    items: list[TargetOut]
    next_after: str | None = None


# ------------------------------------------------------------------------------------ farm

class FarmAgentOut(BaseModel):
    """An agent as the tracker reports it (slots, queues, counts) or as the store last saw it."""

    name: str
    device_key: str
    last_seen: datetime | None = None
    last_seen_seconds_ago: Num = None
    info: dict[str, Any] = Field(default_factory=dict, description="device description (cpu, cores, ...)")
    slots: int | None = None
    in_flight: int | None = None
    completed: int | None = None
    failed: int | None = None
    leases_lost: int | None = None
    draining: bool | None = None
    health: Literal["healthy", "slow", "degraded", "unknown"] | None = Field(
        default=None, description="from the agent's measuring workers' calibrations (tracker only): degraded agents get "
        "no work until a calibration shows they recovered; unknown: nothing judged yet, or an agent that does not calibrate")
    speed_index: Num = Field(default=None, description="its latest calibration against its host's usual speeds (1.0: as "
                             "fast as usual; below 0.8: slow); null before anything was judged")
    slow_windows: int | None = Field(default=None, description="windows whose closing calibration found its worker slow")
    remeasured: int | None = Field(default=None, description="requests it measured again in a fresh worker")
    replacements: int | None = Field(default=None, description="measuring workers it replaced for being slow")

    @classmethod
    def of_store(cls, a: Agent, now: datetime) -> FarmAgentOut:
        return cls(name=a.name, device_key=a.device_key, last_seen=a.last_seen,
                   last_seen_seconds_ago=max(0.0, (now - a.last_seen).total_seconds()), info=dict(a.info))


class FarmKeyOut(BaseModel):
    device_key: str
    agents: int
    queued: int | None = Field(default=None, description="requests waiting (tracker only)")
    in_flight: int | None = None
    completed: int | None = None
    degraded: int | None = Field(default=None, description="agents of the key that get no work until they recover (tracker only)")


class FarmOut(BaseModel):
    source: Literal["tracker", "store"] = Field(description="tracker: live summary; store: agents as last recorded")
    tracker_version: str | None = None
    protocol_version: int | None = None
    uptime_seconds: Num = None
    agents: list[FarmAgentOut]
    keys: list[FarmKeyOut]


# ------------------------------------------------------------------------------------ health

class HealthOut(BaseModel):
    status: Literal["ok"] = "ok"


class ReadyOut(BaseModel):
    status: Literal["ready"] = "ready"
    database: str = Field(description="the database back-end (sqlite, postgresql)")
