"""The measurement protocol: how every tunefarm timing of a kernel is taken.

The local runner, the device agents, the baseline, the end-of-run re-measurement and the
benchmarks all time kernels through `time_samples`, so a figure means the same thing wherever
it was measured. What it does, and why:

- **Samples, not means.** A timing is many short samples (one call, or as few calls as make a
  sample at least `min_sample_s` long), each timed on its own. A mean over many calls lets one
  call that waited behind another process's time slice (milliseconds, against a kernel of 0.1
  ms) decide the figure; the median of samples does not.
- **Each sample knows what it lost.** Linux keeps, per thread, the time it spent runnable but
  waiting for a CPU (`/proc/self/task/<tid>/schedstat`, second field). Summed over the threads of
  this process (the calling thread and the OpenMP team) before and after a sample, that is what
  the kernel lost to other processes during it. A sample that lost more than a small floor is
  *disturbed*; the figure is the median of the clean samples.
- **Disturbed timings are retried, then flagged.** When too few samples are clean, the timing
  backs off (sleeps, doubling) and samples again. If the host stays busy, the result says so:
  `disturbed` is set and `lost_fraction` is the share of the kernel threads' time lost to
  waiting. A figure from a busy host is never presented as a clean one.
- **Repeats adapt.** Sampling goes on until the median of the clean samples is stable (its
  estimated relative standard error under `target_rel_err`), within `min_seconds` ..
  `max_seconds` and `min_samples` .. `max_samples`.
- **A kernel far behind is not timed at length** (`slow_cutoff_s`, seconds per call; a search
  sets it to a multiple of the best it has measured): once CUT_SAMPLES clean samples put its
  median past the cutoff, or one sample puts it FAR_BEHIND times past it, sampling stops and the
  figure is the median of those samples (`cut_short`); the measuring worker does not even start
  sampling a kernel whose checked call was that far past it (`single_call_timing`). A search
  only needs to know that such a kernel is slow and by roughly how much; ten samples of a kernel
  20x slower than the best cost 20x the time of the best's, and were most of the wall time of
  short runs on large computes.
- **How busy the host was** (`host_busy`): CPUs' worth of time other processes used during the
  timing (from /proc/stat minus this process's own CPU time), for people and records.

Where /proc is missing (not Linux), samples cannot be checked: every sample counts as clean and
`checked` is False.

**The measuring process** (`prepare_timing_process`, called first thing by the measuring worker
that the local runner and the device agent start) sets three things before libgomp loads (libgomp
reads its environment once; a value the user set is kept):
- **Its OpenMP team is bound, one thread per core** (OMP_PROC_BIND=close, OMP_PLACES=cores).
  Left to the scheduler, a 2-thread kernel on a quiet 2-core host sometimes runs with both threads
  on one core (a 512³ matmul then reads 2.0x its time, in one process but not the next), and with
  one core held by a busy loop it fell into a steady state where every call took 12x its quiet
  time (15.9 ms against 1.3 ms, spread 0.3 %: no per-sample check can reject that). Bound, the
  same kernel read 1.23-1.25 ms busy against 1.22-1.25 ms quiet (Linux 6.18, EEVDF, znver4).
- **A higher scheduling priority** (nice MEASURE_NICE) where the OS allows it (root, CAP_SYS_NICE
  or RLIMIT_NICE). It runs kernels only while holding the host's timing lock, so the priority
  takes nothing from tunefarm's own work; against another program on a core it decides who runs:
  the bound thread that shares a core with a busy loop then loses a few per cent of its samples
  to it, and those are rejected, instead of half its time.
- **The OpenMP wait policy.** With the priority, libgomp's own spin-then-sleep default keeps the
  team hot between the back-to-back calls of a timing; without it, a thread that spins holds a
  core the thread that has work needs, which is how one busy core made parallel kernels
  25-150x slower, so the spin is cut short (GOMP_SPINCOUNT SHORT_SPIN, a fraction of a
  millisecond) and a busy core costs about 2x.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass, field

_TASK_DIR = "/proc/self/task"

MEASURE_NICE = -10          # the measuring process's priority, where the OS allows it
CUT_SAMPLES = 3             # clean samples past slow_cutoff_s that end a timing
FAR_BEHIND = 4.0            # one clean sample this many times past slow_cutoff_s ends it
SHORT_SPIN = "10000"        # libgomp spin iterations before a waiting thread sleeps, without it
TEAM_BINDING = {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}   # one team thread per core, fixed
BINDING_SETTINGS = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY")   # any of them: the user chose
TURN_S = 0.01               # a kernel's turn in a timing together: samples for at least this long ...
WARM_BELOW_S = 0.005        # ... after one untimed call, for kernels whose calls are shorter than this


def prepare_timing_process() -> dict:
    """Thread binding, priority and OpenMP wait policy of a process that times kernels; call
    before libgomp loads (before compiler.runtime.initialize). Returns what it set, for logs and
    tests."""
    raised = False
    try:
        os.setpriority(os.PRIO_PROCESS, 0, MEASURE_NICE)   # this thread; threads started later inherit it
        raised = True
    except (OSError, AttributeError):
        pass
    if not raised and "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = SHORT_SPIN
    if not any(name in os.environ for name in BINDING_SETTINGS):
        os.environ.update(TEAM_BINDING)
    return {"nice": os.getpriority(os.PRIO_PROCESS, 0) if hasattr(os, "getpriority") else None,
            "raised": raised, "spin": os.environ.get("GOMP_SPINCOUNT"),
            "binding": {name: os.environ[name] for name in BINDING_SETTINGS if name in os.environ}}


class ThreadWaitClock:
    """Run-queue wait (ns) summed over this process's threads, read cheaply many times.

    The schedstat files stay open (a read at offset 0 regenerates their text); `refresh()` picks
    up threads created since (the OpenMP team appears on the first parallel call)."""

    def __init__(self):
        self._fds: dict[str, int] = {}
        self.available = os.path.isdir(_TASK_DIR)
        self.refresh()

    def refresh(self) -> None:
        if not self.available:
            return
        try:
            tids = set(os.listdir(_TASK_DIR))
        except OSError:
            self.available = False
            return
        for tid in list(self._fds):
            if tid not in tids:
                os.close(self._fds.pop(tid))
        for tid in tids - set(self._fds):
            try:
                self._fds[tid] = os.open(f"{_TASK_DIR}/{tid}/schedstat", os.O_RDONLY)
            except OSError:
                continue
        if not self._fds:
            self.available = False

    @property
    def threads(self) -> int:
        return len(self._fds)

    def wait_ns(self) -> int:
        """Total run-queue wait of the threads seen so far (0 when unavailable)."""
        total = 0
        for tid, fd in list(self._fds.items()):
            try:
                fields_ = os.pread(fd, 96, 0).split()
                total += int(fields_[1])
            except (OSError, IndexError, ValueError):
                os.close(self._fds.pop(tid))  # the thread ended
        return total

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def cpu_times() -> tuple[float, float] | None:
    """(busy seconds of the whole host, CPU seconds of this process) or None without /proc."""
    try:
        with open("/proc/stat") as f:
            parts = f.readline().split()[1:]
        with open("/proc/self/stat") as f:
            own = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    values = [int(v) for v in parts]
    idle = values[3] + (values[4] if len(values) > 4 else 0)   # idle + iowait
    busy = sum(values[:8]) - idle                              # user..steal, not guest (counted in user)
    return busy / ticks, (int(own[11]) + int(own[12])) / ticks  # utime + stime of all threads


def foreign_busy(before: tuple[float, float] | None, after: tuple[float, float] | None, elapsed: float) -> float:
    """CPUs' worth of other processes' work between two `cpu_times()` readings `elapsed` seconds
    apart (0.0 when either is missing). /proc/stat counts in ticks of 10 ms: over a tenth of a
    second the figure is good to about 0.2 CPU."""
    if before is None or after is None or elapsed <= 0:
        return 0.0
    return max(0.0, ((after[0] - before[0]) - (after[1] - before[1])) / elapsed)


@dataclass
class TimingOptions:
    """How long and how carefully to time; the defaults suit kernels of 10 µs .. 100 ms."""

    min_samples: int = 10          # clean samples the figure needs at least
    max_samples: int = 400
    min_seconds: float = 0.05      # of sampling per attempt
    max_seconds: float = 1.0       # per attempt (a slow kernel still gets min_samples)
    min_sample_s: float = 100e-6   # calls are batched until a sample is at least this long
    min_calls: int = 1             # calls per sample at least
    target_rel_err: float = 0.005  # stop once the median's estimated relative error is below this
    clean_floor_s: float = 5e-6    # run-queue wait a clean sample may have (wake-up latency) ...
    clean_share: float = 0.01      # ... or this share of its duration, whichever is larger
    attempts: int = 4              # tries in all when too few samples are clean
    backoff_s: float = 0.05        # first back-off; doubles per retry
    disturbed_lost: float = 0.02   # a timing whose threads lost more than this share is disturbed
    slow_cutoff_s: float = math.inf  # per call: a kernel past this is timed briefly (see the module docstring)

    def check(self) -> "TimingOptions":
        if self.min_samples < 1 or self.max_samples < self.min_samples:
            raise ValueError("need 1 <= min_samples <= max_samples")
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if not (0 <= self.min_seconds <= self.max_seconds) or self.max_seconds <= 0:
            raise ValueError("need 0 <= min_seconds <= max_seconds and max_seconds > 0")
        if not self.slow_cutoff_s > 0:
            raise ValueError("slow_cutoff_s must be positive (math.inf: no cutoff)")
        return self


@dataclass
class Timing:
    """What one timing found. Costs are seconds per call."""

    median: float                  # of the samples the figure is taken from (clean ones when enough)
    minimum: float
    spread: float                  # interquartile range / median of those samples
    count: int                     # samples the figure is taken from
    samples: list = field(default_factory=list)   # every sample of the last attempt (s per call)
    basis: list = field(default_factory=list)     # the samples the figure is taken from
    calls_per_sample: int = 1
    disturbed: bool = False        # the host kept the kernel's threads waiting, even after retries
    lost_fraction: float = 0.0     # share of the threads' sampled time spent waiting for a CPU
    clean_fraction: float = 1.0    # share of the last attempt's samples that lost nothing
    host_busy: float = 0.0         # CPUs' worth of other processes' work during the timing
    attempts: int = 1
    checked: bool = True           # False: no /proc, samples could not be checked
    seconds: float = 0.0           # wall time the timing took, back-offs included
    cut_short: bool = False        # stopped early: the kernel was past TimingOptions.slow_cutoff_s

    def to_dict(self) -> dict:
        return {"median": self.median, "min": self.minimum, "spread": self.spread, "count": self.count,
                "calls_per_sample": self.calls_per_sample, "disturbed": self.disturbed,
                "lost_fraction": self.lost_fraction, "clean_fraction": self.clean_fraction,
                "host_busy": self.host_busy, "attempts": self.attempts, "checked": self.checked,
                "cut_short": self.cut_short}


def median_rel_err(values: list) -> float:
    """Estimated relative standard error of the median (normal approximation, scale from the MAD)."""
    n = len(values)
    if n < 3:
        return math.inf
    med = statistics.median(values)
    if med <= 0:
        return math.inf
    mad = statistics.median(abs(v - med) for v in values)
    return 1.2533 * 1.4826 * mad / math.sqrt(n) / med


def _summary(values: list) -> tuple[float, float, float]:
    med = statistics.median(values)
    if len(values) >= 4:
        q = statistics.quantiles(values, n=4)
        spread = (q[2] - q[0]) / med if med > 0 else 0.0
    else:
        spread = (max(values) - min(values)) / med if med > 0 else 0.0
    return med, min(values), spread


def time_samples(run_batch, options: TimingOptions | None = None, clock: ThreadWaitClock | None = None,
                 sleep=time.sleep, calls: int | None = None) -> Timing:
    """Time `run_batch(n)` (runs the kernel n times; returns nothing) by the protocol above.

    The caller has warmed the kernel up (one call at least). `calls`: the calls per sample when the
    caller knows them (its warm-up call alone lasted a sample: probing again would cost a whole-model
    run of seconds for nothing). `run_batch` may raise; the timing stops with it."""
    return time_together([run_batch], [options], clock=clock, sleep=sleep, calls=[calls])[0]


def time_together(run_batches: list, options: list | None = None, clock: ThreadWaitClock | None = None,
                  sleep=time.sleep, calls: list | None = None) -> list:
    """Time several kernels by the protocol above, taking turns (a short burst of samples of the
    first, then of the second, ..., then the first again): one Timing per kernel, each from its
    own samples by its own options and stopping rule, as `time_samples` would take it alone.

    Why interleaved: a host's speed moves on its own over seconds (a VM whose vCPUs the hypervisor
    now and then runs on one core, a neighbour's memory traffic; on a Zen 3 VM the same kernel
    timed twice back to back read 0.74-1.14 of itself). Kernels timed one after the other each
    take their figure from a different stretch of that drift, so their *ratio* carries it, and a
    ratio (a candidate against the default, one candidate against another) is what a search and
    a re-timing decide by. Taken in turn, every kernel samples the same stretch: the drift moves
    them together and their ratio holds. A kernel whose median has settled samples on while
    another has not, within its own caps (max_seconds, max_samples): left out, it kept a figure
    from a fast start while the other sampled on alone into a slow stretch (a conv paired with
    itself read 1.66 once so). On a steady host they all settle about together, and a window
    costs what its kernels timed one by one would; on a drifting one, up to their caps.
    Each kernel's turn is a burst of samples (TURN_S) after one untimed call (for kernels under
    WARM_BELOW_S a call): a kernel sampled straight after another finds the caches as the other
    left them, and a 256³ matmul of 0.2 ms read 18 % slower than timed alone; warmed, each
    turn's samples see the kernel as a timing of it alone does.
    `options`, `calls`: per kernel (None: the defaults, probed). The caller has warmed each
    kernel up. A `run_batch` that raises stops the whole timing with it."""
    k = len(run_batches)
    options = list(options) if options is not None else [None] * k
    calls = list(calls) if calls is not None else [None] * k
    if len(options) != k or len(calls) != k:
        raise ValueError("time_together: one options and one calls entry per kernel")
    own_clock = clock is None
    clock = clock or ThreadWaitClock()
    started = time.perf_counter()
    cpu0 = cpu_times()
    try:
        states = [_KernelSampling(rb, (o or TimingOptions()).check(), c) for rb, o, c in zip(run_batches, options, calls)]
        for st in states:
            st.start_attempt(clock, time.perf_counter())
        perf = time.perf_counter
        while True:
            running = [st for st in states if not st.done and not st.backing_off]
            if not running:
                waiting = [st for st in states if not st.done]
                if not waiting:
                    break
                first = min(st.resume_at for st in waiting)
                sleep(max(0.0, first - perf()))    # (a back-off: nothing else to sample meanwhile)
                for st in waiting:
                    if st.resume_at <= first:
                        st.start_attempt(clock, perf())
                continue
            for st in running:
                if k == 1:
                    while not st.take_sample(clock, interleaved=False):
                        pass
                    st.end_attempt(clock, perf(), interleaved=False)
                    continue
                st.warm()
                turn_end = perf() + TURN_S
                # a settled kernel samples on while another has not settled: its figure then
                # comes from the same stretch of the host's time as the other's
                hold = any(not o.done and not o.settled for o in states if o is not st)
                while True:
                    if st.take_sample(clock, interleaved=True, hold=hold):
                        st.end_attempt(clock, perf(), interleaved=True)
                        break
                    if perf() >= turn_end:
                        break
            now = perf()
            for st in states:
                if st.backing_off and st.resume_at <= now:
                    st.start_attempt(clock, now)
        elapsed = time.perf_counter() - started
        host_busy = foreign_busy(cpu0, cpu_times(), elapsed)
        return [st.timing(clock.available, host_busy, elapsed if k == 1 else st.spent) for st in states]
    finally:
        if own_clock:
            clock.close()


class _KernelSampling:
    """One kernel's side of a timing (`time_together`): its samples, attempts and stopping rule."""

    def __init__(self, run_batch, opts: TimingOptions, calls: int | None):
        self.run_batch, self.opts = run_batch, opts
        self.n = max(int(calls), opts.min_calls) if calls else calls_per_sample(run_batch, opts.min_sample_s, opts.min_calls)
        self.clean_all: list = []
        self.attempt = 0
        self.done = False
        self.cut = False
        self.resume_at = 0.0          # perf_counter time its next attempt may start ...
        self.backing_off = False      # ... while it waits for it
        self.lost_fraction = 0.0
        self.spent = 0.0              # seconds of its own samples and back-offs (its share of a window)

    def start_attempt(self, clock: ThreadWaitClock, now: float) -> None:
        clock.refresh()
        self.threads = max(1, clock.threads)
        self.samples: list = []
        self.clean: list = []
        self.lost_ns, self.own_s = 0, 0.0
        self.t_start = now
        self.backing_off = False
        self.settled = False          # its median met the stopping rule

    def warm(self) -> None:
        """An untimed call before the kernel's turn of a timing together (`time_together`),
        unless its calls are long enough that the caches another kernel left weigh little."""
        if self.samples and self.samples[-1] >= WARM_BELOW_S:
            return
        t0 = time.perf_counter()
        self.run_batch(1)
        self.spent += time.perf_counter() - t0

    def take_sample(self, clock: ThreadWaitClock, interleaved: bool, hold: bool = False) -> bool:
        """One sample; True when this attempt is over (by the stopping rule or the slow cutoff).
        Its elapsed time is its own samples' (`interleaved`: the others' samples between them are
        not its time) or the attempt's wall time (alone). `hold`: a settled median does not end
        the attempt (another kernel of the timing has not settled); its caps still do."""
        opts, perf = self.opts, time.perf_counter
        w0 = clock.wait_ns()
        t0 = perf()
        self.run_batch(self.n)
        t1 = perf()
        waited = clock.wait_ns() - w0
        dt = t1 - t0
        self.own_s += dt
        self.spent += dt
        self.samples.append(dt / self.n)
        self.lost_ns += waited
        if waited <= max(opts.clean_floor_s, opts.clean_share * dt) * 1e9:
            self.clean.append(dt / self.n)
            if _past_cutoff(self.clean, opts.slow_cutoff_s):
                self.cut = True
                return True
        elapsed = self.own_s if interleaved else t1 - self.t_start
        if len(self.samples) >= opts.max_samples or (elapsed >= opts.max_seconds and len(self.samples) >= opts.min_samples):
            return True
        if not self.settled and elapsed >= opts.min_seconds and len(self.clean) >= opts.min_samples \
                and median_rel_err(self.clean) <= opts.target_rel_err:
            self.settled = True
        if self.settled and not hold:
            return True
        return elapsed >= opts.max_seconds * 4   # a kernel so slow that min_samples take too long

    def end_attempt(self, clock: ThreadWaitClock, now: float, interleaved: bool) -> None:
        """Close an attempt: done when quiet, cut or out of attempts; else back off, doubling."""
        opts = self.opts
        wall = self.own_s if interleaved else now - self.t_start
        self.lost_fraction = min(1.0, self.lost_ns / 1e9 / (wall * self.threads)) if wall > 0 else 0.0
        self.clean_all.extend(self.clean)
        quiet = self.lost_fraction <= opts.disturbed_lost and len(self.clean) >= opts.min_samples
        if not clock.available or self.cut or quiet or self.attempt == opts.attempts - 1:
            self.done = True
            return
        self.resume_at = now + opts.backoff_s * 2 ** self.attempt
        self.spent += opts.backoff_s * 2 ** self.attempt
        self.attempt += 1
        self.backing_off = True

    def timing(self, checked: bool, host_busy: float, seconds: float) -> Timing:
        opts = self.opts
        clean_fraction = len(self.clean) / len(self.samples) if self.samples else 0.0
        use_clean = len(self.clean_all) >= opts.min_samples or (self.cut and bool(self.clean_all))
        basis = self.clean_all if use_clean else self.samples
        med, mn, spread = _summary(basis)
        # judged on the last attempt: a moment of load that a retry got past is not a disturbance
        disturbed = checked and (self.lost_fraction > opts.disturbed_lost or not use_clean)
        return Timing(median=med, minimum=mn, spread=spread, count=len(basis), samples=self.samples,
                      basis=list(basis), calls_per_sample=self.n, disturbed=bool(disturbed),
                      lost_fraction=self.lost_fraction, clean_fraction=clean_fraction, host_busy=host_busy,
                      attempts=self.attempt + 1, checked=checked, seconds=seconds, cut_short=self.cut)


def calls_per_sample(run_batch, min_sample_s: float, min_calls: int = 1) -> int:
    """Calls per sample so a sample lasts at least `min_sample_s` (timer resolution and the
    call's own overhead stay far below the kernel's time)."""
    n = max(1, int(min_calls))
    while True:
        t0 = time.perf_counter()
        run_batch(n)
        dt = time.perf_counter() - t0
        if dt >= min_sample_s or n >= 1 << 20:
            return n
        n = max(n * 2, int(n * min_sample_s * 1.2 / max(dt, 1e-9)))


def single_call_timing(seconds: float) -> Timing:
    """The figure of a kernel whose one (checked) call already put it FAR_BEHIND past a slow
    cutoff: that call, unchecked for disturbance, cut short."""
    return Timing(median=seconds, minimum=seconds, spread=0.0, count=1, samples=[seconds], basis=[seconds],
                  checked=False, seconds=seconds, cut_short=True)


def _past_cutoff(clean: list, cutoff: float) -> bool:
    """Whether the clean samples so far show a kernel past the slow cutoff (module docstring)."""
    if cutoff == math.inf:
        return False
    med = statistics.median(clean)
    return med > cutoff and (len(clean) >= CUT_SAMPLES or med > FAR_BEHIND * cutoff)
