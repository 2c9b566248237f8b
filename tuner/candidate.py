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
    UNSUPPORTED_TARGET = 8   # the measuring machine cannot run the kernel's target (another ISA, missing CPU features)


def copy_json(value):
    """A deep copy of JSON-like data (dicts, lists, tuples, scalars): what copy.deepcopy gives
    for it, without deepcopy's memo and dispatch (several times faster; the search copies every
    candidate's parameters and steps it makes)."""
    t = type(value)
    if t is dict:
        return {k: copy_json(v) for k, v in value.items()}
    if t is list:
        return [copy_json(v) for v in value]
    if t is tuple:
        return tuple(copy_json(v) for v in value)
    return value


def candidate_text(kind: str, payload: dict) -> str:
    """A candidate's canonical JSON (sorted keys): what its fingerprint hashes, and what a bulk
    import stores as its `candidate` column without building the Candidate."""
    return json.dumps({"kind": kind, "payload": payload}, sort_keys=True)


def fingerprint_of(text: str) -> str:
    """The fingerprint of a candidate's canonical JSON (candidate_text)."""
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Candidate:
    """A point of a search space: a template config or a sketch trace, as JSON-able data."""

    kind: str       # "config" | "trace"
    payload: dict   # {"template": name, "knobs": {...}} or {"sketch": name, "steps": [...]}

    @cached_property
    def fingerprint(self) -> str:
        """Stable identity for 'never measure the same candidate twice' (payloads are never
        changed after construction, so it is computed once: search compares fingerprints often)."""
        return fingerprint_of(candidate_text(self.kind, self.payload))

    def to_json(self) -> dict:
        return {"kind": self.kind, "payload": self.payload}

    @staticmethod
    def from_json(d: dict) -> "Candidate":
        return Candidate(d["kind"], d["payload"])


@dataclass
class MeasureResult:
    """One candidate's measurement, as the measurement protocol (compiler.timing) took it.

    `costs` are the samples the figure was taken from (seconds per call, at most a few dozen kept);
    `median` is the figure itself. Results from before the protocol, or from an older agent, have
    no median: their figure is the mean of `costs`."""

    costs: list = field(default_factory=list)   # seconds per call; empty on error
    error_code: ErrorCode = ErrorCode.NO_ERROR
    error_msg: str = ""
    build_seconds: float = 0.0
    run_seconds: float = 0.0
    measured_by: str = "local"
    median: float | None = None      # the figure: median of the clean samples
    minimum: float | None = None
    spread: float | None = None      # interquartile range / median of those samples
    samples: int = 0                 # how many samples the figure is taken from
    disturbed: bool = False          # other processes kept the kernel waiting, even after retries
    lost_fraction: float = 0.0       # share of the kernel threads' time spent waiting for a CPU
    host_busy: float = 0.0           # CPUs' worth of other processes' work during the timing
    emulated: bool = False           # timed under an instruction-set emulator (qemu-user board): never mixed with native
    slow_window: bool = False        # timed in a window whose closing calibration found the worker slow (not re-taken)
    remeasured: bool = False         # re-taken in a fresh worker after a slow window (device_agent/calibration.py)
    slow_index: float | None = None  # with either: the speed index of the calibration that found the window slow

    @property
    def ok(self) -> bool:
        return self.error_code == ErrorCode.NO_ERROR

    @property
    def cost(self) -> float:
        """Seconds per call: the protocol's median, else the mean of the costs; inf on error."""
        if not self.costs and self.median is None:
            return float("inf")
        if self.median is not None:
            return self.median
        return sum(self.costs) / len(self.costs)

    def timing_summary(self) -> dict | None:
        """The protocol's summary as measuring workers send it (compiler.timing.Timing.to_dict's
        keys; records' JSON lines and the farm's Timing message carry the same); None for an
        error or a result from before the protocol."""
        if not self.ok or self.median is None or self.minimum is None:
            return None
        return {"median": self.median, "min": self.minimum, "spread": self.spread, "count": self.samples,
                "disturbed": self.disturbed, "lost_fraction": self.lost_fraction, "host_busy": self.host_busy}

    def take_timing(self, timing: dict) -> "MeasureResult":
        """Fill the protocol's fields from such a summary (host_busy may be absent); returns self."""
        self.median, self.minimum = float(timing["median"]), float(timing["min"])
        self.spread, self.samples = float(timing["spread"]), int(timing["count"])
        self.disturbed, self.lost_fraction = bool(timing["disturbed"]), float(timing["lost_fraction"])
        self.host_busy = float(timing.get("host_busy", 0.0))
        return self

    @property
    def mean_cost(self) -> float:
        """The same as `cost` (the name predates the measurement protocol's median; the records
        table's column keeps it)."""
        return self.cost
