"""Workloads with weights from a JSON or YAML file: what `tunefarm tune --workloads FILE` reads.

    {"workloads": [{"op": "conv2d_nchw", "params": {"N": 1, "C": 64, ...}, "weight": 3},
                   {"op": "dense", "params": {...}}]}

A bare list of entries works too. `weight` (default 1) is how much the task counts in the
objective of the task scheduler: how often the operator occurs in a model. Every problem is a
WorkloadError naming the entry and the field; nothing is tuned until the whole file checks.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .workload import Workload, WorkloadError


def read_workloads(path) -> list[tuple[Workload, float]]:
    """[(workload, weight)] of the file; WorkloadError on anything malformed."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise WorkloadError(f"cannot read workloads file {path}: {e.strerror or e}") from None
    data = _parse(text, path)
    entries = data.get("workloads") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries:
        raise WorkloadError(f"{path}: expected a non-empty list of workloads (or {{\"workloads\": [...]}})")
    return [_entry(e, i, path) for i, e in enumerate(entries)]


def _parse(text: str, path: Path):
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise WorkloadError(f"{path}: reading YAML needs PyYAML (pip install pyyaml), or use JSON") from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise WorkloadError(f"{path}: not valid YAML: {e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise WorkloadError(f"{path}: not valid JSON: {e}") from None


def _entry(e, i: int, path: Path) -> tuple[Workload, float]:
    where = f"{path}: workloads[{i}]"
    if not isinstance(e, dict):
        raise WorkloadError(f"{where} must be an object with 'op' (and 'params', 'weight')")
    unknown = set(e) - {"op", "params", "weight"}
    if unknown:
        raise WorkloadError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}; expected op, params, weight")
    op = e.get("op")
    if not isinstance(op, str) or not op:
        raise WorkloadError(f"{where}.op must be an operator name")
    params = e.get("params", {})
    if not isinstance(params, dict):
        raise WorkloadError(f"{where}.params must be an object of parameter values")
    weight = e.get("weight", 1)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not (math.isfinite(weight) and weight > 0):
        raise WorkloadError(f"{where}.weight must be a positive number, got {weight!r}")
    workload = Workload(op, params)
    try:
        workload.opdef()  # type-checks the parameters now, before any tuning starts
    except WorkloadError as err:
        raise WorkloadError(f"{where}: {err}") from None
    return workload, float(weight)

