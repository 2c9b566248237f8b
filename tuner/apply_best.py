"""Apply-best: the records store as a schedule provider for the compiler.

`with ApplyHistoryBest(store): build_op(opdef)` builds with the best valid record for
(workload key, target), replaying its config or trace; records of other targets never match
because the target string is part of the lookup.
"""

from __future__ import annotations

from compiler.dispatch import DispatchContext

from .space import SpaceError, instantiate


class ApplyHistoryBest(DispatchContext):
    def __init__(self, store, k: int = 5):
        self.store = store
        self.k = k

    def best_record(self, opdef, target):
        """The best record whose candidate still applies to this definition, or None.

        Natively timed records come first: an emulated board's timings (qemu-user) rank kernels
        for the emulator, so one of them is used only when no native record of the k best applies."""
        best = self.store.best(opdef.workload_key(), str(target), k=self.k)
        for rec in sorted(best, key=lambda r: r.result.emulated):   # stable: the store's order within each kind
            try:
                instantiate(opdef, rec.candidate, target)
            except SpaceError:
                continue
            return rec
        return None

    def lookup(self, opdef, target):
        rec = self.best_record(opdef, target)
        if rec is None:
            return None
        schedule, _ = instantiate(opdef, rec.candidate, target)
        return schedule
