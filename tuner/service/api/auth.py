"""Bearer tokens with scopes: `read` ⊂ `submit` ⊂ `admin` (tuner.records.tokens).

Every write needs a token with its scope; reads need a `read` token unless the server runs with
public_read. A missing or unknown token is 401 with a WWW-Authenticate challenge (RFC 6750), a
known token with too small a scope 403. A token that is presented is always checked, even on a
public read, so a client with a revoked token learns it at once. `last_used_at` is written at
most once a minute per token and after the response: a write per request would serialize reads
on SQLite's single write lock. For reads a verified token is trusted for 5 s (TokenCache), so a
revocation stops its reads within 5 s and its writes at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Annotated

from fastapi import BackgroundTasks, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from ...records.tokens import SCOPES, token_hash
from ...records.values import StoreError, TokenInfo
from .errors import ApiError

REALM = 'Bearer realm="tunefarm"'
TOUCH_EVERY_S = 60.0
CACHE_S = 5.0           # how long a verified token is trusted without asking the database again

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


class TokenCache:
    """Verified tokens for CACHE_S seconds, keyed by the secret's SHA-256 (the secret itself is
    not kept): a token check per request was a database round trip per request. A revoked
    token keeps working here for at most CACHE_S seconds; unknown tokens are not cached."""

    def __init__(self, seconds: float = CACHE_S, size: int = 1024):
        self.seconds, self.size = seconds, size
        self._known: dict[str, tuple[float, TokenInfo]] = {}
        self._lock = threading.Lock()

    def cached(self, secret: str) -> TokenInfo | None:
        """The token's info if it was verified in the last `seconds`, else None (ask verify)."""
        with self._lock:
            hit = self._known.get(token_hash(secret))
        return hit[1] if hit is not None and time.monotonic() - hit[0] < self.seconds else None

    def verify(self, store, secret: str, fresh: bool = False) -> TokenInfo | None:
        """The token's info (None: unknown or revoked); `fresh` asks the database regardless."""
        if not fresh and (info := self.cached(secret)) is not None:
            return info
        key = token_hash(secret)
        now = time.monotonic()
        info = store.tokens.verify(secret)
        with self._lock:
            if info is None:
                self._known.pop(key, None)
                return None
            if len(self._known) >= self.size:
                self._known.clear()
            self._known[key] = (now, info)
        return info


def _touch(store, token_id: int) -> None:
    try:
        store.tokens.touch(token_id)
    except StoreError:
        pass                    # best effort: the response has been sent already


def require(scope: str) -> Callable:
    """A dependency that admits a request with a token of `scope` (or a public read)."""

    async def check(request: Request, background: BackgroundTasks,
                    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)]) -> TokenInfo | None:
        # async, with the database asked from the thread pool only when needed: a plain `def`
        # dependency would take a thread-pool hop on every request, a cached read token too
        state = request.app.state
        if credentials is None:
            if scope == "read" and state.settings.public_read:
                return None
            raise ApiError(401, f"this needs an API token with scope {scope!r}: send Authorization: Bearer tf_...",
                           field="Authorization", headers={"WWW-Authenticate": REALM})
        # reads may trust a token verified in the last few seconds; writes always ask the database,
        # so a revoked token can never write again
        cache, secret = state.token_cache, credentials.credentials
        info = cache.cached(secret) if scope == "read" else None
        if info is None:
            info = await run_in_threadpool(cache.verify, state.store, secret, fresh=scope != "read")
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
