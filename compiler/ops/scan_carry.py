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

from ..arith import expr_range, to_lin
from ..errors import ScheduleError
from ..expr import INDEX_DTYPE, Binary, Compare, Const, Select, Var, substitute, walk
from ..rewrite import register_rewrite
from ..tensor import ComputeOp, IterVar, Reduce, compute_from_axes, reduce_identity

SCAN_COMBINERS = ("sum", "max", "min")


def scan_plan(op) -> tuple | None:
    """(output axis position d, offset c, reverse) when `op` is a scan written as a masked
    reduction (module docstring): one reduce axis k of extent K, the condition `k <= i + c` with
    c <= 0 (forward) or `k >= i + c` with K <= N + c (reverse; N the extent of i = op.axis[d]:
    the last point reduces at most one term), a summand that does not read i; else None."""
    if not isinstance(op, ComputeOp) or not isinstance(op.body, Reduce):
        return None
    body = op.body
    if body.combiner not in SCAN_COMBINERS or body.where is None or len(op.reduce_axis) != 1:
        return None
    k = op.reduce_axis[0].var
    cond = body.where
    if not isinstance(cond, Compare) or cond.op not in ("le", "lt", "ge", "gt"):
        return None
    # normalized to `lhs <= 0` (or < 0), lhs linear
    a, b = (cond.a, cond.b) if cond.op in ("le", "lt") else (cond.b, cond.a)
    lin = to_lin(a - b, {})
    terms = [(v, c) for v, c in lin.terms.values()]
    if len(terms) != 2 or not all(isinstance(v, Var) for v, _ in terms):
        return None
    coefs = {v: c for v, c in terms}
    if coefs.get(k) not in (1, -1):
        return None
    i = next((v for v in coefs if v is not k), None)
    axes = [ax.var for ax in op.axis]
    if i is None or i not in axes or coefs[i] != -coefs[k]:
        return None
    strict = 1 if cond.op in ("lt", "gt") else 0
    if any(isinstance(n, Var) and n is i for n in walk(body.source)):
        return None
    d = axes.index(i)
    if coefs[k] == 1:         # k - i + const <= 0: k <= i - const
        c = -lin.const - strict
        return (d, c, False) if c <= 0 else None
    c = lin.const + strict    # i - k + const <= 0: k >= i + const
    return (d, c, True) if op.reduce_axis[0].extent <= op.axis[d].extent + c else None


def _carry_value(op, self_tensor, axes, d: int, at):
    """combine(select(j > 0, self[.., j - 1], identity), select(0 <= at < K, f(at), identity)),
    j = axes[d], the summand read at k = `at`."""
    body = op.body
    K = op.reduce_axis[0].extent
    j = axes[d].var
    ident = Const(reduce_identity(body.combiner, op.dtype), op.dtype)
    mapping = {ax.var: nv.var for p, (ax, nv) in enumerate(zip(op.axis, axes)) if p != d}
    term = substitute(body.source, {**mapping, op.reduce_axis[0].var: at})
    lo, hi = expr_range(at, {nv.var: (0, nv.extent - 1) for nv in axes}) or (0, K)
    for ok, test in ((lo >= 0, Compare("ge", at, Const(0, INDEX_DTYPE))), (hi < K, Compare("lt", at, Const(K, INDEX_DTYPE)))):
        if not ok:
            term = Select(test, term, ident)
    prev_idx = [nv.var for nv in axes]
    prev_idx[d] = j - 1
    prev = Select(Compare("gt", j, Const(0, INDEX_DTYPE)), self_tensor[tuple(prev_idx)], ident)
    return Binary("add" if body.combiner == "sum" else body.combiner, prev, term, op.dtype)


def rewrite_scan_carry(op):
    """The `scan_carry` rewrite of a stage (module docstring); ScheduleError where scan_plan
    finds no scan. A forward scan reads the stage's own tensor one step back; a reverse one
    (`k >= i + c`) is a forward carry over the reversed axis j = N-1-i (a stage of its own that
    reads itself), which the stage reads reversed."""
    plan = scan_plan(op)
    if plan is None:
        raise ScheduleError(f"rewrite scan_carry: {getattr(op, 'name', op)} is no scan written as a masked "
                            "reduction (one reduce axis k, where=k <= i or k >= i along an output axis i)")
    d, c, reverse = plan
    axes = [IterVar(ax.name, ax.extent) for ax in op.axis]
    i = axes[d].var
    if not reverse:
        value = _carry_value(op, op.output, axes, d, i + c if c else i)
        return compute_from_axes(op.name, axes, value, tag="scan_carry", attrs={"scan_axis": d})
    N = op.axis[d].extent
    raxes = [IterVar(ax.name, ax.extent) for ax in op.axis]
    zero = Const(reduce_identity(op.body.combiner, op.dtype), op.dtype)
    rev = compute_from_axes(f"{op.name}_rev", raxes, zero, tag="scan_carry", attrs={"scan_axis": d})
    j = raxes[d].var
    rev_op = rev.op
    assert isinstance(rev_op, ComputeOp)
    rev_op.body = _carry_value(op, rev, raxes, d, (N - 1 + c) - j)   # reads itself: made first, then its body
    idx = [nv.var for nv in axes]
    idx[d] = (N - 1) - i
    return compute_from_axes(op.name, axes, rev[tuple(idx)], tag="scan_reverse")


def scan_axis(op) -> int | None:
    """The scanned axis of a stage the rewrite made (its loop must run serial, in order), else None."""
    if isinstance(op, ComputeOp) and op.tag == "scan_carry":
        return int(op.attrs["scan_axis"])
    return None


register_rewrite("scan_carry", rewrite_scan_carry)

__all__ = ["scan_plan", "rewrite_scan_carry", "scan_axis", "SCAN_COMBINERS"]
