"""A running API app for tests: its TestClient, a second store on its database, a token per scope.

The `env` (SQLite and PostgreSQL) and `sqlite_env` fixtures in conftest.py build one; tests that
need other app options call make_env themselves."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tuner.records import open_store
from tuner.records.tokens import SCOPES
from tuner.service.api import create_app


class Env:
    """A running app, its client, a second store on the same database, and a token per scope."""

    def __init__(self, store, client: TestClient, tokens: dict[str, str]):
        self.store, self.client, self.tokens = store, client, tokens

    def h(self, scope: str = "admin") -> dict:
        return {"Authorization": f"Bearer {self.tokens[scope]}"}

    def get(self, url, scope="read", **kw):
        return self.client.get(url, headers=self.h(scope), **kw)

    def post(self, url, scope="submit", **kw):
        return self.client.post(url, headers=self.h(scope), **kw)

    def n_jobs(self) -> int:
        return sum(self.store.jobs.count_by_state().values())


def make_env(url: str, **app_kw):
    store = open_store(url)
    tokens = {scope: store.tokens.create(f"test-{scope}", scope)[0] for scope in SCOPES}
    return store, create_app(url, **app_kw), tokens
