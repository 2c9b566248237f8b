"""Targets that have tasks, with their counts of tasks, workloads, device keys and records."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from .. import auth
from ..deps import MAX_PAGE, Store
from ..errors import responses
from ..schemas import TargetOut, TargetPage

router = APIRouter(tags=["targets"])


@router.get("/targets", response_model=TargetPage, dependencies=[Depends(auth.read)], responses=responses(422),
            summary="Distinct targets with counts")
def list_targets(store: Store,
                 after: Annotated[str | None, Query(max_length=4096, description="page cursor: `next_after` of the last page")] = None,
                 limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50) -> TargetPage:
    rows = store.list_targets(after=after, limit=limit)
    return TargetPage(items=[TargetOut(**r) for r in rows], next_after=rows[-1]["target"] if len(rows) == limit else None)
