"""The channel-blocked layout's own operators, made by compiler.graph.layout, never read from ONNX.

A blocked value [N, C/B, H, W, B] holds channel c at [.., c // B, .., c % B]; a channel count
that B does not divide is padded to whole blocks, and the padding channels hold values no
reader sees (zero weights read them; FromNCHWc drops them).
- ConvNCHWc: a convolution in that layout (compiler.ops.functions.conv2d_nchwc), its weights
  packed by the pass as conv2d_nchwc reads them (pack_conv_weight_nchwc: [F/B, C/B, KH, KW, B, B]
  for blocked data, [F/B, C, KH, KW, B] for NCHW data or a depthwise convolution) and its bias
  [F/B, B]; attributes `strides`, `pads`
  (top, left, bottom, right), `dilations`, `depthwise` (0/1). An anchor, like Conv.
- MaxPoolNCHWc: MaxPool of blocked data (`kernel`, `strides`, `pads` as the MaxPool's
  geometry resolved them, ceil mode included), the padding the dtype's lowest value;
  AveragePoolNCHWc the same for AveragePool (`count_include_pad`, and `in_hw`, the input's rows
  and columns, to count the valid taps);
- GlobalPoolNCHWc: GlobalAveragePool or GlobalMaxPool (`mode` avg or max) of blocked data, its
  output blocked [N, C/B, 1, 1, B].
- ToNCHWc (`block`) and FromNCHWc (`channels`): the copies at the layout's borders.
- ConcatNCHWc (`channels`, each input's real channel count): a Concat along the channels of
  blocked inputs whose parts do not all fill whole blocks (ShuffleNet's 136 + 136): each output
  lane reads its channel from the part that holds it, so the parts' padding channels drop out
  and the concatenation stays blocked. (Parts of whole blocks but the last stay a plain Concat
  of the blocks, which the memory plan places in place.)
- WinogradInputNCHWc (`pads`, `tile`), WinogradGemm and WinogradOutputNCHWc (`out_hw`, `tile`):
  a 3x3 stride-1 ConvNCHWc as the Winograd convolution's three kernels (compiler.ops.winograd):
  the input transform of blocked data, the matrix products with the weights transformed at
  compile time [a, a, F/B, C/B, B, B], and the output transform with the bias [F/B, B], an
  anchor its epilogue fuses into, like ConvNCHWc.
"""

from __future__ import annotations

from ... import expr as E
from ...ops import functions as fn
from ...ops import winograd as wg
from ...ops.base import conv_out_size, lowest
from ...tensor import compute, reduce_axis
from ...tensor import max as te_max
from ...tensor import sum as te_sum
from ..errors import ShapeError
from .base import Kind, Lazy, materialize, register

INTERNAL_OPS = ("ConvNCHWc", "MaxPoolNCHWc", "AveragePoolNCHWc", "GlobalPoolNCHWc", "ToNCHWc", "FromNCHWc",
                "ConcatNCHWc", "WinogradInputNCHWc", "WinogradGemm", "WinogradOutputNCHWc")


def blocked_shape(shape: tuple, block: int) -> tuple:
    """[N, C, H, W] → [N, ceil(C / block), H, W, block]."""
    N, C, H, W = shape
    return (N, -(-C // block), H, W, block)


def _window_out(node, hw, kernel, dilations=(1, 1)) -> tuple:
    """(OH, OW) of a window op with the node's resolved `strides` and `pads`."""
    (sh, sw), (pt, pl, pb, pr) = node.attrs["strides"], node.attrs["pads"]
    return (conv_out_size(node.op_type, "height", hw[0], kernel[0], sh, pt + pb, dilations[0]),
            conv_out_size(node.op_type, "width", hw[1], kernel[1], sw, pl + pr, dilations[1]))


def _conv_infer(node, ins, opset):
    x, w = ins[0], ins[1]
    FO, _, KH, KW, FB = fn.nchwc_weight_geometry(w.shape)
    OH, OW = _window_out(node, x.shape[2:4], (KH, KW), node.attrs["dilations"])
    return [((x.shape[0], FO, OH, OW, FB), x.dtype)]


def _conv_lower(node, xs, ins, opset):
    x, w = materialize(xs[0], "data"), materialize(xs[1], "weight")
    a = node.attrs
    window = tuple(a["group_window"]) if a.get("group_window") else None
    out = fn.conv2d_nchwc(x, w, tuple(a["strides"]), tuple(a["pads"]), tuple(a["dilations"]), bool(a["depthwise"]),
                          group_window=window)
    conv = Lazy.of(out)
    if len(xs) > 2 and xs[2] is not None:
        b = xs[2]
        return Lazy(conv.shape, conv.dtype, lambda idx: conv.read(idx) + b.read((idx[1], idx[4])))
    return conv


def _pool_infer(node, ins, opset):
    N, CO, H, W, B = ins[0].shape
    return [((N, CO, *_window_out(node, (H, W), node.attrs["kernel"]), B), ins[0].dtype)]


def _pool_lower(node, xs, ins, opset):
    x = materialize(xs[0], "data")
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = node.attrs["kernel"], node.attrs["strides"], node.attrs["pads"]
    padded = fn.pad_tensor(x, (0, 0, pt, pl, 0), (0, 0, pb, pr, 0), value=lowest(x.dtype)) if any((pt, pl, pb, pr)) else x
    ry, rx = reduce_axis(kh, "ry"), reduce_axis(kw, "rx")
    shape = _pool_infer(node, ins, opset)[0][0]
    return Lazy.of(compute(shape, lambda n, c, y, w, b: te_max(padded[n, c, y * sh + ry.var, w * sw + rx.var, b],
                                                               axis=[ry, rx]), name="max_pool_nchwc", tag="max_pool2d_nchwc"))


def _valid_taps(o, stride: int, before: int, k: int, size: int):
    """Input positions a window at output index `o` covers inside [0, size) along one axis."""
    start = o * stride - before
    return E.minimum(start + k, size) - E.maximum(start, 0)


def _avg_pool_lower(node, xs, ins, opset):
    """The window mean of blocked data, one reduction stage: the taps over zero padding summed,
    each scaled by 1/count (the whole window with count_include_pad, else its valid taps, as
    ONNX says; ceil mode's overhang never counts)."""
    x = materialize(xs[0], "data")
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = node.attrs["kernel"], node.attrs["strides"], node.attrs["pads"]
    H, W = node.attrs["in_hw"]
    padded = fn.pad_tensor(x, (0, 0, pt, pl, 0), (0, 0, pb, pr, 0)) if any((pt, pl, pb, pr)) else x
    ry, rx = reduce_axis(kh, "ry"), reduce_axis(kw, "rx")
    shape = _pool_infer(node, ins, opset)[0][0]
    whole = node.attrs["count_include_pad"] or not any((pt, pl, pb, pr))

    def body(n, c, y, w, b):
        tap = padded[n, c, y * sh + ry.var, w * sw + rx.var, b]
        if whole:
            return tap * (1.0 / (kh * kw))
        count = _valid_taps(y, sh, pt, kh, H) * _valid_taps(w, sw, pl, kw, W)
        return tap / count.astype(x.dtype)
    return Lazy.of(compute(shape, lambda *i: te_sum(body(*i), axis=[ry, rx]), name="avg_pool_nchwc",
                           tag="avg_pool2d_nchwc"))


def _global_infer(node, ins, opset):
    N, CB, _, _, B = ins[0].shape
    return [((N, CB, 1, 1, B), ins[0].dtype)]


def _global_lower(node, xs, ins, opset):
    """The mean or maximum over a blocked value's rows and columns, per channel lane."""
    x = materialize(xs[0], "data")
    N, CB, H, W, B = x.shape
    ry, rx = reduce_axis(H, "ry"), reduce_axis(W, "rx")
    if node.attrs["mode"] == "max":
        body = lambda n, c, y, w, b: te_max(x[n, c, ry.var, rx.var, b], axis=[ry, rx])   # noqa: E731
    else:
        body = lambda n, c, y, w, b: te_sum(x[n, c, ry.var, rx.var, b] * (1.0 / (H * W)), axis=[ry, rx])   # noqa: E731
    return Lazy.of(compute((N, CB, 1, 1, B), body, name=f"global_{node.attrs['mode']}_pool_nchwc",
                           tag="global_pool_nchwc"))


def _to_infer(node, ins, opset):
    if len(ins[0].shape) != 4:
        raise ShapeError(f"ToNCHWc node {node.name!r}: 4-d data only, got {ins[0].shape}")
    return [(blocked_shape(ins[0].shape, int(node.attrs["block"])), ins[0].dtype)]


def _to_lower(node, xs, ins, opset):
    x = xs[0]
    B, C = int(node.attrs["block"]), x.shape[1]
    shape = blocked_shape(x.shape, B)

    def read(idx):
        n, co, y, w, ci = idx
        c = co * B + ci
        if C % B == 0:
            return x.read((n, c, y, w))
        # a padding channel reads channel C - 1 (in bounds) and is zeroed
        return E.if_then_else(c < C, x.read((n, E.minimum(c, C - 1), y, w)), E.Const(0.0, x.dtype))
    return Lazy(shape, x.dtype, read)


def _from_infer(node, ins, opset):
    N, _, H, W, _ = ins[0].shape
    return [((N, int(node.attrs["channels"]), H, W), ins[0].dtype)]


def _from_lower(node, xs, ins, opset):
    x = xs[0]
    B = x.shape[4]
    N, _, H, W, _ = x.shape
    return Lazy((N, int(node.attrs["channels"]), H, W), x.dtype,
                lambda idx: x.read((idx[0], idx[1] // B, idx[2], idx[3], idx[1] % B)))


def _concat_nchwc_infer(node, ins, opset):
    channels = [int(c) for c in node.attrs["channels"]]
    N, _, H, W, B = ins[0].shape
    if len(channels) != len(ins) or any(x.shape != (N, -(-c // B), H, W, B) for x, c in zip(ins, channels)):
        raise ShapeError(f"ConcatNCHWc node {node.name!r}: inputs {[x.shape for x in ins]} do not hold "
                         f"{channels} channels in blocks of {B}")
    return [(blocked_shape((N, sum(channels), H, W), B), ins[0].dtype)]


def _concat_nchwc_lower(node, xs, ins, opset):
    channels = [int(c) for c in node.attrs["channels"]]
    N, _, H, W, B = xs[0].shape
    starts = [sum(channels[:i]) for i in range(len(channels))]
    shape = blocked_shape((N, sum(channels), H, W), B)

    def read(idx):
        n, co, y, w, ci = idx
        c = co * B + ci

        def part(i):
            k = c - starts[i] if starts[i] else c
            return xs[i].read((n, k // B, y, w, k % B))
        v: E.Expr = E.Const(0.0, xs[0].dtype)   # the output's padding channels
        for i in reversed(range(len(xs))):
            v = E.if_then_else(c < starts[i] + channels[i], part(i), v)
        return v
    return Lazy(shape, xs[0].dtype, read)


def _wino_in_infer(node, ins, opset):
    N, CB, H, W, B = ins[0].shape
    pt, pl, pb, pr = node.attrs["pads"]
    m = int(node.attrs["tile"])
    TH, TW = wg.tile_grid((H + pt + pb - 2, W + pl + pr - 2), m)
    return [((m + 2, m + 2, CB, N * TH * TW, B), ins[0].dtype)]


def _wino_in_lower(node, xs, ins, opset):
    return Lazy.of(wg.winograd_input(materialize(xs[0], "data"), tuple(node.attrs["pads"]), int(node.attrs["tile"])))


def _wino_gemm_infer(node, ins, opset):
    a, _, _, P, _ = ins[0].shape
    return [((a, a, ins[1].shape[2], P, ins[1].shape[5]), ins[0].dtype)]


def _wino_gemm_lower(node, xs, ins, opset):
    return Lazy.of(wg.winograd_gemm(materialize(xs[0], "transformed"), materialize(xs[1], "weight")))


def _wino_out_infer(node, ins, opset):
    a, _, FO, P, FB = ins[0].shape
    OH, OW = node.attrs["out_hw"]
    m = int(node.attrs["tile"])
    TH, TW = wg.tile_grid((OH, OW), m)
    return [((P // (TH * TW), FO, OH, OW, FB), ins[0].dtype)]


def _wino_out_lower(node, xs, ins, opset):
    shape = _wino_out_infer(node, ins, opset)[0][0]
    out = Lazy.of(wg.winograd_output(materialize(xs[0], "products"), shape, int(node.attrs["tile"])))
    if len(xs) > 1 and xs[1] is not None:
        b = xs[1]
        return Lazy(out.shape, out.dtype, lambda idx: out.read(idx) + b.read((idx[1], idx[4])))
    return out


register("ConvNCHWc", Kind.OUT_ELEMWISE_FUSABLE, _conv_infer, _conv_lower)
register("WinogradInputNCHWc", Kind.OPAQUE, _wino_in_infer, _wino_in_lower)
register("WinogradGemm", Kind.OPAQUE, _wino_gemm_infer, _wino_gemm_lower)
register("WinogradOutputNCHWc", Kind.OUT_ELEMWISE_FUSABLE, _wino_out_infer, _wino_out_lower)
register("MaxPoolNCHWc", Kind.OPAQUE, _pool_infer, _pool_lower)
register("AveragePoolNCHWc", Kind.OPAQUE, _pool_infer, _avg_pool_lower)
register("GlobalPoolNCHWc", Kind.COMM_REDUCE, _global_infer, _global_lower)
register("ToNCHWc", Kind.INJECTIVE, _to_infer, _to_lower)
register("FromNCHWc", Kind.INJECTIVE, _from_infer, _from_lower)
register("ConcatNCHWc", Kind.INJECTIVE, _concat_nchwc_infer, _concat_nchwc_lower)


__all__ = ["INTERNAL_OPS", "blocked_shape"]
