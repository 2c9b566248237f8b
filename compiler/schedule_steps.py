"""Replay recorded schedule steps on a fresh compute definition.

Every schedule primitive appends a JSON-able step to `schedule.steps` (see Schedule._record):

    {"op": "split", "stage": 0, "axis": 1, "factor": 8}
    {"op": "compute_at", "stage": 0, "parent": 2, "axis": 5}
    {"op": "cache_read", "tensor": "input1", "scope": "global", "readers": [1], "block": {"1": 16}}
    {"op": "rewrite", "tensor": 1, "name": "winograd", "params": {"tile": 2, "block": 16}}

Stages are referred to by their index in `schedule.stages` at the time of the step, axes by their
index in the stage's `all_iter_vars` (root axes first, then every axis a split or fuse created, in
creation order), inputs by "input{i}" (index in `schedule.placeholders`). So a step list recorded on
one definition replays on any structurally equal one (same canonical text), in another process or
on another machine:

    s = apply_steps(outputs, steps_from_json(text))

`apply_steps` raises ScheduleError naming the step when a step does not apply.
"""

from __future__ import annotations

import json

from .errors import ScheduleError
from .schedule import ANNOTATIONS, Schedule, Stage, create_schedule

# op -> (required fields, optional fields); "op" itself is implied
STEP_FIELDS = {
    "split": ({"stage", "axis"}, {"factor", "nparts"}),
    "fuse": ({"stage", "axes"}, set()),
    "reorder": ({"stage", "axes"}, set()),
    "vectorize": ({"stage", "axis"}, set()),
    "parallel": ({"stage", "axis"}, set()),
    "unroll": ({"stage", "axis"}, set()),
    "auto_unroll": ({"stage", "max_step"}, set()),
    "prefetch": ({"stage", "tensor", "axis", "offset"}, set()),
    "compute_at": ({"stage", "parent", "axis"}, set()),
    "compute_inline": ({"stage"}, set()),
    "compute_root": ({"stage"}, set()),
    "cache_write": ({"tensor", "scope"}, {"order"}),
    "rfactor": ({"tensor", "axis"}, {"factor_axis"}),
    "cache_read": ({"tensor", "scope", "readers"}, {"block", "merge", "stride"}),
    "rewrite": ({"tensor", "name"}, {"params"}),
}


def apply_steps(outputs, steps) -> Schedule:
    """A new schedule of `outputs` with `steps` (a list of step dicts) applied in order."""
    if isinstance(steps, str):
        steps = steps_from_json(steps)
    if not isinstance(steps, (list, tuple)):
        raise ScheduleError(f"steps must be a list of step dicts, got {type(steps).__name__}")
    s = create_schedule(outputs)
    for n, step in enumerate(steps):
        _apply(s, n, step)
    return s


def steps_to_json(steps) -> str:
    """The step list as JSON text (one compact line)."""
    try:
        return json.dumps(list(steps), separators=(",", ":"))
    except TypeError as e:
        raise ScheduleError(f"steps are not JSON-able: {e}") from None


def steps_from_json(text) -> list:
    """Parse JSON text written by steps_to_json; raises ScheduleError when it is not a step list."""
    try:
        steps = json.loads(text)
    except (TypeError, ValueError) as e:
        raise ScheduleError(f"schedule steps are not valid JSON: {e}") from None
    if not isinstance(steps, list) or not all(isinstance(st, dict) for st in steps):
        raise ScheduleError("schedule steps JSON must be a list of objects")
    return steps


# ----------------------------------------------------------------------------- replay

def _apply(s: Schedule, n: int, step):
    if not isinstance(step, dict):
        raise ScheduleError(f"step {n}: expected a dict with an 'op', got {type(step).__name__}")
    op = step.get("op")
    if op not in STEP_FIELDS:
        raise ScheduleError(f"step {n}: unknown op {op!r}; known: {', '.join(STEP_FIELDS)}")
    required, optional = STEP_FIELDS[op]
    fields = set(step) - {"op"}
    missing = required - fields
    if missing:
        raise ScheduleError(f"step {n} ({op}): missing field(s) {', '.join(sorted(missing))}")
    extra = fields - required - optional
    if extra:
        raise ScheduleError(f"step {n} ({op}): unexpected field(s) {', '.join(sorted(extra))}")
    try:
        _dispatch(s, n, op, step)
    except ScheduleError as e:
        msg = str(e)
        if msg.startswith(f"step {n} "):
            raise
        raise ScheduleError(f"step {n} ({op}): {msg}") from None


def _dispatch(s: Schedule, n: int, op: str, step: dict):
    if op == "cache_write":
        tensor = _stage(s, n, step["tensor"], "tensor").tensor
        s.cache_write(tensor, step["scope"], order=step.get("order"))
        return
    if op == "rfactor":
        st = _stage(s, n, step["tensor"], "tensor")
        s.rfactor(st.tensor, _axis(st, n, step["axis"]), step.get("factor_axis", 0))
        return
    if op == "rewrite":
        params = step.get("params") or {}
        if not isinstance(params, dict) or not isinstance(step["name"], str):
            raise ScheduleError(f"step {n} (rewrite): name must be a string and params an object")
        s.rewrite(_stage(s, n, step["tensor"], "tensor").tensor, step["name"], **params)
        return
    if op == "cache_read":
        tensor = _tensor(s, n, step["tensor"])
        readers = step["readers"]
        if not isinstance(readers, list):
            raise ScheduleError(f"step {n} (cache_read): readers must be a list of stage indices")
        reader_stages = [_stage(s, n, r, "readers") for r in readers]
        block = step.get("block")
        if block is not None:
            if not isinstance(block, dict):
                raise ScheduleError(f"step {n} (cache_read): block must map axis -> factor")
            try:
                block = {int(k): v for k, v in block.items()}
            except (TypeError, ValueError):
                raise ScheduleError(f"step {n} (cache_read): block axes must be integers, got "
                                    f"{list(block)}") from None
        s.cache_read(tensor, step["scope"], [st.tensor for st in reader_stages], block=block, merge=step.get("merge"),
                     stride=step.get("stride"))
        return
    st = _stage(s, n, step["stage"], "stage")
    if op == "split":
        st.split(_axis(st, n, step["axis"]), factor=step.get("factor"), nparts=step.get("nparts"))
    elif op in ("fuse", "reorder"):
        axes = step["axes"]
        if not isinstance(axes, list):
            raise ScheduleError(f"step {n} ({op}): axes must be a list of axis indices")
        ivs = [_axis(st, n, a) for a in axes]
        getattr(st, op)(*ivs)
    elif op in ANNOTATIONS:
        getattr(st, op)(_axis(st, n, step["axis"]))
    elif op == "auto_unroll":
        st.auto_unroll(step["max_step"])
    elif op == "prefetch":
        st.prefetch(_tensor(s, n, step["tensor"]), _axis(st, n, step["axis"]), step["offset"])
    elif op == "compute_at":
        parent = _stage(s, n, step["parent"], "parent")
        st.compute_at(parent, _axis(parent, n, step["axis"]))
    elif op == "compute_inline":
        st.compute_inline()
    elif op == "compute_root":
        st.compute_root()
    else:  # pragma: no cover - STEP_FIELDS and this dispatch list the same ops
        raise ScheduleError(f"step {n}: unhandled op {op!r}")


def _index(value, n, what) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ScheduleError(f"step {n}: {what} must be an integer index, got {value!r}")
    return value


def _stage(s: Schedule, n: int, value, what: str) -> Stage:
    i = _index(value, n, what)
    if not 0 <= i < len(s.stages):
        raise ScheduleError(f"step {n}: {what} index {i} out of range; the schedule has {len(s.stages)} "
                            f"stages ({', '.join(st.name for st in s.stages)}) - was it recorded on another "
                            "definition?")
    return s.stages[i]


def _axis(st: Stage, n: int, value):
    i = _index(value, n, "axis")
    if not 0 <= i < len(st.all_iter_vars):
        raise ScheduleError(f"step {n}: axis index {i} out of range for stage {st.name}, which has "
                            f"{len(st.all_iter_vars)} axes ({', '.join(iv.name for iv in st.all_iter_vars)})")
    return st.all_iter_vars[i]


def _tensor(s: Schedule, n: int, ref):
    if isinstance(ref, str):
        if ref.startswith("input") and ref[5:].isdigit():
            i = int(ref[5:])
            if i < len(s.placeholders):
                return s.placeholders[i]
            raise ScheduleError(f"step {n}: {ref} out of range; the definition has {len(s.placeholders)} inputs")
        raise ScheduleError(f"step {n}: tensor must be a stage index or 'input<i>', got {ref!r}")
    return _stage(s, n, ref, "tensor").tensor


__all__ = ["apply_steps", "steps_to_json", "steps_from_json", "STEP_FIELDS"]
