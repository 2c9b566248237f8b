"""Shared fixtures: real databases for the store and the tuner (SQLite files and PostgreSQL)."""

import os
import uuid

import pytest

PG_SERVER = "postgresql://postgres@127.0.0.1:5432"


@pytest.fixture(scope="session")
def pg_database():
    """A fresh PostgreSQL database for this test session, dropped at the end."""
    psycopg = pytest.importorskip("psycopg")
    try:
        admin = psycopg.connect(f"{PG_SERVER}/test", autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as e:
        pytest.skip(f"PostgreSQL not reachable at 127.0.0.1:5432 as postgres (database test): {e}")
    name = f"tunefarm_records_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_SERVER}/{name}"
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def pg_schema_url(pg_database: str, upgraded: bool = True) -> str:
    """A URL to a fresh schema of the session's database (search_path set through libpq options),
    upgraded to the current tunefarm schema as `tunefarm db upgrade` would, unless `upgraded=False`
    (PostgreSQL is never migrated implicitly by opening it)."""
    import psycopg
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_database, autocommit=True) as c:
        c.execute(f"CREATE SCHEMA {schema}")
    url = f"{pg_database.replace('postgresql://', 'postgresql+psycopg://')}?options=-csearch_path%3D{schema}"
    if upgraded:
        from tuner.records import open_store
        open_store(url, upgrade=True).close()
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """A records database URL, ready to open (PostgreSQL already upgraded)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'records.db'}"
    return pg_schema_url(request.getfixturevalue("pg_database"))


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_db_url(request, tmp_path):
    """A records database URL with no schema at all (PostgreSQL not upgraded)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'records.db'}"
    return pg_schema_url(request.getfixturevalue("pg_database"), upgraded=False)




@pytest.fixture
def env(db_url):
    """The API app on a SQLite file and on PostgreSQL, with a token per scope (tests/api_env.py)."""
    from api_env import Env, make_env
    from fastapi.testclient import TestClient
    store, app, tokens = make_env(db_url)
    with store, TestClient(app) as client:
        yield Env(store, client, tokens)


@pytest.fixture
def sqlite_env(tmp_path):
    """The API app on a SQLite file only."""
    from api_env import Env, make_env
    from fastapi.testclient import TestClient
    store, app, tokens = make_env(f"sqlite:///{tmp_path / 'api.db'}")
    with store, TestClient(app) as client:
        yield Env(store, client, tokens)
