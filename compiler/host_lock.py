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
        _state.exclusive += 1
        try:
            yield 0.0
        finally:
            _state.exclusive -= 1
        return
    if _depth("shared"):
        raise RuntimeError("this thread holds tunefarm's shared host lock (a build or search) and asked for the "
                           "exclusive one (a timing): it would wait for itself")
    t0 = time.monotonic()
    gate, main = _open("tunefarm-host.gate"), _open("tunefarm-host.lock")
    try:
        fcntl.flock(gate, fcntl.LOCK_EX)          # new shared holders queue behind this timer
        try:
            fcntl.flock(main, fcntl.LOCK_EX)      # the running ones finish first
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        waited = time.monotonic() - t0
        _state.exclusive = 1
        try:
            yield waited
        finally:
            _state.exclusive = 0
            fcntl.flock(main, fcntl.LOCK_UN)
    finally:
        os.close(gate)
        os.close(main)


@contextmanager
def shared():
    """Hold the host's shared side for a build (waits while a timing runs)."""
    if _depth("shared") or _depth("exclusive"):
        # nested work inside a timing or a build of this thread: it already holds the host
        _state.shared = _depth("shared") + 1
        try:
            yield
        finally:
            _state.shared = _depth("shared") - 1
        return
    gate, main = _open("tunefarm-host.gate"), _open("tunefarm-host.lock")
    try:
        fcntl.flock(gate, fcntl.LOCK_SH)          # waits while a timer is queued or timing
        try:
            fcntl.flock(main, fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        _state.shared = 1
        try:
            yield
        finally:
            _state.shared = 0
            fcntl.flock(main, fcntl.LOCK_UN)
    finally:
        os.close(gate)
        os.close(main)


__all__ = ["exclusive", "shared", "lock_dir"]
