"""Where the compiler looks for a tuned schedule before falling back to the default one.

The compiler knows nothing about databases: a *schedule provider* is any object with
`lookup(opdef, target) -> Schedule | None`. The tuner supplies one backed by its records
(`tuner.apply_best.ApplyHistoryBest`); it can be passed to `build_op(..., records=...)` or made
current for a block with `with provider:` (providers implement the context protocol through
`DispatchContext`).
"""

from __future__ import annotations

import threading
import warnings

_local = threading.local()
_warned: set = set()


class DispatchContext:
    """Base of schedule providers usable as context managers (innermost wins)."""

    def lookup(self, opdef, target):  # pragma: no cover - interface
        raise NotImplementedError

    def __enter__(self):
        _stack().append(self)
        return self

    def __exit__(self, *exc):
        _stack().pop()
        return False


def _stack() -> list:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def current():
    """The innermost active provider, or None."""
    stack = _stack()
    return stack[-1] if stack else None


def warn_default_once(opdef, target, reason: str):
    """Say once per (workload, target) that the default schedule is used."""
    key = (opdef.workload_key(), str(target))
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(f"{opdef.name} {opdef.params}: {reason}; using the default schedule",
                  UserWarning, stacklevel=3)
