"""Schedules: how the loops of each stage are split, ordered, annotated and placed.

A schedule never changes the user's compute definition: cache_read/cache_write add stages and
give the affected stages new operations inside the schedule only, so one definition can be
scheduled many times (the tuner builds thousands of candidates from it).

Every primitive checks its arguments and raises ScheduleError before changing anything, and is
recorded as a step that refers to stages and axes by position (see schedule_steps.py), so a
schedule can be stored as JSON and replayed on a fresh, structurally equal definition.
"""

from __future__ import annotations

import math
from typing import Literal

from . import expr as E
from .arith import expr_range, to_lin
from .errors import ScheduleError
from .expr import Const, transform
from .rewrite import rewrite_function
from .tensor import (
    ComputeOp,
    IterVar,
    PlaceholderOp,
    Reduce,
    Tensor,
    TensorRead,
    compute,
    reduce_axis,
    reduce_identity,
    topo_order,
)

MAX_VECTOR_LANES = 64  # checked at lowering, once bound inference has fixed the extents
ANNOTATIONS = ("vectorize", "parallel", "unroll")
MAX_PREFETCH_OFFSET = 4096  # iterations a prefetch may run ahead


class Split:
    __slots__ = ("parent", "outer", "inner", "factor", "nparts")

    def __init__(self, parent, outer, inner, factor, nparts):
        self.parent, self.outer, self.inner, self.factor, self.nparts = parent, outer, inner, factor, nparts


class Fuse:
    __slots__ = ("outer", "inner", "fused")

    def __init__(self, outer, inner, fused):
        self.outer, self.inner, self.fused = outer, inner, fused


# Where a stage's loops are placed: at the top level, substituted into its readers, or inside a
# loop of another stage. The tag comes first so that `attach[0] == "at"` narrows the type.
Attach = tuple[Literal["root"]] | tuple[Literal["inline"]] | tuple[Literal["at"], "Stage", IterVar]


class Stage:
    """The loop nest that computes one tensor."""

    def __init__(self, schedule: "Schedule", tensor: Tensor, op: ComputeOp, scope: str = "global"):
        self.schedule = schedule
        self.tensor = tensor
        self.op = op
        self.name = op.name
        self.scope = scope
        self.root_iter_vars = list(op.axis) + list(op.reduce_axis)
        self.all_iter_vars = list(self.root_iter_vars)
        self.leaf_iter_vars = list(self.root_iter_vars)
        self.relations: list = []
        self.annotations: dict[IterVar, str] = {}  # leaf loop -> one of ANNOTATIONS
        self.attach: Attach = ("root",)
        self.auto_unroll_max_step = 0
        self.prefetches: list[tuple[Tensor, IterVar, int]] = []   # (tensor, loop, iterations ahead)

    def __repr__(self):
        return f"Stage({self.name})"

    @property
    def is_output(self) -> bool:
        return self.tensor in self.schedule.outputs

    @property
    def is_inline(self) -> bool:
        return self.attach[0] == "inline"

    # ------------------------------------------------------------------ helpers
    def _leaf(self, axis, what: str) -> IterVar:
        iv = self._resolve(axis, what)
        if iv not in self.leaf_iter_vars:
            raise ScheduleError(f"{what}: axis {iv.name!r} is not a loop of stage {self.name} any more "
                                f"(it was split or fused); current loops: {[v.name for v in self.leaf_iter_vars]}")
        return iv

    def _resolve(self, axis, what: str) -> IterVar:
        if isinstance(axis, str):
            for iv in self.all_iter_vars:
                if iv.name == axis:
                    return iv
            raise ScheduleError(f"{what}: stage {self.name} has no axis named {axis!r}")
        if not isinstance(axis, IterVar) or axis not in self.all_iter_vars:
            name = getattr(axis, "name", axis)
            raise ScheduleError(f"{what}: {name!r} is not an axis of stage {self.name}")
        return axis

    def _new_iv(self, name: str, extent: int, kind: str) -> IterVar:
        taken = {iv.name for iv in self.all_iter_vars}
        base, n = name, 1
        while name in taken:
            name = f"{base}{n}"
            n += 1
        iv = IterVar(name, extent, kind)
        self.all_iter_vars.append(iv)
        return iv

    def _index(self, iv: IterVar) -> int:
        return self.all_iter_vars.index(iv)

    def _record(self, op: str, **fields):
        self.schedule._record(op, stage=self.schedule.stages.index(self), **fields)

    def _check_not_inline(self, what):
        if self.is_inline:
            raise ScheduleError(f"{what}: stage {self.name} is inlined and has no loops")

    # ------------------------------------------------------------------ loop primitives
    def split(self, axis, factor=None, nparts=None):
        """Split a loop into (outer, inner) by the inner `factor` or the outer `nparts`."""
        self._check_not_inline("split")
        iv = self._leaf(axis, "split")
        if (factor is None) == (nparts is None):
            raise ScheduleError("split needs exactly one of factor= or nparts=")
        n = factor if factor is not None else nparts
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            raise ScheduleError(f"split of {iv.name}: factor/nparts must be a positive integer, got {n!r}")
        idx = self._index(iv)
        if factor is not None:
            inner_ext = min(factor, iv.extent)
            outer_ext = -(-iv.extent // inner_ext)
        else:
            outer_ext = min(nparts, iv.extent)
            inner_ext = -(-iv.extent // outer_ext)
        outer = self._new_iv(f"{iv.name}_o", outer_ext, iv.kind)
        inner = self._new_iv(f"{iv.name}_i", inner_ext, iv.kind)
        self.relations.append(Split(iv, outer, inner, factor, nparts))
        pos = self.leaf_iter_vars.index(iv)
        self.leaf_iter_vars[pos:pos + 1] = [outer, inner]
        self._record("split", axis=idx, factor=factor, nparts=nparts)
        return outer, inner

    def tile(self, x, y, x_factor, y_factor):
        """Split two loops and order them (xo, yo, xi, yi)."""
        self._check_not_inline("tile")
        if self._leaf(x, "tile") is self._leaf(y, "tile"):  # check everything before the first split
            raise ScheduleError("tile: x and y are the same axis")
        for f in (x_factor, y_factor):
            if not isinstance(f, int) or isinstance(f, bool) or f <= 0:
                raise ScheduleError(f"tile: factors must be positive integers, got {f!r}")
        xo, xi = self.split(x, factor=x_factor)
        yo, yi = self.split(y, factor=y_factor)
        self.reorder(xo, yo, xi, yi)
        return xo, yo, xi, yi

    def fuse(self, *axes):
        """Fuse consecutive loops into one (outermost first)."""
        self._check_not_inline("fuse")
        if len(axes) < 2:
            raise ScheduleError("fuse needs at least two axes")
        ivs = [self._leaf(a, "fuse") for a in axes]
        pos = [self.leaf_iter_vars.index(iv) for iv in ivs]
        if pos != list(range(pos[0], pos[0] + len(ivs))):
            raise ScheduleError(f"fuse: axes {[iv.name for iv in ivs]} are not consecutive loops, "
                                "outermost first; reorder them first")
        if len({iv.kind for iv in ivs}) != 1:
            raise ScheduleError("fuse: cannot fuse a reduction axis with a spatial axis")
        indices = [self._index(iv) for iv in ivs]
        fused = ivs[0]
        for nxt in ivs[1:]:
            new = self._new_iv(f"{fused.name}_{nxt.name}_f", fused.extent * nxt.extent, fused.kind)
            self.relations.append(Fuse(fused, nxt, new))
            fused = new
        self.leaf_iter_vars[pos[0]:pos[-1] + 1] = [fused]
        self._record("fuse", axes=indices)
        return fused

    def reorder(self, *axes):
        """Put the given loops in this order, in the positions they occupy together."""
        self._check_not_inline("reorder")
        ivs = [self._leaf(a, "reorder") for a in axes]
        if len(set(map(id, ivs))) != len(ivs):
            raise ScheduleError("reorder: an axis is listed twice")
        pos = sorted(self.leaf_iter_vars.index(iv) for iv in ivs)
        for p, iv in zip(pos, ivs):
            self.leaf_iter_vars[p] = iv
        self._record("reorder", axes=[self._index(iv) for iv in ivs])

    def _annotate(self, axis, kind):
        self._check_not_inline(kind)
        iv = self._leaf(axis, kind)
        if kind in ("vectorize", "parallel") and iv.kind == "reduce":
            raise ScheduleError(f"{kind}: {iv.name} is a reduction axis of {self.name}; "
                                f"{kind} a spatial axis (or rfactor the reduction first)")
        old = self.annotations.get(iv)
        if old is not None and old != kind:
            raise ScheduleError(f"{kind}: {iv.name} is already marked {old}")
        self.annotations[iv] = kind
        self._record(kind, axis=self._index(iv))

    def vectorize(self, axis):
        """Emit the (innermost) loop as vector instructions, one lane per iteration."""
        self._annotate(axis, "vectorize")

    def parallel(self, axis):
        """Run the iterations of the loop on the thread pool."""
        self._annotate(axis, "parallel")

    def unroll(self, axis):
        """Emit the loop body once per iteration."""
        self._annotate(axis, "unroll")

    def auto_unroll(self, max_step: int):
        """Unroll every inner loop nest whose unrolled size is at most `max_step` statements."""
        if not isinstance(max_step, int) or max_step < 0 or max_step > 4096:
            raise ScheduleError(f"auto_unroll: max_step must be an integer in [0, 4096], got {max_step!r}")
        self.auto_unroll_max_step = max_step
        self._record("auto_unroll", max_step=max_step)

    def prefetch(self, tensor: Tensor, axis, offset: int):
        """At the top of each iteration of loop `axis`, prefetch the cache lines of `tensor` that
        iteration axis + `offset` reads (TVM's prefetch). For a stream the hardware prefetchers
        do not run far enough ahead of: where each line feeds many FMAs (a product of a few rows
        over a large weight), the out-of-order window holds few of the stream's loads, and an
        8-row decode step read its weights at a third of the memory's bandwidth. One iteration's reads
        of `tensor` must be one region of at most MAX_PREFETCH_LINES lines (lowering checks)."""
        self._check_not_inline("prefetch")
        iv = self._leaf(axis, "prefetch")
        if not any(t is tensor for t in self.op.input_tensors()):
            raise ScheduleError(f"prefetch: stage {self.name} does not read {getattr(tensor, 'name', tensor)}")
        if not isinstance(offset, int) or isinstance(offset, bool) or not 1 <= offset <= MAX_PREFETCH_OFFSET:
            raise ScheduleError(f"prefetch: offset must be an integer in [1, {MAX_PREFETCH_OFFSET}] iterations, "
                                f"got {offset!r}")
        self.prefetches.append((tensor, iv, offset))
        self._record("prefetch", tensor=self.schedule._tensor_ref(tensor, self.schedule.stage_of(tensor)),
                     axis=self._index(iv), offset=offset)

    # ------------------------------------------------------------------ placement
    def compute_at(self, parent: "Stage", axis):
        """Compute this stage inside loop `axis` of `parent`, only the region that loop needs."""
        if not isinstance(parent, Stage) or parent.schedule is not self.schedule:
            raise ScheduleError("compute_at: the parent must be a stage of the same schedule")
        if parent is self:
            raise ScheduleError(f"compute_at: stage {self.name} cannot be computed at itself")
        if self.is_output:
            raise ScheduleError(f"compute_at: {self.name} is an output of the schedule; outputs stay at root")
        parent._check_not_inline("compute_at")
        iv = parent._leaf(axis, "compute_at")
        if not self.schedule._reads_transitively(parent, self):
            raise ScheduleError(f"compute_at: {parent.name} does not read {self.name}, so its loop "
                                f"{iv.name} does not enclose a consumer of {self.name}")
        p = parent
        while p.attach[0] == "at":
            p = p.attach[1]
            if p is self:
                raise ScheduleError(f"compute_at: {parent.name} is itself computed inside {self.name}")
        self.attach = ("at", parent, iv)
        self._record("compute_at", parent=self.schedule.stages.index(parent), axis=parent._index(iv))

    def compute_inline(self):
        """Substitute this elementwise stage into its readers; it gets no loops or buffer."""
        if self.is_output:
            raise ScheduleError(f"compute_inline: {self.name} is an output of the schedule")
        if isinstance(self.op.body, Reduce):
            raise ScheduleError(f"compute_inline: {self.name} is a reduction and cannot be inlined")
        if self.relations or self.annotations:
            raise ScheduleError(f"compute_inline: {self.name} already has loop transformations")
        for st in self.schedule.stages:
            if st.attach[0] == "at" and st.attach[1] is self:
                raise ScheduleError(f"compute_inline: {st.name} is computed at {self.name}")
        self.attach = ("inline",)
        self._record("compute_inline")

    def compute_root(self):
        """Compute the whole stage at the top level (the default)."""
        if self.is_inline:
            raise ScheduleError(f"compute_root: {self.name} is inlined")
        self.attach = ("root",)
        self._record("compute_root")


class Schedule:
    """The stages of a compute DAG, producers first, and the steps applied to them."""

    def __init__(self, outputs):
        if isinstance(outputs, Tensor):
            outputs = [outputs]
        outputs = list(outputs)
        if not outputs or not all(isinstance(t, Tensor) for t in outputs):
            raise ScheduleError("create_schedule needs one or more output tensors")
        for t in outputs:
            if isinstance(t.op, PlaceholderOp):
                raise ScheduleError(f"{t.name} is a placeholder; schedule the compute that produces the output")
        self.outputs = outputs
        self.steps: list = []
        self.stages: list[Stage] = []
        self.placeholders: list[Tensor] = []
        self._stage_of: dict = {}
        used = set()
        for op in topo_order(outputs):
            if isinstance(op, PlaceholderOp):
                self.placeholders.append(op.output)
                continue
            stage = Stage(self, op.output, op)
            name, n = stage.name, 1
            while stage.name in used:
                stage.name = f"{name}_{n}"
                n += 1
            used.add(stage.name)
            self.stages.append(stage)
            self._stage_of[op.output] = stage

    def __getitem__(self, key) -> Stage:
        if isinstance(key, str):
            for st in self.stages:
                if st.name == key:
                    return st
            raise ScheduleError(f"the schedule has no stage named {key!r}")
        if isinstance(key, Stage) and key in self.stages:
            return key
        stage = self._stage_of.get(key)
        if stage is None:
            name = getattr(key, "name", key)
            raise ScheduleError(f"{name!r} is not computed by this schedule (a placeholder, or another definition)")
        return stage

    def stage_of(self, tensor: Tensor):
        """The stage computing `tensor`, or None for an input."""
        return self._stage_of.get(tensor)

    def _record(self, op, **fields):
        step = {"op": op}
        step.update({k: v for k, v in fields.items() if v is not None})
        self.steps.append(step)

    def _reads_transitively(self, consumer: Stage, producer: Stage) -> bool:
        todo, seen = [consumer], set()
        while todo:
            st = todo.pop()
            for t in st.op.input_tensors():
                if t is producer.tensor:
                    return True
                nxt = self._stage_of.get(t)
                if nxt is not None and id(nxt) not in seen:
                    seen.add(id(nxt))
                    todo.append(nxt)
        return False

    def readers_of(self, tensor: Tensor) -> list:
        return [st for st in self.stages if any(t is tensor for t in st.op.input_tensors())]

    # ------------------------------------------------------------------ caches
    def cache_write(self, tensor: Tensor, scope: str = "local", order=None) -> Tensor:
        """Compute `tensor` into a new cache stage; the old stage becomes a copy out of it.

        Typical use: the cache is computed at a tile loop of the output, so the accumulators of
        a register tile live in a small local buffer that LLVM keeps in registers.

        `order` (a permutation of the dimensions) lays the cache out in another order: cache
        dimension d is `tensor`'s dimension order[d]. A convolution whose vector axis is the
        output channel of an NCHW output caches its tile as [n, y, x, f] ({"order": [0, 2, 3, 1]}),
        so each channel vector of accumulators is contiguous (a register), not OH*OW apart.
        """
        stage = self[tensor]
        if scope not in ("local", "global"):
            raise ScheduleError(f"cache_write: scope must be 'local' or 'global', got {scope!r}")
        if stage.relations or stage.annotations or stage.attach[0] != "root":
            raise ScheduleError(f"cache_write: apply it to {stage.name} before any loop transformation")
        op = stage.op
        ndim = len(op.shape)
        if order is not None:
            if (not isinstance(order, (list, tuple)) or any(isinstance(d, bool) or not isinstance(d, int) for d in order)
                    or sorted(order) != list(range(ndim))):
                raise ScheduleError(f"cache_write: order must be a permutation of 0..{ndim - 1}, got {order!r}")
            order = [int(d) for d in order]
            if order == list(range(ndim)):
                order = None
        perm = order or list(range(ndim))
        cache_op = ComputeOp(f"{stage.name}_{scope}", [op.shape[d] for d in perm], [op.axis[d] for d in perm],
                             op.body, op.tag, op.attrs)
        cache_tensor = Tensor(cache_op)
        axis = [IterVar(ax.name, ax.extent) for ax in op.axis]
        copy_op = ComputeOp(stage.name, op.shape, axis, cache_tensor[tuple(axis[d].var for d in perm)], op.tag)
        Tensor(copy_op)  # gives copy_op its output tensor (op.output), as every operation has one
        stage_index = self.stages.index(stage)
        new_stage = Stage(self, cache_tensor, cache_op, scope)
        # the old stage keeps the user's tensor (readers still read it) and becomes the copy
        stage.op = copy_op
        stage.root_iter_vars = list(copy_op.axis)
        stage.all_iter_vars = list(stage.root_iter_vars)
        stage.leaf_iter_vars = list(stage.root_iter_vars)
        self.stages.insert(stage_index, new_stage)
        self._stage_of[cache_tensor] = new_stage
        self._record("cache_write", tensor=stage_index, scope=scope, order=order)
        return cache_tensor

    def rfactor(self, tensor: Tensor, axis, factor_axis: int = 0) -> Tensor:
        """Split a reduction in two: a new stage reduces all but `axis`, keeping `axis` as a
        spatial dimension (at position `factor_axis`), and this stage reduces over that dimension.

        With little spatial parallelism (a sum over a whole tensor), the new stage's spatial
        `axis` can be parallelized or vectorized: partial sums per lane or per thread.
        `axis` must be a reduction loop of the stage, which may only have had its reduction axes
        split so far.
        """
        stage = self[tensor]
        body = stage.op.body
        if not isinstance(body, Reduce):
            raise ScheduleError(f"rfactor: {stage.name} is not a reduction")
        iv = stage._leaf(axis, "rfactor")
        if iv.kind != "reduce":
            raise ScheduleError(f"rfactor: {iv.name} is a spatial axis of {stage.name}; give a reduction axis")
        if stage.annotations or stage.attach[0] != "root" or any(
                not isinstance(r, Split) or r.parent.kind != "reduce" for r in stage.relations):
            raise ScheduleError(f"rfactor: apply it to {stage.name} before anything but splits of its "
                                "reduction axes")
        if not 0 <= factor_axis <= len(stage.op.axis):
            raise ScheduleError(f"rfactor: factor_axis must be in [0, {len(stage.op.axis)}]")
        op = stage.op
        # each root reduction axis as an expression of the leaf reduction loops, plus split guards
        value = {r: r.var for r in stage.leaf_iter_vars if r.kind == "reduce"}
        guards = []
        for rel in reversed(stage.relations):
            v = value[rel.outer] * rel.inner.extent + value[rel.inner]
            value[rel.parent] = v
            if rel.outer.extent * rel.inner.extent > rel.parent.extent:
                guards.append(v < rel.parent.extent)
        rf_axis = IterVar(iv.name, iv.extent)
        spatial = [IterVar(a.name, a.extent) for a in op.axis]
        rf_spatial = spatial[:factor_axis] + [rf_axis] + spatial[factor_axis:]
        others = [r for r in stage.leaf_iter_vars if r.kind == "reduce" and r is not iv]
        new_red = {r: reduce_axis(r.extent, r.name) for r in others}
        mapping = {a.var: b.var for a, b in zip(op.axis, spatial)}
        mapping.update({r.var: new_red[r].var for r in others})
        mapping[iv.var] = rf_axis.var
        root_vals = {r.var: E.substitute(value[r], mapping) for r in op.reduce_axis}
        src = E.substitute(E.substitute(body.source, root_vals), mapping)
        where = body.where
        if where is not None:
            where = E.substitute(E.substitute(where, root_vals), mapping)
        for g in guards:  # the split's bound first: the user's condition may read with the index
            g = E.substitute(g, mapping)
            where = g if where is None else g & where
        if not others:  # nothing left to reduce: the factored stage is elementwise
            rf_body = src if where is None else E.if_then_else(
                where, src, Const(reduce_identity(body.combiner, body.dtype), body.dtype))
        else:
            rf_body = Reduce(body.combiner, src, [new_red[r] for r in others], where)
        rf_op = ComputeOp(f"{stage.name}_rf", _shape(rf_spatial), rf_spatial, rf_body, op.tag, op.attrs)
        rf_tensor = Tensor(rf_op)
        final_axis = [IterVar(a.name, a.extent) for a in op.axis]
        k = reduce_axis(iv.extent, f"{iv.name}_v")
        idx = [a.var for a in final_axis]
        idx.insert(factor_axis, k.var)
        final_op = ComputeOp(stage.name, op.shape, final_axis,
                             Reduce(body.combiner, rf_tensor[tuple(idx)], [k]), op.tag, op.attrs)
        stage_index = self.stages.index(stage)
        axis_index = stage._index(iv)
        stage.op = final_op
        stage.root_iter_vars = list(final_axis) + [k]
        stage.all_iter_vars = list(stage.root_iter_vars)
        stage.leaf_iter_vars = list(stage.root_iter_vars)
        stage.relations = []
        new_stage = Stage(self, rf_tensor, rf_op)
        self.stages.insert(stage_index, new_stage)
        self._stage_of[rf_tensor] = new_stage
        self._record("rfactor", tensor=stage_index, axis=axis_index, factor_axis=factor_axis)
        return rf_tensor

    def cache_read(self, tensor: Tensor, scope: str, readers, block: dict | None = None,
                   merge: list | None = None, stride: dict | None = None) -> Tensor:
        """Copy `tensor` into a new stage that `readers` read instead.

        `block` = {axis: factor} packs the copy into a blocked layout: each blocked axis is cut
        into outer blocks (moved to the front) and an inner block of `factor` (moved to the back),
        e.g. B[K, N] with {1: 16} becomes Bp[ceil(N/16), K, 16]; the tail block is zero-padded.
        `merge` = [first, last] joins the consecutive unblocked axes first..last into one (the
        same memory order, one axis for a schedule to tile): OIHW weights [F, C, KH, KW] with
        {0: 16} and [1, 3] become [F/16, C·KH·KW, 16], which a copy can transpose 16 x 16 at a
        time like a matrix's (compiler/ops/schedule_conv.py's weight panels).
        `stride` = {axis: s} copies only every s-th element along the axis, where every reader
        reads only those (its index there a multiple of s at every point: a 1x1 convolution's
        strided input, [N, C, H, W] with {2: 2, 3: 2} a compact [N, C, H/2, W/2]); blocking
        then applies to the compact extents.
        """
        if scope not in ("local", "global"):
            raise ScheduleError(f"cache_read: scope must be 'local' or 'global', got {scope!r}")
        if isinstance(readers, (Tensor, Stage, str)):
            readers = [readers]
        reader_stages = [self[r] for r in readers]
        if not reader_stages:
            raise ScheduleError("cache_read needs at least one reader stage")
        for st in reader_stages:
            if not any(t is tensor for t in st.op.input_tensors()):
                raise ScheduleError(f"cache_read: stage {st.name} does not read {tensor.name}")
        block = _axis_map(block, tensor, "block", "factors", "block factor")
        joined = _check_merge(merge, tensor.ndim, block)
        stride = _check_stride(stride, tensor, reader_stages)
        layout = _BlockLayout(tensor.shape, block, joined, stride)
        name = f"{tensor.name}_{'packed' if block else scope}"
        taken = {st.name for st in self.stages}
        base, n = name, 1
        while name in taken:
            name, n = f"{base}{n}", n + 1
        cache = compute(layout.shape, lambda *i: layout.read_source(tensor, i), name=name)
        step = dict(tensor=self._tensor_ref(tensor, self.stage_of(tensor)), scope=scope,
                    readers=[self.stages.index(st) for st in reader_stages],
                    block={str(k): v for k, v in sorted(block.items())} or None)
        if joined is not None:
            step["merge"] = list(joined)
        if stride:
            step["stride"] = {str(k): v for k, v in sorted(stride.items())}
        first = min(self.stages.index(st) for st in reader_stages)
        cache_op = cache.op
        assert isinstance(cache_op, ComputeOp)  # compute() always makes one (Tensor.op is any Operation)
        new_stage = Stage(self, cache, cache_op, scope)
        for st in reader_stages:
            st.op = _replace_reads(st.op, tensor, cache, layout)
        self.stages.insert(first, new_stage)
        self._stage_of[cache] = new_stage
        self._record("cache_read", **step)
        return cache

    # ------------------------------------------------------------------ algorithms
    def rewrite(self, tensor: Tensor, name: str, **params) -> list:
        """Compute `tensor` by the algorithm rewrite `name` (compiler/rewrite.py) with `params`:
        its stage takes the rewrite's output operation, the rewrite's other stages are inserted
        before it, and stages only it read (a padding) leave the schedule. Readers of `tensor`
        and the kernel's arguments are unchanged. Apply it before any other step on the stage
        and its producers; returns the new stages, producers first."""
        stage = self[tensor]
        if stage.relations or stage.annotations or stage.attach[0] != "root" or stage.op is not tensor.op:
            raise ScheduleError(f"rewrite: apply it to {stage.name} before any other step on it")
        if not isinstance(params, dict) or not all(isinstance(k, str) for k in params):
            raise ScheduleError("rewrite: params must map names to values")
        new_out = rewrite_function(name)(stage.op, **params)
        if not isinstance(new_out, Tensor) or not isinstance(new_out.op, ComputeOp):
            raise ScheduleError(f"rewrite {name!r} did not return a computed tensor")
        if tuple(new_out.shape) != tuple(tensor.shape) or new_out.dtype != tensor.dtype:
            raise ScheduleError(f"rewrite {name!r} computes {new_out.shape} {new_out.dtype}, not {tensor.shape} {tensor.dtype}")
        new_ops = [op for op in topo_order([new_out]) if op is not new_out.op]
        for op in new_ops:
            if isinstance(op, PlaceholderOp) and op.output not in self.placeholders:
                raise ScheduleError(f"rewrite {name!r} reads {op.name}, which the definition does not")
        index = self.stages.index(stage)
        reused = {id(op) for op in new_ops}   # stages the new DAG reads (a computed input) stay
        dropped = [st for st in self._only_read_by(stage) if id(st.tensor.op) not in reused]
        for st in dropped:
            if st.relations or st.annotations or st.attach[0] != "root":
                raise ScheduleError(f"rewrite: {st.name}, which only {stage.name} reads, has steps applied already")
        taken = {st.name for st in self.stages if st not in dropped}
        added = []
        for op in new_ops:
            if isinstance(op, PlaceholderOp) or op.output in self._stage_of:
                continue
            st = Stage(self, op.output, op)
            base, n = st.name, 1
            while st.name in taken:
                st.name, n = f"{base}_{n}", n + 1
            taken.add(st.name)
            added.append(st)
        new_op = new_out.op
        assert isinstance(new_op, ComputeOp)   # checked above; narrows the type
        stage.op = new_op
        stage.root_iter_vars = list(new_op.axis) + list(new_op.reduce_axis)
        stage.all_iter_vars = list(stage.root_iter_vars)
        stage.leaf_iter_vars = list(stage.root_iter_vars)
        for st in dropped:
            self.stages.remove(st)
            del self._stage_of[st.tensor]
        at = self.stages.index(stage)
        self.stages[at:at] = added
        for st in added:
            self._stage_of[st.tensor] = st
        self._record("rewrite", tensor=index, name=name, params=dict(params) or None)
        return added

    def _only_read_by(self, stage: Stage) -> list:
        """The producer stages that `stage` alone reads, directly or through each other."""
        out, todo = [], list(stage.op.input_tensors())
        while todo:
            t = todo.pop()
            st = self._stage_of.get(t)
            if st is None or st in out or st.is_output:
                continue
            if any(r is not stage and r not in out and any(x is t for x in r.op.input_tensors()) for r in self.stages):
                continue
            out.append(st)
            todo.extend(st.op.input_tensors())
        return out

    def _tensor_ref(self, tensor, stage):
        if stage is not None:
            return self.stages.index(stage)
        return f"input{self.placeholders.index(tensor)}"


def _shape(axes) -> tuple:
    return tuple(a.extent for a in axes)


def _check_merge(merge, ndim: int, block: dict) -> tuple[int, int] | None:
    """cache_read's `merge` as a (first, last) pair, or None; ScheduleError where it is not two
    consecutive-range axes of the tensor, first < last, none of them blocked."""
    if merge is None:
        return None
    try:
        first, last = (int(a) for a in merge)
    except (TypeError, ValueError):
        raise ScheduleError(f"cache_read: merge must be [first, last] axis numbers, got {merge!r}") from None
    if not 0 <= first < last < ndim:
        raise ScheduleError(f"cache_read: merge [{first}, {last}] is not a range of two or more of the {ndim} axes")
    if any(a in block for a in range(first, last + 1)):
        raise ScheduleError(f"cache_read: merge [{first}, {last}] includes a blocked axis")
    return first, last


def _axis_map(value, tensor: Tensor, name: str, values: str, value_name: str) -> dict:
    """cache_read's `block` or `stride` as {axis: positive int}; ScheduleError naming `name`
    where it is not a map of the tensor's axis numbers to positive integers."""
    try:
        out = {int(k): v for k, v in (value or {}).items()}
    except (TypeError, ValueError, AttributeError):
        raise ScheduleError(f"cache_read: {name} must map axis numbers to {values}, got {value!r}") from None
    for ax, v in out.items():
        if not 0 <= ax < tensor.ndim:
            raise ScheduleError(f"cache_read: {name} axis {ax} out of range for {tensor.ndim}-d {tensor.name}")
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ScheduleError(f"cache_read: {value_name} for axis {ax} must be a positive integer")
    return out


def _check_stride(stride, tensor: Tensor, reader_stages) -> dict:
    """cache_read's `stride` as {axis: step}; ScheduleError unless every read of `tensor` by the
    readers indexes each strided axis with a multiple of its step at every point of the reader's
    iteration domain (the copy holds nothing else)."""
    if not stride:
        return {}
    stride = _axis_map(stride, tensor, "stride", "steps", "stride")
    for st in reader_stages:
        op = st.op
        # every variable of a ComputeOp's body runs from 0 (a reduce axis's lo is folded into its reads)
        ranges = {iv.var: (0, iv.extent - 1) for iv in list(op.axis) + list(op.reduce_axis)}
        for n in E.walk(op.body):
            if isinstance(n, TensorRead) and n.tensor is tensor:
                for ax, step in stride.items():
                    if not _multiple_of(n.indices[ax], step, ranges):
                        raise ScheduleError(f"cache_read: stage {st.name} reads {tensor.name} along axis {ax} at "
                                            f"positions that are not all multiples of {step}")
    return stride


def _multiple_of(index, step: int, ranges: dict) -> bool:
    """Whether `index` is a multiple of `step` wherever its variables range over `ranges`: every
    term's coefficient a multiple (a term whose value is fixed counts as a constant)."""
    try:
        lin = to_lin(index, ranges)
    except TypeError:
        return False
    const = lin.const
    for atom, coef in lin.terms.values():
        r = expr_range(atom, ranges)
        if r is not None and r[0] == r[1]:
            const += coef * r[0]
        elif coef % step:
            return False
    return const % step == 0


class _BlockLayout:
    """Index mapping of a blocked copy (see Schedule.cache_read): outer blocks, the unblocked
    axes (those of `merge`, a (first, last) range, joined into one), inner blocks; a strided
    axis holds every step-th element of the source's."""

    def __init__(self, shape, block: dict, merge: tuple[int, int] | None = None, stride: dict | None = None):
        self.stride = dict(stride or {})
        self.src_shape = tuple(-(-d // self.stride.get(a, 1)) for a, d in enumerate(shape))
        shape = self.src_shape
        self.block = dict(sorted(block.items()))
        self.merge = merge
        outer = [-(-shape[a] // f) for a, f in self.block.items()]
        middle = self._join([d for a, d in enumerate(shape) if a not in self.block], math.prod)
        inner = list(self.block.values())
        self.shape = tuple(outer + middle + inner)

    def _join(self, middle: list, combine) -> list:
        """The unblocked axes' values with the merged range's replaced by combine(theirs)."""
        if self.merge is None:
            return middle
        first, last = self.merge
        lo = first - sum(1 for a in self.block if a < first)
        return middle[:lo] + [combine(middle[lo:lo + last - first + 1])] + middle[lo + last - first + 1:]

    def _split_merged(self, middle: list) -> list:
        """The merged axis's index back to the source axes it joins (innermost fastest)."""
        if self.merge is None:
            return list(middle)
        first, last = self.merge
        lo = first - sum(1 for a in self.block if a < first)
        k, parts = middle[lo], []
        for d in reversed(self.src_shape[first + 1:last + 1]):
            parts.append(k % d)
            k = k // d   # nested floordivs: the flattened address simplifies back to k
        parts.append(k)
        return list(middle[:lo]) + parts[::-1] + list(middle[lo + 1:])

    def _merged_index(self, parts: list):
        assert self.merge is not None   # only called by _join, which checks
        first, last = self.merge
        k = parts[0]
        for d, v in zip(self.src_shape[first + 1:last + 1], parts[1:]):
            k = k * d + v
        return k

    def read_source(self, tensor, idx):
        nb = len(self.block)
        outer, middle, inner = idx[:nb], idx[nb:len(idx) - nb], idx[len(idx) - nb:]
        src, guard = [], None
        mid = iter(self._split_merged(middle))
        blocked = {a: (o, i, f) for (a, f), o, i in zip(self.block.items(), outer, inner)}
        for a, d in enumerate(self.src_shape):
            if a in blocked:
                o, i, f = blocked[a]
                v = o * f + i
                if d % f:
                    cond = v < d
                    guard = cond if guard is None else guard & cond
                src.append(v)
            else:
                src.append(next(mid))
        src = [v * self.stride[a] if a in self.stride else v for a, v in enumerate(src)]
        if guard is None:
            return tensor[tuple(src)]
        return E.if_then_else(guard, tensor[tuple(src)], Const(0, tensor.dtype))

    def map_read(self, idx):
        idx = [v // self.stride[a] if a in self.stride else v for a, v in enumerate(idx)]
        outer = [idx[a] // f for a, f in self.block.items()]
        middle = self._join([v for a, v in enumerate(idx) if a not in self.block], self._merged_index)
        inner = [idx[a] % f for a, f in self.block.items()]
        return tuple(outer + middle + inner)


def _replace_reads(op: ComputeOp, old: Tensor, new: Tensor, layout: _BlockLayout) -> ComputeOp:
    def fn(n):
        if isinstance(n, TensorRead) and n.tensor is old:
            return TensorRead(new, layout.map_read(n.indices))
        return None
    body = op.body
    if isinstance(body, Reduce):
        src = transform(body.source, fn)
        where = transform(body.where, fn) if body.where is not None else None
        body = Reduce(body.combiner, src, body.axes, where)
    else:
        body = transform(body, fn)
    return ComputeOp(op.name, op.shape, op.axis, body, op.tag, op.attrs)


def create_schedule(outputs) -> Schedule:
    """A default schedule: every stage at root, loops in definition order."""
    return Schedule(outputs)

