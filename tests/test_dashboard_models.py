"""A model job in the web dashboard, in headless chromium (Playwright, /usr/bin/chromium, as
test_dashboard.py): an ONNX model uploaded to a real `tunefarm serve` whose local worker tunes
it; the job page shows the model, the estimated end-to-end latency curve (drawn from the job's
"estimate" events), the scheduler's allocation of trials per task and the tasks table. Checked
at desktop and phone width (labels, contrast, no sideways scrolling); screenshots are kept under
pytest's tmp_path (their paths are printed)."""

from __future__ import annotations

import httpx
import pytest
from test_dashboard import DESKTOP, browser, check_page, start_serve, stop, wait_job  # noqa: F401 - browser is a fixture
from test_graph_models import mlp


@pytest.fixture(scope="module")
def model_site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dashboard_models")
    db = f"sqlite:///{tmp / 'records.db'}"
    proc, url, token = start_serve(db, tmp, "serve", "--workers", "1")
    base = url.split("/?")[0]
    api = httpx.Client(base_url=f"{base}/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=60)
    shots = tmp / "screenshots"
    shots.mkdir()
    yield {"url": url, "base": base, "api": api, "shots": shots}
    api.close()
    stop(proc)


@pytest.mark.slow
def test_a_model_job_page_shows_tasks_allocation_and_latency_curve(browser, model_site):  # noqa: F811
    m, _ = mlp(batch=4, sizes=(24, 16, 16, 10))
    r = model_site["api"].post("/jobs/model", content=m.SerializeToString(),
                               params={"trials": 12, "batch_size": 3, "top_k": 1, "file_name": "mlp.onnx"},
                               headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    job = wait_job(model_site["api"], job_id, timeout=300)
    assert job["model"]["curve"] and job["model"]["curve"][-1]["final"]

    context = browser.new_context(viewport=DESKTOP)
    context.set_default_timeout(15_000)
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(model_site["url"] + f"#/jobs/{job_id}")
        page.wait_for_selector("h1 .badge.state-done")
        section = page.locator("main section:has(h2:has-text('Model'))")
        section.wait_for()
        facts = section.locator("dl.facts").inner_text()
        assert "mlp.onnx" in facts and "Estimated latency" in facts and "Default schedules" in facts
        # the latency curve: a canvas with ink, its legend and a summary naming the final estimate
        page.wait_for_function("() => [...document.querySelectorAll('figure.chart figcaption')]"
                               ".some(c => c.textContent.includes('Estimated end-to-end latency'))")
        chart = section.locator("figure.chart")
        assert "estimated latency" in chart.locator(".u-legend").inner_text()
        summary = chart.locator(".chart-summary").inner_text()
        assert "Final (re-measured)" in summary
        # the speed-up quoted is the API's: over the default schedules timed beside the final estimate
        assert f"({job['model']['speedup']:.2f}×)" in summary and "default schedules" in summary
        ink = page.evaluate("""() => { const fig = [...document.querySelectorAll('figure.chart')]
              .find(f => f.querySelector('figcaption').textContent.includes('latency'));
            const c = fig.querySelector('canvas');
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let ink = 0; for (let i = 0; i < d.length; i += 4) if (d[i + 3] > 0 && (d[i] < 200 || d[i + 1] < 200)) ink++; return ink; }""")
        assert ink > 300, ink
        # the allocation: a row per task with its trials, summing to the job's
        rows = section.locator("table.allocation tbody tr")
        assert rows.count() == len(job["tasks"]) == 4
        trials = [int(rows.nth(i).locator("td").nth(2).inner_text()) for i in range(rows.count())]
        assert trials == [a["trials"] for a in job["model"]["allocation"]] and sum(trials) == 12
        assert "fused_gemm_relu" in rows.first.inner_text()
        tasks = page.locator("main section:has(h2:has-text('Tasks')) tbody tr")
        assert tasks.count() == 4
        check_page(page, model_site, "model-job")
        page.screenshot(path=str(model_site["shots"] / "model-job-viewport.png"))
    finally:
        context.close()
    assert not errors, errors
