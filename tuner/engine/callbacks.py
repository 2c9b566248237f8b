"""What the engine tells its driver: a report per measured batch, and heartbeats.

A driver (the CLI's progress display, a job worker renewing its lease, a notebook) passes
`Callbacks`; any of them may call `request_stop()` on the tuner or scheduler it was given, and
the run ends cleanly after the current batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class BatchReport:
    """One measured batch of one task."""

    task: object               # Task
    candidates: tuple
    results: tuple             # MeasureResult per candidate, same order
    record_ids: tuple          # ids of the records this batch added (duplicates are skipped)
    result: object             # the task's TuneResult so far (live)
    kind: str = "search"       # "baseline" | "search" | "retime"


@dataclass
class Callbacks:
    """Optional hooks; each is called with one argument.

    - `on_batch(BatchReport)`: after every measured batch (progress displays);
    - `on_records(BatchReport)`: after records were written (a service publishing events);
    - `on_heartbeat(tuner)`: between batches and between re-measurement rounds (lease renewal,
      cancellation checks).
    """

    on_batch: Callable | None = None
    on_records: Callable | None = None
    on_heartbeat: Callable | None = None
    extra: list = field(default_factory=list)  # more Callbacks objects, called after these

    def batch(self, report: BatchReport) -> None:
        for cb in self._all():
            if cb.on_records is not None and report.record_ids:
                cb.on_records(report)
            if cb.on_batch is not None:
                cb.on_batch(report)

    def heartbeat(self, tuner) -> None:
        for cb in self._all():
            if cb.on_heartbeat is not None:
                cb.on_heartbeat(tuner)

    def _all(self):
        yield self
        for cb in self.extra:
            yield from cb._all()
