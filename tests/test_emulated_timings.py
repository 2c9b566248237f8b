"""Emulated agents and what the farm serves, without a board: the detection, the tracker's rules
(llvmlite at hello, one kind of agent per key, results stamped), records and the cost model keeping
emulated timings apart, and the worker refusing a kernel of another ISA. tests/test_board.py does
the same end to end with a real emulated board."""

from __future__ import annotations

import io
import tomllib
from pathlib import Path

import grpc
import llvmlite
import numpy as np
import pytest

from compiler.measure_options import MeasureOptions
from compiler.ops import build_op, get_op
from device_agent import host
from device_agent.worker import UNSUPPORTED_TARGET, MeasureRequest, measure_one
from rpc_tracker import state as st
from rpc_tracker.client import make_channel
from rpc_tracker.protocol import (
    AGENT_LLVMLITE_BELOW,
    AGENT_LLVMLITE_MIN,
    PROTOCOL_VERSION,
    auth_metadata,
    llvmlite_problem,
    pb,
    pb_grpc,
)
from rpc_tracker.server import TrackerConfig, start_tracker
from rpc_tracker.targets import DeviceSpec
from tuner.candidate import Candidate, ErrorCode, MeasureResult
from tuner.cost_model import XGBCostModel
from tuner.records import open_store
from tuner.workload import Task, Workload

ROOT = Path(__file__).resolve().parents[1]
X86 = DeviceSpec.make("x86_64-unknown-linux-gnu", "znver3", ["avx2", "fma"], llvmlite_version="0.47.0")
QEMU_ARM = DeviceSpec.make("aarch64-unknown-linux-gnu", "cortex-a72", ["neon"], emulated=True, llvmlite_version="0.47.0")
PI = DeviceSpec.make("aarch64-unknown-linux-gnu", "cortex-a72", ["neon"], llvmlite_version="0.47.0")
T_ARM = "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"


# ----------------------------------------------------------------------------- detection

@pytest.mark.parametrize("kernel, process, emulated", [
    ("x86_64", "aarch64", True),     # qemu-user on an x86 host: the board
    ("aarch64", "x86_64", True),     # an x86 agent translated on an Arm host
    ("x86_64", "x86_64", False),
    ("aarch64", "aarch64", False),   # a Raspberry Pi, a Graviton
    ("aarch64", "armv7l", False),    # 32-bit userland on a 64-bit Arm kernel runs natively
    ("x86_64", "i686", False),
    ("", "aarch64", False),          # the kernel's architecture cannot be told: not claimed
])
def test_emulated_means_the_kernel_is_of_another_architecture_than_the_process(monkeypatch, kernel, process, emulated):
    monkeypatch.delenv(host.EMULATED_ENV, raising=False)
    monkeypatch.setattr(host, "kernel_arch", lambda: host._arch_family(kernel) if kernel else "")
    monkeypatch.setattr(host.platform, "machine", lambda: process)
    assert host.is_emulated() is emulated


def test_this_host_is_native_and_the_override_wins(monkeypatch):
    monkeypatch.delenv(host.EMULATED_ENV, raising=False)
    assert host.kernel_arch() == host._arch_family(host.platform.machine())
    assert host.is_emulated() is False and host.describe_host()["emulated"] is False
    monkeypatch.setenv(host.EMULATED_ENV, "1")
    assert host.is_emulated() is True
    monkeypatch.setenv(host.EMULATED_ENV, "0")
    monkeypatch.setattr(host, "kernel_arch", lambda: "x86_64")
    monkeypatch.setattr(host.platform, "machine", lambda: "aarch64")
    assert host.is_emulated() is False


# ----------------------------------------------------------------------------- llvmlite at hello

def test_the_llvmlite_range_the_tracker_serves_is_the_projects():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [d for d in deps if d.startswith("llvmlite")]
    lo, hi = AGENT_LLVMLITE_MIN, AGENT_LLVMLITE_BELOW
    assert pin == f"llvmlite>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1]}", pin
    assert llvmlite_problem(llvmlite.__version__) == ""
    assert llvmlite_problem(f"{lo[0]}.{lo[1]}.0rc1") == ""
    old = llvmlite_problem("0.39.1")       # Debian bookworm's python3-llvmlite
    assert "llvmlite 0.39.1 cannot load" in old and pin in old, old
    assert pin in llvmlite_problem(f"{hi[0]}.{hi[1]}.0")
    assert "did not say" in llvmlite_problem("") and "can read" in llvmlite_problem("latest")


@pytest.fixture
def tracker():
    server = start_tracker(TrackerConfig(host="127.0.0.1", port=0, agent_token="a", tuner_token="t"))
    yield server.address
    server.stop(0)


def hello(llvmlite_version: str, protocol: int = PROTOCOL_VERSION, key: str = "arm-a72", emulated: bool = False):
    dev = pb.DeviceInfo(triple="aarch64-unknown-linux-gnu", cpu="cortex-a72", features=["neon"], cores=4,
                        llvmlite_version=llvmlite_version, emulated=emulated)
    return pb.Hello(protocol_version=protocol, device_key=key, device=dev, name="pi")


def connect(address, message):
    with make_channel(address) as channel:
        call = pb_grpc.TrackerStub(channel).Connect(message, metadata=auth_metadata("a"), timeout=5)
        try:
            return next(call).welcome.agent_id
        except grpc.RpcError as e:
            return e
        finally:
            call.cancel()


def test_the_tracker_refuses_at_hello_an_agent_whose_llvmlite_or_protocol_it_cannot_serve(tracker):
    refused = connect(tracker, hello("0.39.1"))
    assert isinstance(refused, grpc.RpcError) and refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "llvmlite 0.39.1 cannot load the kernels" in refused.details(), refused.details()
    old = connect(tracker, hello(llvmlite.__version__, protocol=2))
    assert isinstance(old, grpc.RpcError) and old.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "older than this tracker's minimum" in old.details()
    assert isinstance(connect(tracker, hello(llvmlite.__version__)), str)   # the same board, served


# ----------------------------------------------------------------------------- one kind per key

def test_a_key_holds_emulated_or_native_agents_and_results_say_which():
    state = st.TrackerState(unknown_key_grace=0.0)
    board = state.register_agent("qemu-board", "arm-a72", QEMU_ARM)
    with pytest.raises(st.EmulationMismatch, match="served by emulated agents .*qemu-board.* key of its own"):
        state.register_agent("pi", "arm-a72", PI)
    pi = state.register_agent("pi", "arm-a72-pi", PI)              # under a key of its own: fine
    waiter = state.submit("arm-a72", 0, [st.Submission("r1", T_ARM, 1.0)])
    assert [w.request_id for w in state.next_work(board, 0)] == ["r1"]
    assert state.report_result(board, st.Result("r1", [1e-3])) is False
    (res,) = state.wait_results(waiter, 0)
    assert res.emulated is True                  # stamped from the registration, whatever the report said
    waiter = state.submit("arm-a72-pi", 0, [st.Submission("r2", T_ARM, 1.0)])
    assert [w.request_id for w in state.next_work(pi, 0)] == ["r2"]
    assert state.report_result(pi, st.Result("r2", [1e-3], emulated=True)) is False
    (res,) = state.wait_results(waiter, 0)
    assert res.emulated is False
    second = state.register_agent("qemu-board-2", "arm-a72", QEMU_ARM)    # more of the same kind: fine
    state.remove_agent(board, "left")
    state.remove_agent(second, "left")
    state.register_agent("pi-2", "arm-a72", PI)  # the key's emulated agents are gone: native ones may take it


# ----------------------------------------------------------------------------- records and the cost model

def timed(cost: float, emulated: bool) -> MeasureResult:
    return MeasureResult(costs=[cost], median=cost, minimum=cost, spread=0.0, samples=1, measured_by="a",
                         emulated=emulated)


def test_records_keep_the_label_through_the_store_and_json_lines(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'r.db'}")
    task = Task(Workload("matmul", {"M": 8, "N": 8, "K": 8}), T_ARM, "arm-a72")
    a, b = (Candidate("config", {"template": "t", "knobs": {"k": i}}) for i in range(2))
    store.add_records(task, [(a, timed(1e-3, True)), (b, timed(2e-3, False))])
    got = {r.candidate.fingerprint: r.result.emulated for r in store.history()}
    assert got == {a.fingerprint: True, b.fingerprint: False}
    buf = io.StringIO()
    store.export_jsonl(buf)
    other = open_store(f"sqlite:///{tmp_path / 'other.db'}")
    other.import_jsonl(io.StringIO(buf.getvalue()))
    assert {r.candidate.fingerprint: r.result.emulated for r in other.history()} == got
    store.close()
    other.close()


def test_the_cost_model_never_trains_on_both_kinds():
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(20, 5))
    native = [timed(1e-3 * (1 + i), False) for i in range(10)]
    emulated = [timed(1e-1 * (1 + i), True) for i in range(10)]
    model = XGBCostModel(min_samples=2)
    model.update(X[:10], native)
    model.update(X[10:], emulated)                           # the other kind: left out
    assert model.emulated is False and len(model._X) == 10 and model.rows_left_out == 10
    failed = MeasureResult(error_code=ErrorCode.COMPILE_ERROR, emulated=True)
    model.update(X[:1], [failed])                            # failures have no kind
    assert len(model._X) == 11
    # a warm start of native records gives way to a run whose own timings are emulated
    warm = XGBCostModel(min_samples=2)
    warm.warm_start(X[:10], np.arange(1.0, 11.0), ["w"] * 10, emulated=False)
    warm.update(X[10:], emulated)
    assert warm.emulated is True and warm._hX is None and len(warm._X) == 10 and warm.rows_left_out == 10
    warm.warm_start(X[:10], np.arange(1.0, 11.0), ["w"] * 10, emulated=False)   # refused now
    assert warm._hX is None and warm.rows_left_out == 20


# ----------------------------------------------------------------------------- the worker

def test_the_worker_refuses_a_kernel_of_another_isa_with_its_own_code():
    other = T_ARM if host.Target.host().arch != "aarch64" else "llvm -mtriple=x86_64-unknown-linux-gnu -mcpu=haswell"
    foreign = build_op(get_op("matmul", M=8, N=8, K=8), other).to_bytes()
    ans = measure_one(MeasureRequest(foreign, foreign, 2, MeasureOptions(repeat=1, min_repeat_ms=1)))
    assert ans["error_code"] == UNSUPPORTED_TARGET == ErrorCode.UNSUPPORTED_TARGET, ans
    assert "cannot run the candidate kernel" in ans["error_msg"] and "compiled for" in ans["error_msg"], ans


def test_apply_best_prefers_a_native_record_to_a_faster_emulated_one(tmp_path):
    from tuner.apply_best import ApplyHistoryBest
    from tuner.space import default_candidate

    store = open_store(f"sqlite:///{tmp_path / 'r.db'}")
    wl = Workload("matmul", {"M": 8, "N": 8, "K": 8})
    naive = Candidate("trace", {"sketch": "naive", "steps": []})
    default = default_candidate(wl.opdef().workload_key())
    target = host.Target.from_string(T_ARM)
    store.add_records(Task(wl, str(target), "arm-a72-qemu"), [(naive, timed(1e-6, True))])    # qemu on a fast x86
    store.add_records(Task(wl, str(target), "rpi4"), [(default, timed(1e-3, False))])
    best = ApplyHistoryBest(store).best_record(wl.opdef(), target)
    assert best.candidate == default and not best.result.emulated
    store.close()
