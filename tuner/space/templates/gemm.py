"""The GEMM template: matmul, matmul_int8, dense (with its epilogue) and batch_matmul.

The GotoBLAS recipe of the default schedule (compiler/ops/schedule_gemm.py) with its choices as
knobs; the first value of every knob is the default schedule's, so config 0 *is* the default
schedule (same steps) and the rest of the space is its neighbourhood:

- tile_i:  rows of the register tile (mr), unrolled;
- tile_j:  columns of the register tile (nr), vectorized: multiples of 32 bytes of the
           accumulator dtype up to 64 lanes, or N itself when it fits one vector loop;
- tile_k:  the reduction loop split (inner factor), `unroll_k` unrolls the inner part;
- tile_order: which of the row / column tile loops is outermost (columns outermost, the
           default's, keeps one packed B panel in L2 for all row tiles);
- pack_b:  copy B into [N/nr][K][nr] panels (blocked cache_read) read with unit stride;
- parallel: "fused" (batch and all tile loops fused, the default's), "outer" (batch + the
           outer tile loop), "none".

The knob *sets* depend only on the workload (shapes, dtypes; tile_j includes the row widths the
default schedule picks for 128-, 256- and 512-bit registers), so a config names the same loop
structure for any target; only the order of the values follows the task's target (the default
schedule's tile for its register file first).
"""

from __future__ import annotations

from compiler.dtypes import nbytes
from compiler.ops.schedule_gemm import MAX_MR, ROW_VECTORS, gemm_tile
from compiler.schedule import create_schedule

from ..base import SpaceError
from ..template import template

GEMM_OPS = ("matmul", "matmul_int8", "dense", "batch_matmul")
MAX_LANES = 64
GRID_BYTES = 32  # tile_j steps by this many bytes, on every target


def _first(default, values):
    out = [default]
    out += [v for v in values if v != default]
    return out


def gemm_knob_values(M: int, N: int, K: int, acc_dtype: str, target) -> dict:
    """The values of tile_i, tile_j, tile_k (inner factors), the default schedule's first."""
    base = max(4, GRID_BYTES // nbytes(acc_dtype))
    mr, nr = gemm_tile(M, N, target.vector_lanes(acc_dtype), target.capabilities.vector_registers,
                       fmas_per_cycle=target.capabilities.fmas_per_cycle)
    nrs = [base * m for m in range(1, MAX_LANES // base + 1) if base * (m - 1) < N]
    if N <= MAX_LANES:
        nrs.append(N)
    # the row widths gemm_tile may pick on 128/256/512-bit targets, so the set is the same
    # whoever defines it
    for vl in (base // 2, base, 2 * base):
        nrs += [nv * vl for nv in ROW_VECTORS if nv * vl <= MAX_LANES and (nv == 1 or nv * vl <= N)]
    mrs = list(range(1, min(M, MAX_MR) + 1))
    kus = [f for f in (1, 2, 4, 8, 16) if f <= K]
    return {"tile_i": _first(mr, mrs), "tile_j": _first(nr, sorted(set(nrs))), "tile_k": _first(4, kus)}


@template("gemm", ops=("matmul", "matmul_int8", "dense", "batch_matmul"))
def gemm(cfg, opdef, target):
    """Register-tiled, packed GEMM (see module docstring)."""
    if getattr(opdef, "name", None) not in GEMM_OPS:
        raise SpaceError(f"template 'gemm' is for {', '.join(GEMM_OPS)}, not {getattr(opdef, 'name', opdef)!r}")
    out = opdef.output
    s = create_schedule(out)
    red_stage = next(st for st in s.stages if st.op.reduce_axis)
    out_stage = s[out]
    *batch, M, N = out.shape
    (k_axis,) = red_stage.op.reduce_axis
    acc_dtype = red_stage.op.dtype
    vals = gemm_knob_values(M, N, k_axis.extent, acc_dtype, target)
    cfg.define_split("tile_i", M, policy="candidate", candidate=[[v] for v in vals["tile_i"]])
    cfg.define_split("tile_j", N, policy="candidate", candidate=[[v] for v in vals["tile_j"]])
    cfg.define_split("tile_k", k_axis.extent, policy="candidate", candidate=[[v] for v in vals["tile_k"]])
    cfg.define_knob("unroll_k", [True, False])
    cfg.define_reorder("tile_order", 2, policy="candidate", candidate=[[1, 0], [0, 1]])   # panels outermost first
    cfg.define_knob("pack_b", [True, False])
    cfg.define_knob("parallel", ["fused", "outer", "none"])

    mr, nr, ku = cfg["tile_i"].size[-1], cfg["tile_j"].size[-1], cfg["tile_k"].size[-1]
    if red_stage is out_stage:
        acc_stage = s[s.cache_write(out, "local")]
    else:
        acc_stage = red_stage  # the epilogue is the output; the reduction becomes its local tile
    *b_axes, i, j = out_stage.op.axis
    io, ii = out_stage.split(i, factor=mr)
    jo, ji = out_stage.split(j, factor=nr)
    outer = [[io, jo][p] for p in cfg["tile_order"].perm]
    out_stage.reorder(*b_axes, *outer, ii, ji)
    par = cfg["parallel"].val
    if par == "fused":
        attach = out_stage.fuse(*b_axes, *outer)
    else:
        attach = outer[-1]
    acc_stage.compute_at(out_stage, attach)
    *_, ci, cj = acc_stage.op.axis
    (k,) = acc_stage.op.reduce_axis
    if ku > 1:
        ko, ki = acc_stage.split(k, factor=ku)
        acc_stage.reorder(ko, ki, ci, cj)
        if cfg["unroll_k"].val:
            acc_stage.unroll(ki)
    else:
        acc_stage.reorder(k, ci, cj)
    acc_stage.unroll(ci)
    acc_stage.vectorize(cj)
    out_stage.vectorize(ji)
    if par == "outer":
        loop = out_stage.fuse(*b_axes, outer[0]) if b_axes else outer[0]
        out_stage.parallel(loop)
    elif par == "fused":
        out_stage.parallel(attach)
    if cfg["pack_b"].val:
        b = opdef.inputs[1]
        transposed = bool(opdef.params.get("transpose_b")) or opdef.name == "dense"
        n_axis = b.ndim - 2 if transposed else b.ndim - 1
        packed = s[s.cache_read(b, "global", [acc_stage], block={n_axis: nr})]
        if par != "none":
            packed.parallel(packed.op.axis[0])
        packed.vectorize(packed.op.axis[-1])
    return s, opdef.tensors


__all__ = ["gemm", "gemm_knob_values", "GEMM_OPS"]
