"""Responses of models built here: serialized once, not validated a second time.

A route handler that returns a pydantic model has FastAPI validate it again against the route's
response_model before serializing it: for a page of 50 records that second pass cost as much
as building the page. The models of this API are built with validation in their `of`
constructors (finite numbers, enums), so the hot read routes return `json_response(model)` instead; their
`response_model` still documents the shape in the OpenAPI document, and the schema tests hold
the responses to it.
"""

from __future__ import annotations

from fastapi import Response
from pydantic import BaseModel


def json_response(model: BaseModel, status_code: int = 200) -> Response:
    return Response(model.model_dump_json(), status_code=status_code, media_type="application/json")
