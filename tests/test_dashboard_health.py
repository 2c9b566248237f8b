"""Agent health in the web dashboard, in headless chromium (Playwright, /usr/bin/chromium, as
test_dashboard.py): a real tracker, two real agents and `tunefarm serve --tracker` on loopback.

One agent's measuring worker is stopped and continued on a duty cycle (tests/throttle.py) until
its calibrations report it degraded: the farm page shows its health badge, its speed index and a
warning that it gets no work, live (refreshed every 2 s), and shows it healthy again once the
throttle stops. A job whose records were re-measured after a slow window, or kept marked, shows
when, on which agent, at what speed and why, in its page's "Re-taken measurements" section (the
records are stored through the records store, as a farm job's worker stores an agent's results;
test_agent_health.py follows such results from a throttled agent through the tracker). Both pages
are checked at desktop and phone width (labels, contrast, no sideways scrolling); screenshots are
kept under pytest's tmp_path (their paths are printed).
"""

from __future__ import annotations

import sys

import pytest
from processes import wait_for
from test_dashboard import DESKTOP, browser, check_page, free_port, spawn, start_serve, stop  # noqa: F401 - browser is a fixture
from throttle import Throttle, children

from rpc_tracker.client import farm_summary
from tuner.candidate import Candidate, MeasureResult
from tuner.records import open_store
from tuner.workload import Task, Workload

AGENT_TOKEN, TUNER_TOKEN = "health-agent-secret", "health-tuner-secret"
KEY = "dash-health"


def agent_health(address: str, name: str) -> str | None:
    agents = {a.name: a for a in farm_summary(address, TUNER_TOKEN).agents}
    return agents[name].health if name in agents else None


def seed_job(db: str) -> int:
    """A finished farm job whose measurements two slow windows touched: one taken again in a fresh
    worker, one kept but marked (the agent was degraded)."""
    task = Task.create(Workload("matmul", {"M": 64, "N": 64, "K": 64}), device_key=KEY)

    def result(cost, **marks):
        return MeasureResult(costs=[cost], median=cost, minimum=cost, spread=0.01, samples=8, measured_by="stuck-agent",
                             **marks)
    with open_store(db) as store:
        job_id = store.jobs.submit([(task, 1.0, 2 * 64 ** 3)], {"device_key": KEY}, space="sketch", strategy="random",
                                   scheduler="round_robin", trials=6, name="health-demo")
        assert store.jobs.claim("dash-worker", 60.0, [KEY]).id == job_id
        store.add_records(task, [(Candidate("config", {"i": i}), result(1e-4 * (i + 1))) for i in range(2)], job_id=job_id)
        store.add_records(task, [(Candidate("config", {"i": i}), result(1e-4 * (i + 1), remeasured=True, slow_index=0.47))
                                 for i in range(2, 5)], job_id=job_id)
        store.add_records(task, [(Candidate("config", {"i": 5}), result(9e-5, slow_window=True, slow_index=0.38))],
                          job_id=job_id)
        assert store.jobs.finish(job_id, "dash-worker", "done")
    return job_id


@pytest.fixture(scope="module")
def farm_site(tmp_path_factory):
    """A tracker, a steady and a stuck agent of KEY, and `tunefarm serve --tracker` on a seeded database."""
    tmp = tmp_path_factory.mktemp("dashboard_health")
    port = free_port()
    address = f"127.0.0.1:{port}"
    lock = tmp / "lock"
    lock.mkdir()
    procs = [spawn([sys.executable, "-m", "tuner.cli", "tracker", "--host", "127.0.0.1", "--port", str(port),
                    "--agent-token", AGENT_TOKEN, "--tuner-token", TUNER_TOKEN, "--heartbeat", "0.5"], tmp / "tracker.log")]
    env = {"TUNEFARM_AGENT_TOKEN": AGENT_TOKEN, "TUNEFARM_LOCK_DIR": str(lock)}
    agents = {}
    for name, extra in (("steady-agent", ()), ("stuck-agent", ("--recheck", "1", "--degrade-after", "2", "--replacements", "1",
                                                                    "--recovery-wait", "0"))):
        agents[name] = spawn([sys.executable, "-m", "tuner.cli", "agent", "--tracker", address, "--key", KEY, "--name", name,
                              *extra], tmp / f"{name}.log", env)
        procs.append(agents[name])
    db = f"sqlite:///{tmp / 'records.db'}"
    job_id = seed_job(db)
    try:
        for name in agents:
            wait_for(lambda name=name: agent_health(address, name) == "healthy", 90, f"{name} to calibrate healthy")
        serve, url, _ = start_serve(db, tmp, "serve", "--workers", "0", "--tracker", address,
                                    env={"TUNEFARM_TUNER_TOKEN": TUNER_TOKEN})
        procs.append(serve)
        shots = tmp / "screenshots"
        shots.mkdir()
        yield {"url": url, "address": address, "agents": agents, "job_id": job_id, "shots": shots}
    finally:
        for proc in reversed(procs):
            stop(proc)


@pytest.fixture
def page(browser, farm_site):  # noqa: F811 - browser is test_dashboard's fixture
    context = browser.new_context(viewport=DESKTOP)
    context.set_default_timeout(20_000)
    p = context.new_page()
    errors = []
    p.on("pageerror", lambda e: errors.append(str(e)))
    yield p
    context.close()
    assert not errors, errors


@pytest.mark.slow
@pytest.mark.flaky(reruns=2, only_rerun=["AssertionError"])   # a steady host for seconds: see pyproject
def test_the_farm_page_shows_a_degraded_agent_and_its_recovery(farm_site, page):
    address, stuck = farm_site["address"], farm_site["agents"]["stuck-agent"]
    page.goto(farm_site["url"] + "#/farm")
    page.wait_for_selector("main tbody tr[data-key='stuck-agent'] .badge.health-healthy")
    assert "healthy" in page.inner_text("main tbody tr[data-key='steady-agent']")
    with Throttle(lambda: (children(stuck.pid) or [None])[-1], follow=True, stop_s=0.002, run_s=0.002):
        wait_for(lambda: agent_health(address, "stuck-agent") == "degraded", 30, "the stuck agent to be degraded")
        page.wait_for_selector("main tbody tr[data-key='stuck-agent'] .badge.health-degraded")   # live, within a refresh
        row = page.inner_text("main tbody tr[data-key='stuck-agent']")
        assert float(row.split("\t")[3]) < 0.8                          # agent, key, health, speed index
        warning = page.inner_text("main .warning")
        assert "stuck-agent" in warning and "gets no work until a calibration shows it recovered" in warning
        assert page.inner_text(f"main tbody tr[data-key='{KEY}']").split("\t")[2].strip() == "1"    # degraded of the key
        check_page(page, farm_site, "farm-degraded")
    wait_for(lambda: agent_health(address, "stuck-agent") == "healthy", 30, "the stuck agent to recover")
    page.wait_for_selector("main tbody tr[data-key='stuck-agent'] .badge.health-healthy")
    assert page.locator("main .warning").count() == 0


@pytest.mark.slow
def test_a_jobs_page_shows_when_and_why_measurements_were_retaken(farm_site, page):
    page.goto(farm_site["url"] + f"#/jobs/{farm_site['job_id']}")
    page.wait_for_selector("h1 .badge.state-done")
    section = page.locator("main section:has(h2:has-text('Re-taken measurements'))")
    section.locator("tbody tr[data-key]").first.wait_for()
    rows = section.locator("tbody tr[data-key]")
    assert rows.count() == 2
    marked, again = rows.nth(0).inner_text(), rows.nth(1).inner_text()
    assert "marked slow" in marked and "0.38" in marked and "stuck-agent" in marked and "degraded" in marked
    assert "measured again" in again and "0.47" in again and "fresh worker process" in again
    note = section.locator("p").first.inner_text()
    assert "3 measurements were taken again in a fresh worker" in note and "1 is kept but marked slow" in note
    task_row = page.locator("main section:has(h2:has-text('Tasks')) tbody tr").first.inner_text()
    assert task_row.split("\t")[-3:-1] == ["3", "1"]              # re-measured, marked slow
    check_page(page, farm_site, "job-retaken")
