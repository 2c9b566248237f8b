"""A fused group as a workload: its compute DAG (an OpDef) and which graph values feed it.

A group alone that is an inventory operator (a pool, Softmax, LayerNormalization, a reduction)
becomes that operator (`get_op`), so its default schedule and tuning templates apply. Any other
group is a compute DAG named after its nodes (`fused_conv_add_relu`): kernel arguments are
placeholders for the values it reads (activations and weights alike; one-element constants are
embedded in the expression instead), the nodes are lowered in order through their OpSpecs, and
the elementwise / injective part is one output stage. Its workload key is the compiler's key of
that DAG, which depends on the structure and shapes only (not on the graph's value names or the
weights' values), so a repeated layer is one workload and `Workload.from_compute(opdef)` in the
tuner gives the key apply-best finds later.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ops import OpDef, get_op
from ..ops.custom import custom_op
from ..tensor import PlaceholderOp, compute, placeholder, topo_order
from .errors import GraphError
from .fuse import FusedGroup
from .ir import Graph
from .ops import OPS, Kind, Lazy, materialize

MAX_NAME_OPS = 6


@dataclass
class GroupKernel:
    """One fused group ready to build: `args[i]` feeds `opdef.inputs[i]` (a graph value name, or an
    array the compiler made, e.g. LayerNormalization's missing bias)."""

    group: FusedGroup
    opdef: OpDef
    args: list

    @property
    def output(self) -> str:
        return self.group.output

    @property
    def key(self) -> str:
        return self.opdef.workload_key()


def group_name(group: FusedGroup) -> str:
    ops = [n.op_type.lower() for n in group.nodes]
    name = "fused_" + "_".join(ops[:MAX_NAME_OPS])
    return name + (f"_and_{len(ops) - MAX_NAME_OPS}_more" if len(ops) > MAX_NAME_OPS else "")


def lower_group(graph: Graph, group: FusedGroup) -> GroupKernel:
    head = group.nodes[0]
    spec = OPS[head.op_type]
    if len(group.nodes) == 1 and spec.inventory is not None:
        ins = [graph.values[i] if i else None for i in head.inputs]
        found = spec.inventory(head, ins, graph.opset)
        if found is not None:
            name, params, args = found
            opdef = get_op(name, **params)
            return GroupKernel(group, opdef, [head.inputs[a] if isinstance(a, int) else a for a in args])
    return _lower_dag(graph, group)


def _lower_dag(graph: Graph, group: FusedGroup) -> GroupKernel:
    env: dict = {}
    placeholders: list = []   # (value name, Tensor)

    def operand(name):
        if name in env:
            return env[name]
        v = graph.values[name]
        if v.const is not None and v.size == 1:
            lazy = Lazy.scalar(v.const.reshape(-1)[0], v.dtype, v.shape)
        else:
            t = placeholder(v.shape or (1,), v.dtype, f"in{len(placeholders)}")
            placeholders.append((name, t))
            lazy = Lazy.of(t) if v.shape else Lazy((), v.dtype, lambda idx: t[(0,)], None)
        env[name] = lazy
        return lazy

    for n in group.nodes:
        lower = OPS[n.op_type].lower
        if lower is None:
            raise GraphError(f"{n.op_type} node {n.name!r}: cannot be compiled with these attributes")
        xs = [operand(i) if i else None for i in n.inputs]
        ins = [graph.values[i] if i else None for i in n.inputs]
        try:
            env[n.outputs[0]] = lower(n, xs, ins, graph.opset)
        except GraphError:
            raise
        except Exception as e:  # noqa: BLE001 - a tensor function refusing the node's operands
            raise GraphError(f"{n.op_type} node {n.name!r}: cannot be compiled: {e}") from None
    result = env[group.output]
    out_value = graph.values[group.output]
    name = group_name(group)
    tag = "elemwise" if group.kind in (Kind.OUT_ELEMWISE_FUSABLE, Kind.ELEMWISE, Kind.BROADCAST) else "injective"
    if result.tensor is not None and isinstance(result.tensor.op, PlaceholderOp):
        result = Lazy(result.shape, result.dtype, result.read)   # an input as output: copy it
    if not result.shape:
        out = compute((1,), lambda i: result.read(()), name=name, tag=tag)
    else:
        out = materialize(result, name, tag)
    if tuple(out.shape) != (out_value.shape or (1,)) or out.dtype != out_value.dtype:
        raise GraphError(f"group {group.describe()} computes {out.shape} {out.dtype}, the graph expects "
                         f"{out_value.shape} {out_value.dtype}")
    # constants a node needed only at compile time (a Slice's starts) are not kernel arguments:
    # the workload key counts only what the output reads, and so must the arguments
    read = {id(op) for op in topo_order([out])}
    placeholders = [(v, t) for v, t in placeholders if id(t.op) in read]
    opdef = custom_op(name, [t for _, t in placeholders], out)
    return GroupKernel(group, opdef, [v for v, _ in placeholders])


def arg_array(graph: Graph, arg) -> np.ndarray | None:
    """The constant array behind a kernel argument, or None for a run-time value."""
    if isinstance(arg, np.ndarray):
        return arg
    return graph.values[arg].const


__all__ = ["GroupKernel", "lower_group", "group_name", "arg_array"]
