"""A job's measurements taken again after a slow window, or marked: when, where and why.

A measuring worker is calibrated after every window of measurements (device_agent/calibration.py);
a window whose closing calibration found the worker slow is measured again in a fresh worker
(records.remeasured) or, when no healthy worker could be had, kept but marked
(records.slow_window); either way the record keeps the speed index that found it slow
(records.slow_index). A job's page shows those events: `job_retakes` reads the job's marked
records only (the ix_records_job_id_retaken partial index holds just them, so a poll costs the
same at the end of a long job as at its start) and groups them into windows: the records of one
task, measured by one worker (agent or local), found slow by one calibration (its speed index).
"""

from __future__ import annotations

from sqlalchemy import and_, bindparam, select, text

from .models import JobTaskRow, RecordRow

MAX_RETAKEN_ROWS = 5000      # a job's newest marked records read at most (its page lists windows, not records)
REMEASURED, SLOW_WINDOW = "remeasured", "slow_window"


# The select of a job's marked records (bind `job_id`), newest first (MAX_RETAKEN_ROWS + 1 at most,
# to tell a job with more). Built once: a job page polls it every 2 s, and building the select
# cost as much as running it.
RETAKEN_ROWS = (
    select(RecordRow.id, RecordRow.created_at, JobTaskRow.position, RecordRow.measured_by,
           RecordRow.remeasured, RecordRow.slow_window, RecordRow.slow_index)
    .select_from(RecordRow)
    .outerjoin(JobTaskRow, and_(JobTaskRow.job_id == RecordRow.job_id, JobTaskRow.task_id == RecordRow.task_id))
    # the partial index's predicate, term for term (a planner matches it so; SQLAlchemy would
    # spell a boolean column `remeasured = 1` on SQLite, which SQLite's planner does not match)
    .where(RecordRow.job_id == bindparam("job_id"), RecordRow.job_id.is_not(None),
           text("(records.remeasured OR records.slow_window)"))
    .order_by(RecordRow.job_id.desc(), RecordRow.id.desc()).limit(MAX_RETAKEN_ROWS + 1))


def none_retaken() -> dict:
    """What `job_retakes` says of a job none of whose measurements was re-taken or marked."""
    return {"windows": [], "tasks": {}, "capped": False}


def job_retakes(conn, job_id: int, limit: int = 200) -> dict:
    """On `conn` (a Connection, or Database.read's ReadConnection): {"windows": the job's
    re-taken windows newest first, at most `limit`, each a dict of
    position (of its task in the job), measured_by, kind ("remeasured" or "slow_window"),
    slow_index, count, first_at, last_at; "tasks": {position: {"remeasured": records,
    "slow_window": records}}; "capped": whether more marked records than MAX_RETAKEN_ROWS were
    left unread}."""
    rows = conn.execute(RETAKEN_ROWS, {"job_id": int(job_id)}).all()
    capped = len(rows) > MAX_RETAKEN_ROWS
    groups: dict[tuple, dict] = {}
    tasks: dict = {}
    for r in rows[:MAX_RETAKEN_ROWS]:
        kind = REMEASURED if r.remeasured else SLOW_WINDOW
        per_task = tasks.setdefault(r.position, {REMEASURED: 0, SLOW_WINDOW: 0})
        per_task[kind] += 1
        key = (r.position, r.measured_by, kind, r.slow_index)
        g = groups.get(key)
        if g is None:
            g = groups[key] = {"position": r.position, "measured_by": r.measured_by, "kind": kind,
                               "slow_index": r.slow_index, "count": 0, "first_at": r.created_at, "last_at": r.created_at}
        g["count"] += 1
        g["first_at"] = min(g["first_at"], r.created_at)
        g["last_at"] = max(g["last_at"], r.created_at)
    windows = sorted(groups.values(), key=lambda g: g["last_at"], reverse=True)
    return {"windows": windows[:max(0, int(limit))], "tasks": tasks, "capped": capped}
