"""The bulk import of JSON lines: a million records in well under a minute.

An import used to build a Record per line and insert batches of rows through SQLAlchemy (1 M
records: 7 minutes on PostgreSQL, most of it the driver parsing multi-row statements). Here each
line becomes a row tuple in one pass (codec.checked_line: the same checks, no Record, Candidate or
MeasureResult built), the rows go into a temporary table with no index (PostgreSQL: `COPY`, which
the server parses while this process reads the next lines; elsewhere: executemany), and one
`INSERT … SELECT … ON CONFLICT DO NOTHING` moves them into `records` in file order, joined to their
tasks, returning the task of each new record so the tasks' record counts stay right. Tasks and
workloads are added before that, one statement per task of the file.

All of it runs in the caller's transaction: a bad line raises StoreError and leaves the database as
it was. Memory stays flat: only the file's distinct workloads are kept.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from datetime import timezone
from typing import IO, Callable

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..candidate import ErrorCode, candidate_text, fingerprint_of
from .codec import checked_line

STAGE = "tunefarm_import"      # the temporary table (one per connection, so imports never share it)
SQLITE_BATCH = 5000            # rows per executemany into the stage where COPY is not there

# the stage's columns as the loaders fill them; `id` holds the line number (the file's order)
STAGED = ("id", "workload_key", "target", "device_key", "candidate_kind", "candidate", "fingerprint", "costs",
          "mean_cost", "error_code", "error_msg", "build_seconds", "run_seconds", "measured_by", "emulated",
          "created_at", "min_cost", "cost_spread", "samples", "disturbed", "lost_fraction", "host_busy")
# the records columns a stage row fills (task_id from the join; job ids stay behind, see codec)
MOVED = STAGED[4:]


def staged_row(line: str, lineno: int, workloads: dict) -> tuple:
    """One line as a stage row (STAGED's order), with the values codec.record_values gives the
    same record: JSON columns as their text, the figure and the protocol's summary columns."""
    (key, _workload, target, device_key, kind, payload, costs, code, msg, build_s, run_s, measured_by, emulated,
     timing, created_at) = checked_line(line, lineno, workloads)
    cand = candidate_text(kind, payload)
    ok = code == ErrorCode.NO_ERROR
    if timing is not None:
        median, minimum, spread = float(timing["median"]), float(timing["min"]), float(timing["spread"])
        summary = (minimum, spread, int(timing["count"]), bool(timing["disturbed"]), float(timing["lost_fraction"]),
                   float(timing.get("host_busy", 0.0)))
    else:
        median, summary = None, (None, None, None, None, None, None)
    figure = None
    if ok and costs:
        figure = median if median is not None else sum(costs) / len(costs)
        if not math.isfinite(figure):
            figure = None
    return (lineno, key, target, device_key, kind, cand, fingerprint_of(cand), json.dumps(costs), figure, code, msg,
            build_s, run_s, measured_by, emulated, created_at) + summary


def import_lines(s: Session, fileobj: IO[str], task_id: Callable) -> dict[int, int]:
    """Add the records of the JSON lines in `fileobj` that are not stored yet; returns {task id:
    records added}. `task_id(session, workload_key, workload, target, device_key)` finds or adds a
    task (SQLRecordsStore._task_id)."""
    conn = s.connection()
    postgres = conn.dialect.name == "postgresql"
    if postgres:
        conn.exec_driver_sql(f"CREATE TEMPORARY TABLE {STAGE} ON COMMIT DROP AS SELECT * FROM records WITH NO DATA")
    else:
        conn.exec_driver_sql(f"CREATE TEMPORARY TABLE {STAGE} AS SELECT * FROM records WHERE 0")
    for column in ("workload_key", "target", "device_key"):
        conn.exec_driver_sql(f"ALTER TABLE {STAGE} ADD COLUMN {column} TEXT")
    workloads: dict = {}
    lines = ((n, line) for n, line in enumerate(fileobj, 1) if line.strip())
    rows = (staged_row(line, n, workloads) for n, line in lines)
    (_copy_rows if postgres else _insert_rows)(conn, rows)
    for key, target, device_key in conn.exec_driver_sql(
            f"SELECT DISTINCT workload_key, target, device_key FROM {STAGE}").all():
        task_id(s, key, workloads[key][3], target, device_key)
    moved = ", ".join(MOVED)
    added = conn.execute(text(
        f"INSERT INTO records (task_id, {moved}) "
        f"SELECT t.id, {', '.join('i.' + c for c in MOVED)} FROM {STAGE} i JOIN tasks t "
        "ON t.workload_key = i.workload_key AND t.target = i.target AND t.device_key = i.device_key "
        "WHERE true ORDER BY i.id ON CONFLICT (task_id, fingerprint) DO NOTHING RETURNING task_id")).scalars()
    counts = dict(Counter(added))
    conn.exec_driver_sql(f"DROP TABLE {STAGE}")
    return counts


def _copy_rows(conn, rows) -> None:
    """PostgreSQL: the rows by COPY, streamed (the server parses while the lines are read)."""
    raw = conn.connection.driver_connection
    with raw.cursor() as cur, cur.copy(f"COPY {STAGE} ({', '.join(STAGED)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


def _insert_rows(conn, rows) -> None:
    """Other back-ends (SQLite): executemany in batches, timestamps in the text SQLAlchemy stores."""
    sql = f"INSERT INTO {STAGE} ({', '.join(STAGED)}) VALUES ({', '.join('?' * len(STAGED))})"
    created = STAGED.index("created_at")
    batch: list = []
    for row in rows:
        at = row[created].astimezone(timezone.utc)
        batch.append(row[:created] + (at.strftime("%Y-%m-%d %H:%M:%S.%f"),) + row[created + 1:])
        if len(batch) == SQLITE_BATCH:
            conn.exec_driver_sql(sql, batch)
            batch = []
    if batch:
        conn.exec_driver_sql(sql, batch)
