"""Insert-if-absent and upsert, done by the database rather than by a read-then-write.

Two tuner processes (or two store objects on one SQLite file) may add the same workload, task or
candidate at the same moment; `INSERT … ON CONFLICT` makes the second one a no-op instead of a
unique-constraint failure that would roll back its whole batch. SQLite and PostgreSQL both have
it; any other back-end falls back to check-then-insert, which is correct without concurrency.
"""

from __future__ import annotations

from sqlalchemy import Table, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

_INSERTS = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}


def insert_ignore(session: Session, table: Table, values: dict, conflict: list[str], returning=None):
    """Insert `values` unless a row with the same `conflict` columns exists.

    Returns the `returning` column of the new row, or None when the row was already there.
    """
    dialect_insert = _INSERTS.get(session.get_bind().dialect.name)
    if dialect_insert is not None:
        stmt = dialect_insert(table).values(**values).on_conflict_do_nothing(index_elements=conflict)
        if returning is None:
            session.execute(stmt)
            return None
        return session.execute(stmt.returning(returning)).scalar_one_or_none()
    where = [table.c[name] == values[name] for name in conflict]
    if session.execute(select(table.c[conflict[0]]).where(*where)).first() is not None:
        return None
    stmt = insert(table).values(**values)
    if returning is None:
        session.execute(stmt)
        return None
    return session.execute(stmt.returning(returning)).scalar_one()


def upsert(session: Session, table: Table, values: dict, key: list[str], keep: tuple = ()) -> None:
    """Insert `values`, or update the columns of the row with the same `key` (except `keep`)."""
    dialect_insert = _INSERTS.get(session.get_bind().dialect.name)
    changes = {k: v for k, v in values.items() if k not in key and k not in keep}
    if dialect_insert is not None:
        stmt = dialect_insert(table).values(**values)
        session.execute(stmt.on_conflict_do_update(index_elements=key, set_=changes))
        return
    where = [table.c[name] == values[name] for name in key]
    if session.execute(table.update().where(*where).values(**changes)).rowcount == 0:
        session.execute(insert(table).values(**values))
