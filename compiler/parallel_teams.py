"""Which parallel loops of a kernel share one team of threads: one fork per kernel, not per loop.

A kernel is lowered to a sequence of root loop nests, one per stage left at the root: a
convolution's padded-input copy, its weight packing, the convolution itself; the three
transforms of a Winograd layer. Each one the schedule made parallel used to fork a team of
threads and join it. On 2 threads that costs a microsecond a loop; on 16 the forks and joins of
a three-region convolution cost more than its packing does, and every join lets the team's
threads fall asleep between loops that read each other's output (issue 58: ResNet-50's res4
1x1 layer ran 334 GFLOPS on 8 threads and 164 on 16, while a layer packing inside its one region
reached 801).

So code generation runs *consecutive* parallel loops of one sequence as one team
(`team_plan`): one GOMP_parallel, each loop's chunks handed out in turn, one join. A barrier
stands before a loop only where it needs one (`Team.barriers`): when it reads or writes a buffer
a loop since the last barrier wrote, or writes one such a loop read. A convolution's input copy
and its weight packing touch different buffers, so a thread done with its share of the first
goes straight on to the second; the tiles, which read both, wait. "Consecutive" looks through the
scratch buffers declared between them (`Allocate`): code generation places every scratch buffer
at the function's entry anyway, so declaring it before the team changes nothing. A serial
statement between two parallel loops ends the team: it runs on the calling thread between two
teams, as before.

One rule, read by code generation (compiler/codegen_llvm.py) and by the scaling model's view of
a kernel (compiler/parallel_regions.py), so the model predicts the code that runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from .expr import walk
from .loop_ir import Allocate, For, Load, Seq, Stmt, Store, stmt_exprs, walk_stmts


@dataclass(frozen=True)
class Team:
    """Parallel loops run by one team, in order; `barriers[i]`: whether the team waits for
    every thread before loop i (never before the first: the fork is the start)."""

    loops: tuple
    barriers: tuple

    def __post_init__(self):
        if len(self.loops) < 2:
            raise ValueError("a team runs at least two parallel loops; one loop is a region of its own")
        if len(self.barriers) != len(self.loops) or self.barriers[0]:
            raise ValueError("a team has one barrier flag a loop, and none before its first")


def accesses(loop: Stmt) -> tuple:
    """(ids of the buffers read, ids of those written) by `loop`, leaving out the scratch it
    declares itself (each thread's own)."""
    reads: set = set()
    writes: set = set()
    own: set = set()
    for st in walk_stmts(loop):
        if isinstance(st, Allocate):
            own.add(id(st.buffer))
        elif isinstance(st, Store):
            writes.add(id(st.buffer))
        reads |= {id(n.buffer) for e in stmt_exprs(st) for n in walk(e) if isinstance(n, Load)}
    return reads - own, writes - own


def barriers_needed(loops: tuple) -> tuple:
    """Per loop, whether it must wait for the loops before it (since the last barrier): it
    reads or writes what they wrote, or writes what they read. A prefetch is a hint and never
    waits."""
    flags = [False]
    read_since, written_since = accesses(loops[0])
    for loop in loops[1:]:
        reads, writes = accesses(loop)
        wait = bool((reads | writes) & written_since or writes & read_since)
        flags.append(wait)
        if wait:
            read_since, written_since = reads, writes
        else:
            read_since, written_since = read_since | reads, written_since | writes
    return tuple(flags)


def is_region_loop(s: Stmt) -> bool:
    """A loop code generation outlines into a parallel region (outside other regions and vector
    loops: the caller's business)."""
    return isinstance(s, For) and s.kind == "parallel" and s.extent > 1


def flatten(s: Stmt) -> tuple:
    """(the Allocate nodes, the other statements) of the nest of Seq and Allocate nodes at `s`,
    each in program order: what runs one after another at this level."""
    allocates: list = []
    leaves: list = []
    stack = [s]
    while stack:
        node = stack.pop()
        if isinstance(node, Seq):
            stack.extend(reversed(node.stmts))
        elif isinstance(node, Allocate):
            allocates.append(node)
            stack.append(node.body)
        else:
            leaves.append(node)
    return allocates, leaves


def team_plan(s: Stmt) -> tuple | None:
    """(the Allocates to declare first, [statement or Team, ...] to run in order) for a Seq or
    Allocate nest, or None when no two parallel loops are consecutive in it (then nothing is
    rewritten: the nest is run as written)."""
    if not isinstance(s, (Seq, Allocate)):
        return None
    allocates, leaves = flatten(s)
    items: list = []
    run: list = []
    for leaf in [*leaves, None]:
        if leaf is not None and is_region_loop(leaf):
            run.append(leaf)
            continue
        items.extend([Team(tuple(run), barriers_needed(tuple(run)))] if len(run) > 1 else run)
        run = []
        if leaf is not None:
            items.append(leaf)
    if not any(isinstance(i, Team) for i in items):
        return None
    return allocates, items


__all__ = ["Team", "team_plan", "flatten", "is_region_loop", "accesses", "barriers_needed"]
