"""Concatenations that cost nothing: each input computed where the output keeps it.

A Concat whose axis has only unit dimensions before it (a batch-1 concat along channels, blocked
or not; a concat along the first axis) lays its inputs out one after the other, each a
contiguous byte range of the output. When every input is a kernel's output (or such a Concat's
output, so chains nest: DenseNet's growing feature maps), used as one buffer, distinct, and
starts on a 64-byte boundary, the memory plan places each input at its offset inside the
output's buffer and the Concat's kernel is not run at all: the producers write the concatenated
value directly, as a dense layer's fused concat in oneDNN or the "memory-efficient DenseNet" do.
SqueezeNet's eight fire-module concats were 2-3 % of its run, a copy of every expand output.

`place_concats` decides; plan.plan_memory takes the placements; runtime.build_model drops the
kernels. Anything the rule does not cover keeps its Concat kernel (correct, one more pass).
"""

from __future__ import annotations

import math

from .ir import Graph
from .plan import storage_roots

ALIGN_BYTES = 64   # kernels take 64-byte aligned buffers (compiler.buffers)


def place_concats(graph: Graph, kernels: list) -> tuple[list, dict]:
    """(the kernels still to run, {value: (the Concat output holding it, byte offset)}).
    `kernels` are the model's GroupKernels in run order."""
    roots = storage_roots(graph, None)
    produced = {gk.output for gk in kernels}
    pinned = {roots.get(v, v) for v in [*graph.inputs, *graph.outputs]}
    placed: dict = {}
    elided: set = set()
    for gk in kernels:
        node = gk.group.nodes[0]
        if len(gk.group.nodes) != 1 or node.op_type != "Concat":
            continue
        offsets = _offsets(graph, node, roots, produced, pinned, placed)
        if offsets is None:
            continue
        for value, offset in zip(node.inputs, offsets):
            placed[value] = (node.outputs[0], offset)
        elided.add(id(gk))
    return [gk for gk in kernels if id(gk) not in elided], placed


def _offsets(graph, node, roots, produced, pinned, placed) -> list | None:
    """The byte offset of each input inside the Concat's output, or None where the rule does not
    hold (see the module docstring)."""
    out = graph.values[node.outputs[0]]
    axis = int(node.attrs.get("axis", 0)) % max(len(out.shape), 1)
    if math.prod(out.shape[:axis]) != 1 or len(set(node.inputs)) != len(node.inputs):
        return None
    offsets, at = [], 0
    for name in node.inputs:
        v = graph.values.get(name) if name else None
        if (v is None or v.const is not None or v.dtype != out.dtype or roots.get(name, name) != name
                or name in pinned or name in placed or name not in produced or at % ALIGN_BYTES):
            return None
        offsets.append(at)
        at += v.nbytes
    return offsets if at == out.nbytes else None


__all__ = ["place_concats"]
