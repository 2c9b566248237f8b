"""Calibrated measuring workers (device_agent/calibration.py): a worker made slow on purpose
mid-run is noticed, replaced and its window measured again; a device that stays slow is reported
degraded and its marked figures rank after every other record.

The drift is real: the measuring worker process is stopped and continued on a duty cycle
(SIGSTOP/SIGCONT, 3 ms stopped in every 4), which no per-sample check sees (a stopped thread does
not wait in a run queue), so every sample longer than the cycle is equally slow, as with a host
that throttles. The kernels are real kernels of this compiler; the truth is their in-process
timing afterwards."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from throttle import Throttle

from compiler import tensor as T
from compiler.runtime import build, load_kernel
from compiler.schedule import create_schedule
from device_agent import calibration as C
from tuner.candidate import Candidate, MeasureResult
from tuner.measure import BuildResult, LocalRunner, MeasureOptions
from tuner.measure.calibration import HOST_FILE_KEEP, HostSpeedHistory, StoreSpeedHistory
from tuner.records import SQLRecordsStore
from tuner.workload import Task, Workload

N = 96


def _matmul(schedule: str):
    a, b = T.placeholder((N, N), "float32", "A"), T.placeholder((N, N), "float32", "B")
    k = T.reduce_axis(N, "k")
    c = T.compute((N, N), lambda i, j: T.sum(a[i, k] * b[k, j], axis=k), name="C")
    s = create_schedule([c])
    st = s[c]
    i, j = st.op.axis
    if schedule == "vector":
        jo, ji = st.split(j, 16)
        st.reorder(i, jo, k, ji)
        st.vectorize(ji)
    elif schedule == "strided":          # k innermost: scalar, strided reads of B
        st.reorder(i, j, k)
    return build(s, [a, b, c], name=f"mm_{schedule}")


@pytest.fixture(scope="module")
def kernels():
    return {name: _matmul(name).to_bytes() for name in ("naive", "vector", "strided")}


def builds(kernels) -> list:
    ref = kernels["naive"]
    return [BuildResult(kernels[name], ref, num_inputs=2, candidate=Candidate("config", {"name": name}))
            for name in ("vector", "strided")]


def truth(kernel_bytes: bytes) -> float:
    """The kernel's time measured afterwards in this process, by the same protocol."""
    k = load_kernel(kernel_bytes)
    rng = np.random.default_rng(1)
    args = [rng.random((N, N), dtype=np.float32), rng.random((N, N), dtype=np.float32), np.zeros((N, N), np.float32)]
    return k.measure(*args).median


OPTIONS = MeasureOptions(max_repeat_ms=150.0, num_threads=1)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEFARM_LOCK_DIR", str(tmp_path))   # the host lock of this test only
    with SQLRecordsStore(f"sqlite:///{tmp_path / 'records.db'}") as s:
        yield s


def seeded_runner(store) -> LocalRunner:
    runner = LocalRunner(OPTIONS, history=StoreSpeedHistory(store, "local", "test-host"))
    for _ in range(C.MIN_HISTORY):       # the device's history: calibrations of an unthrottled worker
        runner.calibrated.calibrate()
    return runner


TASK = Task.create(Workload("matmul", dict(M=N, N=N, K=N)), "llvm", "local")


QUIET_HOST = pytest.mark.flaky(reruns=2, only_rerun=["AssertionError"])   # see pyproject's test extra


@QUIET_HOST
def test_a_worker_throttled_mid_run_is_detected_replaced_and_its_window_measured_again(store, kernels):
    with seeded_runner(store) as runner:
        first = runner.run(TASK, builds(kernels))                  # a clean window
        assert all(r.ok and not r.slow_window and not r.remeasured for r in first)
        slow_pid = runner.worker.pid
        with Throttle(lambda: runner.worker.pid) as throttle:
            second = runner.run(TASK, builds(kernels))             # throttled from its start
        report = runner.calibrated.report
    assert throttle.cycles > 10
    assert report.slow_windows >= 1 and report.replacements >= 1      # detected, replaced
    assert runner.worker.pid != slow_pid
    assert report.remeasured >= 2 and all(r.remeasured and not r.slow_window for r in second)   # re-measured
    assert all(r.slow_index < C.SLOW_RATIO for r in second)          # ... saying why: the slow calibration's index
    states = [c["state"] for c in store.calibrations("local", "test-host")]
    assert "slow" in states and states[-1] == "healthy"              # reported, in the records store
    slow = [c for c in store.calibrations("local", "test-host") if c["state"] == "slow"]
    assert all(c["speed_index"] < C.SLOW_RATIO for c in slow)
    # the recorded figures are the kernels' own, not the throttled worker's (twice the truth): within
    # 30 % of the truth measured afterwards in-process (a shared VM's speed moved 25 % in seconds)
    for br, res in zip(builds(kernels), second):
        t = truth(br.kernel_bytes)
        assert abs(res.cost - t) / t < 0.30, (br.candidate.payload, res.cost, t)
    best = min(zip(builds(kernels), second), key=lambda p: p[1].cost)[0]
    assert best.candidate.payload["name"] == "vector"


@QUIET_HOST
def test_a_slow_spell_of_the_whole_host_is_waited_out_and_the_window_measured_again(store, kernels, monkeypatch):
    """Every process of the device slow (a host-wide spell: each replacement reads slow too), then
    the spell passes while the last replacement is calibrated again: the window is measured again
    then, not given up on and marked."""
    monkeypatch.setattr(C, "MAX_REPLACEMENTS", 1)
    with seeded_runner(store) as runner:
        runner.calibrated.start()
        with Throttle(lambda: runner.worker.pid, follow=True) as throttle:
            def lift():   # the spell passes a moment after the replacement read slow
                while runner.calibrated.report.replacements < 1:
                    time.sleep(0.05)
                time.sleep(1.5)
                throttle.stop()
            lifter = threading.Thread(target=lift, daemon=True)
            lifter.start()
            results = runner.run(TASK, builds(kernels))
            lifter.join(30)
        report = runner.calibrated.report
    assert throttle.cycles > 10 and report.slow_windows >= 1 and report.replacements == 1
    assert all(r.ok and r.remeasured and not r.slow_window for r in results)   # measured again, not marked
    assert report.state == C.HEALTHY


@QUIET_HOST
def test_a_device_that_stays_slow_is_degraded_and_its_figures_rank_last(store, kernels, monkeypatch):
    monkeypatch.setattr(C, "DEGRADE_AFTER", 1)
    monkeypatch.setattr(C, "MAX_REPLACEMENTS", 1)
    monkeypatch.setattr(C, "RECOVERY_WAIT_S", 1.0)
    with seeded_runner(store) as runner:
        runner.calibrated.start()
        with Throttle(lambda: runner.worker.pid, follow=True):     # every process of the device is slow
            results = runner.run(TASK, builds(kernels))
        report = runner.calibrated.report
    assert report.state == C.DEGRADED and report.slow_windows >= 1
    assert all(r.slow_window and r.slow_index < C.SLOW_RATIO for r in results)   # marked: nothing could re-take them
    cands = [br.candidate for br in builds(kernels)]
    store.add_records(TASK, [(cands[0], results[0])])                # the marked fast reading ...
    store.add_records(TASK, [(cands[1], MeasureResult(costs=[1.0], median=1.0, minimum=1.0, spread=0.0, samples=1))])
    best = store.best(TASK.workload.key, TASK.target, k=2)
    assert [r.candidate.payload["name"] for r in best] == ["strided", "vector"]   # ... ranks after an unmarked one
    assert best[1].result.slow_window and not best[0].result.slow_window


@pytest.mark.parametrize("cal,expect", [
    ({"fma_1": 100, "fma_n": 190, "stream_1": 20, "stream_n": 30}, C.HEALTHY),
    ({"fma_1": 100, "fma_n": 100, "stream_1": 20, "stream_n": 30}, C.SLOW),          # all threads at half speed
    ({"fma_1": 100, "fma_n": 100, "stream_1": 20, "stream_n": 30, "disturbed": ["fma_n"]}, C.HEALTHY),   # load, not speed
    # other processes worked beside it (a VM's SMT neighbour takes no run-queue time): what load explains ...
    ({"fma_1": 100, "fma_n": 130, "stream_1": 20, "stream_n": 30, "host_busy": 1.0}, C.HEALTHY),
    ({"fma_1": 100, "fma_n": 130, "stream_1": 20, "stream_n": 30, "host_busy": 0.2}, C.SLOW),   # ... not a trace of it
    ({"fma_1": 100, "fma_n": 90, "stream_1": 20, "stream_n": 30, "host_busy": 1.0}, C.SLOW),    # ... and not this
])
def test_judging_against_the_device_history(cal, expect):
    past = [{"version": C.CALIBRATION_VERSION, "threads": 2, "fma_1": 100 + i, "fma_n": 200 - i, "stream_1": 20,
             "stream_n": 30, "disturbed": []} for i in range(C.MIN_HISTORY)]
    cal = dict(cal, version=C.CALIBRATION_VERSION, threads=2)
    assert C.judge(cal, past)[0] == expect
    assert C.judge(cal, past[:1])[0] == C.UNKNOWN                  # too little history: nothing judged
    assert C.judge(dict(cal, threads=4), past)[0] == C.UNKNOWN     # another thread count is not comparable


def test_slow_calibrations_never_lower_the_devices_standard():
    """A device that stays slow keeps reading slow: the slow calibrations of its current episode do
    not join the median (with them, five slow readings over three healthy ones made a half-speed
    worker read healthy)."""
    healthy = {"version": C.CALIBRATION_VERSION, "threads": 2, "fma_1": 100, "fma_n": 200, "stream_1": 20,
               "stream_n": 30, "disturbed": []}
    half = dict(healthy, fma_1=50, fma_n=100, stream_1=10, stream_n=15)
    history = C.SpeedHistory([dict(healthy, state=C.UNKNOWN, speed_index=None)] * C.MIN_HISTORY)
    for _ in range(2 * C.MIN_HISTORY):
        state, index = C.judge(half, history.recent(half))
        assert state == C.SLOW and index == pytest.approx(0.5)
        history.add(half, state, index)
    assert C.judge(healthy, history.recent(healthy)) == (C.HEALTHY, 1.0)    # recovered: as fast as before
    # once a reading is healthy, an earlier episode's slow readings count again: the standard is
    # the upper quartile of what the device read, never above what a quarter of its readings reached
    history.add(healthy, C.HEALTHY, 1.0)
    assert C.reference(history.recent(healthy), healthy)["fma_n"] == pytest.approx(200.0)    # four of ten read 200
    for _ in range(8):
        history.add(half, C.SLOW, 0.5)
    history.add(healthy, C.HEALTHY, 1.0)
    assert C.reference(history.recent(healthy), healthy)["fma_n"] == pytest.approx(150.0)    # fourteen of nineteen read 100


def _cal(fma_1, fma_n, stream_1=20.0, stream_n=38.0, **more):
    return {"version": C.CALIBRATION_VERSION, "threads": 2, "fma_1": fma_1, "fma_n": fma_n, "stream_1": stream_1,
            "stream_n": stream_n, "disturbed": [], **more}


def test_the_verdict_is_on_the_teams_speed():
    """A team whose threads came to share a core reads slow though its lone thread reads faster
    (the core to itself: seen on a Zen 3 VM, FMA 62 -> 89 GFLOPS on one thread, 124 -> 85 on
    two); a lone thread a third slower while the team holds its speed is no slower a worker (its
    core's sibling busy); a lone thread at a third of its speed is (stopped on a duty cycle whose
    all-threads samples fell between the stops)."""
    past = [_cal(62.0 + i, 124.0 - i, 47.0, 108.0) for i in range(C.MIN_HISTORY)]
    shared_core = _cal(89.0, 85.0, 55.0, 60.0)
    state, index = C.judge(shared_core, past)
    assert state == C.SLOW and index == pytest.approx(60.0 / 108.0)
    assert C.judge(_cal(45.0, 123.0, 47.0, 108.0), past)[0] == C.HEALTHY          # 0.71 of the lone standard
    assert C.judge(_cal(20.0, 123.0, 47.0, 108.0), past) == (C.SLOW, pytest.approx(20.0 / 63.5))
    # neither team figure comparable (disturbed): the one-thread figures judge
    assert C.judge(_cal(31.0, 60.0, 47.0, 50.0, disturbed=["fma_n", "stream_n"]), past) == (C.SLOW, pytest.approx(31.0 / 63.5))


def test_a_history_begun_in_a_slow_regime_learns_the_fast_one():
    """A device whose first calibrations fell in its slow regime (nothing to judge them by) reads
    its slow regime as slow once a quarter of its history has seen the fast one; with a median it
    took the slow regime for the standard until half the history had seen the other."""
    slow, fast = _cal(89.0, 85.0, 55.0, 60.0), _cal(62.0, 124.0, 47.0, 108.0)
    history = C.SpeedHistory()
    for _ in range(C.MIN_HISTORY):
        history.add(slow, *C.judge(slow, history.recent(slow)))
    assert C.judge(slow, history.recent(slow))[0] == C.HEALTHY        # no other regime seen yet
    assert C.judge(fast, history.recent(fast))[0] == C.HEALTHY
    history.add(fast, *C.judge(fast, history.recent(fast)))
    history.add(fast, *C.judge(fast, history.recent(fast)))
    state, index = C.judge(slow, history.recent(slow))
    assert state == C.SLOW and index < 0.6


def test_a_team_that_meets_slowly_is_a_slow_worker_though_each_thread_computes_as_fast():
    """The regime a cloud VM's vCPUs fall into for seconds (Zen 4 VM: a barrier 0.50 us against
    0.25; the 256³ matmul default 1.31x slower, the FMA tile and the stream unmoved): only the
    team's barrier speed drops, and it alone makes the verdict. A one-thread worker has no team
    to judge (no sync_n), and its history's missing figure is no figure."""
    past = [_cal(62.0, 124.0 - i, 47.0, 108.0, sync_n=3.9 - 0.05 * i) for i in range(C.MIN_HISTORY)]
    far_apart = _cal(62.0, 122.0, 47.0, 106.0, sync_n=1.95)
    state, index = C.judge(far_apart, past)
    assert state == C.SLOW and index == pytest.approx(1.95 / 3.875)
    assert C.judge(_cal(62.0, 122.0, 47.0, 106.0, sync_n=3.3), past)[0] == C.HEALTHY   # 0.85: the usual spread
    assert C.judge(_cal(62.0, 122.0, 47.0, 106.0, sync_n=1.95, disturbed=["sync_n"]), past)[0] == C.HEALTHY
    lone = [dict(_cal(62.0, 62.0, 47.0, 47.0), threads=1, sync_n=None) for _ in range(C.MIN_HISTORY)]
    assert C.judge(dict(_cal(62.0, 61.0, 47.0, 46.0), threads=1), lone)[0] == C.HEALTHY


class _ScriptedWorker:
    """A measuring worker whose calibrations are given in turn: the replacement and waiting
    decisions of CalibratedWorker._replace, without their seconds of real processes."""

    def __init__(self, calibrations):
        self.calibrations, self.pid, self.replaced = list(calibrations), 1, 0

    def run(self, request, timeout):
        return {"calibration": dict(self.calibrations.pop(0), pid=self.pid)}

    def replace(self):
        self.pid += 1
        self.replaced += 1


def test_a_spell_is_waited_for_only_on_a_host_nothing_else_loads(monkeypatch):
    """Every replacement slow: on a quiet host the last is calibrated again until it reads healthy;
    where the slow calibration saw foreign load, nothing is waited for (load does not pass by
    waiting, and the barrier reads it)."""
    monkeypatch.setattr(C, "RECOVERY_PAUSE_S", 0.01)
    monkeypatch.setattr(C, "RECOVERY_WAIT_S", 5.0)
    healthy = _cal(62.0, 124.0, 47.0, 108.0, sync_n=3.9)
    spell = _cal(62.0, 122.0, 47.0, 106.0, sync_n=1.9)
    past = [dict(healthy, state=C.HEALTHY, speed_index=1.0)] * C.MIN_HISTORY
    quiet = C.CalibratedWorker(_ScriptedWorker([spell] * 4 + [healthy]), C.SpeedHistory(past), max_replacements=1)
    assert quiet._replace()[0] == C.HEALTHY and quiet.worker.replaced == 1 and not quiet.worker.calibrations
    loaded = dict(spell, disturbed=["fma_n"])
    busy = C.CalibratedWorker(_ScriptedWorker([loaded] * 2 + [healthy] * 3), C.SpeedHistory(past), max_replacements=1)
    assert busy._replace()[0] == C.SLOW and len(busy.worker.calibrations) == 3   # not calibrated again


def test_a_calibration_measures_the_teams_barriers_on_two_threads_and_more():
    cal = C.calibrate(threads=2)
    assert cal["version"] == C.CALIBRATION_VERSION and 0.05 < cal["sync_n"] < 1000.0   # M barriers/s
    assert "sync_n" not in C.calibrate(threads=1)


def test_calibrations_round_trip_in_the_store(db_url):
    with SQLRecordsStore(db_url) as s:
        cal = {"version": 1, "threads": 2, "fma_1": 50.0, "fma_n": 90.0, "stream_1": 10.0, "stream_n": 12.0,
               "disturbed": ["stream_n"]}
        for i in range(3):
            s.add_calibration("x86", "h1", dict(cal, fma_1=50.0 + i, sync_n=3.5), "healthy", 1.0)
        s.add_calibration("x86", "h2", cal, "slow", 0.5)
        got = s.calibrations("x86", "h1", limit=2)
        assert [c["fma_1"] for c in got] == [51.0, 52.0] and got[0]["disturbed"] == ["stream_n"]
        assert got[0]["sync_n"] == 3.5 and s.calibrations("x86", "h2")[0]["sync_n"] is None
        assert [c["state"] for c in s.calibrations("x86", "h2")] == ["slow"]
        assert s.calibrations("x86", "h1", threads=4) == []


def test_the_hosts_history_outlives_a_store_and_keeps_the_newest(tmp_path, monkeypatch):
    """Every runner of this host adds to one file per device key (beside the host lock); a new
    process reads what earlier ones left, the newest HOST_FILE_KEEP of the comparable ones."""
    monkeypatch.setenv("TUNEFARM_LOCK_DIR", str(tmp_path))
    first = HostSpeedHistory("x86/avx2")
    for i in range(2 * HOST_FILE_KEEP + 5):
        first.add(_cal(60.0, float(i)), C.HEALTHY, 1.0)
    first.add(dict(_cal(60.0, 1.0), threads=4), C.HEALTHY, 1.0)      # another thread count
    with open(first.path, "a") as f:
        f.write('{"version": 2, "threads": 2, "fma_n"')               # a line cut short
    again = HostSpeedHistory("x86/avx2")
    got = again.recent(_cal(60.0, 0.0))
    assert again.path == first.path and len(got) == HOST_FILE_KEEP
    assert [c["fma_n"] for c in got][-1] == 2 * HOST_FILE_KEEP + 4 and got[-1]["state"] == C.HEALTHY
    assert HostSpeedHistory("other").recent(_cal(60.0, 0.0)) == []   # per device key
    assert len(again.recent(dict(_cal(60.0, 0.0), threads=4))) == 1


def test_a_fresh_store_judges_against_the_hosts_history(store, tmp_path):
    """A tuning on a new records file judges its first window against what this host's earlier
    runs saw, and leaves its calibrations in both; a store that knows the device better is judged
    by."""
    fast, slow = _cal(62.0, 124.0, 47.0, 108.0), _cal(89.0, 85.0, 55.0, 60.0)
    host = HostSpeedHistory()
    for _ in range(5):
        host.add(fast, C.HEALTHY, 1.0)
    history = StoreSpeedHistory(store)
    assert len(history.recent(slow)) == 5
    assert C.judge(slow, history.recent(slow))[0] == C.SLOW
    history.add(slow, C.SLOW, 0.5)
    assert len(store.calibrations("local", history.host)) == 1 and len(host.recent(slow)) == 6
    with SQLRecordsStore(f"sqlite:///{tmp_path / 'other.db'}") as other:
        for _ in range(8):
            other.add_calibration("local", history.host, slow, C.HEALTHY, 1.0)
        assert len(StoreSpeedHistory(other).recent(slow)) == 8                       # the longer one
        assert len(StoreSpeedHistory(other, host_file=False).recent(slow)) == 8
        assert StoreSpeedHistory(other, host="elsewhere").host_history is None     # not this machine's file


def test_an_unwritable_host_history_keeps_the_process_own(tmp_path, caplog):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    history = HostSpeedHistory(directory=str(blocked))
    history.add(_cal(62.0, 124.0), C.HEALTHY, 1.0)
    assert len(history.recent(_cal(62.0, 124.0))) == 1
    assert "unusable" in caplog.text


def test_a_new_runner_judges_its_first_window_by_the_hosts_earlier_runs(store, kernels):
    """A runner of a fresh records file, and one without any, start from what earlier runners of
    this host left in its file: a verdict from their first calibration."""
    with LocalRunner(OPTIONS) as first:
        first.run(TASK, builds(kernels)[:1])
        taken = len(first.calibrated.report.calibrations)
    assert taken >= 1 + C.MIN_HISTORY                        # its own start filled the host's history
    for history in (None, StoreSpeedHistory(store)):
        with LocalRunner(OPTIONS, history=history) as runner:
            runner.calibrated.start()
            cals = runner.calibrated.report.calibrations
        assert cals[0]["speed_index"] is not None            # judged from its first calibration
    assert len(HostSpeedHistory().recent(cals[0])) >= taken + 2
