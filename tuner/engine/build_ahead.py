"""Builds that run while the tuner does something else: a batch is handed to the builder and
the tuner goes on; it waits only when it needs the kernels.

A tuning step on one host does four things in turn: pick a batch (the search, one core), build
it (the build processes, every core), time it (the measuring worker, every core) and retrain the
cost model (one core). Picking and retraining leave a core idle, so the engine hands a batch to
the builder as soon as the batch is known and does its one-core work while the batch builds
(`TaskTuner`: the first search batch is picked while the baseline builds; a batch is picked
before a long retrain, which then runs beside its builds).

What this never does is build while a kernel is timed: the tuner starts timing a batch only
after `result()` returned every build of it, and every build process holds the host's shared
lock while it compiles (compiler.host_lock), which a timing anywhere on the host (another tuner,
an agent, a benchmark) waits for and excludes.

All builds of one builder go through one thread (`for_builder`), in order: a BuilderPool is not
thread-safe, and a synchronous `build` queued behind a batch built ahead waits for it, as the
pool would anyway.
"""

from __future__ import annotations

import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor


class PendingBuild:
    """A batch handed to the builder: `result()` waits for its BuildResults; `waited` is how long
    the caller waited, `seconds` how long the builds took (queue time excluded)."""

    def __init__(self, future: Future, clock: dict):
        self._future, self._clock = future, clock
        self.waited = 0.0

    @classmethod
    def resolved(cls, results: list) -> "PendingBuild":
        """Builds already at hand (a part of a batch built ahead), as a PendingBuild."""
        fut: Future = Future()
        fut.set_result(list(results))
        return cls(fut, {})

    def done(self) -> bool:
        return self._future.done()

    def result(self) -> list:
        t0 = time.perf_counter()
        try:
            return self._future.result()
        finally:
            self.waited += time.perf_counter() - t0

    @property
    def seconds(self) -> float:
        start, end = self._clock.get("start"), self._clock.get("end")
        return (end - start) if start is not None and end is not None else 0.0

    @property
    def overlapped(self) -> float:
        """Build seconds the caller did not wait for: spent beside its other work."""
        return max(0.0, self.seconds - self.waited) if self.done() else 0.0


class BuildAhead:
    """One builder's builds, in submission order, on one thread."""

    def __init__(self, builder):
        try:   # (weakly: the registry's values must not keep its keys alive)
            ref = weakref.ref(builder)
            self._builder = lambda: ref()
        except TypeError:
            self._builder = lambda: builder
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tunefarm-build")

    @property
    def builder(self):
        return self._builder()

    def submit(self, task, candidates) -> PendingBuild:
        candidates = list(candidates)
        clock: dict = {}

        def run():
            clock["start"] = time.perf_counter()
            try:
                return self.builder.build(task, candidates) if candidates else []
            finally:
                clock["end"] = time.perf_counter()
        return PendingBuild(self._executor.submit(run), clock)

    def build(self, task, candidates) -> list:
        """Build now (behind whatever was submitted before) and wait."""
        return self.submit(task, candidates).result()

    def close(self) -> None:
        self._executor.shutdown(wait=True)


_BY_BUILDER: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_BY_ID: dict = {}
_LOCK = threading.Lock()


def for_builder(builder) -> BuildAhead:
    """The one BuildAhead of `builder` (tuners that share a builder share its thread)."""
    with _LOCK:
        try:
            ahead = _BY_BUILDER.get(builder)
            if ahead is None:
                ahead = _BY_BUILDER[builder] = BuildAhead(builder)
        except TypeError:   # a builder that cannot be weakly referenced: kept by id while it lives
            ahead = _BY_ID.get(id(builder))
            if ahead is None or ahead.builder is not builder:
                ahead = _BY_ID[id(builder)] = BuildAhead(builder)
        return ahead


__all__ = ["BuildAhead", "PendingBuild", "for_builder"]
