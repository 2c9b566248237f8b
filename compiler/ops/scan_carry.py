"""The `scan_carry` rewrite: a scan written as a masked reduction, computed as a running carry.

A cumulative sum (or max, min; a cumulative product is the exp of a cumulative sum of logs) is
written the way the language allows, as a reduction whose condition ties the reduced axis to an
output axis of the same range: `out[..., i] = sum(f(x[..., k]), k, where=k <= i)`. Computed as
written it is O(L²) per row: every point of the scanned axis reduces its whole prefix again.

The rewrite (compiler/rewrite.py, `Schedule.rewrite(t, "scan_carry")`) takes a reduction with one
reduce axis k whose condition is one comparison `k <= i + c` (c <= 0: `k <= i`, `k < i`, written
either way round) with i an output axis, and whose summand does not read i. The new stage reads
its own output one step back along i:

    out[..., i] = combine(select(i > 0, out[..., i - 1], identity), select(0 <= i + c < K, f(i + c), identity))

— the carry is the previous point of the output, so a loop over i that runs in order, serial,
computes the scan in O(L); every other axis stays free (parallel, vectorized, unrolled). The
stage keeps the original tensor (readers and arguments unchanged) and reads that tensor itself,
so its loop over i must not be vectorized, parallel or reordered backwards: the default schedule
(schedule_rules' scan rule) keeps i serial and inside the loops of the other axes it tiles.
Float sums add in another order than the masked form (left to right instead of k's order per
point: the same order, in fact, and the same terms); max and min and integers are exact.
"""

from __future__ import annotations

from ..arith import to_lin
from ..errors import ScheduleError
from ..expr import INDEX_DTYPE, Binary, Compare, Const, Select, Var, substitute, walk
from ..rewrite import register_rewrite
from ..tensor import ComputeOp, IterVar, Reduce, compute_from_axes, reduce_identity

SCAN_COMBINERS = ("sum", "max", "min")


def scan_plan(op) -> tuple | None:
    """(output axis position d, offset c) when `op` is a scan written as a masked reduction
    (module docstring): one reduce axis k, the condition `k <= i + c` with c <= 0 and i = op.axis[d],
    a summand that does not read i; else None."""
    if not isinstance(op, ComputeOp) or not isinstance(op.body, Reduce):
        return None
    body = op.body
    if body.combiner not in SCAN_COMBINERS or body.where is None or len(op.reduce_axis) != 1:
        return None
    k = op.reduce_axis[0].var
    cond = body.where
    if not isinstance(cond, Compare) or cond.op not in ("le", "lt", "ge", "gt"):
        return None
    # normalize to `lhs <= 0` with lhs linear
    a, b = (cond.a, cond.b) if cond.op in ("le", "lt") else (cond.b, cond.a)
    try:
        lin = to_lin(a - b, {})
    except Exception:     # not affine index arithmetic
        return None
    terms = [(v, c) for v, c in lin.terms.values()]
    if len(terms) != 2 or not all(isinstance(v, Var) for v, _ in terms):
        return None
    coefs = {v: c for v, c in terms}
    if coefs.get(k) != 1:
        return None
    i = next((v for v in coefs if v is not k), None)
    axes = [ax.var for ax in op.axis]
    if i is None or i not in axes or coefs[i] != -1:
        return None
    c = -lin.const - (1 if cond.op in ("lt", "gt") else 0)     # k - i + const <= 0 (or < 0)
    if c > 0:
        return None
    if any(isinstance(n, Var) and n is i for n in walk(body.source)):
        return None
    return axes.index(i), c


def rewrite_scan_carry(op):
    """The `scan_carry` rewrite of a stage (module docstring); ScheduleError where scan_plan
    finds no scan."""
    plan = scan_plan(op)
    if plan is None:
        raise ScheduleError(f"rewrite scan_carry: {getattr(op, 'name', op)} is no scan written as a masked "
                            "reduction (one reduce axis k, where=k <= i along an output axis i)")
    d, c = plan
    body = op.body
    K = op.reduce_axis[0].extent
    axes = [IterVar(ax.name, ax.extent) for ax in op.axis]
    mapping = {ax.var: nv.var for ax, nv in zip(op.axis, axes)}
    i = axes[d].var
    ident = Const(reduce_identity(body.combiner, op.dtype), op.dtype)
    term = substitute(body.source, {**mapping, op.reduce_axis[0].var: i + c if c else i})
    lo_ok = None if c == 0 else Compare("ge", i, Const(-c, INDEX_DTYPE))
    hi_ok = None if op.axis[d].extent + c <= K else Compare("lt", i + c if c else i, Const(K, INDEX_DTYPE))
    for test in (lo_ok, hi_ok):
        if test is not None:
            term = Select(test, term, ident)
    prev_idx = [nv.var for nv in axes]
    prev_idx[d] = i - 1
    prev = Select(Compare("gt", i, Const(0, INDEX_DTYPE)), op.output[tuple(prev_idx)], ident)
    value = Binary("add" if body.combiner == "sum" else body.combiner, prev, term, op.dtype)
    return compute_from_axes(op.name, axes, value, tag="scan_carry", attrs={"scan_axis": d})


def scan_axis(op) -> int | None:
    """The scanned axis of a stage the rewrite made (its loop must run serial, in order), else None."""
    if isinstance(op, ComputeOp) and op.tag == "scan_carry":
        return int(op.attrs["scan_axis"])
    return None


register_rewrite("scan_carry", rewrite_scan_carry)

__all__ = ["scan_plan", "rewrite_scan_carry", "scan_axis", "SCAN_COMBINERS"]
