"""Run a tracker: configuration, the gRPC server on its event loop, and the reaper that makes time pass.

`start_tracker(TrackerConfig(port=0))` returns a running `TrackerServer` (tests, benchmarks and
`tunefarm tracker` all start it this way); the caller's thread is free, the tracker runs on a
thread of its own.

That thread runs one asyncio event loop holding grpc's asyncio server (`grpc.aio`): every call
and every stream is a coroutine on it (servicer.py says why: no thread hand-off per request). The
reaper is a task on the same loop that calls `TrackerState.expire()` a few times a second, so
silent agents are dropped and overdue leases requeued within a fraction of a second of their
deadline, without any RPC having to arrive.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

import grpc

from .config import TrackerConfig, TrackerStartError
from .protocol import channel_options, server_keepalive_options
from .servicer import TrackerServicer, add_to_server
from .state import TrackerState

log = logging.getLogger("rpc_tracker")


def _new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when it is installed (the tuner's extras bring it), else asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class TrackerServer:
    """A running tracker. `address` is what agents and tuners dial; `state` is its memory."""

    def __init__(self, config: TrackerConfig):
        if (config.tls_cert is None) != (config.tls_key is None):
            raise TrackerStartError("TLS needs both a certificate (--tls-cert) and its private key (--tls-key)")
        self.config = config
        self.state = TrackerState(agent_timeout=config.agent_timeout_seconds, lease_slack=config.lease_slack_seconds,
                                  lease_renewals=config.lease_renewals,
                                  max_attempts=config.max_attempts, default_timeout=config.default_timeout_seconds,
                                  result_ttl=config.result_ttl_seconds, result_cache_size=config.result_cache_size,
                                  unknown_key_grace=config.unknown_key_grace_seconds)
        self.port = 0
        self.address = ""
        self._loop = _new_event_loop()
        self._started = threading.Event()
        self._finished = threading.Event()
        self._start_error: BaseException | None = None
        self._stop_event: asyncio.Event | None = None
        self._grace: float | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="tracker-loop", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            self._thread.join()
            raise self._start_error
        host = config.host
        if host in ("0.0.0.0", "::", "[::]", ""):
            host = "127.0.0.1"
        elif ":" in host and not host.startswith("["):
            host = f"[{host}]"
        self.address = f"{host}:{self.port}"

    # ------------------------------------------------------------------ the loop thread

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        except BaseException as e:  # noqa: BLE001 - told to the starting thread, or logged
            if not self._started.is_set():
                self._start_error = e
            else:
                log.exception("the tracker's event loop failed")
        finally:
            self._started.set()
            try:
                self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            finally:
                self._loop.close()
                self._finished.set()

    async def _main(self) -> None:
        self._stop_event = asyncio.Event()
        server = self._make_server()
        await server.start()
        self._started.set()
        config = self.config
        interval = config.reap_interval_seconds or min(0.25, config.agent_timeout_seconds / 4)
        reaper = asyncio.ensure_future(self._reap(interval))
        try:
            await self._stop_event.wait()
        finally:
            reaper.cancel()
            await server.stop(self._grace)

    def _make_server(self) -> grpc.aio.Server:
        config = self.config
        servicer = TrackerServicer(self.state, agent_token=config.agent_token, tuner_token=config.tuner_token,
                                   heartbeat_seconds=config.heartbeat_seconds)
        server = grpc.aio.server(options=channel_options() + server_keepalive_options() + [("grpc.so_reuseport", 0)])
        add_to_server(servicer, server)
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
        self.port = port
        return server

    async def _reap(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                self.state.expire()
            except Exception:  # noqa: BLE001 - a bug must not stop expiry for the whole farm
                log.exception("tracker reaper failed; continuing")

    # ------------------------------------------------------------------ control, from any other thread

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving: streams end (agents reconnect elsewhere, tuners resubmit), then the port closes."""
        if self._stopped:
            return
        self._stopped = True
        self.state.close()  # wakes every stream: each ends with UNAVAILABLE and its reason
        self._grace = grace
        if not self._finished.is_set() and self._stop_event is not None:
            try:
                self._loop.call_soon_threadsafe(self._stop_event.set)
            except RuntimeError:  # the loop is already closed
                pass
        self._thread.join(timeout=(grace or 0) + 10)
        log.info("tracker on %s stopped", self.address)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server stops; True if it did within `timeout`."""
        return self._finished.wait(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start_tracker(config: TrackerConfig | None = None) -> TrackerServer:
    """Start a tracker on its own thread; raises TrackerStartError when it cannot listen."""
    running = TrackerServer(config or TrackerConfig())
    config = running.config
    log.info("tracker listening on %s (%s, agent token %s, tuner token %s)", running.address,
             "TLS" if config.tls_cert else "plaintext", "required" if config.agent_token else "off",
             "required" if config.tuner_token else "off")
    return running
