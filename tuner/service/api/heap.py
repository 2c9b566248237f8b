"""The API process's heap, settled before it serves: what Python's garbage collector costs a request.

An API process holds ~130 000 long-lived objects once its modules are loaded (FastAPI, pydantic,
SQLAlchemy, the compiler that lowers /best's loop IR). CPython's full collection walks all of
them: 40-50 ms on a 2-core znver3, during which that process answers nothing, which is a
request's p99 under load. And a request allocates thousands of short-lived objects, so with
the default first-generation threshold (700) several young collections ran per request.

`settle_heap()`, called in each API process after its app is built and before it serves:
imports what the first requests would import lazily (the lowering of /best), collects once,
then moves every object alive then into the permanent generation (`gc.freeze`), which later
collections skip, and raises the young generation's threshold (GC_YOUNG_THRESHOLD) so a
request's garbage is mostly gone (refcounting frees it) before a collection looks. Cycles made
while serving are still collected.
"""

from __future__ import annotations

import gc

GC_YOUNG_THRESHOLD = 20_000   # allocations minus deallocations between young collections (CPython's default: 700)


def settle_heap() -> None:
    import compiler.loop_ir  # noqa: F401 - /best's lowering, imported here rather than by a request
    import compiler.lower  # noqa: F401

    from ...space import base  # noqa: F401
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
