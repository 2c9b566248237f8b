"""Many agents on one tracker, and the Report stream that lets agents report cheaply.

The tracker runs in this process on 127.0.0.1 (grpc.aio on its own thread). Results reported on
the Report stream are acknowledged one by one, refusals do not end the stream, a duplicate is
said to be one; a batch spread over a handful of light agents (bench/light_agents.py, the load
generator of bench/farm_throughput.py, speaking the real protocol) is answered exactly once per
request id; and a device agent whose tracker has no Report stream reports with ReportResult.
Functional only: the speed is bench/farm_throughput.py's business.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import time
import uuid
from pathlib import Path

import grpc
import llvmlite
import pytest
from processes import kill_group, wait_for

from compiler.target import Target
from rpc_tracker import servicer as servicer_module
from rpc_tracker.client import farm_summary, make_channel
from rpc_tracker.protocol import ACK_INTERVAL_SECONDS, PROTOCOL_VERSION, auth_metadata, pb, pb_grpc, unpack_results
from rpc_tracker.server import TrackerConfig, start_tracker

ROOT = Path(__file__).resolve().parents[1]
AGENT_TOKEN, TUNER_TOKEN = "agent-secret", "tuner-secret"
HOST = Target.host()


@pytest.fixture
def tracker():
    srv = start_tracker(TrackerConfig(host="127.0.0.1", port=0, agent_token=AGENT_TOKEN, tuner_token=TUNER_TOKEN,
                                      heartbeat_seconds=0.5, agent_timeout_seconds=3.0, lease_slack_seconds=2.0,
                                      unknown_key_grace_seconds=0.0))
    yield srv
    srv.stop(grace=0)


def device() -> pb.DeviceInfo:
    return pb.DeviceInfo(triple=HOST.triple, cpu=HOST.cpu, features=[f[1:] for f in HOST.features.split(",") if f],
                         cores=HOST.num_cores, hostname="localhost", llvmlite_version=llvmlite.__version__)


def requests(n: int, prefix: str = "r") -> list:
    opts = pb.MeasureOptions(number=1, repeat=1, timeout_seconds=5.0)
    return [pb.MeasureRequest(request_id=f"{prefix}{i}-{uuid.uuid4().hex[:8]}", target=str(HOST), kernel=b"k",
                              num_inputs=1, options=opts) for i in range(n)]


def result(rid: str, costs=(1e-3,)) -> pb.MeasureResult:
    return pb.MeasureResult(request_id=rid, costs=list(costs), run_seconds=0.001)


def test_report_stream_acks_each_report_and_survives_refusals(tracker):
    with make_channel(tracker.address) as ch:
        stub = pb_grpc.TrackerStub(ch)
        amd, tmd = auth_metadata(AGENT_TOKEN), auth_metadata(TUNER_TOKEN)
        connect = stub.Connect(pb.Hello(protocol_version=PROTOCOL_VERSION, device_key="k", device=device(), slots=2,
                                        name="streamer"), metadata=amd, timeout=30)
        agent_id = next(connect).welcome.agent_id
        reqs = requests(2)
        answers = stub.Measure(pb.MeasureBatch(device_key="k", requests=reqs), metadata=tmd, timeout=30)
        held = {next(connect).work.request.request_id for _ in range(2)}
        assert held == {r.request_id for r in reqs}
        a, b = sorted(held)
        reports = [
            pb.ResultReport(agent_id=agent_id, result=result(a)),                  # taken
            pb.ResultReport(agent_id=agent_id, result=result(a)),                  # the same again: a duplicate
            pb.ResultReport(agent_id=agent_id, result=result("never-submitted")),  # not held
            pb.ResultReport(agent_id="a999-nobody", result=result(b)),             # unknown agent
            pb.ResultReport(agent_id=agent_id, result=result(b, costs=())),        # no costs, no error code
            pb.ResultReport(agent_id=agent_id, result=result(b)),                  # taken: the stream went on
        ]
        acks = list(stub.Report(iter(reports), metadata=amd, timeout=30))
        got = [(x.request_id, grpc.StatusCode.OK if x.status == 0 else
                next(c for c in grpc.StatusCode if c.value[0] == x.status), x.duplicate) for x in acks]
        assert got == [(a, grpc.StatusCode.OK, False), (a, grpc.StatusCode.OK, True),
                       ("never-submitted", grpc.StatusCode.FAILED_PRECONDITION, False),
                       (b, grpc.StatusCode.NOT_FOUND, False), (b, grpc.StatusCode.INVALID_ARGUMENT, False),
                       (b, grpc.StatusCode.OK, False)]
        assert "does not hold" in acks[2].detail and "connect again" in acks[3].detail and "no costs" in acks[4].detail
        assert sorted(r.request_id for r in answers) == sorted(held)   # each answered once, then the stream ends
        connect.cancel()


def test_quiet_reports_are_confirmed_by_count_and_work_comes_ahead(tracker):
    """Protocol 4 on the wire: an agent of one slot that takes one request ahead is pushed two at once
    when more are queued, and a third as it reports the first; quiet reports are acked by name only
    when refused or duplicate, and the rest by ResultAck.received, last when the agent half-closes."""
    with make_channel(tracker.address) as ch:
        stub = pb_grpc.TrackerStub(ch)
        amd, tmd = auth_metadata(AGENT_TOKEN), auth_metadata(TUNER_TOKEN)
        connect = stub.Connect(pb.Hello(protocol_version=PROTOCOL_VERSION, device_key="k", device=device(), slots=1,
                                        prefetch=1, name="ahead"), metadata=amd, timeout=30)
        agent_id = next(connect).welcome.agent_id
        reqs = requests(3)
        answers = stub.Measure(pb.MeasureBatch(device_key="k", requests=reqs), metadata=tmd, timeout=30)
        first, second = (next(connect).work for _ in range(2))       # one for its slot, one ahead
        assert [first.request.request_id, second.request.request_id] == [r.request_id for r in reqs[:2]]
        assert second.lease_seconds > first.lease_seconds            # it waits behind the first: a longer lease
        a, b = first.request.request_id, second.request.request_id
        reports = iter([pb.ResultReport(agent_id=agent_id, result=result(a), quiet=True),         # taken
                        pb.ResultReport(agent_id=agent_id, result=result(a), quiet=True),         # a duplicate
                        pb.ResultReport(agent_id=agent_id, result=result("nobody's"), quiet=True)])  # not held
        acks = stub.Report(reports, metadata=amd, timeout=30)
        third = next(connect).work                                    # a reported, so a third comes ahead of b
        assert third.request.request_id == reqs[2].request_id
        acks = list(acks)
        named = [(x.request_id, x.status, x.duplicate, x.received) for x in acks if x.request_id]
        assert named == [(a, 0, True, 2), ("nobody's", grpc.StatusCode.FAILED_PRECONDITION.value[0], False, 3)]
        counts = [x.received for x in acks]                           # count-only acks may come between
        assert counts[-1] == 3 and counts == sorted(counts)            # the refusal's count confirms all three
        # taken quiet reports on a stream that stays open are confirmed by the timer, within ACK_INTERVAL_SECONDS
        outbox: queue.SimpleQueue = queue.SimpleQueue()
        for rid in (b, third.request.request_id):
            outbox.put(pb.ResultReport(agent_id=agent_id, result=result(rid), quiet=True))
        acks = stub.Report(iter(outbox.get, None), metadata=amd, timeout=30)
        t0 = time.monotonic()
        ack = next(acks)
        assert (ack.request_id, ack.received) == ("", 2) and time.monotonic() - t0 < 5 * ACK_INTERVAL_SECONDS + 2
        outbox.put(None)
        assert list(acks) == []                                       # nothing left to confirm at the half-close
        got = [r for m in answers for r in unpack_results(m)]
        assert sorted(r.request_id for r in got) == sorted(r.request_id for r in reqs)
        assert all(r.attempts == 1 and r.error_code == 0 for r in got)
        connect.cancel()


def test_report_stream_needs_the_agent_token(tracker):
    with make_channel(tracker.address) as ch:
        stub = pb_grpc.TrackerStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            list(stub.Report(iter([pb.ResultReport(agent_id="a1", result=result("x"))]),
                             metadata=auth_metadata(TUNER_TOKEN), timeout=10))
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_handful_of_light_agents_answer_every_request_exactly_once(tracker, tmp_path):
    """8 light agents (2 processes), 400 requests in one batch: each handed out once, acked, answered once."""
    env = dict(os.environ, TUNEFARM_AGENT_TOKEN=AGENT_TOKEN, PYTHONPATH=str(ROOT))
    procs, outs = [], []
    try:
        for i in range(2):
            out = tmp_path / f"light-{i}.json"
            procs.append(subprocess.Popen(
                [sys.executable, str(ROOT / "bench" / "light_agents.py"), "--tracker", tracker.address, "--key", "light",
                 "--agents", "4", "--first-index", str(4 * i), "--service-ms", "2", "--out", str(out)],
                cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True))
            outs.append(out)
        for p in procs:
            assert p.stdout.readline().startswith("ready"), "a light-agent process did not start"
        wait_for(lambda: len(farm_summary(tracker.address, TUNER_TOKEN).agents) == 8, 30, "8 agents registered")

        reqs = requests(400)
        with make_channel(tracker.address) as ch:
            answers = list(pb_grpc.TrackerStub(ch).Measure(pb.MeasureBatch(device_key="light", requests=reqs),
                                                           metadata=auth_metadata(TUNER_TOKEN), timeout=60))
        for p in procs:
            p.stdin.write("stop\n")
            p.stdin.flush()
        for p in procs:
            assert p.stdout.readline().strip() == "done"
            assert p.wait(30) == 0
    finally:
        for p in procs:
            kill_group(p)
    records = [r for out in outs for r in json.loads(out.read_text())["records"]]
    ids = sorted(r.request_id for r in reqs)
    assert sorted(a.request_id for a in answers) == ids                 # none lost, none answered twice
    assert all(a.error_code == 0 and a.attempts == 1 for a in answers)
    assert sorted(r[0] for r in records) == ids                         # each handed to exactly one agent
    assert {r[5] for r in records} == {"ok"}                            # every report acknowledged as taken
    by_id = {r[0]: r for r in records}
    assert all(a.agent.rsplit("-", 1)[-1] == str(by_id[a.request_id][1]) for a in answers)
    assert len({r[1] for r in records}) == 8                            # the work was spread over all of them
    summary = farm_summary(tracker.address, TUNER_TOKEN)
    assert summary.keys[0].completed == 400 and summary.keys[0].queued == 0


def test_agent_reports_with_report_result_when_the_tracker_has_no_report_stream(monkeypatch, tmp_path):
    """An agent of this release on a tracker from before the Report stream (UNIMPLEMENTED) still reports."""
    monkeypatch.setattr(servicer_module, "_STREAMS_IN", {})
    srv = start_tracker(TrackerConfig(host="127.0.0.1", port=0, agent_token=AGENT_TOKEN, tuner_token=TUNER_TOKEN,
                                      heartbeat_seconds=0.5, agent_timeout_seconds=3.0, unknown_key_grace_seconds=0.0))
    log = tmp_path / "agent.log"
    env = dict(os.environ, TUNEFARM_AGENT_TOKEN=AGENT_TOKEN, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    with open(log, "wb") as out:
        agent = subprocess.Popen([sys.executable, "-m", "device_agent", "--tracker", srv.address, "--key", "old",
                                  "--name", "new-agent", "-v", "--no-calibration"], cwd=ROOT, env=env, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: farm_summary(srv.address, TUNER_TOKEN).agents, 60, "the agent registered")
        with make_channel(srv.address) as ch:
            stub = pb_grpc.TrackerStub(ch)
            with pytest.raises(grpc.RpcError) as e:   # the tracker really has no Report stream
                list(stub.Report(iter([]), metadata=auth_metadata(AGENT_TOKEN), timeout=10))
            assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
            reqs = requests(2)   # kernel b"k" does not load: each comes back with an error code, reported all the same
            answers = list(stub.Measure(pb.MeasureBatch(device_key="old", requests=reqs),
                                        metadata=auth_metadata(TUNER_TOKEN), timeout=60))
        assert sorted(a.request_id for a in answers) == sorted(r.request_id for r in reqs)
        assert all(a.agent == "new-agent" and a.error_code != 0 for a in answers)
    finally:
        kill_group(agent)
        srv.stop(grace=0)


def test_agent_reports_on_the_report_stream(monkeypatch, tmp_path):
    """A device agent of this release sends its results on the Report stream, not one call each."""
    calls = []
    original = servicer_module.TrackerServicer.ReportResult

    async def counted(self, request, context):
        calls.append(request.result.request_id)
        return await original(self, request, context)
    monkeypatch.setattr(servicer_module.TrackerServicer, "ReportResult", counted)
    srv = start_tracker(TrackerConfig(host="127.0.0.1", port=0, agent_token=AGENT_TOKEN, tuner_token=TUNER_TOKEN,
                                      heartbeat_seconds=0.5, agent_timeout_seconds=3.0, unknown_key_grace_seconds=0.0))
    env = dict(os.environ, TUNEFARM_AGENT_TOKEN=AGENT_TOKEN, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    with open(tmp_path / "agent.log", "wb") as out:
        agent = subprocess.Popen([sys.executable, "-m", "device_agent", "--tracker", srv.address, "--key", "new",
                                  "--name", "new-agent", "--no-calibration"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    try:
        wait_for(lambda: farm_summary(srv.address, TUNER_TOKEN).agents, 60, "the agent registered")
        reqs = requests(3)
        with make_channel(srv.address) as ch:
            answers = list(pb_grpc.TrackerStub(ch).Measure(pb.MeasureBatch(device_key="new", requests=reqs),
                                                           metadata=auth_metadata(TUNER_TOKEN), timeout=60))
        assert sorted(a.request_id for a in answers) == sorted(r.request_id for r in reqs)
        assert all(a.agent == "new-agent" for a in answers)
        assert calls == []
    finally:
        kill_group(agent)
        srv.stop(grace=0)


def test_measure_packs_ready_results_for_a_tuner_that_asks_and_not_for_one_that_does_not(tracker):
    """MeasureBatch.pack_results: every result the tracker has in hand goes in one message (the
    first result, the rest in `more`); a tuner that does not ask (one from before the field) gets
    one result per message. Both are answered once per request id, with the agent's figures."""
    with make_channel(tracker.address) as ch:
        stub = pb_grpc.TrackerStub(ch)
        amd, tmd = auth_metadata(AGENT_TOKEN), auth_metadata(TUNER_TOKEN)
        connect = stub.Connect(pb.Hello(protocol_version=PROTOCOL_VERSION, device_key="k", device=device(), slots=16,
                                        name="packer"), metadata=amd, timeout=30)
        agent_id = next(connect).welcome.agent_id
        packed, single = requests(8, "p"), requests(8, "s")
        calls = [stub.Measure(pb.MeasureBatch(device_key="k", requests=packed, pack_results=True), metadata=tmd,
                              timeout=30),
                 stub.Measure(pb.MeasureBatch(device_key="k", requests=single), metadata=tmd, timeout=30)]
        held = {next(connect).work.request.request_id for _ in range(16)}
        assert held == {r.request_id for r in packed + single}
        for call in calls:   # the tuners go away; the results will wait in the tracker's cache
            call.cancel()
        time.sleep(0.1)
        costs = {rid: [1e-3 * (i + 1)] for i, rid in enumerate(sorted(held))}
        acks = list(stub.Report(iter([pb.ResultReport(agent_id=agent_id, result=result(rid, costs[rid]))
                                      for rid in sorted(held)]), metadata=amd, timeout=30))
        assert [(a.status, a.duplicate) for a in acks] == [(0, False)] * 16

        # the tuner that asks: all 8 cached results in one message
        messages = list(stub.Measure(pb.MeasureBatch(device_key="k", requests=packed, pack_results=True),
                                     metadata=tmd, timeout=30))
        assert len(messages) == 1 and len(messages[0].more) == 7
        got = [r for m in messages for r in unpack_results(m)]
        assert sorted(r.request_id for r in got) == sorted(r.request_id for r in packed)
        assert all(list(r.costs) == costs[r.request_id] for r in got)
        assert not any(r.more for r in messages[0].more)   # packed one level deep

        # the tuner that does not ask: one result per message, as before the field
        messages = list(stub.Measure(pb.MeasureBatch(device_key="k", requests=single), metadata=tmd, timeout=30))
        assert len(messages) == 8 and not any(m.more for m in messages)
        assert sorted(m.request_id for m in messages) == sorted(r.request_id for r in single)
        assert all(list(m.costs) == costs[m.request_id] for m in messages)
        connect.cancel()
