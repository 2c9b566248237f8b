"""Workloads that have records or jobs: key, name, parameters, whether defined as a compute DAG,
and how many records each has, as keyset pages by key."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from .. import auth
from ..deps import MAX_PAGE, Store
from ..errors import responses
from ..schemas import WorkloadOut, WorkloadPage

router = APIRouter(tags=["workloads"])


@router.get("/workloads", response_model=WorkloadPage, dependencies=[Depends(auth.read)], responses=responses(422),
            summary="Workloads by key, with how many records each has")
def list_workloads(store: Store,
                   name: Annotated[str | None, Query(min_length=1, max_length=255, description="only workloads of this name")] = None,
                   after: Annotated[str | None, Query(max_length=64, description="page cursor: `next_after` of the last page")] = None,
                   limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50) -> WorkloadPage:
    rows = store.list_workloads(after_key=after, limit=limit, name=name)
    return WorkloadPage(items=[WorkloadOut(**r) for r in rows], next_after=rows[-1]["key"] if len(rows) == limit else None)
