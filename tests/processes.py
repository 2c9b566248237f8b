"""Waiting for a condition and stopping a process group: what the farm and service tests share."""

from __future__ import annotations

import os
import signal
import subprocess
import time


def wait_for(predicate, timeout: float, what: str, poll: float = 0.05):
    """`predicate()`'s first truthy value within `timeout` s; AssertionError naming `what` (and the
    last exception the predicate raised, e.g. while a server still starts) otherwise."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - e.g. the tracker is still starting
            last_error = e
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}" + (f" ({last_error})" if last_error else ""))


def kill_group(proc: subprocess.Popen, sig=signal.SIGKILL) -> None:
    """Signal the process group `proc` leads (started with start_new_session); reap it after SIGKILL."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
    if sig == signal.SIGKILL:
        proc.wait(timeout=10)
