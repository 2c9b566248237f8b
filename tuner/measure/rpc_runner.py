"""The farm's runner: measure built candidates on device agents, through the tracker.

`RPCRunner.run(task, builds)` sends one MeasureBatch (one request per kernel, each with a fresh
uuid4 request id) through the tracker's Measure call and collects the results from its stream as
they arrive, in whatever order agents finish (`run_iter` yields them in that order). The tracker keeps no durable state, so when the
stream breaks (the tracker restarted, the network dropped) the runner submits the requests still
unanswered again, under the same ids, after a backoff; the tracker never runs or answers an id
twice, and a duplicate answer that still reaches the runner is ignored. Requests unanswered when
`result_timeout` runs out become RUNNER_ERROR results, so the tuning loop always gets one result
per build, in order, as with LocalRunner.

A misconfigured tuner — a wrong token, a tracker certificate it does not trust, a batch the tracker
rejects (malformed, an unknown device key, a target no agent of the key can run), a tracker address
that never answers — gets a typed exception (`FarmAuthError`, `FarmTLSError`, `FarmRequestError`,
`FarmError`) instead of a batch of error records: recording garbage for every candidate would
poison the search and the database. The first contact asks the tracker for its Summary, so a
wrong token or certificate is told before any candidate is sent.

Over a real network a link can die without a word; the channel's keepalive
(`rpc_tracker.protocol.client_keepalive_options`) ends a stream whose connection stopped answering,
and the unanswered requests are submitted again like after any break.
"""

from __future__ import annotations

import logging
import os
import random
import time
import uuid

import grpc

from compiler.measure_options import MeasureOptions
from rpc_tracker.client import make_tracker_channel, tls_problem
from rpc_tracker.protocol import SHARED_BATCH_FIELDS_PROTOCOL, auth_metadata, pb, pb_grpc, unpack_results

from ..candidate import ErrorCode, MeasureResult
from ..workload import Task
from .runner import Runner, passthrough, to_measure_result

log = logging.getLogger("tunefarm.rpc_runner")

TOKEN_ENV = "TUNEFARM_TUNER_TOKEN"

# Stream endings worth submitting the unanswered requests again for: the tracker went away or
# restarted, or the call was cut; anything else is a statement about the request itself.
_RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
                grpc.StatusCode.INTERNAL, grpc.StatusCode.ABORTED)


class FarmError(RuntimeError):
    """The farm refused the tuner's requests; the tuning run should stop."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None):
        super().__init__(message)
        self.code = code


class FarmAuthError(FarmError):
    """The tracker did not accept the tuner's token (UNAUTHENTICATED / PERMISSION_DENIED)."""


class FarmTLSError(FarmError):
    """The TLS handshake with the tracker failed: its certificate is not signed by the CA given
    (--tls-ca), or one side speaks TLS and the other does not."""


class FarmRequestError(FarmError):
    """The tracker rejected the batch itself (INVALID_ARGUMENT, an oversized message, ...)."""


def unanswered_reason(summary, device_key: str) -> str:
    """Why requests of `device_key` may have gone unanswered, from the tracker's FarmSummary: no
    agent of the key, every one of them degraded (they get no work until a calibration shows them
    recovered), or else how many agents, queued and in-flight requests the key has. A tuner that
    only saw its timeout would not know which."""
    mine = next((k for k in summary.keys if k.device_key == device_key), None)
    if mine is None or mine.agents == 0:
        return f"no agent of key {device_key!r} is registered with the tracker"
    if mine.degraded >= mine.agents:
        return (f"every agent of key {device_key!r} ({mine.agents}) is degraded and gets no work until a "
                f"calibration shows it recovered (see `tunefarm farm status`)")
    return (f"key {device_key!r} has {mine.agents} agent(s), {mine.degraded} degraded, {mine.queued} request(s) "
            f"queued and {mine.in_flight} in flight")


class RPCRunner(Runner):
    """Measures on the farm's agents of one device key, with the same MeasureOptions as LocalRunner."""

    def __init__(self, tracker: str, device_key: str, token: str | None = None, priority: int = 0,
                 options: MeasureOptions | None = None, tls_ca: str | None = None, result_timeout: float = 600.0,
                 connect_timeout: float = 30.0, backoff_initial: float = 0.2, backoff_max: float = 5.0):
        if result_timeout <= 0:
            raise ValueError(f"result timeout must be positive, got {result_timeout!r}")
        if not device_key:
            raise ValueError("a device key is required: the farm measures on agents of one key")
        self.tracker, self.device_key, self.priority = tracker, device_key, int(priority)
        self.token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        self.options = options if options is not None else MeasureOptions()
        self._options_message = self.options.to_proto(pb)
        self.result_timeout, self.connect_timeout = float(result_timeout), float(connect_timeout)
        self._reached = False  # has this runner ever got through to the tracker?
        self._shares_batch_fields = False  # its tracker takes MeasureBatch.target and .references
        self._emulated: bool | None = None  # the key's agents' kind, once known
        self.tls_ca = tls_ca
        self.backoff_initial, self.backoff_max = float(backoff_initial), float(backoff_max)
        self._channel = make_tracker_channel(tracker, tls_ca=tls_ca)
        self._stub = pb_grpc.TrackerStub(self._channel)
        self._metadata = auth_metadata(self.token)

    def timings_emulated(self) -> bool | None:
        """Whether the key's agents run emulated, as they told the tracker (it keeps a key to one
        kind); None when no agent of the key is registered or the tracker does not answer."""
        if self._emulated is None:
            try:
                summary = self._stub.Summary(pb.SummaryRequest(), metadata=self._metadata, timeout=5.0)
            except grpc.RpcError:
                return None
            kinds = {a.device.emulated for a in summary.agents if a.device_key == self.device_key}
            self._emulated = kinds.pop() if len(kinds) == 1 else None
        return self._emulated

    @property
    def _unmeasured_by(self) -> str:
        """measured_by of a result no agent produced."""
        return f"farm:{self.device_key}"

    def run(self, task: Task, build_results: list, options: MeasureOptions | None = None) -> list:
        out: list = [None] * len(build_results)
        for i, res in self.run_iter(task, build_results, options):
            out[i] = res
        return out

    def run_iter(self, task: Task, build_results: list, options: MeasureOptions | None = None):
        """Yield (index into build_results, MeasureResult) as results arrive: build errors first,
        then measurements in the order agents finish them, then the unanswered ones at the end.
        `options`: this call's instead of the runner's."""
        message = self._options_message if options is None else options.to_proto(pb)
        if task.device_key != self.device_key:
            raise ValueError(f"task {task.workload.name} is for device key {task.device_key!r} but this "
                             f"RPCRunner measures on {self.device_key!r}; its records would name the wrong "
                             f"devices")
        self._first_contact()
        requests: dict = {}   # request id -> pb.MeasureRequest, without its target and reference
        references: dict = {}  # request id -> the reference kernel's bytes (b"": none)
        index: dict = {}      # request id -> position in build_results
        for i, br in enumerate(build_results):
            res = passthrough(br, self._unmeasured_by)
            if res is not None:
                yield i, res
                continue
            rid = uuid.uuid4().hex
            requests[rid] = pb.MeasureRequest(request_id=rid, kernel=br.kernel_bytes, num_inputs=br.num_inputs,
                                              options=message)
            references[rid] = br.reference_bytes or b""
            index[rid] = i
        if requests:
            why = None   # what the tracker says of the key, asked once when a request goes unanswered
            for rid, answer in self._collect(requests, references, task.target):
                i = index[rid]
                if answer is None and why is None:
                    why = self._key_state()
                yield i, self._to_result(answer, build_results[i], why or "")

    def _first_contact(self) -> None:
        """Fail fast on a tracker never reached (a wrong address), unlike an outage mid-run, and on a
        wrong token or certificate before any candidate is sent.

        Asks the tracker for its Summary (any valid token may) until it answers or connect_timeout
        runs out. Once the runner has talked to the tracker, an unreachable tracker is taken for
        one that restarts, and waited for up to result_timeout.
        """
        if self._reached:
            return
        deadline = time.monotonic() + self.connect_timeout
        last = "no answer"
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                hint = "" if self.tls_ca else "; if it serves TLS, give its CA with --tls-ca"
                raise FarmError(f"cannot reach the tracker at {self.tracker} within {self.connect_timeout:g} s "
                                f"(is it running, and is the address right?{hint}); last error: {last}")
            try:
                summary = self._stub.Summary(pb.SummaryRequest(), metadata=self._metadata, timeout=min(left, 5.0))
                self._shares_batch_fields = summary.protocol_version >= SHARED_BATCH_FIELDS_PROTOCOL
                break
            except grpc.RpcError as e:
                self._raise_if_refused(e)
                if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    break  # it answered: whatever it says about Summary, Measure will say for itself
                last = f"{e.code().name}: {e.details()}"
            time.sleep(min(0.2, max(deadline - time.monotonic(), 0.0)))
        self._reached = True

    def _raise_if_refused(self, e: grpc.RpcError) -> None:
        """Raise the typed error of a call the tracker refused for the tuner's credentials."""
        code = e.code()
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            raise FarmAuthError(f"the tracker at {self.tracker} refused the tuner: {code.name}: "
                                f"{e.details()} (check --token / ${TOKEN_ENV})", code) from None
        tls = tls_problem(e.details(), self.tls_ca) if code == grpc.StatusCode.UNAVAILABLE else ""
        if tls:
            raise FarmTLSError(f"cannot talk to the tracker at {self.tracker}: {tls}", code) from None

    def _key_state(self) -> str:
        """The tracker's word on this runner's key now ("" when it cannot be asked)."""
        try:
            summary = self._stub.Summary(pb.SummaryRequest(), metadata=self._metadata, timeout=5.0)
        except grpc.RpcError:
            return ""
        return unanswered_reason(summary, self.device_key)

    def _to_result(self, answer, br, why: str = "") -> MeasureResult:
        if answer is None:
            return MeasureResult(error_code=ErrorCode.RUNNER_ERROR,
                                 error_msg=f"no result from the farm within {self.result_timeout:g} s "
                                           f"(tracker {self.tracker}, device key {self.device_key!r})"
                                           + (f": {why}" if why else ""),
                                 build_seconds=br.build_seconds, measured_by=self._unmeasured_by)
        as_dict = {"costs": list(answer.costs), "error_code": answer.error_code,
                   "error_msg": answer.error_msg, "run_seconds": answer.run_seconds,
                   # the agent's calibrations found the window slow: marked, or taken again (protocol 6)
                   "slow_window": answer.slow_window, "remeasured": answer.remeasured, "slow_index": answer.slow_index}
        if answer.HasField("timing"):
            t = answer.timing
            as_dict["timing"] = {f.name: getattr(t, f.name) for f in t.DESCRIPTOR.fields}
        return to_measure_result(as_dict, br, answer.agent or self._unmeasured_by, answer.emulated)

    def _batch(self, rids: list, requests: dict, references: dict, target: str, shared: bool) -> pb.MeasureBatch:
        """The MeasureBatch of these requests for `target`. When `shared` (protocol 5) the target
        and each reference are sent once for all the requests, else in every request."""
        batch = pb.MeasureBatch(device_key=self.device_key, priority=self.priority, pack_results=True)
        if shared:
            batch.target = target
        position: dict = {}   # reference bytes -> its reference_index
        for rid in rids:
            r = batch.requests.add()
            r.CopyFrom(requests[rid])
            if not shared:
                r.target = target
            ref = references[rid]
            if not ref:
                continue
            if shared:
                if ref not in position:
                    batch.references.append(ref)
                    position[ref] = len(batch.references)
                r.reference_index = position[ref]
            else:
                r.reference_kernel = ref
        return batch

    def _collect(self, requests: dict, references: dict, target: str):
        """Yield (request id, pb.MeasureResult) as results arrive, submitting the unanswered requests
        again after a break; then (request id, None) for each left unanswered at result_timeout.

        The shared target and references go only in the first submission, to the tracker this
        runner's Summary described: after a break the tracker may have been replaced by an older
        one that would ignore them, so the requests submitted again carry their own."""
        pending = set(requests)
        deadline = time.monotonic() + self.result_timeout
        delay = self.backoff_initial
        shared = self._shares_batch_fields
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            batch = self._batch([rid for rid in requests if rid in pending], requests, references, target, shared)
            shared = False
            progressed = False
            try:
                for message in self._stub.Measure(batch, metadata=self._metadata, timeout=left):
                    for res in unpack_results(message):
                        if res.request_id in pending:  # a duplicate or unknown id is ignored
                            pending.discard(res.request_id)
                            progressed = True
                            yield res.request_id, res
                if not pending:
                    break
                reason = f"the result stream ended with {len(pending)} request(s) unanswered"
            except grpc.RpcError as e:
                code = e.code()
                self._raise_if_refused(e)
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    break
                if code not in _RETRY_CODES:
                    raise FarmRequestError(f"the tracker at {self.tracker} rejected a batch of {len(batch.requests)} "
                                           f"request(s) for key {self.device_key!r}: {code.name}: {e.details()}",
                                           code) from None
                reason = f"{code.name}: {e.details()}"
            if progressed:
                delay = self.backoff_initial
            pause = min(delay * random.uniform(0.5, 1.0), max(deadline - time.monotonic(), 0.0))
            log.warning("farm measurement interrupted (%s); submitting %d unanswered request(s) again in %.2f s",
                        reason, len(pending), pause)
            time.sleep(pause)
            delay = min(delay * 2.0, self.backoff_max)
        if pending:
            log.warning("%d request(s) got no result from the farm within %g s", len(pending), self.result_timeout)
        for rid in requests:
            if rid in pending:
                yield rid, None

    def close(self) -> None:
        self._channel.close()
