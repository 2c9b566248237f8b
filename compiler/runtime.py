"""Build, load, call and time native kernels; serialize them to cross processes and machines.

A built kernel is an object file plus its argument spec and target string. In the process that
built it, or any process that receives its bytes (`Kernel.to_bytes` / `load_kernel`), the object
is loaded with LLVM's MCJIT and called through ctypes after every argument is checked, so a
shape or dtype mismatch, an output that overlaps another argument or a read-only output raises
ArgumentError instead of corrupting memory. A kernel is safe to call from several threads.
A kernel whose scratch memory cannot be allocated, or that meets a data-dependent index outside
its range (compiler/index_checks.py), raises KernelRuntimeError; after an index error the
outputs hold whatever the kernel had written before it stopped, and must not be used.

Parallel loops run on libgomp; in a process forked after parallel kernels ran they run on one
thread (see compiler/openmp.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
import weakref
from dataclasses import dataclass

import numpy as np

from . import host_lock, kernel_format
from .buffers import aligned_copy
from .codegen_llvm import KERNEL_INDEX_OUT_OF_RANGE, KERNEL_OK, KERNEL_OUT_OF_MEMORY, RELEASE_SUFFIX, ModuleBuilder
from .errors import ArgumentError, KernelLoadError, KernelRuntimeError
from .index_checks import RECORD_WORDS, IndexCheck, failed_check
from .kernel_format import MAGIC, check_runnable
from .lower import lower
from .openmp import before_parallel_call, get_max_threads, runtime_libraries, set_num_threads
from .schedule import Schedule
from .target import Target, llvm_binding, resolve_target
from .timing import Timing, TimingOptions, time_samples, time_together

_STATUS_MESSAGES = {
    KERNEL_OUT_OF_MEMORY: "could not allocate its scratch buffers (out of memory)",
    KERNEL_INDEX_OUT_OF_RANGE: "an index read from data is out of range",
}
ErrorRecord = ctypes.c_int64 * RECORD_WORDS

# Names the generated code or its C runtime use: a kernel with one of them would call itself
# instead (the JIT) or take the library function's place (an exported library).
RESERVED_SYMBOLS = frozenset("""
aligned_alloc malloc calloc realloc free memcpy memmove memset abort exit
exp expf log logf sqrt sqrtf tanh tanhf erf erff pow powf fabs fabsf floor floorf ceil ceilf
fmin fminf fmax fmaxf
""".split())


def check_kernel_name(name) -> str:
    """The kernel's symbol name, or ArgumentError when it cannot be one."""
    if not isinstance(name, str) or not name.isidentifier() or not name.isascii():
        raise ArgumentError(f"kernel name must be a C identifier, got {name!r}")
    if name in RESERVED_SYMBOLS or name.startswith(("GOMP_", "omp_", "__", "llvm")):
        raise ArgumentError(f"kernel name {name!r} is reserved for the C runtime the kernels use; "
                            "choose another name")
    return name


@dataclass(frozen=True)
class ArgSpec:
    """One kernel argument: name, shape, dtype, and whether the kernel writes it (an output).

    `written` defaults to True, the cautious choice for specs built by hand: a written argument
    must be writable and must not overlap any other argument."""

    name: str
    shape: tuple
    dtype: str
    written: bool = True

    def to_json(self):
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "written": self.written}

    @staticmethod
    def from_json(d: dict) -> "ArgSpec":
        return ArgSpec(d["name"], tuple(d["shape"]), d["dtype"], bool(d.get("written", True)))


def initialize() -> None:
    """Set up LLVM and load libgomp now instead of on the first build or call (a measuring
    worker pays this before it reports ready)."""
    llvm_binding()
    runtime_libraries()


_compiling = threading.local()   # a compiling thread's own LLVM context and target machines


def _thread_llvm(target: Target) -> tuple:
    """(LLVM context, target machine) of the calling thread: LLVM objects are not shared across
    threads, so kernels compile on several threads at once (compiler.graph builds a model's
    kernels on a thread of their own while it lowers the next ones)."""
    llvm = llvm_binding()
    if not hasattr(_compiling, "context"):
        _compiling.context = llvm.create_context()
        _compiling.machines = {}
    tm = _compiling.machines.get(str(target))
    if tm is None:
        tm = _compiling.machines[str(target)] = target.new_target_machine()
    return _compiling.context, tm


def compile_module(module, target: Target, opt_level: int = 3) -> bytes:
    """LLVM IR module (or its text) → optimized native object file bytes for `target`; callable
    from any thread."""
    llvm = llvm_binding()
    context, tm = _thread_llvm(target)
    mod = llvm.parse_assembly(module if isinstance(module, str) else str(module), context)
    mod.triple = target.triple
    mod.data_layout = str(tm.target_data)
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=opt_level)
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return tm.emit_object(mod)


def _release_scratch(release, engine) -> None:
    """Free a collected kernel's kept scratch buffers, before its engine (held here until then)
    unloads the code."""
    release()
    del engine


class Kernel:
    """A compiled kernel: call it with numpy arrays in the order of `args`."""

    def __init__(self, name: str, object_code: bytes, args: list, target: Target, source: str = "",
                 checks: list | None = None):
        self.name = name
        self.object_code = object_code
        self.args = [a if isinstance(a, ArgSpec) else ArgSpec.from_json(a) for a in args]
        self.target = target
        self.source = source  # the lowered loop IR, for people
        # the run-time index checks, numbered as the kernel reports them (compiler/index_checks.py)
        self.checks = [c if isinstance(c, IndexCheck) else IndexCheck.from_json(c) for c in checks or ()]
        self.parallel = b"GOMP_parallel" in object_code
        self._fn = None
        self._engine = None
        self._load_lock = threading.Lock()
        self._records = threading.local()   # each calling thread's error record

    # ------------------------------------------------------------------ loading
    def load(self) -> None:
        """Load the object code now (it is loaded on the first call otherwise); KernelLoadError
        when this machine cannot run it."""
        self._load()

    def _load(self):
        fn = self._fn
        if fn is not None:
            return fn
        with self._load_lock:  # one engine per kernel, whichever thread calls first
            if self._fn is None:
                self._engine, self._fn = self._new_engine()
            return self._fn

    def _new_engine(self):
        check_runnable(self.target)
        kernel_format.check_object(self.object_code, self.target)
        runtime_libraries()
        llvm = llvm_binding()
        try:
            empty = llvm.parse_assembly("")
            empty.triple = self.target.triple
            engine = llvm.create_mcjit_compiler(empty, Target.host().new_target_machine())
            engine.add_object_file(llvm.ObjectFileRef.from_data(self.object_code))
            engine.finalize_object()
            addr = engine.get_function_address(self.name)
        except RuntimeError as e:
            raise KernelLoadError(f"cannot load kernel {self.name}: {e}") from None
        if not addr:
            raise KernelLoadError(f"kernel object has no function named {self.name!r}")
        release = engine.get_function_address(self.name + RELEASE_SUFFIX)
        if release:   # the scratch buffers the kernel keeps between calls, freed with it
            weakref.finalize(self, _release_scratch, ctypes.CFUNCTYPE(None)(release), engine)
        return engine, ctypes.CFUNCTYPE(ctypes.c_int32, *([ctypes.c_void_p] * (len(self.args) + 1)))(addr)

    # ------------------------------------------------------------------ calling
    def check_args(self, arrays) -> list:
        """Pointers to the arrays, after checking them against the spec (ArgumentError)."""
        if len(arrays) != len(self.args):
            raise ArgumentError(f"kernel {self.name} takes {len(self.args)} arrays "
                                f"({', '.join(a.name for a in self.args)}), got {len(arrays)}")
        for spec, arr in zip(self.args, arrays):
            if not isinstance(arr, np.ndarray):
                raise ArgumentError(f"argument {spec.name} must be a numpy array, got {type(arr).__name__}")
            if arr.dtype != np.dtype(spec.dtype):
                raise ArgumentError(f"argument {spec.name}: expected dtype {spec.dtype}, got {arr.dtype}")
            if tuple(arr.shape) != tuple(spec.shape):
                raise ArgumentError(f"argument {spec.name}: expected shape {tuple(spec.shape)}, got {tuple(arr.shape)}")
            if not arr.flags.c_contiguous:
                raise ArgumentError(f"argument {spec.name} must be C-contiguous (use np.ascontiguousarray)")
            if spec.written and not arr.flags.writeable:
                raise ArgumentError(f"argument {spec.name} is read-only, but the kernel writes it")
        self._check_overlaps(arrays)
        return [arr.ctypes.data for arr in arrays]

    def error_record(self):
        """This thread's error record (a ctypes int64 array), passed as the kernel's last argument."""
        record = getattr(self._records, "record", None)
        if record is None:
            record = self._records.record = ErrorRecord()
        return record

    def _check_overlaps(self, arrays):
        """Arguments are `noalias` in the generated code: an output sharing memory with another
        argument would be read after it was partly overwritten."""
        for i, (spec, arr) in enumerate(zip(self.args, arrays)):
            if not spec.written:
                continue
            for j, (other_spec, other) in enumerate(zip(self.args, arrays)):
                if j != i and (j > i or not other_spec.written) and np.may_share_memory(arr, other):
                    raise ArgumentError(f"argument {spec.name} (written by the kernel) overlaps argument "
                                        f"{other_spec.name}; pass separate arrays (e.g. a copy)")

    def __call__(self, *arrays):
        ptrs = self.check_args(arrays)
        self._run(self._load(), ptrs)

    def _run(self, fn, ptrs):
        if self.parallel:
            before_parallel_call()
        record = self.error_record()
        status = fn(*ptrs, record)
        if status != KERNEL_OK:
            raise self.failure(status, record)

    def failure(self, status: int, record, where: str = "") -> KernelRuntimeError:
        """The KernelRuntimeError of a call that returned `status` with error record `record`:
        for an index error it names the check's site, the value and the valid range, and carries
        them as `check` and `value` (a model's runtime names the node from them)."""
        check, value = failed_check(self.checks, record) if status & KERNEL_INDEX_OUT_OF_RANGE else (None, None)
        reason = self.status_message(status) if check is None else check.message(value)
        return KernelRuntimeError(f"kernel {self.name}{where} failed: {reason}", status, check=check, value=value)

    @staticmethod
    def status_message(status: int) -> str:
        """What a kernel's non-zero return status means (a bit set of failures)."""
        known = [text for bit, text in _STATUS_MESSAGES.items() if status & bit]
        return "; ".join(known) if known and status & ~sum(_STATUS_MESSAGES) == 0 else f"status {status}"

    def measure(self, *arrays, options: TimingOptions | None = None, lock: bool = True) -> Timing:
        """Time the kernel by tunefarm's measurement protocol (compiler/timing.py): one warm-up
        call, then samples until the median is stable, each sample checked for time lost to
        other processes, retried and flagged when the host is busy. `lock`: hold the host's
        exclusive timing lock (compiler/host_lock.py), so no other tunefarm build or timing runs
        on these cores meanwhile. The kernel runs on 64-byte-aligned buffers (copies of the
        arrays that are not; outputs are copied back): a kernel's speed depends on where its
        buffers start (compiler/buffers.py), and a timing must not depend on where numpy happened
        to put the caller's. Returns a Timing (seconds per call)."""
        run_batch, timed = self.batch_runner(arrays)
        with host_lock.exclusive() if lock else contextlib.nullcontext():
            run_batch(1)                  # the warm-up call runs on the held host too
            timing = time_samples(run_batch, options)
        self._copy_back(arrays, timed)
        return timing

    def batch_runner(self, arrays) -> tuple:
        """(run_batch, the arrays it runs on): `run_batch(n)` calls the kernel n times back to back
        on 64-byte-aligned copies of `arrays` where they are not aligned (see `measure`; keep the
        second value alive while calling it, outputs land there), then raises KernelRuntimeError
        if any call failed. What every timer of a kernel loops over: the protocol, the TVM-style
        evaluator, a measuring worker's calibration."""
        timed, ptrs = self._aligned_args(arrays)
        ptrs = [*ptrs, self.error_record()]
        fn = self._load()
        if self.parallel:
            before_parallel_call()    # a forked child's rule (compiler/openmp.py), as every call takes it

        def run_batch(n: int) -> None:
            failed = 0
            for _ in range(n):
                failed |= fn(*ptrs)
            if failed:
                self._run(fn, ptrs[:-1])  # raises KernelRuntimeError with the reason
        return run_batch, timed

    def _aligned_args(self, arrays) -> tuple:
        """(the arrays a timing runs on, their pointers): the caller's arrays, checked, with
        those that do not start on a cache line replaced by aligned copies."""
        self.check_args(arrays)
        timed = [aligned_copy(a) for a in arrays]
        return timed, [a.ctypes.data for a in timed]

    def _copy_back(self, arrays, timed) -> None:
        """Write the outputs computed in aligned copies back into the caller's arrays."""
        for spec, arr, used in zip(self.args, arrays, timed):
            if spec.written and used is not arr:
                np.copyto(arr, used)

    def time_evaluator(self, number: int = 1, repeat: int = 3, min_repeat_ms: float = 0.0,
                       cooldown_ms: float = 0.0):
        """A function timing the kernel like TVM's: `repeat` measurements, each the mean of `number` calls.

        This is the plain TVM-style timer, kept for people used to it; tunefarm's own timings use
        `measure` (the protocol that notices and survives a busy host).

        `number` grows until one measurement takes at least `min_repeat_ms`. One warm-up call
        runs first. Returns TimingResult with per-repeat seconds.
        """
        if number < 1 or repeat < 1:
            raise ValueError("number and repeat must be at least 1")

        def evaluator(*arrays):
            run_batch, timed = self.batch_runner(arrays)   # as in `measure`
            run_batch(1)
            n = number
            results = []
            for _ in range(repeat):
                while True:
                    t0 = time.perf_counter()
                    run_batch(n)
                    dt = time.perf_counter() - t0
                    if dt * 1000.0 >= min_repeat_ms or min_repeat_ms <= 0:
                        break
                    n = max(n * 2, int(n * min_repeat_ms / max(dt * 1000.0, 1e-3) * 1.2))
                results.append(dt / n)
                if cooldown_ms > 0:
                    time.sleep(cooldown_ms / 1000.0)
            self._copy_back(arrays, timed)
            return TimingResult(results)
        return evaluator

    # ------------------------------------------------------------------ serialization
    def to_bytes(self) -> bytes:
        """Everything needed to call the kernel in another process (see compiler/kernel_format.py)."""
        header = {"name": self.name, "target": str(self.target), "args": [a.to_json() for a in self.args],
                  "checks": [c.to_json() for c in self.checks], "source": self.source}
        return kernel_format.encode(header, self.object_code)

    def __repr__(self):
        sig = ", ".join(f"{a.name}: {a.dtype}{list(a.shape)}" for a in self.args)
        return f"Kernel({self.name}({sig}) for {self.target.cpu})"


def measure_together(runs: list, options: list | TimingOptions | None = None, lock: bool = True) -> list:
    """Time several kernels by the measurement protocol, taking turns
    (compiler.timing.time_together): `runs` is [(kernel, arrays), ...] (kernels may share
    arrays: each runs on the buffers it is given), `options` one TimingOptions for all or one per
    kernel. One warm-up call each, then one Timing per kernel, as `Kernel.measure` would give it
    alone, but every kernel sampled over the same stretch of the host's time, so their ratios do
    not carry the host's drift between one timing and the next. Outputs are copied back as in
    `measure`. A kernel that fails raises KernelRuntimeError (`.kernel_index` says which)."""
    opts = list(options) if isinstance(options, (list, tuple)) else [options] * len(runs)
    batches, kept = [], []
    for i, (kernel, arrays) in enumerate(runs):
        run_batch, timed = kernel.batch_runner(arrays)
        batches.append(_naming_failures(run_batch, i))
        kept.append((kernel, arrays, timed))
    with host_lock.exclusive() if lock else contextlib.nullcontext():
        for run_batch in batches:
            run_batch(1)
        timings = time_together(batches, opts)
    for kernel, arrays, timed in kept:
        kernel._copy_back(arrays, timed)
    return timings


def _naming_failures(run_batch, index: int):
    """`run_batch`, with the index of its kernel set on the KernelRuntimeError it raises."""
    def run(n: int) -> None:
        try:
            run_batch(n)
        except KernelRuntimeError as e:
            e.kernel_index = index
            raise
    return run


@dataclass
class TimingResult:
    results: list

    @property
    def mean(self) -> float:
        return float(np.mean(self.results))

    @property
    def median(self) -> float:
        return float(np.median(self.results))

    @property
    def min(self) -> float:
        return float(np.min(self.results))


def load_kernel(data: bytes) -> Kernel:
    """Inverse of Kernel.to_bytes; raises KernelLoadError on anything malformed or altered.

    A kernel for another machine loads fine (to be passed on); calling it raises KernelLoadError."""
    header, obj = kernel_format.decode(data)
    target = Target.from_string(header["target"])
    kernel_format.check_object(obj, target)
    args = [ArgSpec.from_json(a) for a in header["args"]]
    return Kernel(header["name"], obj, args, target, header.get("source", ""), header.get("checks", []))


@dataclass
class LoweredKernel:
    """A kernel up to its LLVM IR text: what `build` does in Python, before LLVM compiles it
    (`compile_lowered`, which may run on another thread)."""

    name: str
    ir_text: str
    args: list       # ArgSpec
    target: Target
    source: str      # the lowered loop IR
    checks: list

    def compile(self) -> Kernel:
        return Kernel(self.name, compile_module(self.ir_text, self.target), self.args, self.target, self.source,
                      self.checks)


def lower_kernel(schedule: Schedule, args, target=None, name: str = "main", *, index_checks: bool = True,
                 teams: bool = True) -> LoweredKernel:
    """Lower `schedule` and generate its LLVM IR (build's first half)."""
    target = resolve_target(target)
    check_kernel_name(name)
    func = lower(schedule, args, name)
    mb = ModuleBuilder(func, target, index_checks, teams=teams)
    ir_text = str(mb.build())
    outputs = set(schedule.outputs)
    specs = [ArgSpec(b.name, b.shape, b.dtype, t in outputs) for b, t in zip(func.args, args)]
    return LoweredKernel(name, ir_text, specs, target, str(func), mb.checks)


def build(schedule: Schedule, args, target=None, name: str = "main", *, index_checks: bool = True,
          teams: bool = True) -> Kernel:
    """Lower, generate LLVM IR, compile to an object for `target` (host by default) and wrap it.

    `index_checks=False` clamps data-dependent indices instead of checking them; it exists only
    so bench/index_checks.py can measure what the checks cost in one process. Nothing else
    passes it: a kernel that clamps returns a wrong row for a bad index. `teams=False` forks
    and joins a team for every parallel loop instead of once for consecutive ones
    (compiler/parallel_teams.py); likewise only for bench/parallel_teams.py, which measures what
    one team saves."""
    return lower_kernel(schedule, args, target, name, index_checks=index_checks, teams=teams).compile()


__all__ = ["ArgSpec", "Kernel", "Timing", "TimingOptions", "TimingResult", "build", "load_kernel", "compile_module",
           "lower_kernel", "LoweredKernel", "check_runnable",
           "check_kernel_name", "initialize", "set_num_threads", "get_max_threads", "MAGIC"]
