"""Attention's kernels (issue 54): softmax over rows of any length, alone and after a mask add,
against float64 numpy and onnxruntime (masks with -inf and large negative entries, rows masked
whole); and the lowering that makes them fast: a vector loop whose last iteration alone a split's
guard masks runs its other iterations unmasked (lower._peel_vector_tails)."""

from __future__ import annotations

import numpy as np
import pytest
from graph_models import model
from onnx import helper

from compiler import Target, lower
from compiler.expr import Compare, walk
from compiler.graph import build_model, from_onnx
from compiler.loop_ir import For, IfThenElse, Store, stmt_children, walk_stmts
from compiler.ops import get_op
from compiler.ops.default_schedules import build_op, default_schedule

RNG = np.random.default_rng(54)


def np_softmax(x):
    a = x.astype(np.float64)
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def signed(shape, scale=3.0):
    """Random non-zero values of both signs, magnitudes in [0.1, 1) * scale."""
    return (RNG.uniform(0.1, 1.0, shape) * RNG.choice((-1.0, 1.0), shape) * scale).astype(np.float32)


@pytest.mark.parametrize("shape", [(5, 1), (3, 7), (2, 3, 197), (2, 513), (4, 16), (3, 2, 40)])
def test_softmax_rows_of_any_length(shape):
    op = get_op("softmax", shape=shape, axis=len(shape) - 1, dtype="float32")
    kernel = build_op(op)
    x = signed(shape)
    out = np.full(shape, np.nan, np.float32)   # poisoned: every element must be written
    kernel(x, out)
    ref = np_softmax(x)
    assert np.abs(out - ref).max() <= 1e-6 * 4 and np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-6


def _lane_guards_in_main_loops(func) -> list:
    """Comparisons that read both a vector lane and a serial loop of more than one iteration:
    lane masks computed again in every iteration of that loop, which the peeling leaves only
    in its last one (where the comparison reads the lane alone)."""
    found = []

    def visit(st, serial: set, lanes: set):
        if isinstance(st, For):
            if st.kind == "vectorized":
                lanes = lanes | {id(st.var)}
            elif st.kind == "serial" and st.extent > 1:
                serial = serial | {id(st.var)}
        exprs = [st.cond] if isinstance(st, IfThenElse) else [st.value] if isinstance(st, Store) else []
        for e in exprs:
            for n in walk(e):
                if isinstance(n, Compare):
                    used = {id(v) for v in walk(n)}
                    if used & lanes and used & serial:
                        found.append(n)
        for child in stmt_children(st):
            visit(child, serial, lanes)

    visit(func.body, set(), set())
    return found


@pytest.mark.parametrize("n", [197, 513, 45])
def test_softmax_row_tail_is_peeled(n):
    op = get_op("softmax", shape=(3, n), axis=1, dtype="float32")
    func = lower(default_schedule(op, Target.host()), op.inputs + [op.output])
    assert _lane_guards_in_main_loops(func) == []
    # the tail is still guarded: some comparison reads a lane outside the main loops
    assert any(isinstance(s, IfThenElse) or (isinstance(s, Store) and any(isinstance(e, Compare)
               for e in walk(s.value))) for s in walk_stmts(func.body))


def mask_model(shape, mask_shape):
    nodes = [helper.make_node("Add", ["x", "m"], ["s"]), helper.make_node("Softmax", ["s"], ["y"], axis=-1)]
    return model(nodes, {"x": (shape, "float32"), "m": (mask_shape, "float32")}, {"y": (shape, "float32")},
                 opset=17)


@pytest.mark.parametrize("fill", [-np.inf, -1e9, np.finfo(np.float32).min])
def test_masked_softmax_matches_onnxruntime(fill):
    ort = pytest.importorskip("onnxruntime")
    shape = (2, 3, 7, 13)
    m = mask_model(shape, (2, 1, 7, 13))
    x = signed(shape)
    mask = np.zeros((2, 1, 7, 13), np.float32)
    mask[0, 0, :, 9:] = fill                 # padding keys
    mask[1, 0, 2, :] = fill                  # a query row masked whole
    mask[1, 0, 4, ::2] = fill
    feeds = {"x": x, "m": mask}
    (ours,) = build_model(from_onnx(m)).run(**feeds)
    (theirs,) = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
    ok = ~np.isnan(theirs)
    np.testing.assert_allclose(ours[ok], theirs[ok], rtol=1e-5, atol=1e-7)
    with np.errstate(invalid="ignore"):
        ref = np_softmax(x + mask)   # the float32 sum: x + -1e9 is -1e9 whatever x is
    fine = ~np.isnan(ref)
    np.testing.assert_allclose(ours[fine], ref[fine], rtol=1e-5, atol=1e-7)
