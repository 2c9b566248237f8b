"""Calibrated measuring workers: a measuring process that notices it runs slow.

A timing protocol that rejects samples a foreign process disturbed (compiler/timing.py) cannot
see a process that is slow *all the time*: a measuring process whose OpenMP team landed on one
core's two hyperthreads, a board that throttles when hot, a host whose frequency dropped, a
process stopped and continued by someone else's scheduler. Every sample is then equally slow and
equally "clean". What notices it is a fixed yardstick timed in the same process:

- **The calibration kernels** (`CALIBRATION_VERSION`; built here with the project's compiler, the
  same compute and schedule everywhere): an FMA-bound matmul tile (256 x 256 x 128 float32, blocks
  of 8 rows spread over the threads, 16-lane vectors) and a memory-bound stream
  (z = 1.5 x + y over 1 Mi floats, 12 MiB moved a call). Each is timed on one thread and on all of
  the worker's threads: four speeds (GFLOPS, GB/s), the worker's *calibration*. Samples are made
  at least `CAL_SAMPLE_S` long, so a slowdown that comes and goes faster than that (a duty cycle,
  a frequency governor) is averaged into every sample instead of hiding between them, and each
  sample's run-queue wait (time other processes took) is taken out of it (`on_cpu_seconds`): the
  calibration says how fast the process runs when it runs, so a loaded host is not a slow worker.
  Where other processes worked beside it anyway (`host_busy`, from /proc/stat, half a core or
  more: `loaded`), the verdict asks for a slowdown load cannot explain (`LOADED_SLOW_RATIO`): on
  a VM whose vCPUs are one core's hyperthreads on the host, a neighbour slows the calibration
  without taking its run-queue time.
  A fifth speed, `sync_n`, is the team's own: barriers a second of a running team of all the
  worker's threads (compiler.parallel_probe.team_barrier_kernel; none on one thread). Cores whose
  caches are far apart pass a cache line between them slowly; a cloud VM's two vCPUs spend seconds
  at a time so placed (Zen 4 VM: a barrier 0.50 us against 0.25, a fork and join 1.26 us against
  0.59), and then every kernel whose threads share data or meet often runs slower while the FMA
  tile and the stream, each thread on its own data, do not notice (the 256³ matmul default 1.31x,
  the 3x3 conv default about 2x, a candidate with one parallel loop barely): a comparison of
  two kernels taken then holds only then. The barrier is what moves, sharply and with little
  noise, so it is what tells that regime.
- **The device's own history** (`SpeedHistory`): the calibrations of this device key on this host
  (the records store's `calibrations` table for the local runner, the agent's own for an agent).
  A calibration's *speed index* is the lowest of its speeds' ratios to the history's upper
  quartile (`reference`: the device's standard is the regime it usually reaches, not a median a
  frequent slow regime drags down), over the speeds whose timing no other process disturbed
  (foreign load is the measurements' own checks' business): its all-threads speeds, and its
  one-thread speeds only where they fall below `LONE_THREAD_SLOW_RATIO` (0.6) of theirs
  (`speed_index`: the worker times kernels on its whole team, and a lone thread's speed moves
  with its core's sibling); below `SLOW_RATIO` (0.8) the worker is **slow**. With fewer than
  `MIN_HISTORY` comparable calibrations (same version and thread count) nothing is judged.
- **Windows** (`CalibratedWorker.measure_window`): a worker is calibrated when it starts and
  after every window of measurements (a runner's batch; a run of an agent's requests). A window
  closed by a slow calibration is **marked** (`slow_window` in each answer); the worker process is
  replaced (a new process, placed anew by the OS, its OpenMP team bound afresh) and calibrated,
  and the window is measured again (`remeasured`). A slow verdict is confirmed by a second
  calibration first, so one unlucky timing replaces nothing.
- **A slow spell of the host**: where every replacement reads slow too and nothing else loads
  the host (the last calibration undisturbed), the last one is calibrated again for a few
  seconds (`RECOVERY_WAIT_S`) before the window is given up on: a host-wide spell passes, a slow
  process does not, and load is not waited for.
- **Degraded**: a device whose replacement workers stay slow for `DEGRADE_AFTER` windows in a
  row is reported degraded (`state`); its windows are no longer measured again (it would not
  help), and their answers stay marked, so nothing downstream takes a best from them. A marked or
  re-measured answer says why: `slow_index`, the speed index of the calibration that found its
  window slow. An idle device is calibrated again from time to time (`recheck`: how a degraded
  one, which the farm sends no work, is seen to recover).

Kept light for the agent: numpy and the compiler (the tensor language, lowering and llvmlite
codegen the agent's runtime already needs); nothing of the tuner.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field

log = logging.getLogger("tunefarm.calibration")

CALIBRATION_VERSION = 3      # bumped whenever the kernels, their schedules or the way they are timed change
SLOW_RATIO = 0.8             # a calibration below this share of the device's median is slow
MIN_HISTORY = 3              # comparable calibrations needed before anything is judged
HISTORY_SIZE = 25            # the newest calibrations the median is taken over
DEGRADE_AFTER = 3            # windows in a row slow after replacement: the device is degraded
MAX_REPLACEMENTS = 2         # fresh processes tried per slow window before giving up on it
RECOVERY_WAIT_S = 8.0        # then calibrations this long at most, for a host-wide slow spell to pass
RECOVERY_PAUSE_S = 0.5       # between those calibrations
CAL_SAMPLE_S = 2e-3          # a calibration sample lasts at least this (see the module docstring)
CAL_MIN_SAMPLES = 5          # clean samples a calibration figure needs, or it counts as disturbed
FOREIGN_LOAD_CPUS = 0.5      # other processes' work beside a calibration that makes it `loaded` ...
LOADED_SLOW_RATIO = 0.6      # ... and judged slow only below this share (what load cannot explain)
METRICS = ("fma_1", "fma_n", "stream_1", "stream_n", "sync_n")
TEAM_METRICS = ("fma_n", "stream_n", "sync_n")   # the speeds the verdict is taken on (speed_index) ...
LONE_THREAD_SLOW_RATIO = 0.6  # ... with the one-thread speeds where they fall below this share

FMA_SHAPE = (256, 256, 128)  # M, N, K of the FMA tile
STREAM_N = 1 << 20           # floats of the stream's arrays
SYNC_BARRIERS = 100          # barriers of the team per call of the sync probe

HEALTHY, SLOW, UNKNOWN, DEGRADED = "healthy", "slow", "unknown", "degraded"


def on_cpu_seconds(kernel, arrays, seconds: float = 0.012) -> tuple[float, bool]:
    """(seconds per call the kernel spent on the CPU, whether too few samples could say) by the
    measurement protocol's own sampling (compiler.timing: samples of at least CAL_SAMPLE_S, each
    bracketed by the threads' run-queue wait), with that wait taken out of each sample instead of
    the sample thrown away: a calibration asks how fast this process runs when it runs. Time
    another process took from it is load, which the measurements' own checks see and retry; a
    process stopped, throttled or slowed all the time loses no run-queue time, and reads slow."""
    from compiler.timing import ThreadWaitClock, calls_per_sample

    run_batch, timed = kernel.batch_runner(arrays)
    run_batch(1)                              # warm-up; starts the OpenMP team
    n = calls_per_sample(run_batch, CAL_SAMPLE_S)
    # settle: sampled straight after the thread count changed (one thread's figures, then all of
    # them), the all-threads FMA figure read 7 % below the same kernel timed a moment later, and
    # a device's standard with it; two samples' worth first brings that to 1 % (stream: 0)
    run_batch(2 * n)
    clock = ThreadWaitClock()
    try:
        per_call: list = []
        perf = time.perf_counter
        end, tries = perf() + seconds, 0
        while tries < 200 and (perf() < end or len(per_call) < CAL_MIN_SAMPLES):
            tries += 1
            w0 = clock.wait_ns()
            t0 = perf()
            run_batch(n)
            dt = perf() - t0
            # the team meets at a barrier after each call, so a thread's wait holds them all: the
            # whole wait comes off (an over-correction when two threads wait at once only errs fast)
            on_cpu = dt - (clock.wait_ns() - w0) / 1e9
            if on_cpu > 0.5 * dt:             # mostly its own time: a usable sample
                per_call.append(on_cpu / n)
        del timed
        if not per_call:
            return math.inf, True
        return statistics.median(per_call), len(per_call) < CAL_MIN_SAMPLES
    finally:
        clock.close()


_KERNELS: dict = {}
_KERNELS_LOCK = threading.Lock()


def calibration_kernels() -> dict:
    """{"fma": (kernel, arrays), "stream": (kernel, arrays), "sync": (kernel, arrays)}, built once
    per process for the host (the sync probe's team size is its first parameter: set per call)."""
    with _KERNELS_LOCK:
        if not _KERNELS:
            _KERNELS.update(_build_kernels())
        return _KERNELS


def _build_kernels() -> dict:
    import numpy as np

    from compiler import tensor as T
    from compiler.runtime import build
    from compiler.schedule import create_schedule

    m, n, k = FMA_SHAPE
    a = T.placeholder((m, k), "float32", "A")
    b = T.placeholder((k, n), "float32", "B")
    r = T.reduce_axis(k, "k")
    c = T.compute((m, n), lambda i, j: T.sum(a[i, r] * b[r, j], axis=r), name="C")
    s = create_schedule([c])
    st = s[c]
    i, j = st.op.axis
    io, ii = st.split(i, 8)
    iio, ii = st.split(ii, 4)
    jo, ji = st.split(j, 16)
    st.reorder(io, iio, jo, r, ii, ji)
    st.unroll(ii)
    st.vectorize(ji)
    st.parallel(io)
    fma = build(s, [a, b, c], name="calibration_fma")

    x = T.placeholder((STREAM_N,), "float32", "X")
    y = T.placeholder((STREAM_N,), "float32", "Y")
    z = T.compute((STREAM_N,), lambda i: x[i] * 1.5 + y[i], name="Z")
    s2 = create_schedule([z])
    st2 = s2[z]
    outer, inner = st2.split(st2.op.axis[0], 1 << 14)
    _, lanes = st2.split(inner, 16)
    st2.vectorize(lanes)
    st2.parallel(outer)
    stream = build(s2, [x, y, z], name="calibration_stream")

    rng = np.random.default_rng(0)

    def arr(*shape):
        return (rng.random(shape, dtype=np.float32) * 0.9 + 0.1).astype(np.float32)
    from compiler.parallel_probe import team_barrier_kernel
    from compiler.target import resolve_target
    sync = team_barrier_kernel(resolve_target(None))   # params: team, barriers
    return {"fma": (fma, [arr(m, k), arr(k, n), np.zeros((m, n), np.float32)]),
            "stream": (stream, [arr(STREAM_N), arr(STREAM_N), np.zeros(STREAM_N, np.float32)]),
            "sync": (sync, [np.array([1, SYNC_BARRIERS], np.int64)])}


_WARMED: set = set()          # thread counts this process has calibrated at


def calibrate(threads: int | None = None, lock: bool = True) -> dict:
    """Time the calibration kernels in this process on one thread and on `threads` (default: every
    core), holding the host's timing lock unless `lock` is False (the caller holds it). Returns
    {"version", "threads", "fma_1", "fma_n" (GFLOPS), "stream_1", "stream_n" (GB/s), "sync_n"
    (millions of barriers a second of a team of `threads`; only for two threads or more),
    "disturbed" (the metrics whose timing other processes disturbed), "host_busy" (CPUs' worth
    of other processes' work beside it), "seconds", "pid"}."""
    import contextlib

    from compiler import host_lock
    from compiler.runtime import set_num_threads
    from compiler.timing import cpu_times, foreign_busy

    kernels = dict(calibration_kernels())
    sync_kernel, sync_arrays = kernels.pop("sync")
    n = max(1, min(int(threads or os.cpu_count() or 1), os.cpu_count() or 1))
    m, nn, k = FMA_SHAPE
    work = {"fma": 2.0 * m * nn * k / 1e9, "stream": 12.0 * STREAM_N / 1e9}
    out: dict = {"version": CALIBRATION_VERSION, "threads": n, "pid": os.getpid()}
    disturbed: list = []
    t0 = time.perf_counter()
    with host_lock.exclusive() if lock else contextlib.nullcontext():
        # a fresh process's first pass read as low as half its speed (its arrays' first touch, its
        # thread team's start): exactly the pass that judges a replacement worker. Not timed.
        for _ in range(1 if n in _WARMED else 2):
            disturbed = []
            pass_start, cpu0 = time.perf_counter(), cpu_times()
            for count, suffix in ((1, "1"), (n, "n")):
                set_num_threads(count)
                for name, (kernel, arrays) in kernels.items():
                    per_call, unsure = on_cpu_seconds(kernel, arrays)
                    out[f"{name}_{suffix}"] = work[name] / per_call
                    if unsure:
                        disturbed.append(f"{name}_{suffix}")
            if n > 1:   # the team's barriers (the probe forks its own team of n)
                sync_arrays[0][0] = n
                per_call, unsure = on_cpu_seconds(sync_kernel, sync_arrays)
                out["sync_n"] = SYNC_BARRIERS / per_call / 1e6
                # a team's barrier waits for its slowest thread: beside foreign load that the
                # other all-threads figures saw, it reads the load (half speed now and then)
                if unsure or any(f"{name}_n" in disturbed for name in kernels):
                    disturbed.append("sync_n")
            # other processes' work beside the calibration (judge: `loaded`)
            out["host_busy"] = foreign_busy(cpu0, cpu_times(), time.perf_counter() - pass_start)
            _WARMED.add(n)
    out["disturbed"] = disturbed
    out["seconds"] = time.perf_counter() - t0
    return out


# ----------------------------------------------------------------------------- judging

def comparable(cal: dict, past: dict) -> bool:
    return past.get("version") == cal.get("version") and past.get("threads") == cal.get("threads")


def _clean(cal: dict, metric: str) -> bool:
    """Whether the calibration's figure for `metric` is its own: other processes did not disturb
    its timing (a foreign busy loop slows the all-threads figures of a loaded host; that is load,
    which the measurements' own checks see, not the worker's speed)."""
    return cal.get(metric) is not None and metric not in (cal.get("disturbed") or ())


def reference(history: list, cal: dict) -> dict:
    """Per metric, the upper quartile of the undisturbed figures of the
    comparable calibrations of `history` (newest HISTORY_SIZE): the speed the device reaches in
    its usual regime. Not the median: a host that spends a third of its time in a slow regime (a
    cloud VM whose two vCPUs the hypervisor now and then runs on one physical core: 2-thread
    kernels 1.6-1.9x slower for seconds to minutes, seen on a Zen 3 VM) pulls its median into
    that regime, and a history begun in it takes it for the standard; the upper quartile is the
    fast regime once a quarter of the history has seen it, and a noisy device's quartile sits a
    few per cent above its median. A metric with fewer than MIN_HISTORY figures is left out.
    The slow calibrations since the last one that was not slow (the episode the device is in) are
    not part of the standard: a device that stays slow would otherwise lower its own standard until
    a throttled worker read healthy again. Once a calibration reads healthy, the episode's
    readings count again: left out for good, a noisy device's low readings would raise its
    standard until nothing read healthy."""
    same = [h for h in history if comparable(cal, h)]
    while same and same[-1].get("state") == SLOW:
        same.pop()
    ref = {}
    for m in METRICS:
        values = [float(h[m]) for h in same if _clean(h, m)][-HISTORY_SIZE:]
        if len(values) >= MIN_HISTORY:
            ref[m] = statistics.quantiles(values, n=4, method="inclusive")[2]   # the upper quartile
    return ref


def speed_index(cal: dict, ref: dict) -> float | None:
    """The lowest ratio of the calibration's undisturbed speeds to the reference's (1.0: as fast
    as usual), over its all-threads speeds, and over its one-thread speeds where they fall below
    LONE_THREAD_SLOW_RATIO (over the one-thread speeds alone where no all-threads one can be
    compared); None when no metric can be. The worker times kernels on its
    whole team, so the verdict is about the team's speed: where the team's threads come to share
    a core (SMT siblings, vCPUs the hypervisor runs on one core), the all-threads figures drop
    while a lone thread, the core to itself, reads *faster*; and a lone thread's speed moves by a
    third with what its core's sibling does while the team's holds (Zen 3 VM: FMA on one thread 62
    or 89 GFLOPS, on two 124-138 either way, or 85 in the shared-core regime). Judged at
    SLOW_RATIO, the one-thread speeds called a healthy regime slow against a history that had
    seen the other; they still find a worker stopped on a duty cycle, whose all-threads samples
    can fall between its stops (a lone thread at 0.3-0.55)."""
    team, lone = [], []
    for m in METRICS:
        if m in ref and ref[m] > 0 and _clean(cal, m):
            (team if m in TEAM_METRICS else lone).append(float(cal[m]) / ref[m])
    found = team + [r for r in lone if r < LONE_THREAD_SLOW_RATIO]
    if not found:
        return min(lone) if lone else None
    return min(found)


def loaded(cal: dict) -> bool:
    """Whether other processes worked beside the calibration (FOREIGN_LOAD_CPUS or more). On a VM
    whose vCPUs are one core's hyperthreads on the host, such a neighbour slows every figure
    without taking run-queue time from the calibration (Zen 5 VM, a busy loop on the other vCPU:
    FMA on two threads at 0.64-0.9 of its quiet speed, nothing waited), so a loaded calibration is
    judged slow only below LOADED_SLOW_RATIO: a worker stopped on a duty cycle still reads below
    that, a neighbour's share of the cores does not."""
    return float(cal.get("host_busy") or 0.0) >= FOREIGN_LOAD_CPUS


def judge(cal: dict, history: list) -> tuple[str, float | None]:
    """(HEALTHY, SLOW or UNKNOWN, speed index) of a calibration against the device's history."""
    index = speed_index(cal, reference(history, cal))
    if index is None:
        return UNKNOWN, None
    return (SLOW if index < (LOADED_SLOW_RATIO if loaded(cal) else SLOW_RATIO) else HEALTHY), index


class SpeedHistory:
    """A device's calibrations (per device key and host): what judging compares with. This one
    keeps them in memory (an agent's, or a runner without a records store); the tuner's
    `tuner.measure.calibration.StoreSpeedHistory` keeps them in the records store."""

    def __init__(self, initial=()):
        self._items: deque = deque(initial, maxlen=4 * HISTORY_SIZE)
        self._lock = threading.Lock()

    def recent(self, cal: dict) -> list:
        """Past calibrations comparable with `cal`, oldest first."""
        with self._lock:
            return [h for h in self._items if comparable(cal, h)]

    def add(self, cal: dict, state: str, index: float | None) -> None:
        with self._lock:
            self._items.append(dict(cal, state=state, speed_index=index))


@dataclass
class WindowReport:
    """What the calibrations around one window found."""

    slow_windows: int = 0          # closing calibrations that found the worker slow
    remeasured: int = 0            # measurements taken again in a fresh worker
    replacements: int = 0          # worker processes replaced for being slow
    state: str = UNKNOWN           # the device's state after the window
    speed_index: float | None = None
    calibrations: list = field(default_factory=list)


class CalibratedWorker:
    """A measuring `WorkerProcess` that is calibrated when it starts and after every window.

    `measure_window(items)` measures [(request, timeout), ...] (timed together, their samples in
    turn, with `interleave`: WorkerProcess.run_window; else one by one) and returns their answers
    (measure_one's dicts) after the window's closing calibration: re-measured in a replacement
    process when that found the worker slow, and marked `slow_window` when no healthy worker
    could be had (see the module docstring). `report` sums what happened over the worker's life.
    """

    def __init__(self, worker, history: SpeedHistory | None = None, threads: int | None = None,
                 calibration_timeout: float = 60.0, on_calibration=None, degrade_after: int | None = None,
                 max_replacements: int | None = None, interleave: bool = True, recovery_wait: float | None = None):
        self.worker = worker
        self.interleave = interleave   # a window's kernels timed together (WorkerProcess.run_window)
        # None: the module's DEGRADE_AFTER / MAX_REPLACEMENTS / RECOVERY_WAIT_S, read when used
        self.degrade_after, self.max_replacements, self.recovery_wait = degrade_after, max_replacements, recovery_wait
        self.history = history if history is not None else SpeedHistory()
        self.threads = threads
        self.calibration_timeout = calibration_timeout
        self.on_calibration = on_calibration      # called with (calibration dict, state, index)
        self.report = WindowReport()
        self._slow_in_a_row = 0
        self._calibrated_pid: int | None = None

    @property
    def state(self) -> str:
        return self.report.state

    def calibrate(self) -> tuple[str, float | None, dict | None]:
        """Calibrate the worker process now: (state, speed index, calibration); the calibration
        joins the history. A worker that cannot calibrate is UNKNOWN (its measurements tell)."""
        answer = self.worker.run({"calibrate": True, "threads": self.threads}, self.calibration_timeout)
        cal = answer.get("calibration")
        if not cal:
            log.warning("calibration failed: %s", answer.get("error_msg", "no answer"))
            return UNKNOWN, None, None
        state, index = judge(cal, self.history.recent(cal))
        self._calibrated_pid = cal.get("pid")
        self.history.add(cal, state, index)
        self.report.calibrations.append(dict(cal, state=state, speed_index=index))
        if self.on_calibration is not None:
            self.on_calibration(cal, state, index)
        return state, index, cal

    def _verdict(self) -> tuple[str, float | None]:
        """A calibration, and a second one to confirm a slow verdict (one unlucky timing replaces nothing)."""
        state, index, _ = self.calibrate()
        if state == SLOW:
            state, index, _ = self.calibrate()
        return state, index

    def _replace(self) -> tuple[str, float | None]:
        """A new process until one calibrates healthy (MAX_REPLACEMENTS tries), then, where every
        one read slow on a host nothing else loaded (the last calibration undisturbed),
        calibrations of the last for up to RECOVERY_WAIT_S: its verdict. A fresh
        process mends a slowness of its own (its team on one core's two hyperthreads, a process
        stopped on a duty cycle); a slow spell of the whole host (a VM's vCPUs placed far apart
        for seconds: Zen 4 VM, four fresh processes in a row) passes only with time, and a window
        measured again once it has is a window not lost."""
        state, index = SLOW, None
        tries = MAX_REPLACEMENTS if self.max_replacements is None else self.max_replacements
        for _ in range(max(1, tries)):
            self.worker.replace()
            self.report.replacements += 1
            state, index = self._verdict()
            if state != SLOW:
                return state, index
        last = self.report.calibrations[-1] if self.report.calibrations else {}
        if last.get("disturbed"):
            return state, index      # other processes hold the cores: load, which waiting does not tell from a spell
        deadline = time.monotonic() + (RECOVERY_WAIT_S if self.recovery_wait is None else self.recovery_wait)
        while state == SLOW and time.monotonic() + RECOVERY_PAUSE_S < deadline:
            time.sleep(RECOVERY_PAUSE_S)
            state, index = self._verdict()
        return state, index

    def start(self) -> str:
        """The starting calibration: a worker that starts slow is replaced before it measures. A
        device new to its history first has one filled (`fill_history`) and judges against it, so
        its first window is judged rather than its fourth: the first window of a tuning is its
        default's timing, which every candidate of the search is compared with."""
        state, index = self._verdict()
        if state == UNKNOWN and self.fill_history():
            state, index = self._verdict()
        if state == SLOW:
            log.warning("measuring worker started slow (speed index %.2f); replacing it", index or 0.0)
            state, index = self._replace()
        self._settle(state, index)
        return state

    def recheck(self) -> str:
        """A calibration of an idle worker (replaced when slow, as at its start): the device's state
        kept fresh between windows, and how a degraded device, which gets no work, is seen to
        recover (a healthy verdict clears degraded)."""
        state, index = self._verdict()
        if state == SLOW:
            log.warning("idle measuring worker calibrated slow (speed index %.2f); replacing it", index or 0.0)
            state, index = self._replace()
        self._settle(state, index)
        return self.report.state

    def fill_history(self) -> int:
        """Calibrate until the history holds MIN_HISTORY calibrations comparable with this worker's
        (MIN_HISTORY more at most), so a device new to its history is judged from its first window
        instead of its fourth; returns how many were taken. `start` calls it."""
        taken = 0
        while taken < MIN_HISTORY:
            last = self.report.calibrations[-1] if self.report.calibrations else None
            if last is None or len(self.history.recent(last)) >= MIN_HISTORY:
                break
            if self.calibrate()[2] is None:
                break
            taken += 1
        return taken

    def _settle(self, state: str, index: float | None) -> None:
        """The device's state after a verdict: slow ones in a row make it degraded, a healthy one
        clears that (recovered), an unknown one changes nothing."""
        if index is not None:
            self.report.speed_index = index
        if state == HEALTHY:
            self._slow_in_a_row = 0
            self.report.state = HEALTHY
        elif state == SLOW:
            self._slow_in_a_row += 1
            if self._slow_in_a_row >= (DEGRADE_AFTER if self.degrade_after is None else self.degrade_after):
                if self.report.state != DEGRADED:
                    log.error("device degraded: measuring workers slow over %d windows in a row (speed index %.2f)",
                              self._slow_in_a_row, index or 0.0)
                self.report.state = DEGRADED
            else:
                self.report.state = SLOW

    def measure_window(self, items: list) -> list:
        """Answers of [(request, timeout), ...], calibrated around (see the class docstring)."""
        if self._calibrated_pid is None or self._calibrated_pid != self.worker.pid:
            self.start()    # a new worker (first window, or one replaced after a crash) is calibrated first
        answers = self.worker.run_window(items, self.interleave)
        while True:
            if self.worker.pid != self._calibrated_pid:
                break        # a kernel crashed or hung the worker: its replacement is calibrated next window
            state, index = self._verdict()
            if state != SLOW:
                self._settle(state, index)
                break
            self.report.slow_windows += 1
            for a in answers:
                a["slow_window"] = True
                a["slow_index"] = index
            if self.report.state == DEGRADED:
                self._settle(state, index)
                break        # measuring again on a degraded device would not help: the answers stay marked
            log.warning("measuring worker slow after a window of %d (speed index %.2f): replacing it and measuring "
                        "the window again", len(items), index or 0.0)
            slow_index = index
            state, index = self._replace()
            if state == SLOW:
                self._settle(state, index)
                break        # no healthy worker to be had: the window stays marked
            answers = [dict(a, remeasured=True, slow_index=slow_index)
                       for a in self.worker.run_window(items, self.interleave)]
            self.report.remeasured += len(items)
        return answers
