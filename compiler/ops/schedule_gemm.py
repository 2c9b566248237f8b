"""Default x86/Arm schedule for GEMM-like operators: matmul, matmul_int8, dense, batch_matmul.

The GotoBLAS recipe in schedule terms (see shared perf notes):
- register tile: the output is tiled mr × nr, sized by the target's register file (gemm_tile:
  6 × 2 vectors with AVX2's 16 registers, 6 × 4 with the 32 of AVX-512 or NEON); the reduction is
  computed at the tile loop into a local mr × nr buffer (cache_write, or the dense reduction
  stage itself when an epilogue follows), with the k loop outside the unrolled rows and the
  vectorized columns, so LLVM keeps the mr·nr/lanes accumulators in registers;
- packing: B is copied into [N/nr][K][nr] panels (cache_read with a blocked layout) so each
  k step is one unit-stride load per vector;
- the tile loops walk B's panels outermost, then the row tiles (fused with the batch, parallel),
  so a panel stays in L2 while every row tile uses it; the packing is parallel over panels;
- where B streams from memory once per call (one row: schedule_gemv; one row tile over a
  prepacked weight: a decode step), the stream is prefetched STREAM_PREFETCH_BYTES ahead.
"""

from __future__ import annotations

import math

from ..dtypes import nbytes
from ..schedule import MAX_VECTOR_LANES, Schedule, create_schedule
from ..target import resolve_target
from .schedule_common import PARALLEL_MIN_WORK

MAX_MR = 8  # rows of a register tile (the gemm template's tile_i knob goes this far)
LOADS_PER_CYCLE = 2  # vector loads a core issues per cycle (broadcasts of A, vectors of B)
FMA_LATENCY = 4  # cycles between two updates of one accumulator (schedule_conv.FMA_LATENCY)
ROW_VECTORS = (4, 2, 1)  # vectors per tile row: a power of two (see schedule_common.accumulator_factor)


def gemm_tile(M: int, N: int, lanes: int, registers: int, columns: int | None = None,
              fmas_per_cycle: float = 2.0) -> tuple:
    """(mr, nr) of the register tile for a target with `registers` vector registers of `lanes`.

    A k step holds mr·nv accumulators, nv vectors of B and one broadcast of A in registers, and
    does mr·nv FMAs for mr + nv loads. Among whole-register row widths nv (no wider than N) and
    the most rows that fit, the tile that does the most useful FMAs per cycle wins, then the one
    with the most FMAs per load: 6 × 2 vectors with 16 registers (12 accumulators: 4 × 4 would
    not fit), 6 × 4 with 32. A k step takes the longest of its FMAs on the target's
    `fmas_per_cycle` pipes, its loads at LOADS_PER_CYCLE and one FMA latency (each accumulator
    waits for its previous update), as schedule_conv.pick_tile rates conv tiles. Useful: the
    last column tile's lanes past N are computed and thrown away, so where N is not a multiple
    of the wide tile a narrower one that divides it is faster (ConvNeXt's 384 -> 96 projection:
    6 x 64 wasted a quarter of its FMAs, 8 x 32 ran 1.38x faster); but a one-vector tile of 8
    chains starves two FMA pipes (load- and latency-bound): 1000 x 1000 on AVX2 took 8 x 8 for
    its 0.8 % of wasted lanes under 6 x 16, 0.69x onnxruntime.
    `columns`: B already comes in panels that wide (a model's prepacked weight), so nr is that,
    and mr the most rows within 5 % of the best rate, the rows past M counted as waste: 8 rows
    in tiles of 6 computed 12 (a batch-8 MLP layer and a batch-8 decode step's projections).
    """
    if columns is not None:
        nv = max(columns // lanes, 1)
        most = max(1, min(MAX_MR, M, (registers - nv - 1) // nv))

        def rate(mr):
            cycles = max(mr * nv / fmas_per_cycle, (mr + nv) / LOADS_PER_CYCLE, FMA_LATENCY)
            return mr * nv * M / (-(-M // mr) * mr) / cycles
        best = max(rate(mr) for mr in range(1, most + 1))
        return max(mr for mr in range(1, most + 1) if rate(mr) >= 0.95 * best), columns
    if M <= MAX_MR:
        return _few_rows_tile(M, N, lanes, registers, fmas_per_cycle)
    tiles = []
    for nv in ROW_VECTORS:
        mr = min(MAX_MR, M, (registers - nv - 1) // nv)
        nr = nv * lanes
        if mr >= 1 and nr <= MAX_VECTOR_LANES and (nv == 1 or nr <= N):
            fmas = mr * nv
            used = N / (-(-N // nr) * nr)
            cycles = max(fmas / fmas_per_cycle, (mr + nv) / LOADS_PER_CYCLE, FMA_LATENCY)   # loads from L1
            tiles.append((round(fmas * used / cycles, 2), fmas / (mr + nv), mr, nr))
    *_, mr, nr = max(tiles)
    return mr, nr


def _few_rows_tile(M: int, N: int, lanes: int, registers: int, fmas_per_cycle: float) -> tuple:
    """gemm_tile for M <= MAX_MR rows (a decode step of a small batch): each pass of a row tile
    over a panel of B reads it again, from memory the first time, and such a product is bound by
    memory more than by FMAs. Among the tiles within 5 % of the best rate (rows and columns past
    M and N counted as waste), the fewest passes, then the most FMAs per load: 8 rows on
    AVX-512 take one 8 x 2-vector tile (16 accumulators) at the rate of two passes of 4 x 4;
    on AVX2's 16 registers one pass would be 8 x 1 vector, load-bound at 1.8 FMAs a cycle, so
    two passes of 4 x 2 vectors."""
    options = []
    for nv in ROW_VECTORS:
        nr = nv * lanes
        if nr > MAX_VECTOR_LANES or (nv != 1 and nr > N):
            continue
        for mr in range(1, min(MAX_MR, M, (registers - nv - 1) // nv) + 1):
            cycles = max(mr * nv / fmas_per_cycle, (mr + nv) / LOADS_PER_CYCLE, FMA_LATENCY)
            passes = -(-M // mr)
            used = N / (-(-N // nr) * nr) * M / (passes * mr)
            options.append((mr * nv * used / cycles, -passes, mr * nv / (mr + nv), mr, nr))
    best = max(o[0] for o in options)
    *_, mr, nr = max(o[1:] for o in options if o[0] >= 0.95 * best)
    return mr, nr


def schedule_gemm(opdef, target=None, pack: bool = True) -> Schedule:
    """The GotoBLAS schedule. `pack=False` reads B in place: for a product of one row tile
    (a batch-1 layer of a model) every B element is used once per call, so copying B into
    panels costs as much as the product itself; unpacked, B must be [K, N] (unit stride along
    the vector of columns)."""
    target = resolve_target(target)
    s, out_stage, acc_stage, lanes = _product_stages(opdef, target)
    *batch, M, N = opdef.output.shape
    caps = target.capabilities
    mr, nr = gemm_tile(M, N, lanes, caps.vector_registers, opdef.params.get("weight_block"), caps.fmas_per_cycle)
    *b_axes, i, j = out_stage.op.axis
    io, ii = out_stage.split(i, factor=mr)
    jo, ji = out_stage.split(j, factor=nr)
    # panels outermost: a thread sweeps every row tile over one packed B panel (K x nr, in its
    # L2) before the next; rows outermost streamed all of B (4 MB at 1024^3) from L3 per row
    # tile: 1024^3 read 176 GFLOPS that way and 415 this way (numpy 374, rocketlake, 2 threads)
    out_stage.reorder(*b_axes, jo, io, ii, ji)
    outer = out_stage.fuse(*b_axes, jo, io)
    acc_stage.compute_at(out_stage, outer)
    *_, ci, cj = acc_stage.op.axis
    (k,) = acc_stage.op.reduce_axis
    ko, ki = acc_stage.split(k, factor=4)
    acc_stage.reorder(ko, ki, ci, cj)
    acc_stage.unroll(ki)
    acc_stage.unroll(ci)
    acc_stage.vectorize(cj)
    out_stage.vectorize(ji)
    out_stage.parallel(outer)
    if pack:
        _pack_b(s, opdef, acc_stage, nr)
    elif "weight_block" in opdef.params and math.prod(batch) * -(-M // mr) == 1:
        # one row tile streams every panel once: prefetch the panel ahead (see STREAM_PREFETCH_BYTES)
        b = opdef.inputs[1]
        acc_stage.prefetch(b, ko, stream_prefetch_offset(ki.extent * nr * nbytes(b.dtype)))
    return s


STREAM_PREFETCH_BYTES = 16 << 10   # how far ahead a streamed operand is prefetched


def stream_prefetch_offset(bytes_per_iteration: int) -> int:
    """Iterations of a loop that reads `bytes_per_iteration` of a stream to prefetch ahead, so
    the lines asked for arrive STREAM_PREFETCH_BYTES early: about a microsecond of a core's
    share of the memory's bandwidth, several times its latency. A product of 8 rows over panels
    of a prepacked weight read 2048 x 5632 at 36 GB/s without, 59 / 75 / 86 with 4 / 8 / 16 KB
    ahead (Zen 5, 2 threads; 32 KB no better)."""
    return max(1, -(-STREAM_PREFETCH_BYTES // max(1, bytes_per_iteration)))


def _product_stages(opdef, target) -> tuple:
    """(schedule, output stage, accumulator stage, lanes) of a matrix product: the accumulators
    are a local cache of the output, or, when an epilogue stage is the output, the reduction
    stage itself (computed into a local tile or chunk of it)."""
    out = opdef.output
    s = create_schedule(out)
    red_stage = next(st for st in s.stages if st.op.reduce_axis)
    out_stage = s[out]
    lanes = target.vector_lanes(red_stage.op.dtype if red_stage.op.dtype != "int8" else "int32")
    acc_stage = s[s.cache_write(out, "local")] if red_stage is out_stage else red_stage
    return s, out_stage, acc_stage, lanes


def _pack_b(s: Schedule, opdef, acc_stage, nr: int):
    """Pack the right-hand operand into [N/nr][..][K][nr] panels read with unit stride."""
    b = opdef.inputs[1]
    transposed = bool(opdef.params.get("transpose_b")) or opdef.name == "dense"
    n_axis = b.ndim - 2 if transposed else b.ndim - 1
    packed = s.cache_read(b, "global", [acc_stage], block={n_axis: nr})
    st = s[packed]
    st.parallel(st.op.axis[0])
    st.vectorize(st.op.axis[-1])


GEMV_UNROLL = 4  # vectors of a GEMV chunk updated per unrolled step
MIN_GEMV_CHUNK = 8  # vectors of a GEMV chunk at least (256 contiguous bytes of B per row with AVX2)
MIN_PACKED_GEMV_CHUNK = 2  # the same where B is laid out in the chunks' panels (contiguous at any width)


def schedule_gemv(opdef, target=None, lanes: int | None = None) -> Schedule:
    """One output row (a batch-1 layer of a model, B [K, N]): the row streamed, not tiled.

    The GEMM tile (schedule_gemm) walks B by column panels: each k step reads nr floats of a
    row N floats long, one or two cache lines a page apart, which no prefetcher follows; batch-1
    classifiers (1280 x 1000, 512 x 1000) ran at 15 GB/s from L3 against OpenBLAS's 84 (5-7x
    slower). Here each thread owns a chunk of the columns (N split by the cores, whole vectors)
    and, for every k, updates the chunk's accumulators (a local buffer in L1) with one
    contiguous stretch of B's row: B streams once, sequentially, whatever its size. Needs
    whole vectors of columns: `lanes` (default the target's) is the vector width, gemv_lanes
    picks a narrower one when the target's does not divide N.
    """
    target = resolve_target(target)
    s, out_stage, acc_stage, target_lanes = _product_stages(opdef, target)
    lanes = lanes or target_lanes
    *b_axes, i, j = out_stage.op.axis
    chunk, unroll = gemv_chunk(j.extent, lanes, target.num_cores if opdef.flops >= PARALLEL_MIN_WORK else 1,
                               packed="weight_block" in opdef.params)
    jo, ji = out_stage.split(j, factor=chunk)
    outer = out_stage.fuse(*b_axes, i, jo)
    _, jv = out_stage.split(ji, factor=lanes)
    out_stage.vectorize(jv)
    acc_stage.compute_at(out_stage, outer)
    *_, ci, cj = acc_stage.op.axis
    (k,) = acc_stage.op.reduce_axis
    cjo, cjv = acc_stage.split(cj, factor=lanes)
    cjoo, cjoi = acc_stage.split(cjo, factor=unroll)
    acc_stage.reorder(ci, k, cjoo, cjoi, cjv)
    acc_stage.unroll(cjoi)
    acc_stage.vectorize(cjv)
    if "weight_block" in opdef.params or chunk == j.extent:
        # a core's part of B is one contiguous block, read in order: prefetch it ahead (in the
        # address order, across its rows: STREAM_PREFETCH_BYTES)
        b = opdef.inputs[1]
        acc_stage.prefetch(b, cjoo, stream_prefetch_offset(unroll * lanes * nbytes(b.dtype)))
    if outer.extent > 1:
        out_stage.parallel(outer)
    return s


MIN_GEMV_LANES = 4   # narrower vectors than this: the GEMM tile instead


def gemv_panel_columns(K: int, N: int, lanes: int, cores: int) -> int | None:
    """The columns of each core's chunk when schedule_gemv streams a one-row product's B [K, N]
    in more than one chunk, else None: the panel width a model's constant B is laid out in
    (compiler.graph.passes.prepack_matmul_weights), so each core's part is one block."""
    vl = gemv_lanes(N, lanes)
    if vl is None:
        return None
    chunk, _ = gemv_chunk(N, vl, cores if 2 * K * N >= PARALLEL_MIN_WORK else 1, packed=True)
    return chunk if chunk < N else None


def gemv_fits(N: int, lanes: int) -> bool:
    """schedule_gemv needs whole vectors of columns: a chunk that overhangs the row would read B
    through clamped (gathered) indices."""
    return N % lanes == 0


def gemv_lanes(N: int, lanes: int) -> int | None:
    """The vector width schedule_gemv streams a row of N columns with: the target's `lanes`, else
    the widest half, quarter, ... of it (at least MIN_GEMV_LANES) that divides N, else None. A
    1000-class classifier does not fit AVX-512's 16 lanes; on its 8 it streams its 5 MB of
    weights instead of walking them by column panels a page apart (MobileNetV2's last layer on
    znver4: 0.96 -> 0.05 ms)."""
    while lanes >= MIN_GEMV_LANES:
        if gemv_fits(N, lanes):
            return lanes
        lanes //= 2
    return None


def gemv_chunk(N: int, lanes: int, cores: int, packed: bool = False) -> tuple:
    """(columns per chunk, vectors per unrolled step) of schedule_gemv: the row cut into equal
    chunks of whole vectors, as few as give every core one (the smallest divisor of the
    vector count that is at least `cores`, while a chunk keeps MIN_GEMV_CHUNK vectors for a
    long contiguous stretch per row), else as many as keep that stretch (more cores than such
    chunks: a 512-column layer on 16 cores ran in one chunk, on one core, where 4 keep 8
    vectors each). `packed`: B is laid out in the chunks' own panels, each chunk's part one
    contiguous block at any width, so a chunk needs only MIN_PACKED_GEMV_CHUNK vectors (a
    1000-class classifier on 16 cores: 25 chunks of 5 vectors, not 5 of 25)."""
    least = MIN_PACKED_GEMV_CHUNK if packed else MIN_GEMV_CHUNK
    vectors = N // lanes
    fits = [p for p in range(1, vectors + 1) if vectors % p == 0 and vectors // p >= least]
    parts = next((p for p in fits if p >= max(cores, 1)), max(fits, default=1))
    per = vectors // parts
    unroll = next(u for u in (GEMV_UNROLL, 2, 1) if per % u == 0)
    return per * lanes, unroll
