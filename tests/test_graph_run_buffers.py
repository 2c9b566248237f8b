"""A run reads its inputs where the caller holds them and hands back outputs it owns no more
(compiler/graph/runtime.py, the call sequence's movable ranges): values right either way, the
caller's arrays never written, every output independent of the next run, of the inputs and of
the other outputs."""

from __future__ import annotations

import numpy as np
import pytest
from graph_models import model, rand
from onnx import helper
from test_call_sequence import elementwise_kernel

from compiler.buffers import aligned_empty
from compiler.call_sequence import CallSequence
from compiler.graph import build_model, from_onnx

RNG = np.random.default_rng(54)


def kv_step(heads=4, past=7, dim=8):
    """A decode step's cache: present = Concat(past, new) on the sequence axis, scores = q·presentᵀ."""
    nodes = [helper.make_node("Concat", ["past", "k"], ["present"], axis=2),
             helper.make_node("Transpose", ["present"], ["pt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "pt"], ["scores"])]
    shapes = {"past": (1, heads, past, dim), "k": (1, heads, 1, dim), "q": (1, heads, 1, dim)}
    m = model(nodes, {n: (s, "float32") for n, s in shapes.items()},
              {"present": (None, "float32"), "scores": (None, "float32")})

    def reference(past, k, q):
        present = np.concatenate([past, k], axis=2)
        return present, q.astype(np.float64) @ present.transpose(0, 1, 3, 2)
    return m, shapes, reference


def feeds_of(shapes):
    return {n: rand(RNG, s, lo=-1) for n, s in shapes.items()}


def test_outputs_are_right_and_belong_to_the_caller():
    m, shapes, reference = kv_step()
    module = build_model(from_onnx(m))
    f1, f2 = feeds_of(shapes), feeds_of(shapes)
    kept = {n: a.copy() for n, a in f1.items()}
    present1, scores1 = module.run(**f1)
    for n, a in f1.items():
        np.testing.assert_array_equal(a, kept[n])          # the caller's arrays are never written
    want_present, want_scores = reference(**f1)
    np.testing.assert_array_equal(present1, want_present)
    np.testing.assert_allclose(scores1, want_scores, rtol=1e-5, atol=1e-6)
    saved = present1.copy(), scores1.copy()
    present2, scores2 = module.run(**f2)                  # a second run leaves the first's outputs
    np.testing.assert_array_equal(present1, saved[0])
    np.testing.assert_array_equal(scores1, saved[1])
    np.testing.assert_array_equal(present2, reference(**f2)[0])
    for a in (present1, scores1):
        for b in (present2, scores2, *f1.values(), *f2.values()):
            assert not np.shares_memory(a, b)
    present2[...] = 0                                      # writable, and the module does not care
    np.testing.assert_array_equal(module.run(**f2)[0], reference(**f2)[0])


def test_inputs_are_read_where_they_lie_and_copied_only_when_they_must_be():
    x_shape = (6, 10)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "w"], ["y"])]
    m = model(nodes, {"x": (x_shape, "float32"), "w": (x_shape, "float32")}, {"y": (None, "float32")})
    module = build_model(from_onnx(m))
    for block in module._blocks:
        block[:] = 0xFF                                   # the module's own input buffers: poisoned
    x, w = rand(RNG, x_shape, lo=-1), rand(RNG, x_shape, lo=-1)
    (y,) = module.run(x=x, w=w)
    np.testing.assert_allclose(y, np.maximum(x, 0) * w, rtol=1e-6)
    assert np.isnan(module._inputs["x"]).all(), "a contiguous input was copied in"
    # not contiguous (a transposed view): copied into the module's buffer, same values
    xt = np.ascontiguousarray(x.T).T
    (y2,) = module.run(x=xt, w=w)
    assert not xt.flags.c_contiguous
    np.testing.assert_allclose(y2, np.maximum(x, 0) * w, rtol=1e-6)
    np.testing.assert_array_equal(module._inputs["x"], x)


def test_an_output_that_is_an_input_or_another_output_is_its_own_array():
    nodes = [helper.make_node("Identity", ["x"], ["same"]), helper.make_node("Neg", ["x"], ["n"]),
             helper.make_node("Reshape", ["n", "shape"], ["n_flat"])]
    m = model(nodes, {"x": ((3, 5), "float32")}, {"same": (None, "float32"), "n": (None, "float32"),
                                                   "n_flat": (None, "float32")},
              {"shape": np.array([15], np.int64)})
    module = build_model(from_onnx(m))
    x = rand(RNG, (3, 5), lo=-1)
    same, n, n_flat = module.run(x=x)
    np.testing.assert_array_equal(same, x)
    np.testing.assert_array_equal(n, -x)
    np.testing.assert_array_equal(n_flat, -x.reshape(15))
    assert not np.shares_memory(same, x) and not np.shares_memory(n, n_flat)
    n[...] = 7
    np.testing.assert_array_equal(n_flat, -x.reshape(15))


def test_a_sequence_reads_its_movable_ranges_from_the_bases_given_per_call():
    shape = (9, 13)
    add = elementwise_kernel(shape, lambda v: v + 1.5, "mv_add")
    mul = elementwise_kernel(shape, lambda v: v * -2.0, "mv_mul", parallel=True)
    a, b, c = (aligned_empty(shape, np.float32) for _ in range(3))
    a[...] = RNG.uniform(-3, 3, shape)
    seq = CallSequence([add, mul], [[a.ctypes.data, b.ctypes.data], [b.ctypes.data, c.ctypes.data]],
                       movable=[(a.ctypes.data, a.nbytes), (c.ctypes.data, c.nbytes)])
    seq.run()                                             # no bases: the ranges where they were made
    np.testing.assert_allclose(c, (a + 1.5) * -2.0, rtol=1e-6)
    a2 = RNG.uniform(-3, 3, shape).astype(np.float32)
    c2 = np.full(shape, np.nan, np.float32)
    c_before = c.copy()
    seq.run(np.array([a2.ctypes.data, c2.ctypes.data], np.uint64))
    np.testing.assert_allclose(c2, (a2 + 1.5) * -2.0, rtol=1e-6)
    np.testing.assert_array_equal(c, c_before)            # the range moved: its old place untouched
    stamps = np.zeros(3, np.int64)
    c3 = np.full(shape, np.nan, np.float32)
    seq.run_timed(stamps, np.array([a2.ctypes.data, c3.ctypes.data], np.uint64))
    np.testing.assert_array_equal(c3, c2)
    with pytest.raises(ValueError, match="bases"):
        seq.run(np.array([a2.ctypes.data], np.uint64))
    with pytest.raises(ValueError, match="overlap"):
        CallSequence([add], [[a.ctypes.data, b.ctypes.data]], movable=[(a.ctypes.data, 64), (a.ctypes.data + 32, 64)])


def test_output_storage_is_taken_again_only_once_the_caller_dropped_every_view_of_it():
    m, shapes, reference = kv_step()
    module = build_model(from_onnx(m))
    f = feeds_of(shapes)
    present, scores = module.run(**f)
    first = present.ctypes.data
    row = scores[0, 1]                                    # a view the caller made: keeps the storage
    del present, scores
    present2, _ = module.run(**f)
    assert present2.ctypes.data != first                  # `row` still refers to the first run's
    np.testing.assert_allclose(row, reference(**f)[1][0, 1], rtol=1e-5, atol=1e-6)
    second = present2.ctypes.data
    del row, present2, _
    for _ in range(3):                                    # dropped at once: the same storage again
        present3, scores3 = module.run(**f)
        assert present3.ctypes.data in (first, second)
        np.testing.assert_array_equal(present3, reference(**f)[0])
        del present3, scores3
    kept = [module.run(**f) for _ in range(4)]            # kept: each run its own storage
    assert len({outs[0].ctypes.data for outs in kept}) == 4
    for outs in kept:
        np.testing.assert_array_equal(outs[0], reference(**f)[0])
