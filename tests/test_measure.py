"""Build measurement: the builder pool, the measuring worker, the local runner.

Misbehaving kernels are real kernels: tiny LLVM IR modules compiled here (a null-page load, an
endless loop, a kernel that writes nothing) and a kernel of another computation with the same
arguments (wrong answer).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from compiler.ops import default_schedule
from compiler.runtime import ArgSpec, Kernel
from compiler.target import Target, llvm_binding
from device_agent import worker as W
from device_agent.worker import MeasureRequest, WorkerProcess, compare_output, measure_one
from tuner.candidate import Candidate, ErrorCode
from tuner.measure import BuilderPool, BuildResult, LocalRunner, MeasureOptions
from tuner.workload import Task, Workload, register_workload

MM = Workload("matmul", dict(M=32, N=32, K=32))
MM_T = Workload("matmul", dict(M=32, N=32, K=32, transpose_b=True))  # same arguments, other result
ADD = Workload("add", dict(shape_a=(16, 33)))
I8 = Workload("matmul_int8", dict(M=8, N=24, K=16))


def trace(workload) -> Candidate:
    return Candidate("trace", {"sketch": "default", "steps": default_schedule(workload.opdef()).steps})


NAIVE = Candidate("trace", {"sketch": "naive", "steps": []})


# ----------------------------------------------------------------------------- build-process hooks
# run in the builder's spawned processes through `initializer` (importable: pytest puts tests/ on
# sys.path, and spawned children inherit sys.path)

def _register_test_kinds():
    from compiler.schedule import create_schedule
    from tuner.space import register_candidate_kind

    def sleepy(opdef, cand, target):
        time.sleep(cand.payload["seconds"])
        return create_schedule(opdef.output), opdef.tensors

    def crashing(opdef, cand, target):
        os.kill(os.getpid(), signal.SIGSEGV)

    register_candidate_kind("sleepy", sleepy)
    register_candidate_kind("crashing", crashing)


@register_workload("test_measure_scaled_sum")
def scaled_sum(n=24):
    """A user's own workload: spawned build processes get its (importable) constructor."""
    import compiler as C
    from compiler.ops import OpDef
    A = C.placeholder((n, n), "float32", "A")
    k = C.reduce_axis(n, "k")
    out = C.compute((n,), lambda i: C.sum(A[i, k] * 2.0, axis=k), name="out")
    return OpDef("test_measure_scaled_sum", [A], out, {"n": n}, 2 * n * n, lambda a: 2 * a.sum(axis=1))


# ----------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def pool():
    with BuilderPool(n_workers=2, timeout=20.0, initializer=_register_test_kinds) as p:
        yield p


@pytest.fixture(scope="module")
def mm_built(pool):
    """[default schedule, naive] of MM."""
    return pool.build(Task.create(MM), [trace(MM), NAIVE])


@pytest.fixture(scope="module")
def runner():
    with LocalRunner(MeasureOptions(number=2, repeat=3, min_repeat_ms=5, timeout=3.0)) as r:
        yield r


def ir_kernel(body: str, like: BuildResult) -> bytes:
    """A kernel `main` with `like`'s arguments whose body is the given LLVM IR."""
    llvm = llvm_binding()
    host = Target.host()
    params = ", ".join(f"ptr %a{i}" for i in range(len(like.args)))
    mod = llvm.parse_assembly(f"define i32 @main({params}) {{\n{body}\n}}\n")
    mod.triple = host.triple
    mod.data_layout = str(host.target_machine().target_data)
    mod.verify()
    obj = host.target_machine().emit_object(mod)
    return Kernel("main", obj, [ArgSpec(a["name"], tuple(a["shape"]), a["dtype"]) for a in like.args], host).to_bytes()


SEGFAULT = """
  %p = inttoptr i64 16 to ptr
  %v = load volatile i32, ptr %p
  ret i32 %v"""
ENDLESS = """
  br label %loop
loop:
  store volatile i32 1, ptr %a0
  br label %loop"""
NOTHING = "  ret i32 0"


def replace_kernel(br: BuildResult, kernel_bytes: bytes) -> BuildResult:
    return BuildResult(kernel_bytes=kernel_bytes, reference_bytes=br.reference_bytes, args=br.args,
                       num_inputs=br.num_inputs)


# ----------------------------------------------------------------------------- builder

def test_builder_builds_a_batch_in_parallel(pool, mm_built):
    task = Task.create(ADD)
    results = pool.build(task, [trace(ADD), NAIVE, trace(ADD)])
    assert all(r.ok for r in results + mm_built), [r.error_msg for r in results + mm_built]
    for r in results:
        assert r.kernel_bytes[:4] == b"TFK1" and r.reference_bytes[:4] == b"TFK1"
        assert [a["shape"] for a in r.args] == [[16, 33], [16, 33], [16, 33]] and r.num_inputs == 2
        assert r.build_seconds > 0
    # the reference kernel is built once per task and shared
    assert results[0].reference_bytes is results[2].reference_bytes
    assert pool.build(task, [NAIVE])[0].reference_bytes is results[0].reference_bytes
    assert mm_built[0].kernel_bytes != mm_built[1].kernel_bytes


def test_candidate_that_does_not_apply_is_an_instantiation_error(pool):
    bad = [Candidate("trace", {"steps": [{"op": "split", "stage": 7, "axis": 0, "factor": 4}]}),
           Candidate("trace", {"steps": [{"op": "vectorize", "stage": 0, "axis": 99}]}),
           Candidate("trace", {"no_steps": True}),
           Candidate("nonsense", {})]
    results = pool.build(Task.create(MM), bad + [NAIVE])
    assert [r.error_code for r in results[:4]] == [ErrorCode.INSTANTIATION_ERROR] * 4
    assert all(r.kernel_bytes is None and r.error_msg for r in results[:4])
    assert "stage" in results[0].error_msg
    assert results[4].ok  # the rest of the batch is unaffected


def test_hung_build_times_out_and_the_pool_is_replaced():
    task = Task.create(ADD)
    with BuilderPool(n_workers=2, timeout=1.5, initializer=_register_test_kinds) as p:
        p.build(task, [NAIVE])  # processes started and the reference built
        t0 = time.monotonic()
        results = p.build(task, [Candidate("sleepy", {"seconds": 60}), trace(ADD), NAIVE, trace(ADD)])
        elapsed = time.monotonic() - t0
        assert results[0].error_code == ErrorCode.BUILD_TIMEOUT and "1.5" in results[0].error_msg
        assert all(r.ok for r in results[1:]), [r.error_msg for r in results[1:]]
        assert elapsed < 15, elapsed
        assert p.pools_replaced == 1
        assert p.build(task, [trace(ADD)])[0].ok  # the fresh pool builds


def test_builds_waiting_for_a_timing_are_not_charged_for_it(monkeypatch, tmp_path):
    """A build waits while a kernel is timed on the host (compiler.host_lock); that wait is not
    its build time: a timing that holds the host longer than the build timeout fails no build."""
    import threading

    from compiler import host_lock
    monkeypatch.setenv("TUNEFARM_LOCK_DIR", str(tmp_path))   # inherited by the build processes
    task = Task.create(ADD)
    with BuilderPool(n_workers=2, timeout=1.5) as p:
        p.build(task, [NAIVE])
        held, release = threading.Event(), threading.Event()

        def timing():
            with host_lock.exclusive():
                held.set()
                release.wait(10)
        t = threading.Thread(target=timing)
        t.start()
        held.wait(5)
        assert host_lock.timing_elsewhere()
        threading.Timer(3.5, release.set).start()
        t0 = time.monotonic()
        results = p.build(task, [trace(ADD), NAIVE])
        waited = time.monotonic() - t0
        t.join()
        assert waited >= 3.0 and all(r.ok for r in results), [r.error_msg for r in results]
        assert not host_lock.timing_elsewhere()


def test_user_workloads_build_in_spawned_processes(pool, runner):
    task = Task.create(Workload("test_measure_scaled_sum", {"n": 24}))
    (br,) = pool.build(task, [NAIVE])
    assert br.ok, br.error_msg
    assert runner.run(task, [br])[0].ok


def test_build_process_crash_is_blamed_on_its_candidate(pool):
    task = Task.create(ADD)
    results = pool.build(task, [trace(ADD), Candidate("crashing", {}), NAIVE])
    assert results[1].error_code == ErrorCode.COMPILE_ERROR and "died" in results[1].error_msg
    assert results[0].ok and results[2].ok


# ----------------------------------------------------------------------------- measuring code

def test_worker_error_codes_match_the_tuner():
    assert (W.NO_ERROR, W.RUNTIME_ERROR, W.WRONG_ANSWER, W.RUN_TIMEOUT, W.RUNNER_ERROR, W.UNSUPPORTED_TARGET) == (
        ErrorCode.NO_ERROR, ErrorCode.RUNTIME_ERROR, ErrorCode.WRONG_ANSWER, ErrorCode.RUN_TIMEOUT,
        ErrorCode.RUNNER_ERROR, ErrorCode.UNSUPPORTED_TARGET)


def test_compare_output_tolerance():
    ref = np.array([100.0, 1.0, -3.0, np.nan], np.float32)
    assert compare_output("y", ref + np.float32(0.005), ref, 1e-4, 0.0) == ""   # 0.005 < 1e-4 * 100
    assert "1 of 4" in compare_output("y", ref + np.array([0, 0.02, 0, 0], np.float32), ref, 1e-4, 0.0)
    assert compare_output("y", np.array([100.0, 1.0, -3.0, 0.0], np.float32), ref, 1e-4, 0.0)  # NaN expected
    assert compare_output("y", np.where(np.isnan(ref), 1, ref), np.where(np.isnan(ref), np.inf, ref), 1, 0)
    ints = np.array([1, 2, 3], np.int32)
    assert compare_output("i", ints, ints.copy(), 1e-4, 0.0) == ""
    assert "exact" in compare_output("i", ints + np.array([0, 0, 1], np.int32), ints, 0.5, 10.0)


def test_measure_one_in_process(mm_built):
    br = mm_built[0]
    res = measure_one(MeasureRequest(br.kernel_bytes, br.reference_bytes, br.num_inputs,
                                     MeasureOptions(number=1, repeat=2, min_repeat_ms=1)))
    assert res["error_code"] == 0 and 2 <= len(res["costs"]) <= W.KEPT_SAMPLES and all(c > 0 for c in res["costs"])
    timing = res["timing"]   # the measurement protocol's summary: the figure is the median of the samples
    assert timing["count"] >= 2 and timing["min"] <= timing["median"] and timing["median"] > 0
    assert min(res["costs"]) == timing["min"] and timing["checked"]
    assert not timing["cut_short"]
    # far past a search's slow cutoff: checked, then its checked call is its one sample
    res = measure_one(MeasureRequest(br.kernel_bytes, br.reference_bytes, br.num_inputs,
                                     MeasureOptions(repeat=10, slow_cutoff_s=1e-12)))
    assert res["error_code"] == 0 and len(res["costs"]) == 1 and res["timing"]["cut_short"]
    assert res["timing"]["count"] == 1 and res["costs"][0] == res["timing"]["median"] > 0
    res = measure_one(MeasureRequest(br.kernel_bytes, None, br.num_inputs))
    assert res["error_code"] == W.RUNNER_ERROR and "reference" in res["error_msg"]
    res = measure_one({"kernel_bytes": b"junk", "reference_bytes": br.reference_bytes, "num_inputs": 2})
    assert res["error_code"] == W.RUNNER_ERROR and "load" in res["error_msg"]


def test_a_window_is_checked_kernel_by_kernel_and_timed_together(mm_built, pool):
    """measure_window: every kernel checked on its own (a wrong one answered WRONG_ANSWER, a
    broken request RUNNER_ERROR), the rest timed together; answers in the requests' order, each
    with its own figure and run time; the worker's window request answers the same."""
    other = pool.build(Task.create(MM_T), [trace(MM_T)])[0]     # B transposed: same arguments, wrong answer
    opts = MeasureOptions(number=1, repeat=5, min_repeat_ms=1)
    good, naive = (MeasureRequest(br.kernel_bytes, br.reference_bytes, br.num_inputs, opts) for br in mm_built)
    wrong = MeasureRequest(other.kernel_bytes, mm_built[0].reference_bytes, mm_built[0].num_inputs, opts)
    junk = {"kernel_bytes": b"junk", "reference_bytes": mm_built[0].reference_bytes, "num_inputs": 2}
    answers = W.measure_window([good, wrong, junk, naive])
    codes = [a["error_code"] for a in answers]
    assert codes == [W.NO_ERROR, W.WRONG_ANSWER, W.RUNNER_ERROR, W.NO_ERROR], answers
    for a in (answers[0], answers[3]):
        assert a["timing"]["count"] >= 5 and a["costs"] and a["run_seconds"] > 0
    assert min(answers[0]["costs"]) == answers[0]["timing"]["min"] > 0
    served = W.window_answer({"window": [good.to_dict(), wrong.to_dict()]})
    assert [a["error_code"] for a in served["window"]] == [W.NO_ERROR, W.WRONG_ANSWER]
    assert W.window_answer({"window": None})["error_code"] == W.RUNNER_ERROR


def test_a_kernel_that_crashes_or_hangs_a_window_is_blamed_alone(mm_built):
    """WorkerProcess.run_window: a kernel that kills the child, or hangs it, while the window is
    checked costs the window, not the other kernels' answers: it gets the crash or the timeout
    (its own timeout, not the window's), and the others are measured again together."""
    crash = replace_kernel(mm_built[0], ir_kernel(SEGFAULT, mm_built[0]))
    hang = replace_kernel(mm_built[0], ir_kernel(ENDLESS, mm_built[0]))
    opts = MeasureOptions(number=1, repeat=3, min_repeat_ms=1, timeout=5.0)

    def request(br):
        return MeasureRequest(br.kernel_bytes, br.reference_bytes, br.num_inputs, opts)
    with WorkerProcess() as worker:
        answers = worker.run_window([(request(br), 5.0) for br in (mm_built[0], crash, mm_built[1])])
        assert [a["error_code"] for a in answers] == [W.NO_ERROR, W.RUNTIME_ERROR, W.NO_ERROR], answers
        assert "SIGSEGV" in answers[1]["error_msg"] and worker.restarts == 1
        assert all("window_stage" not in a for a in answers)
        t0 = time.monotonic()
        answers = worker.run_window([(request(mm_built[0]), 1.5), (request(hang), 1.5), (request(mm_built[1]), 1.5)])
        elapsed = time.monotonic() - t0
        assert [a["error_code"] for a in answers] == [W.NO_ERROR, W.RUN_TIMEOUT, W.NO_ERROR], answers
        assert "1.5 s" in answers[1]["error_msg"] and elapsed < 1.5 + 3.0     # one kernel's timeout, not the sum
        one_by_one = worker.run_window([(request(mm_built[0]), 5.0), (request(mm_built[1]), 5.0)], interleave=False)
        assert [a["error_code"] for a in one_by_one] == [W.NO_ERROR, W.NO_ERROR]


# ----------------------------------------------------------------------------- local runner

def test_correct_kernels_get_sane_costs(runner, mm_built, pool):
    task = Task.create(MM)
    results = runner.run(task, mm_built)
    for r in results:
        assert r.ok, r.error_msg
        assert 1 <= len(r.costs) <= 32 and all(1e-8 < c < 0.5 for c in r.costs)
        assert r.samples >= 10 and r.minimum == min(r.costs) and r.minimum <= r.cost == r.median
        assert r.run_seconds > 0 and r.build_seconds > 0 and r.measured_by == "local"
    # integer outputs are checked exactly, and pass
    i8 = pool.build(Task.create(I8), [trace(I8)])
    assert runner.run(Task.create(I8), i8)[0].ok


def test_build_errors_pass_through(runner):
    br = BuildResult(None, None, error_code=ErrorCode.INSTANTIATION_ERROR, error_msg="nope", build_seconds=0.5)
    (res,) = runner.run(Task.create(MM), [br])
    assert res.error_code == ErrorCode.INSTANTIATION_ERROR and res.error_msg == "nope" and res.build_seconds == 0.5


def test_segfault_is_a_runtime_error_and_the_next_request_succeeds(runner, mm_built):
    task = Task.create(MM)
    crash = replace_kernel(mm_built[0], ir_kernel(SEGFAULT, mm_built[0]))
    bad, good = runner.run(task, [crash, mm_built[0]])
    assert bad.error_code == ErrorCode.RUNTIME_ERROR and "SIGSEGV" in bad.error_msg, bad.error_msg
    assert good.ok, good.error_msg


def test_endless_loop_is_a_run_timeout_and_the_next_request_succeeds(runner, mm_built):
    task = Task.create(MM)
    hang = replace_kernel(mm_built[0], ir_kernel(ENDLESS, mm_built[0]))
    runner.run(task, [mm_built[1]])  # a warm worker: the timeout is the kernel's alone
    t0 = time.monotonic()
    (bad,) = runner.run(task, [hang])
    elapsed = time.monotonic() - t0
    assert bad.error_code == ErrorCode.RUN_TIMEOUT, bad.error_msg
    assert runner.options.timeout <= elapsed < runner.options.timeout + 2.0
    (good,) = runner.run(task, [mm_built[0]])
    assert good.ok, good.error_msg


def test_wrong_answers_are_caught(runner, mm_built, pool):
    task = Task.create(MM)
    other = pool.build(Task.create(MM_T), [trace(MM_T)])[0]  # B transposed: same arguments
    assert other.ok and other.args == mm_built[0].args
    wrong = replace_kernel(mm_built[0], other.kernel_bytes)
    silent = replace_kernel(mm_built[0], ir_kernel(NOTHING, mm_built[0]))  # leaves outputs unwritten
    r_wrong, r_silent, r_good = runner.run(task, [wrong, silent, mm_built[1]])
    assert r_wrong.error_code == ErrorCode.WRONG_ANSWER and "matmul" in r_wrong.error_msg, r_wrong.error_msg
    assert r_silent.error_code == ErrorCode.WRONG_ANSWER and "1024 of 1024" in r_silent.error_msg
    assert r_good.ok


def test_worker_process_survives_and_closes():
    w = WorkerProcess().start()
    res = w.run({"kernel_bytes": b"junk", "reference_bytes": None, "num_inputs": 1}, timeout=10)
    assert res["error_code"] == W.RUNNER_ERROR
    proc = w._proc
    w.close()
    assert proc.poll() is not None and w._proc is None


def _single_cpu_threads(pid: int) -> list[str]:
    """The CPUs each thread of `pid` may run on, for threads bound to exactly one CPU."""
    bound = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            status = open(f"/proc/{pid}/task/{tid}/status").read()
        except OSError:
            continue   # the thread ended
        cpus = status.split("Cpus_allowed_list:")[1].split()[0]
        if cpus.isdigit():
            bound.append(cpus)
    return bound


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or not os.path.isdir("/proc/self/task"),
                    reason="needs Linux and at least two CPUs to see a team bound one thread per core")
def test_the_measuring_workers_team_is_bound_one_thread_per_core(pool, monkeypatch):
    """Left to the scheduler, a kernel's two threads sometimes share one core (2x its time, in
    one process but not the next); the measuring worker binds its OpenMP team instead."""
    for name in ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY"):
        monkeypatch.delenv(name, raising=False)
    big = Workload("matmul", dict(M=128, N=128, K=128))   # large enough for its loops to run in parallel
    br = pool.build(Task.create(big), [trace(big)])[0]
    w = WorkerProcess().start()
    try:
        res = w.run(MeasureRequest(br.kernel_bytes, br.reference_bytes, br.num_inputs,
                                   MeasureOptions(repeat=3, min_repeat_ms=1, num_threads=2)).to_dict(), timeout=30)
        assert res["error_code"] == 0, res["error_msg"]
        bound = _single_cpu_threads(w._proc.pid)
    finally:
        w.close()
    assert len(set(bound)) >= 2, f"threads bound to single CPUs: {bound}"


def test_a_binding_the_user_chose_is_kept():
    code = ("import os, json\nfrom compiler.timing import prepare_timing_process\n"
            "print(json.dumps(prepare_timing_process()['binding']))")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY")}
    ours = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert json.loads(ours.stdout) == {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}
    theirs = subprocess.run([sys.executable, "-c", code], env={**env, "OMP_PLACES": "threads"},
                            capture_output=True, text=True, check=True)
    assert json.loads(theirs.stdout) == {"OMP_PLACES": "threads"}


def test_measure_options_are_one_value_with_one_set_of_defaults():
    """Both runners, the agent and the worker take one MeasureOptions; the protocol message is
    converted in one place, a field left unset (0) meaning the default where 0 is unusable."""
    from rpc_tracker.protocol import pb
    from tuner.measure import RPCRunner
    opts = MeasureOptions(number=3, repeat=4, min_repeat_ms=2.5, timeout=7.0, seed=9, num_threads=2, rtol=1e-3,
                          slow_cutoff_s=0.25)
    assert MeasureOptions.from_proto(opts.to_proto(pb)) == opts
    assert opts.timing_options().slow_cutoff_s == 0.25 and MeasureOptions().timing_options().slow_cutoff_s == float("inf")
    assert MeasureOptions.from_proto(pb.MeasureOptions()) == MeasureOptions(min_repeat_ms=0.0, rtol=0.0)
    assert MeasureRequest.from_dict(MeasureRequest(b"k", None, 2, opts).to_dict()).options == opts
    for bad in (dict(number=0), dict(repeat=0), dict(timeout=0.0), dict(attempts=0), dict(num_threads=0),
                dict(min_repeat_ms=-1.0), dict(slow_cutoff_s=-1.0)):
        with pytest.raises(ValueError):
            MeasureOptions(**bad)
    with LocalRunner(opts) as local:
        assert local.request(BuildResult(b"k", b"r", num_inputs=2)).options == opts
        briefly = MeasureOptions(slow_cutoff_s=0.5)
        assert local.request(BuildResult(b"k", b"r", num_inputs=2), briefly).options == briefly
    remote = RPCRunner("127.0.0.1:1", "key", options=opts)
    try:
        assert remote.options == opts and MeasureOptions.from_proto(remote._options_message) == opts
    finally:
        remote.close()
