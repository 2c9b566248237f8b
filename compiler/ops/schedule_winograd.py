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
from .schedule_conv import feasible_tiles, pick_tile, register_tile
from .schedule_conv_nchwc import DENSE_CHAIN_LATENCY, MAX_TILE_BLOCKS, MAX_TILE_CHOICES, schedule_blocked_pad

WINOGRAD_TAGS = ("winograd_input", "winograd_gemm", "winograd_output")


def schedule_winograd(opdef, target) -> Schedule | None:
    """The schedule of a Winograd kernel's DAG, found by its stages' tags, else None."""
    computes = [op for op in topo_order([opdef.output]) if isinstance(op, ComputeOp)]
    tags = {op.tag for op in computes}
    if is_winograd_gemm(opdef):
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
    _rows_at_tile(rows, st, tile, target)
    return s


def _rows_at_tile(rows, st, tile, target):
    """The first (row) half of a transform, [i, j, block, tile, lanes], computed per tile of the
    stage `st` (its loop `tile`, in parallel when the work asks): the a x a loops unrolled, the
    lanes one vector; its buffer is the tile's a x a vectors."""
    ri, rj, rblock, rtile, rlanes = rows.op.axis
    rows.reorder(rblock, rtile, ri, rj, rlanes)
    rows.compute_at(st, tile)
    for ax in (ri, rj, rblock, rtile):
        rows.unroll(ax)
    rows.vectorize(rlanes)
    if want_parallel(target, int(np.prod(st.op.shape))) and tile.extent > 1:
        st.parallel(tile)


def winograd_gemm_tile(opdef, target) -> tuple:
    """(FOB, XB): output channel blocks and tiles of a register tile of the matrix products,
    picked as a 1x1 convolution's (the weight vector per block and step shared by XB
    broadcasts of V; weights per block C·B·B, at most what the L2 holds)."""
    vl, dims, cost = _gemm_tile_problem(opdef, target)
    _, (FOB, XB) = pick_tile([opdef.output.shape[4]], vl, dims, cost, target.capabilities, latency=DENSE_CHAIN_LATENCY)
    return FOB, XB


def winograd_gemm_choices(opdef, target) -> dict:
    """The tuner's knob of the matrix products' schedule (tuner/space/sketch_recipe.py):
    `tile`, the MAX_TILE_CHOICES best register tiles that fit the registers, the default first."""
    vl, dims, cost = _gemm_tile_problem(opdef, target)
    default = list(winograd_gemm_tile(opdef, target))
    others = [list(f) for _, f in feasible_tiles([opdef.output.shape[4]], vl, dims, cost, target.capabilities)]
    return {"tile": ([default] + [t for t in others if t != default])[:MAX_TILE_CHOICES]}


def _gemm_tile_problem(opdef, target) -> tuple:
    out = opdef.output
    _, _, FO, P, FB = out.shape
    U = opdef.inputs[1]
    block_bytes = math.prod(U.shape[3:]) * np.dtype(U.dtype).itemsize
    blocks = max(1, min(MAX_TILE_BLOCKS, target.capabilities.l2 // block_bytes))
    dims = [(FO, blocks, False), (P, 8, True)]
    cost = lambda r, c: (c[1] + c[0] * r, c[1])   # noqa: E731
    return lanes(target, out.dtype), dims, cost


def is_winograd_gemm(opdef) -> bool:
    computes = [op for op in topo_order([opdef.output]) if isinstance(op, ComputeOp)]
    return len(computes) == 1 and computes[0].tag == "winograd_gemm"


def schedule_winograd_gemm(opdef, target, tile: tuple | None = None) -> Schedule:
    """`tile` (FOB, XB) instead of winograd_gemm_tile's: the tuner's choice."""
    out = opdef.output
    s = create_schedule(out)
    FOB, XB = winograd_gemm_tile(opdef, target) if tile is None else (int(v) for v in tile)
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
    _rows_at_tile(rows, st, tile, target)
    return s


__all__ = ["WINOGRAD_TAGS", "schedule_winograd", "schedule_winograd_input", "schedule_winograd_gemm",
           "schedule_winograd_output", "winograd_gemm_tile", "winograd_gemm_choices", "is_winograd_gemm"]
