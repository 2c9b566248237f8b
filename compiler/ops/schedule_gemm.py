"""Default x86/Arm schedule for GEMM-like operators: matmul, matmul_int8, dense, batch_matmul.

The GotoBLAS recipe in schedule terms (see shared perf notes):
- register tile: the output is tiled mr × nr (nr = two vector registers); the reduction is
  computed at the tile loop into a local mr × nr buffer (cache_write, or the dense reduction
  stage itself when an epilogue follows), with the k loop outside the unrolled rows and the
  vectorized columns, so LLVM keeps the mr·nr/lanes accumulators in registers;
- packing: B is copied into [N/nr][K][nr] panels (cache_read with a blocked layout) so each
  k step is one unit-stride load per vector;
- parallel over the outer row tiles (fused with the batch), the packing parallel over panels.
"""

from __future__ import annotations

from ..schedule import Schedule, create_schedule
from ..target import resolve_target


def gemm_tile(M: int, N: int, lanes: int) -> tuple:
    """(mr, nr): 6 rows × 2 vectors fits 12 accumulators + 2 B vectors + a broadcast in 16 registers."""
    nr = 2 * lanes if N >= 2 * lanes else lanes
    mr = min(6, M)
    return mr, nr


def schedule_gemm(opdef, target=None) -> Schedule:
    target = resolve_target(target)
    out = opdef.output
    s = create_schedule(out)
    red_stage = next(st for st in s.stages if st.op.reduce_axis)
    out_stage = s[out]
    *batch, M, N = out.shape
    lanes = target.vector_lanes(red_stage.op.dtype if red_stage.op.dtype != "int8" else "int32")
    mr, nr = gemm_tile(M, N, lanes)
    if red_stage is out_stage:
        acc = s.cache_write(out, "local")
        acc_stage = s[acc]
    else:
        acc_stage = red_stage  # the epilogue stage is the output; the reduction becomes its local tile
    *b_axes, i, j = out_stage.op.axis
    io, ii = out_stage.split(i, factor=mr)
    jo, ji = out_stage.split(j, factor=nr)
    out_stage.reorder(*b_axes, io, jo, ii, ji)
    acc_stage.compute_at(out_stage, jo)
    *_, ci, cj = acc_stage.op.axis
    (k,) = acc_stage.op.reduce_axis
    ko, ki = acc_stage.split(k, factor=4)
    acc_stage.reorder(ko, ki, ci, cj)
    acc_stage.unroll(ki)
    acc_stage.unroll(ci)
    acc_stage.vectorize(cj)
    out_stage.vectorize(ji)
    outer = out_stage.fuse(*b_axes, io) if b_axes else io
    out_stage.parallel(outer)
    _pack_b(s, opdef, acc_stage, nr)
    return s


def _pack_b(s: Schedule, opdef, acc_stage, nr: int):
    """Pack the right-hand operand into [N/nr][..][K][nr] panels read with unit stride."""
    b = opdef.inputs[1]
    transposed = bool(opdef.params.get("transpose_b")) or opdef.name == "dense"
    n_axis = b.ndim - 2 if transposed else b.ndim - 1
    packed = s.cache_read(b, "global", [acc_stage], block={n_axis: nr})
    st = s[packed]
    st.parallel(st.op.axis[0])
    st.vectorize(st.op.axis[-1])
