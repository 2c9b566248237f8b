"""Default schedules of the Winograd convolution's three kernels (compiler.ops.winograd).

- the input transform: the padded input materialized (a vector copy in the blocked layout),
  then per (channel block, tile), in parallel: the a x a tile's rows transformed into a local
  buffer and its columns stored into V, both with the a x a loops unrolled (so each row's
  Select is a constant and the transform is the row's adds) and the B channels one vector;
- the matrix products: register tiles of channel blocks by tiles, as a 1x1 convolution's (the
  weights' vector per block and step, a broadcast of V per tile column), every point of the
  a x a tile and every register tile in one parallel loop;
- the output transform, stored through the fused epilogue: per (image, channel block, tile row,
  tile), in parallel, the rows of Aᵀ M into a local buffer, then the m x m output unrolled.
"""

from __future__ import annotations

import math

import numpy as np

from ..schedule import Schedule, create_schedule
from ..tensor import ComputeOp, topo_order
from .schedule_common import fuse_all, lanes, want_parallel
from .schedule_conv import pick_tile, register_tile
from .schedule_conv_nchwc import DENSE_CHAIN_LATENCY, MAX_TILE_BLOCKS, schedule_blocked_pad

WINOGRAD_TAGS = ("winograd_input", "winograd_gemm", "winograd_output")


def schedule_winograd(opdef, target) -> Schedule | None:
    """The schedule of a Winograd kernel's DAG, found by its stages' tags, else None."""
    computes = [op for op in topo_order([opdef.output]) if isinstance(op, ComputeOp)]
    tags = {op.tag for op in computes}
    if "winograd_gemm" in tags and len(computes) == 1:
        return schedule_winograd_gemm(opdef, target)
    if "winograd_input" in tags and opdef.output.op.tag == "winograd_input":
        return schedule_winograd_input(opdef, target)
    if "winograd_output" in tags and "winograd_output_rows" in tags:
        return schedule_winograd_output(opdef, target)
    return None


def _stage(s, tag: str):
    return next(st for st in s.stages if isinstance(st.op, ComputeOp) and st.op.tag == tag)


def schedule_winograd_input(opdef, target) -> Schedule:
    out = opdef.output
    s = create_schedule(out)
    pad = next((st for st in s.stages if st.op.name == "pad"), None)
    if pad is not None:
        schedule_blocked_pad(pad, target)
    st, rows = s[out], _stage(s, "winograd_input_rows")
    i, j, cb, p, b = st.op.axis
    st.reorder(cb, p, i, j, b)
    tile = fuse_all(st, [cb, p])
    for ax in (i, j):
        st.unroll(ax)
    st.vectorize(b)
    ri, rj, rcb, rp, rb = rows.op.axis
    rows.reorder(rcb, rp, ri, rj, rb)
    rows.compute_at(st, tile)
    for ax in (ri, rj, rcb, rp):
        rows.unroll(ax)
    rows.vectorize(rb)
    if want_parallel(target, int(np.prod(out.shape))) and tile.extent > 1:
        st.parallel(tile)
    return s


def winograd_gemm_tile(opdef, target) -> tuple:
    """(FOB, XB): output channel blocks and tiles of a register tile of the matrix products,
    picked as a 1x1 convolution's (the weight vector per block and step shared by XB
    broadcasts of V; weights per block C·B·B, at most what the L2 holds)."""
    out = opdef.output
    vl = lanes(target, out.dtype)
    _, _, FO, P, FB = out.shape
    U = opdef.inputs[1]
    block_bytes = math.prod(U.shape[3:]) * np.dtype(U.dtype).itemsize
    blocks = max(1, min(MAX_TILE_BLOCKS, target.capabilities.l2 // block_bytes))
    dims = [(FO, blocks, False), (P, 8, True)]
    cost = lambda r, c: (c[1] + c[0] * r, c[1])   # noqa: E731
    _, (FOB, XB) = pick_tile([FB], vl, dims, cost, target.capabilities, latency=DENSE_CHAIN_LATENCY)
    return FOB, XB


def schedule_winograd_gemm(opdef, target, tile: tuple | None = None) -> Schedule:
    out = opdef.output
    s = create_schedule(out)
    FOB, XB = winograd_gemm_tile(opdef, target) if tile is None else tile
    register_tile(s, out, [(2, FOB), (3, XB)], 4, out.shape[4], target, opdef.flops, outer_order=[2, 3])
    return s


def schedule_winograd_output(opdef, target) -> Schedule:
    out = opdef.output
    s = create_schedule(out)
    wout, rows = _stage(s, "winograd_output"), _stage(s, "winograd_output_rows")
    m = int(wout.op.attrs["tile"])
    for st in s.stages:
        if isinstance(st.op, ComputeOp) and st is not s[out] and st is not rows:
            st.compute_inline()
    st = s[out]
    n, fo, h, w, fb = st.op.axis
    ho, hi = st.split(h, factor=m)
    wo, wi = st.split(w, factor=m)
    st.reorder(n, fo, ho, wo, hi, wi, fb)
    tile = fuse_all(st, [n, fo, ho, wo])
    st.unroll(hi)
    st.unroll(wi)
    st.vectorize(fb)
    ri, rj, rfo, rp, rfb = rows.op.axis
    rows.reorder(rfo, rp, ri, rj, rfb)
    rows.compute_at(st, tile)
    for ax in (ri, rj, rfo, rp):
        rows.unroll(ax)
    rows.vectorize(rfb)
    if want_parallel(target, int(np.prod(out.shape))) and tile.extent > 1:
        st.parallel(tile)
    return s


__all__ = ["WINOGRAD_TAGS", "schedule_winograd", "schedule_winograd_input", "schedule_winograd_gemm",
           "schedule_winograd_output", "winograd_gemm_tile"]
