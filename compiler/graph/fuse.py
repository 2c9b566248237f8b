"""Fusion: the graph's nodes partitioned into groups, each one kernel (one workload).

The rules are TVM's FuseOps pattern rules, on chains:
- an anchor (OUT_ELEMWISE_FUSABLE: Conv, Gemm, MatMul) takes the elementwise and broadcast nodes
  that follow it while the output keeps the anchor's shape (bias, BatchNorm's scale and shift,
  residual Add, Relu, Clip, Gelu, ...): the epilogue its register tiles are stored through;
- an elementwise, broadcast or injective node starts a group that takes the injective nodes
  that follow it (a Transpose → Add → Cast chain is one pass over memory);
- reductions and opaque operators (pools, Softmax, LayerNormalization, Reduce*) are a group of
  their own;
- ALIAS nodes (the reshape family) belong to no group: they are not kernels.
A node joins its producer's group only when it is that value's only reader and the value is not
a graph output, so every group has exactly one output and no intermediate escapes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .ir import Graph, Node
from .ops import OPS, Kind


@dataclass
class FusedGroup:
    """Nodes computed by one kernel, producers first; `output` is the last node's output."""

    nodes: list
    kind: Kind
    inputs: list = field(default_factory=list)   # values read from outside, in order of first read

    @property
    def output(self) -> str:
        return self.nodes[-1].outputs[0]

    @property
    def anchor(self) -> Node | None:
        return self.nodes[0] if self.kind == Kind.OUT_ELEMWISE_FUSABLE else None

    def describe(self) -> str:
        return "+".join(n.op_type for n in self.nodes)


def fuse(graph: Graph) -> list:
    """The fused groups in an order they can run in (each after the groups it reads)."""
    users = graph.consumers()
    taken: set = set()
    groups = []
    for n in graph.nodes:
        kind = OPS[n.op_type].kind
        if id(n) in taken or kind == Kind.ALIAS:
            continue
        nodes = [n]
        taken.add(id(n))
        if kind <= Kind.INJECTIVE or kind == Kind.OUT_ELEMWISE_FUSABLE:
            _grow(graph, nodes, kind, users, taken)
        groups.append(FusedGroup(nodes, kind, _external_inputs(graph, nodes)))
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    groups.sort(key=lambda g: position[id(g.nodes[-1])])
    return groups


def _grow(graph, nodes, kind, users, taken):
    head_shape = graph.values[nodes[0].outputs[0]].shape
    while True:
        out = nodes[-1].outputs[0]
        readers = users.get(out, [])
        if len(readers) != 1 or out in graph.outputs:
            return
        u = readers[0]
        ukind = OPS[u.op_type].kind
        if id(u) in taken or len([o for o in u.outputs if o]) != 1:
            return
        if kind == Kind.OUT_ELEMWISE_FUSABLE:
            fits = ukind <= Kind.BROADCAST and graph.values[u.outputs[0]].shape == head_shape
        else:
            fits = ukind <= Kind.INJECTIVE
        if not fits:
            return
        nodes.append(u)
        taken.add(id(u))


def _external_inputs(graph, nodes) -> list:
    inside = {o for n in nodes for o in n.outputs}
    seen, out = set(), []
    for n in nodes:
        for i in n.inputs:
            if i and i not in inside and i not in seen:
                seen.add(i)
                out.append(i)
    return out


__all__ = ["FusedGroup", "fuse"]
