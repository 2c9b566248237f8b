"""Helpers shared by the default schedules: vector widths, tile factors, parallel outer loops.

The rules they encode, measured on AVX2 (8 float lanes) with 2 cores:
- a split that does not divide its loop costs a guard; in a reduction's micro-kernel the guard
  (or the clamped, gathered reads an overhanging attached region gets) is several times slower
  than the loop itself, so tile factors are divisors of the extent whenever one is close enough;
- a vectorized loop may be any length up to 64 lanes: LLVM splits a `<13 x float>` load/store
  into register-sized pieces without masks, which beats a masked 8-lane tail; but a vector of
  accumulators carried around a loop must be ≤ 1 register or 1, 2, 4 whole ones (see
  accumulator_factor);
- starting a parallel region costs a few microseconds, so small stages stay serial.
"""

from __future__ import annotations

from ..arith import unit_step
from ..expr import walk
from ..target import resolve_target
from ..tensor import TensorRead

MAX_LANES = 64
# below this many scalar operations per call a parallel region costs more than it saves
PARALLEL_MIN_WORK = 1 << 15


def lanes(target, dtype: str) -> int:
    """Vector lanes of `dtype` on `target` (at least 4, so SSE-only targets still vectorize)."""
    return max(4, resolve_target(target).vector_lanes(dtype))


def divisors(n: int) -> list:
    return [d for d in range(1, n + 1) if n % d == 0]


def largest_divisor(n: int, limit: int, multiple_of: int = 1) -> int:
    """The largest divisor of n that is <= limit and a multiple of `multiple_of` (0 if none)."""
    best = 0
    for d in divisors(n):
        if d <= limit and d % multiple_of == 0:
            best = d
    return best


def vector_factor(extent: int, vl: int, max_vectors: int = 4) -> int:
    """Lanes of the vectorized inner loop for a loop of `extent` iterations.

    The whole loop if it fits in `max_vectors` registers; otherwise the largest multiple of the
    vector width up to `max_vectors` registers that divides it; otherwise one register with a
    masked tail.
    """
    if extent <= min(vl * max_vectors, MAX_LANES):
        return extent
    for k in range(max_vectors, 0, -1):
        if k * vl <= MAX_LANES and extent % (k * vl) == 0:
            return k * vl
    return min(vl, MAX_LANES)


def accumulator_factor(extent: int, vl: int, max_vectors: int = 4) -> int:
    """Lanes of a vector of accumulators carried around a reduction loop: at most one register,
    or a power-of-two number of whole registers. LLVM keeps `<8 x float>` and `<32 x float>`
    phis in registers but splits and reassembles a `<24 x float>` or `<28 x float>` one every
    iteration (measured 5x slower)."""
    if extent <= min(vl, MAX_LANES):
        return extent
    k = max_vectors
    while k >= 1:
        if k * vl <= MAX_LANES and extent % (k * vl) == 0:
            return k * vl
        k //= 2
    return min(vl, MAX_LANES)


def vectorize_inner(stage, axis, vl: int, max_vectors: int = 4, carried: bool = False):
    """Split `axis` for vectorization and vectorize the inner part; returns the outer (or None).

    `carried`: the vector is a reduction's accumulator (see accumulator_factor)."""
    f = (accumulator_factor if carried else vector_factor)(axis.extent, vl, max_vectors)
    if f >= axis.extent:
        stage.vectorize(axis)
        return None
    outer, inner = stage.split(axis, factor=f)
    stage.vectorize(inner)
    return outer


def fuse_all(stage, axes):
    """Fuse consecutive loops (one axis is returned as is; none gives None)."""
    axes = list(axes)
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else stage.fuse(*axes)


def want_parallel(target, work: int) -> bool:
    return resolve_target(target).num_cores > 1 and work >= PARALLEL_MIN_WORK


def parallel_loop(stage, outer_axes, next_axis, target, work: int):
    """Fuse the outer loops and run them in parallel when the stage is big enough.

    `outer_axes` are consecutive loops, outermost first; when they give fewer iterations than
    there are cores, `next_axis` (the loop just inside them, if any) is fused in as well.
    Returns the parallel (or fused serial) loop, or None.
    """
    target = resolve_target(target)
    outer = list(outer_axes)
    extent = 1
    for a in outer:
        extent *= _extent(a)
    if next_axis is not None and extent < 2 * target.num_cores:
        outer.append(next_axis)
    loop = fuse_all(stage, outer)
    if loop is not None and want_parallel(target, work) and _extent(loop) > 1:
        stage.parallel(loop)
    return loop


def _extent(iv) -> int:
    return iv.extent


MIN_GROUP_LANES = 4


def var_groups(index, var) -> set | None:
    """{g} when `index` reads `var` only as `var // g` (constants g >= MIN_GROUP_LANES): its value
    is the same on every lane of a vector of `var` whose lanes stay in one group of g (a grouped
    convolution's input channel `(f // cg) * cg + c` along output channels f); set() when it does
    not read `var`; None when it reads it otherwise."""
    from ..expr import Binary, Const
    groups: set = set()

    def visit(e) -> bool:
        if isinstance(e, Binary) and e.op == "floordiv" and e.a is var and isinstance(e.b, Const) \
                and int(e.b.value) >= MIN_GROUP_LANES:
            groups.add(int(e.b.value))
            return True
        if e is var:
            return False
        return all(visit(k) for k in e.children())
    return groups if visit(index) else None


def reads_in_order(read, var) -> bool:
    """Whether tensor read `read` (a TensorRead) takes consecutive elements, or one element, as
    `var` steps: `var` only in its last index, one step a step. Else a vector along `var`
    gathers it."""
    *lead, last = read.indices
    if any(var in walk(i) for i in lead):
        return False
    return var not in walk(last) or unit_step(last, var)


def gathers_along(body, var) -> bool:
    """Whether a vector along `var` of the compute `body` gathers any of its reads (a channel
    shuffle, a layout change across the lanes): each such element costs
    codegen_llvm.GATHER_WORK."""
    return any(isinstance(n, TensorRead) and not reads_in_order(n, var) for n in walk(body))
