"""Applying a sketch with its params: the schedule built primitive by primitive (recorded as the
candidate's trace), each stage by its rule (rules/), and replaying a trace on a workload.
"""

from __future__ import annotations

import math

from compiler.ops.schedule_conv import panel_merge, schedule_block_copy, schedule_weight_panels
from compiler.schedule import Schedule, Stage, create_schedule

from ...candidate import Candidate
from ..base import SpaceError, register_space_kind, replay_trace
from .generate import Sketch
from .sampling import outer_order

MAX_UNROLLED_BODY = 128   # statements of an unrolled micro-kernel step


class SketchApplier:
    """Builds the schedule of a sketch with given params, primitive by primitive (recorded)."""

    def __init__(self, space, sketch: Sketch, params: dict, opdef):   # space: the SketchSpace
        self.space, self.sk, self.params = space, sketch, params
        self.opdef = opdef
        self.s = create_schedule(opdef.output)
        self.orig = list(self.s.stages)
        if len(self.orig) != space.dag.n or [st.name for st in self.orig] != space.dag.names:
            raise SpaceError("the definition's stages differ from the space's")
        self.lanes = {i: space.lanes(i) for i in range(space.dag.n)}
        self.inlined_into_copy: set = set()   # producers that block_input copied through

    def p(self, i) -> dict:
        return self.params.get(self.space.dag.names[i], {})

    def run(self) -> Schedule:
        rules = self.sk.rules
        for i, rule in rules.items():
            if rule.applied_first:
                rule.apply(self, i)
        for i in reversed(range(len(self.orig))):
            if not rules[i].applied_first:
                rules[i].apply(self, i)
        return self.s

    # -- helpers
    @staticmethod
    def split_levels(st, ax, factors) -> list:
        loops, cur = [], ax
        for d in range(len(factors)):
            outer, cur = st.split(cur, factor=math.prod(factors[d:]))
            loops.append(outer)
        loops.append(cur)
        return loops

    @staticmethod
    def parallel_prefix(st, loops, k):
        k = min(int(k), len(loops))
        if k <= 0:
            return None
        loop = loops[0] if k == 1 else st.fuse(*loops[:k])
        st.parallel(loop)
        return loop

    def micro_kernel(self, i, st, spatial_inner, red_inner, p):
        """Vectorize the innermost spatial loop; unroll the other inner loops (innermost
        first) while the unrolled body stays small; auto_unroll."""
        vec = spatial_inner[-1]
        body = 1
        if vec.extent > 1:
            st.vectorize(vec)
            body = -(-vec.extent // self.lanes[i])
        if p.get("unroll_inner"):
            order = st.leaf_iter_vars
            cands = sorted([a for a in spatial_inner[:-1] + red_inner if a.extent > 1],
                           key=lambda a: -order.index(a))
            for a in cands:
                if body * a.extent <= MAX_UNROLLED_BODY:
                    st.unroll(a)
                    body *= a.extent
        if p.get("auto_unroll"):
            st.auto_unroll(int(p["auto_unroll"]))

    def tile_of(self, i, key, n):
        t = self.p(i)["tile"][key]
        if not isinstance(t, list) or len(t) != n or not all(isinstance(f, int) and f > 0 for f in t):
            raise SpaceError(f"tile {key} of {self.space.dag.names[i]} must be {n} positive integers, got {t!r}")
        return t

    def pack(self, i, reader):
        p = self.p(i)
        if not p.get("pack") or i not in self.sk.pack:
            return
        inp, axis = self.sk.pack[i]
        vec = self.sk.vec.get(i, len(self.space.dag.op(i).axis) - 1)
        width = self.tile_of(i, f"s{vec}", 3)[-1]
        if width <= 1:
            return
        tensor = self.s.placeholders[inp]
        rows_of_weights = axis == 0 and tensor.ndim > 2   # blocks of rows (a conv's OIHW weights)
        merge = panel_merge(tensor, width, self.lanes[i]) if rows_of_weights else None
        packed_tensor = self.s.cache_read(tensor, "global", [reader], block={axis: width}, merge=merge)
        packed = self.s[packed_tensor]
        if rows_of_weights:   # see schedule_weight_panels
            schedule_weight_panels(self.s, packed_tensor, self.lanes[i], lambda work: bool(p.get("parallel")))
            return
        rows = packed.op.axis[:-1]
        if p.get("parallel") and rows and rows[0].extent > 1:
            packed.parallel(rows[0])
        packed.vectorize(packed.op.axis[-1])

    def block_input(self, i, reader):
        """`block_input`: what the tile reads along its first reduction axis (a conv's padded
        input) copied in blocks of that axis's inner tile (r0), a producer inlined into the copy."""
        p = self.p(i)
        if not p.get("block_input") or i not in self.sk.block_in:
            return
        kind, j, axis = self.sk.block_in[i]
        width = self.tile_of(i, "r0", 1)[0]
        if width <= 1:
            return
        src = self.orig[j] if kind == "stage" else None
        tensor = src.tensor if src is not None else self.s.placeholders[j]
        copy_stage = self.s[self.s.cache_read(tensor, "global", [reader], block={axis: width})]
        if src is not None and not src.is_inline:
            src.compute_inline()
            self.inlined_into_copy.add(j)
        schedule_block_copy(copy_stage, lambda work: bool(p.get("parallel")))

    # -- what the rules share
    def outer_first(self, i, sp: list, p: dict) -> list:
        """The spatial axes' split loops in the order of the outer (S0, S1) levels: the last axis
        first when `last_outer` (a matmul's column panels outermost, so a packed B panel stays in
        cache while every row tile uses it: the GEMM default's order), the vector axis last when
        `vec_last` (a convolution's spatial tiles outside its channel blocks, so the smaller
        weights stay in cache), else as defined."""
        vec = self.sk.vec.get(i) if p.get("vec_last") else None
        return outer_order(sp, bool(p.get("last_outer")), vec)

    def red_order(self, p: dict, rd: list) -> list:
        """The reduction loops (per axis: [outer, inner]) in the tile's `red_perm` order (both
        levels): e.g. a convolution's channel loop innermost, the taps outside it."""
        perm = p.get("red_perm")
        if perm is None:
            return rd
        if sorted(perm) != list(range(len(rd))):
            raise SpaceError(f"red_perm {perm!r} is not a permutation of the {len(rd)} reduction axes")
        return [rd[k] for k in perm]

    @staticmethod
    def unroll_store(out: Stage, loops: list):
        """Unroll the store of a tile cached across another vector axis (its rows, innermost
        first, while the copy stays under MAX_UNROLLED_BODY statements): every accumulator is
        then read at a constant offset, so LLVM keeps the whole tile in registers. Left rolled,
        the tile lives on the stack and each FMA loads and stores its accumulator (a 16-channel
        x 4 x 7 conv tile ran at a third of the default schedule's speed)."""
        body = 1
        for loop in reversed(loops):
            if loop.extent > 1 and body * loop.extent <= MAX_UNROLLED_BODY:
                out.unroll(loop)
                body *= loop.extent

def replay_checked(opdef, cand: Candidate):
    """`instantiate` for traces: the recorded steps replayed on `opdef`, after checking that the
    trace was recorded on this workload (when it says which)."""
    payload = cand.payload if isinstance(cand.payload, dict) else {}
    key = payload.get("workload_key")
    if key is not None:
        mine = opdef.workload_key()
        if key != mine:
            raise SpaceError(f"trace does not apply to this workload: it was recorded on workload {key}, "
                             f"this is {getattr(opdef, 'name', '?')} with key {mine}")
    if not isinstance(payload.get("steps"), list):
        raise SpaceError("trace candidate has no 'steps' list")
    return replay_trace(opdef, cand)


register_space_kind("trace", lambda opdef, cand, target: replay_checked(opdef, cand))


__all__ = ["SketchApplier", "replay_checked", "MAX_UNROLLED_BODY"]
