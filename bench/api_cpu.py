"""What one request of each hot read route costs the API: CPU milliseconds per request.

bench/service_load.py says how many requests/s the service holds; this says where they go. Set-up
as there (a fresh PostgreSQL database on 127.0.0.1, seeded through the bulk import with
`--records` records, dropped at the end), then `tunefarm serve --api-processes 1 --workers 0`
and, route by route, `--clients` closed-loop clients sending only that route for `--seconds`:
the API process's CPU and PostgreSQL's (every `postgres` process on the machine) divided by the
requests served. Same requests as service_load's mix (records pages: filtered by workload,
deep `before` cursors, the newest). Run it on a quiet machine: the figures are CPU time, not
latency, but a busy host still slows the caches they run in.

The reference in the same run is `healthz`, the cheapest route (no store, no token): what the
framework and the HTTP layer cost a request by themselves.

    .venv/bin/python bench/api_cpu.py [--records 100000] [--seconds 8] [--clients 16]

Last line: one JSON object, {route: {"api_ms": ..., "postgres_ms": ..., "rps": ...}, ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import tempfile
import time

import service_load as sl

ROUTES = ("healthz", "job", "records", "best", "submit")


async def one_route(port: int, token: str, load: sl.Load, route: str, clients: int, seconds: float) -> int:
    """`clients` closed-loop clients sending `route` for `seconds`; the requests served."""
    deadline = time.perf_counter() + seconds

    async def client(n: int):
        rng = random.Random(n)
        conn = sl.Conn("127.0.0.1", port, token)
        try:
            while time.perf_counter() < deadline:
                if route == "healthz":
                    await load.request(conn, route, "GET", "/healthz")
                else:
                    await load.one(conn, rng, route)
        finally:
            conn.close()

    await asyncio.gather(*(client(n) for n in range(clients)))
    return len(load.lat.get(route, []))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--routes", nargs="+", choices=ROUTES, default=list(ROUTES))
    args = ap.parse_args()


    from tuner.records import open_store

    with sl.scratch_database("tunefarm_apicpu") as url:
        store = open_store(url, upgrade=True)
        with tempfile.TemporaryDirectory() as tmp:
            tasks, _, seed_s = sl.seed_records(store, args.records, tmp)
        token, _ = store.tokens.create("apicpu", "submit")
        print(f"seeded {store.count()} records over {len(tasks)} workloads in {seed_s:.1f} s", flush=True)
        port = sl.free_port()
        api = sl.start_api(url, port, "--api-processes", "1")   # one process: its CPU is one pid's
        try:
            rows = measure_routes(args, port, token, tasks, api)
        finally:
            sl.stop_process(api, timeout=30)
            store.close()
        print(json.dumps({"records": args.records, "clients": args.clients, "seconds": args.seconds, "routes": rows}))


def measure_routes(args, port: int, token: str, tasks: list, api: subprocess.Popen) -> dict:
    """Warm every route, then time each alone; {route: figures}."""
    import httpx
    base = f"http://127.0.0.1:{port}{sl.API}"
    auth = {"Authorization": f"Bearer {token}"}
    load = sl.Load(tasks, [])
    load.oldest_record = httpx.get(f"{base}/records", params={"limit": 1}, headers=auth).json()["items"][0]["id"]
    for i in range(4):   # jobs to poll (queued: no workers run them)
        load.job_ids.append(httpx.post(f"{base}/jobs", json=sl.small_job(i), headers=auth).json()["id"])
    # every route warmed first (imports, caches, prepared statements)
    for route in args.routes:
        asyncio.run(one_route(port, token, sl.Load(tasks, load.job_ids), route, args.clients, 1.0))
    rows = {}
    print(f"\n{args.clients} closed-loop clients per route for {args.seconds:g} s, one API process")
    print(f"{'route':<10}{'rps':>8}{'API ms/req':>12}{'PostgreSQL ms/req':>19}")
    for route in args.routes:
        run = sl.Load(tasks, load.job_ids)
        run.oldest_record = load.oldest_record
        api0, pg0, t0 = sl.tree_cpu_seconds(api.pid), sl.postgres_cpu_seconds(), time.perf_counter()
        served = asyncio.run(one_route(port, token, run, route, args.clients, args.seconds))
        elapsed = time.perf_counter() - t0
        api_s, pg_s = sl.tree_cpu_seconds(api.pid) - api0, sl.postgres_cpu_seconds() - pg0
        errors = sum(run.errors.values())
        rows[route] = {"api_ms": round(1e3 * api_s / served, 3), "postgres_ms": round(1e3 * pg_s / served, 3),
                       "rps": round(served / elapsed, 1), "errors": errors}
        r = rows[route]
        print(f"{route:<10}{r['rps']:>8}{r['api_ms']:>12}{r['postgres_ms']:>19}" + (f"  {errors} errors" if errors else ""),
              flush=True)
    return rows

if __name__ == "__main__":
    main()
