"""One SQL database shared by the three stores on it: records, the job queue and API tokens.

The stores are separate objects with separate contracts (store.RecordsStore, jobs.JobQueue,
tokens.TokenStore), but one farm keeps them in one database: a job's progress refers to its
tasks' records, and one connection pool, one schema version and one migration history serve all
three. `Database` is what they share: the engine, the transaction rules (`session`, `read`), and
the task table every store refers to (`task_id`), with its caches.
"""

from __future__ import annotations

from contextlib import contextmanager

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from ..workload import Task, Workload
from .dialect import insert_ignore
from .engine import first_line, open_engine, shown
from .models import TaskRow, WorkloadRow
from .task_cache import TaskCache
from .values import StoreError, utcnow


class ReadConnection:
    """What Database.read yields in place of a Session: the two things the hot reads ask of
    one, `connection()` and `execute(statement, params)` of a Core statement (the task cache's)."""

    __slots__ = ("_conn",)

    def __init__(self, conn):
        self._conn = conn

    def connection(self):
        return self._conn

    def execute(self, statement, params=None):
        return self._conn.execute(statement, params)


class Database:
    """An open SQLite or PostgreSQL database at this tunefarm's schema (upgraded by Alembic on
    open where engine.open_engine does so), and the rules every store's statements run by.
    `engine` is SQLAlchemy's, for what sits beside the stores (event listeners, a health probe)."""

    def __init__(self, url: str, upgrade: bool | None = None):
        self.url = url
        self.engine = open_engine(url, upgrade=upgrade)
        self._keys: dict[Workload, tuple[str, str | None]] = {}
        self.task_cache = TaskCache()

    def __repr__(self):
        return f"Database({shown(self.url)!r})"

    def close(self) -> None:
        """Close the pool's connections; the stores on this database are unusable after it."""
        self.engine.dispose()

    def ping(self) -> None:
        """One round trip to the database (readiness); StoreError when it does not answer."""
        with self.session() as s:
            s.execute(select(1)).scalar_one()

    @contextmanager
    def session(self, write: bool = False, stream: bool = False):
        """One transaction for a write; a database failure becomes StoreError and nothing is committed.

        Reads on PostgreSQL run in autocommit (each statement its own snapshot): no BEGIN and
        COMMIT round trips, which were half the time of a small API read. No read here needs two
        of its statements to see one snapshot (a job and its tasks' progress may be a batch apart,
        as they could be one request later anyway). `stream`: a read through a server-side cursor
        (yield_per), which PostgreSQL only has inside a transaction."""
        try:
            with self.engine.connect() as conn:
                if write:
                    conn = conn.execution_options(tunefarm_write=True)
                elif conn.dialect.name == "postgresql" and not stream:
                    conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                    with Session(bind=conn, autoflush=False) as session:
                        yield session
                    return
                with conn.begin(), Session(bind=conn, autoflush=False) as session:
                    yield session
                    session.flush()
        except SQLAlchemyError as e:
            raise StoreError(f"records database {shown(self.url)}: {first_line(e)}") from e

    @contextmanager
    def read(self):
        """A read of Core statements without an ORM Session: a ReadConnection on a pooled
        connection (autocommit on PostgreSQL, as session's reads). The Session's set-up,
        bookkeeping and close were a tenth of the API's CPU on a job poll; the hot reads (a job,
        a records page, best) use only its connection, so they take this instead."""
        try:
            with self.engine.connect() as conn:
                if conn.dialect.name == "postgresql":
                    conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                yield ReadConnection(conn)
        except SQLAlchemyError as e:
            raise StoreError(f"records database {shown(self.url)}: {first_line(e)}") from e

    # ------------------------------------------------------------------ tasks
    def workload_key(self, workload: Workload) -> tuple[str, str | None]:
        """Key and canonical text, computed once per workload (building the DAG is not free)."""
        if workload not in self._keys:
            from compiler.canonical import canonical_text
            op = workload.opdef()
            self._keys[workload] = (workload.key, canonical_text([op.output]))
        return self._keys[workload]

    def task_id(self, s: Session, key: str, workload: Workload, target: str, device_key: str,
                canonical: str | None = None) -> int:
        """The id of the task (workload `key`, target, device key), its workload and task rows
        added in transaction `s` if they are not there yet."""
        insert_ignore(s, WorkloadRow.__table__, {"key": key, "name": workload.name, "params": workload.params,
                                                 "canonical": canonical, "definition": workload.definition,
                                                 "created_at": utcnow()}, ["key"])
        where = dict(workload_key=key, target=target, device_key=device_key)
        insert_ignore(s, TaskRow.__table__, where, list(where))
        return s.execute(select(TaskRow.id).filter_by(**where)).scalar_one()

    def find_task_id(self, s: Session, task: Task) -> int | None:
        """The id of `task`'s row, None when nothing of it was ever stored."""
        key, _ = self.workload_key(task.workload)
        return s.execute(select(TaskRow.id).filter_by(workload_key=key, target=task.target,
                                                      device_key=task.device_key)).scalar_one_or_none()

    def ensure_task(self, task: Task) -> int:
        """The id of `task`'s row, made (with its workload's) if it is new, in its own transaction."""
        key, canonical = self.workload_key(task.workload)
        with self.session(write=True) as s:
            return self.task_id(s, key, task.workload, task.target, task.device_key, canonical)
