"""Making a measuring process slow on purpose: stopped and continued on a duty cycle.

SIGSTOP/SIGCONT (3 ms stopped in every 4 by default) is drift no per-sample check sees: a stopped
thread waits in no run queue, so every sample longer than the cycle is equally slow, as on a host
that throttles. Shared by the calibrated-worker tests (a local runner's worker) and the farm's
agent-health tests (an agent's worker, found among the agent process's children)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path


def children(pid: int) -> list[int]:
    """The child processes of `pid` (Linux /proc; [] when it is gone)."""
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(c) for c in (task / "children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    return sorted(set(out))


class Throttle:
    """Stop and continue a process on a duty cycle (stopped `stop_s` in every `stop_s + run_s`);
    `follow`: a callable giving the pid to throttle now (the worker's current process), else the
    first pid only (a replacement runs free)."""

    def __init__(self, pid_of, follow: bool = False, stop_s: float = 0.003, run_s: float = 0.001):
        self.pid_of, self.follow, self.stop_s, self.run_s = pid_of, follow, stop_s, run_s
        self.first = pid_of()
        self.cycles = 0
        self.pids: set = set()          # every process it throttled
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        # the throttler must win the cores it shares with the worker (which asks for nice -10) on a
        # loaded host, or its "1 ms" of running stretches to whatever the scheduler gives it
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))   # 0: this thread
        except (PermissionError, OSError, AttributeError):
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), -15)
            except OSError:
                pass
        while not self._done.is_set():
            pid = self.pid_of() if self.follow else self.first
            try:
                os.kill(pid, signal.SIGSTOP)
                self.pids.add(pid)
                time.sleep(self.stop_s)
                os.kill(pid, signal.SIGCONT)
            except (ProcessLookupError, TypeError):
                if not self.follow:
                    return          # the slow process was replaced: nothing left to throttle
            self.cycles += 1
            time.sleep(self.run_s)

    def __enter__(self):
        self._thread.start()
        return self

    def stop(self):
        self._done.set()
        self._thread.join(5)
        for pid in self.pids | {self.first}:
            try:
                os.kill(pid, signal.SIGCONT)
            except (ProcessLookupError, TypeError):
                pass

    def __exit__(self, *exc):
        self.stop()
