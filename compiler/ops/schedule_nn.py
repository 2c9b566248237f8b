"""Default schedules for softmax and layer_norm.

Both are per-row statistics (max and sum, mean and variance: reductions over `axis`) and
elementwise stages that read them. The output stage is split into
  [axes before `axis`, fused, parallel] [axis] [axes after `axis`, the last one vectorized]
and every other stage is computed at the fused outer loop, so a block of rows, its statistics
and its exponentials stay in L1 and the input is read from memory once.

- `axis` is the last axis: a statistic along a row is a chain of dependent adds (or maxes).
  Each statistic is rfactored into one partial statistic per vector lane (element j of the row
  goes to lane j mod vl) and a final reduction over the lanes, so the row is read with vector
  loads into a vector accumulator. The outer loop walks blocks of up to 8 rows, unrolled
  inside the reduction loops: 8 independent accumulator chains in flight. Rows no longer than
  one vector keep a scalar chain per row.
- `axis` is not last: the statistics are vectors over the trailing axes, which are unit-stride
  in the input, with the reduction loop outside the vector: one vector load per step.
"""

from __future__ import annotations

import numpy as np

from ..schedule import Schedule, create_schedule
from .schedule_common import MAX_LANES, fuse_all, lanes, largest_divisor, vectorize_inner, want_parallel

LANE_VECTORS = 2  # vectors of partial statistics on rows of 4 vectors or more: two chains
ROW_BLOCK = 8  # rows per block: independent reduction chains (and 8 rows of exp = 32 KB at 1024)


def schedule_norm(opdef, target=None) -> Schedule:
    out = opdef.output
    s = create_schedule(out)
    axis = opdef.params["axis"]
    vl = lanes(target, out.dtype)
    blocked = axis == len(out.shape) - 1 and axis > 0 and largest_divisor(out.shape[axis - 1], ROW_BLOCK) > 1
    if axis == len(out.shape) - 1 and out.shape[axis] > vl:
        wide = out.shape[axis] >= 4 * vl and not blocked
        _statistics_per_lane(s, s[out], vl * (LANE_VECTORS if wide else 1))
    st = s[out]
    axes = list(st.op.axis)
    before, red, after = axes[:axis], axes[axis], axes[axis + 1:]
    work = int(np.prod(out.shape)) * 8
    _vectorize_row(st, after[-1] if after else red, vl)
    outer, rows = list(before), False
    if before and not after:
        rb = largest_divisor(before[-1].extent, ROW_BLOCK)
        if rb > 1:
            rows = True
            if rb < before[-1].extent:
                outer[-1], _ = st.split(before[-1], factor=rb)
            else:
                outer.pop()
    loop = fuse_all(st, outer)
    if loop is not None and want_parallel(target, work) and loop.extent > 1:
        st.parallel(loop)
    for other in s.stages:
        if other is st:
            continue
        if loop is not None:
            other.compute_at(st, loop)
        _schedule_inner_stage(other, axis, vl, rows)
    return s


def _vectorize_row(stage, axis, vl: int):
    """`axis` vectorized two registers at a time where it is at least 4 registers long (two
    independent exp polynomials in flight: one alone waits on its own latency), its tail
    masked in the last iteration only (lowering peels it); else as vectorize_inner chooses."""
    if axis.extent >= 4 * vl and axis.extent % (2 * vl) and 2 * vl <= MAX_LANES:
        outer, inner = stage.split(axis, factor=2 * vl)
        stage.vectorize(inner)
        return outer
    return vectorize_inner(stage, axis, vl, max_vectors=2)


def _statistics_per_lane(s, output_stage, vl: int):
    """rfactor every statistic over the (last) row axis into `vl` partial statistics, a new last
    axis the inner stage schedule vectorizes; the statistic becomes a sum/max over the lanes.
    rfactor only accepts splits before it, so this runs before anything else is scheduled."""
    for stage in list(s.stages):
        if stage is not output_stage and stage.op.reduce_axis:
            _, lane = stage.split(stage.op.reduce_axis[0], factor=vl)
            s.rfactor(stage.tensor, lane, factor_axis=len(stage.op.axis))


def _schedule_inner_stage(stage, axis, vl, rows: bool):
    """A statistic, partial statistic or elementwise stage computed per row block.

    `rows`: the block holds several rows along axis - 1, which a reduction unrolls inside its
    reduction loop (independent accumulator chains)."""
    op = stage.op
    rax = list(op.reduce_axis)
    trailing = op.axis[axis + 1:]
    row = op.axis[axis - 1] if rows and rax else None
    if rax and not trailing:  # one scalar accumulator per row
        if row is not None:
            stage.reorder(*[a for a in op.axis if a is not row], *rax, row)
            stage.unroll(row)
        return
    vec = trailing[-1] if trailing else op.axis[axis]
    lo = vectorize_inner(stage, vec, vl, max_vectors=2, carried=True) if rax else _vectorize_row(stage, vec, vl)
    inner = stage.leaf_iter_vars[stage.leaf_iter_vars.index(lo) + 1] if lo is not None else vec
    if rax:  # the reduction loop outside the vector of accumulators (and the block's rows)
        rest = [a for a in op.axis if a is not vec and a is not row]
        unrolled = [row] if row is not None else []
        stage.reorder(*rest, *([lo] if lo is not None else []), *rax, *unrolled, inner)
        if row is not None:
            stage.unroll(row)
