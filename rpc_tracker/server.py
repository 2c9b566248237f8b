"""Run a tracker: configuration, the gRPC server, and the reaper that makes time pass.

`start_tracker(TrackerConfig(port=0))` returns a running `TrackerServer` (tests, benchmarks and
`tunefarm tracker` all start it this way). The reaper thread calls `TrackerState.expire()` a few
times a second, so silent agents are dropped and overdue leases requeued within a fraction of a
second of their deadline, without any RPC having to arrive.

gRPC's sync server runs each call on a pool thread, and a server stream (every connected agent,
every tuner waiting for a batch) holds its thread for as long as it is open, so the pool is sized
for many streams (max_workers); unary calls (heartbeats, results) need free threads beside them.
"""

from __future__ import annotations

import logging
import threading
from concurrent import futures
from pathlib import Path

import grpc

from .config import TrackerConfig, TrackerStartError
from .protocol import channel_options, pb_grpc, server_keepalive_options
from .servicer import TrackerServicer
from .state import TrackerState

log = logging.getLogger("rpc_tracker")


class TrackerServer:
    """A running tracker. `address` is what agents and tuners dial; `state` is its memory."""

    def __init__(self, config: TrackerConfig, server: grpc.Server, state: TrackerState, port: int):
        self.config, self._server, self.state, self.port = config, server, state, port
        host = config.host
        if host in ("0.0.0.0", "::", "[::]", ""):
            host = "127.0.0.1"
        elif ":" in host and not host.startswith("["):
            host = f"[{host}]"
        self.address = f"{host}:{port}"
        self._stop = threading.Event()
        interval = config.reap_interval_seconds or min(0.25, config.agent_timeout_seconds / 4)
        self._reaper = threading.Thread(target=self._reap, args=(interval,), name="tracker-reaper", daemon=True)
        self._reaper.start()
        self._stopped = False

    def _reap(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.state.expire()
            except Exception:  # noqa: BLE001 - a bug must not stop expiry for the whole farm
                log.exception("tracker reaper failed; continuing")

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving: streams end (agents reconnect elsewhere, tuners resubmit), then the port closes."""
        if self._stopped:
            return
        self._stopped = True
        self.state.close()
        self._stop.set()
        self._server.stop(grace).wait()
        self._reaper.join(timeout=2)
        log.info("tracker on %s stopped", self.address)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server stops; True if it did within `timeout`."""
        return self._server.wait_for_termination(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start_tracker(config: TrackerConfig | None = None) -> TrackerServer:
    config = config or TrackerConfig()
    if (config.tls_cert is None) != (config.tls_key is None):
        raise TrackerStartError("TLS needs both a certificate (--tls-cert) and its private key (--tls-key)")
    state = TrackerState(agent_timeout=config.agent_timeout_seconds, lease_slack=config.lease_slack_seconds,
                         max_attempts=config.max_attempts, default_timeout=config.default_timeout_seconds,
                         result_ttl=config.result_ttl_seconds, result_cache_size=config.result_cache_size,
                         unknown_key_grace=config.unknown_key_grace_seconds)
    servicer = TrackerServicer(state, agent_token=config.agent_token, tuner_token=config.tuner_token,
                               heartbeat_seconds=config.heartbeat_seconds)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix="tracker"),
                         options=channel_options() + server_keepalive_options() + [("grpc.so_reuseport", 0)])
    pb_grpc.add_TrackerServicer_to_server(servicer, server)
    bind = f"{config.host}:{config.port}"
    try:
        if config.tls_cert:
            try:
                creds = grpc.ssl_server_credentials([(Path(config.tls_key).read_bytes(),
                                                      Path(config.tls_cert).read_bytes())])
            except OSError as e:
                raise TrackerStartError(f"cannot read the TLS certificate or key: {e}") from None
            port = server.add_secure_port(bind, creds)
        else:
            port = server.add_insecure_port(bind)
    except RuntimeError as e:
        raise TrackerStartError(f"cannot listen on {bind}: {e}") from None
    if not port:
        raise TrackerStartError(f"cannot listen on {bind} (port in use?)")
    server.start()
    running = TrackerServer(config, server, state, port)
    log.info("tracker listening on %s (%s, agent token %s, tuner token %s)", running.address,
             "TLS" if config.tls_cert else "plaintext", "required" if config.agent_token else "off",
             "required" if config.tuner_token else "off")
    return running
