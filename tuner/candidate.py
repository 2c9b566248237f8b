"""Candidates and measurement results: the values that flow between search, build, run and store."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from enum import IntEnum
from functools import cached_property


class ErrorCode(IntEnum):
    NO_ERROR = 0
    INSTANTIATION_ERROR = 1  # the candidate does not give a valid schedule for the workload
    COMPILE_ERROR = 2        # lowering/LLVM failed
    BUILD_TIMEOUT = 3
    RUNTIME_ERROR = 4        # the kernel crashed (signal) or raised while running
    WRONG_ANSWER = 5         # result differs from the reference beyond tolerance
    RUN_TIMEOUT = 6          # the kernel hung past its timeout
    RUNNER_ERROR = 7         # the measuring side failed (worker lost, farm error)


@dataclass(frozen=True)
class Candidate:
    """A point of a search space: a template config or a sketch trace, as JSON-able data."""

    kind: str       # "config" | "trace"
    payload: dict   # {"template": name, "knobs": {...}} or {"sketch": name, "steps": [...]}

    @cached_property
    def fingerprint(self) -> str:
        """Stable identity for 'never measure the same candidate twice' (payloads are never
        changed after construction, so it is computed once: search compares fingerprints often)."""
        text = json.dumps({"kind": self.kind, "payload": self.payload}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def to_json(self) -> dict:
        return {"kind": self.kind, "payload": self.payload}

    @staticmethod
    def from_json(d: dict) -> "Candidate":
        return Candidate(d["kind"], d["payload"])


@dataclass
class MeasureResult:
    costs: list = field(default_factory=list)   # seconds per run; empty on error
    error_code: ErrorCode = ErrorCode.NO_ERROR
    error_msg: str = ""
    build_seconds: float = 0.0
    run_seconds: float = 0.0
    measured_by: str = "local"

    @property
    def ok(self) -> bool:
        return self.error_code == ErrorCode.NO_ERROR

    @property
    def mean_cost(self) -> float:
        return sum(self.costs) / len(self.costs) if self.costs else float("inf")
