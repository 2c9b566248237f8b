"""Indices read from data are checked at run time (issue 54): a bad one is a KernelRuntimeError
naming the read (a custom compute's stage, a model's node), the value and the valid range, in
scalar, vectorized, parallel and fused code; never a clamped or wrapped row. Inputs are random
and non-zero, outputs poisoned before each call, answers compared with numpy."""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest
from graph_models import model, rand
from onnx import helper

import compiler as C
from compiler import serialize
from compiler.graph import build_model, export_model, from_onnx
from compiler.index_checks import IndexCheck
from compiler.runtime import load_kernel

RNG = np.random.default_rng(54)


def _poisoned(shape):
    return np.full(shape, np.nan, np.float32)


def _raises(call, pattern: str) -> C.KernelRuntimeError:
    with pytest.raises(C.KernelRuntimeError, match=pattern) as info:
        call()
    return info.value


# ----------------------------------------------------------------------------- custom computes

@pytest.fixture(scope="module")
def embed():
    """out[i, j] = T[idx[i], j]: rows parallel (2 threads), columns vectorized."""
    T = C.placeholder((50, 16), "float32", "T")
    idx = C.placeholder((512,), "int32", "idx")
    out = C.compute((512, 16), lambda i, j: T[idx[i], j], name="embed")
    s = C.create_schedule(out)
    io, _ = s[out].split(out.op.axis[0], 64)
    s[out].parallel(io)
    s[out].vectorize(out.op.axis[1])
    return C.build(s, [T, idx, out])


def test_an_index_out_of_range_is_an_error_naming_the_read(embed):
    table = rand(RNG, (50, 16))
    ids = RNG.integers(0, 50, 512).astype(np.int32)
    assert embed.parallel and embed.checks == [IndexCheck("embed: T[int64(idx[i]), j] dimension 0", 0, 50)]
    for bad in (50, 10**9, -1, -(2**31)):
        wrong = ids.copy()
        wrong[RNG.integers(0, 512)] = bad
        out = _poisoned((512, 16))
        e = _raises(lambda: embed(table, wrong, out),
                    rf"^kernel main failed: embed: T\[int64\(idx\[i\]\), j\] dimension 0: index {bad} is out of "
                    r"range \[0, 50\)$")
        assert (e.status, e.value, e.check.lo, e.check.hi) == (C.codegen_llvm.KERNEL_INDEX_OUT_OF_RANGE, bad, 0, 50)
    out = _poisoned((512, 16))          # the next call with good indices computes everything
    embed(table, ids, out)
    np.testing.assert_array_equal(out, table[ids])


@pytest.mark.parametrize("vectorized", [False, True])
def test_a_gather_from_a_one_row_table_checks_its_index(vectorized):
    """A table of one row takes index 0 only, which the index arithmetic can prove of any index
    it lets through; the check must stay all the same (a row 1 or 10^9 is an error, not row 0)."""
    T = C.placeholder((1, 16), "float32", "T")
    idx = C.placeholder((40,), "int64", "idx")
    out = C.compute((40, 16), lambda i, j: T[idx[i], j] * 2.0, name="one_row")
    s = C.create_schedule(out)
    if vectorized:
        s[out].vectorize(out.op.axis[1])
    kernel = C.build(s, [T, idx, out])
    assert [(c.lo, c.hi) for c in kernel.checks] == [(0, 1)]
    table, ids = rand(RNG, (1, 16)), np.zeros(40, np.int64)
    for bad in (1, 10**9, -1):
        wrong = ids.copy()
        wrong[RNG.integers(0, 40)] = bad
        _raises(lambda: kernel(table, wrong, _poisoned((40, 16))), rf"index {bad} is out of range \[0, 1\)$")
    got = _poisoned((40, 16))
    kernel(table, ids, got)
    np.testing.assert_array_equal(got, np.repeat(table * 2.0, 40, axis=0))


def test_several_threads_failing_at_once_report_one_of_their_indices(embed):
    """Bad indices in every chunk of the parallel loop: one is reported, none lost."""
    C.set_num_threads(2)
    table = rand(RNG, (50, 16))
    ids = RNG.integers(0, 50, 512).astype(np.int32)
    bad = {7: 60, 100: -4, 300: 99, 511: 1000}
    for pos, value in bad.items():
        ids[pos] = value
    for _ in range(20):
        e = _raises(lambda: embed(table, ids, _poisoned((512, 16))), "out of range")
        assert e.value in bad.values()


def test_vector_lanes_with_their_own_indices_are_checked_under_the_mask():
    """The index varies across the lanes (a gather); a masked tail (37 columns in vectors of 8)
    never checks the lanes past the end, which read idx[37..39] only under the mask."""
    T = C.placeholder((20, 6), "float32", "T")
    idx = C.placeholder((37,), "int64", "idx")
    out = C.compute((6, 37), lambda r, c: T[idx[c], r], name="cols")
    s = C.create_schedule(out)
    _, ci = s[out].split(out.op.axis[1], 8)
    s[out].vectorize(ci)
    k = C.build(s, [T, idx, out])
    table, ids = rand(RNG, (20, 6)), RNG.integers(0, 20, 37)
    got = _poisoned((6, 37))
    k(table, ids, got)
    np.testing.assert_array_equal(got, table[ids].T)
    ids[36] = 20
    e = _raises(lambda: k(table, ids, _poisoned((6, 37))), r"cols: T\[idx\[c\], r\] dimension 0: index 20 ")
    assert e.value == 20


def test_an_embedding_bag_with_a_reduction_over_gathered_rows():
    """bag[b, d] = sum_k T[idx[b, k], d]: the check sits inside a reduction, rows parallel."""
    T = C.placeholder((30, 24), "float32", "T")
    idx = C.placeholder((64, 5), "int64", "idx")
    k = C.reduce_axis((0, 5), "k")
    bag = C.compute((64, 24), lambda b, d: C.sum(T[idx[b, k], d], axis=k), name="bag")
    s = C.create_schedule(bag)
    s[bag].parallel(bag.op.axis[0])
    s[bag].vectorize(bag.op.axis[1])
    kern = C.build(s, [T, idx, bag])
    table, ids = rand(RNG, (30, 24)), RNG.integers(0, 30, (64, 5))
    got = _poisoned((64, 24))
    kern(table, ids, got)
    np.testing.assert_allclose(got, table[ids].sum(axis=1), rtol=1e-5)
    ids[40, 3] = 31
    _raises(lambda: kern(table, ids, _poisoned((64, 24))), r"^kernel main failed: bag: T\[idx\[b, k\], d\] "
            r"dimension 0: index 31 is out of range \[0, 30\)$")
    ids[40, 3] = 29
    kern(table, ids, got)
    np.testing.assert_allclose(got, table[ids].sum(axis=1), rtol=1e-5)


def test_a_guarded_gather_checks_only_where_its_guard_holds():
    """select(idx >= 0, T[idx], 0): a -1 (padding) is never read, so it is no error."""
    T = C.placeholder((10,), "float32", "T")
    idx = C.placeholder((16,), "int64", "idx")
    out = C.compute((16,), lambda i: C.if_then_else(idx[i] >= 0, T[idx[i]], 0.0), name="padded")
    s = C.create_schedule(out)
    s[out].vectorize(out.op.axis[0])
    k = C.build(s, [T, idx, out])
    table, ids = rand(RNG, (10,)), RNG.integers(-1, 10, 16)
    got = _poisoned((16,))
    k(table, ids, got)
    np.testing.assert_array_equal(got, np.where(ids >= 0, table[np.maximum(ids, 0)], 0))
    ids[3] = 10
    _raises(lambda: k(table, ids, got), "index 10 is out of range")


def test_checks_survive_serialization():
    """The kernel's checks travel in its header; a DAG with a checked index keeps its key."""
    T = C.placeholder((8, 4), "float32", "T")
    idx = C.placeholder((3,), "int64", "idx")
    out = C.compute((3, 4), lambda i, j: T[C.checked_index(idx[i], -8, 8, "lookup") % 8, j], name="o")
    k = load_kernel(C.build(C.create_schedule(out), [T, idx, out]).to_bytes())
    assert k.checks == [IndexCheck("lookup", -8, 8)]
    table = rand(RNG, (8, 4))
    got = _poisoned((3, 4))
    k(table, np.array([-8, 7, -1]), got)
    np.testing.assert_array_equal(got, table[[-8, 7, -1]])
    _raises(lambda: k(table, np.array([0, 8, 0]), got), r"lookup: index 8 is out of range \[-8, 8\)")
    doc = serialize.dag_to_json([out], [T, idx])
    _, outputs = serialize.dag_from_json(doc)
    assert C.workload_key(outputs) == C.workload_key([out])


# ----------------------------------------------------------------------------- models

@pytest.fixture(scope="module")
def gather():
    """Add (elementwise, a run-time bias) then Gather (injective): one fused group, the Gather
    its second node."""
    table = rand(RNG, (5, 6))
    nodes = [helper.make_node("Add", ["table", "bias"], ["biased"], name="add0"),
             helper.make_node("Gather", ["biased", "ids"], ["y"], name="lookup", axis=0)]
    m = model(nodes, {"ids": ((2, 3), "int64"), "bias": ((6,), "float32")}, {"y": ((2, 3, 6), "float32")},
              {"table": table})
    return build_model(from_onnx(m)), table, rand(RNG, (6,))


def test_model_gather_wraps_negative_indices_once_and_refuses_the_rest(gather):
    module, table, bias = gather
    biased = table + bias
    assert len(module.steps) == 1 and [n.op_type for n in module.steps[0].group.group.nodes] == ["Add", "Gather"]
    ids = np.array([[-5, -1, 0], [4, 2, -3]])
    np.testing.assert_allclose(module.run(ids=ids, bias=bias)[0], biased[ids], rtol=1e-6)
    for bad in (7, 5, -6, -(10**12)):
        wrong = ids.copy()
        wrong[1, 1] = bad
        e = _raises(lambda: module.run(ids=wrong, bias=bias),
                    rf"^Gather node 'lookup': index {bad} in its indices is out of range \[-5, 5\) \(kernel tf_\w+, "
                    r"step 0 of 1\); the run's outputs were not returned$")
        assert (e.node, e.op_type, e.value, e.call) == ("lookup", "Gather", bad, 0)
    np.testing.assert_allclose(module.run(ids=ids[::-1].copy(), bias=bias)[0], biased[ids[::-1]], rtol=1e-6)


def test_model_export_returns_the_index_error_and_names_the_node(gather, tmp_path):
    module, table, bias = gather
    biased = table + bias
    done = export_model(module, tmp_path / "libgath.so")
    header = done.header.read_text()
    assert "const char* gath_error(const gath_model* model, int64_t* index);" in header and "2 when an index" in header
    lib = ctypes.CDLL(str(done.library))
    lib.gath_create.restype = ctypes.c_void_p
    lib.gath_error.restype = ctypes.c_char_p
    lib.gath_destroy.argtypes = [ctypes.c_void_p]
    handle = ctypes.c_void_p(lib.gath_create())
    try:
        ids, out = np.array([[-5, -1, 0], [4, 2, -3]]), _poisoned((2, 3, 6))

        def run():
            return lib.gath_run(handle, *(ctypes.c_void_p(a.ctypes.data) for a in (ids, bias, out)))
        assert run() == 0
        np.testing.assert_allclose(out, biased[ids], rtol=1e-6)
        assert lib.gath_error(handle, None) is None
        ids[0, 2], out[...] = 9, np.nan
        assert run() == 2
        value = ctypes.c_int64()
        assert lib.gath_error(handle, ctypes.byref(value)).decode() == \
            "Gather node 'lookup': indices, valid range [-5, 5)"
        assert value.value == 9 and np.isnan(out).all()     # no output written
    finally:
        lib.gath_destroy(handle)


def test_the_check_is_structural_so_repeated_layers_share_a_workload():
    """Two Gather + Relu layers with other names: one workload key, each error names its node."""
    nodes = [helper.make_node("Gather", ["t1", "a"], ["g1"], name="first"),
             helper.make_node("Relu", ["g1"], ["y1"], name="r1"),
             helper.make_node("Gather", ["t2", "b"], ["g2"], name="second"),
             helper.make_node("Relu", ["g2"], ["y2"], name="r2")]
    t1, t2 = rand(RNG, (4, 3)), rand(RNG, (4, 3))
    m = model(nodes, {"a": ((2,), "int64"), "b": ((2,), "int64")},
              {"y1": ((2, 3), "float32"), "y2": ((2, 3), "float32")}, {"t1": t1, "t2": t2})
    module = build_model(from_onnx(m))
    assert len(module.steps) == 2 and module.steps[0].kernel is module.steps[1].kernel
    y1, y2 = module.run(a=np.array([3, -4]), b=np.array([0, -1]))
    np.testing.assert_array_equal(y1, np.maximum(t1[[3, -4]], 0))
    np.testing.assert_array_equal(y2, np.maximum(t2[[0, -1]], 0))
    e = _raises(lambda: module.run(a=np.array([0, 1]), b=np.array([4, 0])), re.escape("Gather node 'second'"))
    assert e.call == 1 and e.value == 4
