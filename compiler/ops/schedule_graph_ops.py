"""Default schedules of the model operators whose compute DAGs the structural rules of
schedule_anchor would leave as a naive loop nest, recognized by their stages' tags:

- group_norm (InstanceNormalization, GroupNormalization; compiler/graph/ops/normalization.py):
  statistics per (sample, group) in two passes over the group, then the normalized output.
  Each statistic is rfactored into one partial sum per vector lane along the innermost
  (unit-stride) axis, so the group streams in with vector loads into a vector accumulator, and
  the (sample, group) rows run in parallel; the output is an elementwise stage, vectorized along
  its last axis and parallel over the others.
- the Winograd convolution's input transform, matrix products and output transform
  (compiler/ops/winograd.py): schedule_winograd.
- conv_transpose (compiler/graph/ops/conv_transpose.py) with its epilogue (bias, activation):
  the output's last axis in vectors of accumulators, the reduction over input channels and taps
  outside them, computed per tile of the epilogue stage, the tiles in parallel.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ..schedule import Schedule, create_schedule
from ..tensor import ComputeOp, topo_order
from . import schedule_nn
from .schedule_common import lanes, parallel_loop, vectorize_inner
from .schedule_elementwise import schedule_reduce_stage
from .schedule_winograd import WINOGRAD_TAGS, schedule_winograd

STAT_TAGS = ("group_norm_mean", "group_norm_var")


def schedule_tagged(opdef, target) -> Schedule | None:
    """The schedule of a DAG these rules know (see the module docstring), else None."""
    out = opdef.output
    computes = [op for op in topo_order([out]) if isinstance(op, ComputeOp)]
    tags = {op.tag for op in computes}
    if tags & set(WINOGRAD_TAGS):
        return schedule_winograd(opdef, target)
    if out.op.tag == "group_norm" and STAT_TAGS[0] in tags:
        return schedule_group_norm(opdef, target)
    reductions = [op for op in computes if op.reduce_axis]
    axis = softmax_axis(out, reductions)
    if axis is not None:
        return schedule_nn.schedule_norm(SimpleNamespace(output=out, params={"axis": axis}), target)
    if len(reductions) == 1 and reductions[0].tag == "conv_transpose" and len(computes) <= 2:
        return schedule_reduction_epilogue(opdef, target)
    return None


def softmax_axis(out, reductions) -> int | None:
    """The row axis of a fused softmax (graph/ops/nn.py: a Softmax with elementwise producers
    read in its row and elementwise consumers stored through its output): exactly the
    reductions softmax_max and softmax_sum, the output of the statistics' shape but for the row
    axis; else None."""
    if sorted(op.tag for op in reductions) != ["softmax_max", "softmax_sum"]:
        return None
    mx = next(op for op in reductions if op.tag == "softmax_max")
    n, shape, stat = mx.reduce_axis[0].extent, tuple(out.shape), tuple(mx.shape)
    if len(stat) != len(shape) or len(mx.reduce_axis) != 1:
        return None
    axes = [d for d in range(len(shape)) if stat[d] == 1 and shape[d] == n]
    if not axes or any(stat[d] != shape[d] for d in range(len(shape)) if d not in axes):
        return None
    return axes[-1]


def schedule_group_norm(opdef, target) -> Schedule:
    out = opdef.output
    s = create_schedule(out)
    vl = lanes(target, out.dtype)
    work = int(np.prod(out.shape))
    for st in list(s.stages):
        if st.op.tag in STAT_TAGS:
            _lane_statistic(s, st, vl, target, work)
    st = s[out]
    *outer, last = st.op.axis
    lo = vectorize_inner(st, last, vl, max_vectors=2)
    parallel_loop(st, outer, lo, target, work)
    return s


def _lane_statistic(s, stage, vl: int, target, work: int):
    """A statistic [N, G] as partial sums per lane of its innermost reduction axis, [N, G, vl]
    (the rows in parallel, the lanes a vector), then the sum of the lanes."""
    inner = stage.op.reduce_axis[-1]
    if inner.extent < 2 * vl:
        parallel_loop(stage, list(stage.op.axis), None, target, work)
        return
    _, lane = stage.split(inner, factor=vl)
    rf = s.rfactor(stage.tensor, lane, factor_axis=len(stage.op.axis))
    part = s[rf]
    *rows, lanes_axis = part.op.axis
    part.reorder(*rows, *part.op.reduce_axis, lanes_axis)
    part.vectorize(lanes_axis)
    parallel_loop(part, rows, None, target, work)


def schedule_reduction_epilogue(opdef, target) -> Schedule:
    """One reduction stage (the anchor) and at most one elementwise stage of its shape after it."""
    out = opdef.output
    s = create_schedule(out)
    red = next(st for st in s.stages if isinstance(st.op, ComputeOp) and st.op.reduce_axis)
    in_shape = tuple(red.op.input_tensors()[0].shape)
    if red.op is out.op:
        schedule_reduce_stage(s[out], in_shape, False, target)
        return s
    st = s[out]
    vl = lanes(target, out.dtype)
    *outer, last = st.op.axis
    lo = vectorize_inner(st, last, vl, max_vectors=4, carried=True)
    work = int(opdef.flops) if opdef.flops else int(np.prod(out.shape))
    loop = parallel_loop(st, outer, lo, target, work)
    attach = lo if lo is not None and lo in st.leaf_iter_vars else loop
    if attach is None:
        return s
    red.compute_at(st, attach)
    *r_outer, r_last = red.op.axis
    red.reorder(*r_outer, *red.op.reduce_axis, r_last)
    red.vectorize(r_last)
    return s


__all__ = ["schedule_tagged", "schedule_group_norm", "schedule_reduction_epilogue"]
