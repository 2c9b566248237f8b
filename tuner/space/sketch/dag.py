"""The compute DAG as the sketch rules see it: stages, what each reads, reuse, fusible consumers,
what a tiled stage may pack or block.
"""

from __future__ import annotations

from compiler.expr import free_vars, substitute, transform, walk
from compiler.schedule import create_schedule
from compiler.tensor import PlaceholderOp, Reduce, TensorRead


class SketchDag:
    """The stages of a compute definition (as a fresh schedule lists them) and their relations."""

    def __init__(self, opdef):
        s = create_schedule(opdef.output)
        self.stages = list(s.stages)
        self.n = len(self.stages)
        self.names = [st.name for st in self.stages]
        self.index = {id(st.tensor): i for i, st in enumerate(self.stages)}
        self.inputs = list(s.placeholders)
        self.output = self.index[id(opdef.output)]

    def op(self, i):
        return self.stages[i].op

    def is_reduce(self, i) -> bool:
        return isinstance(self.op(i).body, Reduce)

    def is_output(self, i) -> bool:
        return i == self.output

    def expanded(self, i, inlined: set):
        """The body of stage i with the inlined stages substituted (as lowering will)."""
        body = self.op(i).body
        if isinstance(body, Reduce):
            where = self._expand(body.where, inlined) if body.where is not None else None
            return Reduce(body.combiner, self._expand(body.source, inlined), body.axes, where)
        return self._expand(body, inlined)

    def _expand(self, e, inlined: set):
        def fn(n):
            if isinstance(n, TensorRead):
                j = self.index.get(id(n.tensor))
                if j is not None and j in inlined:
                    op = self.op(j)
                    mapping = {ax.var: idx for ax, idx in zip(op.axis, n.indices)}
                    return self._expand(substitute(op.body, mapping), inlined)
            return None
        return transform(e, fn)

    @staticmethod
    def reads(body) -> list:
        """Every tensor read of a stage body (a reduction's condition included)."""
        if isinstance(body, Reduce):
            roots = [body.source] + ([body.where] if body.where is not None else [])
        else:
            roots = [body]
        return [n for r in roots for n in walk(r) if isinstance(n, TensorRead)]

    def effective_readers(self, i, inlined: set) -> list:
        """Stages that are not inlined and read stage i, directly or through inlined stages."""
        t = self.stages[i].tensor
        return [j for j in range(self.n) if j not in inlined and j != i and
                any(r.tensor is t for r in self.reads(self.expanded(j, inlined)))]

    def has_reuse(self, i, inlined: set) -> bool:
        """Some read runs over the reduction but not over every (non-trivial) spatial axis (B of
        a matmul is the same for every row i): a multi-level tile reuses it from registers and
        cache."""
        op = self.op(i)
        spatial = {ax.var for ax in op.axis if ax.extent > 1}
        reduce = {ax.var for ax in op.reduce_axis}
        if not spatial:
            return False
        for r in self.reads(self.expanded(i, inlined)):
            used = set()
            for idx in r.indices:
                used |= free_vars(idx)
            if used & reduce and spatial - used:
                return True
        return False

    def fusible_consumer(self, i, inlined: set):
        """The elementwise stage that alone reads stage i, point for point, or None."""
        readers = self.effective_readers(i, inlined)
        if len(readers) != 1:
            return None
        j = readers[0]
        op_i, op_j = self.op(i), self.op(j)
        if self.is_reduce(j) or tuple(op_j.shape) != tuple(op_i.shape):
            return None
        t = self.stages[i].tensor
        axis_vars = [ax.var for ax in op_j.axis]
        for r in self.reads(self.expanded(j, inlined)):
            if r.tensor is t and any(idx is not v for idx, v in zip(r.indices, axis_vars)):
                return None
        return j

    def pack_target(self, i, vec: int | None = None):
        """(input index, tensor axis) of an input the tile reuses and reads with spatial axis
        `vec` (the vector axis; the last by default) as one index: packing it blocks that axis by
        the vector tile."""
        op = self.op(i)
        live = [ax for ax in op.axis if ax.extent > 1]
        if not live:
            return None
        axis_var = op.axis[len(op.axis) - 1 if vec is None else vec].var
        spatial = {ax.var for ax in live}
        for r in self.reads(op.body):
            if not isinstance(r.tensor.op, PlaceholderOp):
                continue
            dims = [d for d, idx in enumerate(r.indices) if idx is axis_var]
            used = set()
            for idx in r.indices:
                used |= free_vars(idx)
            if dims and spatial - used and used & {ax.var for ax in op.reduce_axis}:
                return self.inputs.index(r.tensor), dims[0]
        return None

    def block_target(self, i, packed_input: int):
        """("stage", index, axis) or ("input", index, axis) of what tiled stage i reads with its first reduction axis alone
        as one index (a convolution's input channels), other than the packed input: copied in
        blocks along that axis, the reduction's inner steps read consecutive elements (the
        channel-vector default's NCHWc input: schedule_conv.input_channel_block). The stage is
        a placeholder's or a producer's (a padding stage, inlined into the copy)."""
        op = self.op(i)
        if not op.reduce_axis:
            return None
        r0 = op.reduce_axis[0].var
        for r in self.reads(op.body):
            if r.tensor is self.inputs[packed_input]:
                continue
            dims = [d for d, idx in enumerate(r.indices) if idx is r0]
            if not dims:
                continue
            j = self.index.get(id(r.tensor))
            if j is not None:
                return ("stage", j, dims[0])
            if r.tensor in self.inputs:
                return ("input", self.inputs.index(r.tensor), dims[0])
        return None

    def vector_axes(self, i) -> list:
        """Spatial axes of tiled stage i, besides the last, that may be its vector axis: those a
        reused input reads as one index while it does not read the last axis (a convolution's
        output channels, which index the weights; a matmul's rows, which index A). Packing that
        input makes the axis unit-stride; the accumulators are cached with it last."""
        op = self.op(i)
        last = op.axis[-1].var
        out = []
        for d, ax in enumerate(op.axis[:-1]):
            if ax.extent <= 1:
                continue
            target = self.pack_target(i, d)
            if target is None:
                continue
            tensor = self.inputs[target[0]]
            reads_last = any(last in free_vars(idx) for r in self.reads(op.body) if r.tensor is tensor
                             for idx in r.indices)
            if not reads_last:
                out.append(d)
        return out


__all__ = ["SketchDag"]
