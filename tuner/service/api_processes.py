"""The API served by several processes on one port (`tunefarm serve --api-processes`).

One API process spends its requests' Python (routing, validation, the store's row handling,
JSON) under one interpreter lock: at a million records it served 210 requests/s on one core
of two, with PostgreSQL using a sixth of the other. So several processes serve the port, each
with its own app, store and connection pool; the parent only reserves the port, starts them,
restarts one that dies, and stops them (and they die with it, however it dies:
tuner.service.lifeline).

Each process listens on a socket of its own bound to the port with SO_REUSEPORT, and the kernel
spreads new connections evenly over the listening sockets by their address hash. One listening
socket shared by all (where each connection goes to whichever process wins the race to accept
it) handed one process 28 to 31 of 32 keep-alive connections opened together, so a load of a few
long-lived clients was served by one interpreter lock. The parent's own
socket is bound with SO_REUSEPORT but never listens, so it holds the port (and resolves port 0)
without being handed connections. Where SO_REUSEPORT is missing, the processes share the parent's
listening socket as before.

Request metrics are summed over the processes (prometheus_client's multiprocess mode: each
process writes its histogram to a file in a directory of the parent's, /metrics reads them all),
so a scrape sees the server, not whichever process answered it. The parent removes the directory
when it stops; one left by a SIGKILLed serve is removed by the next serve on the host.
"""

from __future__ import annotations

import glob
import multiprocessing
import os
import shutil
import socket
import tempfile
import threading
import time

from .api.metrics import METRICS_DIR_ENV

METRICS_PREFIX = "tunefarm-metrics-"   # + the serve's pid: a SIGKILLed serve's is removed by the next
RESTART_WINDOW_S = 10.0     # a process that dies this soon after starting, twice running, stops the server
STOP_TIMEOUT_S = 30.0


BACKLOG = 2048
PER_PROCESS_LISTENERS = hasattr(socket, "SO_REUSEPORT")


def _bound_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if PER_PROCESS_LISTENERS:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def listening_socket(host: str, port: int) -> socket.socket:
    """The parent's socket, bound to (host, port) (IPv6 when `host` is one): it reserves the port
    for the processes, each of which listens on a socket of its own (`process_socket`); without
    SO_REUSEPORT it listens itself and the processes share it."""
    sock = _bound_socket(host, port)
    if not PER_PROCESS_LISTENERS:
        sock.listen(BACKLOG)
    return sock


def process_socket(reserved: socket.socket) -> socket.socket:
    """One API process's listening socket on the port `reserved` holds (the shared one itself
    where each process cannot have its own)."""
    if not PER_PROCESS_LISTENERS:
        return reserved
    host, port = reserved.getsockname()[:2]
    sock = _bound_socket(host, port)
    sock.listen(BACKLOG)
    return sock


def serve_processes(sock: socket.socket, processes: int, app_options: dict, stop: threading.Event) -> int:
    """Serve create_app(**app_options) from `processes` processes on `sock` until `stop` is set;
    returns 0, or 1 when a process kept dying as it started (its error is on stderr)."""
    _remove_dead_metrics_dirs(tempfile.gettempdir())
    metrics_dir = tempfile.mkdtemp(prefix=f"{METRICS_PREFIX}{os.getpid()}-")
    os.environ[METRICS_DIR_ENV] = metrics_dir            # inherited by the processes started below
    ctx = multiprocessing.get_context("spawn")            # a fresh interpreter: no inherited threads or connections

    def start():
        p = ctx.Process(target=_api_process, args=(sock, app_options, os.getpid()), name="tunefarm-api", daemon=False)
        p.start()
        return p, time.monotonic()

    running = [start() for _ in range(processes)]
    early_deaths = 0
    status = 0
    try:
        while not stop.wait(0.5):
            for i, (p, started) in enumerate(running):
                if p.is_alive():
                    continue
                early_deaths = early_deaths + 1 if time.monotonic() - started < RESTART_WINDOW_S else 0
                if early_deaths >= 2:
                    stop.set()
                    status = 1
                    break
                running[i] = start()
    finally:
        for p, _ in running:
            if p.is_alive():
                p.terminate()                              # SIGTERM: uvicorn finishes its requests
        for p, _ in running:
            p.join(STOP_TIMEOUT_S)
            if p.is_alive():
                p.kill()
                p.join()
        os.environ.pop(METRICS_DIR_ENV, None)
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return status


def _remove_dead_metrics_dirs(folder: str) -> None:
    """Remove the metrics directories of serves that died without removing their own (SIGKILL):
    each is named after its serve's pid, and one whose serve is gone is no one's."""
    for path in glob.glob(os.path.join(folder, f"{METRICS_PREFIX}*-*")):
        owner = os.path.basename(path)[len(METRICS_PREFIX):].split("-", 1)[0]
        if owner.isdigit() and not _alive(int(owner)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:          # another user's process
        return True
    return True


def _api_process(sock: socket.socket, app_options: dict, parent: int) -> None:
    """One API process: its own app and store, accepting on its own socket of the port; it ends
    with the parent however that ends (a SIGKILLed serve must not leave processes answering on
    its port)."""
    import uvicorn

    from .api.app import create_app
    from .api.heap import settle_heap
    from .lifeline import exit_with_parent

    exit_with_parent(parent)

    app = create_app(**app_options)
    settle_heap()
    listener = process_socket(sock)     # listening only once its app is built: no connection waits on a start
    host, port = listener.getsockname()[:2]
    uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning")).run(sockets=[listener])
