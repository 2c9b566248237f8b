"""The tracker's rules, without gRPC: queues, key isolation, slots, leases, exactly-once answers.

A fake clock makes leases and silent agents expire at once, so no test sleeps.
"""

from __future__ import annotations

import threading

import pytest

from rpc_tracker import state as st
from rpc_tracker.state import Result, Submission, TrackerState
from rpc_tracker.targets import DeviceSpec, TargetSpec, why_cannot_run

X86 = DeviceSpec.make("x86_64-unknown-linux-gnu", "znver3", ["avx", "avx2", "fma", "sse4.2"], cores=2)
X86_OLD = DeviceSpec.make("x86_64-unknown-linux-gnu", "nehalem", ["sse4.2"], cores=2)
ARM = DeviceSpec.make("aarch64-unknown-linux-gnu", "cortex-a72", ["neon"], cores=4)
T_X86 = "llvm -mtriple=x86_64-linux-gnu -mcpu=znver3 -mattr=+avx2,+fma -num-cores=2"
T_PLAIN = "llvm -mtriple=x86_64-linux-gnu -mcpu=generic -num-cores=1"
T_ARM = "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72 -num-cores=4"


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def state(clock):
    return TrackerState(agent_timeout=6.0, lease_slack=5.0, max_attempts=3, default_timeout=10.0,
                        unknown_key_grace=30.0, clock=clock)


def subs(*ids, target=T_X86, timeout=1.0):
    return [Submission(i, target, timeout, payload=f"payload-{i}") for i in ids]


def work(state, agent_id):
    return [w.request_id for w in state.next_work(agent_id, 0)]


def ok(rid, cost=1e-3):
    return Result(rid, [cost, cost])


def drain_results(state, waiter):
    return {r.request_id: r for r in state.wait_results(waiter, 0)}


# ----------------------------------------------------------------------------- targets

@pytest.mark.parametrize("target,device,runs", [
    (T_X86, X86, True),
    (T_PLAIN, X86_OLD, True),
    (T_X86, X86_OLD, False),                       # lacks avx2, fma
    (T_ARM, X86, False),                           # architecture
    (T_ARM, ARM, True),
    ("llvm -mtriple=arm64-apple-darwin23 -mcpu=generic", ARM, False),  # same arch, other OS
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=generic", DeviceSpec.make("arm64-unknown-linux-gnu"), True),
    ("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell", X86, False),      # cpu name, no -mattr: must match
    ("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell -mattr=+avx2,-avx512f", X86, True),
    ("llvm -num-cores=2", ARM, True),              # no triple: host of the compiler, unknown here
])
def test_target_capability(target, device, runs):
    reason = why_cannot_run(TargetSpec.parse(target), device)
    assert (reason is None) == runs, reason


def test_target_reasons_name_the_problem():
    assert "avx2" in why_cannot_run(TargetSpec.parse(T_X86), X86_OLD)
    assert "aarch64" in why_cannot_run(TargetSpec.parse(T_ARM), X86)
    with pytest.raises(ValueError, match="unknown target kind"):
        TargetSpec.parse("cuda -arch=sm_80")


def test_host_target_string_parses():
    from compiler.target import Target
    host = Target.host()
    spec = TargetSpec.parse(str(host))
    dev = DeviceSpec.make(host.triple, host.cpu, [f for f in host.features.split(",")])
    assert spec.triple == host.triple and spec.cpu == host.cpu
    assert why_cannot_run(spec, dev) is None


# ----------------------------------------------------------------------------- queues and dispatch

def test_priority_then_arrival(state):
    state.register_agent("probe", "k", X86)  # the key is known; the agent is busy with the first request
    w = state.submit("k", 0, subs("low1", "low2"))
    state.submit("k", 5, subs("high1"))
    state.submit("k", 0, subs("low3"))
    state.submit("k", 5, subs("high2"))
    aid = state.snapshot().agents[0].agent_id
    order = []
    for _ in range(5):
        (rid,) = work(state, aid)
        order.append(rid)
        assert state.report_result(aid, ok(rid)) is False
    # low1 was handed out at once (the agent was free); then priority, then arrival
    assert order == ["low1", "high1", "high2", "low2", "low3"]
    assert set(drain_results(state, w)) == {"low1", "low2"}


def test_key_isolation(state):
    a = state.register_agent("a", "k1", X86)
    b = state.register_agent("b", "k2", X86)
    state.submit("k1", 0, subs("r1", "r2"))
    assert work(state, a) == ["r1"]
    assert work(state, b) == []  # free, but of another key
    snap = {k.device_key: k for k in state.snapshot().keys}
    assert snap["k1"].queued == 1 and snap["k1"].in_flight == 1
    assert snap["k2"].queued == 0 and snap["k2"].in_flight == 0


def test_slots_bound_in_flight(state):
    a = state.register_agent("a", "k", X86, slots=2)
    state.submit("k", 0, subs("r1", "r2", "r3"))
    assert work(state, a) == ["r1", "r2"]
    state.report_result(a, ok("r1"))
    assert work(state, a) == ["r3"]


def test_work_spreads_over_free_agents(state):
    a = state.register_agent("a", "k", X86)
    b = state.register_agent("b", "k", X86)
    state.submit("k", 0, subs("r1", "r2", "r3"))
    assert len(work(state, a)) == 1 and len(work(state, b)) == 1
    assert state.snapshot().keys[0].queued == 1


def test_heterogeneous_agents_take_what_they_can_run(state):
    old = state.register_agent("old", "k", X86_OLD)
    new = state.register_agent("new", "k", X86)
    state.submit("k", 0, subs("needs-avx2") + subs("plain", target=T_PLAIN))
    got = {"old": work(state, old), "new": work(state, new)}
    assert got == {"old": ["plain"], "new": ["needs-avx2"]}


def test_draining_agent_gets_no_work(state):
    a = state.register_agent("a", "k", X86, slots=2)
    state.submit("k", 0, subs("r1"))
    state.drain(a)  # r1 was leased but not pushed yet: it goes back to the queue, no attempt spent
    assert work(state, a) == []
    state.submit("k", 0, subs("r2"))
    assert work(state, a) == []
    b = state.register_agent("b", "k", X86, slots=2)
    assert work(state, b) == ["r1", "r2"]


def test_next_work_wakes_on_dispatch(state):
    a = state.register_agent("a", "k", X86)
    got = []
    t = threading.Thread(target=lambda: got.extend(state.next_work(a, 5.0)))
    t.start()
    state.submit("k", 0, subs("r1"))
    t.join(2)
    assert [w.request_id for w in got] == ["r1"] and got[0].payload == "payload-r1"
    assert got[0].lease_seconds == pytest.approx(1.0 + 5.0)


# ----------------------------------------------------------------------------- leases

def test_lease_expiry_requeues_to_another_agent(state, clock):
    a = state.register_agent("a", "k", X86)
    w = state.submit("k", 0, subs("r1", "r2"))
    assert work(state, a) == ["r1"]
    b = state.register_agent("b", "k", X86)
    assert work(state, b) == ["r2"]
    clock.t += 3.0                       # heartbeats keep both agents, r1's lease (1 + 5 s) is not yet due
    state.heartbeat(a), state.heartbeat(b)
    state.report_result(b, ok("r2"))
    clock.t += 3.5                       # r1's lease expired; agent a is still heartbeating
    state.heartbeat(a)
    state.expire()
    assert work(state, b) == ["r1"]      # back at the front, to the free agent
    assert state.snapshot().agents[0].leases_lost == 1
    with pytest.raises(st.NotHeld, match="lease was lost"):
        state.report_result(a, ok("r1"))  # late result of the old holder
    assert state.report_result(b, ok("r1")) is False
    res = drain_results(state, w)
    assert set(res) == {"r1", "r2"} and res["r1"].attempts == 2 and res["r1"].agent == "b"
    assert state.report_result(a, ok("r1")) is True  # later still: it was answered, a duplicate


def test_requeued_request_goes_first(state, clock):
    a = state.register_agent("a", "k", X86)
    state.submit("k", 0, subs("first", "second", "third"))
    assert work(state, a) == ["first"]
    state.remove_agent(a, "test")
    b = state.register_agent("b", "k", X86)
    assert work(state, b) == ["first"]


def test_silent_agent_dropped_and_its_leases_requeued(state, clock):
    a = state.register_agent("a", "k", X86)
    b = state.register_agent("b", "k", X86)
    w = state.submit("k", 0, subs("r1", "r2"))
    wa, wb = work(state, a), work(state, b)
    state.report_result(b, ok(wb[0]))
    clock.t += 4.0
    state.heartbeat(b)
    clock.t += 2.5                       # a silent 6.5 s > 6 s; b silent 2.5 s
    state.expire()
    assert [x.name for x in state.snapshot().agents] == ["b"]
    assert work(state, b) == wa
    with pytest.raises(st.AgentGone, match="no heartbeat"):
        state.next_work(a, 0)
    with pytest.raises(st.UnknownAgent, match="no heartbeat"):
        state.heartbeat(a)
    state.report_result(b, ok(wa[0]))
    assert set(drain_results(state, w)) == {"r1", "r2"}


def test_max_attempts_answers_with_runner_error(state, clock):
    w = state.submit("k", 0, subs("doomed"))   # within the grace period: queued for an unseen key
    for n in range(3):
        a = state.register_agent(f"a{n}", "k", X86)
        assert work(state, a) == ["doomed"]
        state.remove_agent(a, f"crash {n}")
    (res,) = state.wait_results(w, 0)
    assert res.error_code == st.RUNNER_ERROR and res.attempts == 3 and res.agent == ""
    assert "3 attempt" in res.error_msg and "crash 0" in res.error_msg and "crash 2" in res.error_msg
    assert w.done


# ----------------------------------------------------------------------------- results

def test_result_for_request_not_held_is_refused(state):
    a = state.register_agent("a", "k", X86)
    b = state.register_agent("b", "k", X86)
    state.submit("k", 0, subs("r1"))
    holder, other = (a, b) if work(state, a) else (b, a)
    with pytest.raises(st.NotHeld, match="never handed"):
        state.report_result(other, ok("r1"))
    with pytest.raises(st.NotHeld):
        state.report_result(other, ok("no-such-request"))
    with pytest.raises(st.UnknownAgent):
        state.report_result("a999-nope", ok("r1"))
    assert state.report_result(holder, ok("r1")) is False
    assert state.report_result(holder, ok("r1")) is True   # the same result again: duplicate
    with pytest.raises(st.NotHeld):
        state.report_result(other, ok("r1"))               # never had it, even when answered
    snap = {x.agent_id: x for x in state.snapshot().agents}
    assert snap[holder].completed == 1 and snap[other].completed == 0


def test_error_results_count_as_failed(state):
    a = state.register_agent("a", "k", X86)
    state.submit("k", 0, subs("r1"))
    work(state, a)
    state.report_result(a, Result("r1", [], 5, "wrong answer"))
    assert state.snapshot().agents[0].failed == 1


# ----------------------------------------------------------------------------- idempotency

def test_resubmission_attaches_and_never_runs_twice(state):
    a = state.register_agent("a", "k", X86)
    w1 = state.submit("k", 0, subs("r1", "r2"))
    assert work(state, a) == ["r1"]
    w2 = state.submit("k", 0, subs("r1", "r2", "r3"))   # r1 in flight, r2 queued: both attach
    state.report_result(a, ok("r1"))
    assert work(state, a) == ["r2"]
    state.report_result(a, ok("r2"))
    assert work(state, a) == ["r3"]
    state.report_result(a, ok("r3"))
    assert work(state, a) == []
    assert set(drain_results(state, w1)) == {"r1", "r2"}
    assert set(drain_results(state, w2)) == {"r1", "r2", "r3"}
    assert state.snapshot().agents[0].completed == 3


def test_answered_cache_answers_resubmission_at_once(state, clock):
    a = state.register_agent("a", "k", X86)
    w = state.submit("k", 0, subs("r1"))
    work(state, a)
    state.report_result(a, ok("r1", 0.25))
    state.detach(w)                                     # the tuner went away before reading
    w2 = state.submit("k", 0, subs("r1"))
    assert work(state, a) == []
    assert drain_results(state, w2)["r1"].costs == [0.25, 0.25] and w2.done
    clock.t += 601                                      # past the TTL: forgotten, measured again
    state.heartbeat(a)
    state.expire()
    state.submit("k", 0, subs("r1"))
    assert work(state, a) == ["r1"]


def test_answered_cache_is_bounded(clock):
    s = TrackerState(result_cache_size=2, clock=clock)
    a = s.register_agent("a", "k", X86)
    s.submit("k", 0, subs("r1", "r2", "r3"))
    for _ in range(3):
        (rid,) = work(s, a)
        s.report_result(a, ok(rid))
    w = s.submit("k", 0, subs("r1", "r3"))
    assert work(s, a) == ["r1"]                         # evicted, measured again
    assert set(drain_results(s, w)) == {"r3"}


def test_detached_waiter_leaves_requests_queued(state):
    w = state.submit("k", 0, subs("r1"))
    state.detach(w)
    a = state.register_agent("a", "k", X86)
    assert work(state, a) == ["r1"]


def test_each_waiter_gets_each_result_once(state):
    a = state.register_agent("a", "k", X86)
    w1 = state.submit("k", 0, subs("r1"))
    w2 = state.submit("k", 0, subs("r1"))
    work(state, a)
    state.report_result(a, ok("r1"))
    assert list(drain_results(state, w1)) == ["r1"] and list(drain_results(state, w2)) == ["r1"]
    assert state.wait_results(w1, 0) == [] and state.wait_results(w2, 0) == []


# ----------------------------------------------------------------------------- refusals

def test_unknown_key_after_grace(state, clock):
    state.register_agent("a", "known", X86)
    early = state.submit("nobody", 0, subs("early"))
    clock.t += 31
    with pytest.raises(st.UnknownDeviceKey, match="'nobody'.*known"):
        state.submit("nobody", 0, subs("late"))
    state.expire()          # the request queued during the grace period is answered, not left hanging
    (res,) = state.wait_results(early, 0)
    assert res.error_code == st.RUNNER_ERROR and "no agent has registered" in res.error_msg


def test_target_no_agent_can_run_is_refused_atomically(state):
    a = state.register_agent("a", "k", X86_OLD)
    with pytest.raises(st.TargetNotRunnable, match="avx2"):
        state.submit("k", 0, subs("plain", target=T_PLAIN) + subs("needs-avx2"))
    assert work(state, a) == [] and state.snapshot().keys[0].queued == 0


def test_batch_validation(state):
    with pytest.raises(st.InvalidRequest, match="unique"):
        state.submit("k", 0, subs("r1", "r1"))
    with pytest.raises(st.InvalidRequest, match="target"):
        state.submit("k", 0, subs("r1", target="cuda"))
    state.submit("k1", 0, subs("r1"))
    with pytest.raises(st.InvalidRequest, match="already queued for device key 'k1'"):
        state.submit("k2", 0, subs("r1"))


def test_close_wakes_everyone(state):
    a = state.register_agent("a", "k", X86)
    w = state.submit("k", 0, subs("r1", "r2"))
    state.close()
    with pytest.raises(st.AgentGone, match="shutting down"):
        state.next_work(a, 1.0)
    with pytest.raises(st.TrackerClosed):
        state.wait_results(w, 1.0)
    with pytest.raises(st.TrackerClosed):
        state.submit("k", 0, subs("r3"))


# ----------------------------------------------------------------------------- requests leased ahead (Hello.prefetch)

def test_prefetch_cap_agrees_with_the_protocol():
    from rpc_tracker.protocol import MAX_PREFETCH
    assert st.MAX_PREFETCH == MAX_PREFETCH


def test_ahead_only_when_every_agent_is_busy(state):
    a = state.register_agent("a", "k", X86, prefetch=1)
    b = state.register_agent("b", "k", X86)                     # an agent of protocol 3: never ahead
    state.submit("k", 0, subs("r1", "r2"))
    assert work(state, a) == ["r1"] and work(state, b) == ["r2"]  # two free agents: one each, nothing ahead
    state.submit("k", 0, subs("r3", "r4", "r5"))
    assert work(state, a) == ["r3"]                             # all busy, queue longer than free agents: ahead
    assert work(state, b) == []                                 # b said nothing of prefetch
    state.report_result(b, ok("r2"))                             # b is free: it comes before anyone's second ahead
    assert work(state, b) == ["r4"] and work(state, a) == []
    state.report_result(a, ok("r1"))                             # a starts r3 (held) and is leased r5 ahead
    assert work(state, a) == ["r5"]
    assert state.snapshot().agents[0].in_flight == 2


def test_ahead_capped_at_max_prefetch(state):
    a = state.register_agent("a", "k", X86, prefetch=5)
    state.submit("k", 0, subs("r1", "r2", "r3", "r4"))
    assert work(state, a) == ["r1", "r2"]                        # slots + MAX_PREFETCH (1)
    assert state.snapshot().keys[0].queued == 2


def test_free_agent_gets_queued_work_not_an_ahead_one(state):
    a = state.register_agent("a", "k", X86, prefetch=1)
    state.submit("k", 0, subs("r1", "r2"))
    assert work(state, a) == ["r1", "r2"]
    state.submit("k", 0, subs("r3"))
    b = state.register_agent("b", "k", X86, prefetch=1)          # a joins late: r3 is its, not a's
    assert work(state, b) == ["r3"] and work(state, a) == []


def test_ahead_lease_counts_from_the_lease_it_waits_behind(state, clock):
    a = state.register_agent("a", "k", X86, prefetch=1)
    w = state.submit("k", 0, subs("r1", "r2", timeout=2.0))      # leases of 2 + 5 s slack
    items = state.next_work(a, 0)
    assert [i.request_id for i in items] == ["r1", "r2"]
    assert items[0].lease_seconds == pytest.approx(7.0) and items[1].lease_seconds == pytest.approx(14.0)
    clock.t += 8.0                                               # r1's lease is over, r2's is not
    state.heartbeat(a, ["r1", "r2"])
    state.expire()
    snap = state.snapshot().agents[0]
    assert snap.leases_lost == 1                                 # r1's only: r2's lease had 6 s to go
    assert work(state, a) == ["r1"]                              # queued again, and ahead of r2 to a, its only agent
    assert state.report_result(a, ok("r2")) is False
    assert state.report_result(a, ok("r1")) is False
    got = drain_results(state, w)
    assert got["r1"].attempts == 2 and got["r2"].attempts == 1


def test_heartbeats_that_name_a_request_renew_its_lease_up_to_the_cap(clock):
    state = TrackerState(lease_slack=3.0, lease_renewals=2, clock=clock)
    a = state.register_agent("a", "k", X86)
    b = state.register_agent("b", "k", X86)
    w = state.submit("k", 0, subs("r1", "r2", timeout=1.0))     # leases of 1 + 3 s, renewed to 12 s at most
    assert work(state, a) == ["r1"] and work(state, b) == ["r2"]
    for _ in range(3):                                           # a says it works on r1; b names nothing
        clock.t += 3.0
        state.heartbeat(a, ["r1", "not-its"]), state.heartbeat(b)
        state.expire()
    snap = {x.name: x for x in state.snapshot().agents}
    assert snap["a"].leases_lost == 0 and snap["b"].leases_lost == 1    # r2's 4 s lease ran out at 4 s
    assert state.report_result(a, ok("r1")) is False             # at 9 s: its renewed lease still holds
    assert work(state, b) == ["r2"]                              # again at 6 s: a lease to 10 s, renewed to 18 s at most
    kept = []
    for _ in range(5):
        state.heartbeat(a), state.heartbeat(b, ["r2"])
        state.expire()
        kept.append(state.snapshot().agents[1].leases_lost == 1)
        clock.t += 3.0
    assert kept == [True, True, True, True, False]               # held at 9-18 s, lost at 21 s
    assert work(state, a) == ["r2"] and state.report_result(a, ok("r2")) is False
    got = drain_results(state, w)
    assert got["r1"].attempts == 1 and got["r1"].agent == "a" and got["r2"].attempts == 3
    with pytest.raises(ValueError, match="lease_renewals"):
        TrackerState(lease_renewals=-1)


def test_agent_loss_requeues_its_ahead_request_exactly_once(state):
    a = state.register_agent("a", "k", X86, prefetch=1)
    w = state.submit("k", 0, subs("r1", "r2", "r3"))
    assert work(state, a) == ["r1", "r2"]
    state.remove_agent(a, "its stream closed")
    b = state.register_agent("b", "k", X86, prefetch=1)
    assert work(state, b) == ["r1", "r2"]                        # original order: lost leases go first
    for rid in ("r1", "r2"):
        assert state.report_result(b, ok(rid)) is False
    assert work(state, b) == ["r3"]
    assert state.report_result(b, ok("r3")) is False
    got = drain_results(state, w)
    assert set(got) == {"r1", "r2", "r3"} and got["r1"].attempts == 2 and got["r3"].attempts == 1
    with pytest.raises(st.UnknownAgent):
        state.report_result(a, ok("r2"))                         # the old connection cannot answer it again
    assert state.finished(w)


def test_drain_keeps_a_pushed_ahead_request_and_gives_back_the_rest(state):
    a = state.register_agent("a", "k", X86, prefetch=1)
    w = state.submit("k", 0, subs("r1", "r2", "r3"))
    assert work(state, a) == ["r1", "r2"]                        # both pushed: a holds them
    state.drain(a)
    for rid in ("r1", "r2"):                                    # a finishes what it holds, ahead included
        assert state.report_result(a, ok(rid)) is False
    assert work(state, a) == []                                  # draining: nothing more, not even ahead
    b = state.register_agent("b", "k", X86)
    assert work(state, b) == ["r3"]
    state.report_result(b, ok("r3"))
    assert set(drain_results(state, w)) == {"r1", "r2", "r3"}


def test_drain_returns_an_ahead_request_not_yet_pushed(state):
    a = state.register_agent("a", "k", X86, prefetch=1)
    state.submit("k", 0, subs("r1", "r2"))                       # leased, not yet pushed down the stream
    state.drain(a)
    b = state.register_agent("b", "k", X86, prefetch=1)
    assert work(state, b) == ["r1", "r2"]
    assert state.snapshot().agents[0].in_flight == 0
