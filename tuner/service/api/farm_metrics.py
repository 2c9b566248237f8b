"""Prometheus gauges of the farm's agents: each one's speed index and health state, from the tracker.

Agents calibrate their measuring workers and report what they find to the tracker
(rpc_tracker/health.py); an operator wants that on the dashboards and alerts that already read
the service's /metrics, not in one more place. So an app started with a tracker address asks the
tracker for its summary at scrape time (cached a couple of seconds, so many scrapers cost one
call) and exports, per agent:

- `tunefarm_agent_speed_index{device_key, agent}`: its latest calibration's speed index (1.0: as
  fast as its host usually is; below 0.8: slow); left out until something was judged.
- `tunefarm_agent_state{device_key, agent, state}`: 1 for its state (healthy, slow, degraded,
  unknown), 0 for the others, so `tunefarm_agent_state{state="degraded"} == 1` is the alert.
- `tunefarm_tracker_up`: whether the tracker answered; without an answer the agent gauges are
  left out, and the scrape still succeeds.
"""

from __future__ import annotations

import threading
import time

from prometheus_client.core import GaugeMetricFamily

STATES = ("healthy", "slow", "degraded", "unknown")
CACHE_S = 2.0
TIMEOUT_S = 2.0


class FarmCollector:
    """The agent gauges (see the module docstring), from the tracker at `address`."""

    def __init__(self, address: str, token: str | None, cache_seconds: float = CACHE_S, timeout: float = TIMEOUT_S):
        self.address, self.token = address, token
        self._cache_seconds, self._timeout = cache_seconds, timeout
        self._lock = threading.Lock()
        self._at = -1e9
        self._agents: list | None = None

    def describe(self):
        return []           # nothing asked of the tracker at registration

    def _read(self) -> list | None:
        """[(device_key, agent name, state, speed index or None)], one per agent name (its newest
        connection); None when the tracker does not answer."""
        with self._lock:
            if time.monotonic() - self._at < self._cache_seconds:
                return self._agents
            try:
                import grpc

                from rpc_tracker.client import farm_summary
                summary = farm_summary(self.address, self.token, timeout=self._timeout)
                newest: dict = {}
                for a in summary.agents:
                    name = a.name or a.agent_id
                    if name not in newest or a.connected_seconds < newest[name].connected_seconds:
                        newest[name] = a
                agents: list | None = [(a.device_key, name, a.health if a.health in STATES else "unknown",
                                        a.speed_index if a.speed_index > 0 else None)
                                       for name, a in sorted(newest.items())]
            except (grpc.RpcError, ValueError, OSError):
                agents = None
            self._agents, self._at = agents, time.monotonic()
            return agents

    def collect(self):
        agents = self._read()
        up = GaugeMetricFamily("tunefarm_tracker_up", "1 when the tracker answered this scrape's summary")
        up.add_metric([], 0.0 if agents is None else 1.0)
        yield up
        if agents is None:
            return
        speed = GaugeMetricFamily("tunefarm_agent_speed_index", "Each agent's latest calibration against its host's "
                                  "usual speeds (1.0: as fast as usual; below 0.8: slow)", labels=["device_key", "agent"])
        state = GaugeMetricFamily("tunefarm_agent_state", "Each agent's health: 1 for its state (a degraded agent gets "
                                  "no work until it recovers)", labels=["device_key", "agent", "state"])
        for key, name, health, index in agents:
            if index is not None:
                speed.add_metric([key, name], float(index))
            for s in STATES:
                state.add_metric([key, name, s], 1.0 if s == health else 0.0)
        yield speed
        yield state
