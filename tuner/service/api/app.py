"""The FastAPI application of the tuning service: `create_app(store_url, ...)`.

One app, one store (opened in the lifespan, closed at shutdown), routers per resource under
/api/v1, health and metrics at the root, the web dashboard at / (tuner.service.dashboard), the
OpenAPI document at /openapi.json (the contract; /docs renders it). Route handlers are plain
functions: the store is synchronous, so FastAPI runs them in its thread pool and a slow query
never blocks the event loop. The API never tunes: it queues jobs that worker processes claim
from the database.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from anyio import to_thread
from fastapi import FastAPI

from ...records import open_store
from ..dashboard import install as install_dashboard
from . import errors
from .auth import TokenCache, TokenTouches
from .deps import ApiSettings
from .errors import responses
from .limits import BodyLimit
from .lowering import Lowering
from .metrics import ApiMetrics, RequestTiming
from .routers import best, farm, health, jobs, model_jobs, records, targets, workloads

API_PREFIX = "/api/v1"
DEFAULT_MAX_MODEL_BYTES = 256 << 20   # ResNet-50 in float32 is ~100 MB, BERT-base ~440 MB: raise it for those
VERSION = "1.0.0"
# Handler threads per API process. A handler's Python holds the interpreter lock for most of
# its time, so more threads than cores-worth of lock only add lock handoffs and context
# switches: with 12 threads a request cost a quarter more CPU (bench/service_load.py at
# saturation, Zen 4: 325-433 requests/s at 12 threads, 457-571 at 3-4, read p99 under load
# 60-124 ms against 20-48). Two threads let one slow request (a submit, a cold lowering of a
# best record) hold up the rest: p99 180 ms. Fewer than the store's pool: a handler never waits
# for a connection. Not the event loop either: hot reads made `async` (run on the loop, no thread
# hand-off) cost 40 % less CPU a job poll with one process alone (bench/api_cpu.py), but each
# process then had one database round trip in flight and left the CPU to the job workers while
# it waited: 353 requests/s at saturation against 541 in the same hour, p99 under load 57 ms.
API_THREADS = 4


def create_app(store_url: str | None = None, *, public_read: bool = False, tracker: str | None = None,
               tracker_token: str | None = None, max_body_bytes: int = 8 << 20,
               max_model_bytes: int = DEFAULT_MAX_MODEL_BYTES) -> FastAPI:
    """The REST API on the records database at `store_url` (default: $TUNEFARM_DB_URL, else the
    embedded SQLite file). `public_read`: reads need no token. `tracker`/`tracker_token`: where
    /api/v1/farm gets its live summary. Bodies over `max_body_bytes` are refused with 413, an
    uploaded ONNX model (POST /api/v1/jobs/model) over `max_model_bytes`."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.store = open_store(store_url)      # StoreError (e.g. schema behind) stops the server
        # the handlers run in anyio's thread pool, API_THREADS of them (anyio's default of 40
        # queued them for connections and on the interpreter lock)
        to_thread.current_default_thread_limiter().total_tokens = API_THREADS
        try:
            yield
        finally:
            app.state.store.close()

    app = FastAPI(title="tunefarm", version=VERSION, lifespan=lifespan,
                  description="Tuning jobs, measured records and the best schedules of the tunefarm service. "
                              "Reads need a `read` token unless the server is public; writes need `submit`.")
    app.state.settings = ApiSettings(public_read=public_read, tracker=tracker, tracker_token=tracker_token,
                                     max_body_bytes=max_body_bytes, max_model_bytes=max_model_bytes)
    app.state.token_touches = TokenTouches()
    app.state.token_cache = TokenCache()
    app.state.lowering = Lowering()
    app.state.metrics = ApiMetrics(lambda: app.state.store, tracker=tracker, tracker_token=tracker_token)
    errors.install(app)

    shared = responses(401, 403, 503)       # every /api/v1 route: token checks and the database
    for module in (model_jobs, jobs, records, best, workloads, targets, farm):
        app.include_router(module.router, prefix=API_PREFIX, responses=shared)
        app.state.metrics.add_routes(module.router.routes, API_PREFIX)
    app.include_router(health.router)
    app.state.metrics.add_routes(health.router.routes)
    install_dashboard(app)                  # the web dashboard at / (static files, reads the API above)
    app.state.metrics.add_static(app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url)

    model_limit = (max_model_bytes, "ONNX model", "the server's limit for model uploads (tunefarm serve --max-model-bytes)")
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes, paths={API_PREFIX + model_jobs.MODEL_PATH: model_limit})
    app.add_middleware(RequestTiming, metrics=app.state.metrics)     # outermost: times everything, 413s too
    return app
