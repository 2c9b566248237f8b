"""Convolution templates: conv2d_nchw, depthwise_conv2d_nchw, conv2d_nhwc.

The register-tile recipe of the default schedules (compiler/ops/schedule_conv.py) with its
choices as knobs; the first value of each knob follows the default schedule's choice, so config 0
is (close to) the default schedule:

NCHW / depthwise (vector over output columns x):
- tile_x: the vector length (multiples of 32 bytes up to 64 lanes, OW itself, or a divisor of
  OW of at least 16 bytes); tile_f, tile_y: unrolled output channels / rows of the tile;
- tile_rc (input channel loops longer than 8): the channel loop split, its inner part unrolled;
- order_red: the order of the reduction loops; unroll_red: unroll each short reduction loop;
- tile_order: channel blocks outermost ("fyx") or spatial tiles outermost ("yxf");
- vector_axis ("f" / "x", where a group's channels fill registers): channel vectors
  (schedule_conv_nchw_channels) or column vectors; pack_w: OIHW weights copied into
  [F/FB][C][KH][KW][FB] panels; block_input (0 or INPUT_BLOCK, channel vectors without groups):
  the (padded) input copied into [C/8][N][H][W][8] blocks, the channel loop split by 8 with its
  inner part innermost and unrolled (the default where the weights dominate);
- pad: the padding stage materialized at the root ("root"), inlined into the convolution
  ("inline"), or, for a column stride > 1, the input copied into column phases so the
  micro-kernel's loads stay unit-stride ("deinterleave");
- parallel: the fused tile loop in parallel, or not.

NHWC (vector over output channels f): tile_f (vector), tile_y / tile_x (unrolled), tile_rc,
order_red, unroll_red, f_outer (channel blocks outermost), pack_w (HWIO weights packed into
[F/FB][KH][KW][C][FB] panels), pad ("root" / "inline"), parallel.

Code size is bounded whatever the config: the tile axes are unrolled only while the tile has at
most MAX_UNROLLED_TILE vector statements (of the target's register width), the reduction loops
only while the unrolled step has at most MAX_UNROLLED_BODY (a config asking for more keeps those
loops rolled), so every config compiles in well under a second. Knob sets depend on the workload
only (see gemm.py); the defaults, first, are the default schedule's for the task's target.
"""

from __future__ import annotations

import itertools
import math

from compiler.dtypes import nbytes
from compiler.ops.schedule_common import PARALLEL_MIN_WORK, want_parallel
from compiler.ops.schedule_common import lanes as vector_lanes
from compiler.ops.schedule_conv import (
    INPUT_BLOCK,
    MAX_UNROLLED_STEP,
    block_input_channels,
    deinterleave_columns,
    pack_weight_panels,
    split_output_tile,
    unrolled_fits,
)
from compiler.schedule import create_schedule

from ..base import SpaceError
from ..template import template

MAX_LANES = 64
GRID_BYTES = 32  # vector-length knobs step by this, on every target (see _vector_choices)
MAX_UNROLLED_TAPS = 8
MAX_UNROLLED_TILE = 48   # vector statements of an unrolled register tile
MAX_UNROLLED_BODY = MAX_UNROLLED_STEP  # statements of an unrolled micro-kernel step (vector registers × loops),
                                       # the default schedules' bound, so config 0 unrolls what they unroll


def _first(default, values):
    return [default] + [v for v in values if v != default]


def _base(dtype) -> int:
    return max(4, GRID_BYTES // nbytes(dtype))


def _vector_choices(extent: int, base: int) -> list:
    """Vector lengths along an output axis: multiples of the grid up to 64 lanes (not past the
    axis), the axis itself if it fits, divisors of at least half a grid step, and the default
    schedule's choices for 128-, 256- and 512-bit registers (so the set does not depend on the
    target that defines the space)."""
    out = [base * m for m in range(1, MAX_LANES // base + 1) if base * (m - 1) < extent]
    if extent <= MAX_LANES:
        out.append(extent)
    out += [d for d in range(max(1, base // 2), base) if extent % d == 0]
    sc = _defaults()
    if sc is not None:
        for vl in (max(1, base // 2), base, 2 * base):
            out += [v for v in sc.vector_tiles(extent, vl) if v <= MAX_LANES]
    return sorted(set(out))


def _defaults():
    """The default schedule's tile heuristics, when the compiler has them (optional)."""
    try:
        from compiler.ops import schedule_conv as sc
        return sc
    except ImportError:  # pragma: no cover - the heuristics only order the knob values
        return None


def _pad_stage(s):
    return next((st for st in s.stages if st.op.name == "pad"), None)


def _parallel_knob(cfg, target, work):
    dflt = want_parallel(target, work)
    cfg.define_knob("parallel", [dflt, not dflt])


def _root_rows(stage, parallel: bool):
    """A root elementwise stage: outer axes fused (parallel when the knob says so and the stage
    is big enough), the row loop left to LLVM's vectorizer (explicit vectors of a padded read
    would be gathers). Only the knob and the workload decide: a config gives the same schedule
    on any host that instantiates it."""
    parallel = parallel and math.prod(stage.op.shape) >= PARALLEL_MIN_WORK
    *outer, _ = stage.op.axis
    if len(outer) > 1:
        loop = stage.fuse(*outer)
    elif outer:
        loop = outer[0]
    else:
        return
    if parallel and loop.extent > 1:
        stage.parallel(loop)


def _reduction_knobs(cfg, natural, default_perm=None):
    """Knobs of the reduction loops `natural` = [(name, extent)] in definition order:
    tile_rc (a long channel loop split, its inner part unrolled), order_red (the order of the
    reduction loops), unroll_red (unroll each loop of at most MAX_UNROLLED_TAPS iterations).
    The first values are the default schedule's: the loops in `default_perm` order (positions in
    the definition's; default: as defined), extent-1 loops unrolled, the innermost non-trivial
    loop unrolled when short, else split by 4 (a channel loop)."""
    ext = dict(natural)
    perm = list(default_perm) if default_perm is not None else list(range(len(natural)))
    inner = [natural[i][0] for i in perm if natural[i][1] > 1]
    last = inner[-1] if inner else None
    dflt_ann = ["unroll" if e == 1 or (n == last and e <= MAX_UNROLLED_TAPS) else "none" for n, e in natural]
    if "rc" in ext and ext["rc"] > MAX_UNROLLED_TAPS:
        kus = [1, 2, 4, 8]
        dflt_ku = 4 if last == "rc" and ext["rc"] % 4 == 0 else 1
        cfg.define_split("tile_rc", ext["rc"], policy="candidate", candidate=[[v] for v in _first(dflt_ku, kus)])
    perms = [list(q) for q in itertools.permutations(range(len(natural)))]
    cfg.define_reorder("order_red", len(natural), policy="candidate", candidate=_first(perm, perms))
    anns: list[list[str]] = [[]]
    for _, e in natural:
        choices = ("none", "unroll") if e <= MAX_UNROLLED_TAPS else ("none",)
        anns = [a + [c] for a in anns for c in choices]
    cfg.define_annotate("unroll_red", len(natural), policy="candidate", candidate=_first(dflt_ann, anns))


def _tile_reduction(cfg, cst, rest, tile_axes, red_block: int = 0):
    """Order the accumulator's loops [rest] [reduction loops in the chosen order] [tile axes];
    returns the reduction axes in definition order. `red_block`: the channel loop (the first)
    is split by this first, its outer part ordered in its place and its inner part innermost
    (an input copied in channel blocks: block_input); the returned channel axis is then the
    inner part."""
    rax = list(cst.op.reduce_axis)
    inner = []
    if red_block:
        rco, rci = cst.split(rax[0], factor=red_block)
        rax, inner = [rco] + rax[1:], [rci]
    ordered = [rax[p] for p in cfg["order_red"].perm]
    cst.reorder(*rest, *ordered, *inner, *tile_axes)
    return inner + rax[1:] if red_block else rax


def _annotate_reduction(cfg, cst, rax, tile_body: int, max_body: int = MAX_UNROLLED_BODY, blocked: bool = False):
    """Unroll the chosen reduction loops (extent-1 loops first, then innermost first) while the
    unrolled micro-kernel stays under `max_body` statements (`tile_body` per reduction
    step): a config asking for more gets the loops that fit, so every config compiles in
    reasonable time (a 3x3x8 window unrolled around a 20-row tile is seconds of LLVM time).
    `blocked`: rax[0] is the inner part of a channel loop split by block_input, unrolled where
    the default unrolls it (compiler.ops.schedule_conv.unrolled_fits)."""
    anns = cfg["unroll_red"].anns
    names = [ax.name for ax in rax]
    split_rc = 0
    if blocked:   # the inner part of a channel loop split by block_input: unrolled, after the short loops
        anns = ["none"] + list(anns[1:])
    elif "rc" in names and "tile_rc" in cfg.knobs:
        ku = cfg["tile_rc"].size[-1]
        if 1 < ku < rax[names.index("rc")].extent:
            split_rc = ku
    # the split channel loop's inner part is unrolled only while the step stays within bounds
    unroll_rc = split_rc > 0 and tile_body * split_rc <= max_body
    body = tile_body * (split_rc if unroll_rc else 1)
    order = cst.leaf_iter_vars
    flagged = [ax for ax, a in zip(rax, anns) if a == "unroll"]
    flagged.sort(key=lambda ax: (ax.extent != 1, -order.index(ax)))
    chosen = set()
    for ax in flagged:
        if body * ax.extent <= max_body:
            body *= ax.extent
            chosen.add(ax)
    for ax, _ in sorted(zip(rax, anns), key=lambda p: p[0].extent != 1):
        if ax in chosen:
            cst.unroll(ax)
    if blocked and unrolled_fits(tile_body, rax[0].extent):
        cst.unroll(rax[0])
    if split_rc:
        _, rci = cst.split(rax[names.index("rc")], factor=split_rc)
        if unroll_rc:
            cst.unroll(rci)


def _config_register_tile(s, out, cfg, unrolled, vec_dim, vec_factor, vl, outer_order, parallel, vec_group=0,
                          store_dim=None, max_body=MAX_UNROLLED_BODY, red_block: int = 0):
    """[n, outer tiles (fused, parallel)] [tile: unrolled axes, vector axis]; the reduction is
    computed at the fused tile loop into a local buffer laid out with the vector axis last:
    [reduction loops] [tile axes]. `vl`: the target's lanes, what one vector statement of the
    tile covers. `store_dim`: the axis the tile is stored along (default: the vector axis), as
    in compiler.ops.schedule_conv.register_tile. `red_block`: see _tile_reduction."""
    ndim = len(out.shape)
    layout = [d for d in range(ndim) if d != vec_dim] + [vec_dim]
    acc = s.cache_write(out, "local", order=layout) if layout != list(range(ndim)) else s.cache_write(out, "local")
    st, cst = s[out], s[acc]
    tile_dims, inner, outer_loops = split_output_tile(st, unrolled, vec_dim, vec_factor, outer_order, vec_group)
    store = vec_dim if store_dim is None else store_dim
    # the tile axes are unrolled (innermost first) while the tile stays under MAX_UNROLLED_TILE
    # vector statements: a bigger tile keeps loops, so it compiles in reasonable time (and runs
    # as slowly as its spilled accumulators deserve)
    body = -(-min(vec_factor, out.shape[vec_dim]) // vl)
    unroll_dims: list[int] = []
    for d, f in reversed(unrolled):
        f = min(f, out.shape[d])
        if body * f <= MAX_UNROLLED_TILE:
            body *= f
            unroll_dims.insert(0, d)
    stored_rows = [d for d in tile_dims if d != store]
    for d in stored_rows:
        if d in unroll_dims or d == vec_dim:
            st.unroll(inner[d])
    if store != vec_dim:   # store rows along the output's unit-stride axis
        st.reorder(*[inner[d] for d in stored_rows], inner[store])
    st.vectorize(inner[store])
    cax = [cst.op.axis[layout.index(d)] for d in range(ndim)]   # by the output's dimension
    rest = [cax[d] for d in range(ndim) if d not in tile_dims]
    rax = _tile_reduction(cfg, cst, rest, [cax[d] for d in tile_dims], red_block)
    for d in unroll_dims:
        cst.unroll(cax[d])
    cst.vectorize(cax[vec_dim])
    _annotate_reduction(cfg, cst, rax, body, max_body, blocked=bool(red_block))
    loop = outer_loops[0] if len(outer_loops) == 1 else st.fuse(*outer_loops)
    cst.compute_at(st, loop)
    if parallel and loop.extent > 1:
        st.parallel(loop)
    return cst


# ----------------------------------------------------------------------------- NCHW

def _conv_nchw(cfg, opdef, target):
    depthwise = opdef.name == "depthwise_conv2d_nchw"
    out = opdef.output
    s = create_schedule(out)
    N, F, OH, OW = out.shape
    p = opdef.params
    KH, KW = p["KH"], p["KW"]
    sw = p["stride"][1]
    groups = p.get("groups", 1)
    base = _base(out.dtype)
    lanes = vector_lanes(target, out.dtype)
    fpg = p.get("multiplier", 1) if depthwise else F // groups
    cpg = None if depthwise else opdef.inputs[1].shape[1]
    pad = _pad_stage(s)
    # channel vectors (schedule_conv_nchw_channels) are a choice where a group's channels fill
    # whole registers of the narrowest grid and its input channels (with the window: the RGB
    # stem) make a reduction as long: a condition on the workload alone, so the knob set does
    # not depend on the target
    channels_possible = cpg is not None and fpg % base == 0 and cpg * KH * KW >= base
    sc = _defaults()
    channels_first = bool(channels_possible and sc is not None and sc.channel_vectors_pay(opdef, target))
    natural = ([] if depthwise else [("rc", cpg)]) + [("ry", KH), ("rx", KW)]
    XB, FB, YB, f_first, red_perm, RB = base, 1, 1, True, None, 0
    if channels_first:
        FB, XB, YB = sc.channel_tile(opdef, target)
        f_first = sc.weights_dominate(opdef)
        shared = sc.taps_unrolled(opdef, FB // lanes, XB, YB, target.capabilities)
        RB = sc.input_channel_block(opdef, target, shared)
        if not shared or RB:
            red_perm = [1, 2, 0]
    elif sc is not None:
        taps = KW if KW <= MAX_UNROLLED_TAPS else 1
        XB, (FB, YB) = sc.pick_tile(sc.vector_tiles(OW, lanes), lanes,
                                     [(F, min(fpg, 16), True), (OH, 8, False)],
                                     lambda r, c: (c[0] + c[1] * r, c[1] * r * taps if c[0] > 1 else 1),
                                     target.capabilities)
        f_first = depthwise or sc.weights_dominate(opdef)
    if channels_possible:
        cfg.define_knob("vector_axis", ["f", "x"] if channels_first else ["x", "f"])
    # tile extents along x, f and y: vector lengths along the vector axis, unrolled counts along
    # the others (both kinds of values for x and f when either may be the vector axis)
    xs = _vector_choices(OW, base) + ([v for v in range(1, 9) if v <= OW] if channels_possible else [])
    fs = [v for v in (1, 2, 3, 4, 6, 8, 12, 16) if v <= F]
    if channels_possible:
        fs += [v for v in _vector_choices(fpg, base) if fpg % v == 0]
    for vals, dflt in ((xs, XB), (fs, FB)):
        if dflt not in vals and dflt <= MAX_LANES:
            vals.append(dflt)
    cfg.define_split("tile_x", OW, policy="candidate", candidate=[[v] for v in _first(XB, sorted(set(xs)))])
    cfg.define_split("tile_f", F, policy="candidate", candidate=[[v] for v in _first(FB, sorted(set(fs)))])
    ys = list(range(1, min(OH, 8) + 1))
    cfg.define_split("tile_y", OH, policy="candidate", candidate=[[v] for v in _first(YB, ys)])
    _reduction_knobs(cfg, natural, red_perm)
    cfg.define_knob("tile_order", ["fyx", "yxf"] if f_first else ["yxf", "fyx"])
    if pad is not None or sw > 1:
        modes = ["deinterleave", "root", "inline"] if sw > 1 else ["root", "inline"]
        if pad is None:
            modes = [m for m in modes if m != "inline" and m != "root"] + ["none"]
        if channels_first:  # strided columns are only other broadcast addresses: no copy
            modes = _first("root" if pad is not None else "none", modes)
    else:
        modes = ["none"]
    cfg.define_knob("pad", modes)
    if channels_possible:  # OIHW weights as [F/FB][C][KH][KW][FB] panels
        cfg.define_knob("pack_w", [channels_first, not channels_first])
    if channels_possible and cpg is not None and groups == 1 and cpg % INPUT_BLOCK == 0 and cpg > INPUT_BLOCK:
        # the (padded) input copied into channel blocks, the padding inside the copy (the pad
        # knob is then moot): schedule_conv.input_channel_block
        cfg.define_knob("block_input", [RB, INPUT_BLOCK - RB])
    _parallel_knob(cfg, target, opdef.flops)

    XB, FB, YB = cfg["tile_x"].size[-1], cfg["tile_f"].size[-1], cfg["tile_y"].size[-1]
    par = cfg["parallel"].val
    mode = cfg["pad"].val
    want_par = lambda work: par and work >= PARALLEL_MIN_WORK   # noqa: E731
    if channels_possible and cfg["vector_axis"].val == "f":
        # schedule_conv_nchw_channels: pad first, then the tile, the input copy, the packed weights
        rb = cfg["block_input"].val if "block_input" in cfg.knobs else 0
        if mode == "root" and not rb:
            _root_rows(pad, par)
        order = [1, 2, 3] if cfg["tile_order"].val == "fyx" else [2, 3, 1]
        acc = _config_register_tile(s, out, cfg, [(2, YB), (3, XB)], 1, FB, lanes, order, par,
                                    vec_group=fpg if groups > 1 else 0, store_dim=3,
                                    red_block=rb)
        if rb:
            block_input_channels(s, acc, opdef.inputs[0], rb, want_par)
        elif mode == "inline":
            pad.compute_inline()
        elif mode == "deinterleave":
            _deinterleave_columns(s, acc, opdef.inputs[0], sw, pad, par)
    else:
        order = [1, 2, 3] if cfg["tile_order"].val == "fyx" else [3, 2, 1]
        acc = _config_register_tile(s, out, cfg, [(1, FB), (2, YB)], 3, XB, lanes, order, par)
        if mode == "deinterleave":
            _deinterleave_columns(s, acc, opdef.inputs[0], sw, pad, par)
        elif mode == "root":
            _root_rows(pad, par)
        elif mode == "inline":
            pad.compute_inline()
    if channels_possible and cfg["pack_w"].val:
        pack_weight_panels(s, acc, opdef.inputs[1], FB, lanes, want_par)
    return s, opdef.tensors


def _deinterleave_columns(s, acc, data, sw, pad, parallel):
    _root_rows(deinterleave_columns(s, acc, data, sw, pad), parallel)


@template("conv2d_nchw", ops=("conv2d_nchw",))
def conv2d_nchw(cfg, opdef, target):
    if getattr(opdef, "name", None) != "conv2d_nchw":
        raise SpaceError(f"template 'conv2d_nchw' does not apply to {getattr(opdef, 'name', opdef)!r}")
    return _conv_nchw(cfg, opdef, target)


@template("depthwise_conv2d_nchw", ops=("depthwise_conv2d_nchw",))
def depthwise_conv2d_nchw(cfg, opdef, target):
    if getattr(opdef, "name", None) != "depthwise_conv2d_nchw":
        raise SpaceError(f"template 'depthwise_conv2d_nchw' does not apply to "
                         f"{getattr(opdef, 'name', opdef)!r}")
    return _conv_nchw(cfg, opdef, target)


# ----------------------------------------------------------------------------- NHWC

@template("conv2d_nhwc", ops=("conv2d_nhwc",))
def conv2d_nhwc(cfg, opdef, target):
    if getattr(opdef, "name", None) != "conv2d_nhwc":
        raise SpaceError(f"template 'conv2d_nhwc' does not apply to {getattr(opdef, 'name', opdef)!r}")
    out = opdef.output
    s = create_schedule(out)
    N, OH, OW, F = out.shape
    p = opdef.params
    KH, KW = p["KH"], p["KW"]
    groups = p.get("groups", 1)
    fpg = F // groups
    cpg = opdef.inputs[1].shape[2]
    base = _base(out.dtype)
    lanes = vector_lanes(target, out.dtype)
    pad = _pad_stage(s)
    vec_extent = fpg if groups > 1 else F
    sc = _defaults()
    FB, XB, YB, f_outer = base, 1, 1, False
    if sc is not None:
        FB, (XB, YB) = sc.pick_tile(sc.vector_tiles(vec_extent, lanes), lanes,
                                     [(OW, 8, True), (OH, 4, True)], lambda r, c: (c[0] * c[1] + r, r),
                                     target.capabilities)
        f_outer = sc.weights_dominate(opdef)
    fs = _vector_choices(vec_extent, base)
    if FB not in fs and FB <= MAX_LANES:
        fs.append(FB)
    cfg.define_split("tile_f", F, policy="candidate", candidate=[[v] for v in _first(FB, fs)])
    cfg.define_split("tile_x", OW, policy="candidate",
                     candidate=[[v] for v in _first(XB, range(1, min(OW, 8) + 1))])
    cfg.define_split("tile_y", OH, policy="candidate",
                     candidate=[[v] for v in _first(YB, range(1, min(OH, 4) + 1))])
    _reduction_knobs(cfg, [("ry", KH), ("rx", KW), ("rc", cpg)])
    cfg.define_knob("f_outer", [f_outer, not f_outer])
    cfg.define_knob("pack_w", [True, False])
    cfg.define_knob("pad", ["root", "inline"] if pad is not None else ["none"])
    _parallel_knob(cfg, target, opdef.flops)

    FB, XB, YB = cfg["tile_f"].size[-1], cfg["tile_x"].size[-1], cfg["tile_y"].size[-1]
    par = cfg["parallel"].val
    mode = cfg["pad"].val
    if mode == "root":
        _root_rows(pad, par)
    elif mode == "inline":
        pad.compute_inline()
    order = [3, 1, 2] if cfg["f_outer"].val else [1, 2, 3]
    acc = _config_register_tile(s, out, cfg, [(1, YB), (2, XB)], 3, FB, lanes, order, par,
                                vec_group=fpg if groups > 1 else 0)
    if cfg["pack_w"].val:
        packed = s[s.cache_read(opdef.inputs[1], "global", [acc], block={3: FB})]
        *rows, lane = packed.op.axis
        packed.vectorize(lane)
        loop = packed.fuse(*rows) if len(rows) > 1 else rows[0]
        if par and loop.extent > 1 and math.prod(packed.op.shape) >= PARALLEL_MIN_WORK:
            packed.parallel(loop)
    return s, opdef.tensors


__all__ = ["conv2d_nchw", "conv2d_nhwc", "depthwise_conv2d_nchw"]
