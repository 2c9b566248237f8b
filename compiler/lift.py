"""Lifting expensive sub-expressions that a reduction recomputes into stages of their own.

A user writes Y[i, j] = Σ_k exp(A[i, k]) · B[j, k]. exp(A[i, k]) does not depend on j, yet as
written it is evaluated at every (i, j, k): N times the exponentials torch computes by taking
exp(A) first. No schedule can remove a recomputation that the compute itself states (a tile
over j evaluates it once per tile at best, and the tile then reads A twice as often); rewriting
the compute can. `lift_recomputed_math(output)` returns the same computation in which each such
sub-expression is a stage, L[i, k] = exp(A[i, k]), that the reduction reads. Where that stage is
computed is then the schedule's choice: materialized at the root by the zero-trial schedule
(compiler/ops/schedule_anchor.py), inlined back or kept at the root by the sketch space (its
producers' "inline" / "root" choice), as Ansor keeps a stage with expensive operations
un-inlined (its `IsStrictlyInlineable`).

A sub-expression of a reduction's body is lifted when
- it costs more than its store and reload: it calls a transcendental function (exp, log, sqrt,
  tanh, sigmoid, erf, sin, cos), raises to a power, or divides floats; sums, products and casts
  are one vector instruction and stay where they are;
- it reads a tensor and leaves out spatial axes of the reduction whose extents multiply to at
  least MIN_REUSE (each lifted value serves that many points of the iteration space);
- the lifted stage, computed over the whole range of its variables, reads nothing out of bounds
  and does nothing that can trap: it is outside any select branch (a branch may read only where
  its condition holds), and in a reduction with a `where` condition (a causal mask, k <= j) it
  reads tensors only at its own variables or constants, each within the tensor's extent, and
  divides no integers (the condition may be what keeps a read in bounds: an index from data,
  an offset past the end). Values the condition leaves out are computed and never read;
- its stage holds at most MAX_LIFTED_ELEMENTS.
The largest such sub-expression is taken (exp(A[i, k]) · 2 + 1 whole, not its exp alone), one
stage per occurrence. The stage's axes are the sub-expression's variables, the output's axes
first in their order, then the reduction's. The rewrite is deterministic and idempotent: a
workload's definition is rewritten the same way wherever it is rebuilt (the builder, a record's
replay), so stored schedules keep addressing the same stages; the lifted stages carry the tag
LIFTED_TAG.

Elementwise stages are left as they are: a value that does not depend on their innermost axis is
loop-invariant there and LLVM hoists it.
"""

from __future__ import annotations

import math

from .dtypes import is_float
from .expr import Binary, Call, Const, Select, Var, children, free_vars, rebuild, substitute, transform, walk
from .tensor import ComputeOp, IterVar, Reduce, Tensor, TensorRead, compute_from_axes, topo_order

LIFTED_TAG = "lifted"
EXPENSIVE_CALLS = frozenset({"exp", "log", "sqrt", "tanh", "sigmoid", "erf", "sin", "cos"})
MIN_REUSE = 4                    # evaluations a lifted value must replace
MAX_LIFTED_ELEMENTS = 1 << 24    # 64 MB of float32


def is_expensive(e) -> bool:
    """Whether the node itself is more work than storing and reloading its value."""
    if isinstance(e, Call):
        return e.func in EXPENSIVE_CALLS
    if isinstance(e, Binary):
        return e.op == "pow" or (e.op == "div" and is_float(e.dtype))
    return False


def lift_recomputed_math(output: Tensor) -> Tensor:
    """`output` computed with the recomputed expensive sub-expressions of its reductions lifted
    into stages (see the module docstring); `output` itself when nothing is lifted."""
    rebuilt: dict = {}   # id(old tensor) -> new tensor
    changed = False
    for op in topo_order([output]):
        if not isinstance(op, ComputeOp):
            continue
        body = _reread(op.body, rebuilt)
        if isinstance(body, Reduce):
            body = _LiftFromReduction(op, body).lifted()
        if body is op.body:
            continue
        changed = True
        rebuilt[id(op.output)] = compute_from_axes(op.name, op.axis, body, op.tag, op.attrs)
    return rebuilt.get(id(output), output) if changed else output


def _reread(body, rebuilt: dict):
    """`body` reading the rebuilt producers instead of the old ones."""
    if not rebuilt:
        return body

    def fn(n):
        if isinstance(n, TensorRead) and id(n.tensor) in rebuilt:
            return TensorRead(rebuilt[id(n.tensor)], n.indices)
        return None
    if isinstance(body, Reduce):
        source = transform(body.source, fn)
        where = transform(body.where, fn) if body.where is not None else None
        if source is body.source and where is body.where:
            return body
        return Reduce(body.combiner, source, body.axes, where)
    return transform(body, fn)


class _LiftFromReduction:
    """The lifting of one reduction stage's body."""

    def __init__(self, op: ComputeOp, body: Reduce):
        self.op, self.body = op, body
        self.extent = {ax.var: ax.extent for ax in op.axis}
        self.extent.update({ax.var: ax.extent for ax in body.axes})
        self.order = [ax.var for ax in op.axis] + [ax.var for ax in body.axes]
        self.count = 0

    def lifted(self):
        source = self._visit(self.body.source)
        if source is self.body.source:
            return self.body
        return Reduce(self.body.combiner, source, self.body.axes, self.body.where)

    def _visit(self, e):
        if isinstance(e, Select):
            return e   # its branches are evaluated only where its condition holds
        if self._worth_lifting(e):
            return self._lift(e)
        kids = children(e)
        if not kids or isinstance(e, TensorRead):
            return e
        new = tuple(self._visit(k) for k in kids)
        return e if all(n is k for n, k in zip(new, kids)) else rebuild(e, new)

    def _worth_lifting(self, e) -> bool:
        if e.dtype == "bool" or isinstance(e, TensorRead):
            return False
        nodes = list(walk(e))
        if not any(is_expensive(n) for n in nodes) or not any(isinstance(n, TensorRead) for n in nodes):
            return False
        used = free_vars(e)
        if not used:   # one value for the whole stage: LLVM hoists it out of every loop
            return False
        reuse = math.prod(ax.extent for ax in self.op.axis if ax.var not in used)
        size = math.prod(self.extent[v] for v in used)
        if reuse < MIN_REUSE or size > MAX_LIFTED_ELEMENTS:
            return False
        return self.body.where is None or self._safe_everywhere(nodes)

    def _safe_everywhere(self, nodes) -> bool:
        """Whether every read of `nodes` stays in bounds, and nothing traps, for every value of
        the variables over their whole extents (what a `where` condition may have guarded)."""
        for n in nodes:
            if isinstance(n, Binary) and n.op in ("floordiv", "floormod"):
                return False
            if isinstance(n, TensorRead):
                for index, dim in zip(n.indices, n.tensor.shape):
                    if isinstance(index, Var):
                        if index not in self.extent or self.extent[index] > dim:
                            return False
                    elif not (isinstance(index, Const) and 0 <= index.value < dim):
                        return False
        return True

    def _lift(self, e):
        used = free_vars(e)
        vars_ = [v for v in self.order if v in used]
        axis = [IterVar(v.name, self.extent[v]) for v in vars_]
        mapping: dict[Var, Var] = {v: ax.var for v, ax in zip(vars_, axis)}
        name = f"{self.op.name}_lifted{self.count}"
        self.count += 1
        stage = compute_from_axes(name, axis, substitute(e, mapping), LIFTED_TAG)
        return TensorRead(stage, tuple(vars_))


__all__ = ["lift_recomputed_math", "is_expensive", "LIFTED_TAG", "MIN_REUSE", "MAX_LIFTED_ELEMENTS"]
