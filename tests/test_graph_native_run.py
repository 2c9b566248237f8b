"""A model's run() entered as a native builtin (compiler/graph/native_run.py): the same outputs
as the checked Python way, outputs the caller keeps never written again, and every input the
entry does not take as it is (a view, a subclass, another dtype object, a wrong name) handed to
the Python way, which copies it or refuses it with a clear error."""

from __future__ import annotations

import os
import pickle
import threading
import warnings

import numpy as np
import pytest
from graph_models import model, rand
from onnx import helper

from compiler.errors import KernelRuntimeError
from compiler.graph import build_model, from_onnx
from compiler.graph import native_run as native_module
from compiler.graph.errors import InputError
from compiler.graph.native_run import abi

RNG = np.random.default_rng(77)

needs_abi = pytest.mark.skipif(abi() is None, reason="this Python's object layout is not the one the entry reads")


def mlp(batch=3, features=37, hidden=19, classes=5):
    """MatMul+Add+Relu, MatMul+Add: sizes that divide no tile; small outputs (held storage)."""
    w1, b1 = rand(RNG, (features, hidden), lo=-1), rand(RNG, (hidden,), lo=-1)
    w2, b2 = rand(RNG, (hidden, classes), lo=-1), rand(RNG, (classes,), lo=-1)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["o"]),
             helper.make_node("Add", ["o", "b2"], ["y"])]
    m = model(nodes, {"x": ((batch, features), "float32")}, {"y": (None, "float32")},
              {"w1": w1, "b1": b1, "w2": w2, "b2": b2})

    def reference(x):
        h = np.maximum(x.astype(np.float64) @ w1 + b1, 0)
        return h @ w2 + b2
    return m, (batch, features), reference


def check(y, want):
    """float32 sums of a few hundred products against float64: within 1e-5 of the largest."""
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * max(np.abs(want).max(), 1.0))


@needs_abi
def test_run_is_the_native_builtin_and_matches_numpy():
    m, shape, reference = mlp()
    module = build_model(from_onnx(m))
    x = rand(RNG, shape, lo=-1)
    (y,) = module.run(x=x)
    check(y, reference(x))
    assert module._native and module._native.methods
    assert type(module.run).__name__ == "builtin_function_or_method"
    for _ in range(5):   # the held outputs, recycled once dropped, are written anew each time
        x = rand(RNG, shape, lo=-1)
        (y,) = module.run(x=x)
        check(y, reference(x))


@needs_abi
def test_outputs_the_caller_keeps_are_never_written_again():
    m, shape, reference = mlp()
    module = build_model(from_onnx(m))
    xs = [rand(RNG, shape, lo=-1) for _ in range(4)]
    kept = [module.run(x=x)[0] for x in xs[:2]]            # arrays kept
    view = module.run(x=xs[2])[0][1:]                      # a view kept: holds its base
    listed = module.run(x=xs[3])                           # the list kept
    for _ in range(3):
        module.run(x=rand(RNG, shape, lo=-1))
    for y, x in zip(kept, xs):
        check(y, reference(x))
    check(view, reference(xs[2])[1:])
    check(listed[0], reference(xs[3]))
    assert len({id(y) for y in kept} | {id(listed[0])}) == 3


@needs_abi
def test_inputs_the_entry_declines_take_the_checked_way():
    m, shape, reference = mlp()
    module = build_model(from_onnx(m))
    x = rand(RNG, shape, lo=-1)
    want = reference(x)
    wide = np.zeros((shape[0], shape[1] * 2), np.float32)
    wide[:, ::2] = x
    check(module.run(x=wide[:, ::2])[0], want)            # not contiguous: copied

    class Tagged(np.ndarray):
        pass
    check(module.run(x=x.view(Tagged))[0], want)           # a subclass
    unpickled = pickle.loads(pickle.dumps(x))              # an equal dtype in another object
    assert id(unpickled.dtype) != id(np.dtype(np.float32))
    check(module.run(x=unpickled)[0], want)
    with pytest.raises(InputError, match="dtype"):
        module.run(x=x.astype(">f4"))
    with pytest.raises(InputError, match="dtype"):
        module.run(x=x.astype(np.float64))
    with pytest.raises(InputError, match="shape"):
        module.run(x=x[:2])
    with pytest.raises(InputError, match="missing"):
        module.run()
    with pytest.raises(InputError, match="unknown"):
        module.run(x=x, z=x)
    with pytest.raises(InputError, match="numpy array"):
        module.run(x=x.tolist())
    with pytest.raises(TypeError, match="by name"):
        module.run(x)
    check(module.run(x=x)[0], want)                        # and the entry still runs


@needs_abi
def test_a_kernel_that_fails_in_the_entry_names_its_node():
    table = rand(RNG, (5, 3), lo=-1)
    m = model([helper.make_node("Gather", ["table", "idx"], ["rows"], axis=0)],
              {"idx": ((4,), "int64")}, {"rows": (None, "float32")}, {"table": table})
    module = build_model(from_onnx(m))
    np.testing.assert_array_equal(module.run(idx=np.array([0, 4, -1, 2]))[0], table[[0, 4, -1, 2]])
    with pytest.raises(KernelRuntimeError, match="Gather node") as e:
        module.run(idx=np.array([0, 7, 1, 1]))
    assert e.value.value == 7
    np.testing.assert_array_equal(module.run(idx=np.array([3, 3, 0, 1]))[0], table[[3, 3, 0, 1]])


@needs_abi
def test_large_outputs_come_from_the_arena_and_stay_the_callers():
    shape = (96, 256)   # 96 KB out: above the held storage's limit
    m = model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])],
              {"x": (shape, "float32")}, {"y": (None, "float32"), "r": (None, "float32")})
    module = build_model(from_onnx(m))
    x1, x2 = rand(RNG, shape, lo=-1), rand(RNG, shape, lo=-1)
    y1, r1 = module.run(x=x1)
    assert not module._native.methods
    y2, r2 = module.run(x=x2)
    np.testing.assert_array_equal(y1, -np.maximum(x1, 0))
    np.testing.assert_array_equal(r2, np.maximum(x2, 0))
    assert not np.shares_memory(y1, y2)


def test_without_the_entry_a_model_runs_through_ctypes(monkeypatch):
    monkeypatch.setattr(native_module, "abi", lambda: None)
    m, shape, reference = mlp()
    module = build_model(from_onnx(m))
    x = rand(RNG, shape, lo=-1)
    check(module.run(x=x)[0], reference(x))
    assert module._native is False
    with pytest.raises(InputError, match="shape"):
        module.run(x=x[:1])
    prof = module.profile({"x": x}, repeat=3)
    assert prof.run_seconds > 0 and len(prof.kernels) == len(module.steps)


@needs_abi
def test_a_profile_times_the_entry_and_reads_its_stamps():
    m, shape, _ = mlp(batch=16, features=300, hidden=200)
    module = build_model(from_onnx(m))
    x = rand(RNG, shape, lo=-1)
    prof = module.profile({"x": x}, repeat=5)
    assert all(k.seconds > 0 for k in prof.kernels)
    assert prof.sequence_seconds > 0 and prof.overhead_seconds >= 0
    stamps = np.zeros(len(module.steps) + 1, np.int64)
    with pytest.raises(TypeError, match="inputs, stamps"):
        module.run_timed({"x": x})
    with pytest.raises(ValueError, match="stamps"):   # a wrong stamps array: the checked way says so
        module.run_timed({"x": x}, np.zeros(2, np.int64))
    (y,) = module.run_timed({"x": x}, stamps)
    assert (np.diff(stamps) >= 0).all() and stamps[-1] > stamps[0]


@needs_abi
def test_threads_each_with_its_module_run_at_once():
    m, shape, reference = mlp(batch=8, features=200, hidden=120)
    errors = []

    def work():
        module = build_model(from_onnx(m))
        try:
            for _ in range(50):
                x = rand(np.random.default_rng(), shape, lo=-1)
                check(module.run(x=x)[0], reference(x))
        except AssertionError as e:   # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@needs_abi
def test_a_forked_child_runs_the_model_on_one_thread():
    m, shape, reference = mlp(batch=64, features=256, hidden=256)
    module = build_model(from_onnx(m))
    x = rand(RNG, shape, lo=-1)
    check(module.run(x=x)[0], reference(x))                # the parent's pool is running
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # pragma: no cover - the child
        ok = False
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                y = module.run(x=x)[0]
                want = reference(x)
                ok = np.allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
                forked = sum("forked" in str(c.message) for c in caught)
            os.write(w, b"ok" if ok and forked <= 1 else b"no")
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 2)
    os.waitpid(pid, 0)
    assert got == b"ok"


@needs_abi
@pytest.mark.parametrize("shape", [(3, 37), (96, 256)], ids=["held outputs", "arena outputs"])
def test_a_dropped_model_is_freed_at_once(shape):
    """Nothing the entry keeps refers back to the module: its buffers go with its last
    reference, not at the cycle collector's next pass."""
    import gc
    import weakref
    m = model([helper.make_node("Relu", ["x"], ["y"])], {"x": (shape, "float32")}, {"y": (None, "float32")})
    module = build_model(from_onnx(m))
    x = rand(RNG, shape, lo=-1)
    (y,) = module.run(x=x)
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    gone = weakref.ref(module)
    gc.disable()
    try:
        del module
        assert gone() is None
    finally:
        gc.enable()
    np.testing.assert_array_equal(y, np.maximum(x, 0))   # the caller's output outlives it


@needs_abi
def test_a_kept_run_of_a_freed_model_still_runs_or_says_why():
    m, shape, reference = mlp()
    module = build_model(from_onnx(m))
    x = rand(RNG, shape, lo=-1)
    module.run(x=x)
    run = module.run
    del module
    check(run(x=x)[0], reference(x))                       # the entry keeps what its code needs
    with pytest.raises(ReferenceError, match="freed"):
        run(x=x[:1])                                       # the checked way needs the model


@needs_abi
def test_a_bound_run_taken_before_the_first_call_keeps_the_entry():
    m, shape, reference = mlp()
    module = build_model(from_onnx(m))
    run = module.run                                       # GraphModule.run, bound
    x = rand(RNG, shape, lo=-1)
    check(run(x=x)[0], reference(x))
    calls = []
    module._run = lambda inputs, stamps: calls.append(1)  # the checked way, watched
    check(run(x=x)[0], reference(x))
    assert not calls
