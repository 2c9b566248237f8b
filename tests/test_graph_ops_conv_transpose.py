"""ConvTranspose against a float64 numpy reference written here (each input position's window
scattered into the output, then the padding cropped), on random non-zero inputs of odd shapes:
strides, pads, output_padding, dilations, groups, bias, output_shape, auto_pad, 1-d and 3-d.
Each case runs both ways it compiles: with a constant weight (a 2-d layer without dilation
becomes a Conv of its output phases, canonical_ops.conv_transpose_to_conv) and with the weight
fed at run time (the direct lowering, ops/conv_transpose.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from graph_models import assert_close, model, rand, run
from onnx import helper

from compiler.graph import build_model, from_onnx
from compiler.graph.errors import ShapeError
from compiler.graph.fuse import fuse

RNG = np.random.default_rng(3)


def np_conv_transpose(x, w, b=None, strides=None, pads=None, dil=None, groups=1, out_pad=None):
    """Scatter x[n, c, i] · w[c, f, k] to position i·s + k·d, then crop the leading pads and
    keep the output's length (natural length - pads, output_padding adds zeros at the end)."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    N, C, *sp = x.shape
    Fg, *kernel = w.shape[1:]
    nd = len(sp)
    strides, dil = strides or (1,) * nd, dil or (1,) * nd
    pads, out_pad = pads or (0,) * (2 * nd), out_pad or (0,) * nd
    full = [s * (i - 1) + (k - 1) * d + 1 + op for s, i, k, d, op in zip(strides, sp, kernel, dil, out_pad)]
    acc = np.zeros((N, Fg * groups, *full))
    Cg = C // groups
    for n, c in itertools.product(range(N), range(C)):
        g = c // Cg
        for i in itertools.product(*(range(s) for s in sp)):
            for k in itertools.product(*(range(s) for s in kernel)):
                o = tuple(ii * s + kk * d for ii, kk, s, d in zip(i, k, strides, dil))
                acc[(n, slice(g * Fg, (g + 1) * Fg), *o)] += x[(n, c, *i)] * w[(c, slice(None), *k)]
    crop = tuple(slice(pads[d], full[d] - pads[nd + d]) for d in range(nd))
    y = acc[(slice(None), slice(None), *crop)]
    if b is not None:
        y = y + b.astype(np.float64).reshape((1, -1) + (1,) * nd)
    return y


CASES = [
    dict(x=(1, 3, 5, 6), w=(3, 4, 3, 3)),                                                  # stride 1: flipped correlation
    dict(x=(2, 4, 5, 7), w=(4, 3, 4, 4), strides=(2, 2), pads=(1, 1, 1, 1), bias=True),     # DCGAN / U-Net 4x4 s2
    dict(x=(1, 5, 4, 5), w=(5, 2, 3, 3), strides=(2, 2), pads=(1, 1, 1, 1), out_pad=(1, 1), bias=True),  # FCN 3x3 s2
    dict(x=(1, 4, 3, 5), w=(4, 3, 2, 2), strides=(2, 2)),                                  # U-Net 2x2 s2
    dict(x=(1, 2, 4, 3), w=(2, 3, 3, 2), strides=(3, 2), pads=(0, 1, 2, 0)),               # stride beyond the kernel, asymmetric
    dict(x=(1, 3, 5, 4), w=(3, 2, 3, 3), strides=(2, 1), dil=(2, 3), pads=(1, 2, 0, 1), bias=True),  # dilations
    dict(x=(2, 6, 4, 5), w=(6, 2, 3, 3), strides=(2, 2), pads=(1, 1, 1, 1), groups=3, bias=True),    # groups
    dict(x=(1, 4, 5, 5), w=(4, 1, 3, 3), strides=(1, 1), pads=(1, 1, 1, 1), groups=4),     # depthwise
    dict(x=(2, 3, 9), w=(3, 5, 4), strides=(3,), pads=(1, 2), bias=True),                  # 1-d
    dict(x=(1, 2, 3, 4, 3), w=(2, 3, 2, 3, 2), strides=(2, 1, 2), pads=(0, 1, 0, 1, 0, 1)),  # 3-d
]


@pytest.mark.parametrize("weight", ["constant", "input"])
@pytest.mark.parametrize("cfg", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_conv_transpose(cfg, weight):
    x, w = rand(RNG, cfg["x"]), rand(RNG, cfg["w"])
    b = rand(RNG, (cfg["w"][1] * cfg.get("groups", 1),)) if cfg.get("bias") else None
    want = np_conv_transpose(x, w, b, cfg.get("strides"), cfg.get("pads"), cfg.get("dil"), cfg.get("groups", 1),
                             cfg.get("out_pad"))
    attrs = {"kernel_shape": list(cfg["w"][2:]), "group": cfg.get("groups", 1)}
    for key, attr in (("strides", "strides"), ("pads", "pads"), ("dil", "dilations"), ("out_pad", "output_padding")):
        if key in cfg:
            attrs[attr] = list(cfg[key])
    inits = {"w": w, **({"b": b} if b is not None else {})}
    node = helper.make_node("ConvTranspose", ["x", *inits], ["y"], **attrs)
    inputs, feeds = {"x": (x.shape, "float32")}, {"x": x}
    if weight == "input":
        inputs["w"], feeds["w"] = (w.shape, "float32"), inits.pop("w")
    m = model([node], inputs, {"y": (want.shape, "float32")}, inits)
    ops = {n.op_type for n in from_onnx(m).nodes}
    phases = weight == "constant" and len(cfg["x"]) == 4 and "dil" not in cfg and len(set(cfg.get("strides", (1,)))) == 1
    assert ("Conv" in ops and "ConvTranspose" not in ops) == phases, ops
    (y,) = run(m, feeds)
    assert_close(y, want)


def test_output_shape_and_auto_pad_place_the_output_as_the_spec_says():
    x, w = rand(RNG, (1, 2, 3, 4)), rand(RNG, (2, 3, 3, 3))
    # output_shape 8 x 10 from a natural 7 x 9 (stride 2): total padding -1, taken at the end
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], output_shape=[8, 10])
    m = model([node], {"x": (x.shape, "float32")}, {"y": ((1, 3, 8, 10), "float32")}, {"w": w})
    (y,) = run(m, {"x": x})
    want = np_conv_transpose(x, w, strides=(2, 2), out_pad=(1, 1))
    assert_close(y, want)
    # SAME_UPPER: output = input · stride, total padding 7 + 0 - 6 = 1 in rows, 9 - 8 = 1 in columns, at the end
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], auto_pad="SAME_UPPER")
    m = model([node], {"x": (x.shape, "float32")}, {"y": ((1, 3, 6, 8), "float32")}, {"w": w})
    (y,) = run(m, {"x": x})
    assert_close(y, np_conv_transpose(x, w, strides=(2, 2), pads=(0, 0, 1, 1)))
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], auto_pad="SAME_LOWER")
    m = model([node], {"x": (x.shape, "float32")}, {"y": ((1, 3, 6, 8), "float32")}, {"w": w})
    (y,) = run(m, {"x": x})
    assert_close(y, np_conv_transpose(x, w, strides=(2, 2), pads=(1, 1, 0, 0)))


@pytest.mark.parametrize("weight", ["constant", "input"])
def test_the_epilogue_fuses(weight):
    """Into the phase interleaving after the Conv, or into the direct lowering's kernel."""
    x, w, b = rand(RNG, (1, 4, 6, 5)), rand(RNG, (4, 3, 4, 4)), rand(RNG, (3,))
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    inputs, inits, feeds = {"x": (x.shape, "float32")}, {"w": w, "b": b}, {"x": x}
    if weight == "input":
        inputs["w"], feeds["w"] = (w.shape, "float32"), inits.pop("w")
    m = model(nodes, inputs, {"y": ((1, 3, 12, 10), "float32")}, inits)
    graph = from_onnx(m)
    groups = ["Conv", "DepthToSpace+Slice+Relu"] if weight == "constant" else ["ConvTranspose+Relu"]
    assert [g.describe() for g in fuse(graph)] == groups
    (y,) = build_model(graph).run(**feeds)
    assert_close(y, np.maximum(np_conv_transpose(x, w, b, (2, 2), (1, 1, 1, 1)), 0))


def test_a_weight_that_does_not_fit_is_refused():
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], group=2)
    m = model([node], {"x": ((1, 4, 3, 3), "float32")}, {"y": (None, "float32")}, {"w": rand(RNG, (3, 2, 3, 3))})
    with pytest.raises(ShapeError, match="does not fit"):
        from_onnx(m)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], kernel_shape=[2, 2])
    m = model([node], {"x": ((1, 4, 3, 3), "float32")}, {"y": (None, "float32")}, {"w": rand(RNG, (4, 2, 3, 3))})
    with pytest.raises(ShapeError, match="kernel_shape"):
        from_onnx(m)
