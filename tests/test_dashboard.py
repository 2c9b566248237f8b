"""The web dashboard in a real browser: Playwright's Python package driving Debian's chromium
(headless, /usr/bin/chromium; no browser is ever downloaded) against a real `tunefarm serve` on a
free loopback port, its local worker really tuning, on a SQLite database seeded with 10 000 real
records (template-space candidates of 100 matmuls with synthetic costs, bench/service_load.py's
seed_records) before the server starts.

What a user does: open the URL the server printed (its token is adopted and removed from the
address), submit a job from the form and watch it reach done with its charts drawn, cancel a
running job, compare two jobs, filter, sort and page the records, open a best schedule's loop IR
and export its records, and watch the farm page with a tracker and an agent running. Every page
is checked at 1280×800 and at phone width (390×844): no page-wide horizontal scrolling, every
input labelled, text contrast ≥ 4.5:1, and keyboard use of tables (Tab reaches the first row,
Enter opens it). Screenshots of each page are kept under pytest's tmp_path (their paths are
printed); with TUNEFARM_DOCS_SCREENSHOT=1 the job page's also goes to docs/dashboard-job.png.

Without chromium or the playwright package the browser tests skip with the reason; the checks of
the served files at the top of this file run everywhere.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from serve_process import wait_ready

from tuner.records import open_store
from tuner.service.api import create_app
from tuner.service.dashboard import STATIC

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
SEEDED = 10_000
AGENT_TOKEN, TUNER_TOKEN = "dash-agent-secret", "dash-tuner-secret"
TINY = {"number": 1, "repeat": 2, "min_repeat_ms": 1}
MATMUL_32 = {"M": 32, "N": 32, "K": 32}          # a sketch space with many candidates, each built in a blink


# ----------------------------------------------------------------------------- served files (no browser)

def _imports(js: Path) -> list[Path]:
    return [(js.parent / m).resolve() for m in re.findall(r'^\s*import[^"\']*["\'](\.[^"\']+)["\']', js.read_text(), re.M)]


def test_the_dashboard_is_served_with_its_modules_and_a_strict_policy(tmp_path):
    app = create_app(f"sqlite:///{tmp_path / 'static.db'}")         # not public: the page itself needs no token
    with TestClient(app) as client:
        page = client.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-eval" not in csp and "script-src 'self' 'unsafe-inline'" not in csp
        assert page.headers["x-content-type-options"] == "nosniff"
        html = page.text
        for ref in re.findall(r'(?:src|href)="(/static/[^"]+)"', html):
            r = client.get(ref)
            assert r.status_code == 200, ref
        assert "<script>" not in html                               # no inline script: the policy would block it
        seen, todo = set(), [STATIC / "js" / "main.js"]
        while todo:                                                  # every module main.js imports, transitively
            js = todo.pop()
            if js in seen:
                continue
            seen.add(js)
            r = client.get("/static/" + js.relative_to(STATIC).as_posix())
            assert r.status_code == 200 and "javascript" in r.headers["content-type"], js
            todo += _imports(js)
        assert len(seen) >= 10
        assert client.get("/static/vendor/uPlot.LICENSE").status_code == 200
        assert "1.6.32" in client.get("/static/vendor/uPlot.iife.min.js").text[:200]
        assert client.get("/static/../app.py").status_code == 404
        assert client.get("/static/nope.js").status_code == 404
        assert client.get("/api/v1/jobs").status_code == 401        # the API behind it still needs one


def test_every_static_file_is_package_data():
    """What pyproject.toml installs with the package covers every file of the dashboard."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["tuner.service.dashboard"]
    package = STATIC.parent
    files = [p.relative_to(package).as_posix() for p in STATIC.rglob("*") if p.is_file()]
    assert files and all(any(fnmatch(f, pat) for pat in patterns) for f in files), (files, patterns)
    assert all("*" in pat or (package / pat).exists() for pat in patterns)


# ----------------------------------------------------------------------------- processes

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(cmd: list, log: Path, env: dict | None = None) -> subprocess.Popen:
    """A child in its own process group (stopped with everything it started), output to `log`."""
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def stop(proc: subprocess.Popen, timeout: float = 60) -> None:
    """SIGTERM the process group (tunefarm serve stops its worker), SIGKILL what is left."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=timeout)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


def wait_printed(log: Path, pattern: str, proc: subprocess.Popen, timeout: float = 60) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(pattern, log.read_text(errors="replace"))
        if m:
            return m
        assert proc.poll() is None, f"exited: {log.read_text(errors='replace')}"
        time.sleep(0.1)
    raise AssertionError(f"{pattern!r} not printed in {timeout} s: {log.read_text(errors='replace')}")


def start_serve(db: str, tmp: Path, name: str, *extra: str, env: dict | None = None) -> tuple[subprocess.Popen, str, str]:
    """`tunefarm serve` on a free port: (process, the URL it printed with its token, the token)."""
    port = free_port()
    log = tmp / f"{name}.log"
    proc = spawn([sys.executable, "-m", "tuner.cli", "serve", "--db", db, "--port", str(port), *extra], log, env)
    m = wait_printed(log, r"open (http://\S+/\?token=(tf_\S+))", proc)
    wait_ready(f"http://127.0.0.1:{port}")
    return proc, m.group(1), m.group(2)


def seed_records(store, n: int, n_workloads: int, tmp_dir) -> list:
    """bench/service_load.py's seeding (real template candidates of matmuls, synthetic costs,
    loaded by the store's bulk import): [(workload key, target)]."""
    spec = importlib.util.spec_from_file_location("service_load", ROOT / "bench" / "service_load.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.seed_records(store, n, str(tmp_dir), n_workloads)[0]


# ----------------------------------------------------------------------------- the browser

@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed (pip install -e '.[test]')")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install -y chromium)")
    pw = sync_api.sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--disable-dev-shm-usage", "--disable-gpu"])
    except Exception as e:  # noqa: BLE001 - a chromium that cannot start here is a skip, not a failure
        pw.stop()
        pytest.skip(f"{CHROMIUM} does not start: {e}")
    try:
        yield b
    finally:   # a Playwright left running refuses the next one in this process ("Sync API inside the asyncio loop")
        try:
            b.close()
        finally:
            pw.stop()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A seeded database and `tunefarm serve` (API + 1 local worker) on it."""
    tmp = tmp_path_factory.mktemp("dashboard")
    db = f"sqlite:///{tmp / 'records.db'}"
    t0 = time.monotonic()
    with open_store(db) as store:
        tasks = seed_records(store, SEEDED, 100, tmp)
        read_token = store.tokens.create("dashboard read-only", "read")[0]
        assert store.count() >= SEEDED
    print(f"seeded {SEEDED} records in {time.monotonic() - t0:.1f} s")
    proc, url, token = start_serve(db, tmp, "serve", "--workers", "1")
    base = url.split("/?")[0]
    api = httpx.Client(base_url=f"{base}/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    # two small jobs for the compare page, queued now: the worker runs them while other tests look around
    compare_ids = [api.post("/jobs", json={"name": f"compare-{s}", "workloads": [{"op": "matmul", "params": MATMUL_32}],
                                           "trials": 6, "batch_size": 3, "top_k": 1, "strategy": s, "seed": 1, "measure": TINY})
                   .json()["id"] for s in ("random", "evolutionary")]
    shots = tmp / "screenshots"
    shots.mkdir()
    yield {"url": url, "base": base, "token": token, "read_token": read_token, "api": api, "tasks": tasks, "db": db,
           "compare_ids": compare_ids, "shots": shots, "tmp": tmp}
    api.close()
    stop(proc)


@pytest.fixture
def page(browser, site):
    """A fresh tab with the server's token adopted from the printed URL, at 1280×800."""
    context = browser.new_context(viewport=DESKTOP)
    context.set_default_timeout(15_000)
    p = context.new_page()
    errors = []
    p.on("pageerror", lambda e: errors.append(str(e)))
    p.goto(site["url"] + "#/jobs")
    p.wait_for_selector("h1:has-text('Jobs')")
    yield p
    context.close()
    assert not errors, errors                   # no uncaught exception in the page


def wait_job(api: httpx.Client, job_id: int, states=("done",), timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = api.get(f"/jobs/{job_id}").json()
        if job["state"] in states:
            return job
        assert job["state"] not in ("failed", "cancelled") or job["state"] in states, job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} did not reach {states} in {timeout} s")


# ----------------------------------------------------------------------------- checks every page gets

LABELS_JS = """() => [...document.querySelectorAll('input, select, textarea')]
  .filter(el => el.type !== 'hidden' && !(el.labels && el.labels.length) && !el.getAttribute('aria-label')
                && !el.getAttribute('aria-labelledby'))
  .map(el => el.outerHTML.slice(0, 160))"""

CONTRAST_JS = """() => {
  const rgba = s => { const p = s.match(/[\\d.]+/g).map(Number); return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; };
  const background = el => {
    for (let e = el; e; e = e.parentElement) { const c = rgba(getComputedStyle(e).backgroundColor); if (c[3] > 0.5) return c; }
    return [255, 255, 255, 1];
  };
  const lum = c => { const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
                      return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]); };
  const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
  const out = {checked: 0, worst: 99, failures: []};
  const els = [document.body, ...document.querySelectorAll(
    'main p, main td, main th, main dt, main dd, main label, main a, main button, main span, main h1, main h2, ' +
    'main summary, main caption, header a, .muted, .badge, pre')];
  for (const el of els.slice(0, 600)) {
    const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    const r = el.getBoundingClientRect();
    if (!own || r.width === 0 || r.height === 0 || getComputedStyle(el).visibility === 'hidden') continue;
    if (el.closest('.visually-hidden, .uplot')) continue;
    const v = ratio(rgba(getComputedStyle(el).color), background(el));
    out.checked += 1; out.worst = Math.min(out.worst, v);
    if (v < 4.5) out.failures.push(`${el.tagName}.${el.className}: ${el.textContent.trim().slice(0, 30)} ${v.toFixed(2)}`);
  }
  return out;
}"""


def check_page(page, site, name: str, table: bool = True) -> None:
    """Labels, contrast, no page-wide horizontal scroll at phone width; screenshots at both widths."""
    assert page.evaluate(LABELS_JS) == [], f"{name}: unlabelled inputs"
    contrast = page.evaluate(CONTRAST_JS)
    assert contrast["checked"] > 5 and not contrast["failures"], (name, contrast)
    if table:
        td = page.locator("main tbody td").first
        assert td.is_visible()
    for size, tag in ((DESKTOP, "1280x800"), (PHONE, "390x844")):
        page.set_viewport_size(size)
        page.wait_for_timeout(250)                       # charts follow their container's width
        overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
        if overflow > 1:
            wide = page.evaluate("""() => [...document.querySelectorAll('body, body *')]
                .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1 || e.scrollWidth > window.innerWidth + 1)
                .slice(0, 8).map(e => `${e.tagName}.${e.className} right=${Math.round(e.getBoundingClientRect().right)}`
                                      + ` scrollWidth=${e.scrollWidth}`)""")
            raise AssertionError(f"{name} at {tag}: the page scrolls sideways by {overflow} px: {wide}")
        path = site["shots"] / f"{name}-{tag}.png"
        page.screenshot(path=str(path), full_page=True)
        print(f"screenshot: {path}")
    page.set_viewport_size(DESKTOP)


def wait_rows(page, ids: list[int]) -> None:
    """Wait until the table shows exactly these rows, in this order."""
    page.wait_for_function("(ids) => JSON.stringify([...document.querySelectorAll('main tbody tr[data-key]')]"
                           ".map(r => Number(r.dataset.key))) === JSON.stringify(ids)", arg=ids)


def tab_to_first_row(page, limit: int = 60) -> str:
    """Press Tab from the top until a table row has the focus; returns its data-key."""
    page.evaluate("() => { document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0); }")
    page.locator("body").focus()
    for _ in range(limit):
        page.keyboard.press("Tab")
        if page.evaluate("() => document.activeElement.tagName") == "TR":
            return page.evaluate("() => document.activeElement.dataset.key")
    raise AssertionError("Tab never reached a table row")


# ----------------------------------------------------------------------------- the pages

@pytest.mark.slow
def test_token_from_the_printed_url_and_the_token_form(browser, site, page):
    assert "token=" not in page.url and page.url.endswith("#/jobs")               # removed from the address bar
    assert page.evaluate("() => sessionStorage.getItem('tunefarm.token')") == site["token"]
    auth = []
    page.on("request", lambda r: auth.append(r.headers.get("authorization")) if "/api/v1/" in r.url else None)
    page.goto(site["base"] + "/#/farm")
    page.wait_for_selector("main tbody tr")
    assert auth and all(a == f"Bearer {site['token']}" for a in auth)

    context = browser.new_context(viewport=PHONE)                                  # a tab without a token
    try:
        bare = context.new_page()
        bare.goto(site["base"] + "/#/records")
        bare.get_by_label("API token", exact=True).fill(site["read_token"])
        assert "needs an API token" in bare.inner_text("main [role=alert]")
        check_page(bare, site, "token-form", table=False)
        bare.get_by_role("button", name="Use this token").click()
        bare.wait_for_selector("main tbody tr[data-key]")

        # a read token cannot write: the API's reason is shown next to the form
        bare.goto(site["base"] + "/#/jobs")
        bare.get_by_text("Submit a job").click()
        bare.get_by_role("button", name="Submit job", exact=True).click()
        alert = bare.locator("form[aria-label='Submit a job'] .error")
        alert.wait_for()
        assert "scope 'read'" in alert.inner_text() and "submit" in alert.inner_text()
    finally:
        context.close()


@pytest.mark.slow
def test_submit_a_job_in_the_form_and_watch_it_converge(site, page):
    page.get_by_text("Submit a job").click()
    page.get_by_label("Operator", exact=True).fill("no_such_op")
    page.get_by_role("button", name="Submit job", exact=True).click()
    alert = page.locator("form[aria-label='Submit a job'] .error")
    alert.wait_for()
    assert "unknown operator" in alert.inner_text() and "workloads.0" in alert.inner_text()
    assert page.get_by_label("Operator", exact=True).get_attribute("aria-invalid") == "true"

    page.get_by_label("Operator", exact=True).fill("matmul")
    page.get_by_label("Parameters", exact=True).fill("M=48, N=48, K=48")
    page.get_by_label("Job name", exact=True).fill("from the form")
    page.get_by_label("Trials", exact=True).fill("8")
    page.get_by_label("Batch size", exact=True).fill("2")                       # four batches: points along the time axis
    page.get_by_label("Strategy", exact=True).select_option("random")
    check_page(page, site, "jobs")
    page.get_by_role("button", name="Submit job", exact=True).click()
    page.wait_for_url(re.compile(r"#/jobs/\d+$"))
    job_id = int(page.url.rsplit("/", 1)[1])
    page.wait_for_selector("h1 .badge.state-done", timeout=150_000)
    job = site["api"].get(f"/jobs/{job_id}").json()
    assert job["state"] == "done" and job["trials_done"] == 8 and job["name"] == "from the form"
    assert job["tasks"][0]["batches"] == 4 and job["tasks"][0]["trials"] == 8
    # the charts were drawn from the measurements (canvas and legend), and say what they show
    page.wait_for_function("() => document.querySelectorAll('figure.chart canvas').length >= 2")
    page.wait_for_function("() => document.querySelector('.chart-summary').textContent.includes('after 8 trials')")
    legend = page.inner_text("figure.chart .u-legend")
    assert "best" in legend and "measured" in legend
    drawn = page.evaluate("""() => { const c = document.querySelector('figure.chart canvas');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let ink = 0; for (let i = 0; i < d.length; i += 4) if (d[i + 3] > 0 && (d[i] < 200 || d[i + 1] < 200)) ink++; return ink; }""")
    assert drawn > 500, drawn
    assert page.locator("main section:has(h2:has-text('Events')) tbody tr").count() >= 3     # submitted, claimed, done
    assert "GFLOPS" in page.inner_text("main section:has(h2:has-text('Tasks'))")
    check_page(page, site, "job")
    page.screenshot(path=str(site["shots"] / "job-viewport.png"))
    if os.environ.get("TUNEFARM_DOCS_SCREENSHOT"):
        shutil.copy(site["shots"] / "job-viewport.png", ROOT / "docs" / "dashboard-job.png")


@pytest.mark.slow
def test_compare_two_jobs(site, page):
    a, b = site["compare_ids"]
    for job_id in (a, b):
        wait_job(site["api"], job_id)
    page.goto(f"{site['base']}/#/compare?ids={a},{b}")
    page.wait_for_function("() => document.querySelectorAll('figure.chart canvas').length >= 2")
    legend = page.inner_text("figure.chart .u-legend")
    assert f"job {a} (random)" in legend and f"job {b} (evolutionary)" in legend
    assert page.locator("main tbody tr[data-key]").count() == 2
    check_page(page, site, "compare")


@pytest.mark.slow
def test_cancel_a_running_job(site, page):
    api = site["api"]
    job_id = api.post("/jobs", json={"name": "long", "workloads": [{"op": "matmul", "params": {"M": 56, "N": 56, "K": 56}}],
                                     "trials": 5000, "batch_size": 4, "strategy": "random", "measure": TINY}).json()["id"]
    page.goto(f"{site['base']}/#/jobs/{job_id}")
    page.wait_for_selector("h1 .badge.state-running", timeout=120_000)
    page.wait_for_function("() => document.querySelectorAll('figure.chart canvas').length >= 2")
    page.get_by_role("button", name=f"Cancel job {job_id}", exact=True).click()
    page.wait_for_selector("h1 .badge.state-cancelled")
    assert api.get(f"/jobs/{job_id}").json()["state"] == "cancelled"
    assert page.get_by_role("button", name=f"Resume job {job_id}", exact=True).is_visible()
    page.goto(f"{site['base']}/#/jobs?state=cancelled")
    page.wait_for_selector(f"main tbody tr[data-key='{job_id}']")
    assert page.locator("main tbody tr[data-key]").count() == 1
    key = tab_to_first_row(page)
    assert key == str(job_id)
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(rf"#/jobs/{job_id}$"))


@pytest.mark.slow
def test_records_first_paint_filter_sort_page_and_open(site, page):
    start = time.monotonic()
    page.goto(f"{site['base']}/#/records")
    page.reload()                                       # a cold load of the page, straight onto the records
    page.wait_for_selector("main tbody tr[data-key]")
    wall = time.monotonic() - start
    painted = page.evaluate("() => performance.getEntriesByName('tunefarm:records-rows')[0].startTime")
    print(f"records page at {SEEDED} records: rows painted {painted:.0f} ms after navigation ({wall:.2f} s wall)")
    assert painted < 1000
    assert page.locator("main tbody tr[data-key]").count() == 50
    check_page(page, site, "records")

    key, _ = site["tasks"][7]
    api = site["api"]
    page.get_by_label("Workload key", exact=True).fill(key)
    page.get_by_label("Error", exact=True).select_option("0")
    page.get_by_role("button", name="Apply", exact=True).click()
    page.wait_for_url(re.compile(f"workload_key={key}"))
    first = api.get("/records", params={"workload_key": key, "error_code": 0, "limit": 50}).json()
    wait_rows(page, [r["id"] for r in first["items"]])
    assert set(page.locator("main tbody tr td:nth-child(8)").all_inner_texts()) == {"—"}          # the Error column
    page.get_by_role("button", name="Next →").click()
    second = api.get("/records", params={"workload_key": key, "error_code": 0, "limit": 50, "before": first["next_before"]}).json()
    assert second["items"]
    wait_rows(page, [r["id"] for r in second["items"]])
    page.get_by_role("button", name="← Previous").click()
    wait_rows(page, [r["id"] for r in first["items"]])

    page.get_by_role("button", name=re.compile("Mean time")).click()            # fastest first, over the whole workload
    page.wait_for_url(re.compile("order=fastest"))
    fastest = api.get("/records", params={"workload_key": key, "error_code": 0, "order": "fastest", "limit": 50}).json()["items"]
    assert [r["result"]["mean_cost"] for r in fastest] == sorted(r["result"]["mean_cost"] for r in fastest)
    wait_rows(page, [r["id"] for r in fastest])
    assert page.locator("th[aria-sort=ascending]").inner_text().startswith("Mean time")

    opened = tab_to_first_row(page)                                             # keyboard: Tab to the table, Enter opens
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(rf"#/records/{opened}$"))
    page.wait_for_function("() => document.querySelector('pre[aria-label=\"Loop IR\"]')?.textContent.startsWith('func main(')")
    assert "Candidate" in page.inner_text("main") and "Measured by" in page.inner_text("main")
    check_page(page, site, "record", table=False)


@pytest.mark.slow
def test_best_schedules_loop_ir_and_export(site, page):
    page.goto(f"{site['base']}/#/best")
    page.wait_for_selector("main tbody tr[data-key]")
    assert page.locator("main tbody tr[data-key]").count() == 50 and page.get_by_role("button", name="Next →").is_enabled()
    first = page.locator("main tbody tr[data-key]").first
    assert "×" in first.inner_text() and re.search(r"\d", first.locator("td").nth(3).inner_text())   # GFLOPS, speed-up
    first.get_by_role("button", name=re.compile("Loop IR")).click()
    page.wait_for_function("() => (document.querySelector('pre.loop-ir') || {}).textContent?.includes('for (')")
    assert page.evaluate("() => document.activeElement.id") == "ir-heading"
    with page.expect_download() as got:
        first.get_by_role("link", name=re.compile("Export")).click()
    path = got.value.path()
    lines = Path(path).read_text().splitlines()
    assert lines and all(json.loads(line)["workload_key"] for line in lines[:5])
    check_page(page, site, "best")


@pytest.mark.slow
def test_farm_page_with_a_tracker_and_an_agent(browser, site, tmp_path):
    port = free_port()
    tracker = spawn([sys.executable, "-m", "tuner.cli", "tracker", "--host", "127.0.0.1", "--port", str(port),
                     "--agent-token", AGENT_TOKEN, "--tuner-token", TUNER_TOKEN, "--heartbeat", "0.7"], tmp_path / "tracker.log")
    agent = serve = None
    try:
        agent = spawn([sys.executable, "-m", "tuner.cli", "agent", "--tracker", f"127.0.0.1:{port}", "--key", "dash-test",
                       "--name", "agent-dash", "--slots", "2"], tmp_path / "agent.log", {"TUNEFARM_AGENT_TOKEN": AGENT_TOKEN})
        serve, url, _ = start_serve(f"sqlite:///{tmp_path / 'farm.db'}", tmp_path, "serve-farm", "--workers", "0",
                                    "--tracker", f"127.0.0.1:{port}", env={"TUNEFARM_TUNER_TOKEN": TUNER_TOKEN})
        context = browser.new_context(viewport=DESKTOP)
        try:
            p = context.new_page()
            p.goto(url + "#/farm")
            p.wait_for_selector("main tbody tr[data-key='agent-dash']", timeout=60_000)
            assert "Live from the tracker" in p.inner_text("main")
            row = p.locator("main tbody tr[data-key='agent-dash']").inner_text()
            assert "dash-test" in row and "0 %" in row and "s ago" in row
            assert p.locator("main tbody tr[data-key='dash-test']").count() == 1
            before = p.inner_text("main tbody tr[data-key='agent-dash']")
            # live: "last seen" moves between refreshes (every 2 s; the heartbeat, 0.7 s, does not divide it)
            p.wait_for_function("(b) => document.querySelector(\"tr[data-key='agent-dash']\").innerText !== b", arg=before)   # live
            check_page(p, site, "farm")
        finally:
            context.close()
    finally:
        for proc in (serve, agent, tracker):
            if proc is not None:
                stop(proc)
