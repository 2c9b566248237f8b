"""Kernels are timed on 64-byte-aligned buffers (compiler/buffers.py), whatever the caller passes."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.buffers import ALIGNMENT, aligned_copy, aligned_empty, is_aligned
from compiler.ops import build_op, get_op
from compiler.timing import TimingOptions
from compiler.verify import poisoned

QUICK = TimingOptions(min_samples=3, max_seconds=0.05)


def off_line(arr: np.ndarray, offset: int = 16) -> np.ndarray:
    """A copy of `arr` whose data starts `offset` bytes past a 64-byte boundary."""
    raw = aligned_empty(arr.nbytes + ALIGNMENT, np.uint8)
    out = raw[offset:offset + arr.nbytes].view(arr.dtype).reshape(arr.shape)
    out[...] = arr
    assert out.ctypes.data % ALIGNMENT == offset
    return out


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4), ()])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "int32", "bool"])
def test_aligned_empty_starts_on_a_cache_line(shape, dtype):
    a = aligned_empty(shape, dtype)
    assert a.shape == shape and a.dtype == np.dtype(dtype)
    assert is_aligned(a) and a.flags.c_contiguous and a.flags.writeable


def test_aligned_copy_keeps_an_aligned_array_and_copies_others():
    a = aligned_empty((4, 4), "float32")
    assert aligned_copy(a) is a
    b = off_line(np.arange(16, dtype=np.float32).reshape(4, 4))
    c = aligned_copy(b)
    assert c is not b and is_aligned(c) and np.array_equal(c, b)


@pytest.fixture(scope="module")
def matmul():
    opdef = get_op("matmul", M=37, N=29, K=23)
    return opdef, build_op(opdef)


def spy_pointers(kernel, monkeypatch) -> list:
    """Record the argument pointers of every call of the kernel's native function (its arguments,
    not the error record every call passes last)."""
    seen: list = []
    real = kernel._load

    def load():
        fn = real()

        def call(*ptrs):
            seen.append(ptrs[:len(kernel.args)])
            return fn(*ptrs)
        return call
    monkeypatch.setattr(kernel, "_load", load)
    return seen


@pytest.mark.parametrize("how", ["measure", "time_evaluator"])
def test_a_timing_runs_on_aligned_buffers_and_writes_outputs_back(matmul, monkeypatch, how):
    opdef, kernel = matmul
    rng = np.random.default_rng(1)
    a = off_line(rng.uniform(-1, 1, (37, 23)).astype(np.float32), 16)
    b = off_line(rng.uniform(-1, 1, (23, 29)).astype(np.float32), 48)
    out = off_line(poisoned((37, 29), "float32"), 32)
    seen = spy_pointers(kernel, monkeypatch)
    if how == "measure":
        kernel.measure(a, b, out, options=QUICK)
    else:
        kernel.time_evaluator(number=2, repeat=2)(a, b, out)
    assert seen and all(p % ALIGNMENT == 0 for ptrs in seen for p in ptrs)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-5)
    assert out.ctypes.data % ALIGNMENT == 32   # the caller's own array, filled in


def test_a_timing_of_aligned_arrays_uses_them_as_they_are(matmul, monkeypatch):
    opdef, kernel = matmul
    arrays = [aligned_empty(t.shape, t.dtype) for t in opdef.tensors]
    for arr in arrays[:-1]:
        arr[...] = 0.5
    seen = spy_pointers(kernel, monkeypatch)
    kernel.measure(*arrays, options=QUICK)
    assert set(seen) == {tuple(arr.ctypes.data for arr in arrays)}
    assert np.allclose(arrays[-1], 0.25 * 23)
