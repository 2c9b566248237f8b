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


def plan_memory(graph: Graph, steps) -> MemoryPlan:
    """Plan the buffers of `steps` ((output value, [value read])), run in order."""
    roots = storage_roots(graph, steps)

    def root(v):
        return roots.get(v, v)

    last_use: dict = {}
    for i, (_, reads) in enumerate(steps):
        for r in reads:
            last_use[root(r)] = i
    pinned = {root(v) for v in graph.outputs} | {root(v) for v in graph.inputs}
    plan = MemoryPlan()
    free: list = []   # block indices
    for v in graph.inputs:
        plan.block_of[v] = _new_block(plan, graph.values[v].nbytes)
        plan.unshared_bytes += graph.values[v].nbytes
    for i, (out, reads) in enumerate(steps):
        need = graph.values[out].nbytes
        plan.unshared_bytes += need
        r = root(out)
        if r != out:   # cannot happen for a kernel's output; kept for clarity
            plan.block_of[out] = plan.block_of[r]
            continue
        if r in pinned:
            plan.block_of[out] = _new_block(plan, need)
        else:
            fits = [b for b in free if plan.block_bytes[b] >= need]
            if fits:
                b = min(fits, key=lambda b: plan.block_bytes[b])
            elif free:   # grow the largest free block rather than add one
                b = max(free, key=lambda b: plan.block_bytes[b])
                plan.block_bytes[b] = need
            else:
                b = None
            if b is None:
                b = _new_block(plan, need)
            else:
                free.remove(b)
            plan.block_of[out] = b
        for s in {root(x) for x in reads}:
            if last_use.get(s) == i and s not in pinned and s in plan.block_of:
                free.append(plan.block_of[s])
    for v, r in roots.items():
        if r in plan.block_of:
            plan.block_of[v] = plan.block_of[r]
    return plan


def _new_block(plan: MemoryPlan, nbytes: int) -> int:
    plan.block_bytes.append(nbytes)
    return len(plan.block_bytes) - 1


__all__ = ["MemoryPlan", "plan_memory", "storage_roots"]
