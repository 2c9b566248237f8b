"""The bulk import of JSON lines: a million records in well under a minute.

An import used to build a Record per line and insert batches of rows through SQLAlchemy (1 M
records: 7 minutes on PostgreSQL, most of it the driver parsing multi-row statements). Here each
line becomes a row tuple in one pass (codec.checked_line: the same checks, no Record, Candidate or
MeasureResult built); a chunk of rows goes into a temporary table with no index (PostgreSQL:
`COPY`; elsewhere: executemany) with its task ids (tasks and workloads added as the file names
them), and one `INSERT … SELECT … ON CONFLICT DO NOTHING` moves it into `records` in file order,
returning the task of each new record so the tasks' record counts stay right. The database moves
one chunk while this process checks the next.

All of it runs in the caller's transaction: a bad line raises StoreError and leaves the database as
it was. Memory stays flat: a chunk of rows and the file's distinct workloads.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timezone
from typing import IO, Callable

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..candidate import ErrorCode, candidate_text, fingerprint_of
from .codec import checked_line

STAGE = "tunefarm_import"      # the temporary table (one per connection, so imports never share it)
CHUNK = 20_000                 # lines checked while the database moves the chunk before (import_lines)
SQLITE_BATCH = 5000            # rows per executemany into the stage where COPY is not there
WORK_MEM = "64MB"              # PostgreSQL's sort memory for an import's transaction (a chunk's rows)

# the stage's columns as the loaders fill them; `id` holds the line number (the file's order)
STAGED = ("id", "task_id", "candidate_kind", "candidate", "fingerprint", "costs", "mean_cost", "error_code", "error_msg",
          "build_seconds", "run_seconds", "measured_by", "emulated", "created_at", "min_cost", "cost_spread", "samples",
          "disturbed", "lost_fraction", "host_busy", "slow_window", "remeasured", "slow_index")
# the records columns a stage row fills (job ids stay behind, see codec)
MOVED = STAGED[1:]


def staged_row(line: str, lineno: int, workloads: dict) -> tuple:
    """One line as (line number, its task's (workload key, target, device key), the rest of its
    stage row in STAGED's order after task_id), with the values codec.record_values gives the
    same record: JSON columns as their text, the figure and the protocol's summary columns."""
    (key, _workload, target, device_key, kind, payload, costs, code, msg, build_s, run_s, measured_by, emulated,
     timing, created_at, slow_window, remeasured, slow_index) = checked_line(line, lineno, workloads)
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
    return (lineno, (key, target, device_key),
            (kind, cand, fingerprint_of(cand), json.dumps(costs), figure, code, msg, build_s, run_s, measured_by, emulated,
             created_at) + summary + (slow_window, remeasured, slow_index))


def import_lines(s: Session, fileobj: IO[str], task_id: Callable) -> dict[int, int]:
    """Add the records of the JSON lines in `fileobj` that are not stored yet; returns {task id:
    records added}. `task_id(session, workload_key, workload, target, device_key)` finds or adds a
    task (Database.task_id).

    The file goes through the stage in chunks of CHUNK lines, pipelined: while the database moves
    one chunk into `records` (index and foreign-key upkeep, its half of the work), this process
    checks the next chunk's lines (its half), so the two cores work at once. The connection is
    used by one thread at a time: the mover runs between the loads, and is waited for before the
    next chunk's tasks are looked up or a bad line's error unwinds the transaction."""
    conn = s.connection()
    postgres = conn.dialect.name == "postgresql"
    if postgres:
        conn.exec_driver_sql(f"CREATE TEMPORARY TABLE {STAGE} ON COMMIT DROP AS SELECT * FROM records WITH NO DATA")
        conn.exec_driver_sql(f"SET LOCAL work_mem = '{WORK_MEM}'")      # a chunk sorted in memory
    else:
        conn.exec_driver_sql(f"CREATE TEMPORARY TABLE {STAGE} AS SELECT * FROM records WHERE 0")
    load = _copy_rows if postgres else _insert_rows
    workloads: dict = {}
    task_ids: dict[tuple, int] = {}
    counts: Counter = Counter()
    numbered = ((n, line) for n, line in enumerate(fileobj, 1) if line.strip())
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tunefarm-import") as mover:
        moving = None
        while True:
            chunk = [staged_row(line, n, workloads) for n, line in itertools.islice(numbered, CHUNK)]
            if moving is not None:
                counts.update(moving.result())
            if not chunk:
                break
            for _, task, _ in chunk:
                if task not in task_ids:
                    key, target, device_key = task
                    task_ids[task] = task_id(s, key, workloads[key][3], target, device_key)
            load(conn, [(n, task_ids[task]) + rest for n, task, rest in chunk])
            moving = mover.submit(_move_stage, conn)
    conn.exec_driver_sql(f"DROP TABLE {STAGE}")
    return dict(counts)


def _move_stage(conn) -> Counter:
    """Move the staged rows into `records` in file order and empty the stage; returns the new
    records by task id."""
    moved = ", ".join(MOVED)
    added = Counter(conn.execute(text(
        f"INSERT INTO records ({moved}) SELECT {moved} FROM {STAGE} WHERE true ORDER BY id "
        "ON CONFLICT (task_id, fingerprint) DO NOTHING RETURNING task_id")).scalars())
    conn.exec_driver_sql(f"{'TRUNCATE' if conn.dialect.name == 'postgresql' else 'DELETE FROM'} {STAGE}")
    return added


def _copy_rows(conn, rows: list) -> None:
    """PostgreSQL: the rows by COPY."""
    raw = conn.connection.driver_connection
    with raw.cursor() as cur, cur.copy(f"COPY {STAGE} ({', '.join(STAGED)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


def _insert_rows(conn, rows: list) -> None:
    """Other back-ends (SQLite): executemany, timestamps in the text SQLAlchemy stores."""
    sql = f"INSERT INTO {STAGE} ({', '.join(STAGED)}) VALUES ({', '.join('?' * len(STAGED))})"
    created = STAGED.index("created_at")
    for start in range(0, len(rows), SQLITE_BATCH):
        batch = []
        for row in rows[start:start + SQLITE_BATCH]:
            at = row[created].astimezone(timezone.utc)
            batch.append(row[:created] + (at.strftime("%Y-%m-%d %H:%M:%S.%f"),) + row[created + 1:])
        conn.exec_driver_sql(sql, batch)
