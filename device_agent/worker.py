"""The measuring worker: check a built kernel against a reference and time it, in a child process.

This module is the code that measures every candidate, whether the tuner measures on its own
machine (tuner.measure.LocalRunner) or a device agent of the farm does. It imports only numpy and
the compiler's runtime loader, so it runs on a small board that has nothing of the tuner.

- `MeasureRequest`: a candidate kernel's bytes (`Kernel.to_bytes`), the bytes of the reference
  kernel (the naive schedule of the same workload), how many leading arguments are inputs, and
  the measure options.
- `measure_one(request) -> dict`: load both kernels, make random non-zero inputs, run the reference
  and the candidate on poisoned outputs, compare every output within tolerance, then time the
  candidate. Runs in the calling process: a crashing kernel takes the process with it.
- `WorkerProcess`: a child process (`python -m device_agent.worker`) serving requests one at a
  time over pipes. `run(request, timeout)` returns measure_one's dict; a child that dies
  (RUNTIME_ERROR, naming the signal) or hangs past the timeout (killed, RUN_TIMEOUT) is replaced
  for the next request.

The result dict: `{"costs": [seconds, ...], "error_code": int, "error_msg": str, "run_seconds": float}`.
Error codes are the integers of tuner.candidate.ErrorCode (this module cannot import the tuner).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from compiler.measure_options import MeasureOptions
from compiler.timing import FAR_BEHIND, single_call_timing
from compiler.verify import as_comparable, compare_output, poisoned, same_as_poison

# Same values as tuner.candidate.ErrorCode (checked by the tests).
NO_ERROR = 0
RUNTIME_ERROR = 4
WRONG_ANSWER = 5
RUN_TIMEOUT = 6
RUNNER_ERROR = 7
UNSUPPORTED_TARGET = 8


@dataclass
class MeasureRequest:
    """One kernel to check and time: the candidate, its reference, and how (MeasureOptions);
    plain data (crosses processes)."""

    kernel_bytes: bytes
    reference_bytes: bytes | None
    num_inputs: int                    # the kernel's arguments are num_inputs inputs, then outputs
    options: MeasureOptions = field(default_factory=MeasureOptions)

    def to_dict(self) -> dict:
        return {"kernel_bytes": self.kernel_bytes, "reference_bytes": self.reference_bytes,
                "num_inputs": self.num_inputs, "options": self.options.to_dict()}

    @staticmethod
    def from_dict(d: dict) -> "MeasureRequest":
        return MeasureRequest(d["kernel_bytes"], d.get("reference_bytes"), int(d["num_inputs"]),
                              MeasureOptions.from_dict(d.get("options") or {}))


def _result(code: int = NO_ERROR, msg: str = "", costs=None, run_seconds: float = 0.0) -> dict:
    return {"costs": list(costs or []), "error_code": int(code), "error_msg": msg,
            "run_seconds": float(run_seconds)}


# ----------------------------------------------------------------------------- measuring

def random_arrays(specs, seed: int) -> list:
    """Random non-zero arrays for the given ArgSpecs: floats ±[0.1, 1], ints ±[1, 4], bools 0/1."""
    rng = np.random.default_rng(seed)
    out = []
    for spec in specs:
        dt = np.dtype(spec.dtype)
        shape = tuple(spec.shape)
        if dt.kind == "f":
            # drawn in the argument's own precision (float32 for float32 and narrower): a
            # 25088 x 4096 weight took seconds as float64 draws, once per task and re-timing
            mag = rng.random(size=shape, dtype=np.float64 if dt.itemsize > 4 else np.float32)
            mag *= 0.9
            mag += 0.1
            arr = np.where(rng.integers(0, 2, size=shape, dtype=np.int8) == 1, mag, -mag)
        elif dt.kind in "iu":
            sign = rng.choice(np.array([-1, 1]), size=shape)
            arr = sign * rng.integers(1, 5, size=shape)
        elif dt.kind == "b":
            arr = rng.integers(0, 2, size=shape)
        else:
            raise ValueError(f"argument {spec.name}: no random inputs for dtype {spec.dtype}")
        out.append(np.ascontiguousarray(arr.astype(dt)))
    return out


def _run_kernel(kernel, inputs, out_specs, variant: int) -> list:
    outs = [poisoned(s.shape, s.dtype, variant) for s in out_specs]
    kernel(*[a.copy() for a in inputs], *outs)
    return outs


def _check(cand, refs, inputs, out_specs, rtol, atol) -> tuple[str, float]:
    """('' when the candidate computes what the reference outputs `refs` hold, else why not;
    seconds its first checked call took)."""
    first_call = 0.0
    for variant in (0, 1):
        if variant == 1 and not any(same_as_poison(r, s.dtype, 0) for r, s in zip(refs, out_specs)):
            break  # no reference value equals the first poison: a missed element cannot hide
        ins = [a.copy() for a in inputs]
        outs = [poisoned(s.shape, s.dtype, variant) for s in out_specs]
        t0 = time.perf_counter()
        cand(*ins, *outs)
        first_call = first_call or time.perf_counter() - t0
        for spec, a, b in zip(cand.args, ins, inputs):
            if not np.array_equal(as_comparable(a), as_comparable(b), equal_nan=a.dtype.kind == "f"):
                return f"the kernel wrote to its input {spec.name}", first_call
        for spec, got, ref in zip(out_specs, outs, refs):
            msg = compare_output(spec.name, got, ref, rtol, atol)
            if msg:
                return msg, first_call
    return "", first_call


# (reference digest, seed, num_inputs) -> (kernel, inputs, outputs), the most recently used
# last, the oldest dropped beyond REFERENCE_CACHE_BYTES (the newest is always kept): a model's
# tuning moves between its tasks, and each return to one would draw its inputs and run its
# reference again
_REFERENCE_CACHE: OrderedDict = OrderedDict()
REFERENCE_CACHE_BYTES = 1 << 30


def _remember_reference(key, entry) -> None:
    _REFERENCE_CACHE[key] = entry
    _REFERENCE_CACHE.move_to_end(key)

    def size(e) -> int:
        return sum(a.nbytes for a in (*e[1], *e[2]))
    while len(_REFERENCE_CACHE) > 1 and sum(size(e) for e in _REFERENCE_CACHE.values()) > REFERENCE_CACHE_BYTES:
        _REFERENCE_CACHE.popitem(last=False)


def measure_one(request: MeasureRequest | dict, on_start=None) -> dict:
    """Check one kernel against its reference, then time it; in this process (see WorkerProcess).
    A window of one (`measure_window`)."""
    return measure_window([request], on_start)[0]


@dataclass
class _Loaded:
    """A request whose kernels are loaded and agree on their arguments: what the check needs."""

    request: MeasureRequest
    cand: object
    ref: object
    ref_key: tuple
    cached: tuple | None


@dataclass
class _Checked:
    """A request whose kernel computed the right answer: what the timing needs."""

    index: int
    cand: object
    ref_key: tuple
    inputs: list
    out_specs: list
    threads: int
    opts: MeasureOptions


def measure_window(requests: list, on_start=None, on_progress=None) -> list:
    """Check each kernel of a window against its reference, then time those that passed together,
    taking turns (compiler.runtime.measure_together); in this process. One answer
    dict per request, in order, each as measure_one's.

    Timed together, a window's kernels (a search batch; a re-timing's default and candidates)
    sample the same stretch of the host's time, so the host's drift between one timing and the
    next does not enter their ratios (see compiler.timing.time_together). Kernels of the same
    reference run on one set of input and output buffers, so the window's working set is one
    kernel's, as it is when each is timed alone. Everything that runs a kernel holds the host's
    exclusive timing lock (compiler.host_lock); `on_start()` is called once it is held, and
    `on_progress(i)` once the i-th request's check is over (whatever its outcome; a request that
    could not be loaded is over before the lock is taken), so a parent timing the window knows
    which kernel a hang or a crash belongs to (WorkerProcess.run_window)."""
    from compiler import host_lock

    t0 = time.perf_counter()
    spent = [0.0] * len(requests)
    answers: list = [None] * len(requests)

    def done(i, code, msg="", costs=None):
        return _result(code, msg, costs, spent[i])

    loaded: list = []
    for i, request in enumerate(requests):
        t = time.perf_counter()
        try:
            got = _load(MeasureRequest.from_dict(request) if isinstance(request, dict) else request)
        except Exception as e:  # noqa: BLE001 - the measuring side failed; say how, keep serving
            got = (RUNNER_ERROR, f"measuring failed: {type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}")
        spent[i] += time.perf_counter() - t
        if isinstance(got, _Loaded):
            loaded.append((i, got))
        else:
            answers[i] = done(i, *got)
    if loaded:
        with host_lock.exclusive():
            if on_start is not None:
                on_start()   # the run's clock starts now, not while waiting for the host
            checked = []
            loaded_at = {i for i, _ in loaded}
            for i in range(len(requests)):
                if i not in loaded_at and on_progress is not None:
                    on_progress(i)
            for i, item in loaded:
                t = time.perf_counter()
                try:
                    got = _check_one(i, item)
                except Exception as e:  # noqa: BLE001
                    got = (RUNNER_ERROR, f"measuring failed: {type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}")
                spent[i] += time.perf_counter() - t
                if isinstance(got, _Checked):
                    checked.append(got)
                elif isinstance(got, dict):        # far behind: its checked call is its figure
                    answers[i] = dict(done(i, NO_ERROR, "", got["costs"]), timing=got["timing"])
                else:
                    answers[i] = done(i, *got)
                if on_progress is not None:
                    on_progress(i)
            _time_checked(checked, answers, spent, done)
    for i, a in enumerate(answers):
        if a is None:   # cannot happen; a window never answers short
            answers[i] = _result(RUNNER_ERROR, "no answer was made for this request", run_seconds=time.perf_counter() - t0)
    return answers


def _load(request: MeasureRequest):
    """_Loaded, or (error code, message) for a request that cannot be checked."""
    from compiler.errors import CompilerError
    from compiler.runtime import check_runnable, load_kernel

    try:
        cand = load_kernel(request.kernel_bytes)
    except CompilerError as e:
        return RUNNER_ERROR, f"cannot load the candidate kernel: {e}"
    if request.reference_bytes is None:
        return RUNNER_ERROR, "no reference kernel to check the candidate against"
    ref_key = (hashlib.sha256(request.reference_bytes).digest(), request.options.seed, request.num_inputs)
    cached = _REFERENCE_CACHE.get(ref_key)
    if cached:
        _REFERENCE_CACHE.move_to_end(ref_key)
    try:
        ref = cached[0] if cached else load_kernel(request.reference_bytes)
    except CompilerError as e:
        return RUNNER_ERROR, f"cannot load the reference kernel: {e}"
    sig = [(tuple(a.shape), a.dtype) for a in cand.args]
    if sig != [(tuple(a.shape), a.dtype) for a in ref.args]:
        return RUNNER_ERROR, f"candidate and reference kernels take different arguments: {cand!r} vs {ref!r}"
    n_in = request.num_inputs
    if not 0 <= n_in < len(cand.args):
        return RUNNER_ERROR, (f"num_inputs={n_in} but the kernel has {len(cand.args)} arguments "
                              f"(at least one must be an output)")
    for what, kernel in (("candidate", cand), ("reference", ref)):
        try:   # the kernel's own header, whatever target the request named
            check_runnable(kernel.target)
        except CompilerError as e:
            return UNSUPPORTED_TARGET, f"this machine cannot run the {what} kernel: {e}"
    return _Loaded(request, cand, ref, ref_key, cached)


def _check_one(index: int, item: _Loaded):
    """The part of a measurement before its timing, under the host's exclusive lock: the reference
    result, the check. _Checked; or {"costs", "timing"} for a kernel whose checked call put it far
    behind the search's best (that call is its one sample: compiler.timing); or (error code, message)."""
    from compiler.errors import CompilerError, KernelRuntimeError
    from compiler.runtime import set_num_threads

    request, cand, ref = item.request, item.cand, item.ref
    n_in, opts = request.num_inputs, request.options
    threads = max(1, min(int(opts.num_threads or cand.target.num_cores), os.cpu_count() or 1))
    set_num_threads(threads)
    out_specs = cand.args[n_in:]
    try:
        cand.load()
        ref.load()
    except CompilerError as e:
        return RUNNER_ERROR, f"cannot load kernel: {e}"
    cached = item.cached if item.cached else _REFERENCE_CACHE.get(item.ref_key)
    if cached:
        _, inputs, refs = cached
    else:
        # every candidate of a task runs on the same seeded inputs, so the reference result
        # (often a slow naive kernel) is computed once per task, not once per candidate
        inputs = random_arrays(cand.args[:n_in], opts.seed)
        refs = _run_kernel(ref, inputs, out_specs, 0)
        _remember_reference(item.ref_key, (ref, inputs, refs))
    try:
        msg, first_call = _check(cand, refs, inputs, out_specs, opts.rtol, opts.atol)
    except KernelRuntimeError as e:
        return RUNTIME_ERROR, str(e)
    if msg:
        return WRONG_ANSWER, msg
    if opts.slow_cutoff_s and first_call > FAR_BEHIND * opts.slow_cutoff_s:
        return {"costs": [first_call], "timing": single_call_timing(first_call).to_dict()}
    return _Checked(index, cand, item.ref_key, inputs, list(out_specs), threads, opts)


def _time_checked(checked: list, answers: list, spent: list, done) -> None:
    """Time the checked kernels together (those of one thread count at a time), filling their
    answers; a kernel that fails while timed gets RUNTIME_ERROR and the others are timed again
    without it."""
    from compiler.buffers import aligned_copy
    from compiler.errors import KernelRuntimeError
    from compiler.runtime import measure_together, set_num_threads

    groups: dict = {}
    for c in checked:
        groups.setdefault(c.threads, []).append(c)
    for threads, group in groups.items():
        set_num_threads(threads)
        buffers: dict = {}     # ref_key -> the arrays its kernels run on, shared
        for c in group:
            if c.ref_key not in buffers:
                buffers[c.ref_key] = [aligned_copy(a.copy()) for a in c.inputs] + \
                    [aligned_copy(poisoned(s.shape, s.dtype, 0)) for s in c.out_specs]
        cooldown = max(c.opts.cooldown_ms for c in group)
        if cooldown > 0:
            time.sleep(cooldown / 1000.0)
        while group:
            try:
                timings = measure_together([(c.cand, buffers[c.ref_key]) for c in group],
                                           [c.opts.timing_options() for c in group], lock=False)
            except KernelRuntimeError as e:
                bad = group.pop(e.kernel_index if e.kernel_index is not None else 0)
                answers[bad.index] = done(bad.index, RUNTIME_ERROR, str(e))
                continue
            except Exception as e:  # noqa: BLE001 - the measuring side failed; say how, keep serving
                msg = f"measuring failed: {type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"
                for c in group:
                    answers[c.index] = done(c.index, RUNNER_ERROR, msg)
                break
            for c, timing in zip(group, timings):
                spent[c.index] += timing.seconds
                answers[c.index] = dict(done(c.index, NO_ERROR, "", kept_samples(timing)), timing=timing.to_dict())
            break


KEPT_SAMPLES = 32


def kept_samples(timing) -> list:
    """At most KEPT_SAMPLES of the samples a figure came from, spread over their sorted range
    (a record keeps the distribution's shape, not hundreds of numbers)."""
    values = sorted(timing.basis)
    if len(values) <= KEPT_SAMPLES:
        return [float(v) for v in values]
    step = (len(values) - 1) / (KEPT_SAMPLES - 1)
    return [float(values[round(i * step)]) for i in range(KEPT_SAMPLES)]


# ----------------------------------------------------------------------------- child process

_HEADER = struct.Struct("<Q")
_READY = {"ready": True}
_STARTED = {"started": True}   # the host lock is held: the run's timeout starts now
LOCK_WAIT_TIMEOUT_S = 900.0    # a host whose lock is held this long has a wedged tunefarm process


def _write_frame(fd: int, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes | None:
    """n bytes from fd; None at EOF; raises TimeoutError past the deadline (monotonic)."""
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                raise TimeoutError
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _read_frame(fd: int, deadline: float | None = None):
    head = _read_exact(fd, _HEADER.size, deadline)
    if head is None:
        return None
    (n,) = _HEADER.unpack(head)
    body = _read_exact(fd, n, deadline)
    if body is None:
        return None
    return pickle.loads(body)


def watch_parent(period: float = 1.0, parent: int | None = None) -> None:
    """Exit when the parent dies, even while a kernel spins forever (ctypes calls release the GIL).

    `parent`: the pid the parent had when it started this process. Give it when the parent may
    die before this runs (a process pool's initializer runs after the interpreter's start-up): the
    current parent would then already be init, and the watch would wait for nothing."""
    if parent is None:
        parent = os.getppid()
    elif os.getppid() != parent:
        os._exit(3)

    def watch():
        while True:
            time.sleep(period)
            if os.getppid() != parent:
                os._exit(3)
    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def serve(in_fd: int = 0, out_fd: int = 1) -> None:
    """Child main loop: read request dicts, answer measure_one dicts, until EOF on in_fd.

    The protocol's output fd is moved away from 1 first, so anything a kernel or library prints
    to stdout goes to stderr instead of corrupting the frames.
    """
    from compiler.timing import prepare_timing_process
    prepare_timing_process()  # thread binding, priority, OpenMP wait policy: before any thread or libgomp starts
    proto_out = os.dup(out_fd)
    os.dup2(2, out_fd)
    sys.stdout = sys.stderr
    watch_parent()
    from compiler.runtime import initialize  # pay imports and LLVM set-up before "ready"
    initialize()
    _write_frame(proto_out, _READY)
    while True:
        req = _read_frame(in_fd)
        if req is None:
            return
        serve_one = measure_one
        if isinstance(req, dict) and req.get("calibrate"):
            serve_one = calibration_answer
        elif isinstance(req, dict) and "window" in req:
            serve_one = window_answer
        start = lambda: _write_frame(proto_out, _STARTED)  # noqa: E731
        if serve_one is window_answer:
            answer = window_answer(req, on_start=start, on_progress=lambda i: _write_frame(proto_out, {"progress": i}))
        else:
            answer = serve_one(req, on_start=start)
        _write_frame(proto_out, answer)


def window_answer(request: dict, on_start=None, on_progress=None) -> dict:
    """The answer to a window request ({"window": [request dict, ...]}): {"window": [measure_one's
    answer dict, ...]} (measure_window), or RUNNER_ERROR with the reason."""
    try:
        return dict(_result(NO_ERROR), window=measure_window(list(request["window"]), on_start, on_progress))
    except Exception as e:  # noqa: BLE001 - the measuring side failed; say how, keep serving
        return _result(RUNNER_ERROR, f"measuring the window failed: {type(e).__name__}: {e}")


def calibration_answer(request: dict, on_start=None) -> dict:
    """The answer to a calibration request ({"calibrate": True, "threads": n or None}): this
    process's calibration (device_agent.calibration) under the host's exclusive lock, as
    {"calibration": {...}, "error_code": 0, ...}; RUNNER_ERROR with the reason when it fails."""
    from compiler import host_lock

    from .calibration import calibrate, calibration_kernels
    t0 = time.perf_counter()
    try:
        calibration_kernels()       # built before the host is taken: a build holds no timing lock
        with host_lock.exclusive():
            if on_start is not None:
                on_start()
            cal = calibrate(request.get("threads"), lock=False)
    except Exception as e:  # noqa: BLE001 - the calibration failed; say how, keep serving
        return _result(RUNNER_ERROR, f"calibration failed: {type(e).__name__}: {e}", run_seconds=time.perf_counter() - t0)
    return dict(_result(NO_ERROR, run_seconds=time.perf_counter() - t0), calibration=cal)


def signal_name(returncode: int) -> str:
    """How a child process ended, for people: 'SIGSEGV', 'signal 77' or 'exit code 3'."""
    if returncode is not None and returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


class WorkerProcess:
    """One measuring child process, replaced transparently when a kernel kills or hangs it.

    `run(request, timeout)` sends one request and waits at most `timeout` seconds for the answer
    (the child's start-up is not counted). Requests are served one at a time.
    """

    def __init__(self, startup_timeout: float = 60.0, python: str | None = None):
        self.startup_timeout = startup_timeout
        self.python = python or sys.executable
        self._proc: subprocess.Popen | None = None
        self._stderr_tail: deque = deque(maxlen=40)
        self._stderr_thread = None
        self._ready = False
        self._lock = threading.Lock()
        self.restarts = 0  # how many children were replaced (crash or timeout)

    # -------------------------------------------------------------- child lifecycle
    def _start(self):
        root = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("PYTHONUNBUFFERED", "1")
        tail = deque(maxlen=40)
        self._stderr_tail = tail
        self._proc = subprocess.Popen([self.python, "-m", "device_agent.worker"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=root,
                                      close_fds=True, start_new_session=True)
        self._ready = False
        stream = self._proc.stderr

        def drain():  # keep the child's last stderr lines (LLVM errors, Python tracebacks)
            for line in iter(stream.readline, b""):
                tail.append(line.decode(errors="replace").rstrip())
        self._stderr_thread = threading.Thread(target=drain, daemon=True, name="measure-worker-stderr")
        self._stderr_thread.start()

    def _stderr_text(self, lines: int = 5) -> str:
        if self._stderr_thread is not None:
            self._stderr_thread.join(timeout=0.5)
        tail = [t for t in list(self._stderr_tail) if t.strip()]
        return " | ".join(tail[-lines:])

    def _kill(self):
        proc, self._proc = self._proc, None
        self._ready = False
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the child and any process it started
            except (ProcessLookupError, PermissionError):
                proc.kill()
        for f in (proc.stdin, proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()

    def _ensure_ready(self):
        if self._proc is None:
            self._start()
        if self._ready:
            return
        try:
            msg = _read_frame(self._proc.stdout.fileno(), time.monotonic() + self.startup_timeout)
        except TimeoutError:
            msg = None
        if msg != _READY:
            proc = self._proc
            rc = proc.poll()
            err = self._stderr_text()
            self._kill()
            raise RuntimeError(f"the measuring worker did not start ({signal_name(rc) if rc is not None else 'no answer'})"
                               + (f": {err}" if err else ""))
        self._ready = True

    def start(self) -> "WorkerProcess":
        """Start the child now (otherwise the first run does)."""
        with self._lock:
            self._ensure_ready()
        return self

    @property
    def pid(self) -> int | None:
        """The current child's process id (None before it starts)."""
        proc = self._proc
        return proc.pid if proc is not None else None

    def replace(self) -> "WorkerProcess":
        """Kill the child and start a new one (a calibration found it slow): a new process, which
        the OS places anew and whose OpenMP team is bound afresh."""
        with self._lock:
            self._kill()
            self.restarts += 1
            self._start()
            self._ensure_ready()
        return self

    # -------------------------------------------------------------- requests
    def run(self, request: MeasureRequest | dict, timeout: float, stages: list | None = None) -> dict:
        """Measure one request in the child; never raises for a kernel's misbehaviour. `stages`:
        for a window request, each of its requests' timeouts: each kernel's check then runs under
        its own timeout, the timing of them all under their sum (`timeout` is not used), and an
        answer of a crash or a timeout names the request at fault (`window_stage`; None: the timing)."""
        payload = request.to_dict() if isinstance(request, MeasureRequest) else dict(request)
        with self._lock:
            self._stage, self._limit = None, timeout
            try:
                self._ensure_ready()
            except RuntimeError as e:
                return _result(RUNNER_ERROR, str(e))
            proc = self._proc
            t0 = time.monotonic()
            started = False
            try:
                _write_frame(proc.stdin.fileno(), payload)
                # the child first waits for the host's timing lock (other tunefarm processes'
                # timings and builds): that wait is not the kernel's, so the run's timeout
                # starts when the child says it holds the lock
                answer = _read_frame(proc.stdout.fileno(), t0 + LOCK_WAIT_TIMEOUT_S)
                if answer == _STARTED:
                    started = True
                    t0 = time.monotonic()
                    answer = self._read_answer(proc.stdout.fileno(), timeout, stages)
            except TimeoutError:
                self._kill()
                self.restarts += 1
                self._start()  # the replacement warms up while the caller does other work
                if not started:
                    return _result(RUNNER_ERROR, f"the host's timing lock was not free within {LOCK_WAIT_TIMEOUT_S:g} s "
                                                 f"(another tunefarm process holds it; worker restarted)",
                                   run_seconds=time.monotonic() - t0)
                return self._at_fault(_result(RUN_TIMEOUT, f"the kernel did not finish within {self._limit:g} s "
                                                           f"(worker killed)", run_seconds=time.monotonic() - t0), stages)
            except (BrokenPipeError, ConnectionResetError, OSError):
                answer = None
            if answer is None:  # the child died: a crashing kernel
                try:
                    rc = proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    rc = None
                err = self._stderr_text()
                self._kill()
                self.restarts += 1
                self._start()
                what = signal_name(rc) if rc is not None else "unknown cause"
                return self._at_fault(_result(RUNTIME_ERROR, f"the kernel crashed the worker ({what})"
                                                             + (f": {err}" if err else ""),
                                              run_seconds=time.monotonic() - t0), stages)
            return answer

    def _read_answer(self, fd: int, timeout: float, stages: list | None):
        """The child's answer frame. For a window (`stages`), past its progress frames: the
        kernel being checked (the first whose check is not over) has its own timeout, the timing
        of them all their sum; `_stage` and `_limit` say which stage ran and under what."""
        if not stages:
            return _read_frame(fd, time.monotonic() + timeout)
        over: set = set()
        while True:
            pending = [i for i in range(len(stages)) if i not in over]
            self._stage = pending[0] if pending else None
            self._limit = stages[pending[0]] if pending else sum(stages)
            frame = _read_frame(fd, time.monotonic() + self._limit)
            if isinstance(frame, dict) and set(frame) == {"progress"}:
                over.add(int(frame["progress"]))
                continue
            return frame

    def _at_fault(self, answer: dict, stages: list | None) -> dict:
        """A crash's or a timeout's answer, naming the window's request at fault where known."""
        if stages:
            answer["window_stage"] = self._stage
        return answer

    def run_window(self, items: list, interleave: bool = True) -> list:
        """Answers (measure_one's dicts) of [(request, timeout), ...]: measured as one window, its
        kernels timed together (measure_window), when `interleave` and there are several; else
        one request at a time. Each kernel's check runs under its own timeout (the child says when
        each is over), so a kernel that crashes or hangs the child there is answered with that,
        and the others are measured again together; one that does so while they are timed (or a
        child of an older version that did not understand) has the window measured again one
        request at a time, so the kernel at fault, and only it, is answered with it."""
        if not interleave or len(items) < 2:
            return [self.run(req, timeout) for req, timeout in items]
        payload = {"window": [req.to_dict() if isinstance(req, MeasureRequest) else dict(req) for req, _ in items]}
        stages = [float(timeout) for _, timeout in items]
        answer = self.run(payload, sum(stages), stages=stages)
        got = answer.get("window")
        if isinstance(got, list) and len(got) == len(items):
            return got
        stage = answer.pop("window_stage", None)
        if stage is None:      # in the timing, or a child that did not understand: one by one
            return [self.run(req, timeout) for req, timeout in items]
        out: list = [None] * len(items)
        out[stage] = answer    # its check crashed or hung the child: the others, again together
        rest = [j for j in range(len(items)) if j != stage]
        for j, a in zip(rest, self.run_window([items[j] for j in rest], interleave)):
            out[j] = a
        return out

    def close(self):
        with self._lock:
            proc = self._proc
            if proc is not None and proc.poll() is None:
                try:
                    proc.stdin.close()  # EOF: the child exits its loop
                    proc.wait(timeout=2)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            self._kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if self._proc is not None:
                self._kill()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


if __name__ == "__main__":
    from device_agent.worker import serve as _serve  # the package module, not this __main__ copy
    _serve()
