"""What route handlers get injected: the app's settings and its one store.

The store is opened once per app (in the lifespan, app.py) and shared by all requests: it is
a connection pool, and every store method is its own transaction, so handlers never hold a
session across calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from ...records.jobs import MAX_PAGE
from ...records.store import SQLRecordsStore

MAX_ID = 2**31 - 1          # ids are INTEGER columns (32 bits on PostgreSQL): a larger one cannot exist


@dataclass(frozen=True)
class ApiSettings:
    public_read: bool = False
    tracker: str | None = None
    tracker_token: str | None = None
    max_body_bytes: int = 8 << 20
    max_model_bytes: int = 256 << 20


# async on purpose: FastAPI runs a plain `def` dependency in its thread pool, a hop that cost more
# than these lookups (see auth.require for the same reason)
async def get_store(request: Request) -> SQLRecordsStore:
    return request.app.state.store


async def get_settings(request: Request) -> ApiSettings:
    return request.app.state.settings


Store = Annotated[SQLRecordsStore, Depends(get_store)]
Settings = Annotated[ApiSettings, Depends(get_settings)]

__all__ = ["MAX_ID", "MAX_PAGE", "ApiSettings", "Settings", "Store", "get_settings", "get_store"]
