"""An Arm board in the farm: an aarch64 Debian root under qemu-user (tests/board.py), running the
real agent of this checkout, dialing a real tracker on this host's loopback.

One tracker and one board agent (`tunefarm agent --key arm-a72` inside the board) serve the whole
module, so the emulator's start-up is paid once. What is checked:
- the board is aarch64 Python 3.11 with the agent's base set only, runs this checkout's code, and
  says it is emulated; the tracker keeps that, and a native agent cannot join its key;
- `tunefarm tune … --target aarch64/cortex-a72 --tracker … --key arm-a72` cross-compiles here, the
  board checks and times every candidate, the records are stored under that target and labelled
  emulated; apply-best builds the best one and the board runs it correctly (numpy in the board);
- the same over REST: a job for the board's target and key runs there; a job for x86 on that key
  is refused with 422;
- a kernel of another ISA sent to the board anyway comes back with UNSUPPORTED_TARGET.
Emulation is slow: small shapes, few trials, quick timing options where the interface has them.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from board import ensure_board, run_in_board, spawn_in_board
from processes import kill_group, wait_for

from compiler.ops import build_op, get_op
from compiler.ops.base import random_inputs
from compiler.target import Target
from rpc_tracker.client import farm_summary
from rpc_tracker.server import TrackerConfig, start_tracker
from tuner import cli
from tuner.apply_best import ApplyHistoryBest
from tuner.candidate import ErrorCode
from tuner.measure import BuilderPool, MeasureOptions, RPCRunner
from tuner.records import open_store
from tuner.workload import Task, Workload

pytestmark = [pytest.mark.board, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
KEY = "arm-a72"
BOARD_AGENT = "board-a72"
TARGET = "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"
AGENT_TOKEN, TUNER_TOKEN = "board-agent-secret", "board-tuner-secret"
PARAMS = {"M": 16, "N": 16, "K": 16}
SMALL_ARGS = [arg for name, value in PARAMS.items() for arg in ("--param", f"{name}={value}")]
QUICK = dict(number=1, repeat=3, min_repeat_ms=2, max_repeat_ms=50)


@pytest.fixture(scope="module")
def board():
    return ensure_board()


@pytest.fixture(scope="module")
def board_farm(board, tmp_path_factory):
    """An in-process tracker on 127.0.0.1 and the board's agent registered under KEY: the tracker's address."""
    server = start_tracker(TrackerConfig(host="127.0.0.1", port=0, agent_token=AGENT_TOKEN, tuner_token=TUNER_TOKEN,
                                         heartbeat_seconds=1.0, agent_timeout_seconds=10.0))
    log = tmp_path_factory.mktemp("board") / "agent.log"
    agent = spawn_in_board(["tunefarm", "agent", "--tracker", server.address, "--key", KEY, "--name", BOARD_AGENT],
                           log, env={"TUNEFARM_AGENT_TOKEN": AGENT_TOKEN})
    try:
        try:
            wait_for(lambda: agent.poll() is not None or any(a.name == BOARD_AGENT for a in summary(server.address).agents),
                     180, "the board's agent to register")
        except AssertionError:
            raise AssertionError(f"the board's agent did not register; its output:\n{log.read_text(errors='replace')}") from None
        assert agent.poll() is None, f"the board's agent exited {agent.returncode}:\n{log.read_text(errors='replace')}"
        yield server.address
    finally:
        kill_group(agent, signal.SIGTERM)   # drains, then exits
        try:
            agent.wait(timeout=30)
        except Exception:  # noqa: BLE001 - it did not drain in time: kill it
            kill_group(agent)
        server.stop(0)


def summary(address):
    return farm_summary(address, TUNER_TOKEN)


def board_agent(address):
    (agent,) = [a for a in summary(address).agents if a.name == BOARD_AGENT]
    return agent


# ----------------------------------------------------------------------------- the board itself

PROBE = r"""
import hashlib, importlib.util, json, platform, sys
import device_agent.agent, device_agent.worker
from device_agent.host import describe_host, is_emulated, kernel_arch
heavy = ["fastapi", "sqlalchemy", "xgboost", "alembic", "uvicorn", "pydantic"]
print(json.dumps({
    "machine": platform.machine(), "python": list(sys.version_info[:2]), "kernel_arch": kernel_arch(),
    "emulated": is_emulated(), "device": describe_host(),
    "installed_heavy": [m for m in heavy if importlib.util.find_spec(m) is not None],
    "imported_heavy": sorted(m for m in sys.modules if m.split(".")[0] in heavy),
    "agent_file": device_agent.agent.__file__,
    "host_py_sha": hashlib.sha256(open("/opt/tunefarm/device_agent/host.py", "rb").read()).hexdigest(),
}))
"""


def test_the_board_is_an_emulated_aarch64_with_only_the_agents_base_set(board):
    proc = run_in_board("python3", "-c", PROBE)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["machine"] == "aarch64" and got["python"] == [3, 11], got
    assert got["kernel_arch"] == Target.host().arch and got["emulated"] is True, got
    dev = got["device"]
    assert dev["triple"].startswith("aarch64") and dev["cpu"] == "cortex-a72" and "neon" in dev["features"], dev
    assert dev["emulated"] is True and dev["llvmlite_version"], dev
    assert got["installed_heavy"] == [] and got["imported_heavy"] == [], got
    # the code it runs is this checkout's, as it is now
    assert got["agent_file"].startswith("/opt/tunefarm/"), got
    assert got["host_py_sha"] == hashlib.sha256((ROOT / "device_agent" / "host.py").read_bytes()).hexdigest()


def test_the_tracker_keeps_the_board_emulated_and_its_key_to_emulated_agents(board_farm, tmp_path):
    import llvmlite
    agent = board_agent(board_farm)
    assert agent.device_key == KEY and agent.device.emulated, agent
    assert agent.device.cpu == "cortex-a72" and agent.device.triple.startswith("aarch64"), agent
    assert agent.device.llvmlite_version == llvmlite.__version__   # the board follows the tuner's llvmlite
    # a native agent under the board's key is refused at hello, with the reason, and exits 3
    import subprocess
    import sys
    log = tmp_path / "native.log"
    with open(log, "wb") as out:
        native = subprocess.Popen([sys.executable, "-m", "device_agent", "--tracker", board_farm, "--key", KEY,
                                   "--name", "native-here"], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                  env=dict(os.environ, TUNEFARM_AGENT_TOKEN=AGENT_TOKEN), start_new_session=True)
    try:
        assert native.wait(timeout=60) == 3, log.read_text()
    finally:
        kill_group(native)
    said = log.read_text()
    assert "FAILED_PRECONDITION" in said and f"device key '{KEY}' is served by emulated agents" in said, said
    assert [a.name for a in summary(board_farm).agents] == [BOARD_AGENT]


# ----------------------------------------------------------------------------- tuning on the board

CHECK_ON_BOARD = r"""
import io, json, sys
import numpy as np
from compiler.runtime import load_kernel
data = np.load(io.BytesIO(sys.stdin.buffer.read()))
kernel = load_kernel(data["kernel"].tobytes())
A, B = data["A"], data["B"]
C = np.full((A.shape[0], B.shape[1]), np.nan, np.float32)   # poisoned: every element must be written
kernel(A, B, C)
want = np.matmul(A.astype(np.float64), B.astype(np.float64))
print(json.dumps({"target": str(kernel.target), "max_abs_err": float(np.max(np.abs(C - want))),
                  "all_written": bool(np.isfinite(C).all())}))
"""


def test_tune_on_the_board_then_apply_best_runs_there(board_farm, tmp_path, capsys):
    db = f"sqlite:///{tmp_path / 'board.db'}"
    status = cli.main(["tune", "matmul", *SMALL_ARGS, "--target", TARGET, "--tracker", board_farm, "--token", TUNER_TOKEN,
                       "--key", KEY, "--trials", "4", "--batch", "4", "--top-k", "1", "--plain", "--db", db])
    out = capsys.readouterr()
    assert status == 0, out.out + out.err
    assert "4 trials measured now" in out.out and "run emulated" in out.out, out.out
    assert "this machine cannot run it, its agents checked and timed it" in out.out, out.out

    store = open_store(db)
    target = str(Target.from_string(TARGET))
    records = store.history(target=target)
    assert len(records) >= 5, records                  # 4 trials and the default schedule
    measured = [r for r in records if r.result.ok]
    assert measured and all(r.device_key == KEY for r in records)
    assert all(r.result.measured_by == BOARD_AGENT and r.result.emulated for r in measured), measured
    assert all(r.result.median and r.result.samples > 0 for r in measured)
    assert board_agent(board_farm).completed >= len(measured)

    # apply-best for that target builds the best record's schedule (cross-compiled here) ...
    opdef = get_op("matmul", **PARAMS)
    provider = ApplyHistoryBest(store)
    best = provider.best_record(opdef, Target.from_string(TARGET))
    assert best is not None and best.result.emulated
    with provider:
        kernel = build_op(opdef, Target.from_string(TARGET))
    assert kernel.target.arch == "aarch64" and kernel.source == kernel_source_of(best, opdef, TARGET)
    # ... and load_kernel on the board runs it correctly
    A, B = random_inputs(opdef, np.random.default_rng(5))
    buf = io.BytesIO()
    np.savez(buf, kernel=np.frombuffer(kernel.to_bytes(), np.uint8), A=A, B=B)
    proc = run_in_board("python3", "-c", CHECK_ON_BOARD, input=buf.getvalue())
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["target"].startswith("llvm -mtriple=aarch64") and got["all_written"], got
    assert got["max_abs_err"] < 1e-4 * PARAMS["K"], got
    store.close()


def kernel_source_of(record, opdef, target) -> str:
    """The loop IR apply-best must have built: the record's candidate lowered for `target`."""
    from compiler.lower import lower
    from tuner.space import instantiate
    schedule, args = instantiate(opdef, record.candidate, Target.from_string(target))
    return str(lower(schedule, args, "main"))


def test_a_kernel_of_another_isa_sent_to_the_board_is_refused_with_a_clear_code(board_farm):
    """The tracker routes on the request's target; a request whose kernel is x86 code anyway
    (a tuner that built for the wrong machine) is refused by the board itself, not run."""
    host = Target.host()
    here = Task(Workload("matmul", PARAMS), str(host), KEY)
    with BuilderPool(n_workers=1) as builder:
        (x86,) = builder.build(here, [default_candidate(here)])
    assert x86.kernel_bytes is not None
    arm_task = Task(Workload("matmul", PARAMS), str(Target.from_string(TARGET)), KEY)
    with RPCRunner(board_farm, KEY, token=TUNER_TOKEN, options=MeasureOptions(**QUICK)) as runner:
        (res,) = runner.run(arm_task, [x86])
    assert res.error_code == ErrorCode.UNSUPPORTED_TARGET and res.measured_by == BOARD_AGENT, res
    assert "cannot run the candidate kernel" in res.error_msg and host.arch in res.error_msg, res.error_msg


def default_candidate(task):
    from tuner.space import default_candidate as make
    return make(task.workload.opdef().workload_key())


# ----------------------------------------------------------------------------- the same over REST

def test_a_rest_job_for_the_board_runs_there_and_another_isa_is_422(board_farm, tmp_path):
    from api_env import Env, make_env
    from fastapi.testclient import TestClient

    from tuner.service.worker import JobWorker

    url = f"sqlite:///{tmp_path / 'rest.db'}"
    store, app, tokens = make_env(url, tracker=board_farm, tracker_token=TUNER_TOKEN)
    with store, TestClient(app) as client:
        env = Env(store, client, tokens)
        wl = {"op": "matmul", "params": PARAMS}
        x86 = "llvm -mtriple=x86_64-unknown-linux-gnu -mcpu=haswell"
        r = env.post("/api/v1/jobs", json={"workloads": [wl], "target": x86, "device_key": KEY, "trials": 2})
        assert r.status_code == 422, r.text
        body = r.json()
        assert body["field"] == "target" and f"no agent of device key {KEY!r}" in body["detail"], body
        assert BOARD_AGENT in body["detail"] and "architecture x86_64" in body["detail"], body
        assert env.n_jobs() == 0

        r = env.post("/api/v1/jobs", json={"workloads": [wl], "target": TARGET, "device_key": KEY, "trials": 3,
                                           "batch_size": 3, "space": "template", "strategy": "random", "top_k": 1,
                                           "measure": QUICK})
        assert r.status_code == 201, r.text
        jid = r.json()["id"]
        with JobWorker(store, name="rest-worker", tracker=board_farm, tracker_token=TUNER_TOKEN, build_workers=1) as w:
            assert w.run_once() == jid
        job = env.get(f"/api/v1/jobs/{jid}").json()
        assert job["state"] == "done", job
        page = env.get("/api/v1/records", params={"job_id": jid}).json()["items"]
        assert len(page) == 3 + 1, page
        timed = [rec for rec in page if rec["result"]["error_code"] == 0]
        assert timed and all(rec["result"]["measured_by"] == BOARD_AGENT and rec["result"]["emulated"] for rec in timed)
        assert all(rec["target"].startswith("llvm -mtriple=aarch64") and rec["device_key"] == KEY for rec in page)
        farm = env.get("/api/v1/farm").json()
        (agent,) = [a for a in farm["agents"] if a["name"] == BOARD_AGENT]
        assert agent["info"]["emulated"] is True, agent
