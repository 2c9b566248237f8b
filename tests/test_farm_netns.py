"""The farm across a network: the tracker and the tuner on one host, agents on others (tests/netns.py).

Every host here is a network namespace this test made; the agents' links delay each packet 50 ms
each way and lose 2 % of them, and only let the agents dial out. Everything is real: the tracker
(`python -m rpc_tracker`), the agents (`python -m device_agent`), the tuner (`tests/netns_tuner.py`,
the same `tune()` as `tunefarm tune --tracker`), real kernels measured in the agents' workers.
Each test checks the records the tuner stored: every candidate measured once, by an agent.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import netns
import pytest
from processes import kill_group, wait_for

from rpc_tracker.client import make_channel
from rpc_tracker.protocol import auth_metadata, pb, pb_grpc
from tuner.records import open_store

pytestmark = pytest.mark.netns

_why_not = netns.unavailable()
if _why_not:
    pytest.skip(f"netns tests need network namespaces: {_why_not}", allow_module_level=True)

KEY = "netns-x86"
AGENT_TOKEN, TUNER_TOKEN = "agent-secret", "tuner-secret"
HEARTBEAT = 0.5  # agents silent for 3 heartbeats are dropped: a cut is noticed within ~2 s
TUNER = Path(__file__).resolve().parent / "netns_tuner.py"


# ----------------------------------------------------------------------------- the farm

class Farm:
    """Hosts plus the processes on them: a tracker, agents and a tuner run, each logging to a file."""

    def __init__(self, hosts: netns.Hosts, log_dir: Path):
        self.hosts, self.log_dir = hosts, log_dir
        self.logs: dict = {}
        self.tracker = None
        self.agent_procs: dict = {}
        self.tls_ca = None  # the tracker's certificate once it serves TLS

    def _spawn(self, namespace, name, cmd, env=None):
        log = self.log_dir / f"{name}-{len(self.logs)}.log"
        proc = self.hosts.spawn(namespace, cmd, log, env)
        self.logs[proc.pid] = log
        return proc

    def output(self, proc) -> str:
        return self.logs[proc.pid].read_text(errors="replace")

    def start_tracker(self, *extra) -> subprocess.Popen:
        if "--tls-cert" in extra:
            self.tls_ca = extra[list(extra).index("--tls-cert") + 1]
        self.tracker = self._spawn(self.hosts.service, "tracker", [
            sys.executable, "-m", "rpc_tracker", "--host", self.hosts.tracker_ip,
            "--port", str(self.hosts.TRACKER_PORT), "--agent-token", AGENT_TOKEN, "--tuner-token", TUNER_TOKEN,
            "--heartbeat", str(HEARTBEAT), *extra])
        wait_for(lambda: "tracker listening" in self.output(self.tracker) or self.tracker.poll() is not None,
                 30, "the tracker to listen")
        assert self.tracker.poll() is None, self.output(self.tracker)
        return self.tracker

    def start_agent(self, i: int, token: str = AGENT_TOKEN, extra=()) -> subprocess.Popen:
        name = extra[list(extra).index("--name") + 1] if "--name" in extra else f"agent-{i}"
        proc = self._spawn(self.hosts.agents[i], name, [
            sys.executable, "-m", "device_agent", "--tracker", self.hosts.tracker_address, "--key", KEY,
            *([] if "--name" in extra else ["--name", name]), "--verbose", "--no-calibration", *extra],
            env={"TUNEFARM_AGENT_TOKEN": token})   # the protocol's tests: calibration has its own
        self.agent_procs[name] = proc
        return proc

    def start_tuner(self, db: str, token: str = TUNER_TOKEN, extra=()) -> subprocess.Popen:
        return self._spawn(self.hosts.service, "tuner", [
            sys.executable, str(TUNER), "--tracker", self.hosts.tracker_address, "--key", KEY, "--db", db,
            "--token", token, *extra])

    # the tracker as the operator sees it, from the root namespace over the console link
    def summary(self) -> pb.FarmSummary:
        return self.summary_tls(self.tls_ca)

    def summary_tls(self, tls_ca) -> pb.FarmSummary:
        channel = make_channel(self.hosts.tracker_address, tls_ca=str(tls_ca) if tls_ca else None)
        try:
            return pb_grpc.TrackerStub(channel).Summary(pb.SummaryRequest(), metadata=auth_metadata(TUNER_TOKEN),
                                                        timeout=5)
        finally:
            channel.close()

    def agents(self) -> dict:
        return {a.name: a for a in self.summary().agents if a.device_key == KEY}

    def completed(self) -> int:
        return sum(k.completed for k in self.summary().keys if k.device_key == KEY)

    def wait_registered(self, names, timeout=120.0):   # agents calibrate before they register (test_farm)
        wait_for(lambda: set(names) <= set(self.agents()), timeout, f"agents {sorted(names)} to register")

    def start(self) -> list:
        """The tracker and an agent on every agent host, registered: their names."""
        self.start_tracker()
        for i in range(len(self.hosts.agents)):
            self.start_agent(i)
        names = [f"agent-{i}" for i in range(len(self.hosts.agents))]
        self.wait_registered(names)
        return names





@pytest.fixture
def make_farm(tmp_path):
    """make_farm(n_agents) -> Farm; hosts, processes and links are torn down after the test."""
    problem = netns.missing_tools()
    assert not problem, problem
    netns.sweep_stale()
    made = []

    def make(n_agents: int, **link) -> Farm:
        hosts = netns.Hosts(n_agents, log_dir=tmp_path, **link)
        made.append(hosts)
        return Farm(hosts, tmp_path)

    yield make
    for hosts in made:
        hosts.close()


def finish(farm: Farm, tuner: subprocess.Popen, timeout: float) -> str:
    try:
        tuner.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the tuning run did not finish within {timeout} s:\n{farm.output(tuner)}") from None
    out = farm.output(tuner)
    assert tuner.returncode == 0, out
    return out


def measured_once(db: str, trials: int, agents) -> list:
    """The records of a finished run: `trials` of them, each candidate once, each measured by an agent."""
    store = open_store(db)
    try:
        records = store.history()
    finally:
        store.close()
    candidates = [r.candidate.fingerprint for r in records]
    assert len(records) == trials, [(r.candidate, r.result.error_msg) for r in records]
    assert len(set(candidates)) == len(candidates), "a candidate was recorded twice"
    bad = [(r.result.measured_by, r.result.error_code, r.result.error_msg) for r in records if not r.result.ok]
    assert not bad, bad
    assert {r.result.measured_by for r in records} <= set(agents)
    return records


# ----------------------------------------------------------------------------- tests

def test_tuning_run_across_delayed_lossy_links(make_farm, tmp_path):
    farm = make_farm(2)
    farm.start()
    db = f"sqlite:///{tmp_path / 'run.db'}"
    tuner = farm.start_tuner(db, extra=["--trials", "6", "--batch", "3"])
    finish(farm, tuner, 90)
    records = measured_once(db, 6, farm.agent_procs)
    assert farm.completed() == len(records)  # the tracker answered each request once
    print(farm.output(tuner))


def test_an_agent_cut_off_mid_batch_loses_its_lease_and_comes_back(make_farm, tmp_path):
    farm = make_farm(3)
    names = farm.start()
    db = f"sqlite:///{tmp_path / 'cut.db'}"
    # about half a second a request: the victim is cut in its third one, after it measured at
    # least one trial (its first request may have been the default's baseline, which is no trial)
    tuner = farm.start_tuner(db, extra=["--trials", "9", "--batch", "9", "--min-repeat-ms", "300"])
    victim = wait_for(lambda: next((a.name for a in farm.agents().values() if a.in_flight and a.completed >= 2),
                                   None), 60, "an agent busy with its third request")
    i = names.index(victim)
    farm.hosts.cut_agent(i)
    wait_for(lambda: victim not in farm.agents(), 15, f"the tracker to drop {victim}")
    time.sleep(10.0)  # long enough that TCP alone would take many seconds to notice the link is back
    farm.hosts.restore_agent(i)
    t_restore = time.monotonic()
    finish(farm, tuner, 90)
    records = measured_once(db, 9, farm.agent_procs)
    assert farm.completed() == 9  # no request answered twice, nothing lost
    log = farm.output(farm.tracker)
    assert "lease lost" in log and victim in log, log
    farm.wait_registered([victim], timeout=max(1.0, 10.0 - (time.monotonic() - t_restore)))  # by itself, soon
    assert {r.result.measured_by for r in records} == set(names)
    assert "registering again" in farm.output(farm.agent_procs[victim])


def test_the_tuner_cut_off_from_the_tracker_submits_again_and_nothing_runs_twice(make_farm, tmp_path):
    farm = make_farm(2)
    farm.start()
    db = f"sqlite:///{tmp_path / 'tuner-cut.db'}"
    tuner = farm.start_tuner(db, extra=["--trials", "8", "--batch", "8", "--min-repeat-ms", "300"])
    wait_for(lambda: farm.completed() >= 2, 60, "two results before the cut")
    farm.hosts.cut_tuner()
    try:
        time.sleep(12.0)  # agents go on measuring; the tracker keeps their answers for the tuner
    finally:
        farm.hosts.restore_tuner()
    out = finish(farm, tuner, 90)
    assert "submitting" in out and "unanswered request(s) again" in out, out  # the runner saw the break
    measured_once(db, 8, farm.agent_procs)
    assert farm.completed() == 8  # a re-submitted id attached to its answer: nothing measured twice


def test_a_tracker_restart_mid_run_loses_no_candidate(make_farm, tmp_path):
    farm = make_farm(2)
    names = farm.start()
    db = f"sqlite:///{tmp_path / 'restart.db'}"
    tuner = farm.start_tuner(db, extra=["--trials", "8", "--batch", "8", "--min-repeat-ms", "300"])
    wait_for(lambda: farm.completed() >= 2, 60, "two results before the restart")
    kill_group(farm.tracker)
    time.sleep(1.0)  # agents and the tuner see the tracker gone
    farm.start_tracker()
    out = finish(farm, tuner, 90)
    assert "unanswered request(s) again" in out, out
    measured_once(db, 8, farm.agent_procs)
    farm.wait_registered(names)  # both agents dialled the new tracker by themselves
    assert farm.completed() >= 1  # the new tracker answered part of the run
    assert all(p.poll() is None for p in farm.agent_procs.values())


def test_tls_and_tokens_refuse_a_wrong_token_or_certificate_clearly_on_both_sides(make_farm, tmp_path):
    farm = make_farm(2)
    hosts = farm.hosts
    cert, key = netns.make_certificate(tmp_path, "tracker", hosts.tracker_ip)
    stranger, _ = netns.make_certificate(tmp_path, "stranger", hosts.tracker_ip)  # same address, another key
    farm.start_tracker("--tls-cert", str(cert), "--tls-key", str(key))
    good = farm.start_agent(0, extra=["--tls-ca", str(cert)])
    wrong_token = farm.start_agent(1, token="not-the-token", extra=["--tls-ca", str(cert), "--name", "wrong-token"])
    wrong_cert = farm.start_agent(1, extra=["--tls-ca", str(stranger), "--name", "wrong-cert"])

    def tune(token, ca, db):
        return hosts.run(hosts.service, [
            sys.executable, "-m", "tuner.cli", "tune", "matmul", "--param", "M=16", "--param", "N=16",
            "--param", "K=16", "--space", "template", "--strategy", "random", "--trials", "2", "--batch", "2",
            "--compare-repeat", "1", "--top-k", "1", "--plain", "--key", KEY, "--db", f"sqlite:///{tmp_path / db}",
            "--tracker", hosts.tracker_address, "--token", token, "--tls-ca", str(ca)], timeout=90)

    # the agents' side: a refusal exits 3 and says what to fix
    assert wrong_token.wait(timeout=30) == 3, farm.output(wrong_token)
    out = farm.output(wrong_token)
    assert "refused" in out and "UNAUTHENTICATED" in out and "token" in out, out
    assert wrong_cert.wait(timeout=30) == 3, farm.output(wrong_cert)
    out = farm.output(wrong_cert)
    assert "certificate is not trusted" in out and f"--tls-ca {stranger}" in out, out
    # the tuners' side: the same, from `tunefarm tune`
    bad = tune("not-the-token", cert, "t1.db")
    assert bad.returncode == 1 and "UNAUTHENTICATED" in bad.stderr and "--token" in bad.stderr, bad.stderr
    bad = tune(TUNER_TOKEN, stranger, "t2.db")
    assert bad.returncode == 1 and "certificate is not trusted" in bad.stderr, bad.stderr
    # the tracker's side: the operator sees who was refused
    log = farm.output(farm.tracker)
    assert "agent token refused: the token does not match" in log and "tuner token refused" in log, log
    # and with the right token and certificate, TLS across the lossy link just works
    farm.wait_registered(["agent-0"])
    ok = tune(TUNER_TOKEN, cert, "ok.db")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert {a.name for a in farm.summary_tls(cert).agents} == {"agent-0"} and good.poll() is None


def test_agent_hosts_only_dial_out(make_farm):
    """The agents' side is behind a one-way route: a board behind NAT can call the tracker, nobody can call it."""
    hosts = make_farm(1).hosts
    _, agent_ip = hosts.link_ips(0)
    listen = ("import socket, sys; s = socket.socket(); s.bind(('0.0.0.0', 7000)); s.listen(); "
              "print('listening', flush=True); s.settimeout(8); c, _ = s.accept(); print('accepted', flush=True)")
    dial = ("import socket, sys\n"
            "try:\n"
            "    socket.create_connection((sys.argv[1], 7000), timeout=2).close(); print('connected')\n"
            "except OSError as e:\n"
            "    print('refused or dropped:', e)\n")
    # inbound to the agent's host: dropped
    server = hosts.spawn(hosts.agents[0], [sys.executable, "-c", listen], hosts.log_dir / "listen-agent.log")
    wait_for(lambda: "listening" in (hosts.log_dir / "listen-agent.log").read_text(), 15, "the agent-side listener")
    out = hosts.run(hosts.service, [sys.executable, "-c", dial, agent_ip], timeout=30).stdout
    assert "refused or dropped" in out and "timed out" in out, out
    kill_group(server)
    # outbound from the agent's host to the service side: through
    server = hosts.spawn(hosts.service, [sys.executable, "-c", listen], hosts.log_dir / "listen-svc.log")
    wait_for(lambda: "listening" in (hosts.log_dir / "listen-svc.log").read_text(), 15, "the service-side listener")
    out = hosts.run(hosts.agents[0], [sys.executable, "-c", dial, hosts.tracker_ip], timeout=30).stdout
    assert "connected" in out, out
