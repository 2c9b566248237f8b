"""Making a measuring process slow on purpose: stopped and continued on a duty cycle.

SIGSTOP/SIGCONT (3 ms stopped in every 4 by default) is drift no per-sample check sees: a stopped
thread waits in no run queue, so every sample longer than the cycle is equally slow, as on a host
that throttles. Shared by the calibrated-worker tests (a local runner's worker) and the farm's
agent-health tests (an agent's worker, found among the agent process's children).

The duty cycle runs in a process of its own at real-time priority: a thread of the test process
would need the GIL back after every sleep, and a test process that also serves a tracker's gRPC
threads held it for up to the 5 ms switch interval, long enough to let a "throttled" worker run at
nearly full speed for a whole calibration. The test process only tells it which pid is the worker
now (`follow`), over its stdin."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

FOLLOW_POLL_S = 0.01        # how often the test process looks for a replaced worker


def children(pid: int) -> list[int]:
    """The child processes of `pid` (Linux /proc; [] when it is gone)."""
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(c) for c in (task / "children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    return sorted(set(out))


def _continue(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except (ProcessLookupError, TypeError):
            pass


def _duty_cycle(pid: int | None, stop_s: float, run_s: float) -> None:
    """The throttling process: stop `pid` for stop_s, run it for run_s, until stdin says `stop` (or
    closes); a line with a pid (or `none`) switches to that process. Prints `ready` when it starts,
    {cycles, pids} at the end."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except (PermissionError, OSError, AttributeError):
        try:
            os.setpriority(os.PRIO_PROCESS, 0, -15)
        except OSError:
            pass
    cycles, pids = 0, set()
    print("ready", flush=True)          # __enter__ returns once the cycle runs
    stdin = sys.stdin.buffer.raw if hasattr(sys.stdin.buffer, "raw") else sys.stdin.buffer
    pending = b""
    try:
        while True:
            # nothing to throttle: wait for the next pid instead of waking every cycle on the worker's cores
            if select.select([stdin], [], [], 0 if pid is not None else None)[0]:
                chunk = os.read(stdin.fileno(), 4096)
                if not chunk:
                    break
                pending += chunk
                *lines, pending = pending.split(b"\n")
                if any(line.strip() == b"stop" for line in lines):
                    break
                for line in lines:
                    if line.strip():
                        pid = None if line.strip() == b"none" else int(line)
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGSTOP)
                    pids.add(pid)
                    time.sleep(stop_s)
                    os.kill(pid, signal.SIGCONT)
                    cycles += 1
                except ProcessLookupError:
                    pid = None          # gone: nothing to throttle until told another pid
                    continue
            time.sleep(run_s)
    finally:
        _continue(pids)
        print(json.dumps({"cycles": cycles, "pids": sorted(pids)}), flush=True)


class Throttle:
    """Stop and continue a process on a duty cycle (stopped `stop_s` in every `stop_s + run_s`);
    `follow`: a callable giving the pid to throttle now (the worker's current process), else the
    first pid only (a replacement runs free)."""

    def __init__(self, pid_of, follow: bool = False, stop_s: float = 0.003, run_s: float = 0.001):
        self.pid_of, self.follow, self.stop_s, self.run_s = pid_of, follow, stop_s, run_s
        self.first = pid_of()
        self.cycles = 0
        self.pids: set = set()          # every process it throttled
        self._proc: subprocess.Popen | None = None
        self._done = threading.Event()
        self._watch = threading.Thread(target=self._follow, daemon=True)

    def _send(self, pid) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write(f"{'none' if pid is None else pid}\n".encode())
        self._proc.stdin.flush()

    def _follow(self) -> None:
        current = self.first
        while not self._done.wait(FOLLOW_POLL_S):
            pid = self.pid_of()
            if pid != current:
                current = pid
                self.pids.add(pid)
                try:
                    self._send(pid)
                except (BrokenPipeError, ValueError):
                    return

    def __enter__(self):
        self._proc = subprocess.Popen([sys.executable, __file__, str(self.first or "none"), str(self.stop_s),
                                       str(self.run_s)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.pids.add(self.first)
        assert self._proc.stdout is not None
        if self._proc.stdout.readline().strip() != b"ready":     # throttling from before the caller's next step
            raise RuntimeError("the throttling process did not start")
        if self.follow:
            self._watch.start()
        return self

    def stop(self):
        self._done.set()
        if self._watch.is_alive():
            self._watch.join(5)
        if self._proc is not None:
            try:
                out, _ = self._proc.communicate(b"stop\n", timeout=10)
                report = json.loads(out.decode().strip().splitlines()[-1])
                self.cycles = report["cycles"]
                self.pids |= set(report["pids"])
            except (subprocess.TimeoutExpired, ValueError, IndexError):
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        _continue(self.pids | {self.first})

    def __exit__(self, *exc):
        self.stop()


if __name__ == "__main__":
    first, stop_s, run_s = sys.argv[1:4]
    _duty_cycle(None if first == "none" else int(first), float(stop_s), float(run_s))
