"""The measurement protocol (compiler/timing.py) and the host's timing lock (compiler/host_lock.py)."""

from __future__ import annotations

import math
import subprocess
import sys
import time

import pytest

from compiler import host_lock
from compiler.timing import ThreadWaitClock, TimingOptions, time_samples


def busy_work(n):
    for _ in range(n):
        sum(range(200))


class LosingClock(ThreadWaitClock):
    """A clock whose threads lost 1 ms to waiting in every sample: a host that stays busy."""

    def __init__(self):
        super().__init__()
        self._lost = 0

    def wait_ns(self) -> int:
        self._lost += 500_000
        return self._lost


def test_a_quiet_timing_is_clean_and_stable():
    t = time_samples(busy_work, TimingOptions(min_samples=10, max_seconds=0.5))
    assert t.checked and t.count >= 10 and 0 < t.minimum <= t.median
    assert t.spread >= 0 and t.calls_per_sample >= 1 and t.basis and t.samples


def test_a_busy_host_is_retried_with_back_off_then_flagged():
    sleeps = []
    opts = TimingOptions(min_samples=5, max_seconds=0.05, attempts=3, backoff_s=0.01)
    t = time_samples(busy_work, opts, clock=LosingClock(), sleep=sleeps.append)
    assert t.attempts == 3 and sleeps == pytest.approx([0.01, 0.02], abs=2e-3)   # back-off doubles between attempts
    assert t.disturbed and t.lost_fraction > 0.02 and t.clean_fraction == 0.0
    assert t.median > 0 and t.count == len(t.samples)           # the figure from the disturbed samples, flagged


class QuietClock(ThreadWaitClock):
    """A clock whose threads never wait: every sample is clean."""

    def wait_ns(self) -> int:
        return 0


def sleeper(seconds):
    def run_batch(n):
        for _ in range(n):
            time.sleep(seconds)
    return run_batch


def test_a_kernel_past_the_slow_cutoff_is_timed_in_a_few_samples():
    """A search's candidate well behind the best is not timed ten times: three samples past the
    cutoff end the timing, one sample FAR_BEHIND times past it does, and its figure is still its
    own median."""
    from compiler.timing import CUT_SAMPLES
    opts = TimingOptions(min_samples=10, min_seconds=0.0, max_seconds=5.0, slow_cutoff_s=0.004)
    t = time_samples(sleeper(0.006), opts, clock=QuietClock())
    assert t.cut_short and t.count == CUT_SAMPLES == len(t.samples) and 0.006 <= t.median < 0.012
    far = time_samples(sleeper(0.02), opts, clock=QuietClock())
    assert far.cut_short and far.count == 1 and far.median >= 0.02 and not far.disturbed
    # well inside the cutoff: a loaded machine oversleeps a 2-ms sleep past 4 ms (median 4.2 ms seen)
    near = time_samples(sleeper(0.0005), opts, clock=QuietClock())
    assert not near.cut_short and near.count >= 10
    assert time_samples(sleeper(0.006), TimingOptions(min_samples=5, min_seconds=0.0), clock=QuietClock()).count >= 5


HOLD = """
import sys, time
from compiler import host_lock
with host_lock.exclusive():
    print("held", flush=True)
    time.sleep(float(sys.argv[1]))
"""


def test_a_build_waits_for_a_timing_in_another_process(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEFARM_LOCK_DIR", str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", HOLD, "1.0"], stdout=subprocess.PIPE, text=True,
                            env={**__import__("os").environ, "TUNEFARM_LOCK_DIR": str(tmp_path)})
    try:
        assert proc.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        with host_lock.shared():
            waited = time.monotonic() - t0
        assert waited > 0.5           # the shared side waited for the exclusive holder
        with host_lock.exclusive() as w:
            assert w < 0.5            # the holder is gone: free at once
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_holder_never_wedges_the_host(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEFARM_LOCK_DIR", str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", HOLD, "60"], stdout=subprocess.PIPE, text=True,
                            env={**__import__("os").environ, "TUNEFARM_LOCK_DIR": str(tmp_path)})
    assert proc.stdout.readline().strip() == "held"
    proc.kill()
    proc.wait()
    with host_lock.exclusive() as waited:
        assert waited < 1.0


def test_calls_known_to_the_caller_are_not_probed_and_long_runs_skip_later_warm_ups():
    """A caller whose warm-up lasted a sample passes calls=1: every run_batch is a timed sample of
    one call (no probing batch); time_interleaved warms a side of 0.2 s or more only in round one."""
    from compiler.graph.run_timing import time_interleaved
    batches = []

    def run_batch(n):
        batches.append(n)
        time.sleep(0.003)
    t = time_samples(run_batch, TimingOptions(min_samples=3, min_seconds=0.0), clock=QuietClock(), calls=1)
    assert t.calls_per_sample == 1 and set(batches) == {1} and len(batches) == len(t.samples)
    calls = []
    times = time_interleaved({"long": lambda: (calls.append(1), time.sleep(0.21))}, rounds=2, repeat=1, pause_s=0.0)
    samples = sum(len(t.samples) for t in times["long"].timings)
    assert len(calls) == 1 + samples          # one warm-up in all, every other call a timed sample


class DriftingHost:
    """Kernels of a fixed cost on a host that slows down steadily, by `per_call` of its speed
    each call: a host's drift between one timing and the next."""

    def __init__(self, per_call: float):
        self.calls, self.per_call, self.order = 0, per_call, []

    def kernel(self, name: str, seconds: float):
        def run_batch(n):
            for _ in range(n):
                self.calls += 1
                self.order.append(name)
                time.sleep(seconds * (1.0 + self.per_call * self.calls))
        return run_batch


def test_kernels_timed_together_take_turns_and_their_ratio_does_not_carry_the_drift(monkeypatch):
    """Timed one after the other, two equal kernels take their figures from two stretches of the
    host's drift (ratio ~1.7); timed together, in turns, from the same stretch (ratio ~1), each
    still by its own options and stopping rule, and each turn opened by an untimed call."""
    from compiler import timing
    from compiler.timing import time_together
    opts = TimingOptions(min_samples=20, max_samples=20, min_seconds=0.0, min_sample_s=0.0)
    # sleeps of 4-12 ms: a loaded machine's oversleeping stays small beside the drift
    host = DriftingHost(per_call=1 / 20)
    a = time_samples(host.kernel("a", 0.004), opts, clock=QuietClock(), calls=1)
    b = time_samples(host.kernel("b", 0.004), opts, clock=QuietClock(), calls=1)
    apart = b.median / a.median
    assert apart > 1.3
    # turns of one sample each (TURN_S 0), so the test does not hang on how long a sleep lasts
    monkeypatch.setattr(timing, "TURN_S", 0.0)
    host = DriftingHost(per_call=1 / 20)
    a, b = time_together([host.kernel("a", 0.004), host.kernel("b", 0.004)], [opts, opts],
                         clock=QuietClock(), calls=[1, 1])
    assert host.order[:4] == ["a", "a", "b", "b"]                    # an untimed call, then a sample
    # b's samples come two calls after a's (about 5 % later in the drift); a loaded machine's
    # oversleeping adds noise to both, so the bound is the drift the turns took out: most of it
    together = b.median / a.median
    assert a.count == b.count == 20 and 0.8 < together < 1.25 and abs(math.log(together)) < 0.5 * math.log(apart)
    monkeypatch.undo()
    host = DriftingHost(per_call=0.0)
    time_together([host.kernel("a", 0.002), host.kernel("b", 0.002)], [opts, opts], clock=QuietClock(), calls=[1, 1])
    assert 2 <= host.order.index("b") <= 8                          # a turn: one call and 10 ms of samples
    # a kernel that has its figure stops; the other samples on alone, to its own rule
    host = DriftingHost(per_call=0.0)
    short = TimingOptions(min_samples=5, max_samples=5, min_seconds=0.0, min_sample_s=0.0)
    a, b = time_together([host.kernel("a", 0.001), host.kernel("b", 0.002)], [short, opts],
                         clock=QuietClock(), calls=[1, 1])
    # its samples and one warm-up call a turn (one turn, unless a loaded machine's oversleeping
    # ran a's five samples past TURN_S)
    turns_of_a = sum(1 for i, k in enumerate(host.order) if k == "a" and (i == 0 or host.order[i - 1] != "a"))
    assert a.count == 5 and host.order.count("a") == 5 + turns_of_a and turns_of_a <= 2
    assert b.count == 20 and host.order[-10:] == ["b"] * 10
    # fastest samples: a loaded machine oversleeps a 1-ms sleep to 4 ms now and then, which five
    # samples' median can catch (a 4.0-ms median seen); it never sleeps short
    assert 1.3 < b.minimum / a.minimum < 2.6
    assert 0 < a.seconds < b.seconds                              # each is charged its own time
    # a kernel whose median settled samples on while the other has not: the same stretch of time
    host = DriftingHost(per_call=0.0)
    settles_at_once = TimingOptions(min_samples=3, min_seconds=0.0, min_sample_s=0.0, target_rel_err=1.0)
    a, b = time_together([host.kernel("a", 0.001), host.kernel("b", 0.002)], [settles_at_once, opts],
                         clock=QuietClock(), calls=[1, 1])
    assert b.count == 20 and a.count > 3 and a.seconds > 0.5 * b.seconds
    assert len(host.order) - host.order[::-1].index("a") > host.order.index("b")


def test_a_busy_kernel_backs_off_while_the_others_sample_on():
    """A timing together retries a disturbed kernel after its back-off, as alone; the kernels
    that were not disturbed are not held up by it."""
    from compiler.timing import time_together

    class OneLosingThread(QuietClock):
        """Run-queue wait only while kernel "busy" runs."""
        lost = 0

        def wait_ns(self) -> int:
            return self.lost
    clock = OneLosingThread()

    def busy(n):
        clock.lost += 500_000 * n
        time.sleep(0.001 * n)

    def quiet(n):
        time.sleep(0.001 * n)
    sleeps = []
    opts = TimingOptions(min_samples=5, max_seconds=0.05, attempts=3, backoff_s=0.01, min_sample_s=0.0)
    t_busy, t_quiet = time_together([busy, quiet], [opts, opts], clock=clock, sleep=sleeps.append, calls=[1, 1])
    assert t_busy.attempts == 3 and t_busy.disturbed and t_busy.clean_fraction == 0.0
    assert t_quiet.attempts == 1 and not t_quiet.disturbed and t_quiet.count >= 5
    assert sum(sleeps) <= 0.03 + 5e-3      # only what the other's sampling did not fill of the back-offs


def test_kernels_measured_together_say_which_one_failed():
    """measure_together: a kernel that fails while timed raises with its index, so a measuring
    worker answers it alone with the failure and times the rest again."""
    import numpy as np

    from compiler import Target, build
    from compiler import tensor as T
    from compiler.errors import KernelRuntimeError
    from compiler.runtime import measure_together
    from compiler.schedule import create_schedule
    a = T.placeholder((64,), "float32", "A")
    b = T.compute((64,), lambda i: a[i] * 2.0, name="B")
    k = build(create_schedule([b]), [a, b], Target.host())
    x, y = np.random.default_rng(0).uniform(0.5, 1.0, 64).astype(np.float32), np.full(64, np.nan, np.float32)
    t1, t2 = measure_together([(k, [x, y]), (k, [x, y])], TimingOptions(min_samples=5, max_seconds=0.05))
    assert t1.count >= 5 and t2.count >= 5 and np.allclose(y, 2 * x)

    class Failing:
        def batch_runner(self, arrays):
            def run_batch(n):
                raise KernelRuntimeError("kernel failing failed: index out of range", 2)
            return run_batch, arrays

        def _copy_back(self, arrays, timed):
            pass
    with pytest.raises(KernelRuntimeError) as e:
        measure_together([(k, [x, y]), (Failing(), [x, y])])
    assert e.value.kernel_index == 1
