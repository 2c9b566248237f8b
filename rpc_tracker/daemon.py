"""The tracker as a program: command-line options, logging, run until SIGINT/SIGTERM.

Shared by `python -m rpc_tracker` and `tunefarm tracker`, so both take the same options and stop
the same way: on SIGINT or SIGTERM the streams end (agents reconnect with backoff, tuners
re-submit what was not answered; the tracker keeps no durable state) and the process exits 0.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
import threading

from .config import TrackerConfig, TrackerStartError

# The tracker's own collector settings (a tracker process only; an in-process tracker leaves its
# host's alone). Taking a 6400-request batch allocates some 60 000 objects that live until they
# are answered, and every 700 of them CPython's default threshold ran a young collection, which
# also walked the objects of earlier batches still queued or cached: a third of the intake's time
# (17 instead of 37-48 ms for the batch's queueing, bench/farm_throughput.py). Cycles are rare
# here (messages, dataclasses, dicts), so collecting every 50 000 allocations costs no memory
# worth counting; what was loaded at start (grpc, protobuf, the modules) is frozen out of it.
GC_THRESHOLDS = (50_000, 20, 100)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = TrackerConfig()
    p.add_argument("--host", default=d.host, help=f"address to listen on (default {d.host}; 0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=d.port, help=f"port (default {d.port}; 0 picks a free one)")
    p.add_argument("--agent-token", default=os.environ.get("TUNEFARM_AGENT_TOKEN"),
                   help="token agents must present (default $TUNEFARM_AGENT_TOKEN; none: open)")
    p.add_argument("--tuner-token", default=os.environ.get("TUNEFARM_TUNER_TOKEN"),
                   help="token tuners must present (default $TUNEFARM_TUNER_TOKEN; none: open)")
    p.add_argument("--tls-cert", default=None, help="PEM certificate: serve TLS (with --tls-key)")
    p.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    p.add_argument("--heartbeat", type=float, default=d.heartbeat_seconds,
                   help=f"seconds between agent heartbeats (default {d.heartbeat_seconds:g}); an agent silent "
                        "for 3 of them is dropped")
    p.add_argument("--max-attempts", type=int, default=d.max_attempts,
                   help=f"lost leases before a request is answered with an error (default {d.max_attempts})")
    p.add_argument("--lease-renewals", type=int, default=d.lease_renewals,
                   help=f"leases more a request's lease may be renewed by its agent's heartbeats while the agent "
                        f"works on it (default {d.lease_renewals}; 0: never renewed)")
    p.add_argument("--log-level", default="INFO", help="logging level (default INFO)")


def config_from_args(args) -> TrackerConfig:
    if args.heartbeat <= 0:
        raise TrackerStartError("--heartbeat must be positive")
    if args.max_attempts < 1:
        raise TrackerStartError("--max-attempts must be at least 1")
    if args.lease_renewals < 0:
        raise TrackerStartError("--lease-renewals must not be negative")
    return TrackerConfig(host=args.host, port=args.port, agent_token=args.agent_token or None,
                         tuner_token=args.tuner_token or None, tls_cert=args.tls_cert, tls_key=args.tls_key,
                         heartbeat_seconds=args.heartbeat, agent_timeout_seconds=3 * args.heartbeat,
                         max_attempts=args.max_attempts, lease_renewals=args.lease_renewals)


def serve(args) -> int:
    """Run a tracker from parsed arguments until SIGINT/SIGTERM; 0 on a clean stop, 2 if it cannot start."""
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .server import start_tracker
    try:
        server = start_tracker(config_from_args(args))
    except TrackerStartError as e:
        print(f"tunefarm tracker: error: {e}", file=sys.stderr)
        return 2
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    print(f"tracker listening on {server.address}", flush=True)
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.stop(grace=2.0)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m rpc_tracker", description="Run the tunefarm measurement tracker.")
    add_arguments(p)
    return serve(p.parse_args(argv))
