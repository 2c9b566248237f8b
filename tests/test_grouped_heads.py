"""Grouped-query attention without the expanded copy (compiler/graph/grouped_heads.py): a MatMul
whose right operand repeats K/V heads becomes a product over the groups, the Expand gone, the
result the same as numpy's product of the expanded operand."""

from __future__ import annotations

import numpy as np
import pytest
from graph_models import assert_close, model, rand
from onnx import helper

from compiler.graph import build_model, from_onnx

RNG = np.random.default_rng(31)
n = helper.make_node


def i64(*v):
    return np.array(v, np.int64)


def repeat_kv_nodes(src, out, b, hk, r, t, d):
    """transformers' repeat_kv as the dynamo exporter writes it: Unsqueeze → Expand → Reshape."""
    return [n("Unsqueeze", [src, "ax2"], [f"{src}5"]),
            n("Expand", [f"{src}5", f"{src}_shape5"], [f"{src}e"]),
            n("Reshape", [f"{src}e", f"{src}_shape4"], [out])], {
        "ax2": i64(2), f"{src}_shape5": i64(b, hk, r, t, d), f"{src}_shape4": i64(b, hk * r, t, d)}


def attention(b, hk, r, s, t, d, tile_heads=False):
    """Scores and context of grouped-query attention over K/V [b, hk, t, d] for Q [b, hk·r, s, d]:
    K expanded, reshaped through [b·H, t, d], transposed, both sides scaled (dynamo's SDPA
    decomposition); `tile_heads` repeats the heads as a tile (head h reads K/V head h mod hk),
    which is not a grouping and must not take the rewrite."""
    H = hk * r
    inits = {"scale": np.array(d ** -0.25, np.float32), "flat": i64(b * H, t, d), "unflat": i64(b, H, d, t)}
    if tile_heads:
        nodes = [n("Unsqueeze", ["k", "ax1"], ["k5"]), n("Expand", ["k5", "k_shape5"], ["ke"]),
                 n("Reshape", ["ke", "k_shape4"], ["kx"]),
                 n("Unsqueeze", ["v", "ax1"], ["v5"]), n("Expand", ["v5", "v_shape5"], ["ve"]),
                 n("Reshape", ["ve", "v_shape4"], ["vx"])]
        inits.update(ax1=i64(1), k_shape5=i64(b, r, hk, t, d), k_shape4=i64(b, H, t, d),
                     v_shape5=i64(b, r, hk, t, d), v_shape4=i64(b, H, t, d))
    else:
        kn, ki = repeat_kv_nodes("k", "kx", b, hk, r, t, d)
        vn, vi = repeat_kv_nodes("v", "vx", b, hk, r, t, d)
        nodes = kn + vn
        inits.update(ki)
        inits.update(vi)
    nodes += [n("Reshape", ["kx", "flat"], ["k3"]), n("Transpose", ["k3"], ["kt3"], perm=[0, 2, 1]),
              n("Reshape", ["kt3", "unflat"], ["kt"]),
              n("Mul", ["q", "scale"], ["qs"]), n("Mul", ["kt", "scale"], ["kts"]),
              n("MatMul", ["qs", "kts"], ["scores"]), n("Softmax", ["scores"], ["p"], axis=-1),
              n("MatMul", ["p", "vx"], ["ctx"])]
    m = model(nodes, {"q": ((b, H, s, d), "float32"), "k": ((b, hk, t, d), "float32"),
                      "v": ((b, hk, t, d), "float32")},
              {"scores": (None, "float32"), "ctx": (None, "float32")}, inits)
    return m


def assert_matches_numpy(graph, b, hk, r, s, t, d, tile_heads):
    """The built graph's scores and context on random inputs, against reference's in float64."""
    q, k, v = rand(RNG, (b, hk * r, s, d)), rand(RNG, (b, hk, t, d)), rand(RNG, (b, hk, t, d))
    scores, ctx = build_model(graph).run(q=q, k=k, v=v)
    want_scores, want_ctx = reference(q, k, v, r, tile_heads)
    assert_close(scores, want_scores)
    assert_close(ctx, want_ctx)


def reference(q, k, v, r, tile_heads):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    if tile_heads:
        kx, vx = np.tile(k, (1, r, 1, 1)), np.tile(v, (1, r, 1, 1))
    else:
        kx, vx = np.repeat(k, r, axis=1), np.repeat(v, r, axis=1)
    scores = q @ np.swapaxes(kx, -1, -2) / np.sqrt(q.shape[-1])
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return scores, p @ vx


@pytest.mark.parametrize("b,hk,r,s,t,d", [(2, 4, 4, 1, 128, 64),    # a decode step: one query row per head
                                          (1, 2, 3, 5, 7, 9),       # nothing a multiple of a tile
                                          (3, 1, 2, 4, 6, 8)])      # multi-query: one K/V head
def test_repeated_heads_are_read_in_place(b, hk, r, s, t, d):
    m = attention(b, hk, r, s, t, d)
    graph = from_onnx(m)
    assert not [x for x in graph.nodes if x.op_type == "Expand"]
    products = [x for x in graph.nodes if x.op_type == "MatMul"]
    assert len(products) == 2
    for p in products:   # each a product over the hk groups of r·s rows
        assert graph.values[p.inputs[0]].shape[1:3] == (hk, r * s)
        assert graph.values[p.inputs[1]].shape[1] == hk
    assert_matches_numpy(graph, b, hk, r, s, t, d, tile_heads=False)


def test_heads_tiled_not_grouped_keep_their_copy():
    """Head h reading K/V head h mod hk is not a grouping of consecutive heads: the Expand stays
    and the products are the ones written."""
    b, hk, r, s, t, d = 2, 2, 3, 2, 5, 4
    m = attention(b, hk, r, s, t, d, tile_heads=True)
    graph = from_onnx(m)
    assert [x for x in graph.nodes if x.op_type == "Expand"]
    assert_matches_numpy(graph, b, hk, r, s, t, d, tile_heads=True)


def test_an_expanded_operand_read_elsewhere_stays_computed():
    """The rewrite adds the grouped product; the expanded value stays for any other reader."""
    b, hk, r, t, d = 1, 2, 2, 3, 4
    kn, ki = repeat_kv_nodes("v", "vx", b, hk, r, t, d)
    nodes = kn + [n("MatMul", ["p", "vx"], ["ctx"]), n("Relu", ["vx"], ["vr"])]
    m = model(nodes, {"p": ((b, hk * r, 2, t), "float32"), "v": ((b, hk, t, d), "float32")},
              {"ctx": (None, "float32"), "vr": (None, "float32")}, ki)
    graph = from_onnx(m)
    assert [x for x in graph.nodes if x.op_type == "Expand"]
    p, v = rand(RNG, (b, hk * r, 2, t)), rand(RNG, (b, hk, t, d))
    ctx, vr = build_model(graph).run(p=p, v=v)
    vx = np.repeat(v.astype(np.float64), r, axis=1)
    assert_close(ctx, p @ vx)
    assert_close(vr, np.maximum(vx, 0))
