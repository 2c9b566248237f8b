"""A real `tunefarm serve` for tests: started on a free loopback port, waited for, with the session
token it prints (the tests stop it themselves)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(db: str, port: int, timeout: float = 60.0) -> tuple[subprocess.Popen, str]:
    """`tunefarm serve --db DB --port PORT` (one local worker), answering /readyz; with its session token."""
    proc = subprocess.Popen([sys.executable, "-m", "tuner.cli", "serve", "--db", db, "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    token, lines = None, []
    deadline = time.monotonic() + timeout
    while token is None and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"session token \(admin, revoked when this server stops\): (tf_\S+)", line)
        token = m.group(1) if m else None
    assert token is not None, "".join(lines)
    threading.Thread(target=proc.stdout.read, daemon=True).start()          # keep its pipe drained
    wait_ready(f"http://127.0.0.1:{port}", deadline - time.monotonic())
    return proc, token


def wait_ready(base: str, timeout: float = 60) -> None:
    """Until the server at `base` answers /readyz with 200; AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{base} not ready in {timeout:g} s")
