"""A differential fuzzer at the model level: random small ONNX graphs, tunefarm against onnxruntime.

tests/kernel_fuzz.py (bench/fuzz.py) draws single operators and compute definitions; this draws
whole graphs as exporters write them, so it reaches what only a model reaches: fusion of
epilogues into anchors, constant weights pre-packed for the host, the default schedules of
fused groups at shapes no test names. Three generators:

- `cnn`: 1-4 blocks of the shapes CNN exporters write, on channel counts that are multiples of
  16, of 8 only, or odd (so both the channel-blocked and the NCHW paths run): DenseNet's Concat ->
  BatchNormalization -> Relu, a Pad node (zero or not, asymmetric) before an unpadded Conv,
  ShuffleNet's Reshape -> Transpose -> Reshape channel shuffle, grouped convs (2-8 groups of 3-16
  channels) and depthwise ones, Inception's Concat of conv branches and an AveragePool / MaxPool
  branch, squeeze-excite (GlobalAveragePool -> 1x1 Conv -> act -> 1x1 Conv -> Sigmoid or
  HardSigmoid -> Mul), PRelu / LeakyRelu / HardSwish / Swish activations, nearest Resize x2
  (ONNX's or PyTorch's coordinates, scales or sizes) followed by a Concat, a Dropout with an unread
  mask output, LRN, ResNet basic blocks (projection skip, residual Add) and its 7x7/2 stem with a
  ceil-mode MaxPool; maybe a GlobalAveragePool -> Flatten -> Gemm head;
- `conv`: 1-3 layers of Conv (plain, grouped, depthwise; kernels 1-7, strides, dilations,
  asymmetric pads, odd channel counts, batch 1 or 2), MaxPool or AveragePool, each conv with
  or without a bias and followed by Relu, Clip, Sigmoid or a broadcast Add;
- `transformer`: [B, S, D] inputs through MatMul (+ bias), multi-head attention (Reshape,
  Transpose, MatMul, Softmax), LayerNormalization or its ReduceMean/Sub/Pow/Sqrt/Div spelling,
  activations (Relu, Tanh, Sigmoid, Erf-GELU) and residual Adds.

Each graph runs in onnxruntime (one thread) and through `build_model(from_onnx(...)).run`, on the
same random input; a finding is an error or an output off by more than 1e-4 of the reference's
largest magnitude. Graphs onnxruntime itself refuses are skipped. The seeds are reproducible:
`--seed N --verbose` prints one graph's nodes and the result.

    .venv/bin/python bench/model_fuzz.py --seeds 300 [--start 0] [--kind cnn conv transformer]
    .venv/bin/python bench/model_fuzz.py --seed 339 --kind conv --verbose
    .venv/bin/python bench/model_fuzz.py --seeds 100 --start 200 --kind cnn

Prints a table (graphs drawn, run, findings per generator), every finding on a line, and as its
LAST line one JSON object: {"seeds", "start", "ran": {kind: n}, "findings": [{"kind", "seed",
"message"}], "seconds"}. Exit status 0 even with findings: this is a measurement. Needs the
`bench` extra (onnxruntime).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOLERANCE = 1e-4


class GraphBuilder:
    """Nodes and initializers of one random graph, with fresh names."""

    def __init__(self):
        from onnx import numpy_helper
        self.numpy_helper = numpy_helper
        self.nodes, self.inits, self._n = [], [], 0

    def fresh(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def const(self, array) -> str:
        name = self.fresh("k")
        self.inits.append(self.numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, op: str, inputs: list, **attrs) -> str:
        from onnx import helper
        out = self.fresh(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def model(self, x_shape: list, output: str):
        from onnx import TensorProto, helper
        graph = helper.make_graph(self.nodes, "fuzz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                                  [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)], self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def conv_graph(rng):
    """Conv / pool layers on an NCHW input; (model, input shape) or None if nothing was drawn."""
    g = GraphBuilder()
    C = int(rng.choice([1, 3, 4, 8, 12, 16, 24, 32, 40, 64]))
    shape = [1 if rng.random() < 0.8 else 2, C, int(rng.integers(3, 40)), int(rng.integers(3, 40))]
    x_shape, cur = list(shape), "x"
    for _ in range(int(rng.integers(1, 4))):
        cin, h, w = shape[1], shape[2], shape[3]
        kind = rng.choice(["conv", "depthwise", "pool", "grouped"])
        if kind == "pool" and h >= 2 and w >= 2:
            k = int(rng.integers(1, min(4, h, w) + 1))
            s, p = int(rng.integers(1, 3)), (int(rng.integers(0, k)) if k > 1 else 0)
            cur = g.node(str(rng.choice(["MaxPool", "AveragePool"])), [cur], kernel_shape=[k, k], strides=[s, s],
                         pads=[p] * 4)
            shape = [shape[0], cin, (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1]
            continue
        if kind == "depthwise":
            groups, F = cin, cin * int(rng.choice([1, 1, 2]))
        elif kind == "grouped" and cin % 2 == 0 and cin >= 4:
            groups = int(rng.choice([d for d in (2, 4) if cin % d == 0]))
            F = groups * int(rng.integers(1, 5)) * 2
        else:
            groups, F = 1, int(rng.choice([4, 8, 16, 17, 24, 32, 48, 64]))
        k = int(rng.choice([1, 3, 5, 7])) if h >= 7 and w >= 7 else 1
        s, d = int(rng.choice([1, 1, 2])), (int(rng.choice([1, 1, 2])) if k > 1 else 1)
        span = (k - 1) * d + 1
        pads = [int(rng.integers(0, span)) for _ in range(4)]
        oh, ow = (h + pads[0] + pads[2] - span) // s + 1, (w + pads[1] + pads[3] - span) // s + 1
        if oh < 1 or ow < 1:
            continue
        ins = [cur, g.const((rng.standard_normal((F, cin // groups, k, k)) * 0.3).astype(np.float32))]
        if rng.random() < 0.6:
            ins.append(g.const(rng.standard_normal(F).astype(np.float32)))
        cur = g.node("Conv", ins, kernel_shape=[k, k], strides=[s, s], pads=pads, dilations=[d, d], group=groups)
        shape = [shape[0], F, oh, ow]
        act = rng.choice(["none", "Relu", "Clip", "Sigmoid", "add"])
        if act in ("Relu", "Sigmoid"):
            cur = g.node(str(act), [cur])
        elif act == "Clip":
            cur = g.node("Clip", [cur, g.const(np.array(0, np.float32)), g.const(np.array(6, np.float32))])
        elif act == "add":
            cur = g.node("Add", [cur, g.const(rng.standard_normal((1, F, 1, 1)).astype(np.float32))])
    return (g.model(x_shape, cur), x_shape) if g.nodes else None


def transformer_graph(rng):
    """MatMul / attention / normalization / activation blocks on a [B, S, D] input."""
    g = GraphBuilder()
    B, S, H = int(rng.choice([1, 1, 2])), int(rng.integers(1, 20)), int(rng.choice([1, 2, 3, 4]))
    D = H * int(rng.choice([1, 4, 8, 12, 16]))
    cur, width = "x", D
    f32 = lambda v: g.const(np.array(v, np.float32))  # noqa: E731
    for _ in range(int(rng.integers(1, 4))):
        kind = rng.choice(["linear", "attention", "norm", "activation", "residual"])
        if kind == "linear":
            F = int(rng.choice([1, 5, 8, 16, 24, 40, 64, 100]))
            cur = g.node("MatMul", [cur, g.const((rng.standard_normal((width, F)) / np.sqrt(width)).astype(np.float32))])
            if rng.random() < 0.7:
                cur = g.node("Add", [cur, g.const(rng.standard_normal(F).astype(np.float32))])
            width = F
        elif kind == "attention" and width % H == 0:
            dh = width // H
            q, k, v = (_heads(g, rng, cur, [B, S, H, dh], perm) for perm in ([0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3]))
            p = g.node("Softmax", [g.node("Div", [g.node("MatMul", [q, k]), f32(np.sqrt(dh))])], axis=-1)
            o = g.node("Transpose", [g.node("MatMul", [p, v])], perm=[0, 2, 1, 3])
            cur = g.node("Reshape", [o, g.const(np.array([B, S, width], np.int64))])
        elif kind == "norm":
            if rng.random() < 0.5:
                cur = g.node("LayerNormalization", [cur, g.const(rng.standard_normal(width).astype(np.float32)),
                                                    g.const(rng.standard_normal(width).astype(np.float32))],
                             axis=-1, epsilon=1e-5)
            else:
                centered = g.node("Sub", [cur, g.node("ReduceMean", [cur], axes=[-1], keepdims=1)])   # opset 17: axes an attribute
                var = g.node("ReduceMean", [g.node("Pow", [centered, f32(2.0)])], axes=[-1], keepdims=1)
                cur = g.node("Div", [centered, g.node("Sqrt", [g.node("Add", [var, f32(1e-5)])])])
        elif kind == "activation":
            act = rng.choice(["Relu", "Tanh", "Sigmoid", "gelu"])
            if act == "gelu":
                erf = g.node("Erf", [g.node("Div", [cur, f32(np.sqrt(2))])])
                cur = g.node("Mul", [g.node("Mul", [cur, g.node("Add", [erf, f32(1.0)])]), f32(0.5)])
            else:
                cur = g.node(str(act), [cur])
        elif kind == "residual" and width == D:
            cur = g.node("Add", [cur, "x"])
    return (g.model([B, S, D], cur), [B, S, D]) if g.nodes else None


def _heads(g, rng, x, split: list, perm: list) -> str:
    """A projection of `x` [B, S, H*dh] split into heads ([B, S, H, dh], `split`) and transposed."""
    width = split[2] * split[3]
    w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    t = g.node("Reshape", [g.node("MatMul", [x, g.const(w)]), g.const(np.array(split, np.int64))])
    return g.node("Transpose", [t], perm=perm)


CNN_CHANNELS = [3, 5, 7, 8, 12, 16, 17, 24, 32, 40, 48, 64]   # multiples of 16, of 8 only, and odd: blocked and NCHW paths


def cnn_graph(rng):
    """The block shapes CNN exporters write, stacked 1-4 deep on an NCHW input: DenseNet (Concat ->
    BatchNormalization -> Relu), a Pad node before a Conv (zero or not, asymmetric), ShuffleNet's
    channel shuffle (Reshape -> Transpose -> Reshape), grouped convs (2-8 groups, channels per group
    multiples of 8 or 16 or neither) and depthwise ones, Inception (Concat of conv branches and an
    AveragePool or MaxPool branch), squeeze-excite (GlobalAveragePool -> 1x1 Conv -> act -> 1x1 Conv ->
    Sigmoid or HardSigmoid -> Mul), PRelu / LeakyRelu / HardSwish / Swish activations, nearest Resize
    upsampling followed by a Concat, a Dropout whose mask nobody reads, LRN; maybe a classifier head."""
    g = GraphBuilder()
    shape = [1 if rng.random() < 0.8 else 2, int(rng.choice(CNN_CHANNELS)), int(rng.integers(4, 21)),
             int(rng.integers(4, 21))]
    x_shape, cur = list(shape), "x"
    for _ in range(int(rng.integers(1, 5))):
        block = str(rng.choice(["conv", "pad_conv", "grouped", "shuffle", "dense", "inception", "se", "act",
                                "upsample", "dropout", "lrn", "residual", "stem"]))
        cur, shape = CNN_BLOCKS[block](g, rng, cur, shape)
    if rng.random() < 0.25:   # a classifier head: the blocked layout's way back to NCHW
        pooled = g.node("GlobalAveragePool", [cur])
        flat = g.node("Flatten", [pooled], axis=1)
        F = int(rng.choice([5, 10, 16]))
        cur = g.node("Gemm", [flat, g.const((rng.standard_normal((F, shape[1])) * 0.3).astype(np.float32)),
                              g.const(rng.standard_normal(F).astype(np.float32))], transB=1)
    return (g.model(x_shape, cur), x_shape) if g.nodes else None


def _conv(g, rng, x, shape, F, k=1, groups=1, pads=None, stride=1, bias=None):
    """A Conv of `x` (shape [N, C, H, W]) to F channels; (output, its shape)."""
    N, C, H, W = shape
    pads = [k // 2] * 4 if pads is None else pads
    ins = [x, g.const((rng.standard_normal((F, C // groups, k, k)) * (1.0 / np.sqrt(C // groups * k * k)))
                      .astype(np.float32))]
    if bias if bias is not None else rng.random() < 0.6:
        ins.append(g.const(rng.standard_normal(F).astype(np.float32)))
    out = g.node("Conv", ins, kernel_shape=[k, k], strides=[stride, stride], pads=pads, group=groups)
    return out, [N, F, (H + pads[0] + pads[2] - k) // stride + 1, (W + pads[1] + pads[3] - k) // stride + 1]


def _bn(g, rng, x, C):
    r = lambda: rng.standard_normal(C).astype(np.float32)  # noqa: E731
    return g.node("BatchNormalization", [x, g.const(r()), g.const(r()), g.const(r() * 0.2),
                                         g.const((rng.random(C) + 0.5).astype(np.float32))], epsilon=1e-5)


def _act(g, rng, x, C, choices=("Relu", "PRelu", "LeakyRelu", "HardSwish", "Swish", "Clip", "none")):
    act = str(rng.choice(list(choices)))
    if act == "PRelu":   # the slope per channel ([C, 1, 1], as PyTorch exports it) or one for all
        slope = rng.uniform(0.05, 0.5, (C, 1, 1) if rng.random() < 0.7 else (1,)).astype(np.float32)
        return g.node("PRelu", [x, g.const(slope)])
    if act == "LeakyRelu":
        return g.node("LeakyRelu", [x], alpha=float(rng.choice([0.01, 0.1, 0.2])))
    if act == "Swish":
        return g.node("Mul", [x, g.node("Sigmoid", [x])])
    if act == "Clip":
        return g.node("Clip", [x, g.const(np.array(0, np.float32)), g.const(np.array(6, np.float32))])
    if act == "HardSigmoid":
        return g.node("HardSigmoid", [x], alpha=1 / 6, beta=0.5)
    return x if act == "none" else g.node(act, [x])


def _block_conv(g, rng, x, shape):
    """Conv (1x1 or 3x3, maybe strided) -> maybe BatchNormalization -> activation."""
    k = int(rng.choice([1, 3])) if min(shape[2:]) >= 3 else 1
    out, shape = _conv(g, rng, x, shape, int(rng.choice(CNN_CHANNELS)), k=k, stride=int(rng.choice([1, 1, 2])))
    if rng.random() < 0.5:
        out = _bn(g, rng, out, shape[1])
    return _act(g, rng, out, shape[1]), shape


def _block_pad_conv(g, rng, x, shape):
    """An explicit Pad (asymmetric; zero, as a Conv's own padding folds it, or not) before an unpadded Conv."""
    N, C, H, W = shape
    p = [int(rng.integers(0, 3)) for _ in range(4)]   # top, left, bottom, right
    value = 0.0 if rng.random() < 0.6 else float(rng.choice([0.5, -1.0, 2.0]))
    ins = [x, g.const(np.array([0, 0, p[0], p[1], 0, 0, p[2], p[3]], np.int64))]
    if value != 0.0 or rng.random() < 0.5:
        ins.append(g.const(np.array(value, np.float32)))
    padded = g.node("Pad", ins, mode="constant")
    shape = [N, C, H + p[0] + p[2], W + p[1] + p[3]]
    k = int(rng.choice([1, 3])) if min(shape[2:]) >= 3 else 1
    groups = C if rng.random() < 0.3 else 1
    F = C if groups > 1 else int(rng.choice(CNN_CHANNELS))
    out, shape = _conv(g, rng, padded, shape, F, k=k, groups=groups, pads=[0] * 4, stride=int(rng.choice([1, 2])))
    return _act(g, rng, out, shape[1]), shape


def _block_grouped(g, rng, x, shape):
    """A grouped conv (2-8 groups; channels per group 8, 16 or others) or a depthwise one (channel multiplier 1-2)."""
    N, C, H, W = shape
    k = int(rng.choice([1, 3])) if min(H, W) >= 3 else 1
    if rng.random() < 0.35:
        groups = C
        F = C * int(rng.choice([1, 1, 2]))
        if rng.random() < 0.5:   # a 1x1 conv first, so the depthwise conv sees a chosen channel count
            x, shape = _conv(g, rng, x, shape, int(rng.choice(CNN_CHANNELS)))
            groups = F = shape[1]
    else:
        groups = int(rng.integers(2, 9))
        cin_g, cout_g = (int(rng.choice([3, 4, 5, 8, 16])) for _ in range(2))
        x, shape = _conv(g, rng, x, shape, groups * cin_g)   # a 1x1 conv to a whole number of groups
        F = groups * cout_g
    out, shape = _conv(g, rng, x, shape, F, k=k, groups=groups, stride=int(rng.choice([1, 1, 2])))
    if rng.random() < 0.5:
        out = _bn(g, rng, out, shape[1])
    return _act(g, rng, out, shape[1]), shape


def _block_shuffle(g, rng, x, shape):
    """ShuffleNet's channel shuffle: Reshape [N, g, C/g, H, W] -> Transpose -> Reshape back; a 1x1 conv
    first if C has no factor to shuffle by, a grouped 1x1 conv after."""
    N, C, H, W = shape
    divisors = [d for d in (2, 3, 4, 8) if C % d == 0 and d < C]
    if not divisors:
        x, shape = _conv(g, rng, x, shape, int(rng.choice([8, 12, 16, 24, 32, 48])))
        N, C, H, W = shape
        divisors = [d for d in (2, 3, 4, 8) if C % d == 0 and d < C]
    gr = int(rng.choice(divisors))
    t = g.node("Reshape", [x, g.const(np.array([N, gr, C // gr, H, W], np.int64))])
    t = g.node("Transpose", [t], perm=[0, 2, 1, 3, 4])
    out = g.node("Reshape", [t, g.const(np.array([N, C, H, W] if rng.random() < 0.5 else [N, -1, H, W], np.int64))])
    if rng.random() < 0.6:
        out, shape = _conv(g, rng, out, shape, C, groups=gr)
        out = _act(g, rng, out, C, ("Relu", "none"))
    return out, shape


def _block_dense(g, rng, x, shape):
    """DenseNet: Concat(x, conv(x), ...) -> BatchNormalization -> Relu (the BN after a Concat, not a Conv)."""
    N, C, H, W = shape
    parts, total = [x], C
    for _ in range(int(rng.integers(1, 3))):
        k = int(rng.choice([1, 3])) if min(H, W) >= 3 else 1
        y, ys = _conv(g, rng, x, shape, int(rng.choice([4, 8, 12, 16, 32])), k=k)
        parts.append(g.node("Relu", [y]) if rng.random() < 0.5 else y)
        total += ys[1]
    out = g.node("Concat", parts, axis=1)
    return g.node("Relu", [_bn(g, rng, out, total)]), [N, total, H, W]


def _block_inception(g, rng, x, shape):
    """Inception: Concat of a 1x1 conv, a 3x3 conv (maybe after a 1x1), and a pool branch (AveragePool
    3x3/1 pad 1, with or without counting the pad, or MaxPool) maybe followed by a 1x1 conv."""
    N, C, H, W = shape
    branches, total = [], 0
    y, ys = _conv(g, rng, x, shape, int(rng.choice(CNN_CHANNELS)))
    branches.append(g.node("Relu", [y]))
    total += ys[1]
    if min(H, W) >= 3:
        mid, ms = (x, shape) if rng.random() < 0.5 else _conv(g, rng, x, shape, int(rng.choice([8, 12, 16])))
        y, ys = _conv(g, rng, mid, ms, int(rng.choice(CNN_CHANNELS)), k=3)
        branches.append(g.node("Relu", [y]))
        total += ys[1]
    if rng.random() < 0.7:
        pool = g.node("AveragePool", [x], kernel_shape=[3, 3], strides=[1, 1], pads=[1] * 4,
                      count_include_pad=int(rng.integers(0, 2)))
    else:
        pool = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[1, 1], pads=[1] * 4)
    if rng.random() < 0.6:
        pool, ps = _conv(g, rng, pool, shape, int(rng.choice(CNN_CHANNELS)))
        pool = g.node("Relu", [pool])
        total += ps[1]
    else:
        total += C
    branches.insert(int(rng.integers(0, len(branches) + 1)), pool)
    return g.node("Concat", branches, axis=1), [N, total, H, W]


def _block_se(g, rng, x, shape):
    """Squeeze-excite: GlobalAveragePool -> 1x1 Conv -> act -> 1x1 Conv -> Sigmoid or HardSigmoid -> Mul."""
    N, C, H, W = shape
    s, ss = _conv(g, rng, g.node("GlobalAveragePool", [x]), [N, C, 1, 1], max(1, C // int(rng.choice([2, 4]))),
                  bias=True)
    s = _act(g, rng, s, ss[1], ("Relu", "Swish", "HardSwish"))
    s, _ = _conv(g, rng, s, ss, C, bias=True)
    gate = g.node("Sigmoid", [s]) if rng.random() < 0.5 else g.node("HardSigmoid", [s], alpha=1 / 6, beta=0.5)
    return g.node("Mul", [x, gate] if rng.random() < 0.7 else [gate, x]), shape


def _block_act(g, rng, x, shape):
    return _act(g, rng, x, shape[1], ("PRelu", "LeakyRelu", "HardSwish", "Swish")), shape


def _block_upsample(g, rng, x, shape):
    """Nearest Resize x2 then Concat: a strided path (MaxPool 2/2 or a stride-2 conv) brought back up to
    x's size and concatenated with x (FPN / U-Net), or, at odd sizes, x and a 1x1 conv of x both upsampled."""
    N, C, H, W = shape
    style = str(rng.choice(["onnx", "pytorch", "sizes"]))   # ONNX's defaults, or torch's nearest (asymmetric, floor)
    attrs = {"mode": "nearest"}
    if style != "onnx":
        attrs.update(coordinate_transformation_mode="asymmetric", nearest_mode="floor")

    def up(t, c, h, w):
        """`t` ([N, c, h / 2, w / 2]) upsampled to [N, c, h, w]."""
        if style == "sizes":   # a sizes input (as a traced F.interpolate(size=...) writes it), not scales
            return g.node("Resize", [t, "", "", g.const(np.array([N, c, h, w], np.int64))], **attrs)
        return g.node("Resize", [t, "", g.const(np.array([1, 1, 2, 2], np.float32))], **attrs)
    F = int(rng.choice(CNN_CHANNELS))
    if H % 2 == 0 and W % 2 == 0:
        if rng.random() < 0.5:
            down, ds = _conv(g, rng, g.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2]),
                             [N, C, H // 2, W // 2], F)
        else:
            down, ds = _conv(g, rng, x, shape, F, k=3, stride=2)
        parts = [x, up(down, ds[1], H, W)] if rng.random() < 0.5 else [up(down, ds[1], H, W), x]
        return g.node("Concat", parts, axis=1), [N, C + ds[1], H, W]
    side, ss = _conv(g, rng, x, shape, F)
    return g.node("Concat", [up(x, C, 2 * H, 2 * W), up(side, F, 2 * H, 2 * W)], axis=1), [N, C + ss[1], 2 * H, 2 * W]


def _block_dropout(g, rng, x, shape):
    """Dropout as a PyTorch export in training-mode-off writes it: with a mask output nobody reads."""
    from onnx import helper
    out, mask = g.fresh("dropout"), g.fresh("mask")
    ins = [x] if rng.random() < 0.5 else [x, g.const(np.array(0.3, np.float32))]
    g.nodes.append(helper.make_node("Dropout", ins, [out, mask] if rng.random() < 0.7 else [out]))
    return out, shape


def _block_lrn(g, rng, x, shape):
    """LRN (AlexNet, GoogLeNet): an odd window (onnxruntime refuses even ones), after a Relu."""
    out = g.node("LRN", [g.node("Relu", [x])], size=int(rng.choice([3, 5])), alpha=float(rng.choice([1e-4, 1e-2])),
                 beta=float(rng.choice([0.75, 0.5])), bias=float(rng.choice([1.0, 2.0])))
    return out, shape


def _block_residual(g, rng, x, shape):
    """ResNet's basic block: Conv 3x3 -> BN -> Relu -> Conv 3x3 -> BN, plus x (or a strided 1x1 conv + BN of x
    where the stride or channel count changes; Add or Sum), -> Relu."""
    N, C, H, W = shape
    stride = 2 if rng.random() < 0.3 and min(H, W) >= 4 else 1
    F = C if rng.random() < 0.6 else int(rng.choice(CNN_CHANNELS))
    y, ys = _conv(g, rng, x, shape, F, k=3, stride=stride, bias=False)
    y, ys = _conv(g, rng, g.node("Relu", [_bn(g, rng, y, F)]), ys, F, k=3, bias=False)
    y = _bn(g, rng, y, F)
    skip = x
    if stride != 1 or F != C:
        skip, _ = _conv(g, rng, x, shape, F, stride=stride, bias=False)
        skip = _bn(g, rng, skip, F)
    # Caffe2's exports (the light zoo's ShuffleNet) write the residual as a variadic Sum
    op = "Add" if rng.random() < 0.7 else "Sum"
    return g.node("Relu", [g.node(op, [y, skip] if rng.random() < 0.7 else [skip, y])]), ys


def _block_stem(g, rng, x, shape):
    """ResNet's stem: Conv 7x7/2 pad 3 -> BN -> Relu -> MaxPool 3x3/2 pad 1 (ceil mode or not)."""
    N, C, H, W = shape
    y, ys = _conv(g, rng, x, shape, int(rng.choice([8, 16, 24, 32])), k=7, stride=2, bias=False)
    y = g.node("Relu", [_bn(g, rng, y, ys[1])])
    ceil = int(rng.random() < 0.3)

    def out(n):
        o = (n - 1 + (1 if ceil else 0)) // 2 + 1   # (n + 2 pads - 3) / 2 + 1, floored or ceiled
        return o - 1 if ceil and (o - 1) * 2 >= n + 1 else o   # ONNX drops a window starting in the end pad
    _, F, h, w = ys
    oh, ow = out(h), out(w)
    return g.node("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4, ceil_mode=ceil), [N, F, oh, ow]


CNN_BLOCKS = {"conv": _block_conv, "pad_conv": _block_pad_conv, "grouped": _block_grouped, "shuffle": _block_shuffle,
              "dense": _block_dense, "inception": _block_inception, "se": _block_se, "act": _block_act,
              "upsample": _block_upsample, "dropout": _block_dropout, "lrn": _block_lrn, "residual": _block_residual,
              "stem": _block_stem}


GENERATORS = {"cnn": cnn_graph, "conv": conv_graph, "transformer": transformer_graph}


def reference(model, x):
    """onnxruntime's output, or None when it refuses the graph."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 4   # a refused graph is skipped, not logged
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return session.run(None, {"x": x})[0]
    except Exception:  # noqa: BLE001 - a graph the reference cannot run is no test
        return None


def check(model, x, ref) -> str | None:
    """None if tunefarm's output matches `ref`, else what went wrong."""
    from compiler.graph import from_onnx
    from compiler.graph.runtime import build_model
    try:
        got = build_model(from_onnx(model)).run(x=x)[0]
    except Exception as e:  # noqa: BLE001 - every failure is a finding
        return f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    if got.shape != ref.shape:
        return f"shape {got.shape}, onnxruntime {ref.shape}"
    err = float(np.abs(got.astype(np.float64) - ref).max() / (np.abs(ref).max() + 1e-6))
    if not np.isfinite(err) or err > TOLERANCE:
        return f"wrong: max error {err:.3g} of the reference's largest magnitude"
    return None


def describe(model) -> str:
    from onnx import helper
    return "; ".join(f"{n.op_type}{ {a.name: helper.get_attribute_value(a) for a in n.attribute} or ''}"
                     for n in model.graph.node)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=200, help="seeds per generator")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--seed", type=int, default=None, help="one seed (with --verbose: its graph)")
    ap.add_argument("--kind", nargs="+", choices=sorted(GENERATORS), default=sorted(GENERATORS))
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else list(range(args.start, args.start + args.seeds))
    t0 = time.perf_counter()
    ran = {k: 0 for k in args.kind}
    drawn = {k: 0 for k in args.kind}
    findings = []
    for kind in args.kind:
        for seed in seeds:
            rng = np.random.default_rng(seed)
            made = GENERATORS[kind](rng)
            if made is None:
                continue
            model, x_shape = made
            drawn[kind] += 1
            x = rng.standard_normal(x_shape).astype(np.float32)
            ref = reference(model, x)
            if ref is None:
                continue
            ran[kind] += 1
            problem = check(model, x, ref)
            if args.verbose:
                print(f"{kind} seed {seed}: input {x_shape}: {describe(model)}\n  -> {problem or 'ok'}")
            if problem:
                findings.append({"kind": kind, "seed": seed, "message": problem})
                print(f"FINDING {kind} seed {seed}: {problem}  [{describe(model)}] input {x_shape}", flush=True)
    print(f"{'generator':<14}{'graphs':>8}{'run':>8}{'findings':>10}")
    for kind in args.kind:
        print(f"{kind:<14}{drawn[kind]:>8}{ran[kind]:>8}{sum(f['kind'] == kind for f in findings):>10}")
    print(json.dumps({"seeds": len(seeds), "start": seeds[0], "ran": ran, "findings": findings,
                      "seconds": round(time.perf_counter() - t0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
