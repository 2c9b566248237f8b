"""The web dashboard: static files served by the service's own app (same port, same tokens).

Plain HTML, CSS and ES-module JavaScript under `static/`, installed with the package and served
as they are: no build step, no CDN, so it works offline and behind a firewall. The page is a
single-page app (hash routes such as #/jobs/12) that reads the REST API under /api/v1 with the
token the user gave it; the server adds nothing the API does not already expose. The one chart
library, uPlot, is vendored minified with its licence in `static/vendor/`.

`install(app)` serves index.html at `/` and the rest under `/static/`. The page gets a strict
Content-Security-Policy (scripts only from this origin, no inline script): the token lives in the
page's sessionStorage, so no injected script may run there.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

STATIC = Path(__file__).resolve().parent / "static"
STATIC_PREFIX = "/static"

# uPlot sizes its elements through style attributes, hence 'unsafe-inline' for styles only
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


class _SecurityHeaders:
    """Adds HEADERS to the static files' responses (StaticFiles has no option for it)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + [(k.lower().encode(), v.encode()) for k, v in HEADERS.items()]
            await send(message)

        await self.app(scope, receive, with_headers)


def install(app: FastAPI) -> None:
    """Serve the dashboard from `app`: index.html at `/`, its files under /static/."""

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        # revalidated on every load (ETag): an upgraded tunefarm serves its new page at once
        return FileResponse(STATIC / "index.html", media_type="text/html", headers={**HEADERS, "Cache-Control": "no-cache"})

    app.mount(STATIC_PREFIX, _SecurityHeaders(StaticFiles(directory=STATIC)), name="dashboard")
