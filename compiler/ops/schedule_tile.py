"""The register tile of any reduction whose body combines two operand reads, by structure.

A GEMM's micro-kernel (schedule_gemm.gemm_tile) keeps mr x nv vectors of accumulators: each
step of the reduction loads nv vectors of one operand (shared by the mr units of the tile) and
one broadcast of the other per unit (shared by the nv vectors). Nothing in that needs the body
to be a product: a sum of squared differences ((a - b)^2), a max-plus (max of a + b), an
absolute difference, a convolution in any layout (NHWC: vectors of output channels read from
the filter's unit-stride rows, one input value broadcast per output column) have the same two
reads, so they get the same tile. `product_tile(op, target)` finds it:

- the vector axis: the output's last axis (the one with stride 1 in the output), when every read
  of it is unit-stride in its last index or can be packed (schedule_stages.vector_packing);
- the tile axis: another output axis `u` such that some read that walks the vector axis does not
  depend on `u` (that vector is loaded once per step and used by every unit of the tile) and
  some read depends on `u` but not on the vector axis (the broadcast); among such axes the
  innermost, whose consecutive units are nearest in memory;
- mr x nv: the tile that does the most useful multiply-adds per cycle (gemm_tile's rating: FMAs
  on the target's pipes, loads, one FMA latency), counting the units and lanes an overhanging
  last tile wastes; an mr that divides the tile axis is preferred while it keeps at least
  three quarters of the rating (a split that does not divide costs a guard inside the unrolled
  tile).

A body of one read (a pool's window) or with no broadcast has no such tile: each accumulator
needs its own load, and accumulator_tile's smaller tile stays.
"""

from __future__ import annotations

import math

from ..expr import walk
from ..tensor import TensorRead
from .schedule_common import MIN_GROUP_LANES, var_groups
from .schedule_gemm import LOADS_PER_CYCLE, MAX_MR, ROW_VECTORS

MAX_TILE_LANES = 64
# cycles a tile's accumulators must cover: the FMA latency (4-5) plus the broadcast's
# load-to-use; rated with gemm_tile's 4, the 56 x 64 NHWC 3x3 conv took 2 x 4 vectors (8
# chains): 1.93 ms, where 6 x 2 vectors ran 1.30-1.65 ms (znver2, same run)
TILE_LATENCY = 6


def _reads(op) -> list:
    return [n for n in walk(op.body) if isinstance(n, TensorRead)]


def _uses(read, var) -> bool:
    return any(var in walk(i) for i in read.indices)


def _lane_varying(read, v) -> bool:
    """Whether `read` differs across the lanes of a vector of `v` that stays in one group of
    tile_group's size: it reads `v` other than as `v // g` (schedule_common.var_groups)."""
    return any(var_groups(i, v) is None for i in read.indices)


def tile_group(op) -> int | None:
    """The group size g the vector of `op`'s last axis must stay within (the gcd of the g of its
    reads `v // g`: a grouped convolution's channels per group), None when no read groups it.
    The tile's vectors then start at multiples of nr and nr divides g, so such a read is one
    value per vector, broadcast like any read without v."""
    v = op.axis[-1].var
    g = 0
    for r in _reads(op):
        for i in r.indices:
            for x in var_groups(i, v) or ():
                g = math.gcd(g, x)
    return g or None


def tile_axes(op) -> int | None:
    """The position in op.axis of the tile axis of a two-operand reduction vectorized along its
    last axis, or None when its body has no broadcast operand sharing a vector operand. A read of
    the vector axis only through `v // g` counts as not reading it (tile_group)."""
    if not op.reduce_axis or len(op.axis) < 2 or op.axis[-1].extent <= 1:
        return None
    v = op.axis[-1].var
    reads = _reads(op)
    group = tile_group(op)
    if group is not None and (op.axis[-1].extent % group or group < MIN_GROUP_LANES):
        return None
    for pos in range(len(op.axis) - 2, -1, -1):
        u = op.axis[pos]
        if u.extent <= 1:
            continue
        shared = any(_lane_varying(r, v) and not _uses(r, u.var) for r in reads)
        broadcast = any(_uses(r, u.var) and not _lane_varying(r, v) for r in reads)
        if shared and broadcast:
            return pos
    return None


def rate_tile(mr: int, nv: int, M: int, N: int, lanes: int, fmas_per_cycle: float) -> float:
    """Useful multiply-adds per cycle of an mr x nv-vector tile over M units and N lanes."""
    nr = nv * lanes
    fmas = mr * nv
    used = (N / (-(-N // nr) * nr)) * (M / (-(-M // mr) * mr))
    cycles = max(fmas / fmas_per_cycle, (mr + nv) / LOADS_PER_CYCLE, TILE_LATENCY)
    return fmas * used / cycles


def tile_choices(M: int, N: int, lanes: int, registers: int, fmas_per_cycle: float, group: int | None = None) -> list:
    """[(mr, nr)] register tiles for M units x N lanes, the best first (see the module); with
    `group`, only nr that divide it (tile_group), a vector of `group` lanes where no whole
    register does."""
    if group is not None and group < lanes:
        lanes = group
    rated = []
    for nv in ROW_VECTORS:
        nr = nv * lanes
        if nr > MAX_TILE_LANES or (nv > 1 and nr > N) or (group is not None and group % nr):
            continue
        most = min(MAX_MR, M, (registers - nv - 1) // nv)
        for mr in range(1, most + 1):
            r = rate_tile(mr, nv, M, N, lanes, fmas_per_cycle)
            divides = M % mr == 0
            rated.append((r, divides, mr * nv, mr, min(nr, N) if nv == 1 else nr))
    if not rated:
        return [(1, min(N, lanes))]
    best = max(r[0] for r in rated)
    # a dividing mr first while it keeps 3/4 of the best rating, then by rating
    rated.sort(key=lambda r: (not (r[1] and r[0] >= 0.75 * best), -r[0], -r[2]))
    out: list = []
    for *_, mr, nr in rated:
        if (mr, nr) not in out:
            out.append((mr, nr))
    return out


def product_tile(op, target) -> tuple | None:
    """(tile axis position, mr, nr) of a two-operand reduction `op` vectorized along its last
    axis (see the module), or None."""
    pos = tile_axes(op)
    if pos is None:
        return None
    from .schedule_common import lanes as lanes_of
    vl = lanes_of(target, op.dtype)
    caps = target.capabilities
    mr, nr = tile_choices(op.axis[pos].extent, op.axis[-1].extent, vl, caps.vector_registers,
                          caps.fmas_per_cycle, tile_group(op))[0]
    return pos, mr, nr


def broadcast_read(op, read) -> bool:
    """Whether `read` is the operand `op`'s product tile broadcasts: it walks the tile axis and
    not the vector axis, so each unit of the tile reads it once per reduction step (a padding
    stage inlined there evaluates its border test, a branch, once per unit and step)."""
    pos = tile_axes(op)
    if pos is None:
        return False
    return _uses(read, op.axis[pos].var) and not _lane_varying(read, op.axis[-1].var)


__all__ = ["product_tile", "tile_axes", "tile_group", "tile_choices", "rate_tile", "broadcast_read", "TILE_LATENCY"]
