"""Plain numpy implementations of the operator inventory, to time our kernels against.

A tuned kernel is only interesting next to what a user would write without us, so every
operator here is the straightforward numpy program for it: `np.matmul` (which calls the BLAS
numpy was built with), im2col + matmul for convolutions, a loop over the kernel taps for
depthwise convolution and pooling, and so on. They compute in the operator's own dtype (the
`OpDef.reference` functions compute in float64 to be exact, which would make a slow baseline).

`numpy_baseline(opdef)` returns a function taking the kernel's input arrays, in kernel order,
and returning the output; `time_callable` times it the way `Kernel.measure` times a
kernel, so the two numbers are comparable. The CLI (`tunefarm ops`) and the benchmarks in
bench/ share this module.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

# ----------------------------------------------------------------------------- helpers

def _lowest(dtype):
    dtype = np.dtype(dtype)
    return np.finfo(dtype).min if dtype.kind == "f" else np.iinfo(dtype).min


def _acc(dtype: str) -> str:
    """Accumulator dtype of the int8 kernels (int32), else the dtype itself."""
    return "int32" if dtype == "int8" else dtype


def _taps(xp: np.ndarray, axis_h: int, ry: int, rx: int, dil, stride, OH: int, OW: int) -> np.ndarray:
    """The strided [.., OH, OW ..] view of padded input `xp` that kernel tap (ry, rx) reads."""
    ys, xs = ry * dil[0], rx * dil[1]
    sl = [slice(None)] * xp.ndim
    sl[axis_h] = slice(ys, ys + (OH - 1) * stride[0] + 1, stride[0])
    sl[axis_h + 1] = slice(xs, xs + (OW - 1) * stride[1] + 1, stride[1])
    return xp[tuple(sl)]


def erf(x: np.ndarray) -> np.ndarray:
    """Vectorized erf (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7): numpy has no erf, and
    `np.vectorize(math.erf)` runs at Python speed, which would be no baseline at all."""
    a1, a2, a3, a4, a5, p = 0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429, 0.3275911
    s = np.sign(x)
    ax = np.abs(x)
    t = 1.0 / (1.0 + p * ax)
    poly = ((((a5 * t + a4) * t + a3) * t + a2) * t + a1) * t
    return (s * (1.0 - poly * np.exp(-ax * ax))).astype(x.dtype, copy=False)


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact-form GELU, 0.5·x·(1 + erf(x/√2)), in the input's dtype."""
    return (0.5 * x * (1.0 + erf(x * x.dtype.type(1.0 / math.sqrt(2.0))))).astype(x.dtype, copy=False)


# ----------------------------------------------------------------------------- matrix products

def _matmul(p):
    out = p["out_dtype"]
    cast = p["dtype"] != out  # int8 inputs: numpy would multiply in int8 and overflow

    def fn(a, b):
        if cast:
            a, b = a.astype(out), b.astype(out)
        return np.matmul(a, b.T if p["transpose_b"] else b)
    return fn


def _batch_matmul(p):
    out = p["out_dtype"]
    cast = p["dtype"] != out

    def fn(a, b):
        if cast:
            a, b = a.astype(out), b.astype(out)
        return np.matmul(a, np.swapaxes(b, 1, 2) if p["transpose_b"] else b)
    return fn


def _dense(p):
    epilogue = p.get("epilogue", "gelu")  # dense_gelu's epilogue is its name

    def fn(x, w, b):
        y = x @ w.T
        y += b
        if epilogue == "relu":
            np.maximum(y, 0, out=y)
        elif epilogue == "gelu":
            y = gelu(y)
        return y
    return fn


# ----------------------------------------------------------------------------- convolutions

def _conv_geometry(p):
    KH, KW = p["KH"], p["KW"]
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = p["stride"], p["dilation"], p["padding"]
    OH = (p["H"] + pt + pb - ((KH - 1) * dh + 1)) // sh + 1
    OW = (p["W"] + pl + pr - ((KW - 1) * dw + 1)) // sw + 1
    return KH, KW, (sh, sw), (dh, dw), (pt, pl, pb, pr), OH, OW


def _conv2d_nchw(p):
    """im2col + one (batched over groups) matmul: what framework CPU fallbacks do."""
    N, C, F, G = p["N"], p["C"], p["F"], p["groups"]
    KH, KW, stride, dil, pads, OH, OW = _conv_geometry(p)
    cpg, acc = C // G, _acc(p["dtype"])

    def fn(x, w):
        xp = np.pad(x.astype(acc, copy=False), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
        cols = np.empty((N, C, KH, KW, OH, OW), acc)
        for ry in range(KH):
            for rx in range(KW):
                cols[:, :, ry, rx] = _taps(xp, 2, ry, rx, dil, stride, OH, OW)
        cols = cols.reshape(N, G, cpg * KH * KW, OH * OW)
        wm = w.astype(acc, copy=False).reshape(G, F // G, cpg * KH * KW)
        return np.matmul(wm, cols).reshape(N, F, OH, OW)
    return fn


def _conv2d_bias_relu(p):
    conv = _conv2d_nchw(p)

    def fn(x, w, b):
        y = conv(x, w)
        y += b.reshape(1, -1, 1, 1)
        return np.maximum(y, 0, out=y)
    return fn


def _conv2d_nhwc(p):
    N, C, F, G = p["N"], p["C"], p["F"], p["groups"]
    KH, KW, stride, dil, pads, OH, OW = _conv_geometry(p)
    cpg, acc = C // G, _acc(p["dtype"])

    def fn(x, w):
        xp = np.pad(x.astype(acc, copy=False), ((0, 0), (pads[0], pads[2]), (pads[1], pads[3]), (0, 0)))
        cols = np.empty((N, OH, OW, KH, KW, C), acc)
        for ry in range(KH):
            for rx in range(KW):
                cols[:, :, :, ry, rx] = _taps(xp, 1, ry, rx, dil, stride, OH, OW)
        wk = w.astype(acc, copy=False)
        if G == 1:
            return (cols.reshape(N * OH * OW, KH * KW * C) @ wk.reshape(KH * KW * C, F)).reshape(N, OH, OW, F)
        cg = cols.reshape(N * OH * OW, KH * KW, G, cpg).transpose(2, 0, 1, 3).reshape(G, -1, KH * KW * cpg)
        wg = wk.reshape(KH * KW, cpg, G, F // G).transpose(2, 0, 1, 3).reshape(G, KH * KW * cpg, F // G)
        return np.ascontiguousarray(np.matmul(cg, wg).transpose(1, 0, 2)).reshape(N, OH, OW, F)
    return fn


def _depthwise_conv2d_nchw(p):
    """A multiply-accumulate per kernel tap over whole feature maps (im2col buys nothing here)."""
    N, C, M = p["N"], p["C"], p["multiplier"]
    KH, KW, stride, dil, pads, OH, OW = _conv_geometry(p)
    acc = _acc(p["dtype"])

    def fn(x, w):
        xp = np.pad(x.astype(acc, copy=False), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
        wk = w.astype(acc, copy=False)
        res = np.zeros((N, C, M, OH, OW), acc)
        for ry in range(KH):
            for rx in range(KW):
                res += _taps(xp, 2, ry, rx, dil, stride, OH, OW)[:, :, None] * wk[None, :, :, ry, rx, None, None]
        return res.reshape(N, C * M, OH, OW)
    return fn


# ----------------------------------------------------------------------------- pooling

def _pool_geometry(p):
    KH, KW = p["kernel"]
    stride, pads = p["stride"], p["padding"]
    OH = (p["H"] + pads[0] + pads[2] - KH) // stride[0] + 1
    OW = (p["W"] + pads[1] + pads[3] - KW) // stride[1] + 1
    return KH, KW, stride, pads, OH, OW


def _max_pool2d(p):
    KH, KW, stride, pads, OH, OW = _pool_geometry(p)
    low = _lowest(p["dtype"])

    def fn(x):
        xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])), constant_values=low)
        res = _taps(xp, 2, 0, 0, (1, 1), stride, OH, OW).copy()
        for ry in range(KH):
            for rx in range(KW):
                if ry or rx:
                    np.maximum(res, _taps(xp, 2, ry, rx, (1, 1), stride, OH, OW), out=res)
        return res
    return fn


def _avg_pool2d(p):
    """Sum of taps divided by the number of in-bounds taps (count_include_pad=False, as the op)."""
    KH, KW, stride, pads, OH, OW = _pool_geometry(p)
    dtype = np.dtype(p["dtype"])
    widths = ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3]))
    ones = np.pad(np.ones((1, 1, p["H"], p["W"]), dtype), widths)
    count = sum(_taps(ones, 2, ry, rx, (1, 1), stride, OH, OW) for ry in range(KH) for rx in range(KW))
    if not isinstance(count, np.ndarray):  # sum() of no taps is the int 0 (the op rejects such kernels)
        raise ValueError(f"avg_pool2d: kernel {KH}x{KW} has no taps")
    inv = (1.0 / count).astype(dtype)

    def fn(x):
        xp = np.pad(x, widths)
        res = _taps(xp, 2, 0, 0, (1, 1), stride, OH, OW).copy()
        for ry in range(KH):
            for rx in range(KW):
                if ry or rx:
                    res += _taps(xp, 2, ry, rx, (1, 1), stride, OH, OW)
        res *= inv
        return res
    return fn


# ----------------------------------------------------------------------------- normalization

def _softmax(p):
    axis = p["axis"]

    def fn(x):
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        e /= e.sum(axis=axis, keepdims=True)
        return e
    return fn


def _layer_norm(p):
    axis, eps, nd = p["axis"], p["eps"], len(p["shape"])
    bshape = [1] * nd
    bshape[axis] = p["shape"][axis]

    def fn(x, g, b):
        m = x.mean(axis=axis, keepdims=True)
        d = x - m
        v = (d * d).mean(axis=axis, keepdims=True)
        return d / np.sqrt(v + x.dtype.type(eps)) * g.reshape(bshape) + b.reshape(bshape)
    return fn


# ----------------------------------------------------------------------------- elementwise, reductions, data movement

def _bias_add(p):
    bshape = [1] * len(p["shape"])
    bshape[p["axis"]] = p["shape"][p["axis"]]
    return lambda x, b: x + b.reshape(bshape)


def _reduce(np_fn):
    def make(p):
        axes, keepdims = p["axis"], p["keepdims"]
        out_shape = tuple(1 if d in axes else s for d, s in enumerate(p["shape"])) if keepdims else \
            (tuple(s for d, s in enumerate(p["shape"]) if d not in axes) or (1,))
        return lambda x: np.asarray(np_fn(x, axis=axes)).reshape(out_shape)
    return make


def _transpose(p):
    axes = p["axes"]
    return lambda x: np.ascontiguousarray(np.transpose(x, axes))  # the copy is the work


def _pad(p):
    widths = list(zip(p["pad_before"], p["pad_after"]))
    return lambda x: np.pad(x, widths, mode="constant", constant_values=p["value"])


_BASELINES: dict[str, Callable] = {
    "matmul": _matmul,
    "matmul_int8": _matmul,
    "batch_matmul": _batch_matmul,
    "dense": _dense,
    "dense_gelu": _dense,
    "conv2d_nchw": _conv2d_nchw,
    "conv2d_bias_relu": _conv2d_bias_relu,
    "conv2d_nhwc": _conv2d_nhwc,
    "depthwise_conv2d_nchw": _depthwise_conv2d_nchw,
    "max_pool2d": _max_pool2d,
    "avg_pool2d": _avg_pool2d,
    "softmax": _softmax,
    "layer_norm": _layer_norm,
    "add": lambda p: np.add,
    "mul": lambda p: np.multiply,
    "relu": lambda p: (lambda x: np.maximum(x, x.dtype.type(0))),
    "gelu": lambda p: gelu,
    "bias_add": _bias_add,
    "reduce_sum": _reduce(np.sum),
    "reduce_max": _reduce(np.max),
    "reduce_min": _reduce(np.min),
    "transpose": _transpose,
    "pad": _pad,
}

BASELINE_OPS = tuple(_BASELINES)


NUMPY_BASELINES = frozenset(_BASELINES)


def numpy_baseline(opdef) -> Callable[..., np.ndarray]:
    """The numpy program computing `opdef`: call it with the kernel's input arrays, in order."""
    try:
        make = _BASELINES[opdef.name]
    except KeyError:
        raise KeyError(f"no numpy baseline for operator {opdef.name!r}; "
                       f"have: {', '.join(sorted(_BASELINES))}") from None
    return make(opdef.params)


def time_callable(fn: Callable, args, repeat: int = 10, min_repeat_ms: float = 50.0):
    """Time `fn(*args)` by tunefarm's measurement protocol (compiler/timing.py: the same samples,
    checks and host lock as a kernel's `Kernel.measure`), after one warm-up call: at least
    `repeat` clean samples over at least `min_repeat_ms`. Returns a compiler.timing.Timing."""
    from compiler import host_lock
    from compiler.timing import TimingOptions, time_samples
    if repeat < 1:
        raise ValueError("repeat must be at least 1")

    def run_batch(n):
        for _ in range(n):
            fn(*args)

    with host_lock.exclusive():
        fn(*args)
        return time_samples(run_batch, TimingOptions(min_samples=repeat, min_seconds=min_repeat_ms / 1000.0))
