"""The model graph: values with static shapes and dtypes, nodes in topological order.

Deliberately small (the model-level counterpart of the loop IR): a `Value` is a named tensor with
a concrete shape and dtype, and for a constant its array; a `Node` is an operator application by
ONNX op type with its attributes as plain Python values. Passes (folding, fusion) are functions
from a Graph to a Graph or to groups of its nodes; they never need the onnx package.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Value:
    """A tensor of the graph. `const` holds the array of a constant (an initializer, a Constant
    node, or anything folded at compile time); intermediate values have None."""

    name: str
    shape: tuple
    dtype: str
    const: np.ndarray | None = field(default=None, repr=False)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    @property
    def is_const(self) -> bool:
        return self.const is not None


@dataclass
class Node:
    """One operator application. `inputs` may hold '' for an omitted optional input (ONNX's
    convention); `attrs` are ints, floats, strings, lists of them, or numpy arrays (tensors)."""

    op_type: str
    name: str
    inputs: list
    outputs: list
    attrs: dict = field(default_factory=dict)

    def attr(self, key: str, default=None):
        return self.attrs.get(key, default)


@dataclass
class Graph:
    """A model: `values` by name, `nodes` producers first, graph `inputs` (fed at run time, not
    constants) and `outputs`, and the opset of the default ONNX domain the nodes follow."""

    values: dict
    nodes: list
    inputs: list
    outputs: list
    opset: int
    name: str = "model"

    def producer(self) -> dict:
        """value name -> the node that computes it."""
        return {out: n for n in self.nodes for out in n.outputs}

    def consumers(self) -> dict:
        """value name -> the nodes that read it (graph outputs are not nodes; see `outputs`)."""
        users: dict = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    users.setdefault(i, []).append(n)
        return users

    def summary(self) -> str:
        counts: dict = {}
        for n in self.nodes:
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
        ops = ", ".join(f"{k}×{v}" for k, v in sorted(counts.items()))
        return f"graph {self.name}: {len(self.nodes)} nodes ({ops}), inputs {self.inputs}, outputs {self.outputs}"


__all__ = ["Value", "Node", "Graph"]
