"""The tracker over real gRPC on 127.0.0.1: tokens, versions, bad messages, leases, summary, CLI.

The tests play the protocol's two client roles with real stubs: an agent (Connect, Heartbeat,
ReportResult) that measures a real compiled kernel with the measuring worker's code, and a tuner
(Measure). Short heartbeat and lease settings keep every wait well under a second.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import llvmlite
import pytest

import compiler as C
from compiler.target import Target
from rpc_tracker.client import farm_summary, format_summary, make_channel
from rpc_tracker.protocol import MAX_MESSAGE_BYTES, MIN_AGENT_PROTOCOL, PROTOCOL_VERSION, auth_metadata, pb, pb_grpc
from rpc_tracker.server import TrackerConfig, start_tracker

ROOT = Path(__file__).resolve().parents[1]
AGENT_TOKEN, TUNER_TOKEN = "agent-secret", "tuner-secret"
HOST = Target.host()


# ----------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def kernels():
    """A real candidate (tiled add) and its reference (naive add), as the farm carries them."""
    def build(tiled: bool):
        a = C.placeholder((64,), "float32", "A")
        b = C.placeholder((64,), "float32", "B")
        out = C.compute((64,), lambda i: a[i] + b[i], name="Out")
        s = C.create_schedule(out)
        if tiled:
            st = s[out]
            _, inner = st.split(st.root_iter_vars[0], factor=8)
            st.vectorize(inner)
        return C.build(s, [a, b, out], target=HOST, name="add").to_bytes()
    return build(True), build(False)


@pytest.fixture
def start():
    """start(**config) -> a running tracker on 127.0.0.1:<free port>; every one is stopped afterwards."""
    servers = []

    def _start(**kw):
        cfg = dict(host="127.0.0.1", port=0, agent_token=AGENT_TOKEN, tuner_token=TUNER_TOKEN,
                   heartbeat_seconds=0.1, agent_timeout_seconds=1.0, lease_slack_seconds=0.5,
                   unknown_key_grace_seconds=0.0)
        cfg.update(kw)
        srv = start_tracker(TrackerConfig(**cfg))
        servers.append(srv)
        return srv
    yield _start
    for srv in servers:
        srv.stop(grace=0)


@pytest.fixture
def tracker(start):
    return start()


@pytest.fixture
def clients():
    made = []
    yield made
    for c in made:
        c.close()


def host_device():
    return pb.DeviceInfo(triple=HOST.triple, cpu=HOST.cpu, features=[f[1:] for f in HOST.features.split(",") if f],
                         cores=HOST.num_cores, memory_bytes=1 << 30, agent_version="test", hostname="localhost",
                         llvmlite_version=llvmlite.__version__)


class FakeAgent:
    """The agent role: a Connect stream read by a thread, heartbeats from another one."""

    def __init__(self, address, key="x86-test", name="agent-1", token=AGENT_TOKEN, slots=1, heartbeat=True,
                 device=None):
        self.name = name
        self.channel = make_channel(address)
        self.stub = pb_grpc.TrackerStub(self.channel)
        self.md = auth_metadata(token)
        hello = pb.Hello(protocol_version=PROTOCOL_VERSION, device_key=key, device=device or host_device(),
                         slots=slots, name=name)
        self.stream = self.stub.Connect(hello, metadata=self.md, timeout=30)
        self.welcome = next(self.stream).welcome
        self.agent_id = self.welcome.agent_id
        self.inbox: queue.Queue = queue.Queue()
        self.error: grpc.RpcError | None = None
        self._stop = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if heartbeat:
            threading.Thread(target=self._beat, daemon=True).start()

    def _read(self):
        try:
            for msg in self.stream:
                self.inbox.put(msg.work)
        except grpc.RpcError as e:
            self.error = e
        self.inbox.put(None)

    def _beat(self):
        while not self._stop.wait(0.05):
            try:
                self.stub.Heartbeat(pb.HeartbeatRequest(agent_id=self.agent_id), metadata=self.md, timeout=2)
            except grpc.RpcError:
                return

    def next_work(self, timeout=5.0) -> pb.Work | None:
        return self.inbox.get(timeout=timeout)

    def report(self, request_id, costs=(1e-4, 1e-4), error_code=0, error_msg="", agent_id=None):
        res = pb.MeasureResult(request_id=request_id, costs=list(costs), error_code=error_code, error_msg=error_msg,
                               run_seconds=0.01)
        return self.stub.ReportResult(pb.ResultReport(agent_id=agent_id or self.agent_id, result=res),
                                      metadata=self.md, timeout=5)

    def measure(self, work: pb.Work) -> pb.MeasureResult:
        """Measure the work for real, with the measuring worker's own code."""
        from compiler.measure_options import MeasureOptions
        from device_agent.worker import MeasureRequest, measure_one
        r = work.request
        out = measure_one(MeasureRequest(r.kernel, r.reference_kernel or None, r.num_inputs,
                                         MeasureOptions.from_proto(r.options)))
        res = pb.MeasureResult(request_id=r.request_id, costs=out["costs"], error_code=out["error_code"],
                               error_msg=out["error_msg"], run_seconds=out["run_seconds"])
        if "timing" in out:   # the measurement protocol's summary, which the tracker passes on
            t = out["timing"]
            res.timing.CopyFrom(pb.Timing(median=t["median"], min=t["min"], spread=t["spread"], count=t["count"],
                                          disturbed=t["disturbed"], lost_fraction=t["lost_fraction"]))
        return res

    def stop_heartbeats(self):
        self._stop.set()

    def close(self):
        self._stop.set()
        self.stream.cancel()
        self.channel.close()


class Tuner:
    def __init__(self, address, token=TUNER_TOKEN):
        self.channel = make_channel(address)
        self.stub = pb_grpc.TrackerStub(self.channel)
        self.md = auth_metadata(token)

    def measure(self, requests, key="x86-test", priority=0, timeout=10, references=(), target=""):
        """The Measure stream (the call starts now; iterate it for results)."""
        return self.stub.Measure(pb.MeasureBatch(device_key=key, priority=priority, requests=requests,
                                                 references=list(references), target=target),
                                 metadata=self.md, timeout=timeout)

    def close(self):
        self.channel.close()


def request(rid, kernels, target=None, timeout=2.0):
    cand, ref = kernels
    return pb.MeasureRequest(request_id=rid, target=target or str(HOST), kernel=cand, reference_kernel=ref,
                             num_inputs=2, options=pb.MeasureOptions(number=1, repeat=2, timeout_seconds=timeout))


def shared_request(rid, kernels, index=1, own_target=False, **kw):
    """A request whose reference is the batch's references[index - 1], and its target the batch's
    unless `own_target` (protocol 5)."""
    r = request(rid, kernels, **kw)
    r.reference_kernel, r.reference_index = b"", index
    if not own_target:
        r.target = ""
    return r


def agent(tracker, clients, **kw):
    a = FakeAgent(tracker.address, **kw)
    clients.append(a)
    return a


def tuner(tracker, clients, **kw):
    t = Tuner(tracker.address, **kw)
    clients.append(t)
    return t


def summary(tracker, token=TUNER_TOKEN):
    return farm_summary(tracker.address, token)


def rpc_error(fn) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        fn()
    return info.value


# ----------------------------------------------------------------------------- the happy path

def test_round_trip_with_a_real_kernel(tracker, clients, kernels):
    a = agent(tracker, clients)
    assert a.welcome.protocol_version == PROTOCOL_VERSION and a.welcome.heartbeat_seconds == pytest.approx(0.1)
    t = tuner(tracker, clients)
    stream = t.measure([request("r1", kernels), request("r2", kernels)])
    got = {}
    for _ in range(2):
        work = a.next_work()
        assert work.request.kernel == kernels[0] and work.lease_seconds == pytest.approx(2.5)
        ack = a.stub.ReportResult(pb.ResultReport(agent_id=a.agent_id, result=a.measure(work)), metadata=a.md)
        assert not ack.duplicate
        res = next(stream)
        got[res.request_id] = res
    assert set(got) == {"r1", "r2"}
    for res in got.values():
        assert res.error_code == 0, res.error_msg
        assert 1 <= len(res.costs) <= 32 and all(c > 0 for c in res.costs)
        assert res.HasField("timing") and res.timing.count >= 2 and res.timing.min == min(res.costs)
        assert res.agent == "agent-1" and res.attempts == 1
    assert list(stream) == []  # the stream ends once the batch is answered

    s = summary(tracker)
    assert s.protocol_version == PROTOCOL_VERSION
    (ag,) = s.agents
    assert (ag.name, ag.device_key, ag.device.cpu, ag.slots, ag.in_flight, ag.completed, ag.failed) == \
        ("agent-1", "x86-test", HOST.cpu, 1, 0, 2, 0)
    assert ag.last_seen_seconds_ago < 1.0 and not ag.draining
    (key,) = s.keys
    assert (key.device_key, key.agents, key.queued, key.in_flight, key.completed) == ("x86-test", 1, 0, 0, 2)


def test_a_shared_target_and_reference_reach_every_agent_in_its_request(tracker, clients, kernels):
    """Protocol 5: a batch's target and references are sent once; agents get whole requests (the
    tracker puts them into each), so an agent of protocol 4 checks them as before."""
    a = agent(tracker, clients)
    t = tuner(tracker, clients)
    stream = t.measure([shared_request("r1", kernels), shared_request("r2", kernels)], references=[kernels[1]],
                       target=str(HOST))
    for _ in range(2):
        work = a.next_work()
        assert work.request.reference_kernel == kernels[1] and work.request.reference_index == 0
        assert work.request.target == str(HOST)
        a.stub.ReportResult(pb.ResultReport(agent_id=a.agent_id, result=a.measure(work)), metadata=a.md)
    results = [next(stream), next(stream)]
    assert sorted(r.request_id for r in results) == ["r1", "r2"]
    assert all(r.error_code == 0 for r in results), [r.error_msg for r in results]


def test_summary_counts_queue_and_in_flight(tracker, clients, kernels):
    a = agent(tracker, clients, slots=2)
    t = tuner(tracker, clients)
    stream = t.measure([request(f"r{i}", kernels) for i in range(5)])  # noqa: F841 - kept open
    a.next_work(), a.next_work()
    deadline = time.time() + 5
    while time.time() < deadline:
        s = summary(tracker, token=AGENT_TOKEN)  # either token reads the summary
        if s.keys and s.keys[0].queued == 3:
            break
        time.sleep(0.01)
    assert (s.keys[0].queued, s.keys[0].in_flight, s.agents[0].in_flight) == (3, 2, 2)
    text = format_summary(s)
    assert "agent-1" in text and "x86-test" in text and "in-flight" in text


# ----------------------------------------------------------------------------- authentication

def test_wrong_tokens_are_refused_and_the_tracker_keeps_serving(tracker, clients, kernels):
    e = rpc_error(lambda: FakeAgent(tracker.address, token="wrong"))
    assert e.code() == grpc.StatusCode.UNAUTHENTICATED and "agent token refused" in e.details()
    e = rpc_error(lambda: FakeAgent(tracker.address, token=None))
    assert e.code() == grpc.StatusCode.UNAUTHENTICATED and "no token" in e.details()
    e = rpc_error(lambda: FakeAgent(tracker.address, token=TUNER_TOKEN))  # the other role's token
    assert e.code() == grpc.StatusCode.UNAUTHENTICATED

    t = tuner(tracker, clients, token=AGENT_TOKEN)
    e = rpc_error(lambda: next(t.measure([request("r1", kernels)])))
    assert e.code() == grpc.StatusCode.UNAUTHENTICATED and "tuner token refused" in e.details()
    e = rpc_error(lambda: summary(tracker, token="nope"))
    assert e.code() == grpc.StatusCode.UNAUTHENTICATED and "token refused" in e.details()

    a = agent(tracker, clients)  # still serving
    e = rpc_error(lambda: a.stub.Heartbeat(pb.HeartbeatRequest(agent_id=a.agent_id), metadata=auth_metadata("x")))
    assert e.code() == grpc.StatusCode.UNAUTHENTICATED
    assert [x.name for x in summary(tracker).agents] == ["agent-1"]


def test_open_farm_needs_no_token(start, clients, kernels):
    srv = start(agent_token=None, tuner_token=None)
    a = agent(srv, clients, token=None)
    stream = tuner(srv, clients, token=None).measure([request("r1", kernels)])
    w = a.next_work()
    a.report(w.request.request_id)
    assert next(stream).request_id == "r1"
    assert len(farm_summary(srv.address, None).agents) == 1


# ----------------------------------------------------------------------------- bad messages

def test_old_agent_protocol_is_told_to_upgrade(tracker):
    with make_channel(tracker.address) as ch:
        stub = pb_grpc.TrackerStub(ch)
        hello = pb.Hello(protocol_version=MIN_AGENT_PROTOCOL - 1, device_key="x86-test", device=host_device())
        e = rpc_error(lambda: next(stub.Connect(hello, metadata=auth_metadata(AGENT_TOKEN), timeout=5)))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert e.details() == (f"agent protocol {MIN_AGENT_PROTOCOL - 1} is older than this tracker's minimum "
                           f"{MIN_AGENT_PROTOCOL}; upgrade tunefarm on the agent")


@pytest.mark.parametrize("hello,needle", [
    (dict(device_key=""), "device_key is empty"),
    (dict(device_key="bad key!"), "not a valid device key"),
    (dict(device=pb.DeviceInfo(cpu="x")), "triple is empty"),
])
def test_bad_hello_is_invalid_argument(tracker, hello, needle):
    fields = dict(protocol_version=PROTOCOL_VERSION, device_key="x86-test", device=host_device())
    fields.update(hello)
    with make_channel(tracker.address) as ch:
        stub = pb_grpc.TrackerStub(ch)
        e = rpc_error(lambda: next(stub.Connect(pb.Hello(**fields), metadata=auth_metadata(AGENT_TOKEN), timeout=5)))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and needle in e.details()


def test_bad_batches_are_invalid_argument(tracker, clients, kernels):
    agent(tracker, clients)
    t = tuner(tracker, clients)
    cases = [
        ([request("r1", kernels)], "", "device_key is empty"),
        ([], "x86-test", "requests is empty"),
        ([request("r1", kernels), request("r1", kernels)], "x86-test", "appears twice"),
        ([request("", kernels)], "x86-test", "request_id is empty"),
        ([pb.MeasureRequest(request_id="r1", target=str(HOST), kernel=b"")], "x86-test", "kernel is empty"),
        ([pb.MeasureRequest(request_id="r1", target="", kernel=b"x")], "x86-test",
         "target is empty (and the batch gives none)"),
        ([request("r1", kernels, target="cuda -arch=sm_80")], "x86-test", "unknown target kind"),
        ([request("r1", kernels, timeout=-1)], "x86-test", "timeout_seconds"),
        # options shared by the first requests pass once; a later request's own are still checked
        ([request("r1", kernels), request("r2", kernels), request("r3", kernels, timeout=-1)], "x86-test",
         "request 'r3': options.timeout_seconds"),
        ([shared_request("r1", kernels, 2, own_target=True)], "x86-test",
         "reference_index 2 names no reference; the batch has 1"),
        ([shared_request("r1", kernels, own_target=True)], "x86-test", "references[0] is empty"),
    ]
    refs = {"references[0] is empty": [b""]}
    both = request("r1", kernels)
    both.reference_index = 1
    cases.append(([both], "x86-test", "either as reference_kernel or by reference_index, not both"))
    for reqs, key, needle in cases:
        e = rpc_error(lambda: next(t.measure(reqs, key=key, references=refs.get(needle, [kernels[1]]))))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (needle, e)
        assert needle in e.details()
    assert summary(tracker).keys[0].queued == 0  # nothing of a refused batch was queued


def test_unknown_key_and_unrunnable_target_are_refused(tracker, clients, kernels):
    agent(tracker, clients)
    t = tuner(tracker, clients)
    e = rpc_error(lambda: next(t.measure([request("r1", kernels)], key="rpi4")))
    assert e.code() == grpc.StatusCode.NOT_FOUND and "'rpi4'" in e.details() and "x86-test" in e.details()
    arm = "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72 -num-cores=4"
    e = rpc_error(lambda: next(t.measure([request("r1", kernels, target=arm)])))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and "can run target" in e.details()


def test_oversized_message_is_resource_exhausted(tracker, clients, kernels):
    big = pb.MeasureRequest(request_id="big", target=str(HOST), kernel=b"\0" * (MAX_MESSAGE_BYTES + 1024),
                            num_inputs=2)
    with make_channel(tracker.address, options=[("grpc.max_send_message_length", -1)]) as ch:
        stub = pb_grpc.TrackerStub(ch)
        e = rpc_error(lambda: next(stub.Measure(pb.MeasureBatch(device_key="x86-test", requests=[big]),
                                                metadata=auth_metadata(TUNER_TOKEN), timeout=20)))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    a = agent(tracker, clients)  # still serving
    stream = tuner(tracker, clients).measure([request("r1", kernels)])
    a.report(a.next_work().request.request_id)
    assert next(stream).request_id == "r1"


def test_malformed_bytes_are_refused_and_the_tracker_keeps_serving(tracker, clients, kernels):
    """Bytes that are not a protobuf message of the method's type never reach the servicer."""
    with make_channel(tracker.address) as ch:
        raw = ch.unary_unary("/tunefarm.farm.v1.Tracker/ReportResult",
                             request_serializer=lambda b: b, response_deserializer=lambda b: b)
        e = rpc_error(lambda: raw(b"\xff\xff\xff\x0f garbage", metadata=auth_metadata(AGENT_TOKEN), timeout=5))
    assert e.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT)
    a = agent(tracker, clients)  # still serving
    stream = tuner(tracker, clients).measure([request("r1", kernels)])
    a.report(a.next_work().request.request_id)
    assert next(stream).request_id == "r1"


def test_results_the_agent_does_not_hold(tracker, clients, kernels):
    a = agent(tracker, clients, name="holder")
    b = agent(tracker, clients, name="other")
    stream = tuner(tracker, clients).measure([request("r1", kernels)])
    deadline = time.time() + 5
    while all(x.inbox.empty() for x in (a, b)) and time.time() < deadline:
        time.sleep(0.01)
    holder, other = (a, b) if not a.inbox.empty() else (b, a)
    holder.next_work()

    e = rpc_error(lambda: other.report("r1"))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and "does not hold" in e.details()
    e = rpc_error(lambda: other.report("never-submitted"))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    e = rpc_error(lambda: other.report("r1", agent_id="a999-unknown"))
    assert e.code() == grpc.StatusCode.NOT_FOUND and "connect again" in e.details()
    e = rpc_error(lambda: holder.report("r1", costs=()))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "no costs" in e.details()
    e = rpc_error(lambda: holder.report("r1", error_code=42))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT

    assert holder.report("r1").duplicate is False
    assert holder.report("r1").duplicate is True
    (res,) = list(stream)
    assert (res.request_id, res.agent) == ("r1", holder.name)


# ----------------------------------------------------------------------------- leases over the wire

def test_agent_that_goes_away_loses_its_lease_to_another(tracker, clients, kernels):
    a = agent(tracker, clients, name="leaver")
    stream = tuner(tracker, clients).measure([request("r1", kernels)])
    assert a.next_work().request.request_id == "r1"
    b = agent(tracker, clients, name="stayer")
    a.close()                                  # stream cancelled: its lease goes back at once
    work = b.next_work(timeout=3)
    assert work.request.request_id == "r1"
    b.report("r1")
    (res,) = list(stream)
    assert (res.agent, res.attempts, res.error_code) == ("stayer", 2, 0)
    (ag,) = summary(tracker).agents
    assert ag.name == "stayer"


def test_silent_agent_is_dropped_and_its_stream_ends(tracker, clients, kernels):
    a = agent(tracker, clients, heartbeat=False)
    stream = tuner(tracker, clients).measure([request("r1", kernels)])
    a.next_work()
    assert a.next_work(timeout=5) is None       # dropped after 1 s of silence: the stream ended
    assert a.error.code() == grpc.StatusCode.UNAVAILABLE and "no heartbeat" in a.error.details()
    b = agent(tracker, clients, name="agent-2")
    b.report(b.next_work().request.request_id)
    assert next(stream).agent == "agent-2"


def test_overdue_lease_goes_elsewhere_and_max_attempts_ends_in_an_error(start, clients, kernels):
    srv = start(max_attempts=2)
    a = agent(srv, clients, name="slow-1")
    b = agent(srv, clients, name="slow-2")
    stream = tuner(srv, clients).measure([request("r1", kernels, timeout=0.2)])   # lease 0.2 + 0.5 s
    got = []
    deadline = time.time() + 5
    while len(got) < 2 and time.time() < deadline:
        for x in (a, b):
            try:
                w = x.inbox.get_nowait()
            except queue.Empty:
                continue
            got.append((x.name, w.request.request_id))
        time.sleep(0.01)
    # handed to one agent, then (its lease expired) to the other one, then given up
    assert sorted(got) == [("slow-1", "r1"), ("slow-2", "r1")]
    (res,) = list(stream)
    assert res.error_code == 7 and res.attempts == 2 and "giving up" in res.error_msg and "lease" in res.error_msg
    assert a.report("r1").duplicate is True     # a late result for an answered request: dropped
    assert summary(srv).agents[0].leases_lost == 1


def test_cancelled_tuner_resubmits_and_gets_the_cached_result(tracker, clients, kernels):
    a = agent(tracker, clients)
    t = tuner(tracker, clients)
    stream = t.measure([request("r1", kernels)])
    work = a.next_work()
    stream.cancel()                             # the tuner goes away; the request stays with the agent
    time.sleep(0.05)
    assert a.report(work.request.request_id).duplicate is False
    (res,) = list(t.measure([request("r1", kernels)]))   # answered at once from the cache
    assert res.request_id == "r1" and res.agent == "agent-1"
    assert a.inbox.empty()                                # never measured twice
    assert summary(tracker).agents[0].completed == 1


# ----------------------------------------------------------------------------- command line

def test_farm_status_cli(tracker, clients, capsys):
    from tuner import cli
    agent(tracker, clients, name="board-7")
    assert cli.main(["farm", "status", "--tracker", tracker.address, "--token", TUNER_TOKEN]) == 0
    out = capsys.readouterr().out
    assert "board-7" in out and "x86-test" in out and "completed" in out
    assert cli.main(["farm", "status", "--tracker", tracker.address, "--token", TUNER_TOKEN, "--json"]) == 0
    import json
    doc = json.loads(capsys.readouterr().out)
    assert doc["agents"][0]["name"] == "board-7" and doc["keys"][0]["device_key"] == "x86-test"
    assert cli.main(["farm", "status", "--tracker", tracker.address, "--token", "wrong"]) == 1
    assert "UNAUTHENTICATED" in capsys.readouterr().err


def test_tracker_cli_runs_until_sigterm():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("TUNEFARM_AGENT_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "tuner.cli", "tracker", "--port", "0", "--tuner-token", "t0k"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("tracker listening on 127.0.0.1:"), (line, proc.stderr.read() if proc.poll() else "")
        address = line.split()[-1]
        assert farm_summary(address, "t0k").protocol_version == PROTOCOL_VERSION
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "stopped" in proc.stderr.read()


# ----------------------------------------------------------------------------- TLS

def test_tls_with_given_certificates(start, tmp_path):
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed: cannot make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True, capture_output=True)
    srv = start(tls_cert=str(cert), tls_key=str(key))
    assert farm_summary(srv.address, TUNER_TOKEN, tls_ca=str(cert)).protocol_version == PROTOCOL_VERSION
    e = rpc_error(lambda: farm_summary(srv.address, TUNER_TOKEN, timeout=2))  # plaintext to a TLS port
    assert e.code() == grpc.StatusCode.UNAVAILABLE


def test_tls_failures_are_told_apart_from_a_network_that_is_down(start, tmp_path):
    """tls_problem reads the words this grpcio really uses: a certificate signed by another CA,
    TLS to a plaintext tracker, and a tracker that is simply not there."""
    from rpc_tracker.client import tls_problem
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed: cannot make a test certificate")
    pems = {}
    for name in ("tracker", "stranger"):
        cert, key = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={name}",
                        "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
        pems[name] = (str(cert), str(key))
    tls = start(tls_cert=pems["tracker"][0], tls_key=pems["tracker"][1])
    stranger = pems["stranger"][0]
    e = rpc_error(lambda: farm_summary(tls.address, TUNER_TOKEN, tls_ca=stranger, timeout=3))
    assert e.code() == grpc.StatusCode.UNAVAILABLE
    said = tls_problem(e.details(), stranger)
    assert "certificate is not trusted" in said and f"--tls-ca {stranger}" in said, e.details()
    plain = start()
    e = rpc_error(lambda: farm_summary(plain.address, TUNER_TOKEN, tls_ca=stranger, timeout=3))
    assert "does not speak TLS" in tls_problem(e.details(), stranger), e.details()
    plain.stop(0)
    e = rpc_error(lambda: farm_summary(plain.address, TUNER_TOKEN, tls_ca=stranger, timeout=3))  # nobody there
    assert e.code() == grpc.StatusCode.UNAVAILABLE and tls_problem(e.details(), stranger) == "", e.details()
