"""The REST API against its own OpenAPI document, with schemathesis: for every operation,
generated requests without a token and with an admin token get no server error (5xx), a
documented status code, a documented content type, and a body that matches the documented schema.

The app runs in process (ASGI) on a SQLite file seeded with jobs, records (a real matmul's default
schedule and a template candidate, plus error records) and an agent, so small generated ids hit
real rows. Nothing tunes: the API only queues jobs, and no worker runs here.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import content_type_conformance, not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from compiler.target import resolve_target
from tuner.candidate import Candidate, ErrorCode, MeasureResult
from tuner.engine import make_space
from tuner.records import open_store
from tuner.service.api import create_app
from tuner.service.spec import JobSpec, resolve
from tuner.space.base import default_candidate
from tuner.workload import Task, Workload

CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance, content_type_conformance]
TOKENS: dict[str, str] = {}


@schemathesis.serializer("application/x-ndjson")
def _ndjson(ctx, value):
    """Import bodies: generated strings as UTF-8 bytes (anything else as its JSON)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    import json
    return json.dumps(value).encode()


def seed(url: str) -> None:
    store = open_store(url)
    try:
        TOKENS["admin"] = store.tokens.create("schemathesis", "admin")[0]
        target = str(resolve_target(None))
        workload = Workload("matmul", {"M": 16, "N": 16, "K": 16})
        task = Task(workload, target, "local")
        config = make_space("template", workload.opdef(), target).sample(np.random.default_rng(0))
        ok = MeasureResult(costs=[2e-6, 2.2e-6], build_seconds=0.1, run_seconds=0.1, measured_by="local")
        slow = MeasureResult(costs=[8e-6], measured_by="local")
        bad = MeasureResult(error_code=ErrorCode.COMPILE_ERROR, error_msg="no", measured_by="local")
        store.add_records(task, [(default_candidate(workload.key), slow), (config, ok)])
        store.add_records(task, [(Candidate("config", {"template": "x", "knobs": {"i": i}}), bad if i % 3 else ok)
                                 for i in range(30)])
        for i, state in enumerate(["queued", "running", "done", "failed", "cancelled"]):
            spec = JobSpec(workloads=[{"op": "matmul", "params": {"M": 16, "N": 16, "K": 16 + i}}], trials=4, name=f"job-{i}")
            resolved = resolve(spec)
            job_id = store.jobs.submit(resolved.store_rows(), spec.model_dump(mode="json"), space=spec.space,
                                       strategy=resolved.strategy, scheduler=spec.scheduler, trials=spec.trials, name=spec.name)
            if state != "queued":
                store.jobs.set_state(job_id, "cancelled" if state == "cancelled" else "running")
            if state in ("done", "failed"):
                store.jobs.set_state(job_id, state, error="boom" if state == "failed" else None)
        store.upsert_agent("agent-1", "x86", {"cpu": "znver4"})
    finally:
        store.close()


# The schema is loaded when the module is imported (schemathesis's lazy from_fixture loader does not
# work with this pytest), so the app gets its database file then; the data is seeded before the test.
_DIR = Path(tempfile.mkdtemp(prefix="tunefarm-schemathesis-"))
atexit.register(shutil.rmtree, _DIR, ignore_errors=True)
URL = f"sqlite:///{_DIR / 'records.db'}"
schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(URL))   # starts the app's lifespan


@pytest.fixture(scope="module", autouse=True)
def seeded():
    seed(URL)


@schema.parametrize()
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_every_operation_conforms_with_and_without_a_token(case):
    case.call_and_validate(checks=CHECKS)
    case.call_and_validate(checks=CHECKS, headers={"Authorization": f"Bearer {TOKENS['admin']}"})
