"""Softmax fused with its elementwise neighbours (issue 54; graph/fuse.py's row operators): the
scale Mul, mask Add and causal Where before it and dynamo's Where(IsNaN(softmax), 0, softmax)
after it run in the softmax's one kernel, scheduled by the softmax default schedule. Random
non-zero inputs, float64 and onnxruntime references, odd row lengths, masks with -inf, -1e9 and
rows masked whole; kernel counts."""

from __future__ import annotations

import numpy as np
import pytest
from graph_models import model
from onnx import helper

from compiler.graph import build_model, from_onnx
from compiler.graph.fuse import fuse
from compiler.graph.runtime import for_target
from compiler.graph.workloads import lower_group
from compiler.ops.default_schedules import build_op
from compiler.ops.schedule_graph_ops import softmax_axis
from compiler.tensor import ComputeOp, topo_order

RNG = np.random.default_rng(541)


def signed(shape, scale=3.0):
    return (RNG.uniform(0.1, 1.0, shape) * RNG.choice((-1.0, 1.0), shape) * scale).astype(np.float32)


def np_softmax(a):
    a = a.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(a - a.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)


def attention_scores_model(s, heads=2, batch=2, opset=18):
    """x * 0.125 + mask → Softmax → Where(IsNaN(p), 0, p): the dynamo export's attention core
    (the scores a graph input, so nothing but the softmax can take the prologue)."""
    shape = (batch, heads, s, s)
    nodes = [helper.make_node("Mul", ["x", "scale"], ["xs"]),
             helper.make_node("Add", ["xs", "m"], ["s"]),
             helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("IsNaN", ["p"], ["nan"]),
             helper.make_node("Where", ["nan", "zero", "p"], ["y"])]
    inits = {"scale": np.array(0.125, np.float32), "zero": np.array(0.0, np.float32)}
    return model(nodes, {"x": (shape, "float32"), "m": ((batch, 1, 1, s), "float32")},
                 {"y": (shape, "float32")}, inits, opset=opset)


def mask_of(batch, s, fill):
    mask = np.zeros((batch, 1, 1, s), np.float32)
    mask[0, 0, 0, max(1, s - s // 3):] = fill   # padding keys (never all of them)
    if batch > 1:
        mask[1, 0, 0, :] = fill                 # a sample masked whole: every row of it
    return mask


def kernels(m):
    return len(build_model(from_onnx(m)).steps)


@pytest.mark.parametrize("s", [1, 7, 197])
@pytest.mark.parametrize("fill", [-np.inf, -1e9])
def test_scaled_masked_softmax_is_one_kernel(s, fill):
    ort = pytest.importorskip("onnxruntime")
    m = attention_scores_model(s)
    module = build_model(from_onnx(m))
    assert len(module.steps) == 1
    (opdef,) = {st.group.opdef.workload_key(): st.group.opdef for st in module.steps}.values()
    assert softmax_axis(opdef.output, [op for op in topo_order([opdef.output])
                                       if isinstance(op, ComputeOp) and op.reduce_axis]) == 3
    x, mask = signed((2, 2, s, s)), mask_of(2, s, fill)
    (ours,) = module.run(x=x, m=mask)
    (theirs,) = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "m": mask})
    ref = np_softmax(x * np.float32(0.125) + mask)   # the float32 sum: x + -1e9 is -1e9 whatever x is
    ref = np.where(np.isnan(ref), 0.0, ref)
    assert not np.isnan(ours).any()
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-7)
    if fill == -np.inf:
        assert (ours[1] == 0).all()            # rows masked whole: NaN, then Where's 0


def test_fused_kernel_writes_every_element():
    """The group's kernel alone, its output poisoned with NaN; a causal Where as the prologue."""
    s = 13
    nodes = [helper.make_node("Where", ["causal", "x", "ninf"], ["s"]),
             helper.make_node("Softmax", ["s"], ["y"], axis=-1)]
    causal = np.tril(np.ones((s, s), bool))[None, None]
    m = model(nodes, {"x": ((1, 3, s, s), "float32")}, {"y": ((1, 3, s, s), "float32")},
              {"causal": causal, "ninf": np.array(-np.inf, np.float32)}, opset=18)
    graph = for_target(from_onnx(m), None)
    (group,) = fuse(graph)
    assert group.describe() == "Where+Softmax"
    gk = lower_group(graph, group)
    x = signed((1, 3, s, s))
    arrays = [x if a == "x" else graph.values[a].const for a in gk.args]
    out = np.full((1, 3, s, s), np.nan, np.float32)
    build_op(gk.opdef)(*arrays, out)
    ref = np_softmax(np.where(causal, x, -np.inf))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-7)


def test_anchor_keeps_its_epilogue_and_softmax_takes_the_consumers():
    """Q·Kᵀ * scale + mask stays the GEMM's epilogue; the softmax takes the IsNaN/Where after it."""
    s, d = 7, 8
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["qk"]),
             helper.make_node("Mul", ["qk", "scale"], ["xs"]),
             helper.make_node("Add", ["xs", "m"], ["sc"]),
             helper.make_node("Softmax", ["sc"], ["p"], axis=-1),
             helper.make_node("IsNaN", ["p"], ["nan"]),
             helper.make_node("Where", ["nan", "zero", "p"], ["y"])]
    m = model(nodes, {"q": ((1, 2, s, d), "float32"), "kt": ((1, 2, d, s), "float32"),
                      "m": ((1, 1, 1, s), "float32")}, {"y": ((1, 2, s, s), "float32")},
              {"scale": np.array(0.5, np.float32), "zero": np.array(0.0, np.float32)}, opset=18)
    graph = for_target(from_onnx(m), None)
    assert [g.describe() for g in fuse(graph)] == ["MatMul+Mul+Add", "Softmax+IsNaN+Where"]
    q, kt, mask = signed((1, 2, s, d)), signed((1, 2, d, s)), mask_of(1, s, -1e9)
    (ours,) = build_model(from_onnx(m)).run(q=q, kt=kt, m=mask)
    ref = np_softmax(((q.astype(np.float64) @ kt) * 0.5).astype(np.float32) + mask)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-7)


def test_what_stays_apart():
    """A softmax output read twice (not a diamond that closes), a prologue value read elsewhere,
    and an opset-11 Softmax over a flattened [axis:] keep their own kernels."""
    shape = (2, 3, 5)
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]),
             helper.make_node("Softmax", ["sq"], ["p"], axis=-1),
             helper.make_node("Relu", ["p"], ["y1"]),
             helper.make_node("Neg", ["p"], ["y2"])]
    m = model(nodes, {"x": (shape, "float32")}, {"y1": (shape, "float32"), "y2": (shape, "float32")}, opset=18)
    assert [g.describe() for g in fuse(for_target(from_onnx(m), None))] == ["Mul+Softmax", "Relu", "Neg"]
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]),
             helper.make_node("Softmax", ["sq"], ["p"], axis=-1),
             helper.make_node("Add", ["p", "sq"], ["y"])]
    m = model(nodes, {"x": (shape, "float32")}, {"y": (shape, "float32")}, opset=18)
    assert [g.describe() for g in fuse(for_target(from_onnx(m), None))] == ["Mul", "Softmax+Add"]
    x = signed(shape)
    (ours,) = build_model(from_onnx(m)).run(x=x)
    np.testing.assert_allclose(ours, np_softmax(x.astype(np.float64) ** 2) + x.astype(np.float64) ** 2,
                               rtol=1e-5, atol=1e-6)
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]), helper.make_node("Softmax", ["sq"], ["y"], axis=1)]
    m = model(nodes, {"x": (shape, "float32")}, {"y": (shape, "float32")}, opset=11)
    assert [g.describe() for g in fuse(for_target(from_onnx(m), None))] == ["Mul", "Softmax"]
    (ours,) = build_model(from_onnx(m)).run(x=x)
    ref = np_softmax((x.astype(np.float64) ** 2).reshape(2, 15)).reshape(shape)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-7)
