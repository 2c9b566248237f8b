"""The device agent daemon: join the farm, measure what the tracker sends, report the results.

An agent dials out to the tracker (so a board behind NAT can join) and keeps one Connect stream
open; the tracker pushes Work down it. Results, heartbeats and drain are unary calls on the same
channel. Each request is measured by a `device_agent.worker.WorkerProcess` — the very code the
tuner's LocalRunner uses — so a kernel that crashes, hangs or computes a wrong answer becomes an
error code in its result, the worker process is replaced, and the agent stays up.

Lifecycle:

- start `slots` measuring workers (one per request measured at a time; default 1, so timings do
  not disturb each other), then register: Connect(Hello) with the token in the metadata, read
  Welcome (the tracker's id for this connection and the heartbeat period);
- a heartbeat thread calls Heartbeat every `heartbeat_seconds` with the request ids held; if the
  tracker says it no longer knows the agent (NOT_FOUND) or heartbeats keep failing for three
  periods, the connection is abandoned and registered again;
- each Work is queued to the slots; a slot checks that this host can run the request's target,
  measures it and reports it: as a quiet message on the session's Report stream (`_ReportStream`;
  a message costs the tracker a fraction of what a call does), and goes on to its next request
  without waiting for the tracker. The tracker names a report only when it refuses it or it is a
  duplicate, and confirms the others by count; reports not confirmed when the stream ends (broken,
  a tracker from before the stream: UNIMPLEMENTED) are sent again with ReportResult, which
  retries (a report that got through twice is acknowledged as a duplicate: nothing is counted twice);
- the agent takes `prefetch` requests ahead of its slots (Hello.prefetch, default 1): when the
  farm's queue is longer than its free agents, the tracker leases it the next request while it is
  measuring, and a slot starts that the moment it finishes, without a dispatch round trip between
  two measurements. The next Work arrives while a kernel is being timed; that costs the agent
  process a message's parse, on a core the worker's timing does not use when the host has more
  than one (--prefetch 0 turns it off for a single-core board).
  FAILED_PRECONDITION (the lease had moved to another agent) and
  NOT_FOUND (the tracker restarted or dropped this connection) replies are logged, not fatal:
  the request is answered elsewhere or submitted again by its tuner;
- a broken stream, a tracker restart or an unreachable tracker: register again with exponential
  backoff (0.2 s doubling to 5 s, with jitter). Work of a connection that is gone and has not
  started is dropped (its lease brings it back to the queue on the tracker's side); work already
  running finishes and its report is tried;
- UNAUTHENTICATED, PERMISSION_DENIED, FAILED_PRECONDITION (protocol too old, an llvmlite
  the tracker cannot serve, an emulated agent under a native key or the other way) or INVALID_ARGUMENT
  from Connect, or a TLS handshake that fails (a tracker certificate not signed by --tls-ca, TLS
  against a plaintext tracker): retrying cannot help, so the agent exits with EXIT_REFUSED and
  says why;
- health (device_agent/health.py): each slot's worker is a `CalibratedWorker`, calibrated when it
  starts (and, on a host whose key has too little history, until it can be judged), after every
  window and after `recheck_seconds` idle. A slot's window is the request it waited for and those
  already queued behind it (`window_requests` at most): measured, closed by a calibration, and
  only then reported, so a window the calibration found slow is measured again in a fresh worker
  or reported marked (MeasureResult.slow_window, remeasured, slow_index). The agent's state,
  speed index and new calibrations go to the tracker on every heartbeat, and at once when the
  state changes; the tracker's history of this key and host comes back in Welcome. A degraded
  agent gets no work; its idle rechecks are how it is seen to recover. An emulated agent
  (host.is_emulated) does not calibrate: the emulator's speed says nothing of a device's, and
  under qemu-user a window's closing calibration reads half the standard after any new kernel;
- SIGTERM / SIGINT (`request_stop`): Drain (the tracker sends no more work), finish and report
  what is held (a request received ahead too: it is leased to this agent), wait for the tracker to
  confirm the reports, within `drain_grace_seconds`; past that, exit anyway (the leases requeue it).
"""

from __future__ import annotations

import logging
import os
import queue
import random
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, replace

import grpc

from compiler.measure_options import MeasureOptions
from rpc_tracker.client import make_tracker_channel, tls_problem
from rpc_tracker.protocol import PROTOCOL_VERSION, auth_metadata, pb, pb_grpc

from .calibration import CalibratedWorker
from .health import AgentHealth, calibration_dict
from .host import describe_host, target_problem
from .worker import RUNNER_ERROR, UNSUPPORTED_TARGET, MeasureRequest, WorkerProcess

log = logging.getLogger("tunefarm.agent")

EXIT_OK, EXIT_USAGE, EXIT_REFUSED = 0, 2, 3

# Replies to Connect that no retry can fix: a wrong token, an agent too old, a malformed Hello.
FATAL_CONNECT_CODES = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
                       grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT)

_STATUS_BY_NUMBER = {c.value[0]: c for c in grpc.StatusCode}  # ResultAck.status -> grpc.StatusCode



class AgentRefused(Exception):
    """The tracker refused this agent for good (wrong token, protocol too old, bad registration)."""


@dataclass
class AgentConfig:
    tracker: str                      # HOST:PORT
    device_key: str
    token: str | None = None
    slots: int = 1
    prefetch: int = 1                 # requests taken ahead of the slots (Hello.prefetch; 0: none)
    name: str | None = None           # default hostname-pid
    tls_ca: str | None = None         # PEM file of the CA that signed the tracker's certificate
    drain_grace_seconds: float = 60.0
    backoff_initial_seconds: float = 0.2
    backoff_max_seconds: float = 5.0
    worker_startup_seconds: float = 60.0
    call_timeout_seconds: float = 10.0  # unary calls (heartbeat, report, drain)
    calibrate: bool = True            # calibrated measuring workers and health reports (device_agent/health.py)
    recheck_seconds: float = 30.0     # an idle slot calibrates again after this long
    window_requests: int = 8          # requests of one window at most (measured, then calibrated, then reported)
    degrade_after: int | None = None  # slow windows in a row before degraded (None: calibration.DEGRADE_AFTER)
    max_replacements: int | None = None  # fresh workers tried per slow window (None: calibration.MAX_REPLACEMENTS)
    recovery_wait_seconds: float | None = None   # then waiting out a host-wide slow spell (None: calibration.RECOVERY_WAIT_S)

    def __post_init__(self):
        if not self.device_key or not self.device_key.strip():
            raise ValueError("a device key is required (e.g. --key x86-avx512)")
        if ":" not in self.tracker:
            raise ValueError(f"tracker address must be HOST:PORT, got {self.tracker!r}")
        if self.slots < 1:
            raise ValueError(f"slots must be at least 1, got {self.slots}")
        if self.prefetch < 0:
            raise ValueError(f"prefetch must not be negative, got {self.prefetch}")
        if self.drain_grace_seconds < 0:
            raise ValueError("drain grace period must not be negative")
        if not self.recheck_seconds > 0:
            raise ValueError(f"recheck period must be positive, got {self.recheck_seconds}")
        if self.window_requests < 1:
            raise ValueError(f"a window holds at least 1 request, got {self.window_requests}")
        if self.degrade_after is not None and self.degrade_after < 1:
            raise ValueError(f"degrade_after must be at least 1, got {self.degrade_after}")
        if self.max_replacements is not None and self.max_replacements < 1:
            raise ValueError(f"max_replacements must be at least 1, got {self.max_replacements}")
        if self.recovery_wait_seconds is not None and not 0 <= self.recovery_wait_seconds <= 600:
            raise ValueError(f"recovery_wait_seconds must be 0 to 600, got {self.recovery_wait_seconds}")




class _ReportStream:
    """A session's Report stream: results as quiet messages, confirmed by the tracker's count.

    `send` queues a report and returns at once, so a slot goes on to its next request. The tracker
    answers a quiet report by request id only when it refuses it or it is a duplicate (logged here)
    and confirms the others with ResultAck.received, the number of this stream's reports it has
    handled; a tracker of protocol 3 acks every report by request id, which confirms it as well.
    Reports not confirmed when the stream ends (it broke, the tracker predates it, the session
    closed) go to `resend`, which reports them with ReportResult: one that got through is answered
    as a duplicate, so nothing is counted twice and nothing confirmed is sent again.
    """

    def __init__(self, stub, metadata, resend, on_ack):
        self._out: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._unconfirmed: OrderedDict = OrderedDict()   # request id -> (position on the stream, report)
        self._sent = 0
        self._resend, self._on_ack = resend, on_ack
        self.broken = ""                  # why the stream cannot be used ("" while it can)
        self._call = stub.Report(iter(self._out.get, None), metadata=metadata)
        self._reader = threading.Thread(target=self._read_acks, daemon=True, name="report-acks")
        self._reader.start()

    def _read_acks(self) -> None:
        why = "the tracker ended the report stream"
        try:
            for ack in self._call:
                with self._lock:
                    if ack.request_id:       # refused, a duplicate, or (protocol 3) taken: handled
                        self._unconfirmed.pop(ack.request_id, None)
                    while self._unconfirmed and next(iter(self._unconfirmed.values()))[0] <= ack.received:
                        self._unconfirmed.popitem(last=False)
                if ack.request_id:
                    self._on_ack(ack)
        except grpc.RpcError as e:
            why = (f"the tracker has no Report stream ({e.details()})" if e.code() == grpc.StatusCode.UNIMPLEMENTED
                   else f"the report stream broke: {e.code().name}: {e.details()}")
        with self._lock:
            self.broken = self.broken or why
            left = [report for _, report in self._unconfirmed.values()]
            self._unconfirmed.clear()
        if left:
            log.info("%d report(s) not confirmed on the report stream (%s): reporting them again", len(left),
                     self.broken)
            self._resend(left)

    def send(self, report) -> bool:
        """Queue `report` on the stream; False when the stream cannot take it (use ReportResult)."""
        report.quiet = True
        with self._lock:
            if self.broken:
                return False
            self._sent += 1
            self._unconfirmed[report.result.request_id] = (self._sent, report)
        self._out.put(report)
        return True

    def finish(self, timeout: float) -> None:
        """Half-close and wait (up to `timeout`) for the tracker to confirm every report sent."""
        with self._lock:
            self.broken = self.broken or "the session is ending"
        self._out.put(None)
        self._reader.join(timeout)
        if self._reader.is_alive():
            self._call.cancel()
            self._reader.join(timeout)

    def close(self) -> None:
        with self._lock:
            self.broken = self.broken or "the session ended"
        self._out.put(None)
        self._call.cancel()


class _Session:
    """One registration: its Connect stream, the tracker's id for it, and the requests it holds."""

    def __init__(self, call, welcome, reports: _ReportStream | None = None):
        self.call = call
        self.reports = reports
        self.agent_id = welcome.agent_id
        self.heartbeat_seconds = welcome.heartbeat_seconds if welcome.heartbeat_seconds > 0 else 2.0
        self.tracker_protocol = welcome.protocol_version
        self.closed = threading.Event()
        self.wake = threading.Event()     # heartbeat now: the agent's health changed, or the session closed
        self._holding: set = set()
        self._lock = threading.Lock()

    def hold(self, request_id: str):
        with self._lock:
            self._holding.add(request_id)

    def release(self, request_id: str):
        with self._lock:
            self._holding.discard(request_id)

    def holding(self) -> list:
        with self._lock:
            return sorted(self._holding)

    def close(self):
        """Abandon the stream (the connection loop then registers again unless stopping)."""
        self.closed.set()
        self.wake.set()
        self.call.cancel()
        if self.reports is not None:
            self.reports.close()


@dataclass
class _Item:
    session: _Session
    work: object          # pb.Work
    received: float       # time.monotonic() when it arrived


class Agent:
    """The daemon. `run()` blocks until stopped and returns the process exit status."""

    def __init__(self, config: AgentConfig):
        self.config = config
        self.name = config.name or f"{socket.gethostname()}-{os.getpid()}"
        self.device = describe_host()
        if self.device["emulated"] and config.calibrate:
            # an emulator's speed is not a device's: under qemu-user every window's closing
            # calibration read 0.5-0.6 of the standard (the calibration kernels translated again
            # after a new kernel loads), so every window was measured again for nothing
            log.info("emulated host: windows are not calibrated (the emulator's speed says nothing of a device's)")
            self.config = config = replace(config, calibrate=False)
        self._metadata = auth_metadata(config.token)
        self._stop = threading.Event()        # SIGTERM/SIGINT: drain and leave
        self._refused = threading.Event()     # the tracker refused us for good
        self.refusal = ""
        self._queue: queue.Queue = queue.Queue()
        self._pending = 0                     # queued + running requests
        self._pending_cv = threading.Condition()
        self._session: _Session | None = None
        self._workers: list = []
        self._channel = None
        self._stub = None
        self.health = AgentHealth(self.name)
        self.health.on_change = self._health_changed

    # ------------------------------------------------------------------ public
    def request_stop(self, *_signal_args) -> None:
        """Ask the agent to drain and exit (safe from a signal handler)."""
        self._stop.set()

    def run(self) -> int:
        """Serve until stopped (EXIT_OK) or refused by the tracker (EXIT_REFUSED)."""
        dev = self.device
        log.info("agent %s (%s, %s, %d cores) joining the farm at %s under key %r with %d slot(s)",
                 self.name, dev["cpu"], dev["triple"], dev["cores"], self.config.tracker,
                 self.config.device_key, self.config.slots)
        self._channel = make_tracker_channel(self.config.tracker, self.config.tls_ca)
        self._stub = pb_grpc.TrackerStub(self._channel)
        ready = [threading.Event() for _ in range(self.config.slots)]
        for i, ev in enumerate(ready):
            threading.Thread(target=self._slot_loop, args=(i, ev), daemon=True, name=f"slot-{i}").start()
        for ev in ready:  # workers warm before the first request, so no lease pays their start-up
            ev.wait(self.config.worker_startup_seconds)
        conn = threading.Thread(target=self._connect_loop, daemon=True, name="connect")
        conn.start()
        while not self._stop.wait(0.2):
            if self._refused.is_set():
                log.error("%s", self.refusal)
                self._shutdown(wait_for_workers=True)
                return EXIT_REFUSED
        self._drain()
        conn.join(timeout=2.0)
        return EXIT_OK

    # ------------------------------------------------------------------ registration
    def _hello(self):
        hello = pb.Hello(protocol_version=PROTOCOL_VERSION, device_key=self.config.device_key,
                         device=pb.DeviceInfo(**self.device), slots=self.config.slots, name=self.name,
                         prefetch=self.config.prefetch)
        if self.config.calibrate:   # its state so far, and its recent calibrations for the host's history
            self.health.history.take_unsent()   # the newest of them are in the Hello
            hello.health.CopyFrom(self.health.message(pb, self.health.history.newest()))
        return hello

    def _health_changed(self) -> None:
        session = self._session
        log.log(logging.WARNING if self.health.state != "healthy" else logging.INFO,
                "agent health: %s (speed index %s)", self.health.state,
                f"{self.health.speed_index:.2f}" if self.health.speed_index is not None else "not judged yet")
        if session is not None:
            session.wake.set()

    def _connect_loop(self):
        """Register, serve the stream, and register again whenever it breaks, until stopped."""
        delay = self.config.backoff_initial_seconds
        failures = 0  # consecutive failed registrations: the first is a warning, the rest are routine
        while not self._stop.is_set():
            before = self._session
            try:
                self._serve_stream()
                reason = "the tracker closed the stream"
            except grpc.RpcError as e:
                code = e.code()
                if code in FATAL_CONNECT_CODES and not self._stop.is_set():
                    self.refusal = self._refusal_message(code, e.details())
                    self._refused.set()
                    return
                tls = tls_problem(e.details(), self.config.tls_ca) if code == grpc.StatusCode.UNAVAILABLE else ""
                if tls and not self._stop.is_set():
                    self.refusal = f"agent {self.name} cannot join the tracker at {self.config.tracker}: {tls}"
                    self._refused.set()
                    return
                reason = f"{code.name if code else 'error'}: {e.details()}"
            except _StreamEnded as e:
                reason = str(e)
            if self._stop.is_set():
                return
            if self._session is not before:  # this attempt was welcomed: start the backoff afresh
                delay, failures = self.config.backoff_initial_seconds, 0
            failures += 1
            pause = delay * random.uniform(0.5, 1.0)
            log.log(logging.WARNING if failures == 1 else logging.INFO,
                    "no connection to the tracker (%s); registering again in %.2f s", reason, pause)
            self._stop.wait(pause)
            delay = min(delay * 2.0, self.config.backoff_max_seconds)

    def _refusal_message(self, code, details) -> str:
        hint = {grpc.StatusCode.UNAUTHENTICATED: "check --token / $TUNEFARM_AGENT_TOKEN",
                grpc.StatusCode.PERMISSION_DENIED: "check --token / $TUNEFARM_AGENT_TOKEN",
                grpc.StatusCode.FAILED_PRECONDITION: "the tracker cannot serve this agent as it is",
                grpc.StatusCode.INVALID_ARGUMENT: "check --key and --name"}[code]
        return (f"the tracker at {self.config.tracker} refused agent {self.name}: {code.name}: {details} "
                f"({hint})")

    def _serve_stream(self) -> None:
        """One registration: read Welcome, then queue Work until the stream ends."""
        call = self._stub.Connect(self._hello(), metadata=self._metadata)
        try:
            first = next(call)
        except StopIteration:
            raise _StreamEnded("the tracker ended the stream before welcoming the agent") from None
        if first.WhichOneof("kind") != "welcome":
            call.cancel()
            raise _StreamEnded(f"the tracker's first message was {first.WhichOneof('kind')!r}, "
                                     f"not a welcome")
        session = _Session(call, first.welcome, _ReportStream(self._stub, self._metadata, self._resend,
                                                              self._log_ack))
        if first.welcome.history:   # this key's history on this host, as the tracker holds it
            self.health.history.merge([calibration_dict(c) for c in first.welcome.history])
        self._session = session
        log.info("registered with the tracker as %s (key %r, heartbeat every %.1f s, tracker protocol %d)",
                 session.agent_id, self.config.device_key, session.heartbeat_seconds,
                 session.tracker_protocol)
        threading.Thread(target=self._heartbeat_loop, args=(session,), daemon=True,
                         name="heartbeat").start()
        try:
            for msg in call:
                if msg.WhichOneof("kind") == "work":
                    log.debug("request %s received (lease %.1f s)", msg.work.request.request_id,
                              msg.work.lease_seconds)
                    session.hold(msg.work.request.request_id)  # held from now on, started or not
                    self._enqueue(_Item(session, msg.work, time.monotonic()))
                else:
                    log.warning("ignoring an unexpected %r message from the tracker", msg.WhichOneof("kind"))
        except grpc.RpcError as e:
            if session.closed.is_set() and e.code() == grpc.StatusCode.CANCELLED:
                raise _StreamEnded("the agent abandoned a connection the tracker stopped answering") from None
            raise
        finally:
            session.closed.set()
            session.reports.close()

    def _heartbeat_loop(self, session: _Session):
        """Heartbeat this session until it closes (at once when the agent's health changes, which
        it carries with the calibrations not yet reported); abandon it if the tracker stops answering."""
        period = session.heartbeat_seconds
        failing_since = None
        while True:
            session.wake.wait(period)
            session.wake.clear()
            if session.closed.is_set():
                return
            request = pb.HeartbeatRequest(agent_id=session.agent_id, holding=session.holding())
            sent = []
            if self.config.calibrate:
                sent = self.health.history.take_unsent()
                request.health.CopyFrom(self.health.message(pb, sent))
            try:
                self._stub.Heartbeat(request, metadata=self._metadata, timeout=max(period, 1.0))
                failing_since = None
                sent = []
            except grpc.RpcError as e:
                self.health.history.give_back(sent)
                if session.closed.is_set():
                    return
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    log.warning("the tracker no longer knows agent id %s (%s); registering again",
                                session.agent_id, e.details())
                    session.close()
                    return
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since >= 3 * period:
                    log.warning("heartbeats failing for %.1f s (%s: %s); registering again",
                                now - failing_since, e.code().name, e.details())
                    session.close()
                    return
            except ValueError:  # the channel was closed under us: shutting down
                return

    # ------------------------------------------------------------------ measuring
    def _enqueue(self, item: _Item):
        with self._pending_cv:
            self._pending += 1
        self._queue.put(item)

    def _slot_loop(self, index: int, ready: threading.Event):
        worker = WorkerProcess(startup_timeout=self.config.worker_startup_seconds)
        self._workers.append(worker)
        cfg = self.config
        # a window here is whatever requests were queued, of any jobs, each under its own lease and
        # timeout: they are timed one at a time, so each is answered within its own time
        calibrated = CalibratedWorker(worker, self.health.history, degrade_after=cfg.degrade_after,
                                      max_replacements=cfg.max_replacements, recovery_wait=cfg.recovery_wait_seconds,
                                      interleave=False) if cfg.calibrate else None
        try:
            worker.start()
            if calibrated is not None:
                self._calibrate(index, calibrated, start=True)
        except RuntimeError as e:  # each request will try again and report RUNNER_ERROR if it fails
            log.error("slot %d: %s", index, e)
        ready.set()
        while True:
            try:
                item = self._queue.get(timeout=cfg.recheck_seconds if calibrated is not None else None)
            except queue.Empty:   # idle for a recheck period: calibrate again
                self._calibrate(index, calibrated)
                continue
            if item is None:
                return
            window, last = self._window(item)
            try:
                self._handle_window(index, window, worker, calibrated)
            except Exception:  # noqa: BLE001 - a bug here must not take the slot down
                log.exception("slot %d: failed handling requests %s", index,
                              [i.work.request.request_id for i in window])
            finally:
                with self._pending_cv:
                    self._pending -= len(window)
                    self._pending_cv.notify_all()
            if last:
                return

    def _window(self, first: _Item) -> tuple[list, bool]:
        """`first` and the requests already queued behind it (window_requests at most), and whether
        the slot was told to stop meanwhile (it took its None: the slot ends after this window)."""
        window = [first]
        while len(window) < self.config.window_requests:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                return window, True
            window.append(item)
        return window, False

    def _calibrate(self, index: int, calibrated: CalibratedWorker, start: bool = False) -> None:
        """A starting (with a history filled to judge by) or idle calibration of a slot's worker."""
        try:
            if start:
                calibrated.start()          # with a history filled to judge by, where it is short
            else:
                calibrated.recheck()
        except RuntimeError as e:   # the worker would not start: its requests report that
            log.error("slot %d: calibration failed: %s", index, e)
        self.health.update(index, calibrated.report)

    def _handle_window(self, index: int, window: list, worker: WorkerProcess, calibrated):
        """Measure a window of requests (calibrated around: device_agent.calibration), then report
        each. A request whose connection is gone is dropped (its lease brings it back elsewhere);
        one this host cannot run, or with bad options, is answered without being measured."""
        answers: dict = {}
        todo = []
        for item in window:
            req = item.work.request
            if item.session.closed.is_set():
                log.info("dropping request %s: its connection is gone (the tracker hands it out again)",
                         req.request_id)
                item.session.release(req.request_id)
                continue
            problem = self._refusal(req)
            if problem is not None:
                answers[id(item)] = problem
            else:
                todo.append(item)
        try:
            if todo:
                requests = [self._request(i.work.request) for i in todo]
                if calibrated is not None:
                    measured = calibrated.measure_window(requests)
                    self.health.update(index, calibrated.report)
                else:
                    measured = [worker.run(req, timeout) for req, timeout in requests]
                answers.update({id(i): a for i, a in zip(todo, measured)})
            for item in window:
                if id(item) in answers:
                    self._answer(item, answers[id(item)])
        finally:
            for item in window:
                item.session.release(item.work.request.request_id)

    def _answer(self, item: _Item, answer: dict) -> None:
        """Report one measured (or refused) request on its session."""
        req = item.work.request
        result = pb.MeasureResult(request_id=req.request_id, costs=answer["costs"],
                                  error_code=int(answer["error_code"]), error_msg=answer["error_msg"],
                                  run_seconds=float(answer["run_seconds"]), agent=self.name,
                                  emulated=bool(self.device["emulated"]),
                                  slow_window=bool(answer.get("slow_window", False)),
                                  remeasured=bool(answer.get("remeasured", False)),
                                  slow_index=float(answer.get("slow_index") or 0.0))
        timing = answer.get("timing")
        if timing:
            # the worker's summary has every field of the message (and a few more for logs)
            result.timing.CopyFrom(pb.Timing(**{f.name: timing[f.name] for f in pb.Timing.DESCRIPTOR.fields}))
        log.debug("request %s: error code %d, %d costs, %.3f s%s", req.request_id, result.error_code,
                  len(result.costs), result.run_seconds,
                  " (slow window)" if result.slow_window else " (re-measured)" if result.remeasured else "")
        # retried within its lease, or for one call's time when the lease has run past its first
        # length (the tracker renews it while this agent's heartbeats name the request)
        deadline = max(item.received + max(item.work.lease_seconds, 1.0),
                       time.monotonic() + self.config.call_timeout_seconds)
        self._report(item.session, result, deadline=deadline)

    def _refusal(self, req) -> dict | None:
        """The answer to a request that is not measured (a target this host cannot run, bad
        options), or None when it is to be measured."""
        problem = target_problem(req.target)
        if problem:
            dev = self.device
            return {"costs": [], "error_code": UNSUPPORTED_TARGET, "run_seconds": 0.0,
                    "error_msg": f"agent {self.name} ({dev['cpu']}, {dev['triple']}) cannot run target "
                                 f"{req.target!r}: {problem}"}
        try:
            MeasureOptions.from_proto(req.options)
        except ValueError as e:
            return {"costs": [], "error_code": RUNNER_ERROR, "run_seconds": 0.0, "error_msg": f"bad measure options: {e}"}
        return None

    @staticmethod
    def _request(req) -> tuple[MeasureRequest, float]:
        """(the worker's MeasureRequest, its run timeout) of a protocol MeasureRequest."""
        options = MeasureOptions.from_proto(req.options)
        return MeasureRequest(req.kernel, req.reference_kernel or None, req.num_inputs, options), options.timeout

    def _report(self, session: _Session, result, deadline: float):
        """On the session's Report stream (confirmed later, or reported again if it breaks); else
        ReportResult, retrying a tracker that is briefly unreachable until the lease runs out."""
        report = pb.ResultReport(agent_id=session.agent_id, result=result)
        if session.reports is not None and session.reports.send(report):
            return
        self._report_call(report, deadline)

    def _resend(self, reports: list) -> None:
        """Reports a Report stream could not confirm, again with ReportResult (a few tries each)."""
        for report in reports:
            self._report_call(report, time.monotonic() + self.config.call_timeout_seconds)

    @staticmethod
    def _log_ack(ack) -> None:
        """What an ack naming a report says: a refusal or a duplicate (an OK ack says nothing)."""
        code = _STATUS_BY_NUMBER.get(ack.status, grpc.StatusCode.UNKNOWN)
        if code == grpc.StatusCode.OK:
            if ack.duplicate:
                log.info("request %s was already answered (an earlier report of it, or another agent); result dropped",
                         ack.request_id)
        elif code == grpc.StatusCode.NOT_FOUND:
            log.warning("result of request %s not taken: the tracker no longer knows this connection (%s); "
                        "it is measured again", ack.request_id, ack.detail)
        else:
            log.warning("result of request %s not taken: %s: %s", ack.request_id, code.name, ack.detail)

    def _report_call(self, report, deadline: float) -> None:
        result = report.result
        pause = 0.1
        while True:
            try:
                ack = self._stub.ReportResult(report, metadata=self._metadata, timeout=self.config.call_timeout_seconds)
                if ack.duplicate:
                    log.info("request %s was already answered (an earlier report of it, or another agent); "
                             "result dropped", result.request_id)
                return
            except ValueError:  # the channel was closed: shutting down past the grace period
                return
            except grpc.RpcError as e:
                code = e.code()
                if code == grpc.StatusCode.NOT_FOUND:  # the tracker restarted or dropped this connection
                    log.warning("result of request %s not taken: the tracker no longer knows this connection "
                                "(%s); it is measured again (requeued by the tracker, or submitted again by its "
                                "tuner)", result.request_id, e.details())
                    return
                if code == grpc.StatusCode.FAILED_PRECONDITION:  # the lease went to another agent
                    log.warning("result of request %s not taken: %s", result.request_id, e.details())
                    return
                retryable = code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                if not retryable or time.monotonic() + pause > deadline:
                    log.warning("could not report request %s: %s: %s", result.request_id, code.name, e.details())
                    return
                time.sleep(pause)
                pause = min(pause * 2.0, 1.0)

    # ------------------------------------------------------------------ leaving
    def _drain(self):
        """Tell the tracker to send nothing more, finish what is held (within the grace period)."""
        session = self._session
        if session is not None and not session.closed.is_set():
            try:
                self._stub.Drain(pb.DrainRequest(agent_id=session.agent_id), metadata=self._metadata,
                                 timeout=self.config.call_timeout_seconds)
            except grpc.RpcError as e:
                log.warning("drain call failed (%s: %s); finishing held requests anyway",
                            e.code().name, e.details())
        grace = self.config.drain_grace_seconds
        deadline = time.monotonic() + grace
        with self._pending_cv:
            if self._pending:
                log.info("draining: finishing %d request(s) (grace %.0f s)", self._pending, grace)
            while self._pending and time.monotonic() < deadline:
                self._pending_cv.wait(min(0.2, max(deadline - time.monotonic(), 0.0)))
            left = self._pending
        if left:
            log.warning("drain grace of %.0f s is over with %d request(s) unfinished; leaving them to "
                        "the tracker's leases", grace, left)
        elif session is not None and session.reports is not None and not session.closed.is_set():
            # every result is on the stream: wait for the tracker to confirm them (or re-send them)
            session.reports.finish(max(1.0, min(self.config.call_timeout_seconds, deadline - time.monotonic())))
        self._shutdown(wait_for_workers=not left)
        log.info("agent %s stopped", self.name)

    def _shutdown(self, wait_for_workers: bool):
        session = self._session
        if session is not None:
            session.close()
        for _ in range(self.config.slots):
            self._queue.put(None)
        if wait_for_workers:
            for w in list(self._workers):
                w.close()
        # otherwise a worker is still busy with a kernel: it exits by itself when this process is
        # gone (device_agent.worker watches its parent)
        if self._channel is not None:
            self._channel.close()


class _StreamEnded(Exception):
    """A registration ended without a gRPC error worth naming (retried like a broken stream)."""
