"""Operations: liveness (/healthz, the process answers), readiness (/readyz, the database
answers too) and Prometheus metrics (/metrics). The first two are open so orchestrators need
no token; metrics need a read token unless the server is public_read."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ....records.values import StoreError
from .. import auth
from ..deps import Store
from ..errors import error_response, responses
from ..schemas import HealthOut, ReadyOut

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthOut, summary="The process is up")
def healthz() -> HealthOut:
    return HealthOut()


@router.get("/readyz", response_model=ReadyOut, responses=responses(503), summary="The process is up and its database answers")
def readyz(store: Store):
    try:
        store.ping()
    except StoreError as e:
        why = type(e.__cause__).__name__ if e.__cause__ is not None else "error"
        return error_response(503, f"the records database does not answer ({why})", headers={"Retry-After": "5"})
    return ReadyOut(database=store.url.split(":", 1)[0].split("+", 1)[0])


@router.get("/metrics", response_class=Response, dependencies=[Depends(auth.read)],
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "Prometheus text exposition format"},
                       **responses(401, 403, 503)},
            summary="Prometheus metrics")
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

