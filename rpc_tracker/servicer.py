"""The Tracker gRPC service: checks tokens and messages, then hands over to TrackerState.

Every rule of the farm lives in state.py; this module only authenticates, validates messages
(INVALID_ARGUMENT with a message naming the field), converts protobuf <-> state data and maps
the state's typed errors to gRPC status codes. A bad call gets its own status and touches nothing
else, so the tracker keeps serving everyone else.

The servicer runs on grpc's asyncio server, every call a coroutine on one event loop thread
(server.py): a request's whole path (the agent's ReportResult, the dispatch of the next request,
the Work pushed down the next agent's stream, the result pushed down the tuner's Measure stream)
runs on that thread without handing anything to another thread. With the thread-pool server each
of those hops was a thread wake-up and a GIL hand-off, and they, not the farm's rules, were where
the tracker's time went (bench/farm_throughput.py, 64 light agents).

Streams: Connect and Measure are server streams. Each waits on its own asyncio.Event, which the
state sets (through the `wake` callable given to register_agent / submit) when there is work to
push, results to send, or a reason to end; it then takes what is there without blocking. When a
client goes away, grpc cancels its call's coroutine, and the `finally` drops the agent (its leases
are requeued) or detaches the tuner's waiter (its requests stay queued and their results are
cached for a re-submission).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import re
import threading
from typing import Callable

import grpc
from google.protobuf.message import DecodeError

from compiler.measure_options import MeasureOptions

from . import state as st
from .health import report_of
from .protocol import (
    ACK_INTERVAL_SECONDS,
    AUTH_METADATA_KEY,
    MAX_PACKED_RESULTS,
    MIN_AGENT_PROTOCOL,
    PROTOCOL_VERSION,
    llvmlite_problem,
    pb,
    pb_grpc,
)
from .targets import DeviceSpec

log = logging.getLogger("rpc_tracker")

AGENT, TUNER, ANYONE = "agent", "tuner", "anyone"

STATUS_OF = {
    st.InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    st.UnknownAgent: grpc.StatusCode.NOT_FOUND,
    st.UnknownDeviceKey: grpc.StatusCode.NOT_FOUND,
    st.NotHeld: grpc.StatusCode.FAILED_PRECONDITION,
    st.TargetNotRunnable: grpc.StatusCode.FAILED_PRECONDITION,
    st.EmulationMismatch: grpc.StatusCode.FAILED_PRECONDITION,
    st.TrackerClosed: grpc.StatusCode.UNAVAILABLE,
    st.AgentGone: grpc.StatusCode.UNAVAILABLE,
}

_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,63}$")
MAX_BATCH = 10_000
MAX_REQUEST_ID = 256
MAX_TIMEOUT_SECONDS = 24 * 3600.0
MAX_ERROR_CODE = 8        # tuner.candidate.ErrorCode.UNSUPPORTED_TARGET, the last one


def _tracker_version() -> str:
    try:
        from importlib.metadata import version
        return version("tunefarm")
    except Exception:  # noqa: BLE001 - running from a checkout that is not installed
        return "unknown"


def check_device_key(key: str, what: str = "device_key") -> str | None:
    """None if `key` is a valid device key, else the message for INVALID_ARGUMENT."""
    if not key:
        return f"{what} is empty; give the device key, e.g. x86-avx512 or rpi4"
    if not _KEY_RE.match(key):
        return (f"{what} {key[:80]!r} is not a valid device key: 1-64 characters, letters, digits and ._:+- "
                "starting with a letter or digit")
    return None


_CODE_NUMBER = {c: c.value[0] for c in grpc.StatusCode}  # (StatusCode.value is a slow enum property)


def _finite_nonneg(x: float) -> bool:
    return math.isfinite(x) and x >= 0


def _work_message(request: pb.MeasureRequest, reference: bytes | None, lease_seconds: float) -> pb.TrackerMessage:
    """The Work an agent is handed: the whole request, its shared reference (if any) put back in."""
    msg = pb.TrackerMessage()
    work = msg.work
    work.request.CopyFrom(request)
    work.lease_seconds = lease_seconds
    if reference is not None:
        work.request.reference_kernel = reference
        work.request.reference_index = 0
    return msg


def _result_message(res: st.Result) -> pb.MeasureResult:
    extra = {"timing": res.timing} if res.timing is not None else {}
    return pb.MeasureResult(request_id=res.request_id, costs=res.costs, error_code=res.error_code,
                            error_msg=res.error_msg, run_seconds=res.run_seconds, agent=res.agent,
                            attempts=res.attempts, emulated=res.emulated, slow_window=res.slow_window,
                            remeasured=res.remeasured, slow_index=res.slow_index, **extra)


def _health(message, where: str):
    """(HealthReport or None when the message has no health, the INVALID_ARGUMENT text or None)."""
    if not message.HasField("health"):
        return None, None
    try:
        return report_of(message.health, where), None
    except ValueError as e:
        return None, str(e)


class TrackerServicer(pb_grpc.TrackerServicer):
    """The Tracker service on grpc.aio: every method is a coroutine on the server's event loop."""

    def __init__(self, state: st.TrackerState, *, agent_token: str | None = None, tuner_token: str | None = None,
                 heartbeat_seconds: float = 2.0):
        self.state = state
        self.agent_token, self.tuner_token = agent_token, tuner_token
        self._wanted = {AGENT: (agent_token,), TUNER: (tuner_token,), ANYONE: (agent_token, tuner_token)}
        self.heartbeat_seconds = heartbeat_seconds
        self.version = _tracker_version()

    # ------------------------------------------------------------------ helpers

    async def _auth(self, context, role: str) -> None:
        """Abort with UNAUTHENTICATED unless the call carries the token `role` needs (None = open)."""
        wanted = self._wanted[role]
        if None in wanted:
            return
        given = None
        for k, v in context.invocation_metadata() or ():
            if k == AUTH_METADATA_KEY:
                given = v[len("Bearer "):] if v.startswith("Bearer ") else v
        if given is not None:
            for token in wanted:
                if hmac.compare_digest(given.encode(), token.encode()):
                    return
        who = {AGENT: "agent", TUNER: "tuner", ANYONE: "agent or tuner"}[role]
        detail = "no token was given" if given is None else "the token does not match"
        # the operator's side of the refusal (the caller gets the same words in its error)
        log.warning("refused a call from %s: %s token refused: %s", context.peer(), who, detail)
        await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                            f"{who} token refused: {detail} (metadata 'authorization: Bearer <token>')")

    async def _fail(self, context, err: st.TrackerError):
        await context.abort(STATUS_OF.get(type(err), grpc.StatusCode.INTERNAL), str(err))

    @staticmethod
    def _waker(event: asyncio.Event) -> Callable[[], None]:
        """A `wake` for the state: sets `event` on this loop, from this loop's thread or any other
        (the state is also called by TrackerServer.stop and by tests from other threads)."""
        loop = asyncio.get_running_loop()
        home = threading.get_ident()

        def wake() -> None:
            if threading.get_ident() == home:
                event.set()
            else:
                loop.call_soon_threadsafe(event.set)
        return wake

    # ------------------------------------------------------------------ agents

    async def Connect(self, request: pb.Hello, context):
        await self._auth(context, AGENT)
        if request.protocol_version < MIN_AGENT_PROTOCOL:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"agent protocol {request.protocol_version} is older than this tracker's minimum "
                                f"{MIN_AGENT_PROTOCOL}; upgrade tunefarm on the agent")
        bad = check_device_key(request.device_key, "Hello.device_key")
        if bad:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, bad)
        d = request.device
        if not d.triple:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "Hello.device.triple is empty; the tracker needs it to tell which targets the agent "
                                "can run")
        problem = llvmlite_problem(d.llvmlite_version)
        if problem:
            log.warning("refused agent %r (key %s): %s", request.name, request.device_key, problem)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, problem)
        health, bad = _health(request, "Hello.health")
        if bad:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, bad)
        device = DeviceSpec.make(d.triple, d.cpu, d.features, d.cores, d.memory_bytes, d.agent_version, d.hostname,
                                 d.emulated, d.llvmlite_version)
        ready = asyncio.Event()
        try:
            agent_id = self.state.register_agent(request.name, request.device_key, device,
                                                 min(max(1, request.slots), 1024), wake=self._waker(ready),
                                                 prefetch=request.prefetch, health=health)
        except st.TrackerError as e:
            await self._fail(context, e)
        try:
            # the calibrations of this key on this host: what the agent judges its workers against
            history = self.state.host_history(request.device_key, device.hostname)
            await context.write(pb.TrackerMessage(welcome=pb.Welcome(
                agent_id=agent_id, heartbeat_seconds=self.heartbeat_seconds, protocol_version=PROTOCOL_VERSION,
                history=history)))
            while True:
                ready.clear()  # before taking: a wake from now on is not lost
                try:
                    items = self.state.next_work(agent_id, 0)
                except st.AgentGone as e:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
                for item in items:
                    await context.write(_work_message(*item.payload, item.lease_seconds))
                if not items:
                    await ready.wait()
        finally:  # the agent left, was dropped, or the call was cancelled: its leases are requeued
            self.state.remove_agent(agent_id, "its stream closed")

    async def Heartbeat(self, request: pb.HeartbeatRequest, context):
        await self._auth(context, AGENT)
        health, bad = _health(request, "HeartbeatRequest.health")
        if bad:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, bad)
        try:
            self.state.heartbeat(request.agent_id, request.holding, health)
        except st.TrackerError as e:
            await self._fail(context, e)
        return pb.HeartbeatReply()

    def _take_report(self, request: pb.ResultReport) -> tuple[grpc.StatusCode, str, bool]:
        """Check and take one agent's result: (status, why, duplicate); OK when it was taken."""
        r = request.result
        bad = None
        if not request.agent_id:
            bad = "ResultReport.agent_id is empty; quote the agent_id of the Welcome message"
        elif not request.HasField("result") or not r.request_id:
            bad = "ResultReport.result.request_id is empty"
        elif not 0 <= r.error_code <= MAX_ERROR_CODE:
            bad = f"result of {r.request_id!r}: error_code {r.error_code} is not a tunefarm error code (0-{MAX_ERROR_CODE})"
        elif r.error_code == st.NO_ERROR and not r.costs:
            bad = f"result of {r.request_id!r}: no error but no costs; a measured request has one cost per repeat"
        elif not all(_finite_nonneg(c) for c in r.costs):
            bad = f"result of {r.request_id!r}: costs must be finite non-negative seconds"
        elif not _finite_nonneg(r.run_seconds):
            bad = f"result of {r.request_id!r}: run_seconds must be finite and non-negative"
        elif not _finite_nonneg(r.slow_index):
            bad = f"result of {r.request_id!r}: slow_index must be finite and non-negative"
        if bad:
            return grpc.StatusCode.INVALID_ARGUMENT, bad, False
        result = st.Result(r.request_id, list(r.costs), r.error_code, r.error_msg, r.run_seconds, r.agent,
                           timing=r.timing if r.HasField("timing") else None, emulated=r.emulated,
                           slow_window=r.slow_window, remeasured=r.remeasured, slow_index=r.slow_index)
        try:
            return grpc.StatusCode.OK, "", self.state.report_result(request.agent_id, result)
        except st.TrackerError as e:
            return STATUS_OF.get(type(e), grpc.StatusCode.INTERNAL), str(e), False

    async def ReportResult(self, request: pb.ResultReport, context):
        await self._auth(context, AGENT)
        code, why, duplicate = self._take_report(request)
        if code != grpc.StatusCode.OK:
            await context.abort(code, why)
        return pb.ResultAck(duplicate=duplicate)

    async def Report(self, requests, context):
        """ReportResult's work for every message of the stream, each answered by an ack naming it;
        a quiet report only when it is refused or a duplicate, the others by the count in
        ResultAck.received, sent within ACK_INTERVAL_SECONDS of taking them and when the agent
        half-closes (one ack message per report was a third of what the tracker wrote per request).
        Writes are serialized by a lock: the count may be sent by a timer while the loop reads."""
        await self._auth(context, AGENT)
        loop = asyncio.get_running_loop()
        writing = asyncio.Lock()
        received = confirmed = 0      # reports handled; the count the agent was last told
        timer: asyncio.TimerHandle | None = None
        ended = False

        async def confirm() -> None:
            nonlocal confirmed
            async with writing:
                if confirmed < received and not ended:
                    n = received
                    try:
                        await context.write(pb.ResultAck(received=n))
                    except Exception:  # noqa: BLE001 - the stream ended meanwhile: the agent re-sends
                        return
                    confirmed = max(confirmed, n)

        def on_timer() -> None:
            nonlocal timer
            timer = None
            asyncio.ensure_future(confirm())

        try:
            async for raw in requests:
                try:
                    request = pb.ResultReport.FromString(raw)
                except DecodeError as e:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"a ResultReport message does not parse: {e}")
                received += 1
                code, why, duplicate = self._take_report(request)
                if not request.quiet or duplicate or code != grpc.StatusCode.OK:
                    n = received
                    async with writing:
                        await context.write(pb.ResultAck(duplicate=duplicate, request_id=request.result.request_id,
                                                         status=_CODE_NUMBER[code], detail=why, received=n))
                        confirmed = max(confirmed, n)
                elif timer is None:
                    timer = loop.call_later(ACK_INTERVAL_SECONDS, on_timer)
            if timer is not None:
                timer.cancel()
            await confirm()  # the agent half-closed: confirm the last quiet reports
        finally:
            ended = True
            if timer is not None:
                timer.cancel()

    async def Drain(self, request: pb.DrainRequest, context):
        await self._auth(context, AGENT)
        try:
            self.state.drain(request.agent_id)
        except st.TrackerError as e:
            await self._fail(context, e)
        return pb.DrainReply()

    # ------------------------------------------------------------------ tuners

    def _validate_batch(self, batch: pb.MeasureBatch) -> str | None:
        bad = check_device_key(batch.device_key, "MeasureBatch.device_key")
        if bad:
            return bad
        if not batch.requests:
            return "MeasureBatch.requests is empty; submit at least one request"
        if len(batch.requests) > MAX_BATCH:
            return f"a batch holds at most {MAX_BATCH} requests, got {len(batch.requests)}; split it"
        refs = len(batch.references)
        for j, ref in enumerate(batch.references):
            if not ref:
                return f"references[{j}] is empty; send compiler.runtime.Kernel.to_bytes() of the reference"
        seen = set()
        passed = None   # the last options that passed: a batch's requests mostly share theirs
        for i, r in enumerate(batch.requests):
            rid = r.request_id
            if not rid:
                return f"request #{i}: request_id is empty"
            if len(rid) > MAX_REQUEST_ID:
                return f"request #{i}: request_id is longer than {MAX_REQUEST_ID} characters"
            if rid in seen:
                return f"request id {rid!r} appears twice in the batch; request ids must be unique"
            seen.add(rid)
            if not r.target and not batch.target:
                return f"request {rid!r}: target is empty (and the batch gives none)"
            if not r.kernel:
                return f"request {rid!r}: kernel is empty; send compiler.runtime.Kernel.to_bytes() of the candidate"
            if r.reference_index > refs:
                return (f"request {rid!r}: reference_index {r.reference_index} names no reference; the batch "
                        f"has {refs} (the index counts from 1)")
            if r.reference_index and r.reference_kernel:
                return f"request {rid!r}: give its reference either as reference_kernel or by reference_index, not both"
            o = r.options
            if passed is None or o != passed:   # (a message compare costs a tenth of the check)
                try:
                    MeasureOptions.from_proto(o)   # the bounds every edge checks (compiler.option_fields)
                except ValueError as e:
                    return f"request {rid!r}: options.{e}"
                passed = o
            if o.timeout_seconds > MAX_TIMEOUT_SECONDS:
                return f"request {rid!r}: options.timeout_seconds {o.timeout_seconds:g} is over {MAX_TIMEOUT_SECONDS:g}"
        return None

    async def Measure(self, request: pb.MeasureBatch, context):
        await self._auth(context, TUNER)
        bad = self._validate_batch(request)
        if bad:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, bad)
        subs = []
        # Agents get whole requests: a shared reference goes into each Work message as it is sent
        # (Connect), the batch's target into each request here (the state matches it to agents).
        refs = list(request.references)  # each read of a repeated bytes field makes a new bytes object
        target = request.target
        for r in request.requests:
            ref = refs[r.reference_index - 1] if r.reference_index else None
            if not r.target:
                r.target = target
            if r.options.timeout_seconds <= 0:  # the agent and the lease must agree on the run timeout
                r.options.timeout_seconds = self.state.default_timeout
            subs.append(st.Submission(r.request_id, r.target, r.options.timeout_seconds, (r, ref)))
        pack = request.pack_results
        ready = asyncio.Event()
        try:
            waiter = self.state.submit(request.device_key, request.priority, subs, wake=self._waker(ready))
        except st.TrackerError as e:
            await self._fail(context, e)
        try:
            while True:
                ready.clear()  # before taking: a wake from now on is not lost
                try:
                    results = self.state.wait_results(waiter, 0)
                except st.TrackerClosed as e:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
                if pack:  # every result in hand in one message (at most MAX_PACKED_RESULTS each)
                    for i in range(0, len(results), MAX_PACKED_RESULTS):
                        chunk = [_result_message(res) for res in results[i:i + MAX_PACKED_RESULTS]]
                        head = chunk[0]
                        head.more.extend(chunk[1:])
                        await context.write(head)
                else:
                    for res in results:
                        await context.write(_result_message(res))
                if self.state.finished(waiter):
                    return
                if not results:
                    await ready.wait()
        finally:  # answered, or the tuner went away: its requests stay queued, their results cached
            self.state.detach(waiter)

    # ------------------------------------------------------------------ everyone

    async def Summary(self, request: pb.SummaryRequest, context):
        await self._auth(context, ANYONE)
        snap = self.state.snapshot()
        out = pb.FarmSummary(protocol_version=PROTOCOL_VERSION, tracker_version=self.version,
                             uptime_seconds=snap.uptime_seconds)
        for a in snap.agents:
            d = a.device
            out.agents.add(agent_id=a.agent_id, name=a.name, device_key=a.device_key,
                           device=pb.DeviceInfo(triple=d.triple, cpu=d.cpu, features=sorted(d.features),
                                                cores=d.cores, memory_bytes=d.memory_bytes,
                                                agent_version=d.agent_version, hostname=d.hostname,
                                                emulated=d.emulated, llvmlite_version=d.llvmlite_version),
                           slots=a.slots, in_flight=a.in_flight, completed=a.completed, failed=a.failed,
                           leases_lost=a.leases_lost, connected_seconds=a.connected_seconds,
                           last_seen_seconds_ago=a.last_seen_seconds_ago, draining=a.draining,
                           health=a.health.state, speed_index=a.health.speed_index or 0.0,
                           slow_windows=a.health.slow_windows, remeasured=a.health.remeasured,
                           replacements=a.health.replacements)
        for k in snap.keys:
            out.keys.add(device_key=k.device_key, agents=k.agents, queued=k.queued, in_flight=k.in_flight,
                         completed=k.completed, degraded=k.degraded)
        return out


# ----------------------------------------------------------------------------- registration

SERVICE = pb.DESCRIPTOR.services_by_name["Tracker"].full_name
_METHODS = {  # name -> (handler kind, request type, response type)
    "Connect": (grpc.unary_stream_rpc_method_handler, pb.Hello, pb.TrackerMessage),
    "Heartbeat": (grpc.unary_unary_rpc_method_handler, pb.HeartbeatRequest, pb.HeartbeatReply),
    "ReportResult": (grpc.unary_unary_rpc_method_handler, pb.ResultReport, pb.ResultAck),
    "Drain": (grpc.unary_unary_rpc_method_handler, pb.DrainRequest, pb.DrainReply),
    "Measure": (grpc.unary_stream_rpc_method_handler, pb.MeasureBatch, pb.MeasureResult),
    "Summary": (grpc.unary_unary_rpc_method_handler, pb.SummaryRequest, pb.FarmSummary),
}
_STREAMS_IN = {"Report": (grpc.stream_stream_rpc_method_handler, pb.ResultAck)}  # parse each message itself


def _parsing(method, request_type):
    """`method` behind our own parse of the request bytes: grpc.aio answers a request that does not
    parse with UNKNOWN ("Unexpected DecodeError"); the caller should hear INVALID_ARGUMENT."""
    name = request_type.DESCRIPTOR.name

    async def handler(raw: bytes, context):
        try:
            request = request_type.FromString(raw)
        except DecodeError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the {name} message does not parse: {e}")
        return await method(request, context)
    return handler


def add_to_server(servicer: TrackerServicer, server) -> None:
    """Register the Tracker service's methods on a grpc.aio server (in place of the generated
    add_TrackerServicer_to_server, which lets grpc parse the requests)."""
    handlers = {name: kind(_parsing(getattr(servicer, name), req), request_deserializer=None,
                           response_serializer=resp.SerializeToString)
                for name, (kind, req, resp) in _METHODS.items()}
    for name, (kind, resp) in _STREAMS_IN.items():
        handlers[name] = kind(getattr(servicer, name), request_deserializer=None,
                              response_serializer=resp.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)
