"""Canonical text of a compute DAG and the workload key derived from it.

The text names tensors and variables by position, not by the names the user chose, so the same
operator written twice (in two processes, on two machines) gets the same text and the same key.
"""

from __future__ import annotations

import hashlib

from .expr import Binary, Call, Cast, Compare, Const, Logical, Not, Select, Var
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
    def t(x):
        return _expr_text(x, var_names, op_names)

    if isinstance(e, Var):
        return var_names.get(e, e.name)
    if isinstance(e, Const):
        return f"{e.value!r}:{e.dtype}"
    if isinstance(e, Binary):
        return f"{e.op}({t(e.a)},{t(e.b)})"
    if isinstance(e, (Compare, Logical)):
        return f"{e.op}({t(e.a)},{t(e.b)})"
    if isinstance(e, Not):
        return f"not({t(e.a)})"
    if isinstance(e, Select):
        return f"select({t(e.cond)},{t(e.t)},{t(e.f)})"
    if isinstance(e, Cast):
        return f"cast<{e.dtype}>({t(e.value)})"
    if isinstance(e, Call):
        return f"{e.func}({','.join(t(a) for a in e.args)})"
    if isinstance(e, TensorRead):
        return f"{op_names[id(e.tensor.op)]}[{','.join(t(i) for i in e.indices)}]"
    if isinstance(e, Reduce):
        axes = ",".join(var_names[a.var] for a in e.axes)
        where = "" if e.where is None else f",where={t(e.where)}"
        return f"{e.combiner}({t(e.source)},axes=[{axes}]{where})"
    raise TypeError(f"cannot print {type(e).__name__} in canonical text")
