"""ConvTranspose (the decoder's upsampling convolution: DCGAN, U-Net, FCN, segmentation heads).

A 2-d layer with constant weights, equal strides and no dilation (what exporters write) is
rewritten before fusion into a Conv of its output phases and a DepthToSpace
(canonical_ops.conv_transpose_to_conv), which runs at the convolution's speed. The rest
(weights computed at run time, dilations, unequal strides, 1-d and 3-d) is lowered here as a
direct compute over the output: each output position gathers the input positions
whose transposed window covers it, so nothing is scattered and nothing is zero-inserted. Along
one spatial axis, output o (p the leading padding, s the stride, d the dilation) receives input
i through tap k when i·s + k·d = o + p:
- d = 1: the taps of o are k = (o + p) mod s + s·j, j < ceil(K / s), reading i = (o + p) // s - j,
  so each output position visits only its own ceil(K / s) taps (a stride-2 4x4 layer: 4 of 16),
  not every tap under a divisibility test; with s = 1 this is a correlation with the flipped
  kernel (i = o + p - j);
- d > 1: every tap k, where s divides o + p - k·d, reading i = (o + p - k·d) / s.
Out-of-range taps and inputs are masked by the reduction's condition. Any number of spatial
axes (1-d, 2-d, 3-d), groups, output_padding, output_shape and auto_pad as the ONNX spec
defines them. The reduction is tagged `conv_transpose` and, like a convolution, takes its bias
and the elementwise nodes after it as an epilogue (OUT_ELEMWISE_FUSABLE);
compiler/ops/schedule_graph_ops.py gives it a vectorized, parallel schedule.
"""

from __future__ import annotations

import numpy as np

from ... import expr as E
from ...tensor import compute, reduce_axis
from ...tensor import sum as te_sum
from ..errors import ShapeError
from .base import FLOATS, Kind, Lazy, ints, materialize, register


def _check(node, opset):
    pad = node.attrs.get("auto_pad", "NOTSET")
    if pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        return f"auto_pad={pad!r}"
    return None


def geometry(node, x_shape, w_shape):
    """(strides, dilations, leading pads, output spatial shape) of a ConvTranspose, per the spec:
    output_shape (when given) or auto_pad SAME_* decide the padding from the total
    s·(in - 1) + output_padding + (k - 1)·d + 1 - out."""
    nd = len(x_shape) - 2
    where = f"ConvTranspose node {node.name!r}"
    strides = ints(node, "strides") or (1,) * nd
    dil = ints(node, "dilations") or (1,) * nd
    out_pad = ints(node, "output_padding") or (0,) * nd
    kernel = tuple(w_shape[2:])
    given = ints(node, "kernel_shape")
    if given is not None and tuple(given) != kernel:
        raise ShapeError(f"{where}: kernel_shape {given} differs from the weight's {kernel}")
    if len(strides) != nd or len(dil) != nd or len(out_pad) != nd:
        raise ShapeError(f"{where}: strides {strides}, dilations {dil}, output_padding {out_pad} "
                         f"do not all have {nd} values")
    if min(strides) < 1 or min(dil) < 1 or min(out_pad) < 0:
        raise ShapeError(f"{where}: strides and dilations must be >= 1, output_padding >= 0")
    natural = [s * (i - 1) + op + (k - 1) * d + 1 for s, i, op, k, d in zip(strides, x_shape[2:], out_pad, kernel, dil)]
    auto = node.attrs.get("auto_pad", "NOTSET")
    out_shape = ints(node, "output_shape")
    if out_shape is not None and len(out_shape) == nd + 2:
        out_shape = out_shape[2:]   # some exporters write the whole shape
    if out_shape is None and auto in ("SAME_UPPER", "SAME_LOWER"):
        out_shape = tuple(i * s for i, s in zip(x_shape[2:], strides))
    if out_shape is not None:
        if len(out_shape) != nd:
            raise ShapeError(f"{where}: output_shape {out_shape} is not {nd}-d")
        begin = []
        for total in (n - o for n, o in zip(natural, out_shape)):
            begin.append(total // 2 if auto == "SAME_UPPER" else total - total // 2)
        out = tuple(int(o) for o in out_shape)
    else:
        pads = (0,) * (2 * nd) if auto == "VALID" else (ints(node, "pads") or (0,) * (2 * nd))
        if len(pads) != 2 * nd:
            raise ShapeError(f"{where}: pads {pads} are not {2 * nd} values")
        begin = list(pads[:nd])
        out = tuple(n - b - e for n, b, e in zip(natural, pads[:nd], pads[nd:]))
    if min(out) < 1:
        raise ShapeError(f"{where}: the output would be empty ({out})")
    return tuple(strides), tuple(dil), tuple(begin), out


def _infer(node, ins, opset):
    x, w = ins[0], ins[1]
    if len(x.shape) < 3 or len(w.shape) != len(x.shape):
        raise ShapeError(f"ConvTranspose node {node.name!r}: data {x.shape} and weight {w.shape} must be "
                         "N, C, spatial... and C, F/group, kernel...")
    if x.dtype not in FLOATS or w.dtype != x.dtype:
        raise ShapeError(f"ConvTranspose node {node.name!r}: float data and weight of one dtype, "
                         f"got {x.dtype}, {w.dtype}")
    groups = int(node.attrs.get("group", 1))
    C = x.shape[1]
    if groups < 1 or C % groups or w.shape[0] != C:
        raise ShapeError(f"ConvTranspose node {node.name!r}: weight {w.shape} does not fit data {x.shape} "
                         f"with group={groups}")
    F = w.shape[1] * groups
    if len(ins) > 2 and ins[2] is not None and ins[2].shape != (F,):
        raise ShapeError(f"ConvTranspose node {node.name!r}: bias shape {ins[2].shape}, expected ({F},)")
    _, _, _, out = geometry(node, x.shape, w.shape)
    return [((x.shape[0], F) + out, x.dtype)]


def conv_transpose(x, w, strides, dilations, pads, out_spatial, groups: int, name: str = "conv_transpose"):
    """The transposed convolution of x [N, C, *in] by w [C, F/groups, *kernel] (see the module
    docstring), without bias: one reduction stage over the group's input channels and taps."""
    N, C, *in_sp = x.shape
    Fg, *kernel = w.shape[1:]
    Cg = C // groups
    F = Fg * groups
    rc = reduce_axis(Cg, "rc")
    # per spatial axis, the taps one output position visits (see the module docstring)
    axes_plan = [reduce_axis(-(-k // s) if dl == 1 else k, f"rk{d}")
                 for d, (k, s, dl) in enumerate(zip(kernel, strides, dilations))]

    def body(n, f, *o):
        g = f // Fg if groups > 1 else 0
        fo = f % Fg if groups > 1 else f
        c = g * Cg + rc.var if groups > 1 else rc.var
        x_idx, w_idx, conds = [], [], []
        for d, r in enumerate(axes_plan):
            s, dl, k, p, size = strides[d], dilations[d], kernel[d], pads[d], in_sp[d]
            t = o[d] + p if p else o[d]
            j = r.var
            if dl == 1 and s == 1:
                i, tap = t - j, j
            elif dl == 1:
                tap = t % s + j * s
                i = t // s - j
                if k % s:
                    conds.append(tap < k)
            else:
                u = t - j * dl
                i = u // s if s > 1 else u
                tap = j
                if s > 1:   # the range on u, which the bounds check carries through u // s
                    conds.extend([E.equal(u % s, 0), u >= 0, u <= (size - 1) * s])
                    x_idx.append(i)
                    w_idx.append(tap)
                    continue
            conds.extend([i >= 0, i < size])
            x_idx.append(i)
            w_idx.append(tap)
        where = conds[0]
        for cnd in conds[1:]:
            where = where & cnd
        return te_sum(x[(n, c, *x_idx)] * w[(c, fo, *w_idx)], axis=[rc, *axes_plan], where=where)
    return compute((N, F, *out_spatial), body, name=name, tag="conv_transpose",
                   attrs=dict(strides=tuple(strides), dilations=tuple(dilations), pads=tuple(pads), groups=groups))


def _lower(node, xs, ins, opset):
    x, w = materialize(xs[0], "data"), materialize(xs[1], "weight")
    strides, dil, begin, out = geometry(node, x.shape, w.shape)
    y = Lazy.of(conv_transpose(x, w, strides, dil, begin, out, int(node.attrs.get("group", 1))))
    if len(xs) > 2 and xs[2] is not None:
        b = xs[2]
        return Lazy(y.shape, y.dtype, lambda idx: y.read(idx) + b.read((idx[1],)))
    return y


def _fold(node, arrays, opset):
    """The transposed convolution in float64 numpy, by scattering each input position's window."""
    x, w = arrays[0].astype(np.float64), arrays[1].astype(np.float64)
    strides, dil, begin, out = geometry(node, x.shape, w.shape)
    groups = int(node.attrs.get("group", 1))
    N, C, *in_sp = x.shape
    Fg, *kernel = w.shape[1:]
    Cg = C // groups
    full = [s * (i - 1) + (k - 1) * d + 1 for s, i, k, d in zip(strides, in_sp, kernel, dil)]
    lo = [min(0, b) for b in begin]            # room for negative leading padding (output before the input)
    size = [max(f, b + o) - min(0, b) for f, b, o in zip(full, begin, out)]
    acc = np.zeros((N, Fg * groups, *size))
    for g in range(groups):
        xs = x[:, g * Cg:(g + 1) * Cg]
        wg = w[g * Cg:(g + 1) * Cg]
        for k in np.ndindex(*kernel):
            contrib = np.einsum("nc...,cf->nf...", xs, wg[(slice(None), slice(None), *k)])
            sl = tuple(slice(kk * d - lo_d, kk * d - lo_d + s * (i - 1) + 1, s)
                       for kk, d, lo_d, s, i in zip(k, dil, lo, strides, in_sp))
            acc[(slice(None), slice(g * Fg, (g + 1) * Fg), *sl)] += contrib
    crop = tuple(slice(b - lo_d, b - lo_d + o) for b, lo_d, o in zip(begin, lo, out))
    y = acc[(slice(None), slice(None), *crop)]
    if len(arrays) > 2 and arrays[2] is not None:
        y = y + arrays[2].astype(np.float64).reshape((1, -1) + (1,) * len(in_sp))
    return [y.astype(arrays[0].dtype)]


register("ConvTranspose", Kind.OUT_ELEMWISE_FUSABLE, _infer, _lower, _fold, check=_check)

__all__ = ["conv_transpose", "geometry"]
