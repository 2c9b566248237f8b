"""`tunefarm serve` as a user starts it (the embedded default: API + one local worker process on
a SQLite file, a session token printed and revoked at exit), and the Python client and CLI on it:
`tunefarm submit --watch`, `tunefarm jobs [show|cancel]`, errors a user can read."""

from __future__ import annotations

import glob
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import pytest
from conftest import pg_schema_url
from serve_process import free_port, start_serve, wait_ready

from tuner.cli import main
from tuner.cli.service import LOCAL_WORKER_NICENESS
from tuner.records import open_store
from tuner.service.client import APIError, ServiceClient

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real `tunefarm serve` on a free loopback port; yields (url, session token, db url, process)."""
    db = f"sqlite:///{tmp_path_factory.mktemp('serve') / 'records.db'}"
    port = free_port()
    proc, token = start_serve(db, port)
    url = f"http://127.0.0.1:{port}"
    yield url, token, db, proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)


def test_submit_watch_list_show_and_errors(server, capsys):
    url, token, _, _ = server
    args = ["--server", url, "--token", token]
    assert main(["submit", "relu", "--param", "shape=256", "--trials", "4", "--batch", "2", "--watch",
                 "--interval", "0.3", *args]) == 0
    out = capsys.readouterr().out
    job_id = int(re.search(r"job (\d+) queued", out).group(1))
    assert "claimed by serve-" in out and f"job {job_id}: done, 4/4 trials" in out
    assert re.search(r"relu \(weight 1\): 4 trials, best [0-9.]+ GFLOPS, default [0-9.]+ GFLOPS", out)

    assert main(["jobs", *args]) == 0
    assert re.search(rf"\s{job_id}\s+done\s+4/4\s+relu", capsys.readouterr().out)
    assert main(["jobs", "show", str(job_id), *args]) == 0
    assert "1 attempt(s)" in capsys.readouterr().out

    assert main(["jobs", "cancel", str(job_id), *args]) == 1          # a done job stays done
    assert "409" in capsys.readouterr().err
    assert main(["jobs", "show", "999999", *args]) == 1
    assert "404: no job 999999" in capsys.readouterr().err
    assert main(["submit", "relu", "--server", url, "--token", "tf_wrong"]) == 1
    assert "401" in capsys.readouterr().err
    assert main(["submit", "relu", "--trials", "0", *args]) == 1
    assert "trials" in capsys.readouterr().err
    assert main(["submit", "no_such_op", *args]) == 2                  # checked here, nothing sent
    assert "unknown operator" in capsys.readouterr().err


def test_client_pages_and_reports_unreachable_servers(server):
    url, token, _, _ = server
    with ServiceClient(url, token=token) as c:
        ids = [c.submit({"workloads": [{"op": "relu", "params": {"shape": [64 + i]}}], "trials": 1,
                         "priority": -5})["id"] for i in range(3)]
        page = c.jobs(limit=2)
        assert len(page["items"]) == 2 and page["next_before"] is not None
        assert {j["id"] for j in c.iter_jobs(limit=2)} >= set(ids)
        with pytest.raises(APIError) as e:
            c.submit({"workloads": [{"op": "matmul", "params": {"M": "x", "N": 4, "K": 4}}]})
        assert e.value.status == 422 and e.value.field == "workloads.0"
        for jid in ids:                    # leave the server's worker idle for the next test
            try:
                c.cancel(jid)
            except APIError as err:        # it finished already
                assert err.status == 409 and err.state == "done"
    with ServiceClient(f"http://127.0.0.1:{free_port()}", token=token) as c, pytest.raises(APIError) as e:
        c.jobs()
    assert e.value.status is None and "cannot reach" in str(e.value)


def test_stopping_serve_revokes_its_token_and_stops_its_worker(server):
    url, token, db, proc = server
    worker_pids = subprocess.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True,
                                 text=True).stdout.split()
    assert worker_pids, "tunefarm serve started no local worker"
    # the local worker shares this host with the API: it runs at a lower priority (set as it starts)
    deadline = time.monotonic() + 30
    while {os.getpriority(os.PRIO_PROCESS, int(pid)) for pid in worker_pids} != {LOCAL_WORKER_NICENESS}:
        assert time.monotonic() < deadline, "the local worker kept the API's priority"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=90) == 0
    with open_store(db) as store:
        assert store.tokens.verify(token) is None
    for pid in worker_pids:
        assert not _alive(int(pid))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_worker_priority_is_checked(tmp_path, capsys):
    for bad in ("-1", "20"):
        assert main(["worker", "--db", f"sqlite:///{tmp_path / 'r.db'}", "--nice", bad, "--once"]) == 2
        assert "--nice must be 0..19" in capsys.readouterr().err


def established_connections(pid: int, port: int) -> int:
    """TCP connections to local `port` that process `pid` holds open (from /proc: its socket
    descriptors' inodes, matched with /proc/net/tcp{,6} rows in state ESTABLISHED)."""
    inodes = set()
    for fd in glob.glob(f"/proc/{pid}/fd/*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in f.readlines()[1:]:
                fields = row.split()
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                if fields[3] == "01" and local_port == port and fields[9] in inodes:
                    count += 1
    return count


def test_serve_with_several_api_processes_shares_one_port_and_sums_their_metrics(pg_database):
    """`tunefarm serve --api-processes 2` on PostgreSQL: two API processes serve one port, each
    handed its share of the connections, /metrics counts every request whichever process served
    it, SIGTERM stops both and revokes the session token, and SIGKILL takes them with it (the next
    serve removes what it left in /tmp)."""
    db = pg_schema_url(pg_database)
    port = free_port()

    def serve(*extra: str, **popen) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "tuner.cli", "serve", "--db", db, "--port", str(port), "--workers", "0",
                                 "--api-processes", "2", *extra], **popen)

    proc = serve(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        token = None
        while token is None:
            line = proc.stdout.readline()
            assert line, "tunefarm serve ended before printing its session token"
            m = re.search(r"session token \(admin, revoked when this server stops\): (tf_\S+)", line)
            token = m.group(1) if m else None
        url = f"http://127.0.0.1:{port}"
        wait_ready(url)
        api_pids = {int(p) for p in subprocess.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True,
                                                   text=True).stdout.split()
                    if "spawn_main" in open(f"/proc/{p.strip()}/cmdline").read()}
        assert len(api_pids) == 2
        headers = {"Authorization": f"Bearer {token}"}
        for _ in range(40):                  # a new connection per request: the kernel spreads them
            assert httpx.get(f"{url}/api/v1/jobs", headers=headers, params={"limit": 1}).status_code == 200
        metrics = httpx.get(f"{url}/metrics", headers=headers).text
        served = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                     if line.startswith("tunefarm_http_request_duration_seconds_count") and 'route="/api/v1/jobs"' in line)
        assert served == 40
        # keep-alive connections are spread over the processes (each listens on a socket of its
        # own): with one shared socket, one process took 28-31 of 32 and saturated alone
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(32)]
        try:
            deadline = time.monotonic() + 10
            while sum(held := [established_connections(pid, port) for pid in api_pids]) < 32:
                assert time.monotonic() < deadline, held
                time.sleep(0.1)
            assert min(held) >= 6, held
        finally:
            for c in clients:
                c.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0
        assert not any(_alive(pid) for pid in api_pids)
        with open_store(db) as store:
            assert store.tokens.verify(token) is None
        # a SIGKILLed serve takes its API processes with it: nothing keeps answering on its port
        proc = serve("--no-session-token", stdout=subprocess.DEVNULL)
        wait_ready(url)
        children = [int(p) for p in subprocess.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True,
                                                   text=True).stdout.split()]
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in children):
            assert time.monotonic() < deadline, "API processes outlived their SIGKILLed serve"
            time.sleep(0.1)
        # its metrics directory outlives it, until the next serve of several processes removes it
        left = glob.glob(os.path.join(tempfile.gettempdir(), f"tunefarm-metrics-{proc.pid}-*"))
        assert len(left) == 1
        proc = serve("--no-session-token", stdout=subprocess.DEVNULL)
        wait_ready(url)
        assert not os.path.exists(left[0])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
