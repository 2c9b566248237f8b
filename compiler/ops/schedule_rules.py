"""Rules for the default schedule of any compute DAG, by structure, with their knobs.

compiler/ops/schedule_anchor.py schedules a DAG outside the inventory by its anchor (a
convolution or matrix product an operator's schedule takes) or, failing that, by the kind of its
stages. The rules here fit any DAG a user writes, whatever its operator:

- stride phases: a sum over a zero-stuffed input (a transposed convolution written as
  zero-stuffing + padding + a correlation with the flipped kernel; any `select(… % s == 0, x,
  0)` factor) is rewritten into its dense phases (compiler/ops/stride_phases.py), so no
  multiply by a known zero is computed; each phase is then a reduction scheduled as any other.
- row fusion: reductions over the same rows feeding elementwise stages (softmax, LayerNorm,
  RMSNorm, a log-sum-exp: every stage indexed by the output's leading "row" axes, the
  reductions reducing what follows) run per row: the output's rows fused and parallel, every
  other stage computed inside the row loop, so a row is read from the L1/L2 while it is there;
  an expensive elementwise stage several stages read (softmax's exp) is computed once per row
  into a row buffer instead of being recomputed in each reader; each reduction keeps partial
  results in vector lanes (rfactor) along its unit-stride reduced axis.

Each rule's knobs (`rule_choices`, the default first) are the recipe sketch of the tuner's sketch
space for such a DAG (tuner/space/sketch/recipe.py), so the zero-trial schedule is the search's
first point and the search moves from it one knob at a time.
"""

from __future__ import annotations

import math

from ..arith import unit_step
from ..errors import ScheduleError
from ..expr import Call, walk
from ..schedule import Schedule, create_schedule
from ..target import resolve_target
from ..tensor import ComputeOp, Reduce, TensorRead, topo_order
from .scan_carry import scan_axis, scan_plan
from .schedule_common import MAX_LANES, lanes, parallel_loop
from .schedule_stages import schedule_stages_at_root
from .stride_phases import stride_phase_plan

ROW_LANE_VECTORS = (2, 1, 4)   # vectors of lane partials per reduction step, the default first (row fusion)
SCAN_BLOCKS = (8, 4, 16)       # independent carries per serial step along a contiguous scan axis (scan rule)


# ---------------------------------------------------------------------------- which rule
def rule_of(opdef) -> str | None:
    """The rule of this module that schedules `opdef`'s DAG: "stride_phases", "row_fusion", or
    None (schedule_anchor's structural schedules)."""
    out = opdef.output
    computes = [op for op in topo_order([out]) if isinstance(op, ComputeOp)]
    if any(scan_plan(op) is not None for op in computes):
        return "scan"
    if any(stride_phase_plan(op) is not None for op in computes):
        return "stride_phases"
    if row_fusion_rows(out, computes) is not None:
        return "row_fusion"
    return None


def rule_choices(opdef, target=None) -> dict | None:
    """{knob: values, the default first} of the rule scheduling `opdef`, None when none does."""
    target = resolve_target(target)
    rule = rule_of(opdef)
    if rule == "scan":
        return {"carry": [True, False], "block": list(SCAN_BLOCKS)}
    if rule == "stride_phases":
        return {"phases": [True, False]}
    if rule == "row_fusion":
        return {"fuse_rows": [True, False], "lane_vectors": list(ROW_LANE_VECTORS),
                "buffer_expensive": [True, False]}
    return None


def schedule_by_rule(opdef, target=None, choices: dict | None = None) -> Schedule | None:
    """The schedule of `opdef` by its rule with `choices` (the defaults where absent); None when
    no rule of this module takes the DAG."""
    target = resolve_target(target)
    rule = rule_of(opdef)
    if rule is None:
        if choices:
            raise ScheduleError(f"{opdef.name}: no rule of schedule_rules takes this DAG")
        return None
    defaults = {k: v[0] for k, v in (rule_choices(opdef, target) or {}).items()}
    unknown = set(choices or {}) - set(defaults)
    if unknown:
        raise ScheduleError(f"{opdef.name}: the {rule} rule has no knobs {sorted(unknown)}")
    knobs = {**defaults, **(choices or {})}
    if rule == "scan":
        return _schedule_scan(opdef, target, **knobs)
    if rule == "stride_phases":
        return _schedule_stride_phases(opdef, target, **knobs)
    return _schedule_row_fusion(opdef, target, **knobs)


# ---------------------------------------------------------------------------- scans
def _schedule_scan(opdef, target, carry: bool, block: int) -> Schedule:
    """Scans written as masked reductions rewritten into running carries (scan_carry), each
    scheduled by _scan_stage; the other stages as schedule_stages_at_root does."""
    out = opdef.output
    s = create_schedule(out)
    if carry:
        for st in list(s.stages):
            if isinstance(st.op, ComputeOp) and scan_plan(st.op) is not None:
                s.rewrite(st.tensor, "scan_carry")
    s = schedule_stages_at_root(s, out, target)
    for st in s.stages:
        if scan_axis(st.op) is not None:
            _scan_stage(st, target, block)
    return s


def _scan_stage(st, target, block: int) -> None:
    """A running carry's loops: the scanned axis serial and in order, inside the loops of the
    other axes' blocks. The last other axis is tiled inside the scan loop: vectors of it where
    it follows the scanned axis (contiguous in memory: a scan along rows of a row-major array),
    else `block` rows unrolled (independent carries whose adds overlap, scalar loads); the blocks
    and the axes before them fused and parallel."""
    op = st.op
    d = scan_axis(op)
    assert d is not None    # the caller found the stage by it; narrows the type
    axes = list(op.axis)
    others = [ax for p, ax in enumerate(axes) if p != d]
    if not others:
        return
    v = others[-1]
    vl = lanes(target, op.dtype)
    if axes.index(v) > d:
        f = vl * max(1, min(4, v.extent // vl, MAX_LANES // vl)) if v.extent >= vl else v.extent
        mode = "vectorize"
    else:
        f = min(block, v.extent)
        mode = "unroll"
    if f < v.extent:
        vo, vi = st.split(v, factor=f)
        outer = others[:-1] + [vo]
    else:
        vi, outer = v, others[:-1]
    st.reorder(*outer, axes[d], vi)
    if mode == "vectorize" and f >= vl:
        st.vectorize(vi)
    elif mode == "unroll":
        st.unroll(vi)
    if outer:
        parallel_loop(st, outer, None, target, math.prod(op.shape) * 4)


# ---------------------------------------------------------------------------- stride phases
def _schedule_stride_phases(opdef, target, phases: bool) -> Schedule:
    out = opdef.output
    s = create_schedule(out)
    if phases:
        for st in list(s.stages):
            if isinstance(st.op, ComputeOp) and stride_phase_plan(st.op) is not None:
                s.rewrite(st.tensor, "stride_phases")
    return schedule_stages_at_root(s, out, target)


# ---------------------------------------------------------------------------- row fusion
def row_fusion_rows(out, computes) -> int | None:
    """k, the number of the output's leading axes that are its rows, when the DAG is reductions
    over rows feeding elementwise stages: at least one reduction; every compute's shape is the
    output's first k axes (a row statistic) or the output's shape; each reads every other compute
    at its own row (its first k indices are its own first k axes); reductions of the output's
    shape are not taken (those are products, the anchor's). None otherwise."""
    shape = tuple(out.op.shape)
    if len(computes) < 2 or len(shape) < 2 or isinstance(out.op.body, Reduce):
        return None
    reductions = [op for op in computes if op.reduce_axis]
    if not reductions:
        return None
    k = len(reductions[0].shape)
    if not 1 <= k < len(shape) or math.prod(shape[:k]) < 2:
        return None
    stats, full = shape[:k], shape
    for op in computes:
        if tuple(op.shape) not in (stats, full) or (op.reduce_axis and tuple(op.shape) != stats):
            return None
        own = [a.var for a in op.axis[:k]]
        for n in walk(op.body):
            if isinstance(n, TensorRead) and isinstance(n.tensor.op, ComputeOp):
                if list(n.indices[:k]) != own:
                    return None
    return k


def _expensive(op) -> bool:
    return any(isinstance(n, Call) for n in walk(op.body))


def _schedule_row_fusion(opdef, target, fuse_rows: bool, lane_vectors: int, buffer_expensive: bool) -> Schedule:
    out = opdef.output
    computes = [op for op in topo_order([out]) if isinstance(op, ComputeOp)]
    k = row_fusion_rows(out, computes)
    s = create_schedule(out)
    if not fuse_rows or k is None:
        return schedule_stages_at_root(s, out, target)
    vl = lanes(target, out.dtype)
    readers: dict = {}
    for op in computes:
        for t in op.input_tensors():
            readers.setdefault(id(t.op), []).append(op)
    # the output's rows, fused and parallel; the row's columns vectorized
    ost = s[out]
    rows, cols = list(ost.op.axis[:k]), list(ost.op.axis[k:])
    row = ost.fuse(*rows) if len(rows) > 1 else rows[0]
    _vector_columns(ost, cols, vl)
    work = math.prod(out.shape) * len(computes)
    parallel_loop(ost, [row], None, target, work)
    row_leaf = next(iv for iv in ost.leaf_iter_vars if iv is row or iv.extent == row.extent)
    for op in computes:
        if op is out.op:
            continue
        st = s[op.output]
        if not op.reduce_axis:
            if tuple(op.shape) == tuple(out.shape) and buffer_expensive and _expensive(op) \
                    and len(readers.get(id(op), [])) > 1:
                st.compute_at(ost, row_leaf)
                _vector_columns(st, list(st.op.axis[k:]), vl)
            else:
                st.compute_inline()
    for op in computes:
        if op.reduce_axis and op is not out.op:
            _row_reduction(s, s[op.output], ost, row_leaf, min(vl * lane_vectors, MAX_LANES))
    return s


def _vector_columns(st, cols: list, vl: int) -> None:
    """The last column axis vectorized by whole registers (up to 4), the rest serial."""
    last = cols[-1]
    if last.extent >= vl:
        f = vl * max(1, min(4, last.extent // vl, MAX_LANES // vl))
        if f < last.extent:
            _, inner = st.split(last, factor=f)
        else:
            inner = last
        st.vectorize(inner)


def _row_reduction(s, st, ost, row_leaf, width: int) -> None:
    """A row statistic computed inside the output's row loop: partial results per lane along its
    last reduce axis (an rfactor of it split by `width`) where every read walks that axis with
    unit stride and it is at least two widths long, then the lanes combined; else a plain loop."""
    op = st.op
    rax = op.reduce_axis[-1]
    ok = rax.extent >= 2 * width and all(
        unit_step(n.indices[-1], rax.var) and not any(rax.var in walk(i) for i in n.indices[:-1])
        for n in walk(op.body) if isinstance(n, TensorRead) and any(rax.var in walk(i) for i in n.indices))
    if not ok:
        st.compute_at(ost, row_leaf)
        return
    _, lane = st.split(rax, factor=width)
    part = s[s.rfactor(st.tensor, lane, factor_axis=len(op.axis))]
    st.compute_at(ost, row_leaf)
    part.compute_at(ost, row_leaf)
    part.vectorize(part.op.axis[-1])


__all__ = ["rule_of", "rule_choices", "schedule_by_rule", "row_fusion_rows", "ROW_LANE_VECTORS"]
