"""Agent health as the tracker keeps it: each agent's reported state, and each host's calibrations.

Agents calibrate their measuring workers and judge them themselves (device_agent/health.py says
why the verdict is the agent's); the tracker keeps what the farm needs from those verdicts:

- `HealthReport`: an agent's state (healthy, slow, degraded, unknown), speed index and counters,
  as its last Hello or heartbeat said. A degraded agent gets no work (state.py keeps it out of its
  key's dispatch) until a report says otherwise; a slow one is handed work after healthy ones.
  An agent that does not calibrate (protocol 5) is "unknown" and served as before.
- `HostHistories`: per device key and host, the newest calibrations the agents there reported,
  each id once. An agent gets its key's history on its host back when it registers (Welcome), so
  an agent that restarts, or a second one on the same host, is judged against what that host's
  agents measured before: the same (device key, host) history the local runner keeps in the
  records store. The tracker keeps no durable state: after a restart the agents' Hellos, which
  carry their recent calibrations, seed it again.

Pure Python (no gRPC): state.py's rules are tested with a fake clock; `report_of` reads a
protocol message by its field names and turns bad values into InvalidRequest's message.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field

HEALTHY, SLOW, DEGRADED, UNKNOWN = "healthy", "slow", "degraded", "unknown"
STATES = (HEALTHY, SLOW, DEGRADED, UNKNOWN)
VERDICTS = (HEALTHY, SLOW, UNKNOWN)          # what one calibration can say (degraded is a device's state)
HOST_HISTORY = 100                           # calibrations kept per device key and host
MAX_HOSTS = 4096                             # (device key, host) histories kept, least recently used out
MAX_CALIBRATIONS = 200                       # calibrations one report may carry
MAX_ID = 128
FIGURES = ("fma_1", "fma_n", "stream_1", "stream_n", "sync_n")


@dataclass
class HealthReport:
    """An agent's health as it last reported it; `calibrations` are (id, message) pairs, oldest first."""

    state: str = UNKNOWN
    speed_index: float | None = None
    slow_windows: int = 0
    remeasured: int = 0
    replacements: int = 0
    calibrations: list = field(default_factory=list)


def report_of(message, where: str) -> HealthReport:
    """The HealthReport of a protocol AgentHealth message; raises ValueError naming the field
    (`where`: the message's path, e.g. "HeartbeatRequest.health") when a value is not one an
    agent sends."""
    state = message.state or UNKNOWN
    if state not in STATES:
        raise ValueError(f"{where}.state {state[:40]!r} is not one of {', '.join(STATES)}")
    index = float(message.speed_index)
    if not (math.isfinite(index) and index >= 0):
        raise ValueError(f"{where}.speed_index must be finite and non-negative, got {index}")
    if len(message.calibrations) > MAX_CALIBRATIONS:
        raise ValueError(f"{where}.calibrations holds {len(message.calibrations)}; at most {MAX_CALIBRATIONS} a report")
    calibrations = []
    for i, cal in enumerate(message.calibrations):
        what = f"{where}.calibrations[{i}]"
        if not cal.id or len(cal.id) > MAX_ID:
            raise ValueError(f"{what}.id must be 1 to {MAX_ID} characters")
        if cal.version < 1 or cal.threads < 1:
            raise ValueError(f"{what}: version and threads must be at least 1")
        for name in FIGURES:   # 0: a figure no sample could give (listed in `disturbed`, never judged)
            v = getattr(cal, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{what}.{name} must be a finite, non-negative speed, got {v}")
        if not (math.isfinite(cal.speed_index) and cal.speed_index >= 0):
            raise ValueError(f"{what}.speed_index must be finite and non-negative")
        if (cal.verdict or UNKNOWN) not in VERDICTS:
            raise ValueError(f"{what}.verdict {cal.verdict[:40]!r} is not one of {', '.join(VERDICTS)}")
        kept = type(cal)()
        kept.CopyFrom(cal)      # not a view into the whole report
        calibrations.append((cal.id, kept))
    return HealthReport(state, index or None, int(message.slow_windows), int(message.remeasured),
                        int(message.replacements), calibrations)


class HostHistories:
    """The newest calibrations per (device key, host), each id once (see the module docstring)."""

    def __init__(self, size: int = HOST_HISTORY, max_hosts: int = MAX_HOSTS):
        self.size, self.max_hosts = size, max_hosts
        self._by_host: OrderedDict[tuple, tuple[deque, set]] = OrderedDict()

    def add(self, device_key: str, host: str, calibrations: list) -> int:
        """Keep the (id, payload) pairs not kept yet, oldest first; returns how many were new."""
        if not calibrations:
            return 0
        key = (device_key, host)
        entry = self._by_host.get(key)
        if entry is None:
            entry = self._by_host[key] = (deque(maxlen=self.size), set())
            while len(self._by_host) > self.max_hosts:
                self._by_host.popitem(last=False)
        self._by_host.move_to_end(key)
        items, ids = entry
        new = 0
        for cid, payload in calibrations:
            if cid in ids:
                continue
            if len(items) == items.maxlen:
                ids.discard(items[0][0])
            items.append((cid, payload))
            ids.add(cid)
            new += 1
        return new

    def get(self, device_key: str, host: str) -> list:
        """The payloads kept for this key and host, oldest first."""
        entry = self._by_host.get((device_key, host))
        return [payload for _, payload in entry[0]] if entry else []
