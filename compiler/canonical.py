"""Canonical text of a compute DAG and the workload key derived from it.

The text names tensors and variables by position, not by the names the user chose, so the same
operator written twice (in two processes, on two machines) gets the same text and the same key.
"""

from __future__ import annotations

import hashlib

from .expr import Binary, Call, Cast, CheckedIndex, Compare, Const, Logical, Not, Select, Var, by_kind, fold
from .tensor import PlaceholderOp, Reduce, TensorRead, topo_order


def canonical_text(outputs) -> str:
    """One line per operation, producers first; deterministic for structurally equal DAGs."""
    if not isinstance(outputs, (list, tuple)):
        outputs = [outputs]
    ops = topo_order(outputs)
    op_names = {id(op): f"t{i}" for i, op in enumerate(ops)}
    lines = []
    for op in ops:
        name = op_names[id(op)]
        shape = ",".join(map(str, op.shape))
        if isinstance(op, PlaceholderOp):
            lines.append(f"{name} = placeholder({op.dtype}, [{shape}])")
            continue
        var_names = {ax.var: f"i{d}" for d, ax in enumerate(op.axis)}
        var_names.update({ax.var: f"r{d}" for d, ax in enumerate(op.reduce_axis)})
        reduce_dom = ",".join(str(ax.extent) for ax in op.reduce_axis)
        body = _expr_text(op.body, var_names, op_names)
        lines.append(f"{name} = compute({op.dtype}, [{shape}], reduce=[{reduce_dom}], tag={op.tag!r}) {body}")
    outs = ",".join(op_names[id(t.op)] for t in outputs)
    lines.append(f"outputs {outs}")
    return "\n".join(lines)


def workload_key(outputs) -> str:
    """A stable 32-hex-digit hash of the canonical text."""
    return hashlib.sha256(canonical_text(outputs).encode()).hexdigest()[:32]


def _expr_text(e, var_names, op_names) -> str:
    def reduce_text(r, kids):
        axes = ",".join(var_names[a.var] for a in r.axes)
        where = "" if r.where is None else f",where={kids[1]}"
        return f"{r.combiner}({kids[0]},axes=[{axes}]{where})"

    def unknown(node, kids):
        raise TypeError(f"cannot print {type(node).__name__} in canonical text")

    operator = lambda n, k: f"{n.op}({k[0]},{k[1]})"   # noqa: E731
    table = {
        Var: lambda n, k: var_names.get(n, n.name),
        Const: lambda n, k: f"{n.value!r}:{n.dtype}",
        Binary: operator, Compare: operator, Logical: operator,
        Not: lambda n, k: f"not({k[0]})",
        Select: lambda n, k: f"select({k[0]},{k[1]},{k[2]})",
        Cast: lambda n, k: f"cast<{n.dtype}>({k[0]})",
        Call: lambda n, k: f"{n.func}({','.join(k)})",
        CheckedIndex: lambda n, k: f"checked<{n.lo},{n.hi},{n.site!r}{',wrap' if n.wrap else ''}>({k[0]})",
        TensorRead: lambda n, k: f"{op_names[id(n.tensor.op)]}[{','.join(k)}]",
        Reduce: reduce_text,
    }
    return fold(e, by_kind(table, unknown))
