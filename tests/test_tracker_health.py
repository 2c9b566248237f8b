"""Agent health in the tracker, without sockets: what a degraded, slow or recovered agent gets, and
the calibration history kept per device key and host (rpc_tracker/health.py, rpc_tracker/state.py).

The state's rules run on a fake clock; the reports are the protocol's own messages, read by
health.report_of as the servicer reads them, so a malformed report is the InvalidRequest text a
tracker answers with INVALID_ARGUMENT (the farm tests in test_agent_health.py run real agents)."""

from __future__ import annotations

import math

import pytest

from rpc_tracker import health as H
from rpc_tracker.client import format_summary
from rpc_tracker.protocol import pb
from rpc_tracker.state import Result, Submission, TrackerState
from rpc_tracker.targets import DeviceSpec

T_X86 = "llvm -mtriple=x86_64-linux-gnu -mcpu=znver3 -mattr=+avx2,+fma -num-cores=2"


def device(host: str = "h1") -> DeviceSpec:
    return DeviceSpec.make("x86_64-unknown-linux-gnu", "znver3", ["avx", "avx2", "fma"], cores=2, hostname=host)


class Clock:
    t = 1000.0

    def __call__(self):
        return self.t


@pytest.fixture
def state():
    return TrackerState(agent_timeout=6.0, lease_slack=5.0, max_attempts=3, default_timeout=10.0,
                        unknown_key_grace=30.0, clock=Clock())


def calibration(cid: str, fma: float = 100.0, verdict: str = "healthy", index: float = 1.0) -> pb.Calibration:
    return pb.Calibration(id=cid, version=1, threads=2, fma_1=fma, fma_n=2 * fma, stream_1=20.0, stream_n=30.0,
                          speed_index=index, verdict=verdict)


def report(state_name: str, index: float = 1.0, calibrations=(), where: str = "HeartbeatRequest.health") -> H.HealthReport:
    msg = pb.AgentHealth(state=state_name, speed_index=index, calibrations=list(calibrations), slow_windows=2,
                         remeasured=3, replacements=1)
    return H.report_of(msg, where)


def subs(*ids):
    return [Submission(i, T_X86, 1.0, payload=i) for i in ids]


def work(state, agent_id):
    return [w.request_id for w in state.next_work(agent_id, 0)]


def test_a_degraded_agent_gets_no_work_until_it_recovers(state):
    a = state.register_agent("a", "k", device(), health=report("healthy"))
    waiter = state.submit("k", 0, subs("r1"))
    assert work(state, a) == ["r1"]
    state.heartbeat(a, ["r1"], report("degraded", 0.41))
    state.submit("k", 0, subs("r2", "r3"))
    assert state.report_result(a, Result("r1", [1e-3])) is False   # what it held is still taken
    assert work(state, a) == []                               # a free slot, and nothing new
    snap = state.snapshot()
    assert snap.agents[0].health.state == "degraded" and snap.agents[0].health.speed_index == pytest.approx(0.41)
    assert (snap.keys[0].queued, snap.keys[0].degraded) == (2, 1)
    state.heartbeat(a, ["r1"], report("healthy", 0.97))       # a later calibration: recovered
    assert work(state, a) == ["r2"]                           # one slot; r3 waits for it
    assert state.snapshot().keys[0].degraded == 0
    assert [r.request_id for r in state.wait_results(waiter, 0)] == ["r1"]


def test_an_agent_that_registers_degraded_is_never_handed_work(state):
    a = state.register_agent("a", "k", device(), health=report("degraded", 0.3, where="Hello.health"))
    state.submit("k", 0, subs("r1"))
    assert work(state, a) == []
    b = state.register_agent("b", "k", device("h2"))          # an agent that does not calibrate: unknown, served
    assert work(state, b) == ["r1"]
    assert [x.health.state for x in state.snapshot().agents] == ["degraded", "unknown"]


def test_what_a_degraded_agent_was_leased_and_not_sent_goes_back_to_the_queue(state):
    a = state.register_agent("a", "k", device(), prefetch=1)
    b = state.register_agent("b", "k", device("h2"))
    state.submit("k", 0, subs("r1", "r2", "r3"))
    assert work(state, b) == ["r2"]
    state.heartbeat(a, [], report("degraded", 0.2))           # r1 (and r3 ahead) never reached a's stream
    assert work(state, a) == []
    state.report_result(b, Result("r2", [1e-3]))
    assert work(state, b) == ["r1"]                           # back in the queue, in its place, for b


def test_healthy_agents_are_handed_work_before_slow_ones(state):
    slow = state.register_agent("slow", "k", device(), health=report("slow", 0.7))
    fine = state.register_agent("fine", "k", device("h2"), health=report("healthy"))
    state.submit("k", 0, subs("r1"))
    assert (work(state, fine), work(state, slow)) == (["r1"], [])
    state.submit("k", 0, subs("r2"))
    assert work(state, slow) == ["r2"]                        # the healthy one is busy: the slow one works


def test_calibrations_are_kept_per_key_and_host_each_once(state):
    a = state.register_agent("a", "k", device("h1"), health=report("unknown", 0, [calibration("a/1"), calibration("a/2")],
                                                                    where="Hello.health"))
    state.heartbeat(a, [], report("healthy", 1.0, [calibration("a/2"), calibration("a/3", 110.0)]))
    state.register_agent("b", "k", device("h2"), health=report("healthy", 1.0, [calibration("b/1")]))
    state.register_agent("c", "other", device("h1"), health=report("healthy", 1.0, [calibration("c/1")]))
    assert [c.id for c in state.host_history("k", "h1")] == ["a/1", "a/2", "a/3"]
    assert [c.id for c in state.host_history("k", "h2")] == ["b/1"]
    assert [c.id for c in state.host_history("other", "h1")] == ["c/1"]
    assert state.host_history("k", "nowhere") == []
    histories = H.HostHistories(size=3)
    histories.add("k", "h", [(f"x/{i}", i) for i in range(5)])
    assert histories.get("k", "h") == [2, 3, 4]              # the newest, bounded


@pytest.mark.parametrize("msg,needle", [
    (pb.AgentHealth(state="sluggish"), "state 'sluggish' is not one of"),
    (pb.AgentHealth(state="slow", speed_index=math.nan), "speed_index must be finite"),
    (pb.AgentHealth(state="slow", speed_index=-1), "speed_index must be finite"),
    (pb.AgentHealth(calibrations=[pb.Calibration(version=1, threads=2, fma_1=1, fma_n=1, stream_1=1, stream_n=1)]),
     "calibrations[0].id must be"),
    (pb.AgentHealth(calibrations=[calibration("x/1", fma=-1.0)]), "calibrations[0].fma_1 must be a finite, non-negative"),
    (pb.AgentHealth(calibrations=[calibration("x/1", fma=math.inf)]), "calibrations[0].fma_1 must be a finite, non-negative"),
    (pb.AgentHealth(calibrations=[calibration("x/1", verdict="degraded")]), "verdict 'degraded' is not one of"),
    (pb.AgentHealth(calibrations=[pb.Calibration(id="x/1", version=3, threads=2, sync_n=-2.0)]),
     "calibrations[0].sync_n must be a finite, non-negative"),
    (pb.AgentHealth(calibrations=[calibration(f"x/{i}") for i in range(H.MAX_CALIBRATIONS + 1)]), "at most"),
])
def test_malformed_health_reports_are_refused_naming_the_field(msg, needle):
    with pytest.raises(ValueError, match=r"^HeartbeatRequest\.health") as e:
        H.report_of(msg, "HeartbeatRequest.health")
    assert needle in str(e.value)


def test_farm_status_shows_health_and_speed_index():
    summary = pb.FarmSummary(protocol_version=6, tracker_version="t", uptime_seconds=5.0)
    summary.agents.add(name="good", device_key="k", device=pb.DeviceInfo(cpu="znver3", cores=2), slots=1,
                       health="healthy", speed_index=0.98)
    summary.agents.add(name="bad", device_key="k", device=pb.DeviceInfo(cpu="znver3", cores=2), slots=1,
                       health="degraded", speed_index=0.42, slow_windows=3, remeasured=4)
    summary.agents.add(name="old", device_key="k", device=pb.DeviceInfo(cpu="znver3", cores=2), slots=1)
    summary.keys.add(device_key="k", agents=3, degraded=1)
    text = format_summary(summary)
    lines = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    assert "health" in text and "speed" in text
    assert "healthy" in lines["good"] and "0.98" in lines["good"]
    assert "degraded" in lines["bad"] and "0.42" in lines["bad"]
    assert "unknown" in lines["old"] and "—" in lines["old"]
    assert "degraded (no work until a calibration shows it recovered): bad" in text


def test_a_calibrations_team_barrier_speed_travels_to_the_tracker_and_back():
    """sync_n goes in the protocol's Calibration and comes back as judging reads it; a one-thread
    calibration has none: it travels as 0, listed among the figures no sample gave (never judged)."""
    from device_agent.calibration import CALIBRATION_VERSION
    from device_agent.health import calibration_dict, calibration_message
    cal = {"id": "a/1", "version": CALIBRATION_VERSION, "threads": 2, "fma_1": 60.0, "fma_n": 120.0,
           "stream_1": 40.0, "stream_n": 90.0, "sync_n": 3.9, "disturbed": [], "state": "healthy", "speed_index": 1.0}
    back = calibration_dict(pb.Calibration.FromString(calibration_message(pb, cal).SerializeToString()))
    assert back["sync_n"] == 3.9 and back["disturbed"] == []
    lone = dict(cal, threads=1)
    del lone["sync_n"]
    msg = calibration_message(pb, lone)
    assert msg.sync_n == 0.0 and "sync_n" in msg.disturbed
    H.report_of(pb.AgentHealth(calibrations=[msg]), "HeartbeatRequest.health")     # accepted as it is


def test_an_unanswered_request_says_what_the_tracker_knows_of_its_key():
    """A tuner whose requests went unanswered learns why: no agent of the key, every one of them
    degraded, or the key's agents and queue."""
    from tuner.measure.rpc_runner import unanswered_reason

    def farm(*keys):
        return pb.FarmSummary(keys=[pb.KeySummary(device_key=k, agents=a, degraded=d, queued=q, in_flight=f)
                                    for k, a, d, q, f in keys])
    assert unanswered_reason(farm(), "rpi4") == "no agent of key 'rpi4' is registered with the tracker"
    assert "no agent of key 'rpi4'" in unanswered_reason(farm(("rpi4", 0, 0, 3, 0), ("x86", 2, 0, 0, 0)), "rpi4")
    why = unanswered_reason(farm(("rpi4", 2, 2, 3, 0)), "rpi4")
    assert "every agent of key 'rpi4' (2) is degraded" in why and "tunefarm farm status" in why
    assert unanswered_reason(farm(("rpi4", 2, 1, 3, 1)), "rpi4") == \
        "key 'rpi4' has 2 agent(s), 1 degraded, 3 request(s) queued and 1 in flight"
