"""Refuse what cannot run: a job whose target its device cannot execute is refused at submission.

- 'local' jobs (the API) and `tunefarm tune` without --tracker: this host's own load check
  (compiler.kernel_format.check_runnable) refuses another architecture or a CPU feature the host
  lacks with a 422 naming the field `target` / a usage error, before anything is queued or stored.
- farm jobs: with a tracker that has agents of the key, the tracker's rule (rpc_tracker.targets)
  refuses a target none of them can run; no agents, or no tracker answering, accepts as before.

Real parts throughout: the API app on a SQLite file, the CLI in process, an in-process tracker
and a real `python -m device_agent` process on loopback (killed by the test).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from api_env import Env, make_env
from fastapi.testclient import TestClient
from processes import kill_group, wait_for
from serve_process import free_port

from compiler.target import Target
from rpc_tracker.protocol import pb
from rpc_tracker.server import TrackerConfig, start_tracker
from tuner import cli
from tuner.service.api.runnable import farm_refusal, refusal_from_summary

ROOT = Path(__file__).resolve().parents[1]
HOST = Target.host()
# a triple of another architecture than this host's
FOREIGN_ARCH, FOREIGN = (("aarch64", "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72") if HOST.arch != "aarch64"
                         else ("x86_64", "llvm -mtriple=x86_64-unknown-linux-gnu -mcpu=haswell"))
WORKLOAD = {"op": "matmul", "params": {"M": 16, "N": 16, "K": 16}}
SMALL_ARGS = ["--param", "M=16", "--param", "N=16", "--param", "K=16"]
KEY = "refuse-test"
AGENT_TOKEN, TUNER_TOKEN = "agent-secret", "tuner-secret"


def missing_feature() -> str:
    """A CPU feature LLVM knows for this architecture and this host lacks (skip when it has them all)."""
    candidates = {"x86_64": ("avx512f", "amx-tile"), "aarch64": ("sve", "sme")}.get(HOST.arch, ())
    have = HOST.assumed_features()
    for f in candidates:
        if f not in have:
            return f
    pytest.skip(f"this {HOST.arch} host ({HOST.cpu}) has every feature the test knows to ask for: {candidates}")


def assert_nothing_stored(env: Env):
    assert env.n_jobs() == 0 and env.store.count() == 0
    assert env.get("/api/v1/jobs").json()["items"] == []
    assert env.get("/api/v1/records").json()["items"] == []


# ----------------------------------------------------------------------------- 'local' jobs, the API

def test_local_job_for_another_architecture_is_422(sqlite_env):
    env = sqlite_env
    r = env.post("/api/v1/jobs", json={"workloads": [WORKLOAD], "target": FOREIGN, "device_key": "local"})
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["field"] == "target" and FOREIGN_ARCH in body["detail"] and HOST.triple in body["detail"], body
    assert_nothing_stored(env)


def test_local_job_needing_a_feature_this_host_lacks_is_422(sqlite_env):
    env = sqlite_env
    feature = missing_feature()
    target = f"llvm -mtriple={HOST.triple} -mcpu={HOST.cpu} -mattr=+{feature}"
    r = env.post("/api/v1/jobs", json={"workloads": [WORKLOAD], "target": target})   # device_key defaults to local
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["field"] == "target" and feature in body["detail"] and "lacks" in body["detail"], body
    assert_nothing_stored(env)


def test_local_job_for_this_hosts_own_target_is_accepted(sqlite_env):
    r = sqlite_env.post("/api/v1/jobs", json={"workloads": [WORKLOAD], "target": str(HOST), "trials": 4})
    assert r.status_code == 201, r.text
    assert sqlite_env.n_jobs() == 1


# ----------------------------------------------------------------------------- the CLI

def test_cli_tune_for_another_architecture_is_a_usage_error(tmp_path, capsys):
    db = tmp_path / "cli.db"
    assert cli.main(["tune", "matmul", *SMALL_ARGS, "--trials", "2", "--target", FOREIGN, "--db", f"sqlite:///{db}"]) == 2
    err = capsys.readouterr().err
    assert "tunefarm tune: error:" in err and "cannot run" in err and FOREIGN_ARCH in err, err
    assert not db.exists()              # refused before the records database was even opened


def test_cli_tune_needing_a_feature_this_host_lacks_is_a_usage_error(tmp_path, capsys):
    feature = missing_feature()
    db = tmp_path / "cli.db"
    target = f"llvm -mtriple={HOST.triple} -mcpu={HOST.cpu} -mattr=+{feature}"
    assert cli.main(["tune", "matmul", *SMALL_ARGS, "--trials", "2", "--target", target, "--db", f"sqlite:///{db}"]) == 2
    err = capsys.readouterr().err
    assert "cannot run" in err and feature in err, err
    assert not db.exists()


# ----------------------------------------------------------------------------- farm jobs


@pytest.fixture
def tracker_with_agent(tmp_path):
    """An in-process tracker with one real agent (this host) registered under KEY: the tracker's address."""
    server = start_tracker(TrackerConfig(port=0, agent_token=AGENT_TOKEN, tuner_token=TUNER_TOKEN,
                                         heartbeat_seconds=0.5, agent_timeout_seconds=2.0))
    log = tmp_path / "agent.log"
    with open(log, "wb") as out:
        agent = subprocess.Popen([sys.executable, "-m", "device_agent", "--tracker", server.address, "--key", KEY,
                                  "--name", "agent-here", "--slots", "1", "--no-calibration"],
                                 cwd=ROOT, env=dict(os.environ, TUNEFARM_AGENT_TOKEN=AGENT_TOKEN, PYTHONUNBUFFERED="1"),
                                 stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        from rpc_tracker.client import farm_summary
        try:
            wait_for(lambda: any(a.device_key == KEY for a in farm_summary(server.address, TUNER_TOKEN).agents), 60,
                     "the agent to register")
        except AssertionError:
            raise AssertionError(f"agent did not register; its output:\n{log.read_text(errors='replace')}") from None
        yield server.address
    finally:
        kill_group(agent)
        server.stop(0)


def test_farm_job_no_agent_of_its_key_can_run_is_422(tracker_with_agent, tmp_path):
    store, app, tokens = make_env(f"sqlite:///{tmp_path / 'farm.db'}", tracker=tracker_with_agent, tracker_token=TUNER_TOKEN)
    with store, TestClient(app) as client:
        env = Env(store, client, tokens)
        r = env.post("/api/v1/jobs", json={"workloads": [WORKLOAD], "target": FOREIGN, "device_key": KEY})
        assert r.status_code == 422, r.text
        body = r.json()
        assert body["field"] == "target", body
        assert f"no agent of device key {KEY!r}" in body["detail"] and FOREIGN_ARCH in body["detail"], body
        assert "agent-here" in body["detail"], body
        assert_nothing_stored(env)
        # the host's own target on the same key: its agent can run it
        r = env.post("/api/v1/jobs", json={"workloads": [WORKLOAD], "target": str(HOST), "device_key": KEY, "trials": 4})
        assert r.status_code == 201, r.text
        # a key no agent has registered under: the farm may join later
        r = env.post("/api/v1/jobs", json={"workloads": [WORKLOAD], "target": FOREIGN, "device_key": "not-yet", "trials": 4})
        assert r.status_code == 201, r.text
        assert env.n_jobs() == 2


def test_farm_job_is_accepted_when_the_tracker_does_not_answer(tmp_path):
    nobody = f"127.0.0.1:{free_port()}"
    assert farm_refusal(nobody, TUNER_TOKEN, KEY, FOREIGN) is None
    store, app, tokens = make_env(f"sqlite:///{tmp_path / 'down.db'}", tracker=nobody, tracker_token=TUNER_TOKEN)
    with store, TestClient(app) as client:
        env = Env(store, client, tokens)
        r = env.post("/api/v1/jobs", json={"workloads": [WORKLOAD], "target": FOREIGN, "device_key": KEY, "trials": 4})
        assert r.status_code == 201, r.text


def test_one_capable_agent_is_enough_and_refusals_name_each_agent():
    """refusal_from_summary on a FarmSummary as the tracker sends it (the protocol's own message)."""
    def agent(name, triple, cpu, features, key=KEY):
        return pb.AgentSummary(agent_id=f"id-{name}", name=name, device_key=key,
                               device=pb.DeviceInfo(triple=triple, cpu=cpu, features=features))
    x86 = agent("x86-a", "x86_64-unknown-linux-gnu", "znver3", ["avx", "avx2", "fma"])
    x86_old = agent("x86-b", "x86_64-unknown-linux-gnu", "nehalem", ["sse4.2"])
    arm = agent("arm-a", "aarch64-unknown-linux-gnu", "cortex-a72", ["neon"])
    avx2 = "llvm -mtriple=x86_64-unknown-linux-gnu -mcpu=znver3 -mattr=+avx2,+fma -num-cores=2"
    assert refusal_from_summary(pb.FarmSummary(agents=[x86_old, x86]), KEY, avx2) is None
    why = refusal_from_summary(pb.FarmSummary(agents=[x86_old, arm]), KEY, avx2)
    assert "2 agents registered" in why and "x86-b: cpu features the agent lacks: avx2, fma" in why, why
    assert "arm-a: architecture x86_64" in why, why
    assert refusal_from_summary(pb.FarmSummary(agents=[arm]), "other-key", avx2) is None      # no agents of that key
