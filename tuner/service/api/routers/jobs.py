"""Jobs: submit, list (keyset pages, newest first), show, cancel, resume, events, and the compact
measurements a job's convergence charts are drawn from.

A submission is checked completely (pydantic for shapes and ranges, spec.resolve for what needs
the compiler: operators, parameters, target, space, and that this host can run a 'local' job's
target) before anything is stored; a SpecError becomes a 422 naming the field. A farm job is also
refused when the app's tracker has agents of its device key and none of them can run its target
(runnable.py). The API only queues the job: workers claim and run it.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response

from ....records.store import MAX_MEASUREMENTS
from ...spec import JobSpec, SpecError, resolve
from .. import auth
from ..deps import MAX_ID, MAX_PAGE, Settings, Store
from ..errors import ApiError, responses
from ..respond import json_response
from ..runnable import farm_refusal
from ..schemas import EventOut, EventPage, JobOut, JobPage, MeasurementOut, MeasurementPage, State

router = APIRouter(prefix="/jobs", tags=["jobs"])

JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="job id")]


@router.post("", status_code=201, response_model=JobOut, dependencies=[Depends(auth.submit)],
             responses=responses(400, 409, 413, 422), summary="Submit a tuning job")
def submit_job(spec: JobSpec, store: Store, settings: Settings, request: Request, response: Response) -> JobOut:
    """Queue a job over one or several workloads (inventory operators or compute DAGs as JSON)."""
    try:
        resolved = resolve(spec)
    except SpecError as e:
        raise ApiError(422, e.message, field=e.field) from None
    if spec.device_key != "local" and settings.tracker:
        refusal = farm_refusal(settings.tracker, settings.tracker_token, spec.device_key, resolved.tasks[0].target)
        if refusal is not None:
            raise ApiError(422, refusal, field="target")
    job_id = store.jobs.submit(resolved.store_rows(), spec.model_dump(mode="json"), space=spec.space,
                               strategy=resolved.strategy, scheduler=spec.scheduler, trials=spec.trials,
                               priority=spec.priority, name=spec.name)
    response.headers["Location"] = str(request.url_for("get_job", job_id=job_id))
    return JobOut.of(store.jobs.get(job_id))


@router.get("", response_model=JobPage, dependencies=[Depends(auth.read)], responses=responses(422),
            summary="List jobs, newest first")
def list_jobs(store: Store,
              state: Annotated[State | None, Query(description="only jobs in this state")] = None,
              workload: Annotated[str | None, Query(max_length=255, description="a workload key or operator name")] = None,
              target: Annotated[str | None, Query(max_length=4096)] = None,
              before: Annotated[int | None, Query(ge=1, le=MAX_ID, description="page cursor: `next_before` of the last page")] = None,
              limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50) -> Response:
    jobs = store.jobs.page(state=state, workload=workload, target=target, before_id=before, limit=limit)
    return json_response(JobPage(items=[JobOut.of(j, with_spec=False) for j in jobs],
                                 next_before=jobs[-1].id if len(jobs) == limit else None))


@router.get("/{job_id}", response_model=JobOut, dependencies=[Depends(auth.read)], responses=responses(404, 422),
            summary="A job: state, progress, best so far per task, baseline, errors, timings, re-taken measurements")
def get_job(job_id: JobId, store: Store) -> Response:
    """A model job (POST /jobs/model) also has `model`: its tasks' allocation and the estimated
    end-to-end latency curve (the job's "estimate" events). `retaken` lists the windows of its
    measurements that a measuring worker's calibration found slow: when, on which agent, at what
    speed, and whether they were measured again in a fresh worker or kept but marked."""
    job, retaken = store.job_with_retakes(job_id)
    curve = store.jobs.events(job_id, kind="estimate", limit=MAX_PAGE) if (job.spec or {}).get("model") else None
    return json_response(JobOut.of(job, curve=curve, retaken=retaken))


@router.post("/{job_id}/cancel", response_model=JobOut, dependencies=[Depends(auth.submit)],
             responses=responses(404, 409, 422), summary="Cancel a queued or running job")
def cancel_job(job_id: JobId, store: Store) -> JobOut:
    """A running job's worker stops after its current batch."""
    return JobOut.of(store.jobs.cancel(job_id))


@router.post("/{job_id}/resume", response_model=JobOut, dependencies=[Depends(auth.submit)],
             responses=responses(404, 409, 422), summary="Queue a failed or cancelled job again")
def resume_job(job_id: JobId, store: Store) -> JobOut:
    """It continues from its records: nothing is measured twice."""
    return JobOut.of(store.jobs.resume(job_id))


@router.get("/{job_id}/events", response_model=EventPage, dependencies=[Depends(auth.read)],
            responses=responses(404, 422), summary="A job's events, oldest first (poll with `after`)")
def job_events(job_id: JobId, store: Store,
               after: Annotated[int | None, Query(ge=0, le=MAX_ID, description="only events after this id")] = None,
               limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 200) -> Response:
    events = store.jobs.events(job_id, after_id=after, limit=limit)
    return json_response(EventPage(items=[EventOut.of(e) for e in events], next_after=events[-1].id if events else after))


@router.get("/{job_id}/measurements", response_model=MeasurementPage, dependencies=[Depends(auth.read)],
            responses=responses(404, 422), summary="A job's measurements, oldest first, compact (for charts; poll with `after`)")
def job_measurements(job_id: JobId, store: Store,
                     after: Annotated[int | None, Query(ge=0, le=MAX_ID, description="only records after this id")] = None,
                     limit: Annotated[int, Query(ge=1, le=MAX_MEASUREMENTS)] = 1000) -> Response:
    """Every record the job measured (its baselines too, kind `default`) with its time since the
    job was created, its task's position, cost, GFLOPS and error code: one bounded query."""
    created, rows = store.job_measurements(job_id, after_id=after, limit=limit)
    items = [MeasurementOut(id=r["id"], seconds=max(0.0, (r["created_at"] - created).total_seconds()), position=r["position"],
                            cost=r["mean_cost"], gflops=_gflops(r["flops"], r["mean_cost"]), error_code=r["error_code"],
                            kind=r["candidate_kind"])
             for r in rows]
    return json_response(MeasurementPage(items=items, next_after=rows[-1]["id"] if rows else after))


def _gflops(flops: float | None, cost: float | None) -> float | None:
    return flops / cost / 1e9 if flops and cost and cost > 0 else None
