"""An agent's health: what its measuring workers' calibrations say, as the tracker hears it.

Each slot of an agent measures in a `CalibratedWorker` (device_agent/calibration.py): calibrated
when it starts, after every window of requests and when it has been idle a while. The verdicts
are the agent's own, because it acts on them inside a window (replace the worker, measure the
window again, mark it) with or without a tracker to ask. What it judges against is the history of
its device key on its host, which the tracker keeps for the farm:

- `FarmHistory`: the SpeedHistory the agent's slots share. It starts with the agent's own
  calibrations and takes in the tracker's history of this key and host when the agent registers
  (Welcome.history), so a restarted agent, or a second agent on the same host, is judged against
  what that host's agents calibrated before. Every calibration gets an id ("<agent>/<n>") and
  waits in `unsent` until a heartbeat carries it to the tracker, which keeps each id once.
- `AgentHealth`: the agent's state over its slots (the worst: one degraded slot makes the agent
  degraded, since the tracker can only stop sending work to the whole agent), its speed index
  (the lowest of its slots' latest) and counters, and the `AgentHealth` message of the protocol.
  A change of state sets `changed` and calls `on_change`, with which the agent sends a heartbeat at
  once instead of at its period: the tracker stops sending work to a degraded agent as soon as it
  is one.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import deque

from .calibration import DEGRADED, HEALTHY, HISTORY_SIZE, METRICS, SLOW, UNKNOWN, SpeedHistory, WindowReport

# worse first: the agent's state is its worst slot's
_RANK = {DEGRADED: 0, SLOW: 1, UNKNOWN: 2, HEALTHY: 3}
HELLO_HISTORY = HISTORY_SIZE       # calibrations an agent brings along when it registers
MAX_UNSENT = 4 * HISTORY_SIZE      # calibrations kept for a tracker that does not answer


def _figure(value) -> float:
    """A speed as the protocol carries it: a figure no sample could give (0, or not finite) is 0."""
    value = float(value)
    return value if math.isfinite(value) and value > 0 else 0.0


def calibration_message(pb, cal: dict):
    """A calibration dict (calibrate()'s, with id, state and speed_index) as a pb.Calibration."""
    index = cal.get("speed_index")
    figures = {m: _figure(cal.get(m) or 0.0) for m in METRICS}   # (no sync_n on one thread)
    disturbed = sorted(set(cal.get("disturbed") or ()) | {m for m, v in figures.items() if v == 0.0})
    return pb.Calibration(id=str(cal["id"]), version=int(cal["version"]), threads=int(cal["threads"]),
                          **figures, disturbed=disturbed,
                          speed_index=float(index) if index is not None and math.isfinite(index) else 0.0,
                          verdict=str(cal.get("state") or UNKNOWN))


def calibration_dict(message) -> dict:
    """A pb.Calibration as the dict judging reads (device_agent.calibration.reference)."""
    return {"id": message.id, "version": message.version, "threads": message.threads,
            **{m: getattr(message, m) for m in METRICS}, "disturbed": list(message.disturbed),
            "speed_index": message.speed_index or None, "state": message.verdict or UNKNOWN}


class FarmHistory(SpeedHistory):
    """The agent's calibrations and those of its key and host the tracker handed it (see the
    module docstring); each calibration this agent takes is also queued to be reported."""

    def __init__(self, agent_name: str):
        super().__init__()
        self.agent_name = agent_name
        self._ids: set = set()
        self._count = itertools.count(1)
        self._unsent: deque = deque(maxlen=MAX_UNSENT)

    def add(self, cal: dict, state: str, index: float | None) -> None:
        item = dict(cal, state=state, speed_index=index, id=f"{self.agent_name}/{next(self._count)}")
        with self._lock:
            self._items.append(item)
            self._ids.add(item["id"])
            self._unsent.append(item)

    def merge(self, calibrations) -> int:
        """Take in calibrations of this key and host from elsewhere (dicts with ids, oldest first),
        before this agent's own, which are the newest; ones already held are skipped. Returns how
        many were new."""
        with self._lock:
            new = [c for c in calibrations if c.get("id") and c["id"] not in self._ids]
            if new:
                self._items = deque(new + list(self._items), maxlen=self._items.maxlen)
                self._ids = {c["id"] for c in self._items if c.get("id")}
        return len(new)

    def take_unsent(self) -> list:
        """The calibrations not yet reported (they are reported now: give them back if that fails)."""
        with self._lock:
            out = list(self._unsent)
            self._unsent.clear()
            return out

    def give_back(self, calibrations: list) -> None:
        """Calibrations a report did not deliver: sent with the next one (oldest first)."""
        with self._lock:
            self._unsent.extendleft(reversed(calibrations))

    def newest(self, n: int = HELLO_HISTORY) -> list:
        with self._lock:
            return list(self._items)[-n:]


class AgentHealth:
    """The agent's state over its slots, and the protocol's AgentHealth message (module docstring)."""

    def __init__(self, agent_name: str):
        self.history = FarmHistory(agent_name)
        self.changed = threading.Event()
        self.on_change = None              # called (no lock held) when the state moves
        self._lock = threading.Lock()
        self._slots: dict[int, WindowReport] = {}
        self._state = UNKNOWN
        self._index: float | None = None

    def update(self, slot: int, report: WindowReport) -> str:
        """Take a slot's report after a calibration; returns the agent's state. `changed` is set
        when the state moved."""
        with self._lock:
            self._slots[slot] = report
            state = min((r.state for r in self._slots.values()), key=lambda s: _RANK.get(s, _RANK[UNKNOWN]))
            indexes = [r.speed_index for r in self._slots.values() if r.speed_index is not None]
            self._index = min(indexes) if indexes else None
            moved = state != self._state
            self._state = state
        if moved:
            self.changed.set()
            if self.on_change is not None:
                self.on_change()
        return state

    @property
    def state(self) -> str:
        with self._lock:
            return self._state

    @property
    def speed_index(self) -> float | None:
        with self._lock:
            return self._index

    def message(self, pb, calibrations: list):
        """pb.AgentHealth with these calibrations (unsent ones for a heartbeat, recent ones for Hello)."""
        with self._lock:
            reports = list(self._slots.values())
            state, index = self._state, self._index
        return pb.AgentHealth(state=state, speed_index=index or 0.0,
                              slow_windows=sum(r.slow_windows for r in reports),
                              remeasured=sum(r.remeasured for r in reports),
                              replacements=sum(r.replacements for r in reports),
                              calibrations=[calibration_message(pb, c) for c in calibrations if c.get("id")])
