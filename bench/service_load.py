"""The tuning service under load: the API on PostgreSQL with 2 job workers, 32 concurrent clients.

Set-up, all on 127.0.0.1: a fresh PostgreSQL database (dropped at the end) upgraded with
`tunefarm db upgrade`'s code, seeded with `--records` records (default 10 000) over 100 matmul
workloads or more (8000 records each at most): candidates drawn from the real template space of
each (so /best lowers real loop IR), with synthetic costs — this measures the service, not
kernels. The records are written to a JSON-lines file first and loaded by the store's bulk
import, what `tunefarm records import` runs (its time: `seed_seconds`). Then `tunefarm serve
--workers 0` (its API processes: one per core on PostgreSQL, their CPU reported together) and two
`tunefarm worker` processes.

Phase 1 (the reference, same run): one client, each read route 50 times in turn: unloaded latency.
Phase 2, the load: 32 clients for `--seconds` (30) mixing submits of small real jobs (5 %), job
polls (35 %), record pages (35 %, filtered and deep keyset cursors) and best queries (25 %), each
client sending at its own steady pace so that together they offer `--rate` requests/s (64: two a
second per client; the dashboard's job page polls three routes every 2 s, `tunefarm jobs watch`
one a second). This is an open-loop load: a request's latency counts from when it was due, so a
server that falls behind is charged for the queue it builds (no coordinated omission). The two
job workers run the submitted jobs (builds, measurements, records) on the same two cores as the
API and PostgreSQL, at `--worker-nice` 19, the priority `tunefarm serve` gives its own local
workers (0: as high as the API). Half-way through, one worker is SIGKILLed as soon as it holds a
job. Afterwards every submitted job must finish (the killed worker's job is claimed again when its
lease expires). The drain waits as long as jobs keep finishing (it ends `--drain-timeout` seconds
after the last one finished). Jobs lost (acknowledged, then missing, failed or cancelled), late
(still queued or running when the drain ended: unfinished, not lost) and duplicated (a job with
more search records than its trials, or ended twice) must be 0; the JSON also gives the jobs
finished per second per surviving worker.
Phase 3, saturation: the same clients for `--saturation-seconds` (15) with no pause at all
(closed loop): the most requests/s the API serves here. Its latency is clients / throughput by
construction (32 requests always queued), so it says how much headroom phase 2 had, not how fast
a request is.

The clients speak HTTP/1.1 on keep-alive sockets themselves (a few lines of asyncio): a general
client library spent 2-3 ms of CPU per request, as much as the server, on the same two cores.

Prints a table per route (requests, rps, p50, p99, unloaded p50, errors) for the load and one
for saturation, and, last, one JSON object. Aim: p99 < 100 ms for the read routes at 10 000
records on this 2-core machine (phase 2).

    .venv/bin/python bench/service_load.py [--records 10000] [--seconds 30] [--clients 32] [--rate 64]
                                           [--worker-nice 19] [--saturation-seconds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from urllib.parse import urlencode

PG_SERVER = "postgresql://postgres@127.0.0.1:5432"
LEASE_S = 5
READ_ROUTES = ("job", "records", "best")
API = "/api/v1"


@contextlib.contextmanager
def scratch_database(prefix: str):
    """A fresh PostgreSQL database on 127.0.0.1 for one bench run: yields its SQLAlchemy URL and
    drops it (with whatever still connects to it) on the way out."""
    import psycopg
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = psycopg.connect(f"{PG_SERVER}/test", autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def stop_process(proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """SIGTERM (a server finishes its requests), then SIGKILL if it is still there after `timeout`."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SPACE_PER_WORKLOAD = 8000   # records per seeded workload at most (each template space holds 8640 configs)


def write_seed_file(path: str, n_records: int, n_workloads: int = 100) -> list:
    """JSON lines of `n_records` records (as `tunefarm records export` writes them) over at least
    `n_workloads` matmul workloads, as many more as keep each under SPACE_PER_WORKLOAD: per
    workload its default schedule and distinct candidates of its real template space (so /best
    lowers real loop IR), with synthetic costs (3 % runtime errors). Returns [(workload key,
    target)] of the seeded tasks."""
    import numpy as np

    from compiler.target import Target
    from tuner.candidate import MeasureResult
    from tuner.records.codec import to_line
    from tuner.records.values import Record
    from tuner.space.base import default_candidate
    from tuner.space.template import TemplateSpace
    from tuner.workload import Workload

    target = str(Target.host())
    rng = np.random.default_rng(0)
    n_workloads = max(n_workloads, -(-n_records // SPACE_PER_WORKLOAD))
    per = max(1, -(-n_records // n_workloads))
    tasks, written = [], 0
    with open(path, "w") as f:
        for i in range(n_workloads):
            count = min(per, n_records - written)
            if count <= 0:
                break
            size = 64 + 16 * i
            workload = Workload("matmul", {"M": size, "N": size, "K": 64})
            opdef = workload.opdef()
            key = opdef.workload_key()
            space = TemplateSpace(opdef, None, Target.host())
            picks = rng.permutation(len(space))[:count - 1] if count > 1 else []
            cands = [default_candidate(key)] + [space.get(int(k)) for k in picks]
            for cand in cands:
                if rng.random() < 0.03:
                    result = MeasureResult(costs=[], error_code=4, error_msg="RUNTIME_ERROR (seeded)")
                else:
                    cost = opdef.flops / float(rng.uniform(5, 150)) / 1e9
                    result = MeasureResult(costs=[cost, cost * 1.02], build_seconds=0.1, run_seconds=0.01)
                f.write(to_line(Record(key, workload, target, "local", cand, result)) + "\n")
            written += len(cands)
            tasks.append((key, target))
    return tasks


def seed_records(store, n_records: int, tmp_dir: str, n_workloads: int = 100) -> tuple[list, float, float]:
    """Seed the store through its bulk import (what `tunefarm records import` runs) from a file
    write_seed_file made: ([(workload key, target)], seconds to write the file, seconds to import it)."""
    path = os.path.join(tmp_dir, "seed.jsonl")
    t0 = time.perf_counter()
    tasks = write_seed_file(path, n_records, n_workloads)
    t1 = time.perf_counter()
    with open(path) as f:
        store.import_jsonl(f)
    return tasks, t1 - t0, time.perf_counter() - t1


def start_api(url: str, port: int, *serve_args: str) -> subprocess.Popen:
    """`tunefarm serve --workers 0` (and `serve_args`) on `url`, once it answers /readyz."""
    import httpx
    proc = subprocess.Popen([sys.executable, "-m", "tuner.cli", "serve", "--db", url, "--port", str(port),
                             "--workers", "0", "--no-session-token", *serve_args], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("tunefarm serve did not start")


def start_worker(url: str, name: str, nice: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tuner.cli", "worker", "--db", url, "--name", name, "--lease", str(LEASE_S), "--poll", "0.5"]
    return subprocess.Popen(cmd + (["--nice", str(nice)] if nice else []), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class HTTPError(Exception):
    pass


class Conn:
    """One keep-alive HTTP/1.1 connection to the API: enough of the protocol for this bench
    (uvicorn answers with Content-Length). Reconnects after the server closed it."""

    def __init__(self, host: str, port: int, token: str):
        self.host, self.port, self.token = host, port, token
        self.reader = self.writer = None

    async def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else b""
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Authorization: Bearer {self.token}\r\nContent-Length: {len(data)}\r\n"
                + ("Content-Type: application/json\r\n" if body is not None else "") + "\r\n").encode()
        for attempt in (0, 1):
            if self.writer is None:
                self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            try:
                self.writer.write(head + data)
                status_line = await self.reader.readline()
                if not status_line:
                    raise ConnectionResetError("closed")
                length, close = 0, False
                while (line := await self.reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode("latin-1").partition(":")
                    name = name.strip().lower()
                    if name == "content-length":
                        length = int(value)
                    elif name == "connection" and value.strip().lower() == "close":
                        close = True
                payload = await self.reader.readexactly(length)
                if close:
                    self.close()
                return int(status_line.split()[1]), payload
            except (ConnectionError, asyncio.IncompleteReadError):
                self.close()
                if attempt:
                    raise
        raise HTTPError("unreachable")

    def close(self):
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def small_job(i: int) -> dict:
    return {"name": f"load-{i}", "workloads": [{"op": "relu", "params": {"shape": [1000 + i]}}], "trials": 2,
            "batch_size": 2, "top_k": 1, "strategy": "random",
            "measure": {"number": 1, "repeat": 1, "min_repeat_ms": 0}}


class Load:
    """The clients' shared state: latencies per route, errors, submitted jobs."""

    def __init__(self, tasks, job_ids):
        self.tasks, self.job_ids = tasks, list(job_ids)
        self.lat: dict[str, list[float]] = {}
        self.errors: dict[str, int] = {}
        self.submitted: list[int] = []
        self.next_job = 0
        self.oldest_record = None

    async def request(self, conn: Conn, route: str, method: str, path: str, body=None, due: float | None = None):
        """One request; its latency counts from `due` (when an open-loop client meant to send it)."""
        t0 = time.perf_counter() if due is None else due
        try:
            status, payload = await conn.request(method, path, body)
            ok = status < 400
        except Exception:  # noqa: BLE001 - a refused or dropped request is an error of this route
            payload, ok = b"", False
        self.lat.setdefault(route, []).append(time.perf_counter() - t0)
        if not ok:
            self.errors[route] = self.errors.get(route, 0) + 1
        return json.loads(payload) if ok else None

    async def one(self, conn: Conn, rng: random.Random, route: str, due: float | None = None):
        if route == "submit":
            i = self.next_job
            self.next_job += 1
            got = await self.request(conn, route, "POST", f"{API}/jobs", small_job(i), due)
            if got is not None:
                self.submitted.append(got["id"])
                self.job_ids.append(got["id"])
        elif route == "job":
            if self.job_ids:
                await self.request(conn, route, "GET", f"{API}/jobs/{rng.choice(self.job_ids)}", due=due)
        elif route == "records":
            params: dict = {"limit": 50}
            pick = rng.random()
            if pick < 0.4:
                params["workload_key"] = rng.choice(self.tasks)[0]
            elif pick < 0.7 and self.oldest_record:
                params["before"] = rng.randint(1, self.oldest_record)      # a deep page
            await self.request(conn, route, "GET", f"{API}/records?{urlencode(params)}", due=due)
        elif route == "best":
            key, target = rng.choice(self.tasks)
            await self.request(conn, route, "GET", f"{API}/best?{urlencode({'workload_key': key, 'target': target})}",
                               due=due)


MIX = [("submit", 0.05), ("job", 0.35), ("records", 0.35), ("best", 0.25)]


async def run_clients(port: int, token: str, load: Load, clients: int, seconds: float, rate: float | None,
                      on_half=None) -> float:
    """`clients` concurrent clients for `seconds`. `rate` (requests/s, all clients together): each
    client sends at its steady share of it, a request due every clients/rate seconds from a random
    phase, late ones sent at once and charged from when they were due; None: closed loop."""
    routes, weights = zip(*MIX)
    start = time.perf_counter()
    deadline = start + seconds
    half = [on_half is None]

    async def client_loop(n: int):
        rng = random.Random(n)
        conn = Conn("127.0.0.1", port, token)
        interval = clients / rate if rate else 0.0
        due = start + rng.uniform(0, interval)
        try:
            while True:
                now = time.perf_counter()
                if rate:
                    if due >= deadline:
                        break
                    if due > now:
                        await asyncio.sleep(due - now)
                elif now >= deadline:
                    break
                await load.one(conn, rng, rng.choices(routes, weights)[0], due if rate else None)
                due += interval
                if not half[0] and time.perf_counter() > start + seconds / 2:
                    half[0] = True
                    on_half()
        finally:
            conn.close()

    await asyncio.gather(*(client_loop(n) for n in range(clients)))
    return time.perf_counter() - start


async def unloaded(port: int, token: str, load: Load, per_route: int = 50) -> dict:
    ref = Load(load.tasks, load.job_ids)
    ref.oldest_record = load.oldest_record
    rng = random.Random(99)
    conn = Conn("127.0.0.1", port, token)
    for _ in range(per_route):
        for route in READ_ROUTES:
            await ref.one(conn, rng, route)
    conn.close()
    return ref.lat


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its waited-for children (/proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(int(x) for x in fields[11:15]) / ticks


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process and its live descendants (a worker's build pool and measuring worker)."""
    total = cpu_seconds(pid)
    try:
        children = open(f"/proc/{pid}/task/{pid}/children").read().split()
    except FileNotFoundError:
        return total
    return total + sum(tree_cpu_seconds(int(c)) for c in children)


def postgres_cpu_seconds() -> float:
    """CPU seconds of every PostgreSQL server process on this machine (its backends serve the
    API and the workers; nothing else uses the server during the bench)."""
    total = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != "postgres":
                    continue
        except OSError:
            continue
        total += cpu_seconds(int(pid))
    return total


def cpu_now(api_pid: int, worker_pid: int) -> dict[str, float]:
    return {"api": tree_cpu_seconds(api_pid), "postgres": postgres_cpu_seconds(), "worker": tree_cpu_seconds(worker_pid),
            "clients": cpu_seconds(os.getpid())}


def route_table(load: Load, elapsed: float, ref_lat: dict) -> dict:
    """Print a row per route and return them."""
    rows = {}
    print(f"{'route':<10}{'requests':>10}{'rps':>8}{'p50 ms':>9}{'p99 ms':>9}{'unloaded p50':>14}{'errors':>8}")
    for route in ("submit", "job", "records", "best"):
        lat = load.lat.get(route, [])
        ref = ref_lat.get(route, [])
        rows[route] = {"requests": len(lat), "rps": round(len(lat) / elapsed, 1),
                       "p50_ms": round(1e3 * pct(lat, 0.5), 2), "p99_ms": round(1e3 * pct(lat, 0.99), 2),
                       "unloaded_p50_ms": round(1e3 * statistics.median(ref), 2) if ref else None,
                       "errors": load.errors.get(route, 0)}
        r = rows[route]
        print(f"{route:<10}{r['requests']:>10}{r['rps']:>8}{r['p50_ms']:>9}{r['p99_ms']:>9}"
              f"{r['unloaded_p50_ms'] if r['unloaded_p50_ms'] is not None else '-':>14}{r['errors']:>8}")
    return rows


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main():
    from tuner.cli.service import LOCAL_WORKER_NICENESS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--rate", type=float, default=64.0, help="requests/s the clients offer together (phase 2)")
    ap.add_argument("--worker-nice", type=int, default=LOCAL_WORKER_NICENESS,
                    help="the job workers' priority (tunefarm worker --nice; default: what tunefarm serve's local "
                         f"workers use, {LOCAL_WORKER_NICENESS})")
    ap.add_argument("--saturation-seconds", type=float, default=15.0)
    ap.add_argument("--drain-timeout", type=float, default=300.0,
                    help="the drain ends once this many seconds pass with no submitted job finishing")
    args = ap.parse_args()

    import httpx
    import psycopg

    from tuner.records import open_store

    name = f"tunefarm_load_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = psycopg.connect(f"{PG_SERVER}/test", autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    procs: list[subprocess.Popen] = []
    try:
        store = open_store(url, upgrade=True)
        with tempfile.TemporaryDirectory() as tmp:
            tasks, write_s, seed_s = seed_records(store, args.records, tmp)
        token, _ = store.tokens.create("load", "submit")
        n_records = store.count()
        print(f"seeded {n_records} records over {len(tasks)} workloads: {seed_s:.1f} s to import them "
              f"({write_s:.0f} s to write the file)", flush=True)

        port = free_port()
        procs.append(start_api(url, port))
        workers = [start_worker(url, f"load-w{n}", args.worker_nice) for n in range(2)]
        procs += workers
        base = f"http://127.0.0.1:{port}{API}"
        load = Load(tasks, [])
        first = httpx.get(f"{base}/records", params={"limit": 1}, headers={"Authorization": f"Bearer {token}"}).json()
        load.oldest_record = first["items"][0]["id"]
        # a few jobs to poll from the start
        for i in range(4):
            r = httpx.post(f"{base}/jobs", json=small_job(10_000 + i), headers={"Authorization": f"Bearer {token}"})
            load.submitted.append(r.json()["id"])
            load.job_ids.append(r.json()["id"])
        load.next_job = 0

        ref_lat = asyncio.run(unloaded(port, token, load))
        killed: list[int] = []

        def kill_one():
            """SIGKILL the first worker as soon as it holds a job (within 10 s; with the queue
            empty it may be between jobs), from a thread: the clients go on meanwhile."""
            def when_busy():
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    if any(j.lease_owner == "load-w0" for j in store.jobs.page(state="running", limit=20)):
                        break
                    time.sleep(0.02)
                workers[0].send_signal(signal.SIGKILL)
                killed.append(workers[0].pid)
            threading.Thread(target=when_busy, daemon=True).start()

        api_pid, worker_pids = procs[0].pid, [w.pid for w in workers]
        # the killed worker's CPU cannot be read after its death: the surviving worker's is reported
        cpu0 = cpu_now(api_pid, worker_pids[1])
        elapsed = asyncio.run(run_clients(port, token, load, args.clients, args.seconds, args.rate, kill_one))
        cpu_share = {k: round((v - cpu0[k]) / elapsed, 2) for k, v in cpu_now(api_pid, worker_pids[1]).items()}

        saturated = Load(tasks, load.job_ids)
        saturated.oldest_record, saturated.next_job = load.oldest_record, 100_000
        sat_cpu0 = cpu_now(api_pid, worker_pids[1])
        sat_elapsed = asyncio.run(run_clients(port, token, saturated, args.clients, args.saturation_seconds, None))
        sat_share = {k: round((v - sat_cpu0[k]) / sat_elapsed, 2) for k, v in cpu_now(api_pid, worker_pids[1]).items()}
        submitted = load.submitted + saturated.submitted

        # every submitted job must finish (the killed worker's job after its lease expired): the drain
        # waits as long as jobs keep finishing, and ends once --drain-timeout passes without one
        terminal = ("done", "failed", "cancelled")
        drain_start = time.monotonic()
        deadline, finished_before = drain_start + args.drain_timeout, -1
        while True:
            states = [store.jobs.get(j).state for j in submitted]
            finished = sum(s in terminal for s in states)
            if finished == len(submitted) or time.monotonic() >= deadline:
                break
            if finished > finished_before:
                finished_before, deadline = finished, time.monotonic() + args.drain_timeout
            time.sleep(1)
        drain_s = time.monotonic() - drain_start
        # lost: acknowledged, then missing, failed or cancelled; late: still queued or running when
        # the drain ended (unfinished is not lost); duplicated: ended twice, or more search records
        # than its trials
        lost = late = duplicated = done = 0
        for jid in submitted:
            try:
                job = store.jobs.get(jid)
            except Exception:  # noqa: BLE001 - an acknowledged job that is not stored is lost
                lost += 1
                continue
            if job.state == "done":
                done += 1
            elif job.state in terminal:
                lost += 1
            else:
                late += 1
            events = [e.kind for e in store.jobs.events(jid)]
            search = [r for r in store.records_page(job_id=jid, limit=100) if r.candidate.kind != "default"]
            if events.count("done") > 1 or len(search) > job.trials:
                duplicated += 1
        surviving_workers = len(workers) - 1   # one was killed half-way
        jobs_per_worker_second = done / (elapsed + sat_elapsed + drain_s) / max(1, surviving_workers)
        reclaimed = sum("reclaimed" in [e.kind for e in store.jobs.events(j)] for j in submitted)

        print(f"load: {args.clients} clients offering {args.rate:g} requests/s for {elapsed:.0f} s "
              f"(latency from when each request was due)")
        rows = route_table(load, elapsed, ref_lat)
        total = sum(len(v) for v in load.lat.values())
        read_p99 = max(rows[r]["p99_ms"] for r in READ_ROUTES)
        print(f"{total / elapsed:.0f} requests/s served; {len(submitted)} jobs submitted (both phases), "
              f"{reclaimed} reclaimed after the killed worker, lost {lost}, late {late} (drain {drain_s:.0f} s), "
              f"duplicated {duplicated}; {jobs_per_worker_second:.3f} jobs finished a second per worker; "
              f"read p99 {read_p99} ms at {n_records} records")
        print(f"cores used during the load (of {os.cpu_count()}): API server {cpu_share['api']}, PostgreSQL "
              f"{cpu_share['postgres']}, the surviving job worker {cpu_share['worker']} (with its build and "
              f"measuring processes), load clients {cpu_share['clients']}")
        print(f"\nsaturation: {args.clients} clients with no pause for {sat_elapsed:.0f} s (closed loop)")
        sat_rows = route_table(saturated, sat_elapsed, ref_lat)
        sat_total = sum(len(v) for v in saturated.lat.values())
        print(f"{sat_total / sat_elapsed:.0f} requests/s at most; cores: API server {sat_share['api']}, PostgreSQL "
              f"{sat_share['postgres']}, job worker {sat_share['worker']}, load clients {sat_share['clients']}")
        print(json.dumps({
            "records": n_records, "seed_seconds": round(seed_s, 1), "seed_file_seconds": round(write_s, 1),
            "clients": args.clients, "offered_rate": args.rate, "worker_nice": args.worker_nice,
            "seconds": round(elapsed, 1),
            "requests_per_second": round(total / elapsed, 1), "routes": rows,
            "read_p99_ms": read_p99,
            "read_p99_over_unloaded_p50": {r: round(rows[r]["p99_ms"] / rows[r]["unloaded_p50_ms"], 2)
                                           for r in READ_ROUTES if rows[r]["unloaded_p50_ms"]},
            "errors": sum(load.errors.values()) + sum(saturated.errors.values()), "jobs_submitted": len(submitted),
            "jobs_reclaimed": reclaimed, "jobs_lost": lost, "jobs_late": late, "jobs_duplicated": duplicated,
            "jobs_done": done, "drain_seconds": round(drain_s, 1),
            "jobs_per_second_per_worker": round(jobs_per_worker_second, 4),
            "cores_used": cpu_share,
            "saturation": {"seconds": round(sat_elapsed, 1), "requests_per_second": round(sat_total / sat_elapsed, 1),
                           "read_p99_ms": max(sat_rows[r]["p99_ms"] for r in READ_ROUTES), "routes": sat_rows,
                           "cores_used": sat_share},
            "load_rate_over_saturation": round((total / elapsed) / (sat_total / sat_elapsed), 2),
        }))
        store.close()
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


if __name__ == "__main__":
    main()
