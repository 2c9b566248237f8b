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

A MatMul whose B is one matrix for every matrix of A (a 2-d weight, or B in column panels) over a
batch of A is one matrix product of all of A's rows: its group is lowered over the 2-d view
[rows, N] (`row_view`), A read as [rows, K] and every other operand as one row for all
(a bias) or one row per row (a residual); kernel arguments are flat buffers, so only the
shapes the kernel declares change. The GEMM schedule then tiles the rows whatever the batch is:
nn.MultiheadAttention's in-projection, exported over [S, 1, d] (sequence first, batch 1), was
197 products of one row each, tiled one row at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ops import OpDef, get_op
from ..ops.custom import custom_op
from ..tensor import PlaceholderOp, compute, placeholder, topo_order
from .errors import GraphError
from .fuse import FusedGroup
from .ir import Graph, Value
from .ops import OPS, Kind, Lazy, materialize
from .ops.base import lowering_group

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


# binary operators with numpy's broadcasting and no axis of their own: an epilogue of them
# computes the same values on any view of its operands that keeps each element's row and column
ROW_VIEW_BINARY = frozenset(("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mean", "Sum", "Where", "Equal",
                             "Greater", "GreaterOrEqual", "Less", "LessOrEqual"))


def shared_b_rows(a_shape: tuple, b_shape: tuple, packed: bool = False) -> int | None:
    """The rows of the one matrix product a MatMul of A `a_shape` by B `b_shape` is when B is the
    same matrix for every matrix of a batch of A (2-d, its leading dimensions all 1, or `packed`
    in column panels [N/NB, K, NB]): the product of A's leading dimensions. None when there is
    no batch to join (A 2-d, or every batch dimension 1) or B has a batch of its own."""
    if len(a_shape) < 3 or math.prod(a_shape[:-2]) == 1:
        return None
    if not packed and (len(b_shape) < 2 or any(d != 1 for d in b_shape[:-2])):
        return None
    return math.prod(a_shape[:-1])


def row_view(graph: Graph, group: FusedGroup) -> dict | None:
    """{value name: the shape the group's kernel declares it with} when the group is a MatMul
    whose B is shared by a batch of A (shared_b_rows) followed by an epilogue of elementwise
    nodes and ROW_VIEW_BINARY operators, and each operand of the epilogue is one row for every
    row (its leading dimensions 1: a bias) or one row per row (its leading dimensions the
    output's: a residual); else None (the product stays batched)."""
    head = group.nodes[0]
    if group.kind != Kind.OUT_ELEMWISE_FUSABLE or head.op_type != "MatMul":
        return None
    a, b = graph.values[head.inputs[0]], graph.values[head.inputs[1]]
    rows = shared_b_rows(a.shape, b.shape, "weight_block" in head.attrs)
    if rows is None:
        return None
    out = graph.values[head.outputs[0]].shape
    if math.prod(out[:-1]) != rows:
        return None
    view = {head.inputs[0]: (rows, a.shape[-1])}
    inside = {o for n in group.nodes for o in n.outputs if o}
    for n in group.nodes[1:]:
        if OPS[n.op_type].kind != Kind.ELEMWISE and n.op_type not in ROW_VIEW_BINARY:
            return None
        for name in n.inputs:
            if not name or name in inside or name in view:
                continue
            shape = graph.values[name].shape
            lead = (1,) * (len(out) - len(shape)) + tuple(shape[:-1])
            if len(shape) > len(out):
                return None
            if all(d == 1 for d in lead):
                view[name] = tuple(shape[-1:])
            elif lead == tuple(out[:-1]):
                view[name] = (rows, shape[-1])
            else:
                return None
    for name in inside:
        view[name] = (rows, out[-1])
    return view


def _lower_dag(graph: Graph, group: FusedGroup) -> GroupKernel:
    env: dict = {}
    placeholders: list = []   # (value name, Tensor)
    view = row_view(graph, group) or {}

    def value(name):
        v = graph.values[name]
        if name not in view:
            return v
        return Value(v.name, view[name], v.dtype, None if v.const is None else v.const.reshape(view[name]))

    def operand(name):
        if name in env:
            return env[name]
        v = value(name)
        if v.const is not None and v.size == 1:
            lazy = Lazy.scalar(v.const.reshape(-1)[0], v.dtype, v.shape)
        else:
            t = placeholder(v.shape or (1,), v.dtype, f"in{len(placeholders)}")
            # a constant the row view reshapes is an argument of its own (another kernel may
            # read the value in its own shape)
            reshaped = v.const is not None and v.shape != graph.values[name].shape
            placeholders.append((v.const if reshaped else name, t))
            lazy = Lazy.of(t) if v.shape else Lazy((), v.dtype, lambda idx: t[(0,)], None)
        env[name] = lazy
        return lazy

    lowering_group(group.nodes)   # data_index names its checks by position in the group
    for n in group.nodes:
        lower = OPS[n.op_type].lower
        if lower is None:
            raise GraphError(f"{n.op_type} node {n.name!r}: cannot be compiled with these attributes")
        xs = [operand(i) if i else None for i in n.inputs]
        ins = [value(i) if i else None for i in n.inputs]
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
    if tuple(out.shape) != (view.get(group.output) or out_value.shape or (1,)) or out.dtype != out_value.dtype:
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


__all__ = ["GroupKernel", "lower_group", "group_name", "arg_array", "row_view", "shared_b_rows"]
