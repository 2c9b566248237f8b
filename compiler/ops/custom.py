"""OpDefs of compute definitions that are not inventory operators.

A user's own compute (a compute file, `Workload.from_compute`), or one rebuilt from its JSON
definition (compiler.serialize) in a build process or from a stored record, becomes an OpDef like
an inventory operator, so spaces, builders and runners treat it no differently. What an
inventory operator states by hand is derived from the DAG:

- flops: the arithmetic on values at each point of each stage's iteration space (Binary and
  Call nodes, plus one per reduction step; index arithmetic and conditions are not counted).
  For a matmul that is 2·M·N·K, as the inventory says.
- reference: the DAG's naive schedule, compiled for this machine on first use. It is what the
  tuner's builder checks candidates against as well (its reference kernel), so a kernel is judged
  the same way here and there; unlike the inventory's references it is not computed in float64.
"""

from __future__ import annotations

import math

import numpy as np

from .. import expr as E
from ..lift import lift_recomputed_math
from ..runtime import build
from ..schedule import create_schedule
from ..tensor import ComputeOp, Reduce, TensorRead, topo_order
from .base import OpDef


def custom_op(name: str, inputs, output, params=None) -> OpDef:
    """The OpDef of a compute definition: kernel arguments `inputs` then `output`.

    Its DAG is the definition with the expensive sub-expressions a reduction would recompute
    lifted into stages of their own (compiler.lift), what every schedule of it starts from; the
    reference runs the definition as written."""
    inputs = list(inputs)
    lifted = lift_recomputed_math(output)
    return OpDef(name, inputs, lifted, dict(params or {}), estimate_flops(lifted), naive_reference(inputs, output))


def estimate_flops(output) -> int:
    """Arithmetic operations on values of the DAG computing `output` (see the module docstring)."""
    total = 0
    for op in topo_order([output]):
        if not isinstance(op, ComputeOp):
            continue
        body = op.body
        per_point = _value_ops(body.source) + 1 if isinstance(body, Reduce) else _value_ops(body)
        total += per_point * math.prod(op.shape) * math.prod(ax.extent for ax in op.reduce_axis)
    return total


def _value_ops(e) -> int:
    """Binary and Call nodes of `e` outside tensor indices and conditions."""
    count, stack = 0, [e]
    while stack:
        n = stack.pop()
        if isinstance(n, (TensorRead, E.Compare, E.Logical, E.Not)):
            continue
        if isinstance(n, (E.Binary, E.Call)):
            count += 1
        stack.extend((n.t, n.f) if isinstance(n, E.Select) else E.children(n))
    return count


def naive_reference(inputs, output):
    """`reference(*arrays) -> output array`: the naive schedule, built once on first call."""
    kernel = None

    def reference(*arrays):
        nonlocal kernel
        if kernel is None:
            kernel = build(create_schedule(output), [*inputs, output], name="reference")
        out = np.empty(output.shape, output.dtype)
        kernel(*arrays, out)
        return out

    return reference


__all__ = ["custom_op", "estimate_flops", "naive_reference"]
