"""Fusion: the graph's nodes partitioned into groups, each one kernel (one workload).

The rules are TVM's FuseOps pattern rules, on chains:
- an anchor (OUT_ELEMWISE_FUSABLE: Conv, Gemm, MatMul) takes the elementwise and broadcast nodes
  that follow it while the output keeps the anchor's shape (bias, BatchNorm's scale and shift,
  residual Add, Relu, Clip, Gelu, ...): the epilogue its register tiles are stored through;
- an elementwise, broadcast or injective node starts a group that takes the injective nodes
  that follow it (a Transpose → Add → Cast chain is one pass over memory);
- a row operator (Softmax over its own shape's rows) takes the elementwise/broadcast consumers
  of its output as an anchor takes its epilogue, and the elementwise/broadcast tail of the group
  computing its input, of its shape, as a prologue its row read computes (_row_prologues): the
  attention scale, mask Add or causal Where before it, dynamo's Where(IsNaN(p), 0, p) after it;
- other reductions and opaque operators (pools, LayerNormalization, Reduce*) are a group of
  their own;
- ALIAS nodes (the reshape family) are not kernels: the runtime gives their output the input's
  buffer, except where one sits between two nodes of an injective group, which then reads
  through it as an index map (a channel shuffle's Reshape → Transpose → Reshape: one pass).
A node joins its producer's group only when it is that value's only reader and the value is not
a graph output, so every group has exactly one output and no intermediate escapes it. The one
exception is a closed diamond: when the group's output has several readers that all fit and
meet again within a few nodes (an exported erf GELU reads its input twice: x * (erf(x/√2) + 1)
/ 2), the group takes the whole diamond, since nothing in it is read from outside and it still
ends in one output (TVM reaches the same with its post-dominator tree).
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
        if kind <= Kind.INJECTIVE or kind == Kind.OUT_ELEMWISE_FUSABLE or _row_operator(graph, n):
            _grow(graph, nodes, kind, users, taken)
        groups.append(FusedGroup(nodes, kind, _external_inputs(graph, nodes)))
    groups = _row_prologues(graph, groups, users)
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    groups.sort(key=lambda g: position[id(g.nodes[-1])])
    return groups


DIAMOND_WINDOW = 12   # nodes after a group's output searched for its readers' meeting point


def _grow(graph, nodes, kind, users, taken):
    head_shape = graph.values[nodes[0].outputs[0]].shape

    def fits(u) -> bool:
        ukind = OPS[u.op_type].kind
        if id(u) in taken or len([o for o in u.outputs if o]) != 1:
            return False
        if kind >= Kind.OUT_ELEMWISE_FUSABLE:   # an anchor's or a row operator's epilogue
            return ukind <= Kind.BROADCAST and graph.values[u.outputs[0]].shape == head_shape
        return ukind <= Kind.INJECTIVE

    while True:
        out = nodes[-1].outputs[0]
        readers = users.get(out, [])
        if out in graph.outputs or not readers:
            return
        if len(readers) == 1:
            if kind <= Kind.INJECTIVE:
                grown = _through_aliases(graph, readers[0], users, fits)
            else:
                grown = [readers[0]] if fits(readers[0]) else None
        else:
            grown = _closed_diamond(graph, nodes, users, fits)
        if not grown:
            return
        nodes.extend(grown)
        taken.update(id(u) for u in grown)


def _through_aliases(graph, u, users, fits) -> list | None:
    """[u] when it fits; for an ALIAS node (a Reshape), the chain of aliases from it up to and
    with the first node that fits, each alias the only reader of the value before it: the group
    reads through the reshape as an index map instead of materializing an output that is only
    reshaped and read again (a channel shuffle's Reshape → Transpose → Reshape is one pass). A
    chain that ends anywhere else stays a set of aliases, which cost nothing."""
    chain = []
    while OPS[u.op_type].kind == Kind.ALIAS:
        outs = [o for o in u.outputs if o]
        if (len(outs) != 1 or OPS[u.op_type].lower is None or outs[0] in graph.outputs
                or len(users.get(outs[0], [])) != 1):
            return None
        chain.append(u)
        u = users[outs[0]][0]
    return chain + [u] if fits(u) else None


def _closed_diamond(graph, nodes, users, fits) -> list | None:
    """The nodes after `nodes` that read its output and meet again in one node, when each fits
    and none of their values but the meeting node's is read outside them; else None.

    Walks the graph in order from the group's last node: every node reading a value still open
    (read by some node outside the group so far) must join, and the diamond closes when the only
    open value is the newest node's output."""
    start = next(i for i, n in enumerate(graph.nodes) if n is nodes[-1])
    members = {id(n) for n in nodes}
    open_values = {nodes[-1].outputs[0]}
    added: list = []
    for n in graph.nodes[start + 1:start + 1 + DIAMOND_WINDOW]:
        if not any(i in open_values for i in n.inputs):
            continue
        if not fits(n):
            return None
        added.append(n)
        members.add(id(n))
        open_values.add(n.outputs[0])
        open_values = {v for v in open_values
                       if v in graph.outputs or any(id(r) not in members for r in users.get(v, []))}
        if open_values == {n.outputs[0]}:
            return added
        if any(v in graph.outputs for v in open_values):
            return None
    return None


def _row_operator(graph, n) -> bool:
    """A row operator that runs fused (ROW_OPERATORS): a Softmax whose rows are its own shape's."""
    if n.op_type not in ROW_OPERATORS or OPS[n.op_type].lower is None:
        return False
    from .ops.nn import softmax_fusable
    shape = graph.values[n.inputs[0]].shape
    return bool(shape) and softmax_fusable(n, shape, graph.opset)


ROW_OPERATORS = frozenset(("Softmax",))


def _row_prologues(graph, groups, users) -> list:
    """Each row operator's group (a Softmax and its epilogue) takes the elementwise/broadcast
    producers of its input: the tail of the group computing that input whose nodes are all
    elementwise or broadcast and of the row operator's shape (a scale Mul, a mask Add, a causal
    Where; their other operands, of any broadcast shape, stay kernel arguments), when that group's
    output is read by the row operator alone. The rest of that group, if any, stays a group when
    it hands the tail exactly one value. An anchor's epilogue stays the anchor's (Q·Kᵀ with its
    scale and mask is one GEMM kernel already)."""
    producer = {g.output: g for g in groups}
    merged: set = set()
    for g in groups:
        head = g.nodes[0]
        if not (g.kind == OPS[head.op_type].kind == Kind.OPAQUE and _row_operator(graph, head)):
            continue
        src = producer.get(head.inputs[0])
        if (src is None or src.kind > Kind.BROADCAST or id(src) in merged or src.output in graph.outputs
                or len(users.get(src.output, [])) != 1):
            continue
        shape = graph.values[head.inputs[0]].shape
        cut = len(src.nodes)
        while cut > 0 and OPS[src.nodes[cut - 1].op_type].kind <= Kind.BROADCAST \
                and graph.values[src.nodes[cut - 1].outputs[0]].shape == shape:
            cut -= 1
        if cut == len(src.nodes):
            continue
        prefix, tail = src.nodes[:cut], src.nodes[cut:]
        if prefix:
            made = {o for n in prefix for o in n.outputs if o}
            if {i for n in tail for i in n.inputs if i in made} != {prefix[-1].outputs[0]}:
                continue
        merged.add(id(src))
        g.nodes[:0] = tail
        g.inputs = _external_inputs(graph, g.nodes)
        if prefix:   # kept, shortened: its output is now the value the tail reads
            src.nodes = prefix
            src.inputs = _external_inputs(graph, prefix)
            merged.discard(id(src))
    return [g for g in groups if id(g) not in merged]


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
