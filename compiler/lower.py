"""Lowering: a schedule becomes a LoweredFunc of loop IR.

Passes, in order:
1. `_expand_inline`: substitute inlined stages into their readers.
2. `_infer_bounds`: consumers first, the region of every stage that its attach point needs
   (stages computed at the root get their whole domain).
3. `_StageLoops`: per stage, the extent of every leaf loop and each root axis as an expression of
   the leaf loop variables (undoing split and fuse), plus guards for splits that do not divide.
4. `_build_stage`: the loop nest, the reduction's init nest, attached producers and their local
   buffers; every index is simplified with the loop ranges as it is created.
5. `_auto_unroll`: mark small inner nests unrolled where a stage asked for it.
6. `_peel_vector_tails`: a serial loop around a vector loop whose lanes a split's guard switches
   off only in its last iteration runs its other iterations without the guard (no masks, no
   masked loads or stores) and the last one after it.
"""

from __future__ import annotations

import re

from . import arith
from .bounds import checked_body
from .dtypes import nbytes
from .errors import LoweringError, ScheduleError
from .expr import (
    INDEX_DTYPE,
    Binary,
    Call,
    CheckedIndex,
    Compare,
    Const,
    Expr,
    Select,
    Var,
    children,
    free_vars,
    substitute,
    transform,
    walk,
)
from .loop_ir import (
    Allocate,
    Buffer,
    For,
    IfThenElse,
    LetStmt,
    Load,
    LoweredFunc,
    Prefetch,
    Seq,
    Store,
    format_expr,
    seq,
    stmt_children,
    stmt_exprs,
    walk_stmts,
)
from .schedule import MAX_VECTOR_LANES, Schedule, Split, Stage
from .tensor import IterVar, PlaceholderOp, Reduce, Tensor, TensorRead, reduce_identity

_KIND = {"vectorize": "vectorized", "parallel": "parallel", "unroll": "unrolled"}
CACHE_LINE_BYTES = 64      # what one prefetch brings in (x86 and the Arm cores tunefarm targets)
MAX_PREFETCH_LINES = 16    # prefetches at the top of one iteration at most (Stage.prefetch)


def lower(schedule: Schedule, args, name: str = "main") -> LoweredFunc:
    """Lower `schedule` to a function whose arguments are the tensors `args`, in order."""
    return _Lowering(schedule, list(args), name).run()


def _ident(name: str) -> str:
    s = re.sub(r"\W", "_", name)
    return s if s and not s[0].isdigit() else f"t_{s}"


class _StageLoops:
    """Leaf loops of a stage for given root extents, and root axis values in leaf variables."""

    def __init__(self, stage: Stage, root_ext: dict):
        ext = dict(root_ext)
        for rel in stage.relations:
            if isinstance(rel, Split):
                pe = ext[rel.parent]
                if rel.factor is not None:
                    inner = min(rel.factor, pe)
                    outer = -(-pe // inner)
                else:
                    outer = min(rel.nparts, pe)
                    inner = -(-pe // outer)
                ext[rel.outer], ext[rel.inner] = outer, inner
            else:
                ext[rel.fused] = ext[rel.outer] * ext[rel.inner]
        self.ext = ext
        self.loop_var = {iv: Var(iv.name) for iv in stage.leaf_iter_vars}
        value: dict[IterVar, Expr] = {iv: v for iv, v in self.loop_var.items()}
        self.guards = []  # (expr, limit): expr < limit must hold
        for rel in reversed(stage.relations):
            if isinstance(rel, Split):
                v = value[rel.outer] * ext[rel.inner] + value[rel.inner]
                value[rel.parent] = v
                if ext[rel.outer] * ext[rel.inner] > ext[rel.parent]:
                    self.guards.append((v, ext[rel.parent]))
            else:
                f = value[rel.fused]
                value[rel.outer] = f // ext[rel.inner] if ext[rel.inner] > 1 else f
                value[rel.inner] = f % ext[rel.inner] if ext[rel.inner] > 1 else Const(0, INDEX_DTYPE)
        self.value = value
        self.leaves = list(stage.leaf_iter_vars)


class _Lowering:
    def __init__(self, schedule: Schedule, args: list, name: str):
        self.s = schedule
        self.args = args
        self.name = name
        self.stages = [st for st in schedule.stages if not st.is_inline]
        self.var_range: dict = {}
        self.root_min: dict = {}   # stage -> {root iv: Expr}
        self.loops: dict = {}      # stage -> _StageLoops
        self.buffer_of: dict = {}  # tensor -> Buffer
        self.body_of: dict = {}    # stage -> expanded body

    # ------------------------------------------------------------------ driver
    def run(self) -> LoweredFunc:
        self._check_args()
        for st in self.s.stages:
            for tensor, iv, _ in st.prefetches:
                if st.is_inline or iv not in st.leaf_iter_vars:
                    raise ScheduleError(f"prefetch of {tensor.name} at {iv.name} of {st.name}: the stage was inlined or "
                                        f"the loop split or fused after the prefetch")
        for st in self.stages:
            ranges = {ax.var: (0, ax.extent - 1) for ax in st.root_iter_vars}
            self.body_of[st] = checked_body(st.name, self._expand_inline(st.op.body), ranges)
        self._infer_bounds()
        self._make_buffers()
        attached: dict = {}
        for st in self.stages:
            if st.attach[0] == "at":
                attached.setdefault((id(st.attach[1]), id(st.attach[2])), []).append(st)
        self.attached = attached
        roots = [self._build_stage(st) for st in self.stages if st.attach[0] == "root"]
        body = seq(roots)
        _check_unrolled_size(body)
        body = _peel_vector_tails(body, {})
        for st in reversed(self.stages):
            if st.attach[0] == "root" and not st.is_output:
                body = Allocate(self.buffer_of[st.tensor], body)
        arg_buffers = [self.buffer_of[t] for t in self.args]
        return LoweredFunc(self.name, arg_buffers, body)

    def _check_args(self):
        if not all(isinstance(t, Tensor) for t in self.args):
            raise LoweringError("build/lower args must be the tensors of the kernel's signature")
        ids = [id(t) for t in self.args]
        if len(set(ids)) != len(ids):
            raise LoweringError("a tensor is listed twice in the kernel arguments")
        for t in self.s.placeholders:
            if t not in self.args:
                raise LoweringError(f"input {t.name} is read by the computation but not in the argument list")
        for t in self.s.outputs:
            if t not in self.args:
                raise LoweringError(f"output {t.name} is not in the argument list")
        for t in self.args:
            if not isinstance(t.op, PlaceholderOp) and t not in self.s.outputs:
                raise LoweringError(f"argument {t.name} is neither an input nor an output of the schedule")
        names = set()
        for t in self.args:
            n = _ident(t.name)
            while n in names:
                n += "_"
            names.add(n)
            self.buffer_of[t] = Buffer(n, t.shape, t.dtype, "arg")

    def _expand_inline(self, body):
        def fn(n):
            if isinstance(n, TensorRead):
                st = self.s.stage_of(n.tensor)
                if st is not None and st.is_inline:
                    mapping = {ax.var: i for ax, i in zip(st.op.axis, n.indices)}
                    return self._expand_inline(substitute(st.op.body, mapping))
            return None
        if isinstance(body, Reduce):
            where = transform(body.where, fn) if body.where is not None else None
            return Reduce(body.combiner, transform(body.source, fn), body.axes, where)
        return transform(body, fn)

    # ------------------------------------------------------------------ bounds
    def _infer_bounds(self):
        for st in reversed(self.stages):
            op = st.op
            root_ext = {ax: ax.extent for ax in op.reduce_axis}
            mins: dict[IterVar, Expr] = {ax: Const(0, INDEX_DTYPE) for ax in st.root_iter_vars}
            if st.attach[0] == "at":
                _, at_stage, at_iv = st.attach
                region = self._region(st, at_stage, at_iv)
                for ax, (lo, ext) in zip(op.axis, region):
                    mins[ax], root_ext[ax] = lo, ext
            else:
                root_ext.update({ax: ax.extent for ax in op.axis})
            self.root_min[st] = mins
            loops = _StageLoops(st, root_ext)
            self.loops[st] = loops
            for iv, v in loops.loop_var.items():
                self.var_range[v] = (0, loops.ext[iv] - 1)

    def _attach_path(self, st: Stage):
        path, cur = [], st
        while cur.attach[0] == "at":
            parent, iv = cur.attach[1], cur.attach[2]
            path.append((parent, iv))
            cur = parent
        return path

    def _enclosing_loops(self, st: Stage):
        """(stage, leaf iv) of every loop around the statement of `st`, its own included."""
        out = [(st, iv) for iv in st.leaf_iter_vars]
        for parent, iv in self._attach_path(st):
            pos = parent.leaf_iter_vars.index(iv)
            out.extend((parent, x) for x in parent.leaf_iter_vars[:pos + 1])
        return out

    def _inside(self, loop_stage: Stage, loop_iv, at_stage: Stage, at_iv) -> bool:
        """Is loop (loop_stage, loop_iv) nested inside loop (at_stage, at_iv)?"""
        at_pos = at_stage.leaf_iter_vars.index(at_iv)
        if loop_stage is at_stage:
            return loop_stage.leaf_iter_vars.index(loop_iv) > at_pos
        for parent, iv in self._attach_path(loop_stage):
            if parent is at_stage:
                return parent.leaf_iter_vars.index(iv) >= at_pos
        return False

    def _root_values(self, st: Stage) -> dict:
        loops = self.loops[st]
        return {ax.var: self.root_min[st][ax] + loops.value[ax] for ax in st.root_iter_vars}

    def _region(self, st: Stage, at_stage: Stage, at_iv: IterVar) -> list[tuple[Expr, int]]:
        """[(min expr, extent)] per axis of `st` that the loop it is attached at (loop `at_iv` of
        `at_stage`) needs."""
        if at_iv not in at_stage.leaf_iter_vars:
            raise ScheduleError(f"compute_at: {st.name} is attached at {at_iv.name}, which is no longer "
                                f"a loop of {at_stage.name}")
        consumers = [q for q in self.stages if any(
            isinstance(n, TensorRead) and n.tensor is st.tensor for n in _body_nodes(self.body_of[q]))]
        lows: list[arith.Lin | None] = [None] * len(st.op.axis)
        highs: list[arith.Lin | None] = [None] * len(st.op.axis)
        full: set[int] = set()  # dimensions some read cannot bound: they get the whole extent
        for q in consumers:
            if q is not at_stage and not any(p is at_stage and at_stage.leaf_iter_vars.index(iv) >=
                                             at_stage.leaf_iter_vars.index(at_iv)
                                             for p, iv in self._attach_path(q)):
                raise LoweringError(f"compute_at: {st.name} is read by {q.name}, which is not inside "
                                    f"loop {at_iv.name} of {at_stage.name}")
            relax = {}
            for ls, liv in self._enclosing_loops(q):
                if self._inside(ls, liv, at_stage, at_iv):
                    relax[self.loops[ls].loop_var[liv]] = (0, self.loops[ls].ext[liv] - 1)
            subst = self._root_values(q)
            for n in _body_nodes(self.body_of[q]):
                if not (isinstance(n, TensorRead) and n.tensor is st.tensor):
                    continue
                for d, idx in enumerate(n.indices):
                    b = arith.bound(substitute(idx, subst), relax, self.var_range)
                    if b is None:
                        full.add(d)
                        continue
                    if d in full:
                        continue
                    lo, hi = lows[d], highs[d]
                    lows[d] = b[0] if lo is None else arith.lin_min(lo, b[0], self.var_range)
                    highs[d] = b[1] if hi is None else arith.lin_max(hi, b[1], self.var_range)
        region: list[tuple[Expr, int]] = []
        for d, dim in enumerate(st.op.shape):
            lo, hi = lows[d], highs[d]
            if lo is None or hi is None or d in full:  # (lo and hi are set together)
                region.append((Const(0, INDEX_DTYPE), dim))
                continue
            ext = hi.add(lo, -1)
            if not ext.is_const():
                region.append((Const(0, INDEX_DTYPE), dim))
                continue
            extent = ext.const + 1
            if lo.is_const():
                # the overhang of a consumer's split kept, as it is for a region that moves
                # (computed with clamped reads, or guarded): a row of whole register tiles
                a, b = max(lo.const, 0), lo.const + extent
                region.append((Const(a, INDEX_DTYPE), max(b - a, 1)))
            else:
                region.append((arith.from_lin(lo), min(extent, dim)))
        return region

    # ------------------------------------------------------------------ buffers
    def _make_buffers(self):
        taken = {b.name for b in self.buffer_of.values()}
        for st in self.stages:
            if st.tensor in self.buffer_of:
                continue
            loops = self.loops[st]
            shape = tuple(loops.ext[ax] for ax in st.op.axis)
            n = _ident(st.name)
            while n in taken:
                n += "_"
            taken.add(n)
            scope = "global" if st.attach[0] == "root" else "local"
            self.buffer_of[st.tensor] = Buffer(n, shape, st.op.dtype, scope)

    def _flat_index(self, buf: Buffer, indices) -> Expr:
        idx = None
        for i, stride in zip(indices, buf.strides()):
            term = i * stride if stride != 1 else i
            idx = term if idx is None else idx + term
        return arith.simplify(idx if idx is not None else Const(0, INDEX_DTYPE), self.var_range)

    def _reads_only_global(self, st: Stage) -> bool:
        for n in _body_nodes(self.body_of[st]):
            if isinstance(n, TensorRead):
                src = self.s.stage_of(n.tensor)
                if src is not None and src.attach[0] == "at":
                    return False
        return True

    def _to_loads(self, e, clamp: bool = False):
        """TensorReads → flat Loads; with `clamp`, every index is clamped into its tensor."""
        def fn(n):
            if isinstance(n, TensorRead):
                st = self.s.stage_of(n.tensor)
                idx = list(n.indices)
                if clamp:
                    idx = [arith.simplify(Binary("min", Binary("max", i, Const(0, INDEX_DTYPE), INDEX_DTYPE),
                                                 Const(d - 1, INDEX_DTYPE), INDEX_DTYPE), self.var_range)
                           for i, d in zip(idx, n.tensor.shape)]
                if st is not None and st.attach[0] == "at":
                    mins = self.root_min[st]
                    idx = [i - mins[ax] for i, ax in zip(idx, st.op.axis)]
                return Load(self.buffer_of[n.tensor], self._flat_index(self.buffer_of[n.tensor], idx))
            return None
        return arith.simplify(transform(e, fn), self.var_range)

    # ------------------------------------------------------------------ nests
    def _build_stage(self, st: Stage):
        loops = self.loops[st]
        op = st.op
        buf = self.buffer_of[st.tensor]
        subst = self._root_values(st)
        store_idx = self._flat_index(buf, [loops.value[ax] for ax in op.axis])
        body = self.body_of[st]
        conds = [arith.simplify(v < lim, self.var_range) for v, lim in loops.guards]
        clamp = False
        if st.attach[0] == "at":
            # A region sticks out of the domain where the consumer's splits overhang. Computing
            # those extra points into the local buffer is harmless (nobody reads them) as long as
            # every read stays in bounds: clamp the reads instead of guarding the innermost loops,
            # which would put a branch into the micro-kernel. Reads of other local buffers cannot
            # be clamped that way, so those stages keep the guard.
            domain = [arith.simplify((subst[ax.var] >= 0) & (subst[ax.var] < dim), self.var_range)
                      for ax, dim in zip(op.axis, op.shape)]
            domain = [c for c in domain if not (isinstance(c, Const) and c.value)]
            if domain and self._reads_only_global(st):
                clamp = True
            else:
                conds.extend(domain)
        conds = [c for c in conds if not (isinstance(c, Const) and c.value)]
        leaves = loops.leaves
        for iv in leaves:
            if loops.ext[iv] > MAX_VECTOR_LANES and st.annotations.get(iv) == "vectorize":
                raise ScheduleError(f"vectorize: {iv.name} of {st.name} has {loops.ext[iv]} iterations, "
                                    f"more than {MAX_VECTOR_LANES} lanes; split it first")
        kinds = [_KIND.get(st.annotations.get(iv, ""), "serial") for iv in leaves]  # not annotated: serial
        self._check_vector_placement(st, kinds)
        lvars = [loops.loop_var[iv] for iv in leaves]
        if isinstance(body, Reduce):
            acc = Load(buf, store_idx)
            src = self._to_loads(substitute(body.source, subst), clamp)
            combined = arith.simplify(_combine(body.combiner, acc, src), self.var_range)
            where_guard = None
            if body.where is not None:
                where = self._to_loads(substitute(body.where, subst), clamp)
                if self._guardable_where(where, lvars, kinds):
                    where_guard = where
                else:
                    combined = Select(where, combined, acc)
            init = Store(buf, store_idx, Const(reduce_identity(body.combiner, op.dtype), op.dtype))
            update = Store(buf, store_idx, combined)
            first_red = next(i for i, iv in enumerate(leaves) if iv.kind == "reduce")
            spatial_inner = [i for i in range(first_red, len(leaves)) if leaves[i].kind != "reduce"]
            red_vars = {lvars[i] for i in range(len(leaves)) if leaves[i].kind == "reduce"}
            outer_conds, init_conds, upd_conds = [], [], []
            for c in conds:
                depth = self._depth(c, lvars)
                if depth < first_red:
                    outer_conds.append(c)
                else:
                    upd_conds.append(c)
                    if not (arith_vars(c) & red_vars):
                        init_conds.append(c)
            if where_guard is not None:
                upd_conds.append(where_guard)
            init_nest = self._nest(st, [(lvars[i], loops.ext[leaves[i]], kinds[i], leaves[i]) for i in spatial_inner],
                                   init, init_conds, attach=False, prefetch=False)
            upd_nest = self._nest(st, [(lvars[i], loops.ext[leaves[i]], kinds[i], leaves[i])
                                       for i in range(first_red, len(leaves))], update, upd_conds)
            inner = seq([init_nest, upd_nest])
            nest = self._nest(st, [(lvars[i], loops.ext[leaves[i]], kinds[i], leaves[i]) for i in range(first_red)],
                              inner, outer_conds)
        else:
            value = self._to_loads(substitute(body, subst), clamp)
            nest = self._nest(st, [(lvars[i], loops.ext[leaves[i]], kinds[i], leaves[i]) for i in range(len(leaves))],
                              Store(buf, store_idx, value), conds)
        if st.auto_unroll_max_step:
            nest = _auto_unroll(nest, st.auto_unroll_max_step)
        return nest

    def _guardable_where(self, where, lvars, kinds) -> bool:
        """A reduction's condition that reads no tensor and no vectorized loop variable skips the
        update as a guard at the loop of the innermost variable it reads (a group window's steps
        past the block's groups: the whole step skipped), instead of a Select that computes every
        term and blends it into the accumulator."""
        if any(isinstance(n, Load) for n in walk(where)):
            return False
        used = arith_vars(where)
        return not any(k == "vectorized" and v in used for v, k in zip(lvars, kinds))

    def _check_vector_placement(self, st: Stage, kinds):
        if "vectorized" not in kinds:
            return
        vpos = kinds.index("vectorized")
        if kinds.count("vectorized") > 1:
            raise ScheduleError(f"vectorize: stage {st.name} has more than one vectorized loop")
        for other in self.stages:
            if other.attach[0] == "at" and other.attach[1] is st and \
                    st.leaf_iter_vars.index(other.attach[2]) >= vpos:
                raise ScheduleError(f"vectorize: {other.name} is computed inside the vectorized loop "
                                    f"{st.leaf_iter_vars[vpos].name} of {st.name}")
        for k in kinds[vpos + 1:]:
            if k == "parallel":
                raise ScheduleError(f"parallel loop inside the vectorized loop of {st.name}")

    def _depth(self, cond, lvars) -> int:
        used = arith_vars(cond)
        d = -1
        for i, v in enumerate(lvars):
            if v in used:
                d = i
        return d

    def _nest(self, st, loops, body, conds, attach=True, prefetch=True):
        """Wrap `body` in `loops` (outermost first), placing each guard as high as it can go;
        with the stages computed at them (`attach`) and the prefetches at them (`prefetch`: not
        in a reduction's initialization, which reads nothing)."""
        lvars = [l[0] for l in loops]
        by_depth: dict = {}
        for c in conds:
            by_depth.setdefault(self._depth(c, lvars), []).append(c)
        for d in range(len(loops) - 1, -1, -1):
            var, ext, kind, iv = loops[d]
            body = _guard(by_depth.get(d), body)
            if attach:
                for child in reversed(self.attached.get((id(st), id(iv)), [])):
                    body = Allocate(self.buffer_of[child.tensor], seq([self._build_stage(child), body]))
            prefetches = [(tensor, offset) for tensor, at, offset in st.prefetches if at is iv]
            if prefetches and prefetch:
                if any(k == "vectorized" for _, _, k, _ in loops[:d + 1]):
                    raise ScheduleError(f"prefetch: {iv.name} of {st.name} is vectorized or inside the vectorized "
                                        f"loop; prefetch at a loop outside it")
                body = seq([*(s for tensor, offset in prefetches
                              for s in self._prefetch(st, iv, var, body, tensor, offset)), body])
            body = For(var, ext, kind, body)
        return _guard(by_depth.get(-1), body)

    def _at_loop_starts(self, lin) -> int | None:
        """The value of `lin` with every loop variable at 0, None unless that is a constant."""
        value = arith.simplify(substitute(arith.from_lin(lin), {v: Const(0, INDEX_DTYPE) for v in self.var_range}),
                               self.var_range)
        return value.value if isinstance(value, Const) else None

    def _prefetch(self, st: Stage, iv, var: Var, body, tensor, offset: int) -> list:
        """Prefetch statements for the top of loop `var`'s body: one per cache line that the
        body's reads of `tensor` touch in iteration var + offset (their index bounded over the
        loops inside the body; the lines counted from the lowest index of the current one)."""
        buf = self.buffer_of.get(tensor)
        inner = {f.var: (0, f.extent - 1) for f in walk_stmts(body) if isinstance(f, For)}
        indices = {}
        for s in walk_stmts(body):
            for e in stmt_exprs(s):
                for n in walk(e):
                    if isinstance(n, Load) and n.buffer is buf:
                        indices[format_expr(n.index)] = n.index
        if buf is None or buf.scope == "local" or not indices:
            raise ScheduleError(f"prefetch: loop {iv.name} of {st.name} reads nothing of {tensor.name} in memory")
        if any(isinstance(n, CheckedIndex) for e in indices.values() for n in walk(e)):
            raise ScheduleError(f"prefetch: {st.name} reads {tensor.name} at data-dependent indices; "
                                f"a prefetch of a later iteration would check indices not yet read")
        bounds = [arith.bound(index, inner, self.var_range) for index in indices.values()]
        spans = [span for span in bounds if span is not None]
        if len(spans) < len(bounds):
            raise ScheduleError(f"prefetch: the reads of {tensor.name} in one iteration of {iv.name} of {st.name} "
                                f"cannot be bounded")
        base = spans[0][0]
        # each read's region from the first one's lowest index, as in the first iteration of
        # every loop outside (where a split's overhanging tail clamps an index, the region of its
        # last iteration is narrower)
        ends = [self._at_loop_starts(end.add(base, -1)) for span in spans for end in span]
        known = [end for end in ends if end is not None]
        if len(known) < len(ends):
            raise ScheduleError(f"prefetch: the reads of {tensor.name} in one iteration of {iv.name} of {st.name} "
                                f"are not one region at a fixed distance from each other")
        low, high = min(known), max(known)
        line = max(1, CACHE_LINE_BYTES // nbytes(buf.dtype))
        lines = (high - low) // line + 1
        if lines > MAX_PREFETCH_LINES:
            raise ScheduleError(f"prefetch: one iteration of {iv.name} of {st.name} reads {lines} cache lines of "
                                f"{tensor.name}, more than {MAX_PREFETCH_LINES}; prefetch at an inner loop")
        ahead = arith.substitute_var(arith.from_lin(base), var, var + offset, self.var_range)
        return [Prefetch(buf, arith.simplify(ahead + (low + i * line), self.var_range)) for i in range(lines)]


def _body_nodes(body):
    """Every expression node of a stage body, the reduction's condition included."""
    if isinstance(body, Reduce):
        yield from walk(body.source)
        if body.where is not None:
            yield from walk(body.where)
    else:
        yield from walk(body)


def arith_vars(e) -> set:
    return {n for n in walk(e) if isinstance(n, Var)}


def _guard(conds, body):
    if not conds:
        return body
    cond = conds[0]
    for c in conds[1:]:
        cond = cond & c
    return IfThenElse(cond, body)


def _combine(combiner, acc, src):
    if combiner == "sum":
        return Binary("add", acc, src, acc.dtype)
    return Binary(combiner, acc, src, acc.dtype)


# Code an unrolled loop nest may emit, in weighted expression nodes: LLVM's build time grows
# faster than linearly with the size of one straight-line block (about 2 s at this limit, 17 s
# for 20 000 unrolled copies of a one-line body); a float32 exp/tanh/sigmoid/erf expands to a
# polynomial of about 24 instructions.
MAX_UNROLLED_NODES = 16384
_CALL_WEIGHT = {"exp": 24, "tanh": 24, "sigmoid": 24, "erf": 24}


def _check_unrolled_size(body):
    """ScheduleError when unrolled loops would copy their bodies into more code than
    MAX_UNROLLED_NODES (an unbounded unroll would take minutes to compile, or forever). Counts
    the code inside unrolled loops, each node times its copies."""
    total, loops = 0, []

    def visit(st, copies, unrolled):
        nonlocal total
        if isinstance(st, For) and st.kind == "unrolled":
            copies *= st.extent
            loops.append(st)
            unrolled = unrolled | {st.var}
        if copies > 1:   # code emitted once is not what this bounds (and counting it is most of the cost)
            for e in stmt_exprs(st):
                total += copies * _emitted_nodes(e, unrolled)
        for child in stmt_children(st):
            visit(child, copies, unrolled)

    visit(body, 1, frozenset())
    if total > MAX_UNROLLED_NODES:
        names = ", ".join(f"{x.var.name} ({x.extent})" for x in loops[:6])
        raise ScheduleError(f"unroll: the unrolled loops {names} would emit {total} expression nodes of "
                            f"straight-line code, more than the {MAX_UNROLLED_NODES} that compile in a "
                            "few seconds; unroll fewer or shorter loops (split a loop and unroll its "
                            "inner part)")


def _emitted_nodes(e, unrolled: frozenset) -> int:
    """Weighted nodes code generation emits for `e`: a Select whose condition only the unrolled
    loops' variables decide emits one branch per copy (codegen's static condition), so it counts
    its larger branch, not both."""
    if isinstance(e, Select) and free_vars(e.cond) <= unrolled:
        return 1 + _emitted_nodes(e.cond, unrolled) + max(_emitted_nodes(e.t, unrolled), _emitted_nodes(e.f, unrolled))
    own = _CALL_WEIGHT.get(e.func, 1) if isinstance(e, Call) else 1
    return own + sum(_emitted_nodes(c, unrolled) for c in children(e))


def _auto_unroll(stmt, max_step: int):
    """Mark serial loops unrolled, innermost first, while the unrolled size stays <= max_step."""
    def visit(s):
        if isinstance(s, For):
            body, size = visit(s.body)
            total = size * s.extent
            if s.kind == "serial" and total <= max_step:
                return For(s.var, s.extent, "unrolled", body), total
            return For(s.var, s.extent, s.kind, body), total
        if isinstance(s, Seq):
            parts = [visit(x) for x in s.stmts]
            return Seq([p[0] for p in parts]), sum(p[1] for p in parts)
        if isinstance(s, Allocate):
            body, size = visit(s.body)
            return Allocate(s.buffer, body), size
        if isinstance(s, IfThenElse):
            then, size = visit(s.then)
            return IfThenElse(s.cond, then, s.else_), size
        return s, 1
    return visit(stmt)[0]


# ----------------------------------------------------------------------------- vector tails

def _peel_vector_tails(st, ranges: dict):
    """Split off the last iteration of serial loops whose vector lanes only it guards.

    A row of 197 floats in vectors of 8 is `for o < 25: vectorized for i < 8: if (o*8 + i <
    197) ...`: every vector computed a lane mask, read through masked loads and blended its
    accumulators (a softmax row took 4x onnxruntime's time). Where the ranges prove a guard that
    reads a vector lane true for every iteration but the last, the loop runs those iterations
    with the guard folded away and the last one after it, guarded as before. Loops that hold
    scratch buffers or parallel loops, or whose unrolled code passes MAX_PEELED_NODES, are left
    as they are (the body is emitted twice)."""
    if isinstance(st, For):
        inner = {**ranges, st.var: (0, st.extent - 1)}
        m = _lane_tail(st, inner) if st.kind == "serial" and st.extent >= 2 else 0
        if m:
            head = _resimplify(st.body, {**ranges, st.var: (0, m - 1)})
            rest = st.extent - m
            if rest == 1:
                shift: Expr = Const(m, INDEX_DTYPE)
            else:
                shift = Binary("add", st.var, Const(m, INDEX_DTYPE), INDEX_DTYPE)
            tail = _map_exprs(st.body, lambda e: substitute(e, {st.var: shift}))
            if rest == 1:
                tail = _peel_vector_tails(_resimplify(tail, ranges), ranges)
            else:
                tail_ranges = {**ranges, st.var: (0, rest - 1)}
                tail = For(st.var, rest, "serial", _peel_vector_tails(_resimplify(tail, tail_ranges), tail_ranges))
            head_ranges = {**ranges, st.var: (0, m - 1)}
            return seq([For(st.var, m, "serial", _peel_vector_tails(head, head_ranges)), tail])
        return For(st.var, st.extent, st.kind, _peel_vector_tails(st.body, inner))
    if isinstance(st, Seq):
        return Seq([_peel_vector_tails(x, ranges) for x in st.stmts])
    if isinstance(st, Allocate):
        return Allocate(st.buffer, _peel_vector_tails(st.body, ranges))
    if isinstance(st, LetStmt):
        return LetStmt(st.var, st.value, _peel_vector_tails(st.body, ranges))
    if isinstance(st, IfThenElse):
        return IfThenElse(st.cond, _peel_vector_tails(st.then, ranges),
                          _peel_vector_tails(st.else_, ranges) if st.else_ is not None else None)
    return st


def _lane_tail(loop: For, ranges: dict) -> int:
    """m > 0 where `loop`'s body has a comparison reading both its variable and a vector lane
    that holds in its first m iterations (m < extent, the most such), and no scratch buffer or
    parallel loop; else 0."""
    lanes: set = set()
    conds: list = []
    if _unrolled_code(loop.body) > MAX_PEELED_NODES:
        return 0
    for s in walk_stmts(loop.body):
        if isinstance(s, Allocate) or (isinstance(s, For) and s.kind == "parallel"):
            return 0
        if isinstance(s, For):
            ranges = {**ranges, s.var: (0, s.extent - 1)}
            if s.kind == "vectorized":
                lanes.add(s.var)
        for e in stmt_exprs(s):
            conds.extend(n for n in walk(e) if isinstance(n, Compare))
    conds = [c for c in conds if loop.var in free_vars(c) and free_vars(c) & lanes]
    best = 0
    for c in conds:
        lo, hi = 1, loop.extent - 1   # the largest m in [lo, hi] whose iterations prove c
        if not arith.prove(c, {**ranges, loop.var: (0, 0)}):
            continue
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if arith.prove(c, {**ranges, loop.var: (0, mid - 1)}):
                lo = mid
            else:
                hi = mid - 1
        best = max(best, lo)
    return best


MAX_PEELED_NODES = 4096   # code a peeled body may emit (each unrolled copy counted): it is emitted twice


def _unrolled_code(st, copies: int = 1) -> int:
    if isinstance(st, For):
        return _unrolled_code(st.body, copies * (st.extent if st.kind == "unrolled" else 1))
    own = sum(copies * _emitted_nodes(e, frozenset()) for e in stmt_exprs(st))
    return own + sum(_unrolled_code(c, copies) for c in stmt_children(st))


def _map_exprs(st, fn):
    """`st` with `fn` applied to every expression it holds."""
    if isinstance(st, For):
        return For(st.var, st.extent, st.kind, _map_exprs(st.body, fn))
    if isinstance(st, Seq):
        return Seq([_map_exprs(x, fn) for x in st.stmts])
    if isinstance(st, Allocate):
        return Allocate(st.buffer, _map_exprs(st.body, fn))
    if isinstance(st, LetStmt):
        return LetStmt(st.var, fn(st.value), _map_exprs(st.body, fn))
    if isinstance(st, IfThenElse):
        return IfThenElse(fn(st.cond), _map_exprs(st.then, fn),
                          _map_exprs(st.else_, fn) if st.else_ is not None else None)
    if isinstance(st, Store):
        return Store(st.buffer, fn(st.index), fn(st.value))
    if isinstance(st, Prefetch):
        return Prefetch(st.buffer, fn(st.index))
    return st


def _resimplify(st, ranges: dict):
    """`st` with every expression simplified under the enclosing loops' ranges; guards the
    ranges settle folded away."""
    if isinstance(st, For):
        return For(st.var, st.extent, st.kind, _resimplify(st.body, {**ranges, st.var: (0, st.extent - 1)}))
    if isinstance(st, Seq):
        return seq([_resimplify(x, ranges) for x in st.stmts])
    if isinstance(st, Allocate):
        return Allocate(st.buffer, _resimplify(st.body, ranges))
    if isinstance(st, LetStmt):
        return LetStmt(st.var, arith.simplify(st.value, ranges), _resimplify(st.body, ranges))
    if isinstance(st, IfThenElse):
        cond = arith.simplify(st.cond, ranges)
        if isinstance(cond, Const):
            taken = st.then if cond.value else st.else_
            return _resimplify(taken, ranges) if taken is not None else Seq([])
        return IfThenElse(cond, _resimplify(st.then, ranges),
                          _resimplify(st.else_, ranges) if st.else_ is not None else None)
    if isinstance(st, Store):
        return Store(st.buffer, arith.simplify(st.index, ranges), arith.simplify(st.value, ranges))
    if isinstance(st, Prefetch):
        return Prefetch(st.buffer, arith.simplify(st.index, ranges))
    return st


__all__ = ["lower", "walk_stmts"]
