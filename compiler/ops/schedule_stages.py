"""The stages of a DAG scheduled where they stand, one by one: the fallback every structural
schedule shares (schedule_anchor's DAGs without a product tile, schedule_rules' stride phases and
scans), and the questions it asks of a reduction (whether its last axis can be vectors, which
reads to pack for that, which producers to inline)."""

from __future__ import annotations

from ..arith import unit_step
from ..expr import walk
from ..lift import LIFTED_TAG
from ..schedule import Schedule
from ..tensor import ComputeOp, PlaceholderOp, TensorRead
from .scan_carry import scan_axis
from .schedule_common import var_groups
from .schedule_elementwise import schedule_injective_stage, schedule_pad_stage, schedule_reduce_stage
from .schedule_tile import broadcast_read
from .stride_phases import is_data_movement


def schedule_stages_at_root(s, out, target) -> Schedule:
    """_stages_at_root on a schedule whose stages may differ from the definition's (a rewrite
    made them: schedule_rules' stride phases): each stage as its operation is now."""
    out_op = s[out].op
    # a running carry (scan_carry) reads its own output: never inlined, scheduled by the scan rule
    inline_producers(s, out_op, target, keep=lambda op: bool(op.reduce_axis) or scan_axis(op) is not None)
    for st in list(s.stages):
        op = st.op
        if isinstance(op, ComputeOp) and op.reduce_axis and any(a.extent > 1 for a in op.axis) and not st.is_inline:
            schedule_reduce_stage(st, reduced_input_shape(op), chains_not_vectors(op), target,
                                  pack=vector_packing(op) or ())
    if not out_op.reduce_axis and scan_axis(out_op) is None:
        schedule_injective_stage(s[out], target)
    return s


def inline_producers(s, out_op, target, keep=None) -> None:
    """Inline every compute stage into its readers but the output and `keep` (an op, or a
    predicate on ops), except padding of the last axis that a reduction reads: that is
    materialized at the root, a row copy (schedule_pad_stage), because inlined its border test
    and clamped index vary across the vector's lanes in every tap and make each load a gather
    (an Inception block's 3x3 average pool with count_include_pad over 192 x 35 x 35: 0.8 ms,
    2.3 GB/s, against onnxruntime's 0.05). Padding of other axes stays inlined: its test is one
    per vector (a channel-blocked max pool: materialized, the copy took half its time).
    A stage compiler.lift made of an expensive value a reduction would recompute is computed
    once, at the root: inlined, it would be recomputed again."""
    kept = keep if callable(keep) else (lambda op: op is keep)
    for st in s.stages:
        op = st.op
        if not isinstance(op, ComputeOp) or op is out_op or kept(op):
            continue
        if op.tag == LIFTED_TAG:
            schedule_injective_stage(st, target)
        elif (_pads_last_axis(op) or is_data_movement(op)) and _read_by_reduction(s, op, broadcast=not _pads_last_axis(op)):
            schedule_pad_stage(st, target)
        else:
            st.compute_inline()


def _read_by_reduction(s, op, broadcast: bool) -> bool:
    """Whether a reduction stage of `s` reads `op`; with `broadcast`, as the operand its product
    tile broadcasts (schedule_tile.broadcast_read): a padding there, inlined, tests its border
    (a branch around the load) once per unit and reduction step. Materialized once instead, the
    56 x 56 x 64 NHWC 3x3 conv ran 1.30-1.65 ms against 1.93 inlined (6 x 2-vector tile; znver2)."""
    for x in s.stages:
        r = x.op
        if not isinstance(r, ComputeOp) or not r.reduce_axis:
            continue
        for n in walk(r.body):
            if isinstance(n, TensorRead) and n.tensor.op is op and (not broadcast or broadcast_read(r, n)):
                return True
    return False


def _pads_last_axis(op) -> bool:
    sources = op.input_tensors()
    return op.tag == "pad" and len(sources) == 1 and tuple(sources[0].shape[-1:]) != tuple(op.shape[-1:])


def chains_not_vectors(op) -> bool:
    """Whether a reduction is computed as interleaved scalar chains (its innermost read reduced
    and its output's last axis not read with unit stride, even after packing), not as vectors
    of its last axis."""
    return vector_packing(op) is None and _inner_reduced(op)


def vector_packing(op) -> list | None:
    """The reads to pack so that vectors of `op`'s last axis load whole vectors: [(placeholder,
    its axis that the last axis walks)], [] when every read already is unit-stride or
    independent of it (conv1d's X[c, t + r] along t), None when some read cannot be made so.
    A placeholder that the last axis walks along another of its axes (Bᵀ in exp(A)·Bᵀ, K in
    Q·Kᵀ) is copied into blocks of that axis (cache_read with a block) at the root, as the GEMM
    schedule packs its panels."""
    if not op.axis or op.axis[-1].extent <= 1:
        return None
    var = op.axis[-1].var
    pack: list = []
    for n in walk(op.body):
        if not isinstance(n, TensorRead):
            continue
        # a read of the last axis only as `var // g` is one value per vector (schedule_tile.tile_group)
        where = [p for p, i in enumerate(n.indices) if var in walk(i) and var_groups(i, var) is None]
        if not where:
            continue
        if len(where) > 1 or not unit_step(n.indices[where[0]], var):
            return None
        if where[0] != len(n.indices) - 1:
            if not isinstance(n.tensor.op, PlaceholderOp) or not _reused(op, n):
                return None
            if (n.tensor, where[0]) not in pack:
                pack.append((n.tensor, where[0]))
    if len({id(t) for t, _ in pack}) != len(pack):
        return None   # one tensor walked along two of its axes
    return pack


def _reused(op, read) -> bool:
    """Whether each element `read` loads serves several outputs (an output axis it does not
    depend on): only then does a packed copy pay for itself (B of a matmul serves every row;
    RMSNorm's rows serve one output each, and are summed along their unit-stride axis)."""
    used = {v for i in read.indices for v in walk(i)}
    return any(a.extent > 1 and a.var not in used for a in op.axis)


def reduced_input_shape(op) -> tuple:
    reads = op.input_tensors()
    return tuple(reads[0].shape) if reads else tuple(op.shape)


def _inner_reduced(op) -> bool:
    """Whether a reduction variable indexes the last axis of what the reduction reads."""
    rvars = {r.var for r in op.reduce_axis}
    for n in walk(op.body):
        if isinstance(n, TensorRead) and n.indices and any(v in rvars for v in walk(n.indices[-1])):
            return True
    return False


__all__ = ["schedule_stages_at_root", "inline_producers", "chains_not_vectors", "vector_packing",
           "reduced_input_shape"]
