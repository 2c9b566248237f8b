"""Records: filtered keyset pages (newest, oldest or fastest first), one record and its loop IR, a
streamed JSON-lines export, a JSON-lines import.

The export is written page by page (each page its own short transaction) as the client reads
it, so neither the server's memory nor a database transaction grows with the number of
records. The import is all-or-nothing (the store checks every line before writing any).
"""

from __future__ import annotations

import codecs
import io
import tempfile
from collections.abc import Iterator
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from ....records import codec
from ....records.values import StoreError, UnknownRecord
from .. import auth
from ..deps import MAX_ID, MAX_PAGE, Store
from ..errors import ApiError, from_store_error, responses
from ..record_page import record_page_response
from ..respond import json_response
from ..schemas import ImportOut, RecordIROut, RecordOut, RecordPage

router = APIRouter(prefix="/records", tags=["records"])

NDJSON = "application/x-ndjson"
EXPORT_PAGE = 500
SPOOL_BYTES = 1 << 20        # an import body stays in memory up to this, then goes to a temporary file

WorkloadKey = Annotated[str | None, Query(min_length=1, max_length=64, description="workload key")]
Target = Annotated[str | None, Query(min_length=1, max_length=4096, description="target string, exactly as stored")]


Order = Literal["newest", "oldest", "fastest"]


@router.get("", response_model=RecordPage, dependencies=[Depends(auth.read)], responses=responses(422),
            summary="Records, filtered, newest first (or oldest or fastest first)")
def list_records(store: Store, workload_key: WorkloadKey = None, target: Target = None,
                 device_key: Annotated[str | None, Query(min_length=1, max_length=255)] = None,
                 job_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
                 error_code: Annotated[int | None, Query(ge=0, le=2**31 - 1, description="0: valid records only")] = None,
                 order: Annotated[Order, Query(description="newest (ids descending, cursor `before`), oldest (ids ascending, "
                                                           "cursor `after`) or fastest (valid records by mean cost, cursor "
                                                           "`after_cost` + `after`; needs `workload_key`)")] = "newest",
                 before: Annotated[int | None, Query(ge=1, le=MAX_ID, description="page cursor: `next_before` of the last page")] = None,
                 after: Annotated[int | None, Query(ge=0, le=MAX_ID, description="page cursor: `next_after` of the last page")] = None,
                 after_cost: Annotated[float | None, Query(ge=0, allow_inf_nan=False,
                                                           description="page cursor (fastest): `next_after_cost` of the last page")] = None,
                 limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50) -> Response:
    if order == "newest":
        for name, value in (("after", after), ("after_cost", after_cost)):
            if value is not None:
                raise ApiError(422, f"{name} is a cursor of order=oldest or fastest; newest first pages with `before`", field=name)
        records = store.records_page(workload_key=workload_key, target=target, device_key=device_key, job_id=job_id,
                                     error_code=error_code, before_id=before, limit=limit, page_rows=True)
        return record_page_response(records, next_before=records[-1].id if len(records) == limit else None)
    if before is not None:
        raise ApiError(422, f"order={order} pages with `after`, not `before`", field="before")
    if order == "oldest" and after_cost is not None:
        raise ApiError(422, "after_cost is a cursor of order=fastest", field="after_cost")
    if order == "fastest":
        if workload_key is None:
            raise ApiError(422, "order=fastest needs a workload_key (records are ranked by cost within a workload)",
                           field="workload_key")
        if (after_cost is None) != (after is None):
            raise ApiError(422, "order=fastest pages with both after_cost and after (next_after_cost, next_after)",
                           field="after_cost" if after_cost is None else "after")
    records = store.records_sorted(order, workload_key=workload_key, target=target, device_key=device_key, job_id=job_id,
                                   error_code=error_code, after_id=after, after_cost=after_cost, limit=limit,
                                   page_rows=True)
    last = records[-1] if len(records) == limit else None
    after_cost_next = last.mean_cost if last is not None and order == "fastest" else None
    return record_page_response(records, next_after=last.id if last else None, next_after_cost=after_cost_next)


@router.get("/export", response_class=StreamingResponse, dependencies=[Depends(auth.read)],
            responses={200: {"content": {NDJSON: {"schema": {"type": "string"}}},
                             "description": "one record per line (tunefarm's JSON-lines format), oldest first"},
                       **responses(422)},
            summary="Export records as JSON lines (streamed)")
def export_records(store: Store, workload_key: WorkloadKey = None, target: Target = None) -> StreamingResponse:
    store.ping()        # an unreachable database is a 503 now, not a response cut short later
    return StreamingResponse(_export_lines(store, workload_key, target), media_type=NDJSON,
                             headers={"Content-Disposition": 'attachment; filename="records.jsonl"'})


def _export_lines(store, workload_key: str | None, target: str | None) -> Iterator[str]:
    """One chunk per page; a database failure mid-way ends the stream (the status is sent already)."""
    after = None
    while True:
        try:
            page = store.records_after(after_id=after, limit=EXPORT_PAGE, workload_key=workload_key, target=target)
        except StoreError:
            return
        if not page:
            return
        yield "".join(codec.to_line(r) + "\n" for r in page)
        after = page[-1].id


@router.post("/import", response_model=ImportOut, dependencies=[Depends(auth.submit)],
             responses=responses(400, 409, 413, 422),
             openapi_extra={"requestBody": {"required": True, "description": "records as JSON lines (as exported)",
                                            "content": {NDJSON: {"schema": {"type": "string"}}}}},
             summary="Import records from JSON lines (all or nothing)")
async def import_records(request: Request, store: Store) -> ImportOut:
    """Returns how many records were new; records already stored are skipped."""
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as raw:
        decoder = codecs.getincrementaldecoder("utf-8")()
        try:
            async for chunk in request.stream():
                decoder.decode(chunk)       # checked as it arrives; the bytes are kept as sent
                raw.write(chunk)
            decoder.decode(b"", final=True)
        except UnicodeDecodeError as e:
            raise ApiError(422, f"the body is not UTF-8 text ({e.reason})", field="body") from None
        raw.seek(0)
        text = io.TextIOWrapper(raw, encoding="utf-8", newline=None)
        try:
            added = await run_in_threadpool(store.import_jsonl, text)
        except StoreError as e:
            err = from_store_error(e)
            if err.status_code == 422:      # a bad line: the store's message names it
                err.field = "body"
            raise err from None
        finally:
            text.detach()
    return ImportOut(added=added)


@router.get("/{record_id}", response_model=RecordOut, dependencies=[Depends(auth.read)], responses=responses(404, 422),
            summary="One record: candidate, result, error, who measured it, timings")
def get_record(store: Store, record_id: Annotated[int, Path(ge=1, le=MAX_ID)]) -> Response:
    try:
        return json_response(RecordOut.of(store.get_record(record_id)))
    except UnknownRecord as e:
        raise ApiError(404, str(e), field="record_id") from None


@router.get("/{record_id}/ir", response_model=RecordIROut, dependencies=[Depends(auth.read)], responses=responses(404, 422),
            summary="A record's schedule lowered to loop IR (or why it cannot be)")
def record_ir(request: Request, store: Store, record_id: Annotated[int, Path(ge=1, le=MAX_ID)]) -> RecordIROut:
    """Lowered on the server from the stored workload and candidate, cached per record."""
    try:
        rec = store.get_record(record_id)
    except UnknownRecord as e:
        raise ApiError(404, str(e), field="record_id") from None
    loop_ir, why = request.app.state.lowering.loop_ir(rec)
    return RecordIROut(record_id=record_id, loop_ir=loop_ir, loop_ir_error=why)
