"""Default schedules of compute DAGs that are not inventory operators, by their structure.

A fused group of a model (compiler/graph) is a compute DAG named after its nodes, not an
inventory operator, and a user's compute file is one too; `default_schedule` dispatches on names,
so these come here. The DAG's shape decides, as TVM picks a fused function's schedule by its
anchor operator:
- one convolution or matrix product (an *anchor*: a reduction stage tagged conv2d_nchw,
  conv2d_nchwc, dense, matmul or batch_matmul reading placeholders, the convolution through its
  pad stage), alone or followed by one elementwise stage of its shape (the fused epilogue:
  bias, residual add, activation): the anchor's own default schedule (schedule_conv,
  schedule_conv_nchwc, schedule_gemm), the register tiles stored through the epilogue;
- no reduction at all (a fused injective chain): every stage inlined into the output, which is
  scheduled like an elementwise operator;
- one reduction as the output (a global average pool, a mean): schedule_reduce_stage;
- the model operators schedule_graph_ops knows by their stages' tags (GroupNormalization,
  ConvTranspose with its epilogue): their schedules there;
- anything else: the naive schedule (correct, slow; the tuner's sketches do better).
`anchor_view` gives the OpDef the anchor's schedule reads (its name, inputs, parameters).
"""

from __future__ import annotations

import math

from ..errors import ScheduleError
from ..expr import walk
from ..lower import lower
from ..schedule import Schedule, create_schedule
from ..target import resolve_target
from ..tensor import ComputeOp, PlaceholderOp, TensorRead, topo_order
from .base import OpDef
from .functions import nchwc_weight_geometry
from .schedule_conv import schedule_conv_nchw
from .schedule_conv_nchwc import schedule_conv_nchwc
from .schedule_elementwise import schedule_injective_stage, schedule_reduce_stage
from .schedule_gemm import gemm_tile, gemv_lanes, gemv_panel_columns, schedule_gemm, schedule_gemv
from .schedule_graph_ops import schedule_tagged

CONV_TAGS = ("conv2d_nchw", "conv2d_nchw_packed", "conv2d_nchwc")
GEMM_TAGS = ("dense", "matmul", "batch_matmul")


def schedule_by_structure(opdef, target=None) -> Schedule:
    target = resolve_target(target)
    tagged = schedule_tagged(opdef, target)
    if tagged is not None:
        return tagged
    out = opdef.output
    computes = [op for op in topo_order([out]) if isinstance(op, ComputeOp)]
    reductions = [op for op in computes if op.reduce_axis]
    if len(reductions) == 1:
        view = anchor_view(opdef)
        if view is not None:
            if view.name == "conv2d_nchw":
                return _conv_with_epilogue(schedule_conv_nchw, view, opdef, target)
            if view.name == "conv2d_nchwc":
                return _conv_with_epilogue(schedule_conv_nchwc, view, opdef, target)
            row_lanes = _one_row(view, target)
            if row_lanes:
                return schedule_gemv(view, target, lanes=row_lanes)
            prepacked = "weight_block" in view.params   # B came in the panels packing makes
            return schedule_gemm(view, target, pack=not prepacked and _packing_pays(view, target))
    if not reductions:
        s = create_schedule(out)
        for st in s.stages:
            if isinstance(st.op, ComputeOp) and st.op is not out.op:
                st.compute_inline()
        schedule_injective_stage(s[out], target)
        return s
    if len(reductions) == 1 and reductions[0] is out.op:
        s = create_schedule(out)
        for st in s.stages:
            if isinstance(st.op, ComputeOp) and st.op is not out.op:
                st.compute_inline()
        if any(a.extent > 1 for a in out.op.axis):
            schedule_reduce_stage(s[out], _reduced_input_shape(out.op), _inner_reduced(out.op), target)
        return s
    return create_schedule(out)


def _one_row(view, target) -> int | None:
    """For a product of one output row with B [K, N] (a batch-1 dense layer) in whole vectors of
    columns, the vector width schedule_gemv streams it with (gemv_lanes); else None. B may come
    in panels one core's chunk wide (gemv_panel_columns), not in the GEMM's."""
    *batch, M, N = view.output.shape
    if math.prod(batch) * M != 1 or view.params.get("transpose_b"):
        return None
    lanes = target.vector_lanes(view.output.dtype)
    if "weight_block" in view.params:
        K = view.inputs[1].shape[-2]
        if view.params["weight_block"] != gemv_panel_columns(K, N, lanes, target.num_cores):
            return None
    return gemv_lanes(N, lanes)


def _packing_pays(view, target) -> bool:
    """Whether schedule_gemm should copy B into panels: only when B is [N, K] (dense: the vector
    of columns would be a gather otherwise) or when several row tiles reuse each panel. A
    batch-1 layer of a model is one row tile: an MLP's 784-512-512-10 at batch 1 spent most of
    its time re-packing its weights on every call."""
    if view.params.get("transpose_b"):
        return True
    *batch, M, N = view.output.shape
    lanes = target.vector_lanes(view.output.dtype)
    mr, _ = gemm_tile(M, N, lanes, target.capabilities.vector_registers)
    return math.prod(batch) * M > mr


def _conv_with_epilogue(schedule_conv, view, opdef, target) -> Schedule:
    """The convolution's tiles stored through the epilogue; when that makes more unrolled code
    than the lowering allows (a 4 x 7 tile of a 7x7 layer with a residual add and relu came to
    16.5k nodes against the 16k cap), the tile is stored into the convolution's output and the
    epilogue runs as a second pass; when even that is too much (the model fuzzer's dilated 7x7
    depthwise layer with a broadcast add: 17.2k), the plain loop nest (correct, slow; tuning
    finds better)."""
    out = opdef.output
    variants = [{}] if view.output is out else [{"epilogue": out}, {"epilogue": out, "fuse_epilogue": False}]
    for kw in variants:
        s = schedule_conv(view, target, **kw)
        try:
            lower(s, opdef.tensors)
            return s
        except ScheduleError:
            continue
    return create_schedule(out)


def anchor_view(opdef) -> OpDef | None:
    """The anchor of a fused DAG as the OpDef its operator's default schedule takes, or None when
    the DAG is not an anchor with at most one elementwise epilogue stage."""
    out = opdef.output
    computes = [op for op in topo_order([out]) if isinstance(op, ComputeOp)]
    anchors = [op for op in computes if op.reduce_axis]
    if len(anchors) != 1 or anchors[0].tag not in CONV_TAGS + GEMM_TAGS:
        return None
    anchor = anchors[0]
    anchor_t = next(t for op in computes for t in [*op.input_tensors(), out] if t.op is anchor)
    pads = [op for op in computes if op.tag == "pad"]
    epilogue = [op for op in computes if op is not anchor and op.tag != "pad"]
    if epilogue and (len(epilogue) != 1 or epilogue[0] is not out.op or tuple(out.shape) != tuple(anchor.shape)
                     or any(t.op is not anchor and not isinstance(t.op, PlaceholderOp) for t in out.op.input_tensors())):
        return None
    reads = anchor.input_tensors()
    if anchor.tag in CONV_TAGS:
        if len(pads) > 1 or len(reads) != 2:
            return None
        data, weight = reads
        if pads:
            if data.op is not pads[0] or len(pads[0].input_tensors()) != 1:
                return None
            data = pads[0].input_tensors()[0]
        if not (isinstance(data.op, PlaceholderOp) and isinstance(weight.op, PlaceholderOp)):
            return None
        attrs = anchor.attrs
        cpg, KH, KW = weight.shape[1:4]
        if anchor.tag == "conv2d_nchwc":
            _, cpg, KH, KW, _ = nchwc_weight_geometry(weight.shape)
            N, FO, OH, OW, FB = anchor.shape
            params = dict(KH=KH, KW=KW, stride=tuple(attrs["stride"]), padding=tuple(attrs["padding"]),
                          dilation=tuple(attrs["dilation"]), depthwise=bool(attrs["depthwise"]),
                          block=int(attrs["block"]), data_block=int(attrs["data_block"]))
            if int(attrs.get("groups", 1)) > 1 and not attrs["depthwise"]:
                params["groups"] = int(attrs["groups"])
            if attrs.get("group_window"):
                params["group_window"] = tuple(attrs["group_window"])
            flops = 2 * N * FO * OH * OW * FB * cpg * KH * KW
            return OpDef("conv2d_nchwc", [data, weight], anchor_t, params, flops, _no_reference)
        N, F, OH, OW = anchor.shape
        params = dict(KH=KH, KW=KW, stride=tuple(attrs["stride"]), padding=tuple(attrs["padding"]),
                      dilation=tuple(attrs["dilation"]), groups=int(attrs["groups"]))
        flops = 2 * N * F * OH * OW * cpg * KH * KW
        return OpDef("conv2d_nchw", [data, weight], anchor_t, params, flops, _no_reference)
    if pads or len(reads) != 2 or not all(isinstance(t.op, PlaceholderOp) for t in reads):
        return None
    a, b = reads
    transpose_b = anchor.tag == "dense" or _reads_transposed(anchor, b)
    name = "dense" if anchor.tag == "dense" else "matmul"
    flops = 2 * math.prod(anchor.shape) * math.prod(r.extent for r in anchor.reduce_axis)
    params = dict(transpose_b=transpose_b)
    if "weight_block" in (anchor.attrs or {}):   # B as column panels [N/NB, K, NB], read in place
        params["weight_block"] = int(anchor.attrs["weight_block"])
    return OpDef(name, [a, b], out, params, flops, _no_reference)


def _reads_transposed(op, b) -> bool:
    """Whether the matrix product reads b as [.., N, K] (its reduction variable in the last index)."""
    rvars = {r.var for r in op.reduce_axis}
    for n in walk(op.body):
        if isinstance(n, TensorRead) and n.tensor is b:
            return any(v in rvars for v in walk(n.indices[-1]))
    return False


def _reduced_input_shape(op) -> tuple:
    reads = op.input_tensors()
    return tuple(reads[0].shape) if reads else tuple(op.shape)


def _inner_reduced(op) -> bool:
    """Whether a reduction variable indexes the last axis of what the reduction reads."""
    rvars = {r.var for r in op.reduce_axis}
    for n in walk(op.body):
        if isinstance(n, TensorRead) and n.indices and any(v in rvars for v in walk(n.indices[-1])):
            return True
    return False


def _no_reference(*arrays):  # pragma: no cover - a schedule's view of an anchor is never run
    raise NotImplementedError("an anchor view has no reference")


__all__ = ["schedule_by_structure", "anchor_view"]
