"""Records store: every measured candidate in SQL (SQLite file by default, PostgreSQL by URL).

`open_store(url=None)` opens `url`, else $TUNEFARM_DB_URL, else ~/.tunefarm/records.db, and
upgrades its schema with the Alembic migrations shipped in this package. Needs the `tuner` extra
(SQLAlchemy, Alembic, psycopg); the device agent never imports it.
"""

from .store import RecordsStore, SQLRecordsStore, open_store
from .values import JOB_TRANSITIONS, Agent, Job, JobState, Record, StoreError

__all__ = ["Agent", "JOB_TRANSITIONS", "Job", "JobState", "Record", "RecordsStore", "SQLRecordsStore",
           "StoreError", "open_store"]
