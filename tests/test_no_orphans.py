"""No orphans: when `tunefarm serve` dies, however it dies, its job worker and the worker's build
and measuring processes exit within seconds, and the next serve on this host takes the dead
worker's job back at once (not a lease later) and finishes it without measuring anything twice.

The fast tests check the pieces: worker names, the "provably dead" rule, the reclaim in the job
queue, the parent-death signal. The slow one SIGKILLs a real serve mid-job."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import pytest
from serve_process import free_port, start_serve

from tuner.records import JobState, SQLRecordsStore
from tuner.records.jobs import lease_owner_process, process_gone
from tuner.records.values import utcnow
from tuner.service.client import ServiceClient
from tuner.workload import Task, Workload

HOST = socket.gethostname()
TARGET = "llvm -mtriple=x86_64-linux-gnu -mcpu=znver3 -num-cores=2"


# ----------------------------------------------------------------------------- helpers
def wait_for(cond, timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


def alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def descendants(root: int) -> set[int]:
    """Every process below `root`, from the parent pids in /proc/*/stat."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def dead_pid() -> int:
    """The pid of a process that has ended (and was reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def submit(store, m: int) -> int:
    t = Task(Workload("matmul", {"M": m, "N": 16, "K": 16}), TARGET, "local")
    return store.jobs.submit([(t, 1.0, 1e6)], {"trials": 4}, space="sketch", strategy="random", scheduler="gradient",
                             trials=4)


# ----------------------------------------------------------------------------- the pieces
def test_lease_owner_names():
    assert lease_owner_process("box:123") == ("box", 123)                  # a worker's default name
    assert lease_owner_process("serve-0@box:123") == ("box", 123)          # a worker tunefarm serve started
    for other in (None, "", "doomed", "serve-123-0", "box:", ":12", "box:0", "box:12x", "serve-0@box", "box:99999999999"):
        assert lease_owner_process(other) is None, other


def test_process_gone_only_when_provably_ended():
    now = utcnow()
    assert not process_gone(os.getpid(), now)                              # this very process
    assert process_gone(dead_pid(), now)
    # the pid is taken by a process that started after the owner's last heartbeat: reused
    assert process_gone(os.getpid(), now - timedelta(days=1))
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    assert wait_for(lambda: not alive(zombie.pid), timeout=30)            # ended, not reaped yet
    assert process_gone(zombie.pid, now)
    zombie.wait()


def test_leases_of_dead_workers_of_this_host_end_at_once(tmp_path):
    with SQLRecordsStore(f"sqlite:///{tmp_path / 'r.db'}") as store:
        gone = dead_pid()
        owners = {f"serve-0@{HOST}:{gone}": True, f"{HOST}:{gone}": True,
                  f"{HOST}:{os.getpid()}": False,                           # alive
                  f"elsewhere:{gone}": False,                              # another host: cannot tell
                  "doomed": False}                                         # no pid in the name
        jobs = {}
        for i, owner in enumerate(owners):
            jobs[owner] = submit(store, 16 + i)
            assert store.jobs.claim(owner, 60).id == jobs[owner]
        ended = store.jobs.reclaim_dead_local_leases()
        assert sorted(ended) == sorted(jobs[o] for o, dead in owners.items() if dead)
        assert store.jobs.reclaim_dead_local_leases() == []                     # ended leases are not ended twice
        for owner, dead in owners.items():
            kinds = [e.kind for e in store.jobs.events(jobs[owner])]
            assert ("owner_gone" in kinds) == dead, (owner, kinds)
        rescued = {store.jobs.claim("rescuer", 60).id for _ in ended}
        assert rescued == set(ended) and store.jobs.claim("rescuer", 60) is None
        for jid in ended:
            last = store.jobs.events(jid)[-1]
            assert last.kind == "reclaimed" and last.data["worker"] == "rescuer"
            assert store.jobs.get(jid).attempts == 2


CHILD = textwrap.dedent("""
    import ctypes, sys, time
    from tuner.service.lifeline import exit_with_parent
    exit_with_parent(int(sys.argv[1]))
    sig = ctypes.c_int(0)
    ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)        # PR_GET_PDEATHSIG
    print(sig.value, flush=True)
    time.sleep(120)
""")
PARENT = textwrap.dedent("""
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid())], stdout=subprocess.PIPE, text=True)
    print(child.pid, child.stdout.readline().strip(), flush=True)
    time.sleep(120)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_exit_with_parent_dies_with_a_killed_parent():
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        child, armed = (int(x) for x in parent.stdout.readline().split())
        assert armed == signal.SIGKILL                                     # the kernel's part is armed
        parent.kill()
        parent.wait()
        assert wait_for(lambda: not alive(child), timeout=5), "the child outlived its SIGKILLed parent"
    finally:
        parent.kill()
        parent.wait()
        if child is not None and alive(child):
            os.kill(child, signal.SIGKILL)


# ----------------------------------------------------------------------------- end to end
JOB = {"name": "no-orphans", "workloads": [{"op": "matmul", "params": {"M": 64, "N": 64, "K": 64}}],
       "trials": 24, "batch_size": 4, "top_k": 1, "space": "sketch", "strategy": "random",
       "measure": {"number": 1, "repeat": 1, "min_repeat_ms": 0}}


def job_records(store, job_id: int) -> list:
    return [r for r in store.history() if r.job_id == job_id]


@pytest.mark.slow
def test_killed_serve_leaves_no_orphans_and_the_next_serve_resumes_its_job(tmp_path):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    port = free_port()
    started: list[subprocess.Popen] = []
    tree: set[int] = set()
    try:
        first, token = start_serve(db, port)
        started.append(first)
        with ServiceClient(f"http://127.0.0.1:{port}", token=token) as c:
            jid = c.submit(JOB)["id"]
        with SQLRecordsStore(db) as store:
            assert wait_for(lambda: store.jobs.get(jid).trials_done >= 4, timeout=240, step=0.2), store.jobs.get(jid)
            tree = descendants(first.pid)
            # the job worker, its build processes and its measuring process (and multiprocessing's tracker)
            assert len(tree) >= 3, tree
            first.kill()
            first.wait()
            assert wait_for(lambda: not any(alive(p) for p in tree), timeout=5), \
                f"outlived the SIGKILLed serve: {sorted(p for p in tree if alive(p))}"
            before = store.jobs.get(jid)
            assert before.state == JobState.RUNNING and before.trials_done < JOB["trials"], before
            assert before.lease_owner == f"serve-0@{HOST}:{first.pid}"

            second, _ = start_serve(db, port)
            started.append(second)
            assert wait_for(lambda: store.jobs.get(jid).state != JobState.RUNNING, timeout=300, step=0.5)
            job = store.jobs.get(jid)
            assert job.state == JobState.DONE and job.attempts == 2, job.error
            assert job.trials_done == JOB["trials"]
            events = store.jobs.events(jid)
            kinds = [e.kind for e in events]
            assert kinds.count("claimed") == 1 and kinds[-1] == "done", kinds
            assert kinds.index("owner_gone") < kinds.index("reclaimed"), kinds
            reclaimed = events[kinds.index("reclaimed")]
            assert reclaimed.data["previous"] == before.lease_owner
            assert reclaimed.at < before.lease_expires_at - timedelta(seconds=30)    # not a lease later
            recs = job_records(store, jid)
            fps = [r.candidate.fingerprint for r in recs]
            assert len(fps) == len(set(fps))                                         # nothing measured twice
            assert len([r for r in recs if r.candidate.kind != "default"]) == JOB["trials"]
    finally:
        for p in started:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for pid in tree:                  # only if the test failed: the first serve's leftovers
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
