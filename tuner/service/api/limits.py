"""Request body size limit, as ASGI middleware in front of everything.

A declared Content-Length over the limit is refused before a byte of the body is read; a body
without one (chunked) is counted as it streams and refused when it crosses the limit, so a
client cannot make the server buffer more than `max_bytes` either way. A route that takes files
(an ONNX model upload) has its own limit and its own reason (`paths`: {path: (max_bytes, what,
hint)}: "ONNX model larger than N bytes; <hint>").
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(HTTPException):
    """Raised from `receive` while the app reads the body: FastAPI lets HTTPExceptions through
    its body parsing, so the app's handler answers 413."""

    def __init__(self, max_bytes: int, what: str = "request body", hint: str = ""):
        super().__init__(413, too_large_message(max_bytes, what, hint))


def too_large_message(max_bytes: int, what: str, hint: str = "") -> str:
    return f"{what} larger than {max_bytes} bytes" + (f"; {hint}" if hint else "")


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int, paths: dict | None = None):
        self.app, self.max_bytes = app, int(max_bytes)
        self.paths = {p: (int(n), what, hint) for p, (n, what, hint) in (paths or {}).items()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes, what, hint = self.paths.get(scope.get("path", ""), (self.max_bytes, "request body", ""))
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            try:
                too_large = int(declared) > max_bytes
            except ValueError:
                await _reply(scope, receive, send, 400, "Content-Length is not a number")
                return
            if too_large:
                await _reply(scope, receive, send, 413, too_large_message(max_bytes, what, hint), {"Connection": "close"})
                return
        seen = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > max_bytes:
                    raise BodyTooLarge(max_bytes, what, hint)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge as e:   # read by code outside the app's exception handlers
            if started:
                raise
            await _reply(scope, receive, send, 413, str(e.detail), {"Connection": "close"})


async def _reply(scope: Scope, receive: Receive, send: Send, status: int, detail: str, headers: dict | None = None) -> None:
    await JSONResponse({"detail": detail}, status_code=status, headers=headers)(scope, receive, send)
