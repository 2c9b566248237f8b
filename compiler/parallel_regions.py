"""A lowered kernel's parallel regions, read from its loop IR: what runs on libgomp, how often,
on how many threads at most, in which chunks.

The scaling model (compiler/scaling.py) predicts a kernel's time on many threads from these
facts and from single-thread timings, so they must be the facts code generation acts on, not a
guess from the schedule: a region is exactly a loop that codegen_llvm.emit_parallel outlines (a
`parallel` loop of extent > 1, not inside another parallel loop nor a vectorized one; a parallel
loop nested in a region runs serially inside its chunk), its team cap is
codegen_llvm.parallel_team_cap of that loop, its chunks are those of _emit_counted_chunks
(contiguous, about extent / (team · CHUNKS_PER_THREAD) iterations each). A region nested in
serial loops forks and joins once per iteration of them: `entries` counts those (an upper bound
where an `if` may skip it; the profiling build counts the real number). Consecutive regions
run as one team (compiler/parallel_teams.py): the team forks once, on its first region, and
enters each later one through a barrier where it needs one (`waits`), with as many threads as
its largest cap asks for; each region still cuts its iterations into the chunks its own cap makes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .codegen_llvm import CHUNKS_PER_THREAD, parallel_team_cap
from .dtypes import nbytes
from .expr import walk
from .loop_ir import Allocate, For, Load, LoweredFunc, Stmt, Store, stmt_children, stmt_exprs
from .parallel_teams import Team, is_region_loop, team_plan


@dataclass
class Region:
    """One outlined parallel loop of a kernel."""

    index: int            # order of appearance in the kernel (the profiling build's slot number)
    var: str              # the loop variable's name (the schedule's fused axis, e.g. `oc_o.ow_o`)
    extent: int           # iterations the loop hands out
    team_cap: int         # the threads its chunks are cut for, at most (parallel_team_cap)
    entries: int          # forks (or, in a team, barriers) per kernel call: the enclosing loops' extents multiplied
    bytes: int            # bytes of the non-scratch buffers its body reads or writes
    buffers: list = field(default_factory=list)   # their names
    loop: For | None = field(default=None, repr=False, compare=False)
    first: int = -1       # index of its team's first region (itself: it forks); -1: itself
    threads_cap: int = 0  # most threads its team starts (the largest cap of the team); 0: team_cap
    waits: bool = False   # a later region of a team: whether a barrier precedes it

    @property
    def forks(self) -> bool:
        """Whether entering it starts a team (else the team is running: a barrier enters it)."""
        return self.first in (-1, self.index)

    def team(self, threads: int) -> int:
        """The threads present when it runs, `threads` being available."""
        return max(1, min(self.threads_cap or self.team_cap, threads))

    def chunks(self, threads: int) -> list:
        """[(first, end)] iteration ranges the dynamic schedule hands out on `threads` threads."""
        return chunk_ranges(self.extent, max(1, min(self.team_cap, threads)))

    def to_dict(self) -> dict:
        return {"index": self.index, "var": self.var, "extent": self.extent, "team_cap": self.team_cap,
                "entries": self.entries, "bytes": self.bytes, "forks": self.forks, "waits": self.waits,
                "team_threads_cap": self.threads_cap or self.team_cap}


def chunk_size(extent: int, team: int) -> int:
    """Iterations per chunk, as the generated code computes it: ceil(extent / (team · CHUNKS_PER_THREAD))."""
    per = team * CHUNKS_PER_THREAD
    return max(1, (extent + per - 1) // per)


def chunk_ranges(extent: int, team: int) -> list:
    """The contiguous chunks [(first, end)] of a region of `extent` iterations on a team of `team`."""
    size = chunk_size(extent, team)
    return [(lo, min(lo + size, extent)) for lo in range(0, extent, size)]


def parallel_regions(func: LoweredFunc) -> list:
    """The regions of `func`, in the order code generation meets them."""
    found: list = []
    _collect(func.body, 1, found)
    return found


def _region(s: For, entries: int, found: list) -> Region:
    names, nbytes = _touched(s)
    region = Region(len(found), s.var.name, s.extent, parallel_team_cap(s), entries, nbytes, names, s)
    found.append(region)
    return region


def _collect(s: Stmt, entries: int, found: list) -> None:
    plan = team_plan(s)
    if plan is not None:
        for item in plan[1]:
            if not isinstance(item, Team):
                _collect(item, entries, found)
                continue
            members = [_region(loop, entries, found) for loop in item.loops]
            cap = max(r.team_cap for r in members)
            for r, wait in zip(members, item.barriers):
                r.first, r.threads_cap, r.waits = members[0].index, cap, wait
        return
    if isinstance(s, For):
        if is_region_loop(s):
            _region(s, entries, found)
            return
        if s.kind == "vectorized":   # codegen runs a parallel loop under a vector loop serially
            return
        _collect(s.body, entries * s.extent, found)
        return
    for child in stmt_children(s):
        _collect(child, entries, found)


def _touched(body: Stmt) -> tuple:
    """(names, bytes) of the argument and global buffers `body` loads or stores: the least it
    moves through the memory hierarchy (scratch allocated inside it stays thread-local). A
    buffer counts its whole size, or what the loop's accesses can reach when that is less: a
    Gather of 128 rows of a 94 MB embedding table moves 128 rows, not the table."""
    local: set = set()
    seen: dict = {}
    counts: dict = {}

    def count(buf, times: float) -> None:
        seen[id(buf)] = buf
        counts[id(buf)] = counts.get(id(buf), 0.0) + times

    def visit(s: Stmt, times: float) -> None:
        if isinstance(s, For):
            visit(s.body, times * s.extent)
            return
        if isinstance(s, Allocate):
            local.add(s.buffer)
        if isinstance(s, Store):
            count(s.buffer, times)
        for e in stmt_exprs(s):
            for n in walk(e):
                if isinstance(n, Load):
                    count(n.buffer, times)
        for child in stmt_children(s):
            visit(child, times)

    visit(body, 1.0)
    kept = [b for b in seen.values() if b not in local and b.scope != "local"]
    moved = sum(min(b.nbytes, int(counts[id(b)]) * nbytes(b.dtype)) for b in kept)
    return sorted(b.name for b in kept), moved


def total_chunks(regions: list, threads: int) -> int:
    """Chunks handed out per kernel call on `threads` threads (every entry of every region)."""
    return sum(r.entries * len(r.chunks(threads)) for r in regions)


def min_chunks(regions: list, threads: int) -> int:
    """The fewest chunks any region hands out in one entry on `threads` threads (0: no region)."""
    return min((len(r.chunks(threads)) for r in regions), default=0)


__all__ = ["Region", "parallel_regions", "chunk_ranges", "chunk_size", "total_chunks", "min_chunks"]
