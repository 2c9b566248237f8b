"""API bearer tokens: created once (the secret is shown then and never stored), kept as SHA-256.

A token is 32 random bytes, URL-safe base64 with a `tf_` prefix (so a leaked one is easy to grep
for). Only its SHA-256 is stored: a stolen database does not yield usable tokens, and because the
secret has 256 bits of entropy a plain hash is enough (no slow password hash is needed).
Scopes: `read` (GET), `submit` (jobs and records), `admin` (tokens, job states); each scope
includes the ones before it.
"""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select, update

from .database import Database
from .models import TokenRow
from .values import StoreError, TokenInfo, utcnow

SCOPES = ("read", "submit", "admin")
TOKEN_PREFIX = "tf_"


def token_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def implied_scopes(scope: str) -> frozenset[str]:
    """`submit` includes `read`; `admin` includes both."""
    if scope not in SCOPES:
        raise StoreError(f"unknown scope {scope!r}; scopes are {', '.join(SCOPES)}")
    return frozenset(SCOPES[: SCOPES.index(scope) + 1])


class TokenStore:
    """The API tokens of a records database (SQLRecordsStore.tokens)."""

    def __init__(self, db: Database):
        self._db = db

    def create(self, name: str, scope: str) -> tuple[str, TokenInfo]:
        """A new token with `scope` (and the scopes it includes); returns (secret, info). The
        secret is not kept: show it to the user now."""
        scopes = implied_scopes(scope)
        if not name or len(name) > 255:
            raise StoreError("a token needs a name of 1..255 characters")
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        now = utcnow()
        with self._db.session(write=True) as s:
            row = TokenRow(name=name, token_hash=token_hash(secret), scopes=",".join(sorted(scopes)), created_at=now)
            s.add(row)
            s.flush()
            return secret, _info(row)

    def verify(self, secret: str) -> TokenInfo | None:
        """The token's info if `secret` is a live (not revoked) token, else None."""
        if not secret.startswith(TOKEN_PREFIX):
            return None
        with self._db.session() as s:
            row = s.execute(select(TokenRow).where(TokenRow.token_hash == token_hash(secret))).scalar_one_or_none()
            if row is None or row.revoked_at is not None:
                return None
            return _info(row)

    def touch(self, token_id: int) -> None:
        """Note that a token was used now (for `token list`); best effort."""
        with self._db.session(write=True) as s:
            s.execute(update(TokenRow).where(TokenRow.id == token_id).values(last_used_at=utcnow()))

    def list_all(self) -> list[TokenInfo]:
        """Every token ever created, revoked ones included, oldest first (no secrets: none is kept)."""
        with self._db.session() as s:
            return [_info(r) for r in s.execute(select(TokenRow).order_by(TokenRow.id)).scalars()]

    def revoke(self, token_id: int) -> TokenInfo:
        """Revoke a token: `verify` refuses it from now on. Idempotent (a second revoke keeps the
        first time); StoreError if there is no such token."""
        with self._db.session(write=True) as s:
            row = s.get(TokenRow, token_id)
            if row is None:
                raise StoreError(f"no token {token_id}")
            if row.revoked_at is None:
                row.revoked_at = utcnow()
            s.flush()
            return _info(row)


def _info(row: TokenRow) -> TokenInfo:
    return TokenInfo(id=row.id, name=row.name, scopes=frozenset(row.scopes.split(",")), created_at=row.created_at,
                     last_used_at=row.last_used_at, revoked_at=row.revoked_at)
