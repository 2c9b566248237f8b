"""Default schedules for injective operators and reductions.

Injective (add, mul, relu, gelu, bias_add, pad): the last axis is the unit-stride one for the
output and for every non-broadcast input, so it is the vector axis; the other axes are fused
into one parallel loop. (Fusing the last axis too and splitting the result by the vector width
would turn every index into `(f // n) % m` terms the code generator can only gather.)

transpose: 32 × 32 tiles of the output's last axis and of the output axis that reads the
input's unit-stride axis, with the latter innermost (unit-stride reads, strided writes that stay
in L1 for the tile), left to LLVM's vectorizer: 5x faster than explicit vectors, whose strided
side is a gather per vector.

reductions: when the innermost input axis is kept, the output's last axis is the vector axis
and the reduction loops run outside it, in a register tile of accumulators (accumulator_tile).
When the innermost input axis is reduced along a unit-stride read at least two vectors long,
each row keeps partial results per vector lane (rfactor), 4 rows in flight, and combines its
lanes at the end (the order of a float sum changes, as in any vectorized BLAS reduction; within
the tolerance every kernel is checked to). Shorter or strided rows: 8 rows' scalar chains are
unrolled inside the reduction loop so 8 chains run interleaved, each reading its own row with
unit stride (3x faster than one chain, 3x faster than a vector of rows read by gathers).
"""

from __future__ import annotations

import math

import numpy as np

from ..arith import unit_step
from ..codegen_llvm import ACCUMULATE_WORK, GATHER_WORK, MIN_WORK_PER_THREAD
from ..expr import walk
from ..schedule import Schedule, create_schedule
from ..target import resolve_target
from ..tensor import TensorRead
from .schedule_common import (
    accumulator_factor,
    gathers_along,
    lanes,
    largest_divisor,
    parallel_loop,
    vectorize_inner,
    want_parallel,
)
from .schedule_tile import product_tile

TRANSPOSE_TILE = 32
ROW_CHAINS = 8
ROWS_IN_FLIGHT = 4  # rows whose lane partials a step updates (_lane_partials)
TILE_CHAINS = 6  # most units of a reduction's accumulator tile (accumulator_tile)


def schedule_injective(opdef, target=None) -> Schedule:
    s = create_schedule(opdef.output)
    schedule_injective_stage(s[opdef.output], target)
    return s


def schedule_injective_stage(stage, target):
    """Vectorize the last axis (split by lanes if long) and parallelize the fused outer axes.

    Where the last axis is one vector (a channel-blocked [N, C/B, H, W, B] value), the column
    loop stays serial inside the parallel one: a read that gathers across the lanes (a channel
    shuffle between blocked layers, a layout copy) then computes its lane offsets once per row,
    not per vector (ShuffleNet's shuffles: 22 -> 70 GB/s, with the index vector hoisted). Such a
    gathered element costs GATHER_WORK in the work that decides whether the stage goes
    parallel: a 27K-element shuffle takes as long as a 160K-element copy."""
    axes = list(stage.op.axis)
    *outer_axes, last = axes
    work = int(np.prod(stage.op.shape) * (GATHER_WORK if gathers_along(stage.op.body, last.var) else 1))
    vl = lanes(target, stage.op.dtype)
    lo = vectorize_inner(stage, last, vl, max_vectors=2)
    if lo is None and len(outer_axes) >= 2 and outer_axes[-1].extent >= ROW_CHAINS:
        rows = math.prod(a.extent for a in outer_axes[:-1])
        if rows >= 2 * resolve_target(target).num_cores:
            return parallel_loop(stage, outer_axes[:-1], None, target, work)
    return parallel_loop(stage, outer_axes, lo, target, work)


def schedule_transpose(opdef, target=None) -> Schedule:
    s = create_schedule(opdef.output)
    st = s[opdef.output]
    perm = opdef.params["axes"]
    nd = len(perm)
    out_axes = list(st.op.axis)
    q = perm.index(nd - 1)  # the output axis that walks the input's unit-stride axis
    if q == nd - 1:
        schedule_injective_stage(st, target)
        return s
    last, src = out_axes[-1], out_axes[q]
    tiled = {}
    for ax in (src, last):
        tiled[ax] = st.split(ax, factor=TRANSPOSE_TILE) if ax.extent > TRANSPOSE_TILE else (None, ax)
    others = [a for a in out_axes if a is not last and a is not src]
    outer = others + [o for o in (tiled[src][0], tiled[last][0]) if o is not None]
    st.reorder(*outer, tiled[last][1], tiled[src][1])
    if outer:
        loop = st.fuse(*outer) if len(outer) > 1 else outer[0]
        if want_parallel(target, int(np.prod(st.op.shape))) and loop.extent > 1:
            st.parallel(loop)
    return s


def schedule_pad(opdef, target=None) -> Schedule:
    s = create_schedule(opdef.output)
    schedule_pad_stage(s[opdef.output], target)
    return s


def schedule_pad_stage(stage, target):
    """Fused outer rows in parallel, the row loop left to LLVM.

    The padding reads `data[min(max(i - before, 0), n - 1)]` under a border test: as an
    explicit vector loop the clamped index makes every load a gather, while LLVM's own
    vectorizer of the scalar row loop copies the interior with plain vector loads (10x faster).
    """
    *outer, _ = stage.op.axis
    return parallel_loop(stage, outer, None, target, int(np.prod(stage.op.shape)))


def schedule_reduce(opdef, target=None) -> Schedule:
    s = create_schedule(opdef.output)
    in_shape = opdef.inputs[0].shape
    inner_reduced = (len(in_shape) - 1) in opdef.params["axis"]
    schedule_reduce_stage(s[opdef.output], in_shape, inner_reduced, target)
    return s


def schedule_reduce_stage(stage, in_shape, inner_reduced: bool, target, pack=(), tile=None):
    """[spatial outer, parallel] [reduction loops] [last spatial axis: vector or unrolled].
    `pack`: [(placeholder, axis)] to copy in blocks of the vector (see accumulator_tile)."""
    op = stage.op
    spatial = [a for a in op.axis if a.extent > 1]
    rax = list(op.reduce_axis)
    work = int(np.prod(in_shape))
    if not spatial:  # a full reduction: one accumulator
        return None
    last = spatial[-1]
    keep = [a for a in op.axis if a is not last]
    if inner_reduced:
        lane_axis = _unit_stride_reduce_axis(op, lanes(target, op.dtype))
        if lane_axis is not None:
            return _lane_partials(stage, lane_axis, target, work)
        # independent rows, one scalar accumulator each, interleaved: ROW_CHAINS add chains
        # in flight instead of one
        f = largest_divisor(last.extent, ROW_CHAINS) if last.extent > ROW_CHAINS else last.extent
        if f < ROW_CHAINS // 2 and last.extent > ROW_CHAINS:
            f = ROW_CHAINS  # a tail guard is cheaper than too few chains
        lo, li = stage.split(last, factor=f) if f < last.extent else (None, last)
        stage.reorder(*keep, *([lo] if lo is not None else []), *rax, li)
        stage.unroll(li)
        return parallel_loop(stage, keep, lo, target, work)
    if not pack and tile is None:
        split = _split_reduction(stage, target, work)
        if split is not None:
            return split
    return accumulator_tile(stage, spatial, target, work, pack=pack, tile=tile)


def _split_reduction(stage, target, work: int):
    """A reduction with too few outputs to keep the cores busy (a global pool's few channel
    blocks: efficientnet's squeeze over 112x112 has 2 vectors of output, one thread's work) but
    enough input for several threads: its outermost reduction loop cut into parts whose partial
    results (rfactor) are made in parallel, one part a thread, then summed part by part into the
    output. As many parts as the code generator would give threads to the whole reduction
    (MIN_WORK_PER_THREAD units of work, an accumulated element ACCUMULATE_WORK), at most one a
    core. Returns the partial stage's parallel loop, or None where the output already has the
    parallelism or the reduction is not split (a product tile's, one too small)."""
    target = resolve_target(target)
    op = stage.op
    vl = lanes(target, op.dtype)
    outputs = math.prod(a.extent for a in op.axis[:-1]) * -(-op.axis[-1].extent // vl)
    if outputs >= 2 * target.num_cores or product_tile(op, target) is not None or not op.reduce_axis:
        return None
    first = op.reduce_axis[0]
    parts = min(first.extent, target.num_cores, int(work * ACCUMULATE_WORK) // MIN_WORK_PER_THREAD)
    if parts < 2 or not want_parallel(target, work):
        return None
    s = stage.schedule
    outer, _ = stage.split(first, nparts=parts)
    part = s[s.rfactor(stage.tensor, outer, factor_axis=0)]
    loop = accumulator_tile(part, [a for a in part.op.axis if a.extent > 1], target, work)
    combined = [a for a in stage.op.axis if a.extent > 1]
    if combined:
        accumulator_tile(stage, combined, target, int(np.prod(part.op.shape)))
    return loop


def _unit_stride_reduce_axis(op, vl: int):
    """The reduction axis that every read indexes with unit stride in its last index (or not
    at all), innermost first, if it is at least two vectors long; else None."""
    for r in reversed(op.reduce_axis):
        if r.extent < 2 * vl:
            continue
        seen = False
        for n in walk(op.body):
            if not isinstance(n, TensorRead):
                continue
            *lead, last = n.indices
            if any(r.var in walk(i) for i in lead):
                break
            if r.var in walk(last):
                if not unit_step(last, r.var):
                    break
                seen = True
        else:
            if seen:
                return r
    return None


def _lane_partials(stage, axis, target, work: int):
    """Rows reduced along their unit-stride axis: partial results per vector lane (rfactor of
    that axis split by the vector width), ROWS_IN_FLIGHT rows' vectors updated per step, then
    each row's lanes combined. Scalar chains computed every element on its own: a row sum of
    exp ran the exp one lane at a time; a sum of squares did one add per element."""
    s = stage.schedule
    vl = lanes(target, stage.op.dtype)
    _, lane = stage.split(axis, factor=vl)
    part = s[s.rfactor(stage.tensor, lane, factor_axis=len(stage.op.axis))]
    axes = list(stage.op.axis)
    rows_pos = max(i for i, a in enumerate(axes) if a.extent > 1)
    rows = axes[rows_pos]
    units = min(ROWS_IN_FLIGHT, rows.extent)
    ro, ri = stage.split(rows, factor=units) if units < rows.extent else (None, rows)
    outer = [a for i, a in enumerate(axes) if i != rows_pos]
    stage.reorder(*outer, *([ro] if ro is not None else []), ri, *stage.op.reduce_axis)
    loop = parallel_loop(stage, outer, ro, target, work)
    attach = ro if ro is not None and ro in stage.leaf_iter_vars else loop
    if attach is None:
        return loop
    part.compute_at(stage, attach)
    p_axes = list(part.op.axis)   # the stage's axes with the lanes last
    p_outer = [a for i, a in enumerate(p_axes[:-1]) if i != rows_pos]
    part.reorder(*p_outer, *part.op.reduce_axis, p_axes[rows_pos], p_axes[-1])
    part.unroll(p_axes[rows_pos])
    part.vectorize(p_axes[-1])
    return loop


def accumulator_tile(stage, spatial: list, target, work: int, acc_stage=None, pack=(), tile=None):
    """A reduction that keeps its innermost axis (a pool's window, a sum over rows): the
    accumulators of a tile, vectors of the last axis times up to TILE_CHAINS units of the spatial
    axis before it, in a local cache (cache_write) that LLVM keeps in registers, the reduction
    loops outside the tile's unrolled units, so each tap updates several independent chains.
    One vector accumulated in the output buffer was one serial chain through memory: SqueezeNet's
    3x3/2 max pools ran 2.2x onnxruntime's time; 5 columns in registers: 1.75x faster.

    `acc_stage`: the reduction's own stage when `stage` is an elementwise epilogue of its shape
    (a bias, a scale): the reduction is then the tile's accumulators, no cache is added; a list
    of reductions of that shape the epilogue joins (an LSTM's x·Wx + h·Wh + b): each computed
    at the same tile, one after the other, so the sum is made from two tiles in registers/L1.
    `tile`: (tile axis position, units, lanes) of a two-operand reduction (schedule_tile), by
    default product_tile's when the body has one.
    `pack`: [(placeholder, axis)] the reduction reads with the vector's variable along `axis`:
    each is copied at the root into blocks of the vector's lanes along that axis
    (Schedule.cache_read with a block), so the vector loads are unit-stride (GEMM's panels)."""
    target = resolve_target(target)
    op = stage.op
    last_pos = list(op.axis).index(spatial[-1])
    acc_stages = list(acc_stage) if isinstance(acc_stage, (list, tuple)) else [acc_stage] if acc_stage is not None else []
    red_op = acc_stages[0].op if acc_stages else op
    if tile is None and last_pos == len(op.axis) - 1:
        tile = product_tile(red_op, target)
    if tile is not None:   # a two-operand body: the GEMM's register tile (schedule_tile)
        tile_pos, units, f = tile
        work = max(work, sum(math.prod(a.op.shape) * math.prod(r.extent for r in a.op.reduce_axis)
                             for a in acc_stages or [stage]))
    else:
        tile_pos = list(op.axis).index(spatial[-2]) if len(spatial) > 1 else None
    vl = lanes(target, op.dtype)
    if tile is None:
        f = accumulator_factor(spatial[-1].extent, vl, max_vectors=4)
    vectors = -(-f // vl)
    if not acc_stages:
        acc_stages = [stage.schedule[stage.schedule.cache_write(stage.tensor, "local")]]
    axes = list(stage.op.axis)   # the copy out of the cache, the stage's tensor now
    last = axes[last_pos]
    lo, li = stage.split(last, factor=f) if f < last.extent else (None, last)
    to = ti = None
    if tile_pos is not None:
        if tile is None:
            units = _tile_units(axes[tile_pos].extent,
                                max(1, min(TILE_CHAINS, target.capabilities.accumulator_registers // 2) // vectors))
        if units > 1 and (tile is None or units < axes[tile_pos].extent):
            to, ti = stage.split(axes[tile_pos], factor=units)
        elif units > 1:
            ti = axes[tile_pos]
    outer = [a for i, a in enumerate(axes) if i not in (last_pos, tile_pos)]
    if tile_pos is not None and ti is None:
        outer.append(axes[tile_pos])
    inner_outer = [a for a in (to, lo) if a is not None]
    stage.reorder(*outer, *inner_outer, *([ti] if ti is not None else []), li)
    stage.vectorize(li)
    if ti is not None:
        stage.unroll(ti)
    attach = inner_outer[-1] if inner_outer else (outer[-1] if outer else None)
    loop = parallel_loop(stage, outer, inner_outer[0] if inner_outer else None, target, work)
    if attach is None or attach not in stage.leaf_iter_vars:
        attach = loop
    if attach is None:
        return loop
    for cs in acc_stages:
        cs.compute_at(stage, attach)
    for tensor, axis in pack:
        readers = [cs for cs in acc_stages if any(t is tensor for t in cs.op.input_tensors())]
        packed = stage.schedule[stage.schedule.cache_read(tensor, "global", readers, block={axis: f})]
        parallel_loop(packed, [packed.op.axis[0]], None, target, math.prod(tensor.shape))
        packed.vectorize(packed.op.axis[-1])
    for cs in acc_stages:
        _tile_reduction(cs, last_pos, tile_pos if ti is not None else None, f if lo is not None else None)
    return loop


def _tile_reduction(cs, last_pos: int, tiled, f) -> None:
    """A register tile's accumulators computed at its tile loop: the reduction loops outside
    the unrolled units (`tiled`: the tile axis's position) and the vectorized last axis."""
    c_axes = list(cs.op.axis)
    c_tile = [c_axes[tiled]] if tiled is not None else []
    c_rest = [a for i, a in enumerate(c_axes) if i not in (last_pos, tiled)]
    c_last = c_axes[last_pos]
    c_lo = None
    if f is not None:
        c_lo, c_last = cs.split(c_last, factor=f)
    cs.reorder(*c_rest, *([c_lo] if c_lo is not None else []), *cs.op.reduce_axis, *c_tile, c_last)
    cs.vectorize(c_last)
    if c_tile:
        cs.unroll(c_tile[0])


def _tile_units(extent: int, most: int) -> int:
    """Units of the tile axis per register tile: a divisor of `extent` up to `most`, unless the
    best divisor is under half of it (a prime 13 columns), then `most` with a guarded tail."""
    if extent <= most:
        return extent
    d = largest_divisor(extent, most)
    return d if 2 * d > most else most
