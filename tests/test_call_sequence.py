"""A list of kernel calls compiled into one native call: same results as calling each kernel,
in order, and a failing kernel named with the later ones not run."""

from __future__ import annotations

import numpy as np
import pytest

import compiler as C
from compiler.buffers import aligned_empty
from compiler.call_sequence import CallSequence
from compiler.errors import KernelRuntimeError
from compiler.runtime import ArgSpec, Kernel, compile_module
from compiler.target import Target


def elementwise_kernel(shape, fn, name, parallel=False):
    X = C.placeholder(shape, "float32", "X")
    Y = C.compute(shape, lambda i, j: fn(X[i, j]), name="Y")
    s = C.create_schedule(Y)
    if parallel:
        s[Y].parallel(s[Y].root_iter_vars[0])
    return C.build(s, [X, Y], name=name)


def _failing_kernel(status: int) -> Kernel:
    """A hand-written kernel that writes its output and returns `status` (as an out-of-memory
    kernel returns KERNEL_OUT_OF_MEMORY)."""
    from llvmlite import ir
    mod = ir.Module(name="failing")
    f = ir.Function(mod, ir.FunctionType(ir.IntType(32), [ir.IntType(8).as_pointer()]), name="always_fails")
    b = ir.IRBuilder(f.append_basic_block())
    b.store(ir.Constant(ir.IntType(8), 7), f.args[0])
    b.ret(ir.Constant(ir.IntType(32), status))
    host = Target.host()
    return Kernel("always_fails", compile_module(mod, host), [ArgSpec("flag", (1,), "uint8")], host)


def test_sequence_runs_the_calls_in_order_on_their_buffers():
    rng = np.random.default_rng(0)
    shape = (37, 29)                               # odd sizes, the second kernel parallel
    add = elementwise_kernel(shape, lambda x: x + 1.5, "seq_add")
    mul = elementwise_kernel(shape, lambda x: x * -2.0, "seq_mul", parallel=True)
    a = aligned_empty(shape, np.float32)
    a[...] = rng.uniform(-3, 3, shape).astype(np.float32)
    b = aligned_empty(shape, np.float32)
    c = aligned_empty(shape, np.float32)
    b.fill(np.nan)
    c.fill(np.nan)
    seq = CallSequence([add, mul], [[a.ctypes.data, b.ctypes.data], [b.ctypes.data, c.ctypes.data]])
    assert len(seq) == 2
    seq.run()
    np.testing.assert_allclose(c, (a.astype(np.float64) + 1.5) * -2.0, rtol=1e-6)
    a[...] = rng.uniform(-3, 3, shape).astype(np.float32)   # the same pointers see new data
    seq.run()
    np.testing.assert_allclose(c, (a.astype(np.float64) + 1.5) * -2.0, rtol=1e-6)


def test_a_failing_call_is_named_and_stops_the_sequence():
    shape = (8, 8)
    add = elementwise_kernel(shape, lambda x: x + 1.0, "seq_add_after")
    fails = _failing_kernel(8)   # a status the runtime has no words for
    flag = aligned_empty((1,), np.uint8)
    x = aligned_empty(shape, np.float32)
    x.fill(1.0)
    y = aligned_empty(shape, np.float32)
    y.fill(np.nan)
    seq = CallSequence([fails, add], [[flag.ctypes.data], [x.ctypes.data, y.ctypes.data]])
    with pytest.raises(KernelRuntimeError, match=r"always_fails \(call 0 of 2\) failed: status 8") as info:
        seq.run()
    assert info.value.status == 8
    assert flag[0] == 7                # the failing kernel ran
    assert np.isnan(y).all()           # the one after it did not


def test_pointer_lists_must_match_the_kernels():
    add = elementwise_kernel((4, 4), lambda x: x + 1.0, "seq_add_check")
    with pytest.raises(ValueError, match="2 kernels but 1 argument lists"):
        CallSequence([add, add], [[0, 0]])
    with pytest.raises(ValueError, match="takes 2 pointers, got 1"):
        CallSequence([add], [[0]])


def test_the_timed_sequence_runs_the_same_calls_and_stamps_each():
    rng = np.random.default_rng(1)
    shape = (53, 31)
    add = elementwise_kernel(shape, lambda x: x + 0.5, "timed_add")
    mul = elementwise_kernel(shape, lambda x: x * 3.0, "timed_mul", parallel=True)
    a = aligned_empty(shape, np.float32)
    a[...] = rng.uniform(-2, 2, shape).astype(np.float32)
    b, c = aligned_empty(shape, np.float32), aligned_empty(shape, np.float32)
    b.fill(np.nan)
    c.fill(np.nan)
    seq = CallSequence([add, mul], [[a.ctypes.data, b.ctypes.data], [b.ctypes.data, c.ctypes.data]])
    stamps = np.zeros(3, np.int64)
    seq.run_timed(stamps)
    np.testing.assert_allclose(c, (a.astype(np.float64) + 0.5) * 3.0, rtol=1e-6)
    assert stamps[0] > 0 and np.all(np.diff(stamps) >= 0)     # the monotonic clock, in call order
    first = stamps.copy()
    seq.run_timed(stamps)
    assert stamps[0] >= first[2]
    with pytest.raises(ValueError, match="contiguous int64 array of 3"):
        seq.run_timed(np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="int64"):
        seq.run_timed(np.zeros(3, np.float64))


def test_the_timed_sequence_names_a_failing_call_too():
    flag = np.zeros(1, np.uint8)
    seq = CallSequence([_failing_kernel(3)], [[flag.ctypes.data]])
    with pytest.raises(KernelRuntimeError, match="always_fails"):
        seq.run_timed(np.zeros(2, np.int64))
