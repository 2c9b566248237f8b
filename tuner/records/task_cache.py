"""What a record's task is, remembered per store: a task row never changes once written.

Tasks (workload key, target, device key) and workloads (name, parameters, definition) are
insert-only: a stored record's task id names the same workload on the same target forever. So
record reads select only the record's own columns and look their tasks up here: a page of 50
records no longer carries 50 copies of a long target string and decodes 50 copies of the
workload's parameters (and, for a workload defined as a DAG, re-hashes its definition 50 times).
A miss costs one statement for all the missing tasks of a page. The cache is bounded; when it is
full it starts again empty (no task is wrong after that, only fetched once more).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..workload import Task, Workload
from .models import TaskRow, WorkloadRow

MAX_TASKS = 20_000


@dataclass(frozen=True)
class TaskInfo:
    """A stored task with its workload, as records read from the database refer to it."""

    id: int
    workload_key: str
    workload: Workload
    target: str
    device_key: str

    @property
    def task(self) -> Task:
        return Task(self.workload, self.target, self.device_key)


class TaskCache:
    """Task id -> TaskInfo for one store, shared by its threads (the API's thread pool)."""

    def __init__(self, max_tasks: int = MAX_TASKS):
        self._max = max_tasks
        self._tasks: dict[int, TaskInfo] = {}
        self._lock = threading.Lock()

    def get_many(self, s: Session, task_ids: Iterable[int]) -> dict[int, TaskInfo]:
        """The tasks of `task_ids`, those not yet known read in one statement on `s`."""
        wanted = set(task_ids)
        known = self._tasks
        found = {i: known[i] for i in wanted if i in known}
        missing = wanted.difference(found)
        if missing:
            fetched = self._fetch(s, sorted(missing))
            with self._lock:
                if len(self._tasks) + len(fetched) > self._max:
                    self._tasks = {}
                self._tasks.update(fetched)
            found.update(fetched)
        return found

    def remember(self, infos: Iterable[TaskInfo]) -> None:
        """Tasks a committed write just made (or found): known without a read."""
        fresh = {info.id: info for info in infos}
        with self._lock:
            if len(self._tasks) + len(fresh) > self._max:
                self._tasks = {}
            self._tasks.update(fresh)

    @staticmethod
    def _fetch(s: Session, task_ids: list[int]) -> dict[int, TaskInfo]:
        stmt = (select(TaskRow.id, TaskRow.workload_key, TaskRow.target, TaskRow.device_key,
                       WorkloadRow.name, WorkloadRow.params, WorkloadRow.definition)
                .join(WorkloadRow, TaskRow.workload_key == WorkloadRow.key).where(TaskRow.id.in_(task_ids)))
        workloads: dict[str, Workload] = {}
        out = {}
        for tid, key, target, device_key, name, params, definition in s.execute(stmt):
            if key not in workloads:
                workloads[key] = Workload(name, dict(params), definition)
            out[tid] = TaskInfo(tid, key, workloads[key], target, device_key)
        return out
