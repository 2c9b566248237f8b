"""Memory planning: which buffer each run-time value of a compiled model lives in.

Values that share memory by construction (the reshape family's outputs and their inputs) form
one *storage*; a storage is live from the step that writes it to the last step that reads any of
its values. Steps run in order; at each step the output's storage takes the smallest free block
that holds it (or a new one), and only then are the blocks of storages read for the last time
released, so a kernel's output never shares memory with its inputs (kernel arguments are
`noalias`). Graph inputs and outputs get blocks of their own: inputs are written by `run` before
the first step, outputs are read after the last. This is TVM's graph memory planner in miniature.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .ir import Graph


@dataclass
class MemoryPlan:
    """`block_of[value]` → block index; `block_bytes[i]` the size of block i."""

    block_of: dict = field(default_factory=dict)
    block_bytes: list = field(default_factory=list)
    # value -> byte offset inside its block (a Concat's input placed in its output; 0 if absent)
    offset_of: dict = field(default_factory=dict)
    # bytes the values would take with one buffer each (what the plan saves is the difference)
    unshared_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(self.block_bytes)


def storage_roots(graph: Graph, steps) -> dict:
    """value → the value whose buffer it uses (itself, or the input of a chain of ALIAS nodes)."""
    from .ops import OPS, Kind
    root: dict = {}
    for n in graph.nodes:
        if OPS[n.op_type].kind == Kind.ALIAS and graph.values[n.inputs[0]].const is None:
            src = n.inputs[0]
            root[n.outputs[0]] = root.get(src, src)
    return root


def plan_memory(graph: Graph, steps, placements: dict | None = None) -> MemoryPlan:
    """Plan the buffers of `steps` ((output value, [value read])), run in order. `placements`
    ({value: (value holding it, byte offset)}, concat_in_place) put values inside others'
    storage: such a storage is live from the first step that writes any value in it to the last
    that reads or writes one."""
    roots = storage_roots(graph, steps)
    placements = placements or {}

    def locate(v) -> tuple:
        r, offset = roots.get(v, v), 0
        while r in placements:
            holder, at = placements[r]
            r, offset = roots.get(holder, holder), offset + at
        return r, offset

    def root(v):
        return locate(v)[0]

    last_use: dict = {}
    for i, (out, reads) in enumerate(steps):
        for r in [*reads, out]:
            last_use[root(r)] = i
    pinned = {root(v) for v in graph.outputs} | {root(v) for v in graph.inputs}
    plan = MemoryPlan()
    free: list = []   # block indices
    for v in graph.inputs:
        plan.block_of[v] = _new_block(plan, graph.values[v].nbytes)
        plan.unshared_bytes += graph.values[v].nbytes
    for i, (out, reads) in enumerate(steps):
        plan.unshared_bytes += graph.values[out].nbytes
        r = root(out)
        if r not in plan.block_of:   # else a value placed in a storage an earlier step started
            need = graph.values[r].nbytes
            plan.block_of[r] = _new_block(plan, need) if r in pinned else _reuse_block(plan, free, need)
        for s in {root(x) for x in [*reads, out]}:
            if last_use.get(s) == i and s not in pinned and s in plan.block_of:
                free.append(plan.block_of[s])
    for v in {*roots, *placements, *(out for out, _ in steps)}:
        r, offset = locate(v)
        if r in plan.block_of:
            plan.block_of[v] = plan.block_of[r]
            if offset:
                plan.offset_of[v] = offset
    return plan


def _reuse_block(plan: MemoryPlan, free: list, need: int) -> int:
    """The smallest free block that holds `need` bytes, else the largest grown to it, else a new one."""
    fits = [b for b in free if plan.block_bytes[b] >= need]
    if fits:
        b = min(fits, key=lambda b: plan.block_bytes[b])
    elif free:   # grow the largest free block rather than add one
        b = max(free, key=lambda b: plan.block_bytes[b])
        plan.block_bytes[b] = need
    else:
        return _new_block(plan, need)
    free.remove(b)
    return b


def _new_block(plan: MemoryPlan, nbytes: int) -> int:
    plan.block_bytes.append(nbytes)
    return len(plan.block_bytes) - 1


__all__ = ["MemoryPlan", "plan_memory", "storage_roots"]
