"""The best record's schedule lowered to loop IR, cached per record.

Lowering takes tens of milliseconds and a record never changes, so the text (or the reason it
could not be made) is kept in an LRU keyed by record id; GFLOPS need the workload's flop count,
which needs its compute definition, so that is cached per workload key too. The compute
definition of a DAG workload is parsed as data (compiler.serialize), never evaluated.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from ...records.values import Record

MAX_ENTRIES = 256


class _LRU:
    def __init__(self, size: int):
        self.size = size
        self._data: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            if key not in self._data:
                return None
            self._data.move_to_end(key)
            return self._data[key]

    def put(self, key, value) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)


class Lowering:
    """Loop IR and flop counts of records, computed once each (two requests racing on the same
    record both compute it; the result is the same)."""

    def __init__(self, size: int = MAX_ENTRIES):
        self._ir = _LRU(size)
        self._flops = _LRU(size)

    def flops(self, record: Record) -> float | None:
        got = self._flops.get(record.workload_key)
        if got is None:
            try:
                got = (float(record.workload.opdef().flops),)
            except Exception:  # noqa: BLE001 - a stored workload this tunefarm cannot build has no flop count
                got = (None,)
            self._flops.put(record.workload_key, got)
        return got[0]

    def loop_ir(self, record: Record) -> tuple[str | None, str | None]:
        """(loop IR text, None) or (None, why not)."""
        got = self._ir.get(record.id)
        if got is None:
            got = _lower(record)
            self._ir.put(record.id, got)
        return got


def _lower(record: Record) -> tuple[str | None, str | None]:
    from compiler.loop_ir import format_func
    from compiler.lower import lower

    from ...space.base import instantiate
    try:
        opdef = record.workload.opdef()
        schedule, args = instantiate(opdef, record.candidate, record.target)
        return format_func(lower(schedule, args)), None
    except Exception as e:  # noqa: BLE001 - any failure is a property of this stored record, reported, not raised
        return None, f"{type(e).__name__}: {e}"
