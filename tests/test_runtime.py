"""Runtime: argument checks, serialization across processes, loading errors, targets, timing, threads."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import struct
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import compiler as C
from compiler.errors import ArgumentError, KernelLoadError, TargetError
from compiler.kernel_format import FORMAT_VERSION
from compiler.runtime import MAGIC, Kernel, get_max_threads, load_kernel

REPO = Path(__file__).resolve().parents[1]
M, K, N = 33, 20, 27

ARM = "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"


def _matmul_schedule():
    A = C.placeholder((M, K), "float32", "A")
    B = C.placeholder((K, N), "float32", "B")
    k = C.reduce_axis(K, "k")
    out = C.compute((M, N), lambda i, j: C.sum(A[i, k] * B[k, j], axis=k), name="Out")
    s = C.create_schedule(out)
    st = s[out]
    i, j, kk = st.root_iter_vars
    io, ii = st.split(i, factor=4)
    jo, ji = st.split(j, factor=8)
    st.reorder(io, jo, kk, ii, ji)
    st.parallel(io)
    st.vectorize(ji)
    return s, [A, B, out]


@pytest.fixture(scope="module")
def mm():
    s, args = _matmul_schedule()
    return C.build(s, args, name="mm")


@pytest.fixture(scope="module")
def mm_data():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    return a, b, a.astype(np.float64) @ b.astype(np.float64)


def _poison(shape, dtype="float32"):
    return np.full(shape, np.nan if np.dtype(dtype).kind == "f" else -7, dtype=dtype)


# ----------------------------------------------------------------------------- argument checking

def test_correct_call(mm, mm_data):
    a, b, ref = mm_data
    c = _poison((M, N))
    mm(a, b, c)
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5)
    assert [x.name for x in mm.args] == ["A", "B", "Out"]
    assert mm.args[2].shape == (M, N) and mm.args[2].dtype == "float32"


def _bad_calls(a, b, c):
    ro = c.copy()
    ro.flags.writeable = False
    big = np.zeros((M, 2 * N), np.float32)
    return {
        "too few": ((a, b), "takes 3 arrays"),
        "too many": ((a, b, c, c), "takes 3 arrays"),
        "dtype float64": ((a.astype(np.float64), b, c), "expected dtype float32, got float64"),
        "dtype int32 out": ((a, b, np.zeros((M, N), np.int32)), "expected dtype float32, got int32"),
        "shape transposed": ((a, b.T.copy(), c), r"expected shape \(20, 27\), got \(27, 20\)"),
        "shape extra dim": ((a[None], b, c), "expected shape"),
        "fortran order": ((np.asfortranarray(a), b, c), "C-contiguous"),
        "strided view": ((a, b, big[:, ::2]), "C-contiguous"),
        "read-only output": ((a, b, ro), "read-only"),
        "list": ((a.tolist(), b, c), "must be a numpy array"),
    }


@pytest.mark.parametrize("case", list(_bad_calls(np.zeros((M, K), np.float32), np.zeros((K, N), np.float32),
                                                 np.zeros((M, N), np.float32))))
def test_bad_arguments_raise_and_leave_output_untouched(mm, mm_data, case):
    a, b, _ = mm_data
    c = _poison((M, N))
    args, msg = _bad_calls(a, b, c)[case]
    outs = [x for x in args if isinstance(x, np.ndarray) and x.ndim == 2 and x.shape[0] == M and x.shape[1] >= N]
    before = [np.array(x, copy=True) for x in outs]
    with pytest.raises(ArgumentError, match=msg):
        mm(*args)
    with pytest.raises(ArgumentError):
        mm.time_evaluator()(*args)
    for x, old in zip(outs, before):
        np.testing.assert_array_equal(x, old)
    assert np.isnan(c).all()


def test_argument_error_is_a_type_error(mm):
    with pytest.raises(TypeError):
        mm()


# ----------------------------------------------------------------------------- serialization

def test_round_trip_in_process(mm, mm_data):
    k2 = load_kernel(mm.to_bytes())
    assert k2.name == mm.name and k2.args == mm.args and k2.target == mm.target
    assert k2.source == mm.source and k2.object_code == mm.object_code
    a, b, ref = mm_data
    c = _poison((M, N))
    k2(a, b, c)
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5)
    assert "mm(" in repr(k2)


_CHILD = r"""
import sys
import numpy as np
from compiler import load_kernel
kernel = load_kernel(open(sys.argv[1], "rb").read())
a, b = np.load(sys.argv[2]), np.load(sys.argv[3])
c = np.full(tuple(kernel.args[2].shape), np.nan, dtype=np.float32)
kernel(a, b, c)
np.save(sys.argv[4], c)
print(kernel.name, kernel.target.triple)
"""


def test_round_trip_in_another_process(mm, mm_data, tmp_path):
    a, b, ref = mm_data
    (tmp_path / "k.tfk").write_bytes(mm.to_bytes())
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "k.tfk"), str(tmp_path / "a.npy"),
                           str(tmp_path / "b.npy"), str(tmp_path / "c.npy")],
                          capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["mm", mm.target.triple]
    np.testing.assert_allclose(np.load(tmp_path / "c.npy"), ref, rtol=1e-5, atol=1e-5)


def _pack(header: dict | bytes, obj: bytes, length: int | None = None) -> bytes:
    """A blob with a valid checksum, so the checks behind the checksum are reached."""
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    body = MAGIC + struct.pack("<I", len(h) if length is None else length) + h + obj
    return body + hashlib.sha256(body).digest()


def _header(k: Kernel, **changes):
    h = {"version": FORMAT_VERSION, "name": k.name, "target": str(k.target), "args": [a.to_json() for a in k.args]}
    h.update(changes)
    return {key: v for key, v in h.items() if v is not None}


def _malformed(k: Kernel) -> dict:
    good = k.to_bytes()
    flipped = bytearray(good)
    flipped[-len(k.object_code) // 2] ^= 0xFF
    reshaped = good.replace(b'"shape": [10]', b'"shape": [99]', 1)
    return {
        "not bytes": ("hello", "must be bytes"),
        "empty": (b"", "bad magic"),
        "short": (MAGIC + b"\x01", "bad magic"),
        "bad magic": (b"XXXX" + good[4:], "bad magic"),
        "header longer than data": (_pack(b"{}", b"", length=10_000), "malformed kernel header"),
        "not json": (_pack(b"{not json", k.object_code), "malformed kernel header"),
        "missing key": (_pack(_header(k, name=None), k.object_code), "malformed kernel header"),
        "bad arg spec": (_pack(_header(k, args=[{"name": "A"}]), k.object_code), "malformed kernel header"),
        "future version": (_pack(_header(k, version=99), k.object_code), "version 99"),
        "bad target": (_pack(_header(k, target="cuda"), k.object_code), "malformed kernel header"),
        "no object code": (_pack(_header(k), b""), "no object code"),
        "checksum mismatch": (bytes(flipped), "corrupt"),
        "truncated": (good[:-100], "corrupt"),
        "argument shape edited": (reshaped, "corrupt" if reshaped != good else "bad magic"),
        "old format version": (_pack(_header(k, version=1), k.object_code), "version 1 is not supported"),
        "garbage object": (_pack(_header(k), b"\0" * 4096), "not a valid ELF"),
        "truncated object": (_pack(_header(k), k.object_code[:len(k.object_code) // 2]), "not a valid ELF"),
        "32-bit header lie": (_pack(_header(k), k.object_code[:4] + b"\x01" + k.object_code[5:]), "not a valid ELF"),
    }


@pytest.fixture(scope="module")
def tiny():
    X = C.placeholder((10,), "float32", "X")
    Y = C.compute((10,), lambda i: X[i] * 3.0, name="Y")
    return C.build(C.create_schedule(Y), [X, Y], name="tiny")


@pytest.mark.parametrize("case", list(_malformed(Kernel("k", b"\x7fELF" + b"\0" * 60, [], C.Target.host()))))
def test_malformed_bytes(tiny, case):
    data, msg = _malformed(tiny)[case]
    with pytest.raises(KernelLoadError, match=msg):
        load_kernel(data)


def test_corrupt_object_code_raises_instead_of_crashing(tiny):
    """LLVM's JIT linker aborts the process on a corrupt object; the runtime checks it first."""
    x, y = np.ones(10, np.float32), _poison(10)
    for obj in (b"\0" * 200, tiny.object_code[:300], b"\x7fELF" + b"\2" * 60):
        k = Kernel("tiny", obj, tiny.args, tiny.target)
        with pytest.raises(KernelLoadError):
            k(x, y)
        assert np.isnan(y).all()
    k = Kernel("other_name", tiny.object_code, tiny.args, tiny.target)
    with pytest.raises(KernelLoadError, match="no function named 'other_name'"):
        k(x, y)


def test_object_for_another_machine_type_rejected(tiny, arm_kernel):
    lie = Kernel("tiny", arm_kernel.object_code, tiny.args, tiny.target)
    with pytest.raises(KernelLoadError, match="ELF machine 183"):
        lie(np.ones(10, np.float32), np.ones(10, np.float32))


# ----------------------------------------------------------------------------- other targets

@pytest.fixture(scope="module")
def arm_kernel():
    s, args = _matmul_schedule()
    return C.build(s, args, target=C.Target.from_string(ARM), name="mm_arm")


def test_aarch64_kernel_is_an_aarch64_elf_object(arm_kernel):
    obj = arm_kernel.object_code
    assert obj[:4] == b"\x7fELF"
    assert obj[4] == 2 and obj[5] == 1                       # 64-bit, little endian
    e_type, e_machine = struct.unpack_from("<HH", obj, 16)
    assert e_type == 1                                        # ET_REL: a relocatable object
    assert e_machine == 183                                   # EM_AARCH64
    assert arm_kernel.target.triple == "aarch64-linux-gnu" and arm_kernel.target.cpu == "cortex-a72"


def test_aarch64_kernel_refuses_to_load_here(arm_kernel, mm_data):
    if C.Target.host().arch == "aarch64":
        pytest.skip("the host is aarch64")
    a, b, _ = mm_data
    c = _poison((M, N))
    with pytest.raises(KernelLoadError, match="aarch64"):
        arm_kernel(a, b, c)
    k2 = load_kernel(arm_kernel.to_bytes())     # the bytes are fine; only running them here is not
    assert k2.target == arm_kernel.target
    with pytest.raises(KernelLoadError, match="compiled for aarch64"):
        k2(a, b, c)
    with pytest.raises(KernelLoadError):
        k2.time_evaluator()(a, b, c)
    assert np.isnan(c).all()


def test_missing_cpu_features_refuse_to_load(tiny):
    host = C.Target.host()
    if host.arch != "x86_64" or host.has_feature("avx512f"):
        pytest.skip("needs an x86_64 host without AVX-512")
    t = C.Target.from_string(f"llvm -mtriple={host.triple} -mcpu=skylake-avx512")
    X = C.placeholder((10,), "float32", "X")
    Y = C.compute((10,), lambda i: X[i] * 3.0, name="Y")
    k = C.build(C.create_schedule(Y), [X, Y], target=t, name="k512")
    with pytest.raises(KernelLoadError, match="avx512f"):
        k(np.ones(10, np.float32), np.ones(10, np.float32))


@pytest.mark.parametrize("text", [
    "", "   ", "cuda", "opencl -device=mali", "llvm -mtriple=nonsense-foo-bar", "llvm -mcpu=znver3",
    "llvm -mattr=+avx2", "llvm -bogus=1", "llvm mtriple=x86_64-linux-gnu", "llvm -num-cores=two",
    "llvm -num-cores=0", "llvm -mtriple=x86_64-linux-gnu -mcpu=not-a-cpu",
    "llvm -mtriple=aarch64-linux-gnu -mcpu=not-a-cpu",
])
def test_unknown_target_strings(text):
    with pytest.raises(TargetError):
        C.Target.from_string(text)


def test_target_errors_from_build(tiny):
    X = C.placeholder((4,), "float32", "X")
    Y = C.compute((4,), lambda i: X[i], name="Y")
    with pytest.raises(TargetError):
        C.build(C.create_schedule(Y), [X, Y], target="llvm -mtriple=nonsense-foo-bar")


def test_target_string_round_trip():
    t = C.Target.from_string(ARM + " -num-cores=4")
    assert C.Target.from_string(str(t)) == t and t.num_cores == 4 and t.arch == "aarch64"
    h = C.Target.host()
    assert C.Target.from_string(str(h)) == h and C.Target.from_string("llvm") == h


# ----------------------------------------------------------------------------- timing

def test_time_evaluator_returns_sane_times(mm, mm_data):
    a, b, ref = mm_data
    c = _poison((M, N))
    res = mm.time_evaluator(number=3, repeat=4)(a, b, c)
    assert len(res.results) == 4
    assert all(0 < t < 0.5 for t in res.results)
    assert res.min <= res.median <= max(res.results) and res.min <= res.mean
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5)    # the timed calls computed the result


def test_time_evaluator_respects_min_repeat_ms(mm, mm_data):
    a, b, _ = mm_data
    c = np.empty((M, N), np.float32)
    t0 = time.perf_counter()
    res = mm.time_evaluator(number=1, repeat=3, min_repeat_ms=25)(a, b, c)
    wall = time.perf_counter() - t0
    assert wall >= 3 * 0.025
    assert len(res.results) == 3 and all(t > 0 for t in res.results)
    assert res.mean < 0.025     # one call of this small kernel is far below the measurement window


def test_time_evaluator_cooldown_and_bad_parameters(mm, mm_data):
    a, b, _ = mm_data
    c = np.empty((M, N), np.float32)
    t0 = time.perf_counter()
    mm.time_evaluator(number=1, repeat=3, cooldown_ms=20)(a, b, c)
    assert time.perf_counter() - t0 >= 0.055
    for kw in ({"number": 0}, {"repeat": 0}):
        with pytest.raises(ValueError):
            mm.time_evaluator(**kw)


# ----------------------------------------------------------------------------- threads

def test_num_threads_1_and_2_give_the_same_correct_result(mm, mm_data):
    a, b, ref = mm_data
    old = get_max_threads()
    try:
        outs = []
        for n in (1, 2, 1, 2):
            C.set_num_threads(n)
            assert get_max_threads() == n
            c = _poison((M, N))
            mm(a, b, c)
            outs.append(c)
        for c in outs:
            np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(outs[0], outs[1])     # same per-element order of additions
    finally:
        C.set_num_threads(old)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2"])
def test_set_num_threads_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        C.set_num_threads(bad)


def _scratch_kernel(in_parallel: bool):
    """y[i] = sum_j (2·x[i, j] + 1) with the elementwise stage a heap scratch buffer: at the root
    (256 KiB, the kernel's own, kept between calls), or per row block inside a parallel loop
    (each thread's, allocated per call)."""
    rows, cols = 64, 1024
    x = C.placeholder((rows, cols), "float32", "x")
    t = C.compute((rows, cols), lambda i, j: x[i, j] * 2.0 + 1.0, name="t")
    j = C.reduce_axis(cols, "j")
    y = C.compute((rows,), lambda i: C.sum(t[i, j.var], axis=[j]), name="y")
    s = C.create_schedule(y)
    if in_parallel:
        io, ii = s[y].split(s[y].op.axis[0], factor=16)   # a 16 x 1024 block: 64 KiB, over the stack's limit
        s[y].parallel(io)
        s[t].compute_at(s[y], io)
    return C.build(s, [x, y]), x.shape


@pytest.mark.parametrize("in_parallel", [False, True])
def test_kept_scratch_buffers_give_right_answers_call_after_call_and_across_threads(in_parallel):
    kernel, shape = _scratch_kernel(in_parallel)
    assert b"_release" in kernel.object_code
    held = {"kernel": kernel}
    del kernel
    rng = np.random.default_rng(5)

    def call(seed):
        x = np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)
        y = np.full(shape[0], np.nan, np.float32)
        held["kernel"](x, y)
        np.testing.assert_allclose(y, (2.0 * x.astype(np.float64) + 1.0).sum(axis=1), rtol=1e-4, atol=1e-3)
        return True

    assert all(call(int(s)) for s in rng.integers(0, 1 << 30, 5))   # each call's own values, none left over
    with ThreadPoolExecutor(4) as pool:   # concurrent calls: each takes its own buffer
        assert all(pool.map(call, range(40)))
    held.clear()
    gc.collect()   # its kept buffers released with it (no crash, no use after the code is gone)


def test_kernels_compile_on_several_threads_at_once():
    """LLVM runs each compiling thread in a context of its own (a model's kernels compile on a
    thread beside the one lowering them); concurrent builds give the kernels built alone."""

    def make(c):
        A = C.placeholder((37, 29), "float32", "A")
        B = C.compute((37, 29), lambda i, j: A[i, j] * float(c) + 1.0, name="B")
        s = C.create_schedule(B)
        s[B].vectorize(s[B].split(s[B].op.axis[1], factor=8)[1])
        return C.build(s, [A, B], name=f"scaled_{c}")

    with ThreadPoolExecutor(max_workers=4) as pool:
        kernels = list(pool.map(make, range(1, 9)))
    a = np.random.default_rng(3).uniform(-2, 2, (37, 29)).astype(np.float32)
    for c, kernel in enumerate(kernels, start=1):
        out = np.full((37, 29), np.nan, np.float32)
        kernel(a, out)
        np.testing.assert_allclose(out, a.astype(np.float64) * c + 1.0, rtol=1e-6)
