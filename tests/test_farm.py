"""The measurement farm end to end: a real tracker, real agent processes, real kernels, loopback only.

Agents are `python -m device_agent` subprocesses (their own process groups, killed in teardown);
the tracker runs in this process (`start_tracker`, port 0) except where it must be killed and
started again, where it is a `python -m rpc_tracker` subprocess on a fixed free port. Heartbeats
and timeouts are short so failures are noticed within about a second.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from processes import kill_group, wait_for

from compiler.ops import default_schedule
from compiler.runtime import ArgSpec, Kernel
from compiler.target import Target, llvm_binding
from compiler.timing import FAR_BEHIND
from rpc_tracker.client import make_channel
from rpc_tracker.protocol import auth_metadata, pb, pb_grpc
from rpc_tracker.server import TrackerConfig, start_tracker
from tuner.candidate import Candidate, ErrorCode
from tuner.engine.task_tuner import SLOW_CUTOFF
from tuner.measure import BuilderPool, BuildResult, FarmAuthError, FarmError, FarmRequestError, LocalRunner, MeasureOptions, RPCRunner
from tuner.records import open_store
from tuner.tune import tune
from tuner.workload import Task, Workload

ROOT = Path(__file__).resolve().parents[1]
KEY = "farm-test"
AGENT_TOKEN, TUNER_TOKEN = "agent-secret", "tuner-secret"
FAST = dict(heartbeat_seconds=0.5, agent_timeout_seconds=2.0, lease_slack_seconds=3.0, max_attempts=3)
MM = Workload("matmul", dict(M=64, N=64, K=64))
NAIVE = Candidate("trace", {"sketch": "naive", "steps": []})
QUICK = dict(number=1, repeat=2, min_repeat_ms=1)       # a request takes milliseconds
# The farm's protocol (leases, restarts, drains, refusals) with agents that do not calibrate:
# beside the suite's other process, an agent's calibrations read slow now and then, and its
# replacements, recovery waits and degraded spells (tests/test_agent_health.py's subject) held
# a restart's requests past the runner's 60 s.
NO_CALIBRATION = ("--no-calibration",)
SLOWISH = dict(number=1, repeat=2, min_repeat_ms=150)   # a request takes about half a second
SLOWER = dict(number=1, repeat=2, min_repeat_ms=500)    # a request takes over a second


# ----------------------------------------------------------------------------- processes

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(cmd: list, log: Path, env: dict | None = None) -> subprocess.Popen:
    """A child in its own process group, output to `log` (read back when a test fails)."""
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


class Processes:
    """Every child a test starts, killed (whole process group) at teardown."""

    def __init__(self, tmp: Path):
        self.tmp, self.procs, self.logs = tmp, [], {}

    def agent(self, tracker: str, name: str, key: str = KEY, token: str | None = AGENT_TOKEN,
              slots: int = 1, command=("-m", "device_agent"), extra=()) -> subprocess.Popen:
        """An agent that does not calibrate (NO_CALIBRATION)."""
        cmd = [sys.executable, *command, "--tracker", tracker, "--key", key, "--name", name,
               "--slots", str(slots), *NO_CALIBRATION, *extra]
        env = {"TUNEFARM_AGENT_TOKEN": token} if token else {}  # the token through the environment
        return self._start(name, cmd, env)

    def tracker(self, port: int, name: str = "tracker") -> subprocess.Popen:
        cmd = [sys.executable, "-m", "rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
               "--agent-token", AGENT_TOKEN, "--tuner-token", TUNER_TOKEN,
               "--heartbeat", str(FAST["heartbeat_seconds"])]  # agents silent for 3 heartbeats are dropped
        return self._start(name, cmd)

    def _start(self, name, cmd, env=None):
        log = self.tmp / f"{name}-{len(self.procs)}.log"
        proc = spawn(cmd, log, env)
        self.procs.append(proc)
        self.logs[proc.pid] = log
        return proc

    def output(self, proc) -> str:
        return self.logs[proc.pid].read_text(errors="replace")

    def tails(self, lines: int = 40) -> str:
        """The last lines of every child's log, for a failing assertion's message."""
        return "\n".join(f"--- {log.name}:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
                         for log in self.logs.values())

    def kill_all(self):
        for p in self.procs:
            kill_group(p)


@pytest.fixture
def procs(tmp_path):
    p = Processes(tmp_path)
    yield p
    p.kill_all()


# ----------------------------------------------------------------------------- tracker helpers

def summary(address: str) -> pb.FarmSummary:
    channel = make_channel(address)
    try:
        return pb_grpc.TrackerStub(channel).Summary(pb.SummaryRequest(), metadata=auth_metadata(TUNER_TOKEN),
                                                    timeout=5)
    finally:
        channel.close()


def agents_of(address: str, key: str = KEY) -> dict:
    return {a.name: a for a in summary(address).agents if a.device_key == key}


def completed(address: str, key: str = KEY) -> int:
    return sum(k.completed for k in summary(address).keys if k.device_key == key)


# three agents starting together beside the suite's other measuring tests (each agent's worker
# start waits for the host's timing lock) took over 30 s to register
REGISTER_TIMEOUT = 120.0


def wait_registered(address: str, names, key: str = KEY, timeout: float = REGISTER_TIMEOUT):
    return wait_for(lambda: set(names) <= set(agents_of(address, key)), timeout,
                    f"agents {sorted(names)} to register under {key!r}")


def runner_for(address: str, key: str = KEY, **kw) -> RPCRunner:
    # one thread per kernel: three agents timing 2-thread kernels on this 2-core machine would
    # oversubscribe it, and a parallel loop's barrier then waits for descheduled threads
    opts = dict(QUICK, timeout=20.0, num_threads=1)
    opts.update(kw)
    runner_kw = {k: opts.pop(k) for k in ("result_timeout", "connect_timeout") if k in opts}
    runner_kw.setdefault("result_timeout", 60.0)
    return RPCRunner(address, key, token=TUNER_TOKEN, options=MeasureOptions(**opts), **runner_kw)


class Background:
    """runner.run(task, builds) in a thread, so a test can kill things while it runs."""

    def __init__(self, runner, task, builds):
        self.results, self.error = None, None
        self.thread = threading.Thread(target=self._run, args=(runner, task, builds), daemon=True)
        self.thread.start()

    def _run(self, runner, task, builds):
        try:
            self.results = runner.run(task, builds)
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            self.error = e

    def join(self, timeout: float):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the farm run did not finish within {timeout} s"
        if self.error is not None:
            raise self.error
        return self.results


# ----------------------------------------------------------------------------- module fixtures

@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    """An in-process tracker with three agents of KEY: (address, {name: Popen}, Processes)."""
    server = start_tracker(TrackerConfig(port=0, agent_token=AGENT_TOKEN, tuner_token=TUNER_TOKEN, **FAST))
    p = Processes(tmp_path_factory.mktemp("farm"))
    names = [f"agent-{i}" for i in range(3)]
    agents = {n: p.agent(server.address, n) for n in names}
    try:
        wait_registered(server.address, names)
        yield server.address, agents, p
    finally:
        p.kill_all()
        server.stop(0)


@pytest.fixture(scope="module")
def builds():
    """[default schedule of MM, naive schedule of MM], built for this host under KEY."""
    task = Task.create(MM, device_key=KEY)
    default = Candidate("trace", {"sketch": "default", "steps": default_schedule(MM.opdef()).steps})
    with BuilderPool(n_workers=2, timeout=60) as pool:
        out = pool.build(task, [default, NAIVE])
    assert all(b.ok for b in out), [b.error_msg for b in out]
    return task, out


def ir_kernel(body: str, like: BuildResult) -> BuildResult:
    """A kernel with `like`'s arguments whose body is the given LLVM IR (crashes, hangs)."""
    llvm, host = llvm_binding(), Target.host()
    params = ", ".join(f"ptr %a{i}" for i in range(len(like.args)))
    mod = llvm.parse_assembly(f"define i32 @main({params}) {{\n{body}\n}}\n")
    mod.triple = host.triple
    mod.data_layout = str(host.target_machine().target_data)
    obj = host.target_machine().emit_object(mod)
    kernel = Kernel("main", obj, [ArgSpec(a["name"], tuple(a["shape"]), a["dtype"]) for a in like.args], host)
    return BuildResult(kernel_bytes=kernel.to_bytes(), reference_bytes=like.reference_bytes, args=like.args,
                       num_inputs=like.num_inputs)


SEGFAULT = "  %p = inttoptr i64 16 to ptr\n  %v = load volatile i32, ptr %p\n  ret i32 %v"
ENDLESS = "  br label %loop\nloop:\n  store volatile i32 1, ptr %a0\n  br label %loop"


# ----------------------------------------------------------------------------- tests: the farm at work

@pytest.mark.slow
def test_tuning_run_through_the_farm_stores_the_same_kind_of_records_as_a_local_run(farm, builds, tmp_path):
    address, agents, _ = farm
    task = Task.create(MM, device_key=KEY)
    farm_store = open_store(f"sqlite:///{tmp_path / 'farm.db'}")
    local_store = open_store(f"sqlite:///{tmp_path / 'local.db'}")
    with BuilderPool(n_workers=2, timeout=60) as builder:
        with runner_for(address) as runner:
            # no baseline: the fastest candidates are re-timed however they compare with the default
            res = tune(task, farm_store, space="sketch", strategy="random", trials=6, batch_size=3,
                       builder=builder, runner=runner, baseline=False)
        with LocalRunner(MeasureOptions(**QUICK)) as local:
            tune(Task.create(MM, device_key=KEY), local_store, space="sketch", strategy="random", trials=3,
                 batch_size=3, builder=builder, runner=local)
    assert res.trials == 6 and res.best_gflops > 0
    farm_records = farm_store.history(workload_key=task.workload.key)
    local_records = local_store.history(workload_key=task.workload.key)
    assert len(farm_records) == 6 and len(local_records) == 3 + 1  # locally the default schedule too
    assert any(r.retimed_cost is not None for r in farm_records)  # re-measured on the farm as well
    best = min(r.result.minimum for r in farm_records if r.result.ok)
    for rec in farm_records:
        assert rec.device_key == KEY and rec.target == task.target
        assert rec.result.measured_by in agents, rec.result.measured_by
        if rec.result.ok:
            assert 1 <= len(rec.result.costs) <= 32 and all(0 < c < 1 for c in rec.result.costs)
            assert rec.result.minimum == min(rec.result.costs)  # the protocol's summary
            # one sample only for a candidate far behind the search's best so far (its slow cutoff)
            far_behind = FAR_BEHIND * SLOW_CUTOFF * best
            assert rec.result.samples >= 2 or rec.result.minimum > far_behind, (rec.result, best)
            assert rec.result.run_seconds > 0 and rec.result.build_seconds > 0
    assert sum(r.result.ok for r in farm_records) >= 4
    assert {r.result.measured_by for r in local_records} == {"local"}
    # the same fields, the same kinds of values: only who measured differs
    # (a window an agent or the local runner found slow on a busy host carries its slow_index, set
    # only then: compare unmarked results where there are some)
    def unmarked_first(records):
        ok = [r.result for r in records if r.result.ok]
        return next((r for r in ok if not (r.slow_window or r.remeasured)), ok[0])
    farm_ok, local_ok = unmarked_first(farm_records), unmarked_first(local_records)
    marked = {"slow_index"} if any(r.slow_window or r.remeasured for r in (farm_ok, local_ok)) else set()
    assert ({k: type(v) for k, v in vars(farm_ok).items() if k not in marked}
            == {k: type(v) for k, v in vars(local_ok).items() if k not in marked})


@pytest.mark.slow
def test_cli_tune_through_the_farm(farm, tmp_path, capsys):
    from tuner.cli import main
    address, agents, _ = farm
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    args = ["--param", "M=16", "--param", "N=16", "--param", "K=16", "--db", db, "--key", KEY]
    assert main(["tune", "matmul", *args, "--trials", "2", "--batch", "2", "--space", "template",
                 "--strategy", "random", "--plain", "--repeat", "1",
                 "--tracker", address, "--token", TUNER_TOKEN]) == 0
    assert "2 trials measured now" in capsys.readouterr().out
    records = open_store(db).history()
    assert len(records) == 2 + 1 and all(r.result.measured_by in agents and r.device_key == KEY for r in records)
    assert main(["tune", "matmul", *args, "--tracker", address, "--token", "wrong", "--trials", "3"]) == 1
    assert "UNAUTHENTICATED" in capsys.readouterr().err


def test_a_job_worker_runs_a_farm_job_through_the_tracker(farm, tmp_path):
    """A job submitted for device key KEY is claimed by a worker with --tracker and measured by
    the farm's agents; a local-only worker never takes it."""
    from tuner.service.spec import JobSpec, resolve
    from tuner.service.worker import JobWorker
    address, agents, _ = farm
    store = open_store(f"sqlite:///{tmp_path / 'r.db'}")
    spec = JobSpec(workloads=[{"op": "matmul", "params": MM.params}], device_key=KEY, target=str(Target.host()),
                   trials=4, batch_size=2,
                   space="template", strategy="random", top_k=1, measure=QUICK)
    job = resolve(spec)
    jid = store.jobs.submit(job.store_rows(), spec.model_dump(mode="json"), space=spec.space, strategy=job.strategy,
                            scheduler=spec.scheduler, trials=spec.trials)
    with JobWorker(store, name="local-only") as local:
        assert local.run_once() is None
    with JobWorker(store, name="farm-worker", tracker=address, tracker_token=TUNER_TOKEN, build_workers=1) as w:
        assert w.run_once() == jid
    done = store.jobs.get(jid)
    assert done.state == "done" and done.trials_done == 4, done.error
    records = store.records_page(job_id=jid)
    assert len(records) == 4 + 1 and all(r.result.measured_by in agents and r.device_key == KEY for r in records)
    store.close()


def test_build_errors_pass_through_and_results_keep_their_order(farm, builds):
    address, agents, _ = farm
    task, (good, naive) = builds
    broken = BuildResult(None, None, error_code=ErrorCode.COMPILE_ERROR, error_msg="llvm said no", build_seconds=0.2)
    with runner_for(address) as runner:
        out = runner.run(task, [good, broken, naive, good])
    assert [r.error_code for r in out] == [0, ErrorCode.COMPILE_ERROR, 0, 0]
    assert out[1].error_msg == "llvm said no" and out[1].build_seconds == 0.2
    assert all(out[i].measured_by in agents for i in (0, 2, 3))
    with runner_for(address) as runner:  # as they arrive: nothing to wait for first
        arrived = list(runner.run_iter(task, [good, broken, naive]))
    assert arrived[0][0] == 1 and sorted(i for i, _ in arrived) == [0, 1, 2]


def test_candidates_are_checked_against_the_target_and_reference_sent_once_per_batch(farm, builds):
    """Protocol 5: the runner sends a task's target and reference once per batch (MeasureBatch.target,
    .references) and the tracker puts them back into every agent's request, so a kernel that writes
    nothing is still caught by the agents' check. The other form, a batch submitted again after a
    break, carries them in each request."""
    address, agents, _ = farm
    task, (good, naive) = builds
    blank = ir_kernel("  ret i32 0", good)
    with runner_for(address) as runner:
        out = runner.run(task, [good, blank, naive, blank])
        assert runner._shares_batch_fields
        reqs = {rid: pb.MeasureRequest(request_id=rid) for rid in "ab"}
        refs = dict.fromkeys("ab", good.reference_bytes)
        shared = runner._batch(["a", "b"], reqs, refs, task.target, shared=True)
        inline = runner._batch(["a", "b"], reqs, refs, task.target, shared=False)
    assert list(shared.references) == [good.reference_bytes] and shared.target == task.target
    assert [(r.reference_index, r.reference_kernel, r.target) for r in shared.requests] == [(1, b"", "")] * 2
    assert not inline.references and not inline.target
    assert [(r.reference_index, r.reference_kernel, r.target) for r in inline.requests] == \
        [(0, good.reference_bytes, task.target)] * 2
    assert [r.error_code for r in out] == [0, ErrorCode.WRONG_ANSWER, 0, ErrorCode.WRONG_ANSWER], \
        [r.error_msg for r in out]
    assert all(r.measured_by in agents for r in out)


@pytest.mark.slow
def test_segfaulting_and_hanging_kernels_are_error_records_and_agents_stay_up(farm, builds):
    address, agents, _ = farm
    task, (good, naive) = builds
    crash, hang = ir_kernel(SEGFAULT, good), ir_kernel(ENDLESS, good)
    with runner_for(address, timeout=1.0) as runner:
        out = runner.run(task, [crash, good, hang, naive])
        assert out[0].error_code == ErrorCode.RUNTIME_ERROR and "SIGSEGV" in out[0].error_msg, out[0].error_msg
        assert out[2].error_code == ErrorCode.RUN_TIMEOUT and "1 s" in out[2].error_msg, out[2].error_msg
        assert out[1].ok and out[3].ok
        assert out[0].measured_by in agents and out[2].measured_by in agents
        assert all(p.poll() is None for p in agents.values())
        assert set(agents_of(address)) == set(agents)
    # the replaced workers measure again: each starts first, which can take more than the 4 s
    # lease of a 1 s timeout on a slow shared host under the suite's load
    with runner_for(address, timeout=10.0) as runner:
        again = runner.run(task, [good] * 3)
    assert all(r.ok for r in again), [r.error_msg for r in again]


@pytest.mark.slow
def test_sigkill_of_an_agent_mid_batch_still_answers_every_request_once(builds, procs, caplog):
    server = start_tracker(TrackerConfig(port=0, agent_token=AGENT_TOKEN, tuner_token=TUNER_TOKEN, **FAST))
    try:
        names = ["k-0", "k-1", "k-2"]
        agents = {n: procs.agent(server.address, n) for n in names}
        wait_registered(server.address, names)
        task, (good, _) = builds
        n = 9
        # about a second a request: the victim is killed early in its second one, never just as it ends
        with runner_for(server.address, number=1, repeat=2, min_repeat_ms=300) as runner:
            run = Background(runner, task, [good] * n)
            victim = wait_for(lambda: next((a.name for a in agents_of(server.address).values()
                                            if a.in_flight and a.completed >= 1), None), 30,
                              "an agent busy with its second request")
            kill_group(agents[victim])
            out = run.join(60)
        assert len(out) == n and all(r.ok for r in out), [r.error_msg for r in out if not r.ok]
        assert all(r.measured_by in names for r in out)
        snap = summary(server.address)
        assert sum(k.completed for k in snap.keys if k.device_key == KEY) == n  # each answered exactly once
        survivors = {a.name for a in snap.agents}
        assert victim not in survivors and survivors == set(names) - {victim}
        # the request the victim held went back to the queue and to another agent
        assert any("lease lost" in r.getMessage() and f"agent {victim} left" in r.getMessage()
                   for r in caplog.records), [r.getMessage() for r in caplog.records]
    finally:
        server.stop(0)


@pytest.mark.slow
def test_tracker_restart_mid_run_agents_come_back_and_the_run_completes(builds, procs):
    port = free_port()
    address = f"127.0.0.1:{port}"
    tracker = procs.tracker(port)
    names = ["r-0", "r-1"]
    agents = {n: procs.agent(address, n) for n in names}
    wait_registered(address, names)
    task, (good, _) = builds
    n = 10
    with runner_for(address, **SLOWISH) as runner:
        run = Background(runner, task, [good] * n)
        wait_for(lambda: completed(address) >= 2, 30, "two results before the restart")
        kill_group(tracker)
        time.sleep(0.5)  # agents and the tuner see the tracker gone
        tracker = procs.tracker(port, name="tracker-again")
        out = run.join(90)
    assert len(out) == n and all(r.ok for r in out), ([r.error_msg for r in out if not r.ok], procs.tails())
    assert all(r.measured_by in names for r in out)
    wait_registered(address, names)  # both agents registered again by themselves
    assert all(p.poll() is None for p in agents.values())
    assert completed(address) >= 1  # the new tracker answered part of the run


def test_agent_with_a_wrong_token_is_refused(farm, procs):
    address, _, _ = farm
    # through the tunefarm command line: `tunefarm agent` is the same agent
    bad = procs.agent(address, "intruder", token="wrong", command=("-m", "tuner.cli", "agent"))
    assert bad.wait(timeout=30) == 3
    out = procs.output(bad)
    assert "refused" in out and "UNAUTHENTICATED" in out and "token" in out, out
    assert "intruder" not in agents_of(address)


def test_an_agent_of_another_key_gets_no_work_of_this_key(farm, builds, procs):
    address, agents, _ = farm
    other = procs.agent(address, "stranger", key="other-key", slots=2)
    wait_registered(address, ["stranger"], key="other-key")
    task, (good, _) = builds
    with runner_for(address) as runner:
        out = runner.run(task, [good] * 6)
    assert all(r.ok and r.measured_by in agents for r in out)
    (stranger,) = agents_of(address, "other-key").values()
    assert stranger.completed == 0 and stranger.in_flight == 0
    # its own key's work goes to it, two requests at a time (two slots, two worker processes)
    with runner_for(address, key="other-key", **SLOWER) as runner:
        run = Background(runner, Task.create(MM, device_key="other-key"), [good] * 4)
        # two running at once, and a third may be leased ahead of them (Hello.prefetch): 2 or 3
        wait_for(lambda: _both_slots_busy(address, run, procs, other), 30, "two requests at once")
        mine = run.join(60)
    assert all(r.ok for r in mine) and {r.measured_by for r in mine} == {"stranger"}
    assert other.poll() is None


def _both_slots_busy(address: str, run: Background, procs, agent) -> bool:
    """Whether the stranger holds two requests now; a run that ended first fails the test at once
    with what it returned and the agent's log (wait_for would only say it timed out)."""
    if agents_of(address, "other-key")["stranger"].in_flight >= 2:
        return True
    if not run.thread.is_alive():
        pytest.fail(f"the run ended before two requests were in flight at once: error {run.error!r}, "
                    f"results {run.results}\nagent log:\n{procs.output(agent)}")
    return False


def test_a_target_the_agent_cannot_run_is_a_clear_error(farm, builds):
    """The tracker routes on -mattr; the agent also knows the features a cpu name implies."""
    address, agents, _ = farm
    task, (good, _) = builds
    host = Target.host()
    if host.has_feature("avx512f") or host.arch != "x86_64":
        pytest.skip("needs an x86-64 host without AVX-512")
    avx512 = Task(MM, f"llvm -mtriple={host.triple} -mcpu=skylake-avx512 -mattr=+avx2,+fma -num-cores=2", KEY)
    with runner_for(address) as runner:
        (res,) = runner.run(avx512, [good])
    assert res.error_code == ErrorCode.UNSUPPORTED_TARGET and res.measured_by in agents
    assert f"agent {res.measured_by} ({host.cpu}, {host.triple}) cannot run target" in res.error_msg, res.error_msg
    assert "avx512f" in res.error_msg


def test_misconfigured_tuners_get_typed_errors(farm, builds):
    address, _, _ = farm
    task, (good, _) = builds
    with RPCRunner(address, KEY, token="wrong", options=MeasureOptions(**QUICK)) as runner:
        with pytest.raises(FarmAuthError, match="UNAUTHENTICATED"):
            runner.run(task, [good])
    with runner_for(address) as runner:
        with pytest.raises(ValueError, match="device key"):
            runner.run(Task.create(MM, device_key="local"), [good])  # records would name the wrong devices
    with RPCRunner(f"127.0.0.1:{free_port()}", KEY, token=TUNER_TOKEN, connect_timeout=1.0) as runner:
        with pytest.raises(FarmError, match="cannot reach the tracker"):
            runner.run(task, [good])
    foreign = Task(MM, "llvm -mtriple=aarch64-unknown-linux-gnu -mcpu=cortex-a72 -mattr=+neon -num-cores=4", KEY)
    with runner_for(address) as runner:
        with pytest.raises(FarmRequestError, match="can run target"):
            runner.run(foreign, [good])


def received(procs, agent):
    """Wait until the agent has the request in hand (the tracker's in-flight count starts at the
    lease, before the request is pushed down the stream; a drain takes back what was not pushed)."""
    wait_for(lambda: "received" in procs.output(agent), 30, "the agent to receive the request")


@pytest.mark.slow
def test_sigterm_drains_an_agent(builds, procs):
    server = start_tracker(TrackerConfig(port=0, agent_token=AGENT_TOKEN, tuner_token=TUNER_TOKEN, **FAST))
    try:
        agent = procs.agent(server.address, "drainer", extra=("--verbose",))
        wait_registered(server.address, ["drainer"])
        task, (good, _) = builds
        # samples of 20 000 calls: the timing stops at 32 samples whatever min_repeat_ms says, so
        # only long samples keep the request running (>= 0.4 s) until the signal arrives
        with runner_for(server.address, number=20000, repeat=3, min_repeat_ms=400) as runner:
            run = Background(runner, task, [good])
            received(procs, agent)
            agent.send_signal(signal.SIGTERM)
            # the drain measures the held request: on a slow shared host, not within 30 s
            assert agent.wait(timeout=90) == 0, procs.output(agent)
            (res,) = run.join(10)
        assert res.ok and res.measured_by == "drainer", res.error_msg
        out = procs.output(agent)
        assert "draining" in out and "stopped" in out, out
        assert completed(server.address) == 1 and not agents_of(server.address)
    finally:
        server.stop(0)


@pytest.mark.slow
def test_an_agent_takes_a_request_ahead_and_a_drain_finishes_it(builds, procs):
    """Prefetch end to end: an agent of one slot is pushed a second request while it measures the
    first (Hello.prefetch), holds both, and on SIGTERM measures and reports both (it was leased the
    second) before it leaves: each answered once, by it, at the first attempt, confirmed before exit."""
    server = start_tracker(TrackerConfig(port=0, agent_token=AGENT_TOKEN, tuner_token=TUNER_TOKEN, **FAST))
    try:
        agent = procs.agent(server.address, "ahead", extra=("--verbose",))
        wait_registered(server.address, ["ahead"])
        task, (good, _) = builds
        with runner_for(server.address, number=20000, repeat=3, min_repeat_ms=400) as runner:
            run = Background(runner, task, [good, good])
            wait_for(lambda: procs.output(agent).count("received (lease") == 2, 30, "both requests at the agent")
            assert agents_of(server.address)["ahead"].in_flight == 2 and completed(server.address) == 0
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(timeout=60) == 0, procs.output(agent)
            results = run.join(10)
        assert [r.ok for r in results] == [True, True], [r.error_msg for r in results]
        assert {r.measured_by for r in results} == {"ahead"}
        out = procs.output(agent)
        assert "draining: finishing 2 request(s)" in out and "not confirmed" not in out, out
        assert completed(server.address) == 2 and not agents_of(server.address)
    finally:
        server.stop(0)


@pytest.mark.slow
def test_sigterm_past_the_grace_period_exits_and_leaves_the_request_to_its_lease(builds, procs):
    server = start_tracker(TrackerConfig(port=0, agent_token=AGENT_TOKEN, tuner_token=TUNER_TOKEN, **FAST))
    try:
        agent = procs.agent(server.address, "stubborn", extra=("--drain-grace", "1", "--verbose"))
        wait_registered(server.address, ["stubborn"])
        task, (good, _) = builds
        with runner_for(server.address, timeout=60.0, result_timeout=6.0) as runner:
            run = Background(runner, task, [ir_kernel(ENDLESS, good)])
            received(procs, agent)
            t0 = time.monotonic()
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(timeout=15) == 0, procs.output(agent)
            assert time.monotonic() - t0 < 5
            (res,) = run.join(30)
        assert "grace" in procs.output(agent)
        # back in the queue with no agent left to take it: the runner gives up after result_timeout
        assert res.error_code == ErrorCode.RUNNER_ERROR and "no result from the farm within 6 s" in res.error_msg
        assert f"no agent of key {KEY!r} is registered" in res.error_msg, res.error_msg   # ... and why
    finally:
        server.stop(0)


def test_agent_entry_points_stay_light():
    """`tunefarm agent` must work on an install without the tuner extra (no SQLAlchemy, XGBoost, rich)."""
    code = ("import sys\n"
            "class NotInstalled:  # an agent-only install: the tuner extra is missing\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('sqlalchemy', 'xgboost', 'rich', 'alembic', 'psycopg'):\n"
            "            raise ImportError(f'{name} is not installed on this agent')\n"
            "sys.meta_path.insert(0, NotInstalled())\n"
            "from tuner.cli import build_parser\n"
            "args = build_parser().parse_args(['agent', '--tracker', 'h:1', '--key', 'k'])\n"
            "import device_agent.agent, device_agent.cli\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'xgboost', 'rich', 'alembic'))\n"
            "assert not heavy, heavy\n"
            "assert args.key == 'k' and args.slots == 1\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_host_description_and_runnable_check():
    from device_agent.host import describe_host, target_problem
    d = describe_host()
    host = Target.host()
    assert d["triple"] == host.triple and d["cpu"] == host.cpu and d["cores"] >= 1
    assert d["memory_bytes"] > 1 << 20 and d["agent_version"] and d["hostname"]
    assert d["features"] and not any(f.startswith("+") for f in d["features"])
    pb.DeviceInfo(**d)  # exactly the protocol's fields
    assert target_problem(str(host)) == ""
    assert "aarch64" in target_problem("llvm -mtriple=aarch64-unknown-linux-gnu -mcpu=generic")
    assert "target" in target_problem("not a target")


def test_agent_usage_errors_exit_2(capsys):
    from device_agent.cli import main as agent_main
    assert agent_main(["--tracker", "no-port", "--key", "k"]) == 2
    assert "HOST:PORT" in capsys.readouterr().err
    assert agent_main(["--tracker", "h:1", "--key", "k", "--slots", "0"]) == 2
    assert "slots" in capsys.readouterr().err
