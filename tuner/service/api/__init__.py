"""The tuning service's REST API (FastAPI): `create_app(store_url, ...)`.

Jobs, records, best schedules, workloads, targets and the farm under /api/v1; /healthz, /readyz
and /metrics at the root; bearer tokens with read/submit/admin scopes. See app.py.
"""

from .app import create_app

__all__ = ["create_app"]
