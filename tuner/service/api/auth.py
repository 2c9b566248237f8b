"""Bearer tokens with scopes: `read` ⊂ `submit` ⊂ `admin` (tuner.records.tokens).

Every write needs a token with its scope; reads need a `read` token unless the server runs with
public_read. A missing or unknown token is 401 with a WWW-Authenticate challenge (RFC 6750), a
known token with too small a scope 403. A token that is presented is always checked, even on a
public read, so a client with a revoked token learns it at once. `last_used_at` is written at
most once a minute per token and after the response: a write per request would serialize reads
on SQLite's single write lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Annotated

from fastapi import BackgroundTasks, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ...records.tokens import SCOPES
from ...records.values import StoreError, TokenInfo
from .errors import ApiError

REALM = 'Bearer realm="tunefarm"'
TOUCH_EVERY_S = 60.0

bearer = HTTPBearer(auto_error=False, scheme_name="bearer",
                    description="an API token (`tunefarm token create --scope read|submit|admin`), sent as "
                                "`Authorization: Bearer tf_...`")


class TokenTouches:
    """When each token's use was last written, so it is written at most every TOUCH_EVERY_S."""

    def __init__(self):
        self._last: dict[int, float] = {}
        self._lock = threading.Lock()

    def due(self, token_id: int) -> bool:
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(token_id, -TOUCH_EVERY_S) < TOUCH_EVERY_S:
                return False
            self._last[token_id] = now
            return True


def _touch(store, token_id: int) -> None:
    try:
        store.touch_token(token_id)
    except StoreError:
        pass                    # best effort: the response has been sent already


def require(scope: str) -> Callable:
    """A dependency that admits a request with a token of `scope` (or a public read)."""

    def check(request: Request, background: BackgroundTasks,
              credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)]) -> TokenInfo | None:
        state = request.app.state
        if credentials is None:
            if scope == "read" and state.settings.public_read:
                return None
            raise ApiError(401, f"this needs an API token with scope {scope!r}: send Authorization: Bearer tf_...",
                           field="Authorization", headers={"WWW-Authenticate": REALM})
        info = state.store.verify_token(credentials.credentials)
        if info is None:
            raise ApiError(401, "unknown or revoked API token", field="Authorization",
                           headers={"WWW-Authenticate": f'{REALM}, error="invalid_token"'})
        if scope not in info.scopes:
            have = next((s for s in reversed(SCOPES) if s in info.scopes), "none")
            raise ApiError(403, f"token {info.name!r} has scope {have!r}; this needs {scope!r}", field="Authorization",
                           headers={"WWW-Authenticate": f'{REALM}, error="insufficient_scope", scope="{scope}"'})
        if state.token_touches.due(info.id):
            background.add_task(_touch, state.store, info.id)
        return info

    check.__name__ = f"require_{scope}"
    return check


read = require("read")
submit = require("submit")
admin = require("admin")
