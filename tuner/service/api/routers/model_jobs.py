"""Model jobs: an ONNX file uploaded as the request body becomes a job over its fused workloads.

`POST /jobs/model?trials=2000&input_shape=input=1,3,224,224` with the file as the body
(Content-Type: application/octet-stream; the tuning and measurement parameters are a job's,
spec.ModelJobQuery). The body has its own size limit (the app's
`max_model_bytes`; 413 with the reason over it, enforced by limits.BodyLimit before the body is
buffered). The file is read and its tasks extracted in the thread pool (service/model_job.py): a
file that is not ONNX, an unsupported operator or an unpinned dynamic shape is a 422 naming the
node, op or input, and nothing is stored. The job is then an ordinary job (its workloads and
weights) with a `model` section; `GET /jobs/{id}` shows its allocation and latency curve.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from ...model_job import model_job_spec, parse_input_shapes
from ...spec import ModelJobQuery, SpecError, resolve
from .. import auth
from ..deps import Settings, Store
from ..errors import ApiError, responses
from ..runnable import farm_refusal
from ..schemas import JobOut

router = APIRouter(prefix="/jobs", tags=["jobs"])

MODEL_PATH = "/jobs/model"
ONNX_BODY = {"requestBody": {"required": True, "description": "the ONNX model file, as it is on disk",
                             "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}


@router.post("/model", status_code=201, response_model=JobOut, dependencies=[Depends(auth.submit)],
             responses=responses(400, 413, 422), openapi_extra=ONNX_BODY,
             summary="Submit a model job: an ONNX file, its fused workloads tuned under one budget")
async def submit_model_job(
        request: Request, response: Response, store: Store, settings: Settings,
        options: Annotated[ModelJobQuery, Query()],
        input_shape: Annotated[list[str] | None, Query(max_length=64, description="NAME=D0,D1,... pins an input the "
                                                                                  "model leaves dynamic (repeatable)")] = None,
        name: Annotated[str | None, Query(max_length=200)] = None,
        file_name: Annotated[str | None, Query(max_length=255, description="the file's name, for people")] = None,
        target: Annotated[str | None, Query(max_length=1000, description="default: the server's host")] = None,
        device_key: Annotated[str, Query(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9_.:-]+$")] = "local",
        priority: Annotated[int, Query(ge=-1000, le=1000)] = 0) -> JobOut:
    """The model is read, checked and its tasks extracted now; a worker tunes them like
    `tunefarm model tune` (gradient task scheduler, one shared cost model)."""
    if request.headers.get("content-type", "").startswith("multipart/"):
        raise ApiError(422, "send the ONNX file as the raw request body (Content-Type: application/octet-stream), "
                            "not as a form", field="model")
    data = await request.body()        # limits.BodyLimit refuses a body over max_model_bytes with 413
    job: dict[str, object] = dict(priority=priority, **options.job_fields())
    if name is not None:
        job["name"] = name
    try:
        shapes = parse_input_shapes(input_shape or [])
        spec = await run_in_threadpool(model_job_spec, data, input_shapes=shapes, file_name=file_name, target=target,
                                       device_key=device_key, **job)
        resolved = await run_in_threadpool(resolve, spec)
    except SpecError as e:
        raise ApiError(422, e.message, field=e.field) from None
    if device_key != "local" and settings.tracker:
        refusal = await run_in_threadpool(farm_refusal, settings.tracker, settings.tracker_token, device_key,
                                          resolved.tasks[0].target)
        if refusal is not None:
            raise ApiError(422, refusal, field="target")

    def submit():
        job_id = store.jobs.submit(resolved.store_rows(), spec.model_dump(mode="json"), space=spec.space,
                                   strategy=resolved.strategy, scheduler=spec.scheduler, trials=spec.trials,
                                   priority=spec.priority, name=spec.name)
        return store.jobs.get(job_id)

    stored = await run_in_threadpool(submit)
    response.headers["Location"] = str(request.url_for("get_job", job_id=stored.id))
    return JobOut.of(stored)


__all__ = ["router", "MODEL_PATH"]
