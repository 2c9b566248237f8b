"""2-d convolutions (NCHW, NHWC, depthwise NCHW) with stride, padding, dilation and groups.

Padding is its own stage named "pad" (skipped when all pads are zero) so a schedule can
inline it into the convolution or materialize it.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import is_int
from ..errors import ExprError
from ..tensor import compute, placeholder, reduce_axis
from ..tensor import sum as te_sum
from .base import OpDef, check_dtype_for, check_int, check_pair, check_padding, conv_out_size, np_window, \
    window_index
from .transform import pad_tensor

CONV_DTYPES = ("float32", "float64", "int8")


def _geometry(op, H, W, KH, KW, stride, padding, dilation):
    sh, sw = check_pair(op, "stride", stride)
    dh, dw = check_pair(op, "dilation", dilation)
    pads = check_padding(op, padding)  # top, left, bottom, right
    OH = conv_out_size(op, "height", H, KH, sh, pads[0] + pads[2], dh)
    OW = conv_out_size(op, "width", W, KW, sw, pads[1] + pads[3], dw)
    return (sh, sw), pads, (dh, dw), OH, OW


def _out_dtype(dtype):
    return "int32" if dtype == "int8" else dtype


def _mul(a, b, out_dtype):
    return a.astype(out_dtype) * b.astype(out_dtype)


def _check_groups(op, C, F, groups):
    groups = check_int(op, "groups", groups)
    if C % groups or F % groups:
        raise ExprError(f"{op}: groups={groups} must divide both input channels C={C} and filters F={F}")
    return groups


def _group_channel(f, rc, C, F, groups):
    """Input channel read for output channel f: (f // (F/groups)) * (C/groups) + rc."""
    if groups == 1:
        return rc.var
    fpg, cpg = F // groups, C // groups
    g = f if fpg == 1 else f // fpg
    return g * cpg + rc.var if cpg != 1 else g + rc.var


def conv2d_nchw(N, C, H, W, F, KH, KW, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1,
                dtype="float32") -> OpDef:
    """out[n,f,y,x] = Σ data[n, c, y·sh + ry·dh - pt, x·sw + rx·dw - pl] · weight[f, c', ry, rx];
    weight is [F, C/groups, KH, KW]; int8 accumulates into int32."""
    op = "conv2d_nchw"
    N, C, H, W, F, KH, KW = (check_int(op, n, v) for n, v in
                             zip(("N", "C", "H", "W", "F", "KH", "KW"), (N, C, H, W, F, KH, KW)))
    dtype = check_dtype_for(op, dtype, CONV_DTYPES)
    groups = _check_groups(op, C, F, groups)
    stride, pads, dil, OH, OW = _geometry(op, H, W, KH, KW, stride, padding, dilation)
    out_dtype, cpg = _out_dtype(dtype), C // groups
    data = placeholder((N, C, H, W), dtype, "data")
    weight = placeholder((F, cpg, KH, KW), dtype, "weight")
    padded = pad_tensor(data, (0, 0, pads[0], pads[1]), (0, 0, pads[2], pads[3])) if any(pads) else data
    rc, ry, rx = reduce_axis(cpg, "rc"), reduce_axis(KH, "ry"), reduce_axis(KW, "rx")

    def body(n, f, y, x):
        v = padded[n, _group_channel(f, rc, C, F, groups), window_index(y, stride[0], ry, dil[0]),
                   window_index(x, stride[1], rx, dil[1])]
        return te_sum(_mul(v, weight[f, rc, ry, rx], out_dtype), axis=[rc, ry, rx])

    attrs = dict(layout="NCHW", stride=stride, padding=pads, dilation=dil, groups=groups)
    out = compute((N, F, OH, OW), body, name=op, tag=op, attrs=attrs)

    def reference(x, w):
        acc = np.int64 if is_int(dtype) else np.float64
        xp = np.pad(x.astype(acc), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
        wr = w.astype(acc).reshape(groups, F // groups, cpg, KH, KW)
        res = np.zeros((N, groups, F // groups, OH, OW), acc)
        for ry_ in range(KH):
            for rx_ in range(KW):
                win = np_window(xp, 2, ry_, rx_, dil, stride, OH, OW).reshape(N, groups, cpg, OH, OW)
                res += np.einsum("ngcyx,gfc->ngfyx", win, wr[:, :, :, ry_, rx_])
        return res.reshape(N, F, OH, OW).astype(out_dtype)

    params = dict(N=N, C=C, H=H, W=W, F=F, KH=KH, KW=KW, stride=stride, padding=pads, dilation=dil,
                  groups=groups, dtype=dtype)
    return OpDef(op, [data, weight], out, params, 2 * N * F * OH * OW * cpg * KH * KW, reference)


def conv2d_nhwc(N, C, H, W, F, KH, KW, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1,
                dtype="float32") -> OpDef:
    """NHWC data [N, H, W, C], HWIO weight [KH, KW, C/groups, F], NHWC output; int8 accumulates
    into int32. Same parameter order as conv2d_nchw, so switching layout changes only the name."""
    op = "conv2d_nhwc"
    N, C, H, W, F, KH, KW = (check_int(op, n, v) for n, v in
                             zip(("N", "C", "H", "W", "F", "KH", "KW"), (N, C, H, W, F, KH, KW)))
    dtype = check_dtype_for(op, dtype, CONV_DTYPES)
    groups = _check_groups(op, C, F, groups)
    stride, pads, dil, OH, OW = _geometry(op, H, W, KH, KW, stride, padding, dilation)
    out_dtype, cpg = _out_dtype(dtype), C // groups
    data = placeholder((N, H, W, C), dtype, "data")
    weight = placeholder((KH, KW, cpg, F), dtype, "weight")
    padded = pad_tensor(data, (0, pads[0], pads[1], 0), (0, pads[2], pads[3], 0)) if any(pads) else data
    ry, rx, rc = reduce_axis(KH, "ry"), reduce_axis(KW, "rx"), reduce_axis(cpg, "rc")

    def body(n, y, x, f):
        v = padded[n, window_index(y, stride[0], ry, dil[0]), window_index(x, stride[1], rx, dil[1]),
                   _group_channel(f, rc, C, F, groups)]
        return te_sum(_mul(v, weight[ry, rx, rc, f], out_dtype), axis=[ry, rx, rc])

    attrs = dict(layout="NHWC", stride=stride, padding=pads, dilation=dil, groups=groups)
    out = compute((N, OH, OW, F), body, name=op, tag=op, attrs=attrs)

    def reference(x, w):
        acc = np.int64 if is_int(dtype) else np.float64
        xp = np.pad(x.astype(acc), ((0, 0), (pads[0], pads[2]), (pads[1], pads[3]), (0, 0)))
        wr = w.astype(acc).reshape(KH, KW, cpg, groups, F // groups)
        res = np.zeros((N, OH, OW, groups, F // groups), acc)
        for ry_ in range(KH):
            for rx_ in range(KW):
                win = np_window(xp, 1, ry_, rx_, dil, stride, OH, OW).reshape(N, OH, OW, groups, cpg)
                res += np.einsum("nyxgc,cgf->nyxgf", win, wr[ry_, rx_])
        return res.reshape(N, OH, OW, F).astype(out_dtype)

    params = dict(N=N, C=C, H=H, W=W, F=F, KH=KH, KW=KW, stride=stride, padding=pads, dilation=dil,
                  groups=groups, dtype=dtype)
    return OpDef(op, [data, weight], out, params, 2 * N * F * OH * OW * cpg * KH * KW, reference)


def depthwise_conv2d_nchw(N, C, H, W, KH, KW, stride=(1, 1), padding=(0, 0), dilation=(1, 1), multiplier=1,
                          dtype="float32") -> OpDef:
    """Each input channel c gets `multiplier` filters; weight [C, multiplier, KH, KW],
    output channel c·multiplier + m (the TVM/PyTorch order)."""
    op = "depthwise_conv2d_nchw"
    N, C, H, W, KH, KW, mult = (check_int(op, n, v) for n, v in
                                zip(("N", "C", "H", "W", "KH", "KW", "multiplier"),
                                    (N, C, H, W, KH, KW, multiplier)))
    dtype = check_dtype_for(op, dtype, CONV_DTYPES)
    stride, pads, dil, OH, OW = _geometry(op, H, W, KH, KW, stride, padding, dilation)
    out_dtype = _out_dtype(dtype)
    data = placeholder((N, C, H, W), dtype, "data")
    weight = placeholder((C, mult, KH, KW), dtype, "weight")
    padded = pad_tensor(data, (0, 0, pads[0], pads[1]), (0, 0, pads[2], pads[3])) if any(pads) else data
    ry, rx = reduce_axis(KH, "ry"), reduce_axis(KW, "rx")

    def body(n, oc, y, x):
        c, m = (oc, 0) if mult == 1 else (oc // mult, oc % mult)
        v = padded[n, c, window_index(y, stride[0], ry, dil[0]), window_index(x, stride[1], rx, dil[1])]
        return te_sum(_mul(v, weight[c, m, ry, rx], out_dtype), axis=[ry, rx])

    attrs = dict(layout="NCHW", stride=stride, padding=pads, dilation=dil, multiplier=mult)
    out = compute((N, C * mult, OH, OW), body, name=op, tag=op, attrs=attrs)

    def reference(x, w):
        acc = np.int64 if is_int(dtype) else np.float64
        xp = np.pad(x.astype(acc), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
        res = np.zeros((N, C, mult, OH, OW), acc)
        for ry_ in range(KH):
            for rx_ in range(KW):
                win = np_window(xp, 2, ry_, rx_, dil, stride, OH, OW)
                res += np.einsum("ncyx,cm->ncmyx", win, w.astype(acc)[:, :, ry_, rx_])
        return res.reshape(N, C * mult, OH, OW).astype(out_dtype)

    params = dict(N=N, C=C, H=H, W=W, KH=KH, KW=KW, stride=stride, padding=pads, dilation=dil,
                  multiplier=mult, dtype=dtype)
    return OpDef(op, [data, weight], out, params, 2 * N * C * mult * OH * OW * KH * KW, reference)
