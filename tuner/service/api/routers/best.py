"""The best record of (workload, target): GFLOPS, speed-up over the default schedule, the
candidate, and its schedule lowered to loop IR (cached per record: see ..lowering); and the best
record of every task, a keyset page at a time (the dashboard's table of best schedules)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response

from .. import auth
from ..deps import MAX_ID, MAX_PAGE, Store
from ..errors import ApiError, responses
from ..respond import json_response
from ..schemas import BestOut, CandidateOut, RecordOut, TaskBestOut, TaskBestPage, workload_ref

router = APIRouter(prefix="/best", tags=["best"])


@router.get("/all", response_model=TaskBestPage, dependencies=[Depends(auth.read)], responses=responses(422),
            summary="The best record of every task (workload × target × device key), by task id")
def best_all(request: Request, store: Store,
             target: Annotated[str | None, Query(min_length=1, max_length=4096, description="only tasks on this target")] = None,
             after: Annotated[int | None, Query(ge=0, le=MAX_ID, description="page cursor: `next_after` of the last page")] = None,
             limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50) -> Response:
    """Best as /best ranks (a re-measured record first, by its re-measured cost; else by the
    mean), found with index lookups per task (see the store's best_per_task); tasks without a
    valid record yet are listed with nulls."""
    lowering = request.app.state.lowering
    items = []
    for tb in store.best_per_task(after_task_id=after, limit=limit, target=target):
        rec, base = tb.best, tb.baseline
        either = rec or base
        flops = lowering.flops(either) if either is not None else None
        cost = rec.cost if rec is not None else None
        base_cost = base.cost if base is not None else None
        items.append(TaskBestOut(task_id=tb.task_id, workload=workload_ref(tb.workload_key, tb.workload), target=tb.target,
                                 device_key=tb.device_key, record_id=rec.id if rec else None, kind=rec.candidate.kind if rec else None,
                                 cost=cost, flops=flops, gflops=flops / cost / 1e9 if flops and cost else None,
                                 baseline_record_id=base.id if base else None, baseline_cost=base_cost,
                                 speedup=base_cost / cost if base_cost and cost else None))
    return json_response(TaskBestPage(items=items, next_after=items[-1].task_id if len(items) == limit else None))


@router.get("", response_model=BestOut, dependencies=[Depends(auth.read)], responses=responses(404, 422),
            summary="The best record for a workload on a target")
def best(request: Request, store: Store,
         workload_key: Annotated[str, Query(min_length=1, max_length=64)],
         target: Annotated[str, Query(min_length=1, max_length=4096, description="target string, exactly as stored")],
         device_key: Annotated[str | None, Query(min_length=1, max_length=255, description="only records of this device key")] = None,
         ) -> Response:
    rec, baseline = store.best_with_baseline(workload_key, target, device_key=device_key)
    if rec is None:
        where = f" on device key {device_key!r}" if device_key else ""
        raise ApiError(404, f"no valid record of workload {workload_key} on target {target!r}{where}", field="workload_key")
    lowering = request.app.state.lowering
    flops = lowering.flops(rec)
    loop_ir, why = lowering.loop_ir(rec)

    def gflops(r):
        return flops / r.cost / 1e9 if flops and r is not None and r.cost > 0 else None

    return json_response(BestOut(workload=workload_ref(rec.workload_key, rec.workload), target=rec.target, record=RecordOut.of(rec),
                                 candidate=CandidateOut(kind=rec.candidate.kind, payload=rec.candidate.payload), flops=flops,
                                 gflops=gflops(rec), baseline=RecordOut.of(baseline) if baseline is not None else None,
                                 baseline_gflops=gflops(baseline),
                                 speedup=baseline.cost / rec.cost if baseline is not None and rec.cost > 0 else None,
                                 loop_ir=loop_ir, loop_ir_error=why))
