"""Operators as tensor functions (like TVM's TOPI): Tensors in, a Tensor out, composable.

    y = relu(bias_add(conv2d_nchw(x, w, stride=2, padding=1), b))

The inventory's OpDefs (conv.py, matmul.py, elementwise.py) are built from these functions: an
OpDef adds parameter checks named after the operator, an exact numpy reference and a flop count
around a composition of them. A user's compute file composes them the same way.

Each function checks that its tensors fit together (ranks, channels, dtypes) and raises
ExprError naming the function, and adds one stage (a convolution with padding adds two: "pad",
then the convolution). `name` names that stage: default schedules, templates and sketch
parameters find stages by name, so the defaults are the names the inventory's stages have.
`bias_add(..., activation=...)` applies bias and activation in one stage, the epilogue form
that a GEMM or convolution schedule fuses into its register tile.
"""

from __future__ import annotations

import numpy as np

from .. import expr as E
from ..dtypes import is_int
from ..errors import ExprError
from ..tensor import Tensor, compute, reduce_axis
from ..tensor import sum as te_sum
from .base import (
    FLOAT,
    NUMERIC,
    check_axis,
    check_dtype_for,
    check_int,
    check_padding,
    check_pair,
    conv_out_size,
    window_index,
)
from .transform import pad_tensor

CONV_DTYPES = ("float32", "float64", "int8")
MATMUL_DTYPES = ("float32", "float64", "int8", "int32")
ACTIVATIONS = {"none": lambda v: v, "relu": lambda v: E.maximum(v, 0), "gelu": E.gelu}


# ----------------------------------------------------------------------------- checks shared with the OpDefs

def conv_geometry(op, H, W, KH, KW, stride, padding, dilation) -> tuple:
    """(stride, pads (top, left, bottom, right), dilation, OH, OW) of a 2-d window."""
    sh, sw = check_pair(op, "stride", stride)
    dh, dw = check_pair(op, "dilation", dilation)
    pads = check_padding(op, padding)
    OH = conv_out_size(op, "height", H, KH, sh, pads[0] + pads[2], dh)
    OW = conv_out_size(op, "width", W, KW, sw, pads[1] + pads[3], dw)
    return (sh, sw), pads, (dh, dw), OH, OW


def check_groups(op, C, F, groups) -> int:
    groups = check_int(op, "groups", groups)
    if C % groups or F % groups:
        raise ExprError(f"{op}: groups={groups} must divide both input channels C={C} and filters F={F}")
    return groups


def acc_dtype(op, dtype, out_dtype=None) -> str:
    """The output dtype of a product: int8 accumulates into int32 (an int8 sum would overflow
    after a few terms); an explicit out_dtype must be of the same kind as the inputs."""
    if out_dtype is None:
        out_dtype = "int32" if dtype == "int8" else dtype
    out_dtype = check_dtype_for(op, out_dtype, ("float32", "float64", "int32", "int64"), "out_dtype")
    if is_int(dtype) != is_int(out_dtype):
        raise ExprError(f"{op}: out_dtype {out_dtype} must be an {'int' if is_int(dtype) else 'float'} "
                        f"type for {dtype} inputs")
    return out_dtype


def broadcast_shape(op, shape_a, shape_b) -> tuple:
    try:
        return tuple(int(s) for s in np.broadcast_shapes(shape_a, shape_b))
    except ValueError:
        raise ExprError(f"{op}: shapes {shape_a} and {shape_b} cannot be broadcast together") from None


def _tensor(op, what, t, ndim=None):
    if not isinstance(t, Tensor):
        raise ExprError(f"{op}: {what} must be a Tensor, got {type(t).__name__}")
    if ndim is not None and t.ndim != ndim:
        raise ExprError(f"{op}: {what} must be {ndim}-d, got shape {t.shape}")


def _dtype(op, tensors, allowed) -> str:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        raise ExprError(f"{op}: {' and '.join(t.name for t in tensors)} have different dtypes "
                        f"({', '.join(t.dtype for t in tensors)}); cast one first")
    return check_dtype_for(op, dtypes.pop(), allowed)


def _channel_check(op, what, got, want, why=""):
    if got != want:
        raise ExprError(f"{op}: {what} is {got}, expected {want}{why}")


# ----------------------------------------------------------------------------- convolutions

def _mul(a, b, out_dtype):
    return a.astype(out_dtype) * b.astype(out_dtype)


def _group_channel(f, rc, C, F, groups):
    """Input channel read for output channel f: (f // (F/groups)) * (C/groups) + rc."""
    if groups == 1:
        return rc.var
    fpg, cpg = F // groups, C // groups
    g = f if fpg == 1 else f // fpg
    return g * cpg + rc.var if cpg != 1 else g + rc.var


def conv2d_nchw(data, weight, stride=1, padding=0, dilation=1, groups=1, name="conv2d_nchw") -> Tensor:
    """out[n,f,y,x] = Σ data[n, c, y·sh + ry·dh - pt, x·sw + rx·dw - pl] · weight[f, c', ry, rx];
    data [N, C, H, W], weight [F, C/groups, KH, KW]; int8 accumulates into int32."""
    op = "conv2d_nchw"
    _tensor(op, "weight", weight, 4)
    F, cpg, KH, KW = weight.shape
    return _conv_nchw(op, data, weight, F, cpg, KH, KW, lambda f, rc, ry, rx: weight[f, rc, ry, rx],
                      stride, padding, dilation, groups, name, {})


def conv2d_nchw_packed(data, weight, stride=1, padding=0, dilation=1, groups=1, name="conv2d_nchw") -> Tensor:
    """conv2d_nchw over weights laid out in blocks of FB output channels, [F/FB, C/groups, KH,
    KW, FB] (weight[f // FB, c, ry, rx, f % FB]): the layout the channel-vector schedule packs
    the OIHW weights into on every call, done once instead for a model's constant weights."""
    op = "conv2d_nchw_packed"
    _tensor(op, "weight", weight, 5)
    FO, cpg, KH, KW, FB = weight.shape

    def read(f, rc, ry, rx):
        return weight[(f // FB, rc, ry, rx, f % FB) if FO > 1 else (0, rc, ry, rx, f)]
    return _conv_nchw(op, data, weight, FO * FB, cpg, KH, KW, read, stride, padding, dilation, groups, name,
                      {"weight_block": FB})


def _conv_nchw(op, data, weight, F, cpg, KH, KW, weight_at, stride, padding, dilation, groups, name,
               extra_attrs) -> Tensor:
    """The NCHW convolution of both weight layouts: `weight_at(f, rc, ry, rx)` reads one weight."""
    _tensor(op, "data", data, 4)
    out_dtype = acc_dtype(op, _dtype(op, [data, weight], CONV_DTYPES))
    N, C, H, W = data.shape
    groups = check_groups(op, C, F, groups)
    _channel_check(op, "weight.shape[1] (input channels per group)", cpg, C // groups, f" (C={C} / groups={groups})")
    stride, pads, dil, OH, OW = conv_geometry(op, H, W, KH, KW, stride, padding, dilation)
    padded = pad_tensor(data, (0, 0, pads[0], pads[1]), (0, 0, pads[2], pads[3])) if any(pads) else data
    rc, ry, rx = reduce_axis(cpg, "rc"), reduce_axis(KH, "ry"), reduce_axis(KW, "rx")

    def body(n, f, y, x):
        v = padded[n, _group_channel(f, rc, C, F, groups), window_index(y, stride[0], ry, dil[0]),
                   window_index(x, stride[1], rx, dil[1])]
        return te_sum(_mul(v, weight_at(f, rc, ry, rx), out_dtype), axis=[rc, ry, rx])

    attrs = dict(layout="NCHW", stride=stride, padding=pads, dilation=dil, groups=groups, **extra_attrs)
    return compute((N, F, OH, OW), body, name=name, tag=op, attrs=attrs)


def group_window_span(fo, block: int, fpg: int, cpg: int, groups: int) -> tuple:
    """(first input channel, channels from it) of output block `fo`'s window in a grouped
    convolution whose groups split channel blocks (conv2d_nchwc's `group_window`): the input
    channels of the groups of the block's lanes, which are consecutive groups. `fo` is an index
    expression or an int; a padded last block's lanes past the last group take that group."""
    g_lo = fo * block // fpg
    g_hi = (fo * block + block - 1) // fpg
    g_hi = min(g_hi, groups - 1) if isinstance(fo, int) else E.minimum(g_hi, groups - 1)
    return g_lo * cpg, (g_hi - g_lo + 1) * cpg


def group_window_channels(F: int, block: int, cpg: int, groups: int) -> int:
    """Input channels the widest block's groups hold: the steps every block's reduction has,
    those past its own span skipped."""
    return max(group_window_span(fo, block, F // groups, cpg, groups)[1] for fo in range(-(-F // block)))


def group_window_unit(cpg: int) -> int:
    """Input channels per step of a group window's reduction: 2 where a group's channels are even
    (each window is whole steps), else 1; the step is unrolled, and its index arithmetic (a
    channel's block and lane) is repeated per channel and column of the tile."""
    return 2 if cpg % 2 == 0 else 1


def conv2d_nchwc(data, weight, stride=1, padding=0, dilation=1, depthwise=False, name="conv2d_nchwc",
                 group_window: tuple | None = None) -> Tensor:
    """A convolution in the channel-blocked layout the libraries compute in (NCHWc): the output
    is [N, F/FB, OH, OW, FB] (channel f at [f // FB, ..., f % FB]) and the data is either blocked
    too, [N, C/CB, H, W, CB], or plain NCHW [N, C, H, W] (a network's first convolution, whose 3
    channels make no block). A register tile's channel vector then loads and stores whole lines,
    and the input of the next convolution needs no copy into blocks: what the channel-vector NCHW
    schedules spend per layer on transposing copies. `depthwise`: one filter per channel (F = C,
    FB = CB). Blocked data may be read in groups (weights of C/groups input channels, each
    group's input and output channels whole blocks, as onnxruntime's NCHWc takes them): output
    block fo reads the input blocks of its group. Groups that split blocks (ShuffleNet's 4 groups
    of 34 channels in blocks of 16) take `group_window` = (output, input channels per group,
    groups) and weights [F/FB, steps, KH, KW, U, FB]: output block fo reduces over the input
    channels of its lanes' groups, group_window_span(fo), U channels a step, each channel read
    where it lies in the blocked data, the weights zero outside each lane's own group
    (pack_group_window_weight); steps past the block's span are skipped. A block of one group
    reads that group's channels and no more; one that straddles two reads both. A model's
    channels are padded to whole blocks with zero weights
    (compiler.graph.layout).

    The weights are blocked as the reduction walks them (pack_conv_weight_nchwc): for blocked
    data [F/FB, C/CB, KH, KW, CB, FB] (oneDNN's OIhw8i8o), so that consecutive steps of the
    reduction (input channel blocks, taps, then the block's channels) read consecutive weight
    vectors; for NCHW data or a depthwise convolution [F/FB, C or 1, KH, KW, FB]. With the
    input channels outermost in a 5-d [F/FB, C, KH, KW, FB] instead, each step of the innermost
    channel loop jumped KH·KW vectors: a 12-accumulator tile on Zen 3 ran at half speed (78
    against 151 GFLOPS), every weight load a new cache line."""
    op = "conv2d_nchwc"
    _tensor(op, "weight", weight)
    if data.ndim not in (4, 5):
        raise ExprError(f"{op}: data must be [N, C, H, W] or [N, C/CB, H, W, CB], got shape {data.shape}")
    out_dtype = acc_dtype(op, _dtype(op, [data, weight], CONV_DTYPES))
    blocked = data.ndim == 5
    N, H, W = data.shape[0], data.shape[2], data.shape[3]
    CB = data.shape[4] if blocked else 1
    C = data.shape[1] * CB
    dense_blocked = blocked and not depthwise
    if weight.ndim != (6 if dense_blocked else 5) or (dense_blocked and group_window is None and weight.shape[4] != CB):
        want = ("[F/FB, C/CB, KH, KW, CB, FB] with CB = the data's block" if dense_blocked
                else "[F/FB, C or 1, KH, KW, FB]")
        raise ExprError(f"{op}: weights for {'blocked' if blocked else 'NCHW'} data must be {want}, "
                        f"got shape {weight.shape}")
    FO, cpg, KH, KW, FB = nchwc_weight_geometry(weight.shape)
    if depthwise:
        if not blocked or CB != FB or data.shape[1] != FO or cpg != 1:
            raise ExprError(f"{op}: a depthwise convolution takes [N, C/B, H, W, B] data and [C/B, 1, KH, KW, B] "
                            f"weights, got {data.shape} and {weight.shape}")
        groups = FO
    elif group_window is not None:
        if not blocked or len(group_window) != 3:
            raise ExprError(f"{op}: a group window (output, input channels per group, groups) reads blocked data, "
                            f"got {group_window} for data of shape {data.shape}")
        fpg_w, cpg_w, groups_w = (int(v) for v in group_window)
        unit, steps = weight.shape[4], weight.shape[1]
        if (cpg_w * groups_w > C or fpg_w * groups_w > FO * FB or fpg_w * groups_w <= (FO - 1) * FB
                or cpg_w % unit or steps * unit != group_window_channels(fpg_w * groups_w, FB, cpg_w, groups_w)):
            raise ExprError(f"{op}: a group window of {groups_w} groups of {cpg_w} input and {fpg_w} output channels "
                            f"needs data of at least {cpg_w * groups_w} channels and weights [F/FB, steps, KH, KW, U, FB] "
                            f"with U dividing {cpg_w} and steps * U the widest block's channels; got data {data.shape}, "
                            f"weights {weight.shape}")
        groups = 0
    elif blocked and cpg != C:   # grouped: each group's input and output channels are whole blocks
        if cpg <= 0 or C % cpg or (C // cpg) < 2 or FO % (C // cpg):
            raise ExprError(f"{op}: weights read {cpg} input channels of {C}, which is neither all of them nor "
                            f"whole groups of them, with the {FO} output blocks split evenly among the groups")
        groups = C // cpg
    else:
        _channel_check(op, "weight.shape[1] (input channels)", cpg, C)
        groups = 1
    stride, pads, dil, OH, OW = conv_geometry(op, H, W, KH, KW, stride, padding, dilation)
    before, after = (0, 0, pads[0], pads[1]), (0, 0, pads[2], pads[3])
    padded = (pad_tensor(data, before + (0,) * blocked, after + (0,) * blocked) if any(pads) else data)
    ry, rx = reduce_axis(KH, "ry"), reduce_axis(KW, "rx")

    def at(y, x):
        return window_index(y, stride[0], ry, dil[0]), window_index(x, stride[1], rx, dil[1])

    if depthwise:
        def body(n, fo, y, x, fi):
            v = padded[(n, fo, *at(y, x), fi)]
            return te_sum(_mul(v, weight[fo, 0, ry, rx, fi], out_dtype), axis=[ry, rx])
    elif blocked:
        rco, rci = reduce_axis(weight.shape[1], "rco"), reduce_axis(weight.shape[4], "rci")
        out_blocks, in_blocks = (FO // groups, cpg // CB) if groups else (0, 0)   # per group

        def body(n, fo, y, x, fi):
            where = None
            if group_window is not None:
                first, span = group_window_span(fo, FB, fpg_w, cpg_w, groups_w)
                # the steps past the span are skipped; clamped, their reads stay inside the data
                channel = E.minimum(first + rco.var * weight.shape[4] + rci.var, cpg_w * groups_w - 1)
                v = padded[(n, channel // CB, *at(y, x), channel % CB)]
                where = rco.var < span // weight.shape[4]
            else:
                block = rco.var if groups == 1 else fo // out_blocks * in_blocks + rco.var
                v = padded[(n, block, *at(y, x), rci.var)]
            return te_sum(_mul(v, weight[fo, rco.var, ry, rx, rci.var, fi], out_dtype), axis=[rco, ry, rx, rci],
                          where=where)
    else:
        rc = reduce_axis(C, "rc")

        def body(n, fo, y, x, fi):
            v = padded[(n, rc.var, *at(y, x))]
            return te_sum(_mul(v, weight[fo, rc.var, ry, rx, fi], out_dtype), axis=[rc, ry, rx])

    attrs = dict(layout="NCHWc", stride=stride, padding=pads, dilation=dil, depthwise=bool(depthwise),
                 block=FB, data_block=CB if blocked else 0, groups=groups)
    if group_window is not None:
        attrs["group_window"] = tuple(int(v) for v in group_window)
    return compute((N, FO, OH, OW, FB), body, name=name, tag=op, attrs=attrs)


def pack_conv_weight(weight: np.ndarray, block: int) -> np.ndarray:
    """OIHW weights [F, C, KH, KW] as conv2d_nchw_packed reads them, [F/block, C, KH, KW, block]."""
    F, C, KH, KW = weight.shape
    return np.ascontiguousarray(weight.reshape(F // block, block, C, KH, KW).transpose(0, 2, 3, 4, 1))


def nchwc_weight_geometry(shape: tuple) -> tuple:
    """(F/FB, input channels each output reads, KH, KW, FB) of conv2d_nchwc weights in either
    layout: [F/FB, C/CB, KH, KW, CB, FB] or [F/FB, C or 1, KH, KW, FB]."""
    if len(shape) == 6:
        FO, CO, KH, KW, CB, FB = shape
        return FO, CO * CB, KH, KW, FB
    return tuple(shape)


def pack_conv_weight_nchwc(weight: np.ndarray, block: int, in_block: int = 0) -> np.ndarray:
    """OIHW weights [F, C, KH, KW] as conv2d_nchwc reads them: [F/block, C/in_block, KH, KW,
    in_block, block] for data blocked by `in_block` channels (a dense convolution), else
    [F/block, C, KH, KW, block] (NCHW data, or a depthwise convolution's [C/block, 1, KH, KW, block])."""
    if not in_block:
        return pack_conv_weight(weight, block)
    F, C, KH, KW = weight.shape
    return np.ascontiguousarray(weight.reshape(F // block, block, C // in_block, in_block, KH, KW)
                                .transpose(0, 2, 4, 5, 3, 1))


def pack_group_window_weight(weight: np.ndarray, groups: int, block: int) -> np.ndarray:
    """Grouped OIHW weights [F, C/groups, KH, KW] as conv2d_nchwc's `group_window` reads them:
    [ceil(F/block), steps, KH, KW, U, block], U = group_window_unit, each output block's steps
    walking its group_window_span; each lane's weights at its own group's channels, zero at the
    other groups' channels and past the block's span (and in padding lanes)."""
    F, cpg, KH, KW = weight.shape
    fpg, unit = F // groups, group_window_unit(cpg)
    FO, window = -(-F // block), group_window_channels(F, block, cpg, groups)
    steps = window // unit
    full = np.zeros((FO, block, window, KH, KW), weight.dtype)
    for f in range(F):
        fo, lane = divmod(f, block)
        at = (f // fpg) * cpg - group_window_span(fo, block, fpg, cpg, groups)[0]   # the lane's group
        full[fo, lane, at:at + cpg] = weight[f]
    return np.ascontiguousarray(full.reshape(FO, block, steps, unit, KH, KW).transpose(0, 2, 4, 5, 3, 1))


def conv2d_nhwc(data, weight, stride=1, padding=0, dilation=1, groups=1, name="conv2d_nhwc") -> Tensor:
    """NHWC data [N, H, W, C], HWIO weight [KH, KW, C/groups, F], NHWC output; int8 accumulates
    into int32."""
    op = "conv2d_nhwc"
    _tensor(op, "data", data, 4)
    _tensor(op, "weight", weight, 4)
    out_dtype = acc_dtype(op, _dtype(op, [data, weight], CONV_DTYPES))
    (N, H, W, C), (KH, KW, cpg, F) = data.shape, weight.shape
    groups = check_groups(op, C, F, groups)
    _channel_check(op, "weight.shape[2] (input channels per group)", cpg, C // groups, f" (C={C} / groups={groups})")
    stride, pads, dil, OH, OW = conv_geometry(op, H, W, KH, KW, stride, padding, dilation)
    padded = pad_tensor(data, (0, pads[0], pads[1], 0), (0, pads[2], pads[3], 0)) if any(pads) else data
    ry, rx, rc = reduce_axis(KH, "ry"), reduce_axis(KW, "rx"), reduce_axis(cpg, "rc")

    def body(n, y, x, f):
        v = padded[n, window_index(y, stride[0], ry, dil[0]), window_index(x, stride[1], rx, dil[1]),
                   _group_channel(f, rc, C, F, groups)]
        return te_sum(_mul(v, weight[ry, rx, rc, f], out_dtype), axis=[ry, rx, rc])

    attrs = dict(layout="NHWC", stride=stride, padding=pads, dilation=dil, groups=groups)
    return compute((N, OH, OW, F), body, name=name, tag=op, attrs=attrs)


def depthwise_conv2d_nchw(data, weight, stride=1, padding=0, dilation=1,
                          name="depthwise_conv2d_nchw") -> Tensor:
    """Each input channel c gets `multiplier` filters: weight [C, multiplier, KH, KW], output
    channel c·multiplier + m (the TVM/PyTorch order)."""
    op = "depthwise_conv2d_nchw"
    _tensor(op, "data", data, 4)
    _tensor(op, "weight", weight, 4)
    out_dtype = acc_dtype(op, _dtype(op, [data, weight], CONV_DTYPES))
    (N, C, H, W), (WC, mult, KH, KW) = data.shape, weight.shape
    _channel_check(op, "weight.shape[0]", WC, C, " (the data's channels)")
    stride, pads, dil, OH, OW = conv_geometry(op, H, W, KH, KW, stride, padding, dilation)
    padded = pad_tensor(data, (0, 0, pads[0], pads[1]), (0, 0, pads[2], pads[3])) if any(pads) else data
    ry, rx = reduce_axis(KH, "ry"), reduce_axis(KW, "rx")

    def body(n, oc, y, x):
        c, m = (oc, 0) if mult == 1 else (oc // mult, oc % mult)
        v = padded[n, c, window_index(y, stride[0], ry, dil[0]), window_index(x, stride[1], rx, dil[1])]
        return te_sum(_mul(v, weight[c, m, ry, rx], out_dtype), axis=[ry, rx])

    attrs = dict(layout="NCHW", stride=stride, padding=pads, dilation=dil, multiplier=mult)
    return compute((N, C * mult, OH, OW), body, name=name, tag=op, attrs=attrs)


# ----------------------------------------------------------------------------- matrix products

def matmul(a, b, transpose_b=False, out_dtype=None, name="matmul") -> Tensor:
    """C[M,N] = A[M,K] @ B[K,N] (B is [N,K] with transpose_b); int8 accumulates into int32."""
    op = "matmul"
    _tensor(op, "a", a, 2)
    _tensor(op, "b", b, 2)
    out_dtype = acc_dtype(op, _dtype(op, [a, b], MATMUL_DTYPES), out_dtype)
    (M, K), (N, KB) = a.shape, (b.shape if transpose_b else b.shape[::-1])
    _channel_check(op, f"the reduction length of b{' (transposed)' if transpose_b else ''}", KB, K, " (as a's)")
    k = reduce_axis(K, "k")

    def term(i, j):
        x, y = a[i, k], (b[j, k] if transpose_b else b[k, j])
        return x.astype(out_dtype) * y.astype(out_dtype)

    return compute((M, N), lambda i, j: te_sum(term(i, j), axis=k), name=name, tag="matmul")


def batch_matmul(a, b, transpose_b=False, out_dtype=None, name="batch_matmul") -> Tensor:
    """C[b,M,N] = A[b,M,K] @ B[b,K,N] (B is [b,N,K] with transpose_b)."""
    op = "batch_matmul"
    _tensor(op, "a", a, 3)
    _tensor(op, "b", b, 3)
    out_dtype = acc_dtype(op, _dtype(op, [a, b], MATMUL_DTYPES), out_dtype)
    (B, M, K), (BB, N, KB) = a.shape, (b.shape if transpose_b else (b.shape[0], b.shape[2], b.shape[1]))
    _channel_check(op, "the batch of b", BB, B, " (as a's)")
    _channel_check(op, f"the reduction length of b{' (transposed)' if transpose_b else ''}", KB, K, " (as a's)")
    k = reduce_axis(K, "k")
    lhs, rhs = a, b  # the stage's axes are named b, i, j, which shadows `b`

    def body(b, i, j):
        w = rhs[b, j, k] if transpose_b else rhs[b, k, j]
        return te_sum(lhs[b, i, k].astype(out_dtype) * w.astype(out_dtype), axis=k)

    return compute((B, M, N), body, name=name, tag="batch_matmul")


def dense(data, weight, name="dense_matmul") -> Tensor:
    """out[i,j] = Σk data[i,k] · weight[j,k] (weight [out_dim, in_dim]); float dtypes (an
    integer product needs a wider accumulator: use matmul with transpose_b and out_dtype)."""
    op = "dense"
    _tensor(op, "data", data, 2)
    _tensor(op, "weight", weight, 2)
    _dtype(op, [data, weight], FLOAT)
    _channel_check(op, "weight.shape[1] (in_dim)", weight.shape[1], data.shape[1], " (as data's)")
    k = reduce_axis(data.shape[1], "k")
    return compute((data.shape[0], weight.shape[0]), lambda i, j: te_sum(data[i, k] * weight[j, k], axis=k),
                   name=name, tag="dense")


# ----------------------------------------------------------------------------- elementwise

def broadcast_read(t, out_idx):
    """Read `t` at the numpy-broadcast position of output index `out_idx` (size-1 dims read 0)."""
    lead = len(out_idx) - t.ndim
    return t[tuple(0 if s == 1 else out_idx[lead + d] for d, s in enumerate(t.shape))]


def _broadcast(op, fn, a, b, name) -> Tensor:
    _tensor(op, "a", a)
    _tensor(op, "b", b)
    _dtype(op, [a, b], NUMERIC)
    shape = broadcast_shape(op, a.shape, b.shape)
    return compute(shape, lambda *i: fn(broadcast_read(a, i), broadcast_read(b, i)), name=name,
                   tag="broadcast" if a.shape != b.shape else "elemwise")


def add(a, b, name="add") -> Tensor:
    """a + b with numpy broadcasting."""
    return _broadcast("add", lambda x, y: x + y, a, b, name)


def multiply(a, b, name="mul") -> Tensor:
    """a * b with numpy broadcasting."""
    return _broadcast("mul", lambda x, y: x * y, a, b, name)


def _unary(op, fn, x, allowed, name) -> Tensor:
    _tensor(op, "x", x)
    check_dtype_for(op, x.dtype, allowed)
    return compute(x.shape, lambda *i: fn(x[i]), name=name, tag="elemwise")


def relu(x, name="relu") -> Tensor:
    """max(x, 0)."""
    return _unary("relu", ACTIVATIONS["relu"], x, NUMERIC, name)


def gelu(x, name="gelu") -> Tensor:
    """Exact GELU, 0.5·x·(1 + erf(x/√2))."""
    return _unary("gelu", ACTIVATIONS["gelu"], x, FLOAT, name)


def bias_add(data, bias, axis=1, activation="none", name="bias_add", tag="broadcast") -> Tensor:
    """activation(data + bias broadcast along `axis`) in one stage; bias is [data.shape[axis]].

    With an activation this is the epilogue of a fused operator (conv2d_bias_relu, dense): the
    operator's schedule computes the product per register tile and this stage stores it."""
    op = "bias_add"
    _tensor(op, "data", data)
    _tensor(op, "bias", bias, 1)
    axis = check_axis(op, axis, data.ndim)
    dtype = _dtype(op, [data, bias], NUMERIC)
    known = isinstance(activation, str) and activation in ACTIVATIONS
    if not known or (activation == "gelu" and dtype not in FLOAT):
        raise ExprError(f"{op}: activation must be one of {', '.join(ACTIVATIONS)} (gelu for float dtypes), "
                        f"got {activation!r}")
    _channel_check(op, "bias.shape[0]", bias.shape[0], data.shape[axis], f" (data.shape[{axis}])")
    act = ACTIVATIONS[activation]
    return compute(data.shape, lambda *i: act(data[i] + bias[i[axis]]), name=name, tag=tag)


__all__ = ["conv2d_nchw", "conv2d_nchw_packed", "pack_conv_weight", "pack_conv_weight_nchwc", "pack_group_window_weight",
           "group_window_channels", "group_window_span", "group_window_unit", "nchwc_weight_geometry",
           "conv2d_nhwc", "depthwise_conv2d_nchw", "matmul", "batch_matmul", "dense",
           "add", "multiply", "relu", "gelu", "bias_add", "pad_tensor", "ACTIVATIONS"]
