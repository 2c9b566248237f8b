"""2-d convolutions (NCHW, NHWC, depthwise NCHW) with stride, padding, dilation and groups, and
conv2d_bias_relu (an NCHW convolution with its bias + relu epilogue).

The computes are the tensor functions of functions.py; these OpDefs add the parameter checks,
an exact numpy reference and the flop count. Padding is its own stage named "pad" (skipped when
all pads are zero) so a schedule can inline it into the convolution or materialize it.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import is_int
from ..tensor import placeholder
from . import functions as fn
from .base import FLOAT, OpDef, check_dtype_for, check_int, np_window
from .functions import CONV_DTYPES, acc_dtype, check_groups, conv_geometry


def _sizes(op, names, values):
    return tuple(check_int(op, n, v) for n, v in zip(names, values))


def _exact_conv_nchw(x, w, groups, pads, stride, dil, out_shape):
    """The NCHW convolution in int64 or float64 (numpy), before rounding to the output dtype."""
    N, F, OH, OW = out_shape
    _, cpg, KH, KW = w.shape
    acc = np.int64 if is_int(str(x.dtype)) else np.float64
    xp = np.pad(x.astype(acc), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    wr = w.astype(acc).reshape(groups, F // groups, cpg, KH, KW)
    res = np.zeros((N, groups, F // groups, OH, OW), acc)
    for ry_ in range(KH):
        for rx_ in range(KW):
            win = np_window(xp, 2, ry_, rx_, dil, stride, OH, OW).reshape(N, groups, cpg, OH, OW)
            res += np.einsum("ngcyx,gfc->ngfyx", win, wr[:, :, :, ry_, rx_])
    return res.reshape(N, F, OH, OW)


def _nchw(op, N, C, H, W, F, KH, KW, stride, padding, dilation, groups, dtype, dtypes):
    """Checked parameters, the placeholders and the convolution of conv2d_nchw and the operators
    that extend it with an epilogue, and a reference in int64/float64."""
    N, C, H, W, F, KH, KW = _sizes(op, ("N", "C", "H", "W", "F", "KH", "KW"), (N, C, H, W, F, KH, KW))
    dtype = check_dtype_for(op, dtype, dtypes)
    groups = check_groups(op, C, F, groups)
    stride, pads, dil, OH, OW = conv_geometry(op, H, W, KH, KW, stride, padding, dilation)
    data = placeholder((N, C, H, W), dtype, "data")
    weight = placeholder((F, C // groups, KH, KW), dtype, "weight")
    conv = fn.conv2d_nchw(data, weight, stride, pads, dil, groups)
    params = dict(N=N, C=C, H=H, W=W, F=F, KH=KH, KW=KW, stride=stride, padding=pads, dilation=dil,
                  groups=groups, dtype=dtype)
    flops = 2 * N * F * OH * OW * (C // groups) * KH * KW

    def exact(x, w):
        return _exact_conv_nchw(x, w, groups, pads, stride, dil, conv.shape)

    return params, data, weight, conv, flops, exact


def conv2d_nchw(N, C, H, W, F, KH, KW, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1,
                dtype="float32") -> OpDef:
    """out[n,f,y,x] = Σ data[n, c, y·sh + ry·dh - pt, x·sw + rx·dw - pl] · weight[f, c', ry, rx];
    weight is [F, C/groups, KH, KW]; int8 accumulates into int32."""
    op = "conv2d_nchw"
    params, data, weight, conv, flops, exact = _nchw(op, N, C, H, W, F, KH, KW, stride, padding, dilation,
                                                     groups, dtype, CONV_DTYPES)
    return OpDef(op, [data, weight], conv, params, flops, lambda x, w: exact(x, w).astype(conv.dtype))


def conv2d_bias_relu(N, C, H, W, F, KH, KW, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1,
                     dtype="float32") -> OpDef:
    """relu(conv2d_nchw(data, weight) + bias[f]), bias [F]: a convolution with its epilogue as one
    workload, tuned as one task (the epilogue is applied as each register tile is stored, so the
    convolution's output never goes to memory). Float dtypes: an int8 epilogue would need
    requantization."""
    op = "conv2d_bias_relu"
    params, data, weight, conv, flops, exact = _nchw(op, N, C, H, W, F, KH, KW, stride, padding, dilation,
                                                     groups, dtype, FLOAT)
    bias = placeholder((params["F"],), params["dtype"], "bias")
    out = fn.bias_add(conv, bias, axis=1, activation="relu", name=op, tag="elemwise")

    def reference(x, w, b):
        y = exact(x, w) + b.astype(np.float64).reshape(1, -1, 1, 1)
        return np.maximum(y, 0.0).astype(out.dtype)

    return OpDef(op, [data, weight, bias], out, params, flops + int(np.prod(out.shape)), reference)


def conv2d_nhwc(N, C, H, W, F, KH, KW, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1,
                dtype="float32") -> OpDef:
    """NHWC data [N, H, W, C], HWIO weight [KH, KW, C/groups, F], NHWC output; int8 accumulates
    into int32. Same parameter order as conv2d_nchw, so switching layout changes only the name."""
    op = "conv2d_nhwc"
    N, C, H, W, F, KH, KW = _sizes(op, ("N", "C", "H", "W", "F", "KH", "KW"), (N, C, H, W, F, KH, KW))
    dtype = check_dtype_for(op, dtype, CONV_DTYPES)
    groups = check_groups(op, C, F, groups)
    stride, pads, dil, OH, OW = conv_geometry(op, H, W, KH, KW, stride, padding, dilation)
    out_dtype, cpg = acc_dtype(op, dtype), C // groups
    data = placeholder((N, H, W, C), dtype, "data")
    weight = placeholder((KH, KW, cpg, F), dtype, "weight")
    out = fn.conv2d_nhwc(data, weight, stride, pads, dil, groups)

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
    N, C, H, W, KH, KW, mult = _sizes(op, ("N", "C", "H", "W", "KH", "KW", "multiplier"),
                                      (N, C, H, W, KH, KW, multiplier))
    dtype = check_dtype_for(op, dtype, CONV_DTYPES)
    stride, pads, dil, OH, OW = conv_geometry(op, H, W, KH, KW, stride, padding, dilation)
    out_dtype = acc_dtype(op, dtype)
    data = placeholder((N, C, H, W), dtype, "data")
    weight = placeholder((C, mult, KH, KW), dtype, "weight")
    out = fn.depthwise_conv2d_nchw(data, weight, stride, pads, dil)

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
