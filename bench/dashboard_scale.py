"""The dashboard at farm scale: how long its records and best pages take to show their rows in a
real browser with a store of `--records` records (1 000 000), against the same pages on a
`--reference` store (10 000) in the same run.

For each store: a fresh PostgreSQL database seeded as bench/service_load.py seeds it (its
JSON-lines file through the store's bulk import: real template-space candidates of matmul
workloads, synthetic costs), `tunefarm serve --workers 0`, a read token. Per page — records newest
first, the records of one workload, that workload's records fastest first, the best of every
task — `--rounds` cold loads, each in a new browser page (Playwright's Python package driving
Debian's chromium, headless; no browser is downloaded): the seconds from navigation until the
page's table has its rows. Prints a table (median and slowest load per page and store) and, last,
one JSON object: per page the big store's median, the reference's, their ratio, and `max_seconds`,
the slowest load of any page at the big store. Aim (issue 37): every page under 1 s at 1 M records.

    .venv/bin/python bench/dashboard_scale.py [--records 1000000] [--reference 10000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from urllib.parse import urlencode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from service_load import PG_SERVER, free_port, seed_records, start_api  # noqa: E402 - the bench's own helpers

CHROMIUM = "/usr/bin/chromium"
ROWS = "main tbody tr[data-key]"


def pages(tasks: list) -> dict[str, str]:
    """The dashboard routes timed: {name: hash route}."""
    key = tasks[len(tasks) // 2][0]
    return {"records": "#/records", "records of a workload": f"#/records?{urlencode({'workload_key': key})}",
            "fastest of a workload": f"#/records?{urlencode({'workload_key': key, 'order': 'fastest'})}",
            "best of every task": "#/best"}


def time_pages(browser, base: str, token: str, routes: dict[str, str], rounds: int) -> dict[str, list[float]]:
    """Cold loads of each route, alternating between routes round by round: {name: [seconds]}."""
    times: dict[str, list[float]] = {name: [] for name in routes}
    for _ in range(rounds):
        for name, route in routes.items():
            context = browser.new_context()            # nothing cached, no token remembered
            page = context.new_page()
            start = time.perf_counter()
            page.goto(f"{base}/?{urlencode({'token': token})}{route}")
            page.wait_for_selector(ROWS, timeout=60_000)
            times[name].append(time.perf_counter() - start)
            context.close()
    return times


def one_store(browser, n_records: int, rounds: int) -> dict[str, list[float]]:
    """Seed a fresh database with `n_records`, serve it, time its pages; the database is dropped."""
    import psycopg

    from tuner.records import open_store
    name = f"tunefarm_dash_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = psycopg.connect(f"{PG_SERVER}/test", autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    api = None
    try:
        store = open_store(url, upgrade=True)
        with tempfile.TemporaryDirectory() as tmp:
            tasks, _, seed_s = seed_records(store, n_records, tmp)
        token, _ = store.tokens.create("dashboard bench", "read")
        store.close()
        print(f"{n_records} records seeded in {seed_s:.0f} s", flush=True)
        port = free_port()
        api = start_api(url, port)
        return time_pages(browser, f"http://127.0.0.1:{port}", token, pages(tasks), rounds)
    finally:
        if api is not None:
            api.terminate()
            api.wait(timeout=60)
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--reference", type=int, default=10_000, help="records of the reference store, timed in the same run")
    ap.add_argument("--rounds", type=int, default=5, help="cold loads of each page per store")
    args = ap.parse_args()
    if not os.path.exists(CHROMIUM):
        raise SystemExit(f"{CHROMIUM} is not installed (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--disable-dev-shm-usage", "--disable-gpu"])
        try:
            ref = one_store(browser, args.reference, args.rounds)
            big = one_store(browser, args.records, args.rounds)
        finally:
            browser.close()

    print(f"\nseconds from navigation to the table's rows, {args.rounds} cold loads each")
    print(f"{'page':24s} {args.reference:>12,} median  {args.records:>12,} median     max   ratio")
    figures = {}
    for name in big:
        r, b = statistics.median(ref[name]), statistics.median(big[name])
        figures[name] = {"seconds": round(b, 3), "reference_seconds": round(r, 3), "ratio": round(b / r, 2),
                         "max_seconds": round(max(big[name]), 3)}
        print(f"{name:24s} {r:19.3f}  {b:19.3f} {max(big[name]):7.3f} {b / r:7.2f}")
    print(json.dumps({"records": args.records, "reference_records": args.reference, "rounds": args.rounds, "pages": figures,
                      "max_seconds": max(f["max_seconds"] for f in figures.values())}))


if __name__ == "__main__":
    main()
