"""New values and nodes for a graph rewrite that replaces one node (compiler/graph/canonical_ops.py,
grouped_heads.py): names derived from the node's, constants folded where the source is one."""

from __future__ import annotations

import numpy as np

from .errors import ShapeError
from .ir import Graph, Node, Value
from .ops import OPS


class NodeBuilder:
    """New values and nodes for a rewrite of `node`, named after it."""

    def __init__(self, graph: Graph, node: Node):
        self.graph, self.node = graph, node
        self.nodes: list[Node] = []
        self.count = 0

    def name(self, what: str) -> str:
        self.count += 1
        name = f"{self.node.name}/{what}{self.count}"
        while name in self.graph.values:
            self.count += 1
            name = f"{self.node.name}/{what}{self.count}"
        return name

    def const(self, what: str, array: np.ndarray) -> str:
        name = self.name(what)
        self.graph.values[name] = Value(name, tuple(array.shape), str(array.dtype), np.ascontiguousarray(array))
        return name

    def value(self, what: str, shape: tuple, dtype: str) -> str:
        name = self.name(what)
        self.graph.values[name] = Value(name, tuple(shape), dtype)
        return name

    def reshape(self, src: str, shape: tuple, out: str | None = None) -> str:
        v = self.graph.values[src]
        if tuple(v.shape) == tuple(shape) and out is None:
            return src
        if v.const is not None and out is None:
            return self.const("reshaped", v.const.reshape(shape))
        target = self.const("shape", np.array(shape, np.int64))
        out = out or self.value("reshaped", shape, v.dtype)
        self.nodes.append(Node("Reshape", self.name("reshape"), [src, target], [out]))
        return out

    def emit(self, op_type: str, inputs: list, attrs: dict, out: str | None = None) -> str:
        """A node of `op_type`, its output's shape and dtype inferred by the operator's own rule."""
        node = Node(op_type, self.name(op_type.lower()), list(inputs), [out or ""], dict(attrs))
        ins = [self.graph.values[i] if i else None for i in inputs]
        ((shape, dtype),) = OPS[op_type].infer(node, ins, self.graph.opset)
        if out is None:
            out = self.value(op_type.lower(), shape, dtype)
            node.outputs = [out]
        elif tuple(self.graph.values[out].shape) != tuple(shape):
            raise ShapeError(f"{self.node.op_type} node {self.node.name!r}: rewritten to {shape}, inferred "
                             f"{self.graph.values[out].shape}")
        self.nodes.append(node)
        return out

    def slice(self, src: str, starts: list, ends: list, axes: list, out: str | None = None) -> str:
        if self.graph.opset < 10:
            return self.emit("Slice", [src], {"starts": starts, "ends": ends, "axes": axes}, out)
        ins = [self.const(what, np.array(v, np.int64)) for what, v in (("starts", starts), ("ends", ends),
                                                                          ("axes", axes))]
        return self.emit("Slice", [src, *ins], {}, out)

    def transpose(self, src: str, perm: list, out: str | None = None) -> str:
        v = self.graph.values[src]
        if list(perm) == list(range(len(perm))) and out is None:
            return src
        if v.const is not None and out is None:
            return self.const("transposed", np.transpose(v.const, perm))
        shape = tuple(v.shape[p] for p in perm)
        out = out or self.value("transposed", shape, v.dtype)
        self.nodes.append(Node("Transpose", self.name("transpose"), [src], [out], {"perm": list(perm)}))
        return out


__all__ = ["NodeBuilder"]
