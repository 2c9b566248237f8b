"""What the graph compiler knows about an ONNX operator, and the pieces its lowerings share.

An `OpSpec` is one operator type's whole story, kept in one place:
- `kind`: its fusion pattern (TVM's OpPatternKind: elementwise < broadcast < injective <
  comm_reduce < out_elemwise_fusable < opaque), plus ALIAS for the reshape family, which moves no
  data (the runtime gives the output the input's buffer);
- `check(node, opset)`: None, or why this node cannot be compiled (an attribute value, a rank),
  asked for every node before anything else happens so one error can list them all;
- `infer(node, inputs, opset)`: output (shape, dtype) pairs from the inputs' Values (constants
  readable: a Reshape's target shape is a constant input);
- `fold(node, arrays, opset)`: the outputs computed at compile time when every input is a
  constant (numpy, on the small integer tensors of shape arithmetic and on weights); kernels are
  never replaced by it: a node with a non-constant input is always compiled;
- `lower(node, operands, inputs, opset)`: the node's output as a tensor expression over its
  operands (`Lazy` reads, see below), through the compiler's tensor functions.

`Lazy` is an elementwise view of a tensor: a shape, a dtype and `read(index) -> Expr`. A fused
group composes elementwise and injective nodes as Lazy reads and materializes one stage at its
output, so an epilogue chain (bias, residual add, relu) is one stage, the form the anchor's
schedule stores its register tile through.

An index a lowering reads from a run-time tensor (Gather's indices; any op that addresses one
tensor by another's values) goes through `data_index`: checked at run time, so a bad index stops
the kernel and the model's run raises KernelRuntimeError naming this node (graph/index_errors.py)
instead of reading a wrong (wrapped, clamped) element.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from ... import expr as E
from ...tensor import Tensor, compute
from ..errors import ShapeError
from ..ir import Node


class Kind(IntEnum):
    """Fusion pattern of an operator (TVM's OpPatternKind, same order), and ALIAS."""

    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    COMM_REDUCE = 3
    OUT_ELEMWISE_FUSABLE = 4
    OPAQUE = 8
    ALIAS = 16  # no kernel: the output is the input's buffer under another shape


@dataclass(frozen=True)
class OpSpec:
    op_type: str
    kind: Kind
    infer: Callable
    lower: Callable | None = None
    fold: Callable | None = None
    check: Callable | None = None
    min_opset: int = 1
    # (node, inputs, opset) -> (inventory operator, params, kernel arguments) when the node alone
    # is an inventory operator (pools, softmax, layer_norm): its default schedule and templates
    # then apply. An argument is an input position, or an array the compiler supplies.
    inventory: Callable | None = None


OPS: dict[str, OpSpec] = {}


def register(op_type: str, kind: Kind, infer, lower=None, fold=None, check=None, min_opset: int = 1,
             inventory=None):
    OPS[op_type] = OpSpec(op_type, kind, infer, lower, fold, check, min_opset, inventory)


# ----------------------------------------------------------------------------- lazy reads

@dataclass
class Lazy:
    """An elementwise view: `read(index tuple) -> Expr` over `shape`. `tensor` is set when the
    view is a plain Tensor (a kernel argument or a materialized stage), so an anchor can take it."""

    shape: tuple
    dtype: str
    read: Callable
    tensor: Tensor | None = None

    @staticmethod
    def of(t: Tensor) -> "Lazy":
        return Lazy(tuple(t.shape), t.dtype, lambda idx: t[tuple(idx)], t)

    @staticmethod
    def scalar(value, dtype: str, shape=()) -> "Lazy":
        """A constant (a one-element tensor of the model) embedded in the expression."""
        c = E.Const(value.item() if hasattr(value, "item") else value, dtype)
        return Lazy(tuple(shape), dtype, lambda idx: c)


def materialize(x: Lazy, name: str, tag: str = "elemwise") -> Tensor:
    """The Tensor of a Lazy view: itself when it is one, else one compute stage."""
    if x.tensor is not None:
        return x.tensor
    if not x.shape:  # a 0-d value is computed as one element
        return compute((1,), lambda i: x.read(()), name=name, tag=tag)
    return compute(x.shape, lambda *i: x.read(i), name=name, tag=tag)


def broadcast(x: Lazy, shape: tuple) -> Callable:
    """read(out_index) of `x` broadcast (numpy rules) to `shape`."""
    lead = len(shape) - len(x.shape)
    dims = x.shape

    def read(idx):
        return x.read(tuple(0 if s == 1 and shape[lead + d] != 1 else idx[lead + d] for d, s in enumerate(dims)))
    return read


# ----------------------------------------------------------------------------- data-dependent indices

# {id(node): its position in the fused group being lowered}, set by workloads' lowering
_GROUP_POSITIONS: ContextVar[dict | None] = ContextVar("group_positions", default=None)
_SITE = re.compile(r"^(\w+) #(\d+|\?): ")


def lowering_group(nodes) -> None:
    """`nodes` (a fused group, in order) are lowered next, in this context: from now until the
    next group, `data_index` names each node's checks by its position in the group (structural,
    so a repeated layer keeps one workload key; the runtime maps a failed check back to the node).
    Not a `with` block: a group's Lazy reads run when its output is materialized, after its
    nodes' lowerings return."""
    _GROUP_POSITIONS.set({id(n): i for i, n in enumerate(nodes)})


def node_site(node: Node, what: str) -> str:
    """The site text of a check in `node`'s lowering: `Gather #2: indices` (op type, position in
    its group, which input); site_position reads the position back."""
    positions = _GROUP_POSITIONS.get() or {}
    pos = positions.get(id(node))
    return f"{node.op_type} #{'?' if pos is None else pos}: {what}"


def site_position(site: str) -> tuple:
    """(op type, position in the group or None) of a node_site text; (None, None) for another
    site (a custom compute's stage read)."""
    m = _SITE.match(site)
    if m is None:
        return None, None
    return m.group(1), None if m.group(2) == "?" else int(m.group(2))


def data_index(node: Node, index: E.Expr, n: int, what: str = "indices", negative: bool = True) -> E.Expr:
    """An index into an axis of `n` elements read from a run-time tensor, made safe: checked at
    run time against [-n, n) with `negative` (ONNX's negative indices count from the end, wrapped
    once: -1 is the last) or [0, n), so an index outside is the model's KernelRuntimeError naming
    `node` and `what`, the value and the range, never a wrong element. Returns the index in [0, n)."""
    if index.dtype != "int64":
        index = index.astype("int64")
    # wrapped in the node, not by `% n`, which index arithmetic drops where n is 1 (expr.CheckedIndex)
    return E.checked_index(index, -n if negative else 0, n, node_site(node, what), wrap=negative)


# ----------------------------------------------------------------------------- attributes and checks

def ints(node: Node, key: str, default=None):
    v = node.attrs.get(key, default)
    return None if v is None else tuple(int(a) for a in v)


def axis_of(node: Node, axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < rank:
        raise ShapeError(f"{node.op_type} node {node.name!r}: {what} {axis} out of range for rank {rank}")
    return axis % rank


def const_input(node: Node, inputs: list, i: int, what: str):
    """The constant array of input i (a shape, axes, pads...), which must be known at compile time."""
    v = inputs[i] if i < len(inputs) else None
    if v is None:
        return None
    if v.const is None:
        raise ShapeError(f"{node.op_type} node {node.name!r}: {what} (input {v.name!r}) must be a constant "
                         "known at compile time; tunefarm compiles static shapes only", needs_constant=v.name)
    return v.const


def broadcast_shapes(node: Node, *shapes) -> tuple:
    try:
        return tuple(int(s) for s in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(f"{node.op_type} node {node.name!r}: shapes {', '.join(map(str, shapes))} "
                         "cannot be broadcast together") from None


def same_dtype(node: Node, inputs) -> str:
    dtypes = {v.dtype for v in inputs if v is not None}
    if len(dtypes) != 1:
        raise ShapeError(f"{node.op_type} node {node.name!r}: inputs have different dtypes {sorted(dtypes)}")
    return dtypes.pop()


FLOATS = ("float32", "float64")


__all__ = ["Kind", "OpSpec", "OPS", "register", "Lazy", "materialize", "broadcast", "ints", "axis_of",
           "const_input", "broadcast_shapes", "same_dtype", "FLOATS", "data_index", "node_site", "site_position",
           "lowering_group"]
