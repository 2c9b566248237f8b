"""The best record of (workload, target): GFLOPS, speed-up over the default schedule, the
candidate, and its schedule lowered to loop IR (cached per record: see ..lowering)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from .. import auth
from ..deps import Store
from ..errors import ApiError, responses
from ..schemas import BestOut, CandidateOut, RecordOut, workload_ref

router = APIRouter(prefix="/best", tags=["best"])


@router.get("", response_model=BestOut, dependencies=[Depends(auth.read)], responses=responses(404, 422),
            summary="The best record for a workload on a target")
def best(request: Request, store: Store,
         workload_key: Annotated[str, Query(min_length=1, max_length=64)],
         target: Annotated[str, Query(min_length=1, max_length=4096, description="target string, exactly as stored")],
         device_key: Annotated[str | None, Query(min_length=1, max_length=255, description="only records of this device key")] = None,
         ) -> BestOut:
    found = store.best(workload_key, target, k=1, device_key=device_key)
    if not found:
        where = f" on device key {device_key!r}" if device_key else ""
        raise ApiError(404, f"no valid record of workload {workload_key} on target {target!r}{where}", field="workload_key")
    rec = found[0]
    lowering = request.app.state.lowering
    flops = lowering.flops(rec)
    baseline = store.baseline_record(workload_key, target, device_key)
    loop_ir, why = lowering.loop_ir(rec)

    def gflops(r):
        return flops / r.cost / 1e9 if flops and r is not None and r.cost > 0 else None

    return BestOut(workload=workload_ref(rec.workload_key, rec.workload), target=rec.target, record=RecordOut.of(rec),
                   candidate=CandidateOut(kind=rec.candidate.kind, payload=rec.candidate.payload), flops=flops,
                   gflops=gflops(rec), baseline=RecordOut.of(baseline) if baseline is not None else None,
                   baseline_gflops=gflops(baseline),
                   speedup=baseline.cost / rec.cost if baseline is not None and rec.cost > 0 else None,
                   loop_ir=loop_ir, loop_ir_error=why)
