"""Prometheus metrics: request latency measured in this process, job and measurement figures
read from SQL at scrape time.

Several API servers and the workers share one database, and the workers do the measuring, so
counters kept in one API process could not see most of what happens: everything about jobs and
measurements is read from the database when scraped, with bounded queries on indexed columns
(jobs grouped by state on ix_jobs_state_id; the last minute's measurements by walking the newest
records backwards by primary key, capped), and cached for a few seconds so many scrapers cost
no more than one. If the database does not answer, the scrape still succeeds, with
tunefarm_store_up 0 and the request metrics. With a tracker, each agent's speed index and health
state too (farm_metrics.py).
"""

from __future__ import annotations

import os
import threading
import time

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...candidate import ErrorCode
from ...records.values import JobState, StoreError
from .farm_metrics import FarmCollector

METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"   # prometheus_client's multiprocess switch (tuner.service.api_processes)
WINDOW_S = 60.0
CACHE_S = 2.0
KNOWN_CODES = frozenset(int(c) for c in ErrorCode)
LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class StoreCollector:
    """Job and measurement metrics from the records database, computed at scrape time."""

    def __init__(self, store_of, cache_seconds: float = CACHE_S):
        self._store_of = store_of           # () -> the app's store (opened after this is built)
        self._cache_seconds = cache_seconds
        self._lock = threading.Lock()
        self._at = -1e9
        self._values: dict | None = None

    def describe(self):
        return []           # no values at registration: the store is not open yet

    def _read(self) -> dict | None:
        with self._lock:
            if time.monotonic() - self._at < self._cache_seconds:
                return self._values
            try:
                store = self._store_of()
                by_state = store.jobs.count_by_state()
                trials, errors, capped = store.recent_measurements(WINDOW_S)
                values: dict | None = {"jobs": by_state, "trials": trials, "errors": errors, "capped": capped}
            except StoreError:
                values = None
            self._values, self._at = values, time.monotonic()
            return values

    def collect(self):
        values = self._read()
        up = GaugeMetricFamily("tunefarm_store_up", "1 when the records database answered this scrape's queries")
        up.add_metric([], 0.0 if values is None else 1.0)
        yield up
        if values is None:
            return
        jobs = GaugeMetricFamily("tunefarm_jobs", "Jobs by state", labels=["state"])
        for state in JobState:
            jobs.add_metric([state.value], float(values["jobs"].get(state.value, 0)))
        yield jobs
        queue = GaugeMetricFamily("tunefarm_queue_depth", "Jobs queued, waiting for a worker")
        queue.add_metric([], float(values["jobs"].get(JobState.QUEUED.value, 0)))
        yield queue
        rate = GaugeMetricFamily("tunefarm_trials_per_second", f"Measurements stored per second over the last {WINDOW_S:.0f} s")
        rate.add_metric([], values["trials"] / WINDOW_S)
        yield rate
        errors = GaugeMetricFamily("tunefarm_measurement_errors", f"Failed measurements in the last {WINDOW_S:.0f} s by error code",
                                   labels=["code"])
        for code in ErrorCode:
            if code != ErrorCode.NO_ERROR:
                errors.add_metric([code.name], float(values["errors"].get(int(code), 0)))
        for code, n in sorted(values["errors"].items()):
            if code not in KNOWN_CODES:
                errors.add_metric([str(code)], float(n))
        yield errors
        capped = GaugeMetricFamily("tunefarm_measurement_window_capped",
                                   "1 when the last minute held more measurements than a scrape reads (rates are lower bounds)")
        capped.add_metric([], 1.0 if values["capped"] else 0.0)
        yield capped


class ApiMetrics:
    """The app's own registry (two apps in one process, as in tests, do not share series)."""

    def __init__(self, store_of, tracker: str | None = None, tracker_token: str | None = None):
        self.registry = CollectorRegistry()
        # served by several processes (tuner.service.api_processes): each writes its latencies to a
        # file of the shared directory, and a scrape sums them
        shared = os.environ.get(METRICS_DIR_ENV)
        own = CollectorRegistry() if shared else self.registry
        self.latency = Histogram("tunefarm_http_request_duration_seconds", "HTTP request latency by route template and status",
                                 ["method", "route", "status"], registry=own, buckets=LATENCY_BUCKETS)
        if shared:
            MultiProcessCollector(self.registry, path=shared)
        self.registry.register(StoreCollector(store_of))
        if tracker:   # the farm's agents: speed index and health (farm_metrics)
            self.registry.register(FarmCollector(tracker, tracker_token))
        self._templates: dict[int, str] = {}
        self._static: set[str] = set()

    def add_routes(self, routes, prefix: str = "") -> None:
        """Remember the full path template of routes mounted under `prefix`: some FastAPI versions
        hand the middleware the router's own route, whose path lacks the prefix."""
        for route in routes:
            self._templates[id(route)] = prefix + getattr(route, "path", "")

    def add_static(self, *paths: str | None) -> None:
        """Paths without a template (the OpenAPI document and its viewers) labelled as themselves."""
        self._static.update(p for p in paths if p)

    def template(self, scope: Scope) -> str:
        route = scope.get("route")
        if route is not None:
            return self._templates.get(id(route)) or getattr(route, "path", None) or "unmatched"
        return scope["path"] if scope.get("path") in self._static else "unmatched"


class RequestTiming:
    """ASGI middleware observing every HTTP request's latency, labelled by the route's template
    (/api/v1/jobs/{job_id}, never the raw path: ids would make a series each)."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def status_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, status_send)
        finally:
            template = self.metrics.template(scope)
            self.metrics.latency.labels(scope.get("method", "?"), template, str(status)).observe(time.perf_counter() - start)
