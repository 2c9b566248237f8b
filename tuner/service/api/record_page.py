"""A page of records written as JSON text straight from the rows the store read.

A records page is the API's most frequent large answer (the dashboard's tables, `tunefarm
records`, every client that follows a job). Built as 50 Records and encoded from dicts
(schemas.record_json), a page spent a tenth of its CPU decoding each candidate's JSON only to
encode it again, and as much building the Record, MeasureResult and dict objects. Here the store's
page rows (codec.PageRow: the candidate and the costs still the text the database holds) are
written as they are: the candidate and the costs verbatim, a task's part (workload, target,
device key) encoded once per task, and the rest a few numbers and strings. Costs are decoded
only where the text cannot stand as it is (NaN or Infinity, which SQLite's JSON text can hold
and the models write as null) or where a row from before the figure column needs their mean.
The JSON is the one RecordPage's models give for the same records (tests/test_api.py holds them
equal on SQLite and PostgreSQL), so the OpenAPI document's RecordPage stays its contract.
"""

from __future__ import annotations

import json
from threading import Lock

from fastapi import Response

from ...records.codec import PageRow
from ...records.task_cache import MAX_TASKS, TaskInfo
from .schemas import error_name, finite, utc_text

_task_parts: dict[int, tuple[TaskInfo, str]] = {}
_task_parts_lock = Lock()


def record_page_response(rows: list[PageRow], next_before: int | None = None, next_after: int | None = None,
                         next_after_cost: float | None = None) -> Response:
    """A RecordPage's response (next_after and next_after_cost left out when null, as
    RecordPage's exclude_if does)."""
    tail = f',"next_before":{"null" if next_before is None else int(next_before)}'
    if next_after is not None:
        tail += f',"next_after":{int(next_after)}'
    if next_after_cost is not None:
        tail += f',"next_after_cost":{_number(next_after_cost)}'
    return Response(f'{{"items":[{",".join(map(_item, rows))}]{tail}}}', media_type="application/json")


def _item(page_row: PageRow) -> str:
    """One record's RecordOut JSON (schemas.record_json's fields, in its order)."""
    row = page_row.row
    (rid, _task_id, job_id, candidate, costs, code, msg, build_s, run_s, measured_by, created_at, retimed,
     _fingerprint, figure) = row[:14]
    costs = costs or "[]"
    ok = code == 0 and costs != "[]"
    if (ok and figure is None) or "N" in costs or "I" in costs:   # a row from before the figure column; NaN, Infinity
        values = json.loads(costs)
        costs = f'[{",".join(_number(c) for c in values)}]'
        figure = sum(values) / len(values) if ok and figure is None else figure
    mean = figure if ok else None
    cost = (retimed if retimed is not None else mean) if ok else None
    result = (f'{{"costs":{costs},"mean_cost":{_number(mean)},"error_code":{int(code)},'
              f'"error_name":{json.dumps(error_name(int(code)))},"error_msg":{json.dumps(msg)},'
              f'"build_seconds":{_number(build_s)},"run_seconds":{_number(run_s)},'
              f'"measured_by":{json.dumps(measured_by)},"emulated":{"true" if row[21] else "false"},'   # [21]: emulated
              # [22], [23], [24]: slow_window, remeasured, slow_index
              f'"slow_window":{"true" if row[22] else "false"},"remeasured":{"true" if row[23] else "false"},'
              f'"slow_index":{_number(row[24]) if row[22] or row[23] else "null"}}}')
    return (f'{{"id":{int(rid)},{_task_part(page_row.task)},"job_id":{"null" if job_id is None else int(job_id)},'
            f'"candidate":{candidate},"result":{result},"retimed_cost":{_number(retimed)},"cost":{_number(cost)},'
            f'"created_at":"{utc_text(created_at)}"}}')


def _task_part(task: TaskInfo) -> str:
    """`"workload":{...},"target":...,"device_key":...` of a task, encoded once per task (its
    workload's parameters can be long; a page's records mostly share a few tasks). Keyed by the
    store's TaskInfo object: a task row never changes, and the store hands out one object per
    task until its own cache starts again."""
    hit = _task_parts.get(id(task))
    if hit is not None and hit[0] is task:
        return hit[1]
    wl = task.workload
    workload = {"key": task.workload_key, "name": wl.name, "params": dict(wl.params), "is_compute": wl.definition is not None}
    text = (f'"workload":{json.dumps(workload, separators=(",", ":"))},"target":{json.dumps(task.target)},'
            f'"device_key":{json.dumps(task.device_key)}')
    with _task_parts_lock:
        if len(_task_parts) >= MAX_TASKS:     # as the store's task cache: then start again empty
            _task_parts.clear()
        _task_parts[id(task)] = (task, text)
    return text


def _number(x) -> str:
    """A JSON number; null for None and for what is not finite (as the models write them)."""
    value = finite(x)
    return "null" if value is None else repr(value)


__all__ = ["record_page_response"]
