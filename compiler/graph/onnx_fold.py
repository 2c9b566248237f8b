"""Constant subgraphs of an ONNX model evaluated at import by onnx's reference evaluator.

A node whose inputs are all known at import (initializers, Constant nodes, shapes, outputs of
nodes folded before it) is not compiled: its outputs become constants. Where the operator has a
cheap numpy fold in its OpSpec that fold is used; every other operator, including those tunefarm
has no kernel for (a Swin's ScatterND building its shifted-window mask from constants, a LeViT's
GatherND of constant attention biases), is run here by `onnx.reference`, so an operator that
folds never refuses a model, whatever it is. Only the import path (onnx_import.py) uses this
module, and it imports `onnx` lazily like the importer.
"""

from __future__ import annotations

import numpy as np

from .errors import GraphError
from .ir import Node

# operators whose value differs from one run to the next: never folded (and not compiled either)
NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                              "Multinomial", "Bernoulli"})


class FoldError(GraphError):
    """The reference evaluator could not compute a node (an operator it lacks, attributes or
    inputs it refuses); `reason` says why, for the importer's list of unsupported nodes."""

    def __init__(self, node: Node, reason: str):
        super().__init__(f"{node.op_type} node {node.name!r}: {reason}")
        self.reason = reason


class ReferenceFolder:
    """Evaluates single nodes of one model with `onnx.reference.ReferenceEvaluator`.

    `protos` maps id(Node) to the NodeProto it was read from (attributes exactly as the model
    wrote them, domain included); `opsets` is the model's {domain: version}."""

    def __init__(self, protos: dict, opsets: dict):
        self.protos = protos
        self.opsets = dict(opsets)

    def __call__(self, node: Node, arrays: list) -> list:
        """The node's outputs (one array per output name, None for an omitted one) computed from
        its constant inputs (`arrays`, None for an omitted optional input)."""
        from onnx.reference import ReferenceEvaluator
        proto = self.protos.get(id(node))
        if proto is None:
            raise FoldError(node, "no ONNX node to evaluate (made by a pass, not read from the model)")
        feeds = {name: np.asarray(a) for name, a in zip(proto.input, arrays) if name and a is not None}
        try:
            evaluator = ReferenceEvaluator(proto, opsets=self.opsets)
            results = evaluator.run(None, feeds)
        except NotImplementedError as e:
            raise FoldError(node, f"operator not supported (onnx's reference evaluator lacks it too: {e})") from None
        except Exception as e:  # noqa: BLE001 - the evaluator's op implementations raise anything
            raise FoldError(node, f"its constant inputs could not be evaluated at import: "
                                  f"{type(e).__name__}: {e}") from None
        named = [o for o in proto.output if o]
        if len(results) != len(named):
            raise FoldError(node, f"the reference evaluator gave {len(results)} outputs for {len(named)}")
        by_name = dict(zip(named, results))
        return [by_name.get(o) if o else None for o in node.outputs]


def constant_nodes(nodes: list, protos: dict, constants: set, defined: set) -> set:
    """id(Node) of the nodes computable at import: Shape and Size of any value (shapes are
    static), and any deterministic node without graph attributes (If, Loop: their bodies read
    values of the enclosing graph) whose inputs are all constants (`constants`: the
    initializers' names) or outputs of such nodes. `defined`: the names the model defines before
    any node (graph inputs and initializers); `protos` as in ReferenceFolder."""
    known, const = set(defined), set(constants)
    found: set = set()
    pending = list(nodes)
    while pending:
        rest = []
        for n in pending:
            if not all(not i or i in known for i in n.inputs):
                rest.append(n)
                continue
            proto = protos.get(id(n))
            default_domain = proto is None or proto.domain in ("", "ai.onnx")
            folds = (n.op_type in ("Shape", "Size") and default_domain) or (
                n.op_type not in NONDETERMINISTIC and not _has_subgraph(proto)
                and all(not i or i in const for i in n.inputs))
            if folds:
                found.add(id(n))
                const.update(o for o in n.outputs if o)
            known.update(o for o in n.outputs if o)
        if len(rest) == len(pending):
            break   # undefined inputs or a cycle: shape inference reports it
        pending = rest
    return found


def _has_subgraph(proto) -> bool:
    from onnx import AttributeProto
    return proto is not None and any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in proto.attribute)


__all__ = ["ReferenceFolder", "FoldError", "constant_nodes", "NONDETERMINISTIC"]
