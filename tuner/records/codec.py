"""Conversions between rows, values and JSON lines.

The JSON-lines form is self-contained (workload key, name and parameters, target, device key,
candidate, result, time), so records move between databases and machines without the importing
side needing to rebuild the operator: custom workloads need not be registered there. A workload
defined as a compute DAG carries its definition, so its kernels can be rebuilt from the line
alone; on import the definition must give the line's workload key. Job ids are left out: they
only mean something inside the database that made them.

Format versions: 2 added `workload.definition`. A line without one is still written as version
1, so an older tunefarm keeps importing the records it can use. A result's slow-window marks
(`slow_window`, `remeasured`, `slow_index`: device_agent/calibration.py) are written only when
set, so an unmarked line reads as before; an older tunefarm ignores them.
"""

from __future__ import annotations

import functools
import json
import math
from datetime import datetime, timezone
from numbers import Real
from typing import NamedTuple

from sqlalchemy import Text, cast

from ..candidate import Candidate, ErrorCode, MeasureResult
from ..workload import Workload
from .models import RecordRow, WorkloadRow
from .task_cache import TaskInfo
from .values import Record, StoreError, utcnow

FORMAT_VERSION = 2


def mean_cost_column(result: MeasureResult) -> float | None:
    """The value stored in `records.mean_cost`: NULL for anything that is not a valid timing."""
    if not result.ok or not result.costs:
        return None
    cost = result.mean_cost
    return cost if math.isfinite(cost) else None


def record_values(task_id: int, job_id: int | None, candidate: Candidate, result: MeasureResult,
                  created_at: datetime) -> dict:
    """Column values of one records row."""
    return {
        "task_id": task_id,
        "job_id": job_id,
        "candidate_kind": candidate.kind,
        "candidate": candidate.to_json(),
        "fingerprint": candidate.fingerprint,
        "costs": [float(c) for c in result.costs],
        "mean_cost": mean_cost_column(result),
        "error_code": int(result.error_code),
        "error_msg": result.error_msg or "",
        "build_seconds": float(result.build_seconds),
        "run_seconds": float(result.run_seconds),
        "measured_by": result.measured_by,
        "emulated": bool(result.emulated),
        "slow_window": bool(result.slow_window),
        "remeasured": bool(result.remeasured),
        "slow_index": slow_index_column(result),
        "created_at": created_at,
        **timing_values(result),
    }


def slow_index_column(result: MeasureResult) -> float | None:
    """records.slow_index: the speed index that found a marked or re-measured record's window slow."""
    if not (result.slow_window or result.remeasured) or result.slow_index is None:
        return None
    index = float(result.slow_index)
    return index if math.isfinite(index) else None


def timing_values(result: MeasureResult) -> dict:
    """The measurement protocol's columns of a record (NULL for an error or a result without them)."""
    t = result.timing_summary() or {}
    return {"min_cost": t.get("min"), "cost_spread": t.get("spread"), "samples": t.get("count"),
            "disturbed": t.get("disturbed"), "lost_fraction": t.get("lost_fraction"), "host_busy": t.get("host_busy")}


_ERROR_CODES = {int(code): code for code in ErrorCode}


def _error_code(value: int):
    """The ErrorCode of a stored number; a code added by a newer tunefarm stays a number."""
    return _ERROR_CODES.get(value, value)


# what a record read selects: its own columns, never its task's (task_cache has those); to_record
# unpacks them in this order
RECORD_COLUMNS = (RecordRow.id, RecordRow.task_id, RecordRow.job_id, RecordRow.candidate, RecordRow.costs,
                  RecordRow.error_code, RecordRow.error_msg, RecordRow.build_seconds, RecordRow.run_seconds,
                  RecordRow.measured_by, RecordRow.created_at, RecordRow.retimed_cost, RecordRow.fingerprint,
                  RecordRow.mean_cost, RecordRow.min_cost, RecordRow.cost_spread, RecordRow.samples,
                  RecordRow.disturbed, RecordRow.lost_fraction, RecordRow.host_busy, RecordRow.beats_default,
                  RecordRow.emulated, RecordRow.slow_window, RecordRow.remeasured, RecordRow.slow_index)


# what a records page selects (the store's page reads with page_rows=True): RECORD_COLUMNS with the
# candidate and the costs as their stored JSON text, which the API's page writes verbatim (decoding
# them and encoding them again was a fifth of a page's CPU; PageRow)
PAGE_COLUMNS = tuple(cast(c, Text) if c is RecordRow.candidate or c is RecordRow.costs else c for c in RECORD_COLUMNS)


class PageRow(NamedTuple):
    """A record as a page shows it, not as code uses it: its row of PAGE_COLUMNS (by position, the
    candidate and the costs still the JSON text the database holds) and its task."""

    row: tuple
    task: TaskInfo

    @property
    def id(self) -> int:
        return self.row[0]

    @property
    def mean_cost(self) -> float | None:
        """The records.mean_cost column: what an order by cost pages by."""
        return self.row[13]


def to_workload(row: WorkloadRow) -> Workload:
    return Workload(row.name, dict(row.params), row.definition)


def to_record(row, task: TaskInfo) -> Record:
    """A record from a row of RECORD_COLUMNS and its task (see task_cache: tasks are looked up,
    not joined into every row). The row is unpacked by position: a named attribute of a
    SQLAlchemy row costs a microsecond, a page of records reads hundreds of them."""
    (rid, _task_id, job_id, candidate, costs, code, msg, build_s, run_s, measured_by, created_at, retimed,
     _fingerprint, figure, min_cost, spread, samples, disturbed, lost, busy, beats_default, emulated, slow_window,
     remeasured, slow_index) = row
    result = MeasureResult(costs=list(costs), error_code=_error_code(code), error_msg=msg, build_seconds=build_s,
                           run_seconds=run_s, measured_by=measured_by, median=figure, minimum=min_cost, spread=spread,
                           samples=samples or 0, disturbed=bool(disturbed), lost_fraction=lost or 0.0, host_busy=busy or 0.0,
                           emulated=bool(emulated), slow_window=bool(slow_window), remeasured=bool(remeasured),
                           slow_index=slow_index)
    return Record(workload_key=task.workload_key, workload=task.workload, target=task.target, device_key=task.device_key,
                  candidate=Candidate(candidate["kind"], candidate["payload"]), result=result,
                  job_id=job_id, created_at=created_at, id=rid, retimed_cost=retimed, beats_default=beats_default)


def to_line(record: Record) -> str:
    r = record.result
    result = {"costs": r.costs, "error_code": int(r.error_code), "error_msg": r.error_msg,
              "build_seconds": r.build_seconds, "run_seconds": r.run_seconds, "measured_by": r.measured_by,
              **({"timing": t} if (t := r.timing_summary()) else {}), **({"emulated": True} if r.emulated else {}),
              **slow_marks(r.slow_window, r.remeasured, slow_index_column(r))}
    tail = line_tail(record.workload_key, record.workload, record.target)
    return _line(record.candidate.to_json(), record.created_at, record.device_key, result, tail)


def slow_marks(slow_window, remeasured, slow_index) -> dict:
    """A line's result fields of the slow-window marks: only those that are set."""
    marks: dict = {}
    if remeasured:
        marks["remeasured"] = True
    if slow_index is not None and (slow_window or remeasured):
        marks["slow_index"] = float(slow_index)
    if slow_window:
        marks["slow_window"] = True
    return marks


def line_tail(workload_key: str, workload: Workload, target: str) -> str:
    """The end of a line, after its result: the same for every record of a workload on a target,
    so an export writes it once per task instead of encoding a long target string per line."""
    version = FORMAT_VERSION if workload.definition is not None else 1
    return (f", {_TARGET}{json.dumps(target)}, {_VERSION}{version}, {_WORKLOAD}"
            f"{json.dumps(workload.to_json(), sort_keys=True)}, {_KEY}{json.dumps(workload_key)}}}")


# what an export selects: RECORD_COLUMNS' values for a line, the JSON columns as their stored text
# (written with sorted keys: engine.sorted_json, bulk_import; older rows keep their order, the same
# JSON), which goes into the line verbatim
EXPORT_COLUMNS = (RecordRow.id, RecordRow.task_id, cast(RecordRow.candidate, Text), cast(RecordRow.costs, Text),
                  RecordRow.error_code, RecordRow.error_msg, RecordRow.build_seconds, RecordRow.run_seconds,
                  RecordRow.measured_by, RecordRow.created_at, RecordRow.mean_cost, RecordRow.min_cost,
                  RecordRow.cost_spread, RecordRow.samples, RecordRow.disturbed, RecordRow.lost_fraction,
                  RecordRow.host_busy, RecordRow.emulated, RecordRow.slow_window, RecordRow.remeasured, RecordRow.slow_index)


def row_to_line(row, tail: str, device_key: str) -> str:
    """to_line(to_record(...)) of a row of EXPORT_COLUMNS, written without building the record
    or decoding its JSON: the export's path, where a million rows pass through. `tail` is
    line_tail of the row's task. The result object is spelled out as json.dumps(sort_keys=True)
    writes MeasureResult's fields (a test holds the two equal)."""
    (_rid, _task_id, candidate, costs, code, msg, build_s, run_s, measured_by, created_at, figure, min_cost, spread,
     samples, disturbed, lost, busy, emulated, slow_window, remeasured, slow_index) = row
    marked = ""
    if slow_window or remeasured:    # keys in sorted order, between run_seconds and timing
        marked = "".join(f', "{k}": {"true" if v is True else _number(v)}'
                         for k, v in slow_marks(slow_window, remeasured, slow_index).items() if k != "remeasured")
    result = (f'{{"build_seconds": {_number(build_s)}, "costs": {costs}, {_EMULATED if emulated else ""}"error_code": {code}, '
              f'"error_msg": {json.dumps(msg)}, "measured_by": {json.dumps(measured_by)}, '
              f'{_REMEASURED if remeasured else ""}"run_seconds": {_number(run_s)}{marked}')
    if code == ErrorCode.NO_ERROR and figure is not None and min_cost is not None:   # MeasureResult.timing_summary
        result += (f', "timing": {{"count": {int(samples or 0)}, "disturbed": {"true" if disturbed else "false"}, '
                   f'"host_busy": {_number(busy or 0.0)}, "lost_fraction": {_number(lost or 0.0)}, '
                   f'"median": {_number(figure)}, "min": {_number(min_cost)}, "spread": {_number(spread)}}}')
    return (f'{{"candidate": {candidate}, "created_at": "{created_at.isoformat()}", "device_key": {json.dumps(device_key)}, '
            f'"result": {result}}}{tail}')


_EMULATED = '"emulated": true, '
_REMEASURED = '"remeasured": true, '


def _number(x) -> str:
    """A float as json.dumps writes it (None: null)."""
    if x is None:
        return "null"
    return float.__repr__(float(x)) if math.isfinite(x) else json.dumps(float(x))


_TARGET, _VERSION, _WORKLOAD, _KEY = '"target": ', '"v": ', '"workload": ', '"workload_key": '


def _line(candidate: dict, created_at: datetime, device_key: str, result: dict, tail: str) -> str:
    """A line as json.dumps(..., sort_keys=True) writes it, its keys in that order: candidate,
    created_at, device_key, result, then the task's tail (target, v, workload, workload_key)."""
    return (f'{{"candidate": {json.dumps(candidate, sort_keys=True)}, "created_at": "{created_at.isoformat()}", '
            f'"device_key": {json.dumps(device_key)}, "result": {json.dumps(result, sort_keys=True)}{tail}')


TIMING_TYPES = {"median": Real, "min": Real, "spread": Real, "count": int, "disturbed": bool, "lost_fraction": Real,
                "host_busy": Real}   # a line's result.timing (MeasureResult.timing_summary); host_busy may be absent


def from_line(line: str, lineno: int) -> Record:
    """Parse and check one JSON line; any problem is a StoreError naming the line."""
    (key, workload, target, device_key, kind, payload, costs, code, msg, build_s, run_s, measured_by, emulated,
     timing, created_at, slow_window, remeasured, slow_index) = checked_line(line, lineno)
    result = MeasureResult(costs=costs, error_code=ErrorCode(code), error_msg=msg, build_seconds=build_s,
                           run_seconds=run_s, measured_by=measured_by, emulated=emulated, slow_window=slow_window,
                           remeasured=remeasured, slow_index=slow_index)
    if timing is not None:
        result.take_timing(timing)
    return Record(workload_key=key, workload=workload, target=target, device_key=device_key,
                  candidate=Candidate(kind, payload), result=result, created_at=created_at)


def checked_line(line: str, lineno: int, workloads: dict | None = None) -> tuple:
    """The checked fields of one JSON line, in from_line's order: (workload key, Workload, target,
    device key, candidate kind, candidate payload, costs, error code, error message, build seconds,
    run seconds, measured by, emulated, timing summary or None, created at, slow window, re-measured,
    slow index or None). The one check of the
    format, shared by from_line and the bulk import (which builds rows, not Records); any problem is
    a StoreError naming the line.

    `workloads`: {key: (name, params, definition, Workload)} of the lines before, so the thousands
    of lines of one workload in a file build and check it once."""
    try:
        return _checked(json.loads(line), workloads)
    except json.JSONDecodeError as e:
        raise StoreError(f"line {lineno}: not JSON: {e}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        what = f"missing field {e}" if isinstance(e, KeyError) else str(e)
        raise StoreError(f"line {lineno}: not a tunefarm record: {what}") from None


_PLAIN = {str: str, dict: dict, list: list, int: int, bool: bool, float: Real}   # a JSON value's type -> what it passes


def _check(value, kind, name):
    if _PLAIN.get(type(value)) is kind or (kind is Real and type(value) is int):   # what json.loads gives: no ABC check
        return value
    if kind is Real:
        ok = isinstance(value, Real) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise TypeError(f"{name} must be {getattr(kind, '__name__', kind)}, got {type(value).__name__}")
    return value


@functools.lru_cache(maxsize=64)
def _definition_key(name: str, definition_text: str) -> str:
    """Workload key of a DAG definition (records of one workload share it: parsed once)."""
    return Workload(name, {}, json.loads(definition_text)).key


def _checked_workload(key: str, wl: dict, workloads: dict | None) -> Workload:
    name = _check(wl["name"], str, "workload.name")
    params = _check(wl.get("params", {}), dict, "workload.params")
    definition = wl.get("definition")
    seen = workloads.get(key) if workloads is not None else None
    if seen is not None and seen[0] == name and seen[1] == params and seen[2] == definition:
        return seen[3]
    if definition is not None:
        _check(definition, dict, "workload.definition")
        defined_key = _definition_key(name, json.dumps(definition, sort_keys=True))
        if defined_key != key:
            raise ValueError(f"workload.definition is the DAG of workload {defined_key}, not of the line's "
                             f"workload_key {key}")
    workload = Workload(name, params, definition)
    if workloads is not None and seen is None:
        workloads[key] = (name, params, definition, workload)
    return workload


def _checked(d, workloads: dict | None) -> tuple:
    _check(d, dict, "the line")
    version = d.get("v", 1)
    if isinstance(version, bool) or version not in range(1, FORMAT_VERSION + 1):
        raise ValueError(f"unsupported format version {version!r} (this tunefarm reads 1 to {FORMAT_VERSION}; "
                         "a newer one wrote it)")
    key = _check(d["workload_key"], str, "workload_key")
    if not key or len(key) > 64:
        raise ValueError("workload_key must be 1 to 64 characters")
    wl, cand, res = (_check(d[k], dict, k) for k in ("workload", "candidate", "result"))
    workload = _checked_workload(key, wl, workloads)
    kind, payload = _check(cand["kind"], str, "candidate.kind"), _check(cand["payload"], dict, "candidate.payload")
    costs = [float(_check(c, Real, "result.costs[]")) for c in _check(res["costs"], list, "result.costs")]
    code = int(ErrorCode(_check(res["error_code"], int, "result.error_code")))
    timing = res.get("timing")
    if timing is not None and code == ErrorCode.NO_ERROR:   # the measurement protocol's summary (absent in older lines)
        _check(timing, dict, "result.timing")
        for field, kind_ in TIMING_TYPES.items():   # not `key`: that name holds the line's workload key
            _check(timing.get(field, 0.0 if field == "host_busy" else None), kind_, f"result.timing.{field}")
    else:
        timing = None
    created = d.get("created_at")
    created_at = datetime.fromisoformat(_check(created, str, "created_at")) if created is not None else utcnow()
    if created_at.tzinfo is None:
        created_at = created_at.replace(tzinfo=timezone.utc)
    return (key, workload, _check(d["target"], str, "target"), _check(d.get("device_key", "local"), str, "device_key"),
            kind, payload, costs, code, _check(res.get("error_msg", ""), str, "result.error_msg"),
            float(_check(res.get("build_seconds", 0.0), Real, "result.build_seconds")),
            float(_check(res.get("run_seconds", 0.0), Real, "result.run_seconds")),
            _check(res.get("measured_by", "unknown"), str, "result.measured_by"),
            _check(res.get("emulated", False), bool, "result.emulated"), timing, created_at, *_checked_marks(res))


def _checked_marks(res: dict) -> tuple:
    """(slow_window, remeasured, slow_index or None) of a line's result (absent: unmarked)."""
    slow_window = _check(res.get("slow_window", False), bool, "result.slow_window")
    remeasured = _check(res.get("remeasured", False), bool, "result.remeasured")
    index = res.get("slow_index")
    if index is not None:
        index = float(_check(index, Real, "result.slow_index"))
        if not (math.isfinite(index) and index >= 0):
            raise ValueError(f"result.slow_index must be finite and non-negative, got {index}")
        if not (slow_window or remeasured):
            index = None
    return slow_window, remeasured, index
