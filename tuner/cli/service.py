"""`tunefarm serve`, `worker`, `db upgrade` and `token`: running the tuning service.

    tunefarm serve [--db URL] [--port 8080]     the REST API, plus one local job worker process
    tunefarm worker [--db URL]                  claim and run jobs (as many processes as wanted)
    tunefarm db upgrade [--db URL]              migrate a PostgreSQL database (SQLite migrates itself)
    tunefarm token create --scope submit        an API token (printed once, stored hashed)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager

from .common import EXIT_FAIL, EXIT_OK, UsageError, open_store


def _db_arg(p) -> None:
    p.add_argument("--db", default=None, metavar="URL",
                   help="records database (default $TUNEFARM_DB_URL, else ~/.tunefarm/records.db)")


def _resolved_url(url: str | None) -> str:
    from ..records.engine import resolve_url
    return resolve_url(url)


# ----------------------------------------------------------------------------- worker
def cmd_worker(args) -> int:
    import logging

    from ..service.worker import JobWorker

    if args.lease < 3:
        raise UsageError(f"--lease must be at least 3 seconds, got {args.lease}")
    if not 0 <= args.nice <= 19:
        raise UsageError(f"--nice must be 0..19 (a lower priority), got {args.nice}")
    if args.exit_with_parent is not None:
        from ..service.lifeline import exit_with_parent
        exit_with_parent(args.exit_with_parent)     # first: a serve that died while this started is not missed
    if args.nice:
        os.nice(args.nice)      # before any build or measuring process starts: they inherit it
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    store = open_store(args.db)
    worker = JobWorker(store, name=args.name, lease_seconds=args.lease, poll_seconds=args.poll,
                       device_keys=args.device_key or None, tracker=args.tracker, tracker_token=args.tracker_token,
                       tls_ca=args.tls_ca, calibrate=not args.no_calibration)
    stop = threading.Event()

    def on_signal(signum, _frame):
        print(f"tunefarm worker {worker.name}: {signal.Signals(signum).name}: stopping after the current batch",
              file=sys.stderr, flush=True)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"tunefarm worker {worker.name}: claiming jobs from {store!r} "
          f"(device keys: {', '.join(worker.device_keys) if worker.device_keys else 'all'})", flush=True)
    try:
        if args.once:
            worker.run_once(stop)
        else:
            worker.serve(stop)
    finally:
        worker.close()
        store.close()
    return EXIT_OK


# ----------------------------------------------------------------------------- serve
def cmd_serve(args) -> int:
    import uvicorn

    from ..service.api.app import create_app
    from ..service.api.heap import settle_heap
    from ..service.api_processes import listening_socket, serve_processes

    url = _resolved_url(args.db)
    store = open_store(url)          # migrates SQLite, refuses a PostgreSQL schema that is behind
    session = None
    if not args.no_session_token:
        secret, info = store.tokens.create(f"serve session pid {os.getpid()}", "admin")
        session = (secret, info.id)
    store.close()
    processes = args.api_processes if args.api_processes is not None else default_api_processes(url)
    if processes < 1:
        raise UsageError(f"--api-processes must be at least 1, got {processes}")
    host = "127.0.0.1" if args.host is None else args.host
    sock = None
    if processes > 1:
        try:
            sock = listening_socket(host, args.port)
        except OSError as e:
            raise UsageError(f"cannot listen on {host}:{args.port}: {e.strerror or e}") from None
    workers = [_spawn_worker(url, args, n) for n in range(args.workers)]
    app_options = dict(store_url=url, public_read=args.public_read, tracker=args.tracker, tracker_token=args.tracker_token,
                       max_model_bytes=args.max_model_bytes)
    shown_host = f"[{host}]" if ":" in host else host
    print(f"tunefarm serve: http://{shown_host}:{args.port}/ (API under /api/v1, OpenAPI at /docs), "
          f"records in {url}, {processes} API process(es), {args.workers} local worker(s)", flush=True)
    if session is not None:
        print(f"tunefarm serve: session token (admin, revoked when this server stops): {session[0]}", flush=True)
        print(f"tunefarm serve: open http://{shown_host}:{args.port}/?token={session[0]}", flush=True)
    stop = threading.Event()
    server = None
    if sock is None:
        app = create_app(**app_options)
        settle_heap()
        server = _server_without_signal_handling(uvicorn.Config(app, host=host, port=args.port, log_level="warning"))

    def on_signal(signum, _frame):
        stop.set()
        if server is not None:
            server.should_exit = True       # uvicorn finishes its requests, then run() returns

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    status = EXIT_OK
    try:
        if server is not None:
            server.run()
        else:
            status = EXIT_OK if serve_processes(sock, processes, app_options, stop) == 0 else EXIT_FAIL
    finally:
        if sock is not None:
            sock.close()
        for p in workers:
            p.send_signal(signal.SIGTERM)
        for p in workers:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        if session is not None:
            with open_store(url) as s:
                s.tokens.revoke(session[1])
    return status


def default_api_processes(url: str) -> int:
    """API processes `tunefarm serve` runs unless told: one per core (at most MAX_DEFAULT_API_PROCESSES)
    on a server database; one on the embedded SQLite file, a single user's."""
    if url.startswith("sqlite"):
        return 1
    return max(1, min(os.cpu_count() or 1, MAX_DEFAULT_API_PROCESSES))


def _server_without_signal_handling(config):
    """uvicorn's Server, minus its own signal handling: uvicorn re-raises SIGTERM after shutting
    down, which would end this process before it stops its workers and revokes its token."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextmanager
        def capture_signals(self):
            yield

    return Server(config)


LOCAL_WORKER_NICENESS = 19   # the lowest priority: batch work behind the API (_spawn_worker)
MAX_DEFAULT_API_PROCESSES = 4


def _spawn_worker(url: str, args, n: int) -> subprocess.Popen:
    """A local job worker as its own process: tuning never runs in the API process. It shares
    this host with the API, so it runs at the lowest priority (LOCAL_WORKER_NICENESS): a page of
    the dashboard is answered first and the tuning takes every cycle the API leaves
    (bench/service_load.py: read p99 under load went from 90-155 ms to 40-80 ms at nice 5, and
    at a million records from 76 to 22 ms at nice 19, znver4: at nice 5 a worker's search and
    builds still weighed a third of the API's requests in the scheduler). Its measuring process
    sets its own raised priority (compiler.timing.MEASURE_NICE, absolute), so timings are taken
    as cleanly as before; where the OS refuses that (no CAP_SYS_NICE), its timings yield to the
    API too, and the ones the API disturbs are retaken (the measurement protocol).

    It dies with this process, however this one dies (--exit-with-parent; call this from the
    main thread: the kernel's parent-death signal follows the thread that started the child), and
    is named `serve-N@host:pid` after this process, so the next serve on this host sees that the
    owner of a job left running is gone and takes the job back at once, not a lease later."""
    name = f"serve-{n}@{socket.gethostname()}:{os.getpid()}"
    cmd = [sys.executable, "-m", "tuner.cli", "worker", "--db", url, "--name", name,
           "--nice", str(LOCAL_WORKER_NICENESS), "--exit-with-parent", str(os.getpid())]
    if args.tracker:
        cmd += ["--tracker", args.tracker]
    env = dict(os.environ)
    if args.tracker_token:
        env["TUNEFARM_TUNER_TOKEN"] = args.tracker_token
    return subprocess.Popen(cmd, env=env)


# ----------------------------------------------------------------------------- db
def cmd_db_upgrade(args) -> int:
    from ..records import StoreError
    from ..records import open_store as _open
    url = _resolved_url(args.db)
    try:
        _open(url, upgrade=True).close()
    except StoreError as e:
        print(f"tunefarm db upgrade: error: {e}", file=sys.stderr)
        return EXIT_FAIL
    print(f"tunefarm db upgrade: {url.split('@')[-1]} is at the current schema")
    return EXIT_OK


# ----------------------------------------------------------------------------- tokens
def cmd_token_create(args) -> int:
    from ..records import StoreError
    with open_store(args.db) as store:
        try:
            secret, info = store.tokens.create(args.name, args.scope)
        except StoreError as e:
            raise UsageError(str(e)) from None
    print(secret)
    print(f"token {info.id} ({info.name}): scopes {', '.join(sorted(info.scopes))}; shown once, stored hashed",
          file=sys.stderr)
    return EXIT_OK


def cmd_token_list(args) -> int:
    with open_store(args.db) as store:
        tokens = store.tokens.list_all()
    for t in tokens:
        state = f"revoked {t.revoked_at:%Y-%m-%d %H:%M}" if t.revoked_at else "active"
        used = f"last used {t.last_used_at:%Y-%m-%d %H:%M}" if t.last_used_at else "never used"
        print(f"{t.id:>5}  {t.name:<32} {','.join(sorted(t.scopes)):<20} {state:<24} {used}")
    return EXIT_OK


def cmd_token_revoke(args) -> int:
    from ..records import StoreError
    with open_store(args.db) as store:
        try:
            info = store.tokens.revoke(args.id)
        except StoreError as e:
            raise UsageError(str(e)) from None
    print(f"token {info.id} ({info.name}) revoked")
    return EXIT_OK


def register(sub) -> None:
    """Add serve, worker, db and token to the `tunefarm` parser."""
    p = sub.add_parser("serve", help="run the REST API (and a local job worker) until SIGINT/SIGTERM",
                       description="Run the tuning service: the REST API under /api/v1 and, unless --workers 0, "
                                   "local job worker processes measuring on this machine.")
    _db_arg(p)
    p.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--workers", type=int, default=1, help="local job worker processes (0: API only)")
    p.add_argument("--api-processes", type=int, default=None, metavar="N",
                   help="processes serving the API on one socket (default: one per core, at most "
                        f"{MAX_DEFAULT_API_PROCESSES}, on PostgreSQL; one on SQLite)")
    p.add_argument("--public-read", action="store_true", help="reads need no token")
    p.add_argument("--max-model-bytes", type=int, default=256 << 20, metavar="N",
                   help="largest ONNX file a model job may upload (default 256 MiB)")
    p.add_argument("--no-session-token", action="store_true",
                   help="do not create (and print) an admin token for this server's lifetime")
    p.add_argument("--tracker", default=None, metavar="HOST:PORT", help="the farm's tracker (farm page, device keys)")
    p.add_argument("--tracker-token", default=os.environ.get("TUNEFARM_TUNER_TOKEN"),
                   help="the tracker's tuner token (default $TUNEFARM_TUNER_TOKEN)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("worker", help="claim tuning jobs from the records database and run them",
                       description="A job worker: claims the next queued job (or one whose worker died) with a "
                                   "lease, runs it, and repeats. SIGTERM/SIGINT: stop after the current batch and "
                                   "hand the job back.")
    _db_arg(p)
    p.add_argument("--name", default=None, help="worker name in leases and events (default host:pid)")
    p.add_argument("--lease", type=float, default=60.0, help="lease length in seconds (renewed every third)")
    p.add_argument("--poll", type=float, default=2.0, help="seconds between claims when the queue is empty")
    p.add_argument("--device-key", action="append", default=[],
                   help="serve only jobs of this device key (repeatable; default: local, or all with --tracker)")
    p.add_argument("--tracker", default=None, metavar="HOST:PORT", help="measure farm device keys through this tracker")
    p.add_argument("--tracker-token", default=os.environ.get("TUNEFARM_TUNER_TOKEN"),
                   help="the tracker's tuner token (default $TUNEFARM_TUNER_TOKEN)")
    p.add_argument("--tls-ca", default=None, help="CA certificate (PEM) when the tracker serves TLS")
    p.add_argument("--once", action="store_true", help="run at most one job, then exit")
    p.add_argument("--no-calibration", action="store_true",
                   help="do not calibrate the local measuring workers around each window (no drift checks, no slow "
                        "windows measured again; saves about 0.1 s a window)")
    p.add_argument("--nice", type=int, default=0, metavar="N",
                   help="run at this lower priority (0..19), builds and measurements too: on a host shared with the "
                        "API (tunefarm serve starts its local workers at 5)")
    p.add_argument("--exit-with-parent", type=int, default=None, metavar="PID",
                   help="exit at once when process PID (the one starting this worker) ends, however it ends; "
                        "tunefarm serve starts its local workers so")
    p.set_defaults(func=cmd_worker)

    db = sub.add_parser("db", help="the records database's schema")
    db_sub = db.add_subparsers(dest="db_command", metavar="DB_COMMAND", required=True)
    p = db_sub.add_parser("upgrade", help="migrate the database to this tunefarm's schema (PostgreSQL needs it)")
    _db_arg(p)
    p.set_defaults(func=cmd_db_upgrade)

    tok = sub.add_parser("token", help="API tokens")
    tok_sub = tok.add_subparsers(dest="token_command", metavar="TOKEN_COMMAND", required=True)
    p = tok_sub.add_parser("create", help="create a token and print it (once)")
    _db_arg(p)
    p.add_argument("--scope", required=True, choices=("read", "submit", "admin"),
                   help="read: GET; submit: also jobs and record imports; admin: everything")
    p.add_argument("--name", default="cli", help="what the token is for")
    p.set_defaults(func=cmd_token_create)
    p = tok_sub.add_parser("list", help="tokens with scopes and last use (never their secrets)")
    _db_arg(p)
    p.set_defaults(func=cmd_token_list)
    p = tok_sub.add_parser("revoke", help="revoke a token by id")
    _db_arg(p)
    p.add_argument("id", type=int)
    p.set_defaults(func=cmd_token_revoke)
