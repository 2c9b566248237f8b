"""Default schedules for max_pool2d and avg_pool2d (NCHW).

[n, c, y fused, parallel] [window taps, unrolled] [x]: a row of running maxima/sums is updated
once per tap, so it stays in L1 (or registers) while the input rows stream in.

- The padding stage is materialized at the root (its rows are a cheap copy, see
  schedule_pad_stage), so the taps read without border tests.
- Stride 1: x is an explicit vector loop (unit-stride loads). Stride > 1: the x loop is left to
  LLVM's vectorizer, which reads the strided taps as wide loads + shuffles; an explicit vector
  loop would gather them, 3x slower.
- avg_pool2d's window sums are computed per output row into a local row buffer, which the
  vectorized division by the valid-tap count reads back.
"""

from __future__ import annotations

import numpy as np

from ..schedule import Schedule, create_schedule
from .schedule_common import lanes, parallel_loop, vectorize_inner
from .schedule_elementwise import schedule_pad_stage

MAX_UNROLLED_TAPS = 16


def schedule_pool(opdef, target=None) -> Schedule:
    out = opdef.output
    s = create_schedule(out)
    st = s[out]
    vl = lanes(target, out.dtype)
    unit_stride = opdef.params["stride"][1] == 1
    kh, kw = opdef.params["kernel"]
    work = int(np.prod(out.shape)) * kh * kw
    pad = _stage(s, "pad")
    if pad is not None:
        schedule_pad_stage(pad, target)
    red = st if st.op.reduce_axis else _stage(s, "avg_pool_sum")
    n, c, y, x = st.op.axis
    if red is st:  # max_pool2d: the output is the reduction
        ry, rx = st.op.reduce_axis
        xo = vectorize_inner(st, x, vl, max_vectors=2, carried=True) if unit_stride else None
        xi = x if xo is None else st.leaf_iter_vars[st.leaf_iter_vars.index(xo) + 1]
        st.reorder(n, c, y, *([xo] if xo is not None else []), ry, rx, xi)
        parallel_loop(st, [n, c, y], None, target, work)
    else:  # avg_pool2d: window sums per row, then the division
        vectorize_inner(st, x, vl, max_vectors=2)
        row = parallel_loop(st, [n, c, y], None, target, work)
        red.compute_at(st, row)
        rn, rc, ry_, rx_ = red.op.axis
        ry, rx = red.op.reduce_axis
        red.reorder(rn, rc, ry_, ry, rx, rx_)
        if unit_stride:
            vectorize_inner(red, rx_, vl, max_vectors=2, carried=True)
    if kh * kw <= MAX_UNROLLED_TAPS:
        red.unroll(ry)
        red.unroll(rx)
    return s


def _stage(s, name):
    for st in s.stages:
        if st.op.name == name:
            return st
    return None
