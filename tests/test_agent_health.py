"""Agent health in the farm, end to end: a real tracker, a real agent process, real kernels, and a
measuring worker made slow on purpose (device_agent/health.py, rpc_tracker/health.py).

The agent's worker process is stopped and continued on a duty cycle (tests/throttle.py: SIGSTOP /
SIGCONT, half the time stopped), which no per-sample check of the timing protocol sees. Its
calibrations do: the window it measured is taken again in a fresh worker, and the tuner's results
say so; when fresh workers are slow too (the throttle follows every process the agent starts) the
agent reports itself degraded, its window comes back marked, the tracker hands it no work (a
request of its key stays queued), `tunefarm farm status`, the API's farm view and the Prometheus
gauges say so, and once the throttle stops an idle calibration shows it recovered and the queued
request is measured. The marks reach the records, a job's API view and the JSONL export.

Each test has an agent of its own, alone under its key (so "no work" means nothing dispatched at
all): one with the default periods for the re-measured window (an idle calibration never runs
between its batch's arrival and its window, so the throttle is known to hit the window's closing
calibration), one with short ones for the degraded agent (`--recheck 1`, degraded after two slow
verdicts in a row with one fresh worker tried each time) so it degrades and recovers within
seconds, and a busy host's odd slow calibration does not make it degraded on its own. Both take the host's timing
lock in a folder of their own (TUNEFARM_LOCK_DIR): other tunefarm processes on this machine do
not hold up their measurements.
"""

from __future__ import annotations

import io
import json
import sys
import time

import pytest
from fastapi.testclient import TestClient
from processes import wait_for
from test_farm import AGENT_TOKEN, FAST, MM, NAIVE, TUNER_TOKEN, Background, Processes, agents_of, runner_for, summary
from throttle import Throttle, children

from compiler.ops import default_schedule
from device_agent.agent import AgentConfig
from device_agent.calibration import SLOW_RATIO
from rpc_tracker.server import TrackerConfig, start_tracker
from tuner.candidate import Candidate
from tuner.measure import BuilderPool
from tuner.records import open_store
from tuner.service.api import create_app
from tuner.workload import Task

AGENTS = {   # name: (device key, extra options)
    "drifting": ("health-remeasure", ()),
    "degrading": ("health-degrade", ("--recheck", "1", "--degrade-after", "2", "--replacements", "1", "--recovery-wait", "0")),
}
# a request takes a few tenths of a second: long enough to start a throttle while it is measured,
# short enough under one (its sampling is capped, one attempt on a busy host) to keep each test to seconds
MEASURE = dict(number=1, repeat=2, min_repeat_ms=150, max_repeat_ms=300, attempts=1)
HALF_SPEED = dict(stop_s=0.002, run_s=0.002)


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    """A tracker and the calibrating agents of AGENTS, each healthy: (address, {name: Popen})."""
    tmp = tmp_path_factory.mktemp("health")
    server = start_tracker(TrackerConfig(port=0, agent_token=AGENT_TOKEN, tuner_token=TUNER_TOKEN, **FAST))
    procs = Processes(tmp)
    lock_dir = tmp / "lock"
    lock_dir.mkdir()
    env = {"TUNEFARM_AGENT_TOKEN": AGENT_TOKEN, "TUNEFARM_LOCK_DIR": str(lock_dir)}
    agents = {name: procs._start(name, [sys.executable, "-m", "device_agent", "--tracker", server.address, "--key", key,
                                        "--name", name, "--slots", "1", "-v", *extra], env)
              for name, (key, extra) in AGENTS.items()}
    try:
        for name in AGENTS:
            wait_for(lambda name=name: health(server.address, name).health == "healthy", 60,
                     f"agent {name} to register and calibrate healthy")
        yield server.address, agents
    finally:
        procs.kill_all()
        server.stop(0)


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """{device key: (task, [default schedule of MM, naive schedule of MM] built for this host, their
    candidates)}: built once (a kernel does not depend on the device key), under a host lock of this
    module's own, as its agents measure."""
    default = Candidate("trace", {"sketch": "default", "steps": default_schedule(MM.opdef()).steps})
    keys = [key for key, _ in AGENTS.values()]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNEFARM_LOCK_DIR", str(tmp_path_factory.mktemp("build-lock")))
        with BuilderPool(n_workers=1, timeout=60) as pool:
            built = pool.build(Task.create(MM, device_key=keys[0]), [default, NAIVE])
    assert all(b.ok for b in built), [b.error_msg for b in built]
    return {key: (Task.create(MM, device_key=key), built, [default, NAIVE]) for key in keys}


def health(address: str, name: str):
    """The agent's AgentSummary (health, speed index, counters) as the tracker has it."""
    return agents_of(address, AGENTS[name][0])[name]


def worker_of(agent) -> int | None:
    """The agent's measuring worker now (its one child; the newest while one is being replaced)."""
    kids = children(agent.pid)
    return kids[-1] if kids else None


def healthy(address: str, name: str) -> None:
    """Wait until the agent is healthy (a busy host can make an idle calibration read slow for a
    while): two of the default agent's recheck periods and a margin, since a calibration that read
    the host slow is redone only at the next idle recheck, 30 s later (on a slow 2-core host running
    the suite's other half, one such reading ran the 30 s this waited before out)."""
    wait_for(lambda: health(address, name).health == "healthy", 2 * AgentConfig.recheck_seconds + 15,
             f"{name} to be healthy")


def started(address: str, name: str, run: Background) -> None:
    wait_for(lambda: health(address, name).in_flight >= 1 or run.results is not None, 20, f"{name} to take the batch")
    assert run.results is None


def stored_job(tmp_path, task, candidates, results) -> tuple:
    """The results as a job's records in a SQLite store: (store URL, job id)."""
    url = f"sqlite:///{tmp_path / 'records.db'}"
    with open_store(url) as store:
        job_id = store.jobs.submit([(task, 1.0, None)], {"device_key": task.device_key}, space="sketch", strategy="random",
                                   scheduler="round_robin", trials=len(results))
        store.add_records(task, list(zip(candidates, results)), job_id=job_id)
    return url, job_id


@pytest.mark.slow
@pytest.mark.flaky(reruns=2, only_rerun=["AssertionError"])   # a steady host for seconds: see pyproject
def test_a_window_found_slow_is_measured_again_in_a_fresh_worker(farm, builds, tmp_path):
    address, agents = farm
    name = "drifting"
    agent, key = agents[name], AGENTS[name][0]
    task, out, candidates = builds[key]
    healthy(address, name)
    before = health(address, name)
    slow_pid = worker_of(agent)
    runner = runner_for(address, key, **MEASURE)
    try:
        # throttled from before the request is sent (started after it, a quick window and its
        # calibration could close first), this worker only: a replacement runs free. The verdict
        # is a timing: a calibration that caught the worker in its running half may read healthy,
        # so the window is sent again (to the same, still throttled worker) up to three times
        for _ in range(3):
            with Throttle(lambda: slow_pid, **HALF_SPEED) as throttle:
                run = Background(runner, task, out[:1])      # one request: one window
                results = run.join(60)
            if any(r.remeasured for r in results) or worker_of(agent) != slow_pid:
                break
    finally:
        runner.close()
    assert throttle.cycles > 10
    assert all(r.ok and r.measured_by == name for r in results), [r.error_msg for r in results]
    again = [r for r in results if r.remeasured]
    assert again and not any(r.slow_window for r in results)                 # taken again, nothing left marked
    assert all(r.slow_index is not None and r.slow_index < SLOW_RATIO for r in again)
    assert worker_of(agent) != slow_pid                                      # the slow process was replaced
    # the counters reach the tracker with the agent's next health report: wait for all of them
    after = wait_for(lambda: (a := health(address, name)).replacements > before.replacements
                     and a.remeasured >= before.remeasured + len(again) and a.slow_windows > before.slow_windows
                     and a, 10, "the agent to report the replacement and the re-measured window")
    assert after.health == "healthy" and after.speed_index >= SLOW_RATIO     # the fresh worker is healthy

    # the records keep it, and a job's API view says when and why
    url, job_id = stored_job(tmp_path, task, candidates, results)
    with TestClient(create_app(url, public_read=True)) as client:
        job = client.get(f"/api/v1/jobs/{job_id}").json()
        record = client.get("/api/v1/records", params={"job_id": job_id}).json()["items"]
    assert sum(w["count"] for w in job["retaken"] if w["kind"] == "remeasured") == len(again)
    window = job["retaken"][0]
    assert window["measured_by"] == name and window["position"] == 0 and window["slow_index"] < SLOW_RATIO
    assert "measured again in a fresh worker" in window["reason"]
    assert job["tasks"][0]["remeasured"] == len(again) and job["tasks"][0]["slow_window"] == 0
    assert sum(r["result"]["remeasured"] for r in record) == len(again)


@pytest.mark.slow
@pytest.mark.flaky(reruns=2, only_rerun=["AssertionError"])   # a steady host for seconds: see pyproject
def test_an_agent_that_stays_slow_is_degraded_gets_no_work_and_recovers(farm, builds, tmp_path, capsys):
    address, agents = farm
    name = "degrading"
    agent, key = agents[name], AGENTS[name][0]
    task, out, candidates = builds[key]
    healthy(address, name)
    runner = runner_for(address, key, **MEASURE)
    throttle = None
    try:
        run = Background(runner, task, out[:1])      # one request: one window
        started(address, name, run)
        throttle = Throttle(lambda: worker_of(agent), follow=True, **HALF_SPEED).__enter__()   # every worker it starts
        marked = run.join(60)
        assert all(r.ok and r.slow_window and not r.remeasured for r in marked), marked
        assert all(r.slow_index < SLOW_RATIO for r in marked)
        wait_for(lambda: health(address, name).health == "degraded", 20, "the agent to report itself degraded")

        # no work while degraded: a request of its key stays queued
        done_before = health(address, name).completed
        waiting = Background(runner, task, out[:1])
        for _ in range(10):
            time.sleep(0.2)
            mine = next(k for k in summary(address).keys if k.device_key == key)
            assert (mine.queued, mine.in_flight, mine.degraded) == (1, 0, 1)
        assert health(address, name).completed == done_before and waiting.results is None

        # ... and everything that shows the farm says so
        from tuner.cli import main as tunefarm
        assert tunefarm(["farm", "status", "--tracker", address, "--token", TUNER_TOKEN]) == 0
        status = capsys.readouterr().out
        row = next(line for line in status.splitlines() if line.startswith(name))
        assert "degraded" in row and f"{health(address, name).speed_index:.2f}" in row
        assert f"no work until a calibration shows it recovered): {name}" in status
        with TestClient(create_app(f"sqlite:///{tmp_path / 'api.db'}", public_read=True, tracker=address,
                                   tracker_token=TUNER_TOKEN)) as client:
            farm_view = client.get("/api/v1/farm").json()
            metrics = client.get("/metrics").text
        seen = next(a for a in farm_view["agents"] if a["name"] == name)
        assert seen["health"] == "degraded" and seen["speed_index"] < SLOW_RATIO and seen["slow_windows"] >= 1
        assert next(k for k in farm_view["keys"] if k["device_key"] == key)["degraded"] == 1
        assert f'tunefarm_agent_state{{agent="{name}",device_key="{key}",state="degraded"}} 1.0' in metrics
        assert f'tunefarm_agent_state{{agent="{name}",device_key="{key}",state="healthy"}} 0.0' in metrics
        gauge = next(line for line in metrics.splitlines() if line.startswith(f'tunefarm_agent_speed_index{{agent="{name}"'))
        assert float(gauge.split()[-1]) < SLOW_RATIO
        assert "tunefarm_tracker_up 1.0" in metrics
    finally:
        if throttle is not None:
            throttle.stop()
    # recovered: an idle calibration finds it healthy, and the queued request is measured
    try:
        wait_for(lambda: health(address, name).health == "healthy", 20, "the agent to recover")
        later = waiting.join(30)
    finally:
        runner.close()
    assert later[0].ok and not later[0].slow_window and later[0].measured_by == name

    # the marked records keep their marks in both exports, and a job's API view says why
    url, job_id = stored_job(tmp_path, task, candidates, marked)
    with open_store(url) as store:
        text = io.StringIO()
        store.export_jsonl(text)
    with TestClient(create_app(url, public_read=True)) as client:
        job = client.get(f"/api/v1/jobs/{job_id}").json()
        streamed = client.get("/api/v1/records/export").text
    assert {w["kind"] for w in job["retaken"]} == {"slow_window"}
    assert "fresh workers were slow too" in job["retaken"][0]["reason"]
    assert sum(t["slow_window"] for t in job["tasks"]) == len(marked)
    for lines in (text.getvalue(), streamed):
        exported = [json.loads(line)["result"] for line in lines.splitlines() if line.strip()]
        assert len(exported) == len(marked)
        assert all(r["slow_window"] is True and r["slow_index"] < SLOW_RATIO for r in exported)
