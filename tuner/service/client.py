"""A Python client of the tuning service's REST API (httpx), used by `tunefarm submit` / `jobs`.

    from tuner.service.client import ServiceClient
    with ServiceClient("http://127.0.0.1:8080", token="tf_...") as c:
        job = c.submit({"workloads": [{"op": "matmul", "params": {"M": 512, "N": 512, "K": 512}}], "trials": 64})
        final = c.watch(job["id"], on_update=print)

Responses are the API's JSON (dicts, as its OpenAPI document describes them). Every 4xx/5xx is an
APIError carrying the status, the server's reason and the field it names; a server that cannot be
reached is an APIError with status None.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

import httpx

DEFAULT_SERVER = "http://127.0.0.1:8080"
FINAL_STATES = ("done", "failed", "cancelled")


class APIError(RuntimeError):
    def __init__(self, status: int | None, detail: str, field: str | None = None, state: str | None = None):
        where = f" ({field})" if field else ""
        super().__init__(f"{status or 'no answer'}: {detail}{where}")
        self.status, self.detail, self.field, self.state = status, detail, field, state


class ServiceClient:
    """One HTTP connection pool to a tunefarm server; a context manager."""

    def __init__(self, server: str | None = None, token: str | None = None, timeout: float = 30.0,
                 transport: httpx.BaseTransport | None = None):
        self.server = (server or os.environ.get("TUNEFARM_SERVER") or DEFAULT_SERVER).rstrip("/")
        token = token if token is not None else os.environ.get("TUNEFARM_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.server + "/api/v1", headers=headers, timeout=timeout,
                                  transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ jobs
    def submit(self, spec: dict) -> dict:
        return self._call("POST", "/jobs", json=spec)

    def submit_model(self, data: bytes, input_shape: list[str] | None = None, **params) -> dict:
        """Queue a model job: `data` is the ONNX file as it is on disk, `input_shape` pins dynamic
        inputs ("input=1,3,224,224"), `params` are POST /jobs/model's other query parameters
        (trials, file_name, target, device_key, scheduler, space, strategy, batch_size, top_k, priority, seed,
        name, and the measurement options: number, repeat, min_repeat_ms, max_repeat_ms, attempts, timeout)."""
        query = list(_params(**params).items()) + [("input_shape", s) for s in input_shape or []]
        return self._call("POST", "/jobs/model", content=data, params=query,
                          headers={"Content-Type": "application/octet-stream"})

    def jobs(self, state: str | None = None, workload: str | None = None, target: str | None = None,
             limit: int = 50, before: int | None = None) -> dict:
        """One page: {"items": [...], "next_before": id or None}."""
        return self._call("GET", "/jobs", params=_params(state=state, workload=workload, target=target, limit=limit,
                                                         before=before))

    def iter_jobs(self, **filters) -> Iterator[dict]:
        """Every job matching `filters`, newest first, page by page."""
        before = None
        while True:
            page = self.jobs(before=before, **filters)
            yield from page["items"]
            before = page.get("next_before")
            if before is None:
                return

    def job(self, job_id: int) -> dict:
        return self._call("GET", f"/jobs/{int(job_id)}")

    def cancel(self, job_id: int) -> dict:
        return self._call("POST", f"/jobs/{int(job_id)}/cancel")

    def resume(self, job_id: int) -> dict:
        return self._call("POST", f"/jobs/{int(job_id)}/resume")

    def events(self, job_id: int, after: int | None = None) -> dict:
        """{"items": [...], "next_after": id}: the events after event `after`."""
        return self._call("GET", f"/jobs/{int(job_id)}/events", params=_params(after=after))

    def watch(self, job_id: int, interval: float = 2.0, on_update: Callable[[dict, list], None] | None = None,
              timeout: float | None = None) -> dict:
        """Poll a job until it is done, failed or cancelled; `on_update(job, new_events)` after
        every poll. Returns the final job (TimeoutError after `timeout` seconds)."""
        after = None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            page = self.events(job_id, after=after)
            after = page.get("next_after", after)
            job = self.job(job_id)
            if on_update is not None:
                on_update(job, page["items"])
            if job["state"] in FINAL_STATES:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job['state']} after {timeout} s")
            time.sleep(interval)

    # ------------------------------------------------------------------ records
    def records(self, limit: int = 50, before: int | None = None, **filters) -> dict:
        return self._call("GET", "/records", params=_params(limit=limit, before=before, **filters))

    def best(self, workload_key: str, target: str, device_key: str | None = None) -> dict:
        return self._call("GET", "/best", params=_params(workload_key=workload_key, target=target,
                                                         device_key=device_key))

    def export_records(self, out: IO[bytes], **filters) -> int:
        """Stream the records as JSON lines into `out`; returns the bytes written."""
        n = 0
        try:
            with self._http.stream("GET", "/records/export", params=_params(**filters)) as r:
                if r.status_code >= 400:
                    r.read()
                    _raise_for(r)
                for chunk in r.iter_bytes():
                    out.write(chunk)
                    n += len(chunk)
        except httpx.TransportError as e:
            raise APIError(None, f"cannot reach {self.server}: {e}") from None
        return n

    def import_records(self, data: bytes) -> dict:
        return self._call("POST", "/records/import", content=data, headers={"Content-Type": "application/x-ndjson"})

    # ------------------------------------------------------------------ plumbing
    def _call(self, method: str, path: str, **kw) -> Any:
        try:
            r = self._http.request(method, path, **kw)
        except httpx.TransportError as e:
            raise APIError(None, f"cannot reach {self.server}: {e}") from None
        if r.status_code >= 400:
            _raise_for(r)
        return r.json()


def _params(**kw) -> dict:
    return {k: v for k, v in kw.items() if v is not None}


def _raise_for(r: httpx.Response) -> None:
    try:
        body = r.json()
    except ValueError:
        raise APIError(r.status_code, r.text.strip()[:500] or r.reason_phrase) from None
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, list):  # request validation: [{"loc": [...], "msg": ...}, ...]
        parts = [f"{'.'.join(str(x) for x in d.get('loc', [])[1:])}: {d.get('msg')}" for d in detail
                 if isinstance(d, dict)]
        raise APIError(r.status_code, "; ".join(parts) or str(detail),
                       field=".".join(str(x) for x in detail[0].get("loc", [])[1:]) if detail and
                       isinstance(detail[0], dict) else None)
    raise APIError(r.status_code, str(detail), field=body.get("field") if isinstance(body, dict) else None,
                   state=body.get("state") if isinstance(body, dict) else None)
