"""Sampling helpers of the sketch space: tile factors, vector lengths, loop levels, the loops a
parallel prefix fuses, and the tile mutation.
"""

from __future__ import annotations

from compiler.schedule import MAX_VECTOR_LANES

NICE_SIZES = (2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 24, 32, 48, 64)
NONDIVIDING_P = 0.15      # how often a tile size that does not divide its extent is drawn


def divisors(n: int) -> list:
    return [d for d in range(1, n + 1) if n % d == 0]


def pick(rng, seq):
    seq = list(seq)
    return seq[int(rng.integers(len(seq)))]


def sample_factor(rng, extent: int, cap: int) -> int:
    """A tile size for a loop of `extent`: a divisor up to `cap`, sometimes (more often when the
    extent has few small divisors, a prime) a size that does not divide it."""
    divs = [d for d in divisors(extent) if d <= cap]
    others = [d for d in NICE_SIZES if d <= min(cap, extent) and extent % d]
    # a long loop whose only small divisor is 1 (a prime like 67) mostly gets non-dividing tiles
    p = 0.5 if divs == [1] or (len(divs) == 2 and extent > cap) else NONDIVIDING_P
    if others and rng.random() < p:
        return pick(rng, others)
    return pick(rng, divs)


def vector_sizes(extent: int, lanes: int) -> list:
    """Lengths of a vectorized innermost loop: whole registers up to 64 lanes (not past the
    extent's last register), or the whole loop when it fits."""
    out = [lanes * m for m in range(1, MAX_VECTOR_LANES // lanes + 1) if lanes * (m - 1) < extent]
    if extent <= MAX_VECTOR_LANES:
        out.append(extent)
    return sorted(set(v for v in out if v > 1)) or [1]


def sample_levels(rng, rest: int, n: int, caps) -> list:
    """n factors (outer to inner) of `rest` (their product divides it), each within its cap."""
    out = []
    for c in reversed(caps[:n]):
        f = pick(rng, [d for d in divisors(rest) if d <= c])
        out.append(f)
        rest //= f
    return list(reversed(out))


def loop_outer(axes, reduction: bool, inner, split) -> list:
    """The loops in front of a reduce/elementwise stage's inner part, which a parallel prefix
    fuses: the spatial axes but the last, plus the last one's outer part when it is split; with
    no inner annotation, a reduction's spatial loops all (they precede its reduction loops), an
    elementwise stage's all but the last row loop (left to LLVM's vectorizer) unless it has one."""
    axes = list(axes)
    last = axes[-1]
    if inner != "none" and last.extent > 1 and split > 1:
        return axes[:-1] + ([OuterLoop(-(-last.extent // split))] if split < last.extent else [])
    if reduction or len(axes) == 1:
        return axes
    return axes[:-1]


def outer_order(items: list, last_outer: bool, vec_last: int | None) -> list:
    """Per-axis items (loops or extents) in the order of a tile's outer levels: the last axis
    first when `last_outer`; then the vector axis `vec_last` (if given) moved last."""
    order = list(range(len(items)))
    if last_outer:
        order = order[-1:] + order[:-1]
    if vec_last is not None:
        order = [d for d in order if d != vec_last] + [vec_last]
    return [items[d] for d in order]


class OuterLoop:
    """Stands for the outer loop a split will create (sampling only needs its extent)."""

    def __init__(self, extent):
        self.extent = extent


def move_factor(levels: list, rng) -> list:
    """Ansor-style tile mutation: move a factor of one level to another (the innermost level of
    a vector axis keeps its length)."""
    levels = list(levels)
    src = int(rng.integers(len(levels)))
    divs = [d for d in divisors(levels[src]) if d > 1]
    if not divs:
        return levels
    f = pick(rng, divs)
    dst = pick(rng, [k for k in range(len(levels) + 1) if k != src + 1])  # 0 = the outer loop
    levels[src] //= f
    if dst > 0:
        levels[dst - 1] *= f
    if levels[-1] > MAX_VECTOR_LANES:
        levels[-1] = MAX_VECTOR_LANES
    return levels


__all__ = ["NICE_SIZES", "NONDIVIDING_P", "divisors", "pick", "sample_factor", "vector_sizes", "sample_levels",
           "loop_outer", "outer_order", "OuterLoop", "move_factor"]
