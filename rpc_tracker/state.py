"""The tracker's memory: agents, per-key queues, leases and answered results.

Pure Python and no gRPC, so every rule of the farm (priorities, key isolation, slots, leases,
re-dispatch, exactly-once answers) is unit-tested without sockets and with a fake clock; the
servicer only translates between protobuf messages and this module.

One lock guards everything. A stream that waits (an agent's for work, a tuner's for results) is
woken by its own signal, so a result wakes exactly the streams that want it, not every stream of
the farm: a thread waits on its own Condition built on that lock (`next_work` / `wait_results`
with a timeout), and the tracker's asyncio server passes a `wake` callable instead, called under
the lock whenever the stream has something to send or must end, and then takes what is there
without waiting (timeout 0).

Rules, in one place:
- Queues: one per device key, ordered by priority (higher first), then arrival (a sequence
  number). A request whose lease is lost goes back with its original sequence number, so it is
  ahead of everything that arrived after it.
- Dispatch: a queued request goes only to an agent registered under exactly its key, that is not
  draining, has fewer requests in flight than its slots, and can run the request's target.
- Ahead: an agent that accepts requests ahead of its slots (`prefetch`, at most one here) is
  leased one more when every agent of its key is busy and requests are still queued (so the key's
  queue holds more requests than there are free agents): it starts that request the moment it
  reports the one before, instead of waiting a dispatch round trip. A request leased ahead is held
  like any other: only its holder may answer, and it is requeued when the agent leaves or the lease
  expires; its lease runs from the latest lease it waits behind, so waiting does not eat into it.
  A free agent always comes first, so work is only ever ahead when no agent could start it now.
- Leases: handing a request to an agent starts a lease of options.timeout_seconds + slack. While
  the holder's heartbeats name the request (it is received and not yet answered), the lease is
  renewed to a full lease from that heartbeat, up to lease_renewals more leases in all: a live
  agent that is replacing a crashed or slow worker, calibrating it and measuring again keeps its
  request, and one whose measuring is stuck behind a live heartbeat still loses it. A lease
  is lost when it expires or its agent leaves (stream closed, silent past agent_timeout); the
  request is queued again, unless it has already been handed out max_attempts times, in which
  case it is answered with a RUNNER_ERROR result that says what happened, so it never hangs.
- Results: only the agent that holds the lease may answer. A second result for an answered
  request from an agent that was handed it is acknowledged as a duplicate and dropped; a result
  from an agent that does not hold the request (never had it, or its lease moved on) is refused
  with NotHeld.
- Idempotency: submitting a request id that is queued or in flight attaches the new caller to it
  (it never runs twice); a request id answered within result_ttl seconds is answered at once
  from the cache (bounded to result_cache_size entries, oldest first out).
- Delivery: every Measure call waiting on a request id receives its result exactly once.
- Unknown keys: for unknown_key_grace seconds after start (agents reconnect after a tracker
  restart while tuners already re-submit) requests for a key no agent has registered under are
  queued; after that such submissions are refused, and requests still queued for a key that never
  got an agent are answered with a RUNNER_ERROR result.
- Targets: if agents of the key are registered and none of them can run a request's target, the
  whole batch is refused (TargetNotRunnable) before anything is queued.
- Health (health.py): an agent reports its state (healthy, slow, degraded, unknown) from its
  measuring workers' calibrations when it registers and on heartbeats. A degraded agent is out of
  its key's dispatch (what was leased to it and not yet pushed goes back to the queue) until a
  report says it recovered; a slow one is handed work after the healthy ones. The calibrations it
  reports are kept per device key and host (`host_history`), for the next agent there.
- Emulation: a device key is served by emulated agents (qemu-user boards) or by native ones, never
  both at once: an agent of the other kind is refused at registration (EmulationMismatch), so the
  timings of one key's requests are all of one kind, and each result says which (`emulated`).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from compiler.errors import TargetError

from .health import DEGRADED, SLOW, HealthReport, HostHistories
from .targets import DeviceSpec, TargetSpec, why_cannot_run

log = logging.getLogger("rpc_tracker")

NO_ERROR = 0
MAX_PREFETCH = 1  # protocol.MAX_PREFETCH (state.py imports nothing of gRPC; a test checks they agree)
RUNNER_ERROR = 7  # tuner.candidate.ErrorCode.RUNNER_ERROR (the tracker cannot import the tuner)


# ----------------------------------------------------------------------------- errors

class TrackerError(Exception):
    """Base of the errors the servicer turns into a gRPC status (see servicer.STATUS_OF)."""


class InvalidRequest(TrackerError):
    """A malformed submission or report (INVALID_ARGUMENT)."""


class UnknownAgent(TrackerError):
    """An agent id the tracker does not know, or no longer knows (NOT_FOUND: reconnect)."""


class UnknownDeviceKey(TrackerError):
    """A submission for a key no agent has ever registered under (NOT_FOUND)."""


class NotHeld(TrackerError):
    """A result for a request the reporting agent does not hold (FAILED_PRECONDITION)."""


class TargetNotRunnable(TrackerError):
    """No registered agent of the key can run a request's target (FAILED_PRECONDITION)."""


class EmulationMismatch(TrackerError):
    """An emulated agent joining a key served by native agents, or the other way (FAILED_PRECONDITION)."""


class TrackerClosed(TrackerError):
    """The tracker is shutting down (UNAVAILABLE: resubmit to the next one)."""


class AgentGone(TrackerError):
    """The agent was dropped or left; its stream must end. `str()` says why."""


def _emulation_mismatch(device_key: str, emulated: bool, other: str) -> str:
    this, that = ("emulated", "native") if emulated else ("native", "emulated")
    return (f"device key {device_key!r} is served by {that} agents ({other}); a {this} agent's timings are not "
            f"comparable with theirs: register it under a key of its own (e.g. {device_key}-{'qemu' if emulated else 'native'})")


# ----------------------------------------------------------------------------- plain data

@dataclass
class Submission:
    """One request of a tuner's batch, as the state needs it; `payload` is passed to the agent as is."""

    request_id: str
    target: str
    timeout_seconds: float = 0.0   # 0: the state's default_timeout
    payload: Any = None


@dataclass
class Result:
    request_id: str
    costs: list = field(default_factory=list)
    error_code: int = NO_ERROR
    error_msg: str = ""
    run_seconds: float = 0.0
    agent: str = ""
    attempts: int = 0
    timing: Any = None             # the agent's measurement-protocol summary (pb.Timing), passed on as it is
    emulated: bool = False         # measured by an emulated agent
    slow_window: bool = False      # timed in a window its closing calibration found slow (not re-taken)
    remeasured: bool = False       # re-taken in a fresh worker after a slow window
    slow_index: float = 0.0        # the speed index that found the window slow (0: neither)


@dataclass
class WorkItem:
    """One request pushed down an agent's stream."""

    request_id: str
    payload: Any
    lease_seconds: float


@dataclass
class AgentInfo:
    agent_id: str
    name: str
    device_key: str
    device: DeviceSpec
    slots: int
    in_flight: int
    completed: int
    failed: int
    leases_lost: int
    connected_seconds: float
    last_seen_seconds_ago: float
    draining: bool
    health: HealthReport = field(default_factory=HealthReport)


@dataclass
class KeyInfo:
    device_key: str
    agents: int
    queued: int
    in_flight: int
    completed: int
    degraded: int = 0              # agents of the key that get no work until they recover


@dataclass
class Snapshot:
    uptime_seconds: float
    agents: list
    keys: list


# ----------------------------------------------------------------------------- internal records

class _Agent:
    def __init__(self, agent_id, name, device_key, device, slots, now, cond, wake, ahead=0):
        self.agent_id, self.name, self.device_key, self.device = agent_id, name, device_key, device
        self.slots = slots
        self.ahead = ahead                          # requests it may hold beyond its slots
        self.connected_at = self.last_seen = now
        self.last_assigned = 0.0
        self.completed = self.failed = self.leases_lost = 0
        self.draining = False
        self.held: dict[str, _Request] = {}        # request id -> request, leased to this agent
        self.outbox: deque[WorkItem] = deque()     # leased but not yet pushed down the stream
        self.reported_holding: tuple = ()          # what the last heartbeat said
        self.cond = cond
        self.wake: Callable[[], None] | None = wake
        self.gone_reason: str | None = None
        self.health = HealthReport()               # as the agent last reported it (health.py)
        self._why_not: dict[TargetSpec, str | None] = {}  # target -> why_cannot_run, asked once per target

    def notify(self) -> None:
        """Its stream has work to push or must end (lock held): it waits through `wake` or on `cond`."""
        if self.wake is not None:
            self.wake()
        else:
            self.cond.notify_all()

    def why_not(self, spec: TargetSpec) -> str | None:
        """why_cannot_run(spec, self.device), remembered: a tuning run sends one target thousands of times."""
        try:
            return self._why_not[spec]
        except KeyError:
            reason = self._why_not[spec] = why_cannot_run(spec, self.device)
            return reason


class _Request:
    def __init__(self, sub: Submission, key: str, priority: int, seq: int, spec: TargetSpec, timeout: float):
        self.request_id, self.device_key, self.priority, self.seq = sub.request_id, key, priority, seq
        self.spec, self.timeout, self.payload = spec, timeout, sub.payload
        self.attempts = 0
        self.holder: _Agent | None = None
        self.lease_deadline = 0.0
        self.renew_until = 0.0                     # heartbeats extend the lease up to this
        self.entry: list | None = None             # its live heap entry while queued
        self.handed_to: set[str] = set()           # agent ids that were ever handed it
        self.losses: list[str] = []                # why each lost lease was lost
        self.waiters: set[ResultWaiter] = set()


class ResultWaiter:
    """One Measure call's view of its batch: results not yet delivered, and the ids still pending."""

    def __init__(self, cond: threading.Condition, wake: Callable[[], None] | None = None):
        self.cond = cond
        self.wake = wake
        self.inbox: deque[Result] = deque()
        self.pending: set[str] = set()
        self.closed = False

    @property
    def done(self) -> bool:
        return not self.pending and not self.inbox

    def notify(self) -> None:
        """Its stream has results to send or must end (lock held): it waits through `wake` or on `cond`."""
        if self.wake is not None:
            self.wake()
        else:
            self.cond.notify_all()


# ----------------------------------------------------------------------------- the state

class TrackerState:
    def __init__(self, *, agent_timeout: float = 6.0, lease_slack: float = 5.0, lease_renewals: int = 3,
                 max_attempts: int = 3,
                 default_timeout: float = 10.0, result_ttl: float = 600.0, result_cache_size: int = 100_000,
                 unknown_key_grace: float = 30.0, clock: Callable[[], float] = time.monotonic):
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        if lease_renewals < 0:
            raise ValueError(f"lease_renewals must not be negative, got {lease_renewals}")
        self.lease_renewals = lease_renewals
        self.agent_timeout, self.lease_slack, self.max_attempts = agent_timeout, lease_slack, max_attempts
        self.default_timeout, self.result_ttl, self.result_cache_size = default_timeout, result_ttl, result_cache_size
        self.unknown_key_grace = unknown_key_grace
        self._clock = clock
        self._lock = threading.Lock()
        self._started = clock()
        self._seq = itertools.count()
        self._agent_numbers = itertools.count(1)
        self._agents: dict[str, _Agent] = {}
        self._key_agents: dict[str, dict[str, _Agent]] = {}  # key -> its agents: dispatch looks at one key's only
        # key -> its agents that could take a request now (in flight < slots + ahead, not draining):
        # dispatch runs on every report and looks at these few instead of all of the key's agents
        self._room: dict[str, dict[str, _Agent]] = {}
        self._queues: dict[str, list] = {}              # key -> heap of [-priority, seq, request id]
        self._queued: dict[str, int] = {}               # key -> live entries in its heap
        self._requests: dict[str, _Request] = {}        # queued or leased, not yet answered
        # request id -> (result, when answered, ids of the agents that were handed it)
        self._answered: OrderedDict[str, tuple[Result, float, frozenset]] = OrderedDict()
        self._gone: OrderedDict[str, str] = OrderedDict()  # recently dropped agent id -> why
        self._completed: dict[str, int] = {}            # key -> requests answered
        self._keys_seen: set[str] = set()               # keys any agent ever registered under
        self._waiters: set[ResultWaiter] = set()
        self._histories = HostHistories()               # (key, host) -> calibrations its agents reported
        self.closed = False

    # ------------------------------------------------------------------ agents

    def register_agent(self, name: str, device_key: str, device: DeviceSpec, slots: int = 1,
                       wake: Callable[[], None] | None = None, prefetch: int = 0,
                       health: HealthReport | None = None) -> str:
        """A new agent connection; returns its agent id. Queued work of its key is dispatched to it
        (unless its `health` says it is degraded).

        `wake`, if given, is called (lock held) whenever the agent's stream has work or must end.
        `prefetch`: requests the agent accepts ahead of its slots (capped at MAX_PREFETCH).
        """
        with self._lock:
            if self.closed:
                raise TrackerClosed("the tracker is shutting down")
            other = next((a for a in self._agents.values()
                          if a.device_key == device_key and a.device.emulated != device.emulated), None)
            if other is not None:
                raise EmulationMismatch(_emulation_mismatch(device_key, device.emulated, other.name))
            now = self._clock()
            agent_id = f"a{next(self._agent_numbers)}-{uuid.uuid4().hex[:8]}"
            agent = _Agent(agent_id, name or agent_id, device_key, device, max(1, int(slots)), now,
                           threading.Condition(self._lock), wake, min(max(0, int(prefetch)), MAX_PREFETCH))
            if health is not None:
                agent.health = health
                self._histories.add(device_key, device.hostname, health.calibrations)
                health.calibrations = []
            self._agents[agent_id] = agent
            self._key_agents.setdefault(device_key, {})[agent_id] = agent
            self._refresh(agent)
            self._keys_seen.add(device_key)
            log.info("agent joined: %s (%s) key=%s triple=%s cpu=%s cores=%d slots=%d ahead=%d", agent.name,
                     agent_id, device_key, device.triple, device.cpu or "?", device.cores, agent.slots, agent.ahead)
            self._dispatch(device_key)
            return agent_id

    def remove_agent(self, agent_id: str, reason: str) -> bool:
        """Drop an agent; its leases are lost (requeued). False if it was already gone."""
        with self._lock:
            return self._remove_agent(agent_id, reason)

    def heartbeat(self, agent_id: str, holding: Iterable[str] = (), health: HealthReport | None = None) -> None:
        with self._lock:
            agent = self._agent(agent_id)
            agent.last_seen = self._clock()
            agent.reported_holding = tuple(holding)
            for rid in agent.reported_holding:  # still working on it: a full lease from now, within the cap
                req = agent.held.get(rid)
                if req is not None and req.lease_deadline >= agent.last_seen:  # an expired lease stays lost
                    renewed = min(agent.last_seen + req.timeout + self.lease_slack, req.renew_until)
                    req.lease_deadline = max(req.lease_deadline, renewed)
            if health is not None:
                self._take_health(agent, health)

    def host_history(self, device_key: str, host: str) -> list:
        """The calibrations agents of `device_key` on `host` reported (payloads, oldest first)."""
        with self._lock:
            return self._histories.get(device_key, host)

    def _take_health(self, agent: _Agent, health: HealthReport) -> None:
        """An agent's new health report (lock held): its calibrations join its host's history; a
        change into or out of degraded takes it out of dispatch or puts it back."""
        self._histories.add(agent.device_key, agent.device.hostname, health.calibrations)
        health.calibrations = []
        before, agent.health = agent.health.state, health
        if health.state == before:
            return
        index = f"{health.speed_index:.2f}" if health.speed_index else "not judged"
        if health.state == DEGRADED:
            log.warning("agent degraded: %s (%s) key=%s, speed index %s: it gets no work until it recovers",
                        agent.name, agent.agent_id, agent.device_key, index)
            self._take_back_unsent(agent)
        elif before == DEGRADED:
            log.info("agent recovered: %s (%s) key=%s is %s, speed index %s", agent.name, agent.agent_id,
                     agent.device_key, health.state, index)
        else:
            log.info("agent %s (%s) key=%s is %s, speed index %s", agent.name, agent.agent_id, agent.device_key,
                     health.state, index)
        self._refresh(agent)
        self._dispatch(agent.device_key)

    def _take_back_unsent(self, agent: _Agent) -> None:
        """What was leased to `agent` and not yet pushed down its stream goes back to the queue (lock
        held): it never saw it, so no attempt is spent."""
        while agent.outbox:
            item = agent.outbox.pop()
            req = agent.held.pop(item.request_id)
            req.attempts -= 1
            req.handed_to.discard(agent.agent_id)
            req.holder = None
            self._enqueue(req)

    def drain(self, agent_id: str) -> None:
        """The agent takes no more work; what it was handed but not yet sent goes back to the queue."""
        with self._lock:
            agent = self._agent(agent_id)
            agent.last_seen = self._clock()
            if agent.draining:
                return
            agent.draining = True
            self._refresh(agent)
            log.info("agent draining: %s (%s) key=%s, %d in flight", agent.name, agent_id, agent.device_key,
                     len(agent.held))
            self._take_back_unsent(agent)
            self._dispatch(agent.device_key)

    def next_work(self, agent_id: str, timeout: float) -> list[WorkItem]:
        """Work to push to the agent, waiting up to `timeout` for some ([] if none came).

        Raises AgentGone (with the reason) once the agent is dropped or the tracker closes.
        """
        with self._lock:
            agent = self._agents.get(agent_id)
            if agent is None:
                raise AgentGone(self._gone.get(agent_id, f"agent {agent_id} is not registered"))
            if not agent.outbox and agent.gone_reason is None and timeout > 0:
                agent.cond.wait(timeout)
            if agent.gone_reason is not None:
                raise AgentGone(agent.gone_reason)
            items = list(agent.outbox)
            agent.outbox.clear()
            return items

    def report_result(self, agent_id: str, result: Result) -> bool:
        """Accept an agent's result; returns True when it was a duplicate (dropped).

        Raises UnknownAgent, or NotHeld when the agent does not hold the request.
        """
        with self._lock:
            agent = self._agent(agent_id)
            agent.last_seen = self._clock()
            rid = result.request_id
            req = self._requests.get(rid)
            if req is not None and req.holder is agent:
                agent.held.pop(rid, None)
                self._refresh(agent)
                agent.completed += 1
                if result.error_code != NO_ERROR:
                    agent.failed += 1
                result.agent = result.agent or agent.name
                result.emulated = agent.device.emulated  # as the agent registered, whatever the report says
                result.attempts = req.attempts
                self._answer(req, result)
                self._dispatch(agent.device_key)
                return False
            if req is None and rid in self._answered and agent_id in self._answered[rid][2]:
                return True  # answered already (by this agent or another one after its lease moved)
            if req is not None and agent_id in req.handed_to:
                raise NotHeld(f"request {rid!r} is no longer leased to agent {agent.name}: its lease was lost "
                              f"({req.losses[-1] if req.losses else 'moved'}) and it was queued again")
            raise NotHeld(f"agent {agent.name} does not hold request {rid!r}: the tracker never handed it to this agent")

    # ------------------------------------------------------------------ tuners

    def submit(self, device_key: str, priority: int, submissions: list[Submission],
               wake: Callable[[], None] | None = None) -> ResultWaiter:
        """Queue a batch (atomically: a refused batch queues nothing); returns the caller's waiter.

        `wake`, if given, is called (lock held) whenever the waiter has results or must end.

        Raises InvalidRequest, UnknownDeviceKey, TargetNotRunnable or TrackerClosed.
        """
        with self._lock:
            if self.closed:
                raise TrackerClosed("the tracker is shutting down; submit again to its successor")
            now = self._clock()
            ids = [s.request_id for s in submissions]
            if len(set(ids)) != len(ids):
                raise InvalidRequest("request ids in one batch must be unique")
            agents = self._agents_of(device_key)
            new: dict[str, TargetSpec] = {}   # request id -> its parsed target, for requests not seen before
            for s in submissions:
                if s.request_id in self._answered:
                    continue
                old = self._requests.get(s.request_id)
                if old is not None:
                    if old.device_key != device_key:
                        raise InvalidRequest(f"request {s.request_id!r} is already queued for device key "
                                             f"{old.device_key!r}, not {device_key!r}")
                    continue
                try:
                    spec = TargetSpec.parse(s.target)
                except TargetError as e:
                    raise InvalidRequest(f"request {s.request_id!r}: {e}") from None
                new[s.request_id] = spec
            if new and not agents and device_key not in self._keys_seen \
                    and now - self._started >= self.unknown_key_grace:
                raise UnknownDeviceKey(self._unknown_key_message(device_key))
            if agents:
                checked: set[TargetSpec] = set()  # a batch has one target or a few: check each once
                for rid, spec in new.items():
                    if spec in checked:
                        continue
                    reasons = [a.why_not(spec) for a in agents]
                    if all(reasons):
                        raise TargetNotRunnable(
                            f"request {rid!r}: no agent of device key {device_key!r} can run target "
                            f"{spec.text!r} ({len(agents)} agent{'s' if len(agents) > 1 else ''}; "
                            f"{agents[0].name}: {reasons[0]})")
                    checked.add(spec)

            waiter = ResultWaiter(threading.Condition(self._lock), wake)
            for s in submissions:
                cached = self._answered.get(s.request_id)
                if cached is not None:
                    waiter.inbox.append(cached[0])
                    continue
                req = self._requests.get(s.request_id)
                if req is None:
                    spec = new[s.request_id]
                    timeout = s.timeout_seconds if s.timeout_seconds > 0 else self.default_timeout
                    req = _Request(s, device_key, int(priority), next(self._seq), spec, timeout)
                    self._requests[s.request_id] = req
                    self._enqueue(req)
                req.waiters.add(waiter)
                waiter.pending.add(s.request_id)
            self._waiters.add(waiter)
            self._dispatch(device_key)
            return waiter

    def wait_results(self, waiter: ResultWaiter, timeout: float) -> list[Result]:
        """Results not yet delivered to this waiter, waiting up to `timeout` for one ([] if none came).

        Raises TrackerClosed when the tracker shuts down with results still pending.
        """
        with self._lock:
            if not waiter.inbox and waiter.pending and not waiter.closed and not self.closed and timeout > 0:
                waiter.cond.wait(timeout)
            out = list(waiter.inbox)
            waiter.inbox.clear()
            if not out and self.closed and waiter.pending:
                raise TrackerClosed("the tracker is shutting down; submit the unanswered requests again")
            return out

    def finished(self, waiter: ResultWaiter) -> bool:
        """True once every request of the waiter's batch has been delivered to it."""
        with self._lock:
            return waiter.done

    def detach(self, waiter: ResultWaiter) -> None:
        """The Measure call went away: stop delivering to it. Its requests stay queued (and cached when answered)."""
        with self._lock:
            waiter.closed = True
            for rid in waiter.pending:
                req = self._requests.get(rid)
                if req is not None:
                    req.waiters.discard(waiter)
            waiter.pending.clear()
            waiter.inbox.clear()
            self._waiters.discard(waiter)
            waiter.notify()

    # ------------------------------------------------------------------ time

    def expire(self) -> None:
        """Drop silent agents, take back overdue leases, forget old results. Called by the reaper."""
        with self._lock:
            now = self._clock()
            for agent in list(self._agents.values()):
                silent = now - agent.last_seen
                if silent > self.agent_timeout:
                    self._remove_agent(agent.agent_id, f"no heartbeat for {silent:.1f} s "
                                                       f"(timeout {self.agent_timeout:g} s)")
            overdue = [r for r in self._requests.values() if r.holder is not None and r.lease_deadline < now]
            for req in overdue:
                self._lose_lease(req, f"no result from agent {req.holder.name} within its "
                                      f"{req.timeout + self.lease_slack:g} s lease (its heartbeats renew it for "
                                      f"{self.lease_renewals} leases more at most)")
            while self._answered:
                rid, (_, when, _) = next(iter(self._answered.items()))
                if now - when <= self.result_ttl:
                    break
                self._answered.popitem(last=False)
            if now - self._started >= self.unknown_key_grace:
                orphans = [r for r in self._requests.values()
                           if r.device_key not in self._keys_seen and r.holder is None]
                for req in orphans:
                    self._answer(req, Result(req.request_id, error_code=RUNNER_ERROR, attempts=req.attempts,
                                             error_msg=self._unknown_key_message(req.device_key)))

    # ------------------------------------------------------------------ reading

    def snapshot(self) -> Snapshot:
        with self._lock:
            now = self._clock()
            agents = [AgentInfo(a.agent_id, a.name, a.device_key, a.device, a.slots, len(a.held), a.completed,
                                a.failed, a.leases_lost, now - a.connected_at, now - a.last_seen, a.draining, a.health)
                      for a in sorted(self._agents.values(), key=lambda a: (a.device_key, a.name, a.agent_id))]
            keys = sorted(set(self._keys_seen) | set(self._queues) | set(self._completed))
            infos = []
            for k in keys:
                mine = [a for a in self._agents.values() if a.device_key == k]
                infos.append(KeyInfo(k, len(mine), self._queued.get(k, 0), sum(len(a.held) for a in mine),
                                     self._completed.get(k, 0), sum(a.health.state == DEGRADED for a in mine)))
            return Snapshot(now - self._started, agents, infos)

    def agent_name(self, agent_id: str) -> str | None:
        with self._lock:
            a = self._agents.get(agent_id)
            return a.name if a else None

    def close(self) -> None:
        """Shutting down: wake every stream so it ends (agents reconnect, tuners resubmit)."""
        with self._lock:
            self.closed = True
            for agent in self._agents.values():
                agent.gone_reason = "the tracker is shutting down; reconnect to its successor"
                agent.notify()
            for w in self._waiters:
                w.notify()

    # ------------------------------------------------------------------ internals (lock held)

    def _agent(self, agent_id: str) -> _Agent:
        agent = self._agents.get(agent_id)
        if agent is None:
            why = self._gone.get(agent_id)
            raise UnknownAgent(f"unknown agent id {agent_id!r}: "
                               f"{why if why else 'it was dropped or never registered'}; connect again")
        return agent

    def _agents_of(self, key: str) -> list[_Agent]:
        return list(self._key_agents.get(key, {}).values())

    def _unknown_key_message(self, key: str) -> str:
        known = sorted(self._keys_seen)
        return (f"no agent has registered under device key {key!r} "
                f"(keys with agents: {', '.join(known) if known else 'none'})")

    def _remove_agent(self, agent_id: str, reason: str) -> bool:
        agent = self._agents.pop(agent_id, None)
        if agent is None:
            return False
        del self._key_agents[agent.device_key][agent_id]
        self._room.get(agent.device_key, {}).pop(agent_id, None)
        agent.gone_reason = f"agent {agent.name} dropped: {reason}"
        self._gone[agent_id] = agent.gone_reason
        while len(self._gone) > 1000:
            self._gone.popitem(last=False)
        agent.notify()
        log.info("agent left: %s (%s) key=%s: %s; %d lease(s) to requeue, %d completed",
                 agent.name, agent_id, agent.device_key, reason, len(agent.held), agent.completed)
        for req in list(agent.held.values()):
            self._lose_lease(req, f"agent {agent.name} left ({reason})")
        agent.outbox.clear()
        self._dispatch(agent.device_key)
        return True

    def _lose_lease(self, req: _Request, reason: str) -> None:
        agent = req.holder
        if agent is not None:
            agent.held.pop(req.request_id, None)
            self._refresh(agent)
            agent.leases_lost += 1
            for item in list(agent.outbox):
                if item.request_id == req.request_id:
                    agent.outbox.remove(item)
        req.holder = None
        req.losses.append(reason)
        if req.attempts >= self.max_attempts:
            log.warning("lease lost: request %s: %s; attempt %d of %d, giving up", req.request_id, reason,
                        req.attempts, self.max_attempts)
            self._answer(req, Result(req.request_id, error_code=RUNNER_ERROR, attempts=req.attempts,
                                     error_msg=f"request lost its lease {len(req.losses)} times, giving up after "
                                               f"{req.attempts} attempt(s): " + "; ".join(req.losses)))
        else:
            log.warning("lease lost: request %s: %s; attempt %d of %d, queued again", req.request_id, reason,
                        req.attempts, self.max_attempts)
            self._enqueue(req)
        if agent is not None:
            self._dispatch(agent.device_key)
        self._dispatch(req.device_key)

    def _refresh(self, agent: _Agent) -> None:
        """Keep `agent` in its key's `_room` exactly while it could take a request (after any change
        of its held requests, draining or registration)."""
        if not agent.draining and agent.gone_reason is None and len(agent.held) < agent.slots + agent.ahead \
                and agent.health.state != DEGRADED and self._agents.get(agent.agent_id) is agent:
            self._room.setdefault(agent.device_key, {})[agent.agent_id] = agent
        else:
            room = self._room.get(agent.device_key)
            if room is not None:
                room.pop(agent.agent_id, None)

    def _enqueue(self, req: _Request) -> None:
        req.entry = [-req.priority, req.seq, req.request_id]
        heapq.heappush(self._queues.setdefault(req.device_key, []), req.entry)
        self._queued[req.device_key] = self._queued.get(req.device_key, 0) + 1

    def _unqueue(self, req: _Request) -> None:
        """Take a queued request out of its heap (lazily: its entry is skipped when it surfaces)."""
        if req.entry is not None:
            req.entry = None
            self._queued[req.device_key] -= 1

    def _live(self, entry) -> _Request | None:
        req = self._requests.get(entry[2])
        return req if req is not None and req.entry is entry else None

    def _take_for(self, key: str, agent: _Agent) -> _Request | None:
        """The first queued request of `key` (priority, then arrival) that `agent` can run."""
        heap = self._queues.get(key)
        while heap and self._live(heap[0]) is None:
            heapq.heappop(heap)  # stale entry of a request taken out of the queue
        if not heap:
            return None
        head = self._live(heap[0])
        if agent.why_not(head.spec) is None:
            heapq.heappop(heap)
            self._unqueue(head)
            return head
        for entry in sorted(heap):  # the head needs another agent: look further down, in order
            req = self._live(entry)
            if req is not None and agent.why_not(req.spec) is None:
                self._unqueue(req)
                return req
        return None

    def _dispatch(self, key: str) -> None:
        if self._queued.get(key, 0) <= 0:
            return
        while self._queued.get(key, 0) > 0:
            room = self._room.get(key)
            if not room:
                return
            free = [a for a in room.values() if len(a.held) < a.slots and a.gone_reason is None]
            if not free:  # every agent busy and requests still queued: lease ahead to those that take it
                free = [a for a in room.values() if a.gone_reason is None]
                if not free:
                    return
            heap = self._queues[key]
            while heap and self._live(heap[0]) is None:
                heapq.heappop(heap)
            tried = self._live(heap[0]).handed_to if heap else ()
            # a request that lost a lease goes to another agent when there is one; then a healthy
            # agent before a slow one; then the least loaded, then the one that has waited longest
            free.sort(key=lambda a: (a.agent_id in tried, a.health.state == SLOW, len(a.held) / a.slots,
                                     a.last_assigned))
            for agent in free:
                req = self._take_for(key, agent)
                if req is not None:
                    self._lease(req, agent)
                    break
            else:
                return  # free agents, but none can run what is queued

    def _lease(self, req: _Request, agent: _Agent) -> None:
        now = self._clock()
        lease = req.timeout + self.lease_slack
        if len(agent.held) >= agent.slots:  # ahead: it starts when a slot frees, at the latest when the
            # lease it waits behind runs out; its own lease counts from then
            lease += max(0.0, max(r.lease_deadline for r in agent.held.values()) - now)
        req.holder, req.lease_deadline = agent, now + lease
        req.renew_until = req.lease_deadline + self.lease_renewals * (req.timeout + self.lease_slack)
        req.attempts += 1
        req.handed_to.add(agent.agent_id)
        agent.held[req.request_id] = req
        self._refresh(agent)
        agent.last_assigned = now
        agent.outbox.append(WorkItem(req.request_id, req.payload, lease))
        agent.notify()

    def _answer(self, req: _Request, result: Result) -> None:
        self._requests.pop(req.request_id, None)
        self._unqueue(req)
        if req.holder is not None:
            req.holder.held.pop(req.request_id, None)
            self._refresh(req.holder)
            req.holder = None
        self._answered[req.request_id] = (result, self._clock(), frozenset(req.handed_to))
        self._answered.move_to_end(req.request_id)
        while len(self._answered) > self.result_cache_size:
            self._answered.popitem(last=False)
        self._completed[req.device_key] = self._completed.get(req.device_key, 0) + 1
        for w in req.waiters:
            w.inbox.append(result)
            w.pending.discard(req.request_id)
            w.notify()
        req.waiters.clear()
