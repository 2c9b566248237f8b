"""Error responses: one JSON shape ({"detail", "field", "state"}) for every error the API raises.

Store errors are mapped by kind, not by message: an unknown job is 404, a refused state change
409 (with the job's current state), a value the database refuses 422, and a database that does
not answer 503 with Retry-After, so a client can tell "fix your request" from "try again later".
Request validation keeps FastAPI's format (a list of issues naming each field). Anything else is
a bug: it is logged and answered with a 500 that carries no internals.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, IntegrityError, SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...records.engine import first_line
from ...records.jobs import JobStateError, UnknownJob
from ...records.values import StoreError
from .schemas import ErrorOut

log = logging.getLogger("tunefarm.api")

DESCRIPTIONS = {
    400: "Malformed request",
    401: "No token, or an unknown or revoked one (see WWW-Authenticate)",
    403: "The token's scope is too small",
    404: "No such resource",
    409: "The job's state does not allow this change (`state` is the current one)",
    413: "Request body larger than the server's limit",
    422: "Invalid input (`field` names it; request validation lists every issue)",
    503: "The records database or the tracker does not answer",
}


def responses(*codes: int) -> dict:
    """OpenAPI documentation of the error responses a route can give."""
    return {code: {"model": ErrorOut, "description": DESCRIPTIONS[code]} for code in codes}


class ApiError(StarletteHTTPException):
    """An error with the field or job state it is about."""

    def __init__(self, status_code: int, detail: str, field: str | None = None, state: str | None = None,
                 headers: Mapping[str, str] | None = None):
        super().__init__(status_code, detail, headers)
        self.field, self.state = field, state


def error_response(status: int, detail, field: str | None = None, state: str | None = None,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    body = ErrorOut.model_validate({"detail": detail, "field": field, "state": state}).model_dump(mode="json", exclude_none=True)
    return JSONResponse(body, status_code=status, headers=headers)


def from_store_error(e: StoreError) -> ApiError:
    """The HTTP error a store failure stands for."""
    if isinstance(e, UnknownJob):
        return ApiError(404, str(e), field="job_id")
    if isinstance(e, JobStateError):
        return ApiError(409, str(e), field="state", state=str(e.current))
    cause = e.__cause__
    if isinstance(cause, DataError):        # e.g. a NUL in text, a number out of the column's range
        return ApiError(422, f"the database refused a value of the request: {first_line(cause)}")
    if isinstance(cause, IntegrityError):
        return ApiError(409, "the request conflicts with stored data")
    if isinstance(cause, SQLAlchemyError):
        log.warning("records database error: %s", e)
        return ApiError(503, f"the records database does not answer ({type(getattr(cause, 'orig', None) or cause).__name__})",
                        headers={"Retry-After": "5"})
    return ApiError(422, str(e))


def install(app: FastAPI) -> None:
    """Register the handlers on `app`."""

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        field, state = getattr(exc, "field", None), getattr(exc, "state", None)
        return error_response(exc.status_code, str(exc.detail), field, state, getattr(exc, "headers", None))

    @app.exception_handler(StoreError)
    async def _store(request: Request, exc: StoreError):
        err = from_store_error(exc)
        return error_response(err.status_code, err.detail, err.field, err.state, err.headers)

    @app.exception_handler(UnicodeError)
    async def _unicode(request: Request, exc: UnicodeError):
        # lone surrogates in JSON strings ("\ud800") reach the database driver, which cannot encode them
        return error_response(422, f"text that is not valid Unicode: {getattr(exc, 'reason', exc)}")

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal error (logged on the server)")
