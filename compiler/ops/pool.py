"""2-d max and average pooling over NCHW data.

Max pooling pads with the dtype's lowest value (the padding never wins); average pooling
divides by the number of valid elements in the window (count_include_pad=False).
"""

from __future__ import annotations

import numpy as np

from .. import expr as E
from ..errors import ExprError
from ..tensor import compute, placeholder, reduce_axis
from ..tensor import max as te_max
from ..tensor import sum as te_sum
from .base import (
    FLOAT,
    NUMERIC,
    OpDef,
    check_dtype_for,
    check_int,
    check_padding,
    check_pair,
    conv_out_size,
    lowest,
    np_window,
    window_index,
)
from .transform import pad_tensor


def _setup(op, N, C, H, W, kernel, stride, padding):
    N, C, H, W = (check_int(op, n, v) for n, v in zip(("N", "C", "H", "W"), (N, C, H, W)))
    KH, KW = check_pair(op, "kernel", kernel)
    stride = (KH, KW) if stride is None else check_pair(op, "stride", stride)
    pads = check_padding(op, padding)
    for p, k, what in zip(pads, (KH, KW, KH, KW), ("top", "left", "bottom", "right")):
        if p >= k:
            raise ExprError(f"{op}: {what} padding {p} must be smaller than the kernel ({k}), "
                            "or some windows would hold padding only")
    OH = conv_out_size(op, "height", H, KH, stride[0], pads[0] + pads[2])
    OW = conv_out_size(op, "width", W, KW, stride[1], pads[1] + pads[3])
    return (N, C, H, W), (KH, KW), stride, pads, OH, OW


def _padded(data, pads, value):
    if not any(pads):
        return data
    return pad_tensor(data, (0, 0, pads[0], pads[1]), (0, 0, pads[2], pads[3]), value)


def _tap(padded, n, c, y, x, stride, ry, rx):
    return padded[n, c, window_index(y, stride[0], ry, 1), window_index(x, stride[1], rx, 1)]


def _np_pad(x, pads, value):
    return np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])), constant_values=value)


def max_pool2d(N, C, H, W, kernel, stride=None, padding=0, dtype="float32") -> OpDef:
    """out[n,c,y,x] = max over the window; stride defaults to the kernel size."""
    op = "max_pool2d"
    dtype = check_dtype_for(op, dtype, NUMERIC)
    (N, C, H, W), (KH, KW), stride, pads, OH, OW = _setup(op, N, C, H, W, kernel, stride, padding)
    data = placeholder((N, C, H, W), dtype, "data")
    padded = _padded(data, pads, lowest(dtype))
    ry, rx = reduce_axis(KH, "ry"), reduce_axis(KW, "rx")
    out = compute((N, C, OH, OW), lambda n, c, y, x: te_max(_tap(padded, n, c, y, x, stride, ry, rx), axis=[ry, rx]),
                  name=op, tag=op, attrs=dict(kernel=(KH, KW), stride=stride, padding=pads))

    def reference(x):
        xp = _np_pad(x, pads, lowest(dtype))
        res = np.full((N, C, OH, OW), lowest(dtype), dtype)
        for i in range(KH):
            for j in range(KW):
                res = np.maximum(res, np_window(xp, 2, i, j, (1, 1), stride, OH, OW))
        return res

    params = dict(N=N, C=C, H=H, W=W, kernel=(KH, KW), stride=stride, padding=pads, dtype=dtype)
    return OpDef(op, [data], out, params, N * C * OH * OW * KH * KW, reference)


def _valid_count(o, s, p_before, k, size, n_out):
    """Number of in-bounds taps along one axis for output index o (an index expression or int)."""
    start = o if s == 1 else o * s
    if p_before:
        start = start - p_before
    hi = E.minimum(start + k, size) if (n_out - 1) * s - p_before + k > size else start + k
    lo = E.maximum(start, 0) if p_before else start
    return hi - lo


def avg_pool2d(N, C, H, W, kernel, stride=None, padding=0, dtype="float32") -> OpDef:
    """Two stages: `avg_pool_sum` (reduction) and `avg_pool2d` (divide by the valid-tap count)."""
    op = "avg_pool2d"
    dtype = check_dtype_for(op, dtype, FLOAT)
    (N, C, H, W), (KH, KW), stride, pads, OH, OW = _setup(op, N, C, H, W, kernel, stride, padding)
    data = placeholder((N, C, H, W), dtype, "data")
    padded = _padded(data, pads, 0.0)
    ry, rx = reduce_axis(KH, "ry"), reduce_axis(KW, "rx")
    attrs = dict(kernel=(KH, KW), stride=stride, padding=pads)
    total = compute((N, C, OH, OW), lambda n, c, y, x: te_sum(_tap(padded, n, c, y, x, stride, ry, rx), axis=[ry, rx]),
                    name="avg_pool_sum", tag="avg_pool_sum", attrs=attrs)

    def body(n, c, y, x):
        if not any(pads):
            return total[n, c, y, x] * (1.0 / (KH * KW))
        cnt = _valid_count(y, stride[0], pads[0], KH, H, OH) * _valid_count(x, stride[1], pads[1], KW, W, OW)
        return total[n, c, y, x] / cnt.astype(dtype)

    out = compute((N, C, OH, OW), body, name=op, tag="elemwise", attrs=attrs)

    def reference(x):
        xp = _np_pad(x.astype(np.float64), pads, 0.0)
        ones = _np_pad(np.ones((1, 1, H, W)), pads, 0.0)
        s, cnt = np.zeros((N, C, OH, OW)), np.zeros((1, 1, OH, OW))
        for i in range(KH):
            for j in range(KW):
                s += np_window(xp, 2, i, j, (1, 1), stride, OH, OW)
                cnt += np_window(ones, 2, i, j, (1, 1), stride, OH, OW)
        return (s / cnt).astype(dtype)

    params = dict(N=N, C=C, H=H, W=W, kernel=(KH, KW), stride=stride, padding=pads, dtype=dtype)
    return OpDef(op, [data], out, params, N * C * OH * OW * (KH * KW + 1), reference)
