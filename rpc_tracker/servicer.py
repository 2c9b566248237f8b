"""The Tracker gRPC service: checks tokens and messages, then hands over to TrackerState.

Every rule of the farm lives in state.py; this module only authenticates, validates messages
(INVALID_ARGUMENT with a message naming the field), converts protobuf <-> state data and maps
the state's typed errors to gRPC status codes. A bad call gets its own status and touches nothing
else, so the tracker keeps serving everyone else.

Streams: Connect and Measure are server streams, each holding one thread of the server's pool
while it waits on its own Condition (woken by dispatch or by a result, with a short timeout to
notice a client that went away). When a client goes away, the callback registered with
`context.add_callback` drops the agent (its leases are requeued) or detaches the tuner's waiter
(its requests stay queued and their results are cached for a re-submission).
"""

from __future__ import annotations

import hmac
import logging
import math
import re

import grpc

from . import state as st
from .protocol import AUTH_METADATA_KEY, MIN_AGENT_PROTOCOL, PROTOCOL_VERSION, llvmlite_problem, pb, pb_grpc
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
WAIT_SLICE = 0.25         # how often a waiting stream checks that its client is still there


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


def _finite_nonneg(x: float) -> bool:
    return math.isfinite(x) and x >= 0


class TrackerServicer(pb_grpc.TrackerServicer):
    def __init__(self, state: st.TrackerState, *, agent_token: str | None = None, tuner_token: str | None = None,
                 heartbeat_seconds: float = 2.0):
        self.state = state
        self.agent_token, self.tuner_token = agent_token, tuner_token
        self.heartbeat_seconds = heartbeat_seconds
        self.version = _tracker_version()

    # ------------------------------------------------------------------ helpers

    def _auth(self, context, role: str) -> None:
        """Abort with UNAUTHENTICATED unless the call carries the token `role` needs (None = open)."""
        given = None
        for k, v in context.invocation_metadata():
            if k == AUTH_METADATA_KEY:
                given = v[len("Bearer "):] if v.startswith("Bearer ") else v
        wanted = {AGENT: [self.agent_token], TUNER: [self.tuner_token],
                  ANYONE: [self.agent_token, self.tuner_token]}[role]
        for token in wanted:
            if token is None or (given is not None and hmac.compare_digest(given.encode(), token.encode())):
                return
        who = {AGENT: "agent", TUNER: "tuner", ANYONE: "agent or tuner"}[role]
        detail = "no token was given" if given is None else "the token does not match"
        # the operator's side of the refusal (the caller gets the same words in its error)
        log.warning("refused a call from %s: %s token refused: %s", context.peer(), who, detail)
        context.abort(grpc.StatusCode.UNAUTHENTICATED,
                      f"{who} token refused: {detail} (metadata 'authorization: Bearer <token>')")

    def _fail(self, context, err: st.TrackerError):
        context.abort(STATUS_OF.get(type(err), grpc.StatusCode.INTERNAL), str(err))

    # ------------------------------------------------------------------ agents

    def Connect(self, request: pb.Hello, context):
        self._auth(context, AGENT)
        if request.protocol_version < MIN_AGENT_PROTOCOL:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"agent protocol {request.protocol_version} is older than this tracker's minimum "
                          f"{MIN_AGENT_PROTOCOL}; upgrade tunefarm on the agent")
        bad = check_device_key(request.device_key, "Hello.device_key")
        if bad:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, bad)
        d = request.device
        if not d.triple:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "Hello.device.triple is empty; the tracker needs it to tell which targets the agent can run")
        problem = llvmlite_problem(d.llvmlite_version)
        if problem:
            log.warning("refused agent %r (key %s): %s", request.name, request.device_key, problem)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, problem)
        device = DeviceSpec.make(d.triple, d.cpu, d.features, d.cores, d.memory_bytes, d.agent_version, d.hostname,
                                 d.emulated, d.llvmlite_version)
        try:
            agent_id = self.state.register_agent(request.name, request.device_key, device,
                                                 min(max(1, request.slots), 1024))
        except st.TrackerError as e:
            self._fail(context, e)
        if not context.add_callback(lambda: self.state.remove_agent(agent_id, "its stream closed")):
            self.state.remove_agent(agent_id, "its stream closed before it started")
            return
        yield pb.TrackerMessage(welcome=pb.Welcome(agent_id=agent_id, heartbeat_seconds=self.heartbeat_seconds,
                                                   protocol_version=PROTOCOL_VERSION))
        while True:
            try:
                items = self.state.next_work(agent_id, WAIT_SLICE)
            except st.AgentGone as e:
                if context.is_active():
                    context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
                return
            for item in items:
                yield pb.TrackerMessage(work=pb.Work(request=item.payload, lease_seconds=item.lease_seconds))
            if not context.is_active():
                return

    def Heartbeat(self, request: pb.HeartbeatRequest, context):
        self._auth(context, AGENT)
        try:
            self.state.heartbeat(request.agent_id, request.holding)
        except st.TrackerError as e:
            self._fail(context, e)
        return pb.HeartbeatReply()

    def ReportResult(self, request: pb.ResultReport, context):
        self._auth(context, AGENT)
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
        if bad:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, bad)
        result = st.Result(r.request_id, list(r.costs), r.error_code, r.error_msg, r.run_seconds, r.agent,
                           timing=r.timing if r.HasField("timing") else None, emulated=r.emulated)
        try:
            duplicate = self.state.report_result(request.agent_id, result)
        except st.TrackerError as e:
            self._fail(context, e)
        return pb.ResultAck(duplicate=duplicate)

    def Drain(self, request: pb.DrainRequest, context):
        self._auth(context, AGENT)
        try:
            self.state.drain(request.agent_id)
        except st.TrackerError as e:
            self._fail(context, e)
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
        seen = set()
        for i, r in enumerate(batch.requests):
            rid = r.request_id
            if not rid:
                return f"request #{i}: request_id is empty"
            if len(rid) > MAX_REQUEST_ID:
                return f"request #{i}: request_id is longer than {MAX_REQUEST_ID} characters"
            if rid in seen:
                return f"request id {rid!r} appears twice in the batch; request ids must be unique"
            seen.add(rid)
            if not r.target:
                return f"request {rid!r}: target is empty"
            if not r.kernel:
                return f"request {rid!r}: kernel is empty; send compiler.runtime.Kernel.to_bytes() of the candidate"
            o = r.options
            for name in ("timeout_seconds", "min_repeat_ms", "cooldown_ms", "rtol", "atol"):
                if not _finite_nonneg(getattr(o, name)):
                    return f"request {rid!r}: options.{name} must be finite and non-negative, got {getattr(o, name)}"
            if o.timeout_seconds > MAX_TIMEOUT_SECONDS:
                return f"request {rid!r}: options.timeout_seconds {o.timeout_seconds:g} is over {MAX_TIMEOUT_SECONDS:g}"
        return None

    def Measure(self, request: pb.MeasureBatch, context):
        self._auth(context, TUNER)
        bad = self._validate_batch(request)
        if bad:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, bad)
        subs = []
        for r in request.requests:
            if r.options.timeout_seconds <= 0:  # the agent and the lease must agree on the run timeout
                r.options.timeout_seconds = self.state.default_timeout
            subs.append(st.Submission(r.request_id, r.target, r.options.timeout_seconds, r))
        try:
            waiter = self.state.submit(request.device_key, request.priority, subs)
        except st.TrackerError as e:
            self._fail(context, e)
        if not context.add_callback(lambda: self.state.detach(waiter)):
            self.state.detach(waiter)  # the tuner left already; its requests stay queued
            return
        while True:
            try:
                results = self.state.wait_results(waiter, WAIT_SLICE)
            except st.TrackerClosed as e:
                if context.is_active():
                    context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
                return
            for res in results:
                extra = {"timing": res.timing} if res.timing is not None else {}
                yield pb.MeasureResult(request_id=res.request_id, costs=res.costs, error_code=res.error_code,
                                       error_msg=res.error_msg, run_seconds=res.run_seconds, agent=res.agent,
                                       attempts=res.attempts, emulated=res.emulated, **extra)
            if self.state.finished(waiter) or not context.is_active():
                return

    # ------------------------------------------------------------------ everyone

    def Summary(self, request: pb.SummaryRequest, context):
        self._auth(context, ANYONE)
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
                           last_seen_seconds_ago=a.last_seen_seconds_ago, draining=a.draining)
        for k in snap.keys:
            out.keys.add(device_key=k.device_key, agents=k.agents, queued=k.queued, in_flight=k.in_flight,
                         completed=k.completed)
        return out
