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
- one reduction as the output (a global average pool, a mean, a user's Aᵀ·B): schedule_reduce_stage;
- one reduction followed by elementwise stages of its shape (a user's matmul + bias, Q·Kᵀ·scale):
  the epilogue inlined into the output, tiled as the reduction alone would be, the reduction
  computed at the tile;
- the model operators schedule_graph_ops knows by their stages' tags (GroupNormalization,
  ConvTranspose with its epilogue): their schedules there;
- anything else (several reductions, RMSNorm's statistic then its rows): the elementwise stages
  inlined, every reduction computed whole at the root by schedule_reduce_stage, the output as an
  elementwise or reduction stage.
Elementwise producers are inlined into their readers, except padding of the last axis that a
reduction reads, which is materialized once (schedule_stages.inline_producers). A reduction is vectors of its
output's last axis (the accumulator tile) when every read is unit-stride along it or
independent of it, or can be made so by packing (`schedule_stages.vector_packing`: an
input the last axis walks along another of its axes, reused across another output axis, copied
into blocks of the vector as GEMM packs B), else interleaved scalar chains where its innermost
read is reduced, else vectors with gathers. This is the zero-trial schedule of a compute nobody
wrote a schedule for; the tuner's sketches start from it and do better.
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
from .schedule_common import lanes
from .schedule_conv_nchwc import conv2d_nchwc_choices, schedule_conv_nchwc
from .schedule_conv_plane import conv2d_nchw_recipe_choices, schedule_conv_nchw_default, schedule_conv_nchw_recipe
from .schedule_elementwise import accumulator_tile, schedule_injective_stage, schedule_reduce_stage
from .schedule_gemm import gemm_tile, gemv_lanes, gemv_panel_columns, schedule_gemm, schedule_gemv
from .schedule_graph_ops import schedule_tagged
from .schedule_rules import rule_choices, rule_of, schedule_by_rule
from .schedule_stages import chains_not_vectors, inline_producers, reduced_input_shape, schedule_stages_at_root, vector_packing
from .schedule_tile import tile_axes, tile_choices, tile_group
from .schedule_winograd import is_winograd_gemm, schedule_winograd_gemm, winograd_gemm_choices

CONV_TAGS = ("conv2d_nchw", "conv2d_nchw_packed", "conv2d_nchwc")
GEMM_TAGS = ("dense", "matmul", "batch_matmul")


def schedule_by_structure(opdef, target=None) -> Schedule:
    target = resolve_target(target)
    tagged = schedule_tagged(opdef, target)
    if tagged is not None:
        return tagged
    ruled = schedule_by_rule(opdef, target)   # rules for any DAG: stride phases, row fusion
    if ruled is not None:
        return ruled
    return _by_structure(opdef, target)


def _by_structure(opdef, target, tile=None) -> Schedule:
    """schedule_by_structure past the tagged operators and the rules; `tile`: (mr, nr) of the
    register tile of a two-operand reduction (schedule_tile), product_tile's by default."""
    out = opdef.output
    computes = [op for op in topo_order([out]) if isinstance(op, ComputeOp)]
    reductions = [op for op in computes if op.reduce_axis]
    if len(reductions) == 1:
        view = anchor_view(opdef)
        if view is not None:
            if view.name == "conv2d_nchw":
                return _conv_with_epilogue(schedule_conv_nchw_default, view, opdef, target)
            if view.name == "conv2d_nchwc":
                return _conv_with_epilogue(schedule_conv_nchwc, view, opdef, target)
            kind, arg = product_schedule(view, target)
            if kind == "gemv":
                return schedule_gemv(view, target, lanes=arg)
            return schedule_gemm(view, target, pack=arg)
    if not reductions:
        s = create_schedule(out)
        for st in s.stages:
            if isinstance(st.op, ComputeOp) and st.op is not out.op:
                st.compute_inline()
        schedule_injective_stage(s[out], target)
        return s
    if len(reductions) == 1 and reductions[0] is out.op:
        s = create_schedule(out)
        inline_producers(s, out.op, target)
        if any(a.extent > 1 for a in out.op.axis):
            schedule_reduce_stage(s[out], reduced_input_shape(out.op), chains_not_vectors(out.op), target,
                                  pack=vector_packing(out.op) or (), tile=_forced(out.op, tile))
        return s
    if len(reductions) == 1 and _is_epilogue_of(out.op, reductions[0], computes):
        return _reduction_with_epilogue(out, reductions[0], target, tile=_forced(reductions[0], tile))
    join = joined_reductions(computes, reductions)
    if join is not None:
        return _joined_reductions(out, join, reductions, target, tile=_forced(reductions[0], tile))
    return _stages_at_root(out, computes, target)


def _forced(op, tile):
    """accumulator_tile's `tile` for a chosen (mr, nr), None for product_tile's own."""
    if tile is None:
        return None
    pos = tile_axes(op)
    if pos is None:
        raise ScheduleError(f"{op.name}: no register tile of two operands to choose")
    return pos, int(tile[0]), int(tile[1])


def product_tile_choices(opdef, target=None) -> dict | None:
    """{"tile": [(mr, nr), ...], the default first} when the DAG's structural default tiles a
    two-operand reduction (one reduction, alone or with an elementwise epilogue, or several
    joined; no anchor of the inventory's), else None: the recipe sketch's knob for such DAGs."""
    target = resolve_target(target)
    out = opdef.output
    computes = [op for op in topo_order([out]) if isinstance(op, ComputeOp)]
    reductions = [op for op in computes if op.reduce_axis]
    if not reductions or (len(reductions) == 1 and anchor_view(opdef) is not None):
        return None
    red = reductions[0]
    single = len(reductions) == 1 and (red is out.op or _is_epilogue_of(out.op, red, computes))
    if not single and joined_reductions(computes, reductions) is None:
        return None
    if single and chains_not_vectors(red) or tile_axes(red) is None:
        return None
    pos = tile_axes(red)
    caps = target.capabilities
    tiles = tile_choices(red.axis[pos].extent, red.axis[-1].extent, lanes(target, red.dtype),
                         caps.vector_registers, caps.fmas_per_cycle, tile_group(red))
    return {"tile": [list(t) for t in tiles[:6]]}


def joined_reductions(computes, reductions):
    """The elementwise stage that joins several two-operand reductions of one output space (an
    LSTM's x·Wx + h·Wh + b; any sum or other combination of such reductions, each read only
    there and at its own point), when their product tiles (schedule_tile) agree; else None."""
    if len(reductions) < 2:
        return None
    shape = tuple(reductions[0].shape)
    plans = {tile_axes(r) for r in reductions}
    if any(tuple(r.shape) != shape for r in reductions) or len(plans) != 1 or None in plans:
        return None
    if any(vector_packing(r) is None for r in reductions):
        return None
    ids = {id(r) for r in reductions}
    for e in computes:
        if e.reduce_axis or tuple(e.shape) != shape:
            continue
        own = [a.var for a in e.axis]
        reads = [n for n in walk(e.body) if isinstance(n, TensorRead) and id(n.tensor.op) in ids]
        if {id(n.tensor.op) for n in reads} != ids or any(list(n.indices) != own for n in reads):
            continue
        if any(id(t.op) in ids for c in computes if c is not e for t in c.input_tensors()):
            continue
        return e
    return None


def _joined_reductions(out, join, reductions, target, tile=None) -> Schedule:
    """Reductions of one output space joined by an elementwise stage: the join tiled by the
    reductions' register tile, every reduction computed at that tile into its accumulators, one
    after the other (accumulator_tile with several accumulator stages), so the join reads two
    tiles from registers and L1, never a whole product from memory; the stages after the join
    (an LSTM's gates, reading it at column offsets) inlined into the output, elementwise. A
    user's LSTM cell (batch 64, 256 -> 4 x 256) 7.5 ms -> 0.76 ms (torch 0.97; znver2)."""
    s = create_schedule(out)
    ids = {id(r) for r in reductions} | {id(join)}
    inline_producers(s, out.op, target, keep=lambda op: id(op) in ids)
    jst = s[join.output]
    pack: list = []
    for r in reductions:
        for p in vector_packing(r) or []:
            if p not in pack:
                pack.append(p)
    spatial = [a for a in jst.op.axis if a.extent > 1]
    accumulator_tile(jst, spatial, target, math.prod(join.shape), acc_stage=[s[r.output] for r in reductions],
                     pack=pack, tile=tile)
    if join is not out.op:
        schedule_injective_stage(s[out], target)
    return s


def product_schedule(view, target) -> tuple:
    """How the default schedules a matrix product's anchor view: ("gemv", lanes) for one output
    row streamed (schedule_gemv), else ("gemm", pack): schedule_gemm, copying B into panels on
    every call or not (B came prepacked, or one row tile uses each panel)."""
    row_lanes = _one_row(view, target)
    if row_lanes:
        return "gemv", row_lanes
    prepacked = "weight_block" in view.params   # B came in the panels packing makes
    return "gemm", not prepacked and _packing_pays(view, target)


def product_schedule_kind(opdef, target=None) -> str | None:
    """The default schedule's kind for a DAG with a matrix product, None for one without:
    "gemv", "gemm" (B packed every call), "gemm-prepacked" (B came in the panels),
    "gemm-inplace" (B read where it is), each "batched-" when the product has a batch of
    matrices; "generic" when the product is not an anchor the GEMM schedules take (the
    structural fallback: no register tile of the GEMM's). What tests and benchmarks assert on."""
    target = resolve_target(target)
    computes = [op for op in topo_order([opdef.output]) if isinstance(op, ComputeOp)]
    if not any(op.reduce_axis and op.tag in GEMM_TAGS for op in computes):
        return None
    view = anchor_view(opdef)
    if view is None or view.name not in ("matmul", "dense") or schedule_tagged(opdef, target) is not None:
        return "generic"
    kind, arg = product_schedule(view, target)
    if kind == "gemm":
        kind = "gemm-prepacked" if "weight_block" in view.params else "gemm" if arg else "gemm-inplace"
    *batch, _, _ = view.output.shape
    return ("batched-" if math.prod(batch) > 1 else "") + kind


def _reduction_with_epilogue(out, red, target, tile=None) -> Schedule:
    """One reduction and elementwise stages after it of its shape (a bias, a scale, an
    activation): the epilogue inlined into the output, which is tiled as the reduction alone
    would be, the reduction computed at its tile; where the reduction makes serial chains (its
    innermost read reduced), the reduction at the root and the output elementwise."""
    s = create_schedule(out)
    inline_producers(s, out.op, target, keep=red)
    if not any(a.extent > 1 for a in out.op.axis):
        return s
    work = math.prod(reduced_input_shape(red))
    if chains_not_vectors(red):
        schedule_reduce_stage(s[red.output], reduced_input_shape(red), True, target)
        schedule_injective_stage(s[out], target)
        return s
    spatial = [a for a in out.op.axis if a.extent > 1]
    accumulator_tile(s[out], spatial, target, work, acc_stage=s[red.output], pack=vector_packing(red) or (), tile=tile)
    return s


def _stages_at_root(out, computes, target) -> Schedule:
    """Any other DAG of reductions and elementwise stages: the elementwise stages inlined into
    their readers, each reduction computed whole at the root with schedule_reduce_stage, the
    output scheduled as what it is (RMSNorm: the sum of squares per row, then the scaled rows).
    Not the best schedule, but vectors, chains and threads everywhere instead of the naive nest."""
    return schedule_stages_at_root(create_schedule(out), out, target)


def _is_epilogue_of(out_op, red, computes) -> bool:
    """Whether every compute but `red` is elementwise after it at its shape: each reads `red`
    only at its own output point, and the output has red's shape."""
    if tuple(out_op.shape) != tuple(red.shape):
        return False
    for op in computes:
        if op is red:
            continue
        if tuple(op.shape) != tuple(red.shape) and any(t.op is red for t in op.input_tensors()):
            return False
        own = [a.var for a in op.axis]
        for n in walk(op.body):
            if isinstance(n, TensorRead) and n.tensor.op is red and list(n.indices) != own:
                return False
    return True


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
    mr, _ = gemm_tile(M, N, lanes, target.capabilities.vector_registers,
                      fmas_per_cycle=target.capabilities.fmas_per_cycle)
    return math.prod(batch) * M > mr


# Anchors whose default schedule takes the tuner's choices as arguments: the view's name ->
# (its choices: {knob: values, the default first}, the schedule function taking them).
RECIPES = {"conv2d_nchwc": (conv2d_nchwc_choices, schedule_conv_nchwc),
           "conv2d_nchw": (conv2d_nchw_recipe_choices, schedule_conv_nchw_recipe)}


def anchor_recipe_choices(opdef, target=None) -> dict | None:
    """The knobs of the default schedule of `opdef`'s anchor (RECIPES), each with its values,
    the default first; None when the DAG's default is not such a recipe. The tuner samples them
    (tuner/space/sketch/recipe.py), so a search starts where the default is, not from scratch."""
    target = resolve_target(target)
    if is_winograd_gemm(opdef):
        return winograd_gemm_choices(opdef, target)
    if schedule_tagged(opdef, target) is not None:
        return None
    view = anchor_view(opdef)
    if view is None or view.name not in RECIPES:
        ruled = rule_choices(opdef, target)   # a rule for any DAG (schedule_rules), or None
        return ruled if ruled is not None or rule_of(opdef) is not None else product_tile_choices(opdef, target)
    return RECIPES[view.name][0](view, target)


def schedule_anchor_recipe(opdef, target, choices: dict) -> Schedule:
    """The default schedule of `opdef` with `choices` (a value per knob of anchor_recipe_choices)
    for its anchor; ScheduleError when they make a schedule that does not lower."""
    target = resolve_target(target)
    if is_winograd_gemm(opdef):
        return schedule_winograd_gemm(opdef, target, **choices)
    view = anchor_view(opdef)
    if view is None or view.name not in RECIPES:
        if rule_of(opdef) is None and set(choices) == {"tile"} and product_tile_choices(opdef, target):
            return _by_structure(opdef, target, tile=choices["tile"])
        ruled = schedule_by_rule(opdef, target, choices)
        if ruled is None:
            raise ScheduleError(f"{opdef.name}: its default schedule takes no choices")
        return ruled
    return _conv_with_epilogue(RECIPES[view.name][1], view, opdef, target, choices=choices)


def _conv_with_epilogue(schedule_conv, view, opdef, target, choices: dict | None = None) -> Schedule:
    """The convolution's tiles stored through the epilogue; when that makes more unrolled code
    than the lowering allows (a 4 x 7 tile of a 7x7 layer with a residual add and relu came to
    16.5k nodes against the 16k cap), the tile is stored into the convolution's output and the
    epilogue runs as a second pass; when even that is too much (the model fuzzer's dilated 7x7
    depthwise layer with a broadcast add: 17.2k), the plain loop nest (correct, slow; tuning
    finds better)."""
    out = opdef.output
    variants = [{}] if view.output is out else [{"epilogue": out}, {"epilogue": out, "fuse_epilogue": False}]
    error = None
    for kw in variants:
        s = schedule_conv(view, target, **kw, **(choices or {}))
        try:
            lower(s, opdef.tensors)
            return s
        except ScheduleError as e:
            error = e
    if choices is not None:
        raise ScheduleError(f"{opdef.name}: the choices {choices} make no schedule that lowers: {error}")
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


def _no_reference(*arrays):  # pragma: no cover - a schedule's view of an anchor is never run
    raise NotImplementedError("an anchor view has no reference")


__all__ = ["schedule_by_structure", "anchor_view", "product_tile_choices", "joined_reductions",
           "product_schedule", "product_schedule_kind", "anchor_recipe_choices",
           "schedule_anchor_recipe", "RECIPES"]
