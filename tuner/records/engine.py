"""Opening a records database: URL choice, engine set-up per back-end, and the Alembic upgrade.

Opening is all-or-nothing. A URL is checked before anything touches disk or network; the schema
upgrade runs in one transaction on one connection (PostgreSQL and SQLite both have transactional
DDL), so a database that fails half-way is rolled back, and a SQLite file this open created is
removed again. Every failure becomes a `StoreError` that names the URL (password hidden).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.util import CommandError
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, DisconnectionError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.pool import StaticPool

from .values import StoreError

ENV_VAR = "TUNEFARM_DB_URL"
CONNECT_TIMEOUT_S = 3
SQLITE_BUSY_TIMEOUT_S = 30      # how long a SQLite writer waits for another writer's lock
IDLE_PING_S = 5.0               # a pooled server connection idle longer than this is pinged before use
PREPARED_MAX = 1000             # statements a PostgreSQL connection keeps prepared (psycopg's default: 100)
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
_PG_MIGRATION_LOCK = 0x7475_6E65  # "tune": serializes concurrent first opens of one PostgreSQL db


def default_url() -> str:
    """`sqlite:///~/.tunefarm/records.db`, creating the folder: the zero-set-up default."""
    folder = Path.home() / ".tunefarm"
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'records.db'}"


def resolve_url(url: str | None = None) -> str:
    """An explicit URL (e.g. from --db), else $TUNEFARM_DB_URL, else the default SQLite file."""
    return url or os.environ.get(ENV_VAR) or default_url()


def shown(url: str | URL) -> str:
    try:
        return (url if isinstance(url, URL) else make_url(url)).render_as_string(hide_password=True)
    except ArgumentError:
        return repr(url)


def open_engine(url: str, upgrade: bool | None = None) -> Engine:
    """An engine for `url`, connected once, with its schema at this tunefarm's head; or StoreError.

    `upgrade=None`: the embedded SQLite default is migrated on open; a server database
    (PostgreSQL) is only checked, and one that is behind is refused with the command that
    upgrades it: several servers and workers share it, and a schema change there is an
    operator's deliberate step, not a side effect of whichever process opened it first."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StoreError(f"malformed database URL {url!r}; expected e.g. sqlite:///path/to/records.db "
                         "or postgresql://user@host:5432/dbname") from None
    created_file = _sqlite_file_to_create(parsed)
    try:
        engine = _create(parsed)
    except (NoSuchModuleError, ImportError) as e:
        raise StoreError(f"unknown or uninstalled database driver in {shown(parsed)}: {e}; "
                         "supported: sqlite:///… and postgresql://… (psycopg)") from None
    except (ArgumentError, TypeError, ValueError) as e:
        raise StoreError(f"bad database URL {shown(parsed)}: {e}") from None
    if upgrade is None:
        upgrade = parsed.get_backend_name() == "sqlite"
    try:
        if upgrade:
            migrate(engine)
        else:
            check_schema(engine)
    except BaseException as e:
        engine.dispose()
        if created_file is not None:
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(str(created_file) + suffix).unlink(missing_ok=True)
        if isinstance(e, StoreError):
            raise
        if isinstance(e, (SQLAlchemyError, CommandError, OSError)):
            raise StoreError(f"cannot open records database {shown(parsed)}: {first_line(e)}") from None
        raise
    return engine


def migrate(engine: Engine) -> None:
    """Upgrade the schema to head in one transaction (a no-op on an up-to-date database)."""
    cfg = _alembic_config()
    with engine.connect() as conn:
        conn = conn.execution_options(tunefarm_write=True)
        with conn.begin():
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
            cfg.attributes["connection"] = conn
            try:
                command.upgrade(cfg, "head")
            except CommandError as e:
                raise StoreError(f"cannot migrate records database {shown(engine.url)}: {e} "
                                 "(was it written by a newer tunefarm?)") from None


def check_schema(engine: Engine) -> None:
    """StoreError unless the database's schema is at this tunefarm's head revision."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    from .models import VERSION_TABLE
    script = ScriptDirectory.from_config(_alembic_config())
    head = script.get_current_head()
    with engine.connect() as conn:
        current = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()
    if current == head:
        return
    command_hint = f"run `tunefarm db upgrade --db '{shown(engine.url)}'`"
    if current is None:
        raise SchemaBehind(f"records database {shown(engine.url)} has no tunefarm schema yet; {command_hint}")
    if current not in {rev.revision for rev in script.walk_revisions()}:
        raise StoreError(f"records database {shown(engine.url)} is at schema {current}, newer than this tunefarm's "
                         f"{head}: upgrade tunefarm")
    raise SchemaBehind(f"records database {shown(engine.url)} is at schema {current}, this tunefarm needs {head}; "
                       f"{command_hint}")


class SchemaBehind(StoreError):
    """The database's schema is older than this tunefarm's (`tunefarm db upgrade` fixes it)."""


def _alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS).replace("%", "%%"))
    return cfg


def _sqlite_file_to_create(url: URL) -> Path | None:
    """For a SQLite file URL: check its folder exists (we never create folders for an explicit
    URL) and return the path if the file does not exist yet, so a failed open can remove it."""
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    if url.database.startswith("file:"):
        return None
    path = Path(url.database).expanduser()
    if not path.parent.is_dir():
        raise StoreError(f"cannot open records database {shown(url)}: folder {path.parent} does not exist")
    return None if path.exists() else path


POOL_SIZE = 12        # connections a server store keeps open (more than an API process's handler threads)
POOL_OVERFLOW = 4     # more, opened for a burst and closed after it


def sorted_json(value) -> str:
    """How JSON columns are written: keys sorted, as a bulk import writes them and an export
    copies them into lines verbatim (codec.row_to_line)."""
    return json.dumps(value, sort_keys=True)


def _create(url: URL) -> Engine:
    backend = url.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(url)
    # a pool as large as the threads that use it (an API server's, see tuner.service.api.app): with
    # SQLAlchemy's default of 5 (+10 overflow), 32 clients had the API open and close a PostgreSQL
    # connection (a server process forked) for a tenth of its requests
    kwargs: dict = {"json_serializer": sorted_json, "pool_size": POOL_SIZE, "max_overflow": POOL_OVERFLOW}
    if backend == "postgresql" and url.get_driver_name() in ("psycopg", "psycopg2"):
        kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
    engine = create_engine(url, **kwargs)
    _ping_when_idle(engine)
    _keep_statements_prepared(engine)
    return engine


def _keep_statements_prepared(engine: Engine) -> None:
    """Let each psycopg connection keep PREPARED_MAX prepared statements. psycopg prepares a
    statement on its fifth run and keeps the 100 most recent: the API's reads are a few hundred
    statement texts (each filter set, order and cursor of the records pages, the per-task reads
    of best), so at 100 they pushed each other out, and a records page paid a PREPARE and a
    DEALLOCATE round trip beside its query (7.3 against 5.7 ms of the API's CPU a page, with
    less of PostgreSQL's too). A prepared statement is a few kilobytes of a backend's memory."""
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        if hasattr(dbapi_conn, "prepared_max"):      # psycopg 3; psycopg2 prepares nothing itself
            dbapi_conn.prepared_max = PREPARED_MAX


def _ping_when_idle(engine: Engine) -> None:
    """Ping a pooled connection before use only when it has been idle for IDLE_PING_S.

    SQLAlchemy's pool_pre_ping costs a round trip on every checkout: a third of the database
    time of a small API read. A connection used a moment ago is as alive as a ping would show;
    one idle for longer (the server may have restarted, a firewall may have dropped it) is
    pinged, and a dead one is replaced before the caller sees it (DisconnectionError makes the
    pool retry with a new connection). A server dying under busy connections fails the
    statements in flight once (StoreError, a 503 in the API); SQLAlchemy then drops the pool."""

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_conn, record):
        record.info["tunefarm_used_at"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn, record, _proxy):
        used_at = record.info.get("tunefarm_used_at")
        if used_at is None or time.monotonic() - used_at < IDLE_PING_S:
            return      # a new connection, or one returned a moment ago
        try:
            alive = engine.dialect.do_ping(dbapi_conn)
        except engine.dialect.loaded_dbapi.Error as e:
            raise DisconnectionError(f"idle connection failed its ping: {first_line(e)}") from e
        if alive is False:
            raise DisconnectionError("idle connection failed its ping")


def _sqlite_engine(url: URL) -> Engine:
    """SQLite with foreign keys on, WAL (readers do not block the writer), a busy timeout, and
    BEGIN IMMEDIATE for write transactions: two store objects on one file then queue for the
    write lock instead of failing with 'database is locked' when a reader upgrades to a writer."""
    memory = url.database in (None, "", ":memory:")
    kwargs = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False},
              "json_serializer": sorted_json}
    if memory:
        kwargs["poolclass"] = StaticPool   # one shared connection, or each would see its own empty db
    engine = create_engine(url, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None   # we emit BEGIN ourselves (below)
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA foreign_keys=ON")
        if not memory:
            cur.execute("PRAGMA journal_mode=WAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        write = conn.get_execution_options().get("tunefarm_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def first_line(e: BaseException) -> str:
    msg = str(getattr(e, "orig", None) or e).strip()
    return msg.splitlines()[0] if msg else type(e).__name__
