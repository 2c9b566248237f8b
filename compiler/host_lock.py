"""One lock per host that every tunefarm process honours: timings run alone on the cores.

A kernel timed while a build, another worker's measurement or an agent's run uses the same cores
measures the contention, not the kernel. So:

- `exclusive()` is held while a kernel is checked and timed (the measuring worker; benchmarks
  timing in-process). Only one holder on the host at a time, and no `shared()` holder.
- `shared()` is held by tunefarm's other heavy work: each build in a build process. Any number
  of them run together; a timing waits until they finish, and while a timing waits, new shared
  holders wait behind it (so a stream of builds cannot starve the timer).

It is two `flock(2)` files in one directory (`$TUNEFARM_LOCK_DIR`, default the system's temp
directory): a *gate* a timer closes while it waits, and the lock itself. flock locks belong to
open files and the kernel drops them when a process dies however it dies, so a SIGKILLed or
crashed holder never leaves the host locked. The files are created readable by every user
(flock needs no write permission), so tunefarm processes of different users share them.

A process must not nest the two (hold `shared()` and ask for `exclusive()`, or the reverse): the
locks are per open file, and it would wait for itself. Re-entering the same kind in one thread is
allowed and costs nothing.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
import time
from contextlib import contextmanager

_state = threading.local()


def lock_dir() -> str:
    return os.environ.get("TUNEFARM_LOCK_DIR") or tempfile.gettempdir()


def _open(name: str) -> int:
    path = os.path.join(lock_dir(), name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError:
        fd = os.open(path, os.O_RDONLY)
    try:
        os.fchmod(fd, 0o644)
    except OSError:
        pass   # another user's file: reading is all flock needs
    return fd


def _depth(kind: str) -> int:
    return getattr(_state, kind, 0)


@contextmanager
def exclusive():
    """Hold the host while timing; yields the seconds spent waiting for it."""
    if _depth("exclusive"):
        with _nested("exclusive"):
            yield 0.0
        return
    if _depth("shared"):
        raise RuntimeError("this thread holds tunefarm's shared host lock (a build) and asked for the "
                           "exclusive one (a timing): it would wait for itself")
    t0 = time.monotonic()
    # the gate closed: new shared holders queue behind this timer; then the running ones finish
    with _held(fcntl.LOCK_EX, "exclusive"):
        yield time.monotonic() - t0


@contextmanager
def shared():
    """Hold the host's shared side for a build (waits while a timing runs)."""
    if _depth("shared") or _depth("exclusive"):
        # nested work inside a timing or a build of this thread: it already holds the host
        with _nested("shared"):
            yield
        return
    with _held(fcntl.LOCK_SH, "shared"):   # the gate waits while a timer is queued or timing
        yield


def timing_elsewhere() -> bool:
    """Whether a timing holds the host right now (a probe: takes nothing). A build pool uses it
    to stop the clock of builds that wait for a timing instead of charging them for it."""
    main = _open("tunefarm-host.lock")
    try:
        fcntl.flock(main, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(main)   # closing the file drops the probe's lock, if it got one
    return False


@contextmanager
def _held(mode: int, kind: str):
    """Pass the gate in `mode`, take the lock in `mode`, let the gate go; hold the lock."""
    gate, main = _open("tunefarm-host.gate"), _open("tunefarm-host.lock")
    try:
        fcntl.flock(gate, mode)
        try:
            fcntl.flock(main, mode)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        setattr(_state, kind, 1)
        try:
            yield
        finally:
            setattr(_state, kind, 0)
            fcntl.flock(main, fcntl.LOCK_UN)
    finally:
        os.close(gate)
        os.close(main)


@contextmanager
def _nested(kind: str):
    setattr(_state, kind, _depth(kind) + 1)
    try:
        yield
    finally:
        setattr(_state, kind, _depth(kind) - 1)


__all__ = ["exclusive", "shared", "lock_dir", "timing_elsewhere"]
