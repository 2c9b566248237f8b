"""Build candidates into kernels in parallel worker processes, with a timeout per build.

`BuilderPool.build(task, candidates)` turns each candidate into a `BuildResult`: the kernel's
bytes (`Kernel.to_bytes`, what a runner or an agent loads), or an error code and message. The
reference kernel a runner checks candidates against (the naive schedule of the workload, built
for the same target) is built once per task and cached by the pool.

Builds run in a `ProcessPoolExecutor` with the "spawn" context (forking a process that has
initialised LLVM is unsafe). At most `n_workers` builds are in flight, so a build starts when it
is submitted and its deadline is submission + `timeout`, not counting the time a timing holds
the host (builds wait for it: compiler.host_lock). A build past its deadline is recorded as
BUILD_TIMEOUT; the pool's processes are killed (a running future cannot be cancelled) and a fresh
pool takes the other in-flight builds again, uncharged. A build process that dies (LLVM aborts
on some inputs) breaks the pool: the builds that were in flight are retried one at a time, and
the one that kills its process again is a COMPILE_ERROR.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field

from compiler import host_lock

from ..candidate import Candidate, ErrorCode
from ..workload import Task, Workload

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildOutcome:
    """What a build process sends back (pickled across the process boundary): the kernel and its
    argument specs, or the error code and message of why there is none; the pool pairs it with
    the task's reference into a BuildResult."""

    kernel_bytes: bytes | None
    args: list                 # arg specs as dicts {"name", "shape", "dtype"}
    num_inputs: int
    error_code: int            # an ErrorCode's value
    error_msg: str
    build_seconds: float


@dataclass
class BuildResult:
    """One built candidate: kernel bytes, or why there are none."""

    kernel_bytes: bytes | None
    reference_bytes: bytes | None = None   # naive-schedule kernel of the workload (shared per task)
    args: list = field(default_factory=list)  # arg specs as dicts {"name", "shape", "dtype"}
    num_inputs: int = 0                    # args[:num_inputs] are inputs, the rest outputs
    error_code: ErrorCode = ErrorCode.NO_ERROR
    error_msg: str = ""
    build_seconds: float = 0.0
    candidate: Candidate | None = None
    reference_error: str = ""              # why reference_bytes is None

    @property
    def ok(self) -> bool:
        return self.error_code == ErrorCode.NO_ERROR and self.kernel_bytes is not None


# ----------------------------------------------------------------------------- in the build process

BUILD_NICENESS = 5


def _build_process_init(parent: int, user_initializer) -> None:
    """Every build process exits when its parent dies (a SIGKILLed job worker must not leave its
    build processes behind: they hold the pool's queue ends, so they would never see EOF), runs
    at a lower priority, then runs the pool's initializer.

    Builds are batch work that fills every core in bursts; the process timing kernels and the
    API server beside an embedded worker are not. At nice BUILD_NICENESS a build yields the CPU
    to them when both want it (bench/service_load.py: read p99 under load) and still gets all
    of an idle core."""
    from device_agent.worker import watch_parent
    watch_parent(parent=parent)
    os.nice(BUILD_NICENESS)
    if user_initializer is not None:
        user_initializer()


def _warm_up() -> int:
    """Import and initialise what every build needs, so the first build's time is its own."""
    import compiler.runtime  # noqa: F401
    from compiler.target import Target
    from tuner.space import instantiate  # noqa: F401
    Target.host().target_machine()
    return os.getpid()


def _error_code(e: BaseException) -> ErrorCode:
    from compiler.errors import CompilerError, LoweringError, ScheduleError

    from ..space import SpaceError
    from ..workload import WorkloadError
    if isinstance(e, (SpaceError, ScheduleError, LoweringError, WorkloadError)):
        return ErrorCode.INSTANTIATION_ERROR
    if isinstance(e, CompilerError):
        return ErrorCode.COMPILE_ERROR
    return ErrorCode.COMPILE_ERROR  # LLVM verifier errors and anything unexpected while compiling


def _build_job(workload: Workload, target: str, cand_json: dict | None, custom_ctor=None) -> BuildOutcome:
    """Build one candidate (or, with cand_json None, the naive reference) in a build process,
    holding the host's shared lock: a build never runs while a kernel is timed on this host
    (compiler.host_lock), and its time is counted from when the host was free."""
    with host_lock.shared():
        return _build_now(workload, target, cand_json, custom_ctor)


def _build_now(workload: Workload, target: str, cand_json: dict | None, custom_ctor=None) -> BuildOutcome:
    t0 = time.perf_counter()
    try:
        from compiler.runtime import build
        from compiler.schedule import create_schedule

        from .. import workload as workload_mod
        from ..space import instantiate
        if custom_ctor is not None:
            workload_mod.adopt_custom_constructor(workload.name, custom_ctor)
        try:
            opdef = workload.opdef()
            if cand_json is None:
                sched, args = create_schedule(opdef.output), opdef.tensors
            else:
                sched, args = instantiate(opdef, Candidate.from_json(cand_json), target)
        except Exception as e:  # noqa: BLE001 - whatever stops instantiation is the candidate's
            return _failure(ErrorCode.INSTANTIATION_ERROR, f"{type(e).__name__}: {e}", time.perf_counter() - t0)
        kernel = build(sched, args, target, name="main" if cand_json is not None else "reference")
        return BuildOutcome(kernel.to_bytes(), [a.to_json() for a in kernel.args], len(opdef.inputs),
                            int(ErrorCode.NO_ERROR), "", time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - every failure becomes a record, the tuning goes on
        return _failure(_error_code(e), f"{type(e).__name__}: {e}", time.perf_counter() - t0)


# ----------------------------------------------------------------------------- the pool

LOCK_PROBE_SECONDS = 1.0  # how often the pool checks whether its builds wait for a timing


@dataclass
class _Job:
    key: object            # "ref" or the candidate's index
    args: tuple
    isolate: bool = False  # run alone (it was in flight when a build process died)


class BuilderPool:
    """Parallel builds with a timeout; `build(task, candidates) -> list[BuildResult]` in order.

    `initializer` (a picklable, importable function) runs in every build process: the place to
    register space kinds or workloads a process started with "spawn" would not know. Workloads
    registered with `register_workload` whose constructor is importable are sent along anyway;
    a workload defined as a compute DAG (`Workload.from_compute`) carries its JSON definition
    and needs neither.
    """

    def __init__(self, n_workers: int | None = None, timeout: float = 20.0, initializer=None,
                 start_method: str = "spawn"):
        self.n_workers = max(1, int(n_workers or os.cpu_count() or 1))
        if timeout <= 0:
            raise ValueError(f"build timeout must be positive, got {timeout!r}")
        self.timeout = float(timeout)
        self.initializer = initializer
        if start_method not in ("spawn", "forkserver"):
            raise ValueError(f"start method must be 'spawn' or 'forkserver', not {start_method!r} "
                             f"(forking a process that has initialised LLVM is unsafe)")
        self._ctx = multiprocessing.get_context(start_method)
        self._pool: ProcessPoolExecutor | None = None
        self._references: dict = {}  # (workload, target) -> (bytes | None, error message)
        self.pools_replaced = 0

    # -------------------------------------------------------------- pool lifecycle
    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            pool = ProcessPoolExecutor(self.n_workers, mp_context=self._ctx, initializer=_build_process_init,
                                       initargs=(os.getpid(), self.initializer))
            # start every process and pay its imports now, not inside the first builds' timeouts
            warm = [pool.submit(_warm_up) for _ in range(self.n_workers)]
            try:
                for f in warm:
                    f.result(timeout=120)
            except Exception as e:
                self._pool = pool
                self._kill_pool()
                raise RuntimeError(f"the build processes did not start ({type(e).__name__}: {e}); a script "
                                   f"that builds must guard its main code with `if __name__ == '__main__':` "
                                   f"(processes are spawned and import the main module)") from e
            self._pool = pool
        return self._pool

    def _kill_pool(self):
        pool, self._pool = self._pool, None
        if pool is None:
            return
        procs = list((getattr(pool, "_processes", None) or {}).values())
        for p in procs:
            try:
                p.kill()
            except (OSError, ValueError, AttributeError):
                pass
        pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            try:
                p.join(timeout=5)
            except (OSError, ValueError, AssertionError):
                pass

    def close(self):
        self._kill_pool()  # builds are disposable: do not wait for stragglers

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -------------------------------------------------------------- building
    def build(self, task: Task, candidates) -> list:
        candidates = list(candidates)
        ctor = _custom_ctor(task.workload)
        jobs = [_Job(i, (task.workload, task.target, c.to_json(), ctor)) for i, c in enumerate(candidates)]
        ref_key = (task.workload, task.target)
        if ref_key not in self._references:
            jobs.insert(0, _Job("ref", (task.workload, task.target, None, ctor)))
        outcomes = self._run(jobs)
        if "ref" in outcomes:
            out = outcomes["ref"]
            ref_bytes, ref_err = out.kernel_bytes, out.error_msg
            if ref_bytes is None:
                log.warning("no reference kernel for %s: %s", task.workload.name, ref_err)
            if out.error_code != ErrorCode.BUILD_TIMEOUT:  # a timeout may pass: try next batch
                self._references[ref_key] = (ref_bytes, ref_err)
        else:
            ref_bytes, ref_err = self._references[ref_key]
        results = []
        for i, cand in enumerate(candidates):
            out = outcomes[i]
            results.append(BuildResult(kernel_bytes=out.kernel_bytes, reference_bytes=ref_bytes,
                                       args=out.args, num_inputs=out.num_inputs,
                                       error_code=ErrorCode(out.error_code), error_msg=out.error_msg,
                                       build_seconds=out.build_seconds, candidate=cand,
                                       reference_error="" if ref_bytes is not None
                                       else f"reference build failed: {ref_err}"))
        return results

    def _run(self, jobs) -> dict:
        """Run the jobs with at most n_workers in flight; job key → BuildOutcome."""
        pending = deque(jobs)
        inflight: dict = {}  # future -> (job, deadline)
        outcomes: dict = {}
        while pending or inflight:
            while pending and len(inflight) < self.n_workers:
                if pending[0].isolate and inflight:
                    break
                if inflight and any(j.isolate for j, _ in inflight.values()):
                    break
                job = pending.popleft()
                try:
                    fut = self._executor().submit(_build_job, *job.args)
                except BrokenProcessPool:  # a process died while idle (e.g. the OOM killer)
                    self._kill_pool()
                    self.pools_replaced += 1
                    fut = self._executor().submit(_build_job, *job.args)
                inflight[fut] = (job, time.monotonic() + self.timeout)
            first_deadline = min(d for _, d in inflight.values())
            before = time.monotonic()
            done, _ = wait(list(inflight), timeout=min(max(0.0, first_deadline - before), LOCK_PROBE_SECONDS),
                           return_when=FIRST_COMPLETED)
            if host_lock.timing_elsewhere():
                # the builds wait for a kernel being timed (compiler.host_lock): stop their clock
                waited = time.monotonic() - before
                for fut, (job, deadline) in list(inflight.items()):
                    inflight[fut] = (job, deadline + waited)
            broken = False
            for fut in done:
                job, _ = inflight.pop(fut)
                try:
                    outcomes[job.key] = fut.result()
                except BrokenProcessPool:
                    broken = True
                    inflight[fut] = (job, 0.0)  # handled below with the rest of the flight
                except Exception as e:  # noqa: BLE001 - e.g. arguments that cannot be pickled
                    outcomes[job.key] = _failure(ErrorCode.COMPILE_ERROR, f"{type(e).__name__}: {e}")
            if broken:
                self._handle_broken(inflight, pending, outcomes)
                continue
            now = time.monotonic()
            expired = [f for f, (_, d) in inflight.items() if d <= now and not f.done()]
            if expired:
                for fut in expired:
                    job, _ = inflight.pop(fut)
                    outcomes[job.key] = _failure(ErrorCode.BUILD_TIMEOUT,
                                                 f"build did not finish within {self.timeout:g} s "
                                                 f"(build process killed)", self.timeout)
                self._requeue_or_collect(inflight, pending, outcomes)
                self._kill_pool()
                self.pools_replaced += 1
        return outcomes

    def _requeue_or_collect(self, inflight, pending, outcomes, isolate: bool = False):
        """Take finished results from the flight; put the unfinished jobs back at the front."""
        for fut, (job, _) in list(inflight.items()):
            result = None
            if fut.done():
                try:
                    result = fut.result()
                except Exception:  # noqa: BLE001 - broken or cancelled: run it again
                    result = None
            if result is not None:
                outcomes[job.key] = result
            else:
                job.isolate = job.isolate or isolate
                pending.appendleft(job)
        inflight.clear()

    def _handle_broken(self, inflight, pending, outcomes):
        """A build process died: blame the job if it ran alone, else retry the flight one by one."""
        # let the executor fail every future of the dead pool before looking at them
        wait(list(inflight), timeout=5)
        culprits = [(f, j) for f, (j, _) in inflight.items()]
        if len(culprits) == 1:
            fut, job = culprits[0]
            inflight.clear()
            try:
                outcomes[job.key] = fut.result(timeout=0)
            except Exception:  # noqa: BLE001
                outcomes[job.key] = _failure(ErrorCode.COMPILE_ERROR,
                                             "the build process died while compiling this candidate "
                                             "(the compiler crashed)")
        else:
            self._requeue_or_collect(inflight, pending, outcomes, isolate=True)
        self._kill_pool()
        self.pools_replaced += 1


def _failure(code: ErrorCode, msg: str, seconds: float = 0.0) -> BuildOutcome:
    return BuildOutcome(None, [], 0, int(code), msg, seconds)


def _custom_ctor(workload: Workload):
    """The constructor of a user-registered workload, if it can travel to a build process."""
    from .. import workload as workload_mod
    fn = workload_mod.custom_constructor(workload.name)
    if fn is None:
        return None
    try:
        pickle.dumps(fn)
    except Exception:  # noqa: BLE001 - a lambda or closure: the process must register it itself
        return None
    return fn
