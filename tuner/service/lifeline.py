"""A process that dies with its parent, however the parent dies (SIGKILL included).

`tunefarm serve` starts its job workers with `--exit-with-parent`: a crashed or killed serve must
not leave a worker tuning (and its build and measuring processes, which watch the worker, running)
with nobody to stop it. The next serve on this host then finds the dead worker's job and takes it
back at once (tuner.records.jobs: JobQueue.reclaim_dead_local_leases).
"""

from __future__ import annotations

import ctypes
import signal
import sys

PR_SET_PDEATHSIG = 1     # <linux/prctl.h>


def exit_with_parent(parent: int) -> None:
    """End this process when `parent` (the pid that started it) ends.

    On Linux the kernel kills it the moment the parent exits (prctl PR_SET_PDEATHSIG); elsewhere,
    and as a second line, a thread polls getppid() every second (device_agent.worker.watch_parent),
    which also checks once now: a parent that died while this process started up is not missed.

    SIGKILL, not SIGTERM: a worker's SIGTERM means "finish the batch, then hand the job back", which
    can take a minute, and an orphan must go within seconds. Nothing is lost: every finished batch is
    in the records, the build and measuring processes follow within a second (they watch their
    parent), and the next worker on this host reclaims the job at once.

    PR_SET_PDEATHSIG fires when the *thread* that started this process ends, not the process: the
    parent must start it from a thread that lives as long as itself (serve: its main thread)."""
    from device_agent.worker import watch_parent
    _set_parent_death_signal(signal.SIGKILL)
    watch_parent(parent=parent)


def _set_parent_death_signal(sig: signal.Signals) -> bool:
    """Ask the kernel for `sig` when the parent exits; False where that cannot be had (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    # unsigned long arguments: a plain int would leave the upper half of a 64-bit register undefined
    args = (ctypes.c_ulong(int(sig)), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    return prctl(ctypes.c_int(PR_SET_PDEATHSIG), *args) == 0
