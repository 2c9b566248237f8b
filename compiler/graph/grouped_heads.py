"""Grouped-query attention read in place: a MatMul whose right operand repeats each head of a
smaller tensor becomes a product over the groups.

Llama-style attention keeps fewer key/value heads than query heads (grouped-query attention: 4
K/V heads serve 16 query heads, 4 each). `transformers` writes `repeat_kv` before the products,
and the dynamo exporter spells it Unsqueeze → Expand → Reshape (with the Transpose of Kᵀ and the
scale's Mul after it): every K and V head copied r times into a tensor r times larger, on every
decode step, for products of one query row per head. The product reads the copy again, r times
the bytes of the cache it came from.

The rewrite: where the right operand B of MatMul(A, B) is such a chain of layout nodes (Unsqueeze,
Squeeze, Expand, Reshape, Transpose, Identity, and Muls by a scalar constant) over a source X, and
B's head axis (the batch axis next to the matrix) repeats each of hk heads r times, the product
becomes
    Reshape(MatMul(Reshape(A, [..., hk, r·M, K]), G), [..., r·hk, M, N])
where G is X itself or X with its matrix axes swapped (Kᵀ), scaled as B was: the r query heads of
a group become r·M rows of one product over the group's own K/V head. Both Reshapes are aliases
(A's heads of one group are consecutive rows), the expanded copy is gone, and a decode step's
one-row products become products of r rows. TorchScript's exporter writes the grouped form itself
(transformers reshapes Q to [b, hk, r, d] for its SDPA path); this gives dynamo's spelling the same.

Which elements of X each element of B reads is found by replaying the chain on an array of X's
element numbers (numpy's reshape, broadcast_to, transpose: the layout nodes' own semantics at the
shapes the graph already inferred), not by matching the exporter's spelling, so any order of
layout nodes that repeats heads takes the rewrite, and nothing else does.
"""

from __future__ import annotations

import math

import numpy as np

from .ir import Graph, Node
from .node_builder import NodeBuilder

LAYOUT_NODES = ("Unsqueeze", "Squeeze", "Expand", "Reshape", "Transpose", "Identity")
MAX_REPLAY_ELEMENTS = 1 << 24   # elements of B whose sources are replayed at most (int64: 128 MB)


def group_query_heads(graph: Graph) -> Graph:
    """Rewrite every MatMul whose B repeats heads (module docstring); in place, returns the graph.
    The chain's nodes stay, for any other reader; dead-code elimination drops them otherwise."""
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    rewrites: dict = {}
    for n in graph.nodes:
        if n.op_type == "MatMul":
            new = _grouped(graph, n, producer)
            if new:
                rewrites[id(n)] = new
    if rewrites:
        graph.nodes = [m for n in graph.nodes for m in rewrites.get(id(n), [n])]
    return graph


def _grouped(graph: Graph, n: Node, producer: dict) -> list | None:
    va, vb = graph.values[n.inputs[0]], graph.values[n.inputs[1]]
    shapes = (va.shape, vb.shape, graph.values[n.outputs[0]].shape)
    if (va.dtype not in ("float32", "float64") or vb.const is not None or len(va.shape) < 3
            or va.shape[:-2] != vb.shape[:-2] or not all(isinstance(d, int) for s in shapes for d in s)):
        return None
    traced = _trace(graph, n.inputs[1], producer)
    if traced is None:
        return None
    source, chain, scales = traced
    x = graph.values[source]
    if not any(m.op_type == "Expand" for m in chain) or math.prod(vb.shape) > MAX_REPLAY_ELEMENTS:
        return None
    index = _replay(np.arange(math.prod(x.shape), dtype=np.int64).reshape(x.shape), chain, graph)
    if index is None or index.shape != tuple(vb.shape):
        return None
    axis = len(vb.shape) - 3
    heads = vb.shape[axis]
    repeat = next((r for r in range(heads, 1, -1) if heads % r == 0 and np.array_equal(
        index, np.repeat(index.take(range(0, heads, r), axis=axis), r, axis=axis))), None)
    if repeat is None:
        return None
    grouped = index.take(range(0, heads, repeat), axis=axis)   # [..., hk, K, N] as X's element numbers
    order = np.arange(grouped.size, dtype=np.int64)
    if np.array_equal(grouped.ravel(), order):
        swap = False
    elif np.array_equal(np.swapaxes(grouped, -1, -2).ravel(), order):
        swap = True
    else:
        return None
    *batch, M, K = va.shape
    N = vb.shape[-1]
    groups = heads // repeat
    b = NodeBuilder(graph, n)
    g_shape = tuple(grouped.shape)
    g = b.reshape(source, g_shape[:-2] + ((N, K) if swap else (K, N)))
    if swap:
        g = b.transpose(g, list(range(len(g_shape) - 2)) + [len(g_shape) - 1, len(g_shape) - 2])
    for scale in scales:
        scaled = b.value("scaled", g_shape, vb.dtype)
        b.nodes.append(Node("Mul", b.name("scale"), [g, scale], [scaled]))
        g = scaled
    rows = tuple(batch[:axis]) + (groups, repeat * M, K)
    a = b.reshape(n.inputs[0], rows)
    product = b.value("grouped", tuple(batch[:axis]) + (groups, repeat * M, N), va.dtype)
    b.nodes.append(Node("MatMul", b.name("matmul"), [a, g], [product]))
    b.reshape(product, tuple(graph.values[n.outputs[0]].shape), out=n.outputs[0])
    return b.nodes


def _trace(graph: Graph, name: str, producer: dict) -> tuple | None:
    """(source value, layout nodes from it to `name` in order, names of scalar constants B was
    multiplied by) walking back from `name` through layout nodes and scalar Muls; None when
    there is no such node."""
    chain: list = []
    scales: list = []
    while True:
        m = producer.get(name)
        if m is None:
            break
        if m.op_type in LAYOUT_NODES and len([o for o in m.outputs if o]) == 1:
            chain.append(m)
            name = m.inputs[0]
            continue
        if m.op_type == "Mul" and len(m.inputs) == 2:
            data, scale = _scalar_operand(graph, m)
            if scale is not None and graph.values[data].shape == graph.values[m.outputs[0]].shape:
                chain.append(m)
                scales.append(scale)
                name = data
                continue
        break
    if not chain:
        return None
    return name, chain[::-1], scales


def _scalar_operand(graph: Graph, m: Node) -> tuple:
    """(the data input, the scalar constant input) of a Mul by one constant number, else (None, None)."""
    for data, scale in ((m.inputs[0], m.inputs[1]), (m.inputs[1], m.inputs[0])):
        c = graph.values[scale].const
        if c is not None and c.size == 1 and graph.values[scale].dtype == graph.values[data].dtype:
            return data, scale
    return None, None


def _replay(index: np.ndarray, chain: list, graph: Graph) -> np.ndarray | None:
    """The element numbers of the chain's source as its last node lays them out: each layout node
    applied to the array of numbers at the shapes the graph inferred; None for a node whose
    layout is not a plain reshape, broadcast or transpose of its input."""
    for m in chain:
        out = tuple(graph.values[m.outputs[0]].shape)
        if m.op_type == "Mul":
            continue
        if m.op_type == "Transpose":
            perm = m.attrs.get("perm")
            index = np.transpose(index, None if perm is None else [int(p) for p in perm])
        elif m.op_type == "Expand":
            try:
                index = np.broadcast_to(index, out)
            except ValueError:
                return None
        elif index.size == math.prod(out):   # Reshape, Unsqueeze, Squeeze, Identity: element order kept
            index = index.reshape(out)
        else:
            return None
        if index.shape != out:
            return None
    return index


__all__ = ["group_query_heads"]
