"""The channel-blocked layout: conv2d_nchwc kernels against a float64 numpy reference, and
networks compiled through compiler.graph.layout against numpy, with the layout's borders
(ToNCHWc, FromNCHWc) only where the blocked region begins and ends."""

from __future__ import annotations

import numpy as np
import pytest
from graph_models import assert_close, model, np_bn, np_conv, np_pool, rand
from onnx import helper

from compiler import expr as E
from compiler.graph import build_model, from_onnx
from compiler.graph.errors import UnsupportedModelError
from compiler.graph.runtime import for_target
from compiler.ops import default_schedule
from compiler.ops import functions as fn
from compiler.ops.custom import custom_op
from compiler.runtime import build
from compiler.target import resolve_target
from compiler.tensor import compute, placeholder

RNG = np.random.default_rng(11)
TARGET = resolve_target(None)
B = TARGET.vector_lanes("float32")


def blocked(x, b):
    N, C, H, W = x.shape
    cp = -(-C // b) * b
    xp = np.zeros((N, cp, H, W), x.dtype)
    xp[:, :C] = x
    return np.ascontiguousarray(xp.reshape(N, cp // b, b, H, W).transpose(0, 1, 3, 4, 2))


def unblocked(y, channels):
    N, FO, H, W, b = y.shape
    return y.transpose(0, 1, 4, 2, 3).reshape(N, FO * b, H, W)[:, :channels]


CASES = [   # C, F, H, W, k, stride, pads, dilation, depthwise, data blocked
    (2 * B, B, 9, 11, 3, (1, 1), (1, 1, 1, 1), (1, 1), False, True),
    (B, 2 * B, 7, 13, 3, (2, 2), (0, 1, 1, 0), (1, 1), False, True),
    (B, B, 10, 10, 3, (1, 1), (2, 2, 2, 2), (2, 2), False, True),
    (2 * B, 3 * B, 5, 6, 1, (1, 1), (0, 0, 0, 0), (1, 1), False, True),
    (3, B, 15, 17, 3, (2, 2), (1, 1, 1, 1), (1, 1), False, False),      # an RGB stem, NCHW data
    (2 * B, 2 * B, 13, 9, 3, (1, 1), (1, 1, 1, 1), (1, 1), True, True),  # depthwise
    (B, B, 14, 11, 3, (2, 2), (1, 1, 1, 1), (1, 1), True, True),         # depthwise, stride 2 (pad inlined)
    (B, B, 9, 9, 5, (1, 2), (2, 2, 2, 2), (1, 1), True, True),
]


# Dense tiles whose weights overflow half the L1, in rows of several tiles: a row of output
# blocks accumulated over chunks of input blocks (row_accumulated_tile, taken here whatever the
# host's L2 bandwidth); sizes that the tile's columns do not divide, stride, asymmetric padding,
# dilation, output blocks the tile does not divide, a 1x1 with many input blocks (chunks of several).
ROW_CASES = [   # C, F, H, W, k, stride, pads, dilation
    (8 * B, 4 * B, 9, 19, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    (8 * B, 3 * B, 7, 29, 3, (2, 2), (0, 1, 1, 0), (1, 1)),
    (16 * B, 5 * B, 10, 20, 3, (1, 1), (2, 2, 2, 2), (2, 2)),
    (48 * B, 4 * B, 5, 17, 1, (1, 1), (0, 0, 0, 0), (1, 1)),
]


@pytest.mark.parametrize("case", CASES)
def test_conv2d_nchwc_kernel_matches_numpy(case):
    check_conv_kernel(case)


@pytest.mark.parametrize("case", ROW_CASES)
def test_row_accumulated_conv2d_nchwc_matches_numpy(case, monkeypatch):
    import compiler.ops.schedule_conv_nchwc as nchwc
    calls = []
    original = nchwc.row_accumulated_tile
    monkeypatch.setattr(nchwc, "row_accumulated_tile", lambda *a, **k: calls.append(a[4]) or original(*a, **k))
    monkeypatch.setattr(nchwc, "L2_WEIGHT_STREAM", 0)
    check_conv_kernel((*case, False, True))
    assert len(calls) == 1 and calls[0] >= 1   # the row path, with a chunk of input blocks


def conv_relu_opdef(C, F, H, W, k, stride, pads, dil, depthwise, is_blocked, b=B):
    xshape = (1, C // b, H, W, b) if is_blocked else (1, C, H, W)
    wshape = (F // b, C // b, k, k, b, b) if is_blocked and not depthwise else (F // b, 1 if depthwise else C, k, k, b)
    X, Wt, Bias = placeholder(xshape, "float32", "x"), placeholder(wshape, "float32", "w"), \
        placeholder((F // b, b), "float32", "b")
    conv = fn.conv2d_nchwc(X, Wt, stride, pads, dil, depthwise)
    out = compute(conv.shape, lambda n, f, y, x_, fi: E.maximum(conv[n, f, y, x_, fi] + Bias[f, fi], 0.0),
                  name="epilogue", tag="elemwise")
    return custom_op("conv_relu", [X, Wt, Bias], out)


def check_conv_kernel(case):
    C, F, H, W, k, stride, pads, dil, depthwise, is_blocked = case
    x = rand(RNG, (1, C, H, W))
    w = rand(RNG, (F, 1 if depthwise else C, k, k))
    bias = rand(RNG, (F,))
    xd = blocked(x, B) if is_blocked else x
    wp = fn.pack_conv_weight_nchwc(w, B, B if is_blocked and not depthwise else 0)
    opdef = conv_relu_opdef(*case)
    kernel = build(default_schedule(opdef, TARGET), opdef.tensors, TARGET)
    y = np.full(opdef.output.shape, np.nan, np.float32)
    kernel(xd, wp, bias.reshape(F // B, B), y)
    want = np.maximum(np_conv(x, w, bias, stride, pads, dil, C if depthwise else 1), 0)
    assert_close(unblocked(y, F), want)


# ResNet-, VGG- and DenseNet-sized layers on hosts of both vector widths: the default schedule is
# the register or row tile, never the plain loop nest that too much unrolled code falls back to
# (AVX-512's 4 x 6 row tile times 16 channels did, 100x slower).
LAYERS = [   # C, F, H, W, k, stride
    (256, 384, 12, 12, 3, 1), (256, 256, 14, 14, 3, 1), (512, 512, 7, 7, 3, 1), (128, 128, 56, 56, 3, 1),
    (1024, 256, 14, 14, 1, 1), (256, 1024, 14, 14, 1, 1), (512, 128, 28, 28, 1, 1), (256, 256, 28, 28, 3, 2),
]


@pytest.mark.parametrize("cpu", ["znver3", "znver4", "skylake-avx512"])
def test_default_conv_schedules_stay_tiled_on_every_vector_width(cpu):
    from compiler.lower import lower
    from compiler.target import Target
    target = Target.from_string(f"llvm -mtriple={TARGET.triple} -mcpu={cpu} -num-cores=2")
    b = target.vector_lanes("float32")
    for C, F, H, W, k, stride in LAYERS:
        opdef = conv_relu_opdef(C, F, H, W, k, (stride, stride), (k // 2,) * 4, (1, 1), False, True, b)
        code = str(lower(default_schedule(opdef, target), opdef.tensors))
        assert "parallel for" in code and "unrolled for" in code, (cpu, C, F, H, k)


def test_row_accumulation_where_the_weight_stream_outruns_l2():
    """Zen 3's AVX2 tile of ResNet's 256-channel 3x3 layer asks 21 bytes of weights a cycle from
    L2 and is row-accumulated; Zen 4's AVX-512 tiles ask 9-16 and keep the whole reduction."""
    from compiler.ops.schedule_anchor import anchor_view
    from compiler.ops.schedule_conv_nchwc import nchwc_tile, row_chunk
    from compiler.target import Target
    chosen = {}
    for cpu in ("znver3", "znver4"):
        target = Target.from_string(f"llvm -mtriple={TARGET.triple} -mcpu={cpu} -num-cores=2")
        b = target.vector_lanes("float32")
        view = anchor_view(conv_relu_opdef(256, 256, 14, 14, 3, (1, 1), (1,) * 4, (1, 1), False, True, b))
        FOB, XB, YB = nchwc_tile(view, target)
        chosen[cpu] = row_chunk(view, target, FOB, XB, YB)
    assert chosen["znver3"] >= 1 and chosen["znver4"] == 0


def test_conv2d_nchwc_refuses_mismatched_operands():
    from compiler.errors import ExprError
    X = placeholder((1, 2, 8, 8, B), "float32", "x")
    with pytest.raises(ExprError, match="depthwise"):
        fn.conv2d_nchwc(X, placeholder((1, 1, 3, 3, B), "float32", "w"), depthwise=True)
    with pytest.raises(ExprError, match="input channels"):
        fn.conv2d_nchwc(X, placeholder((1, 1, 3, 3, B, B), "float32", "w"))
    with pytest.raises(ExprError, match=r"\[F/FB, C/CB, KH, KW, CB, FB\]"):   # 5-d weights for blocked data
        fn.conv2d_nchwc(X, placeholder((1, 2 * B, 3, 3, B), "float32", "w"))


def test_blocked_weights_are_laid_out_as_the_reduction_reads_them():
    """pack_conv_weight_nchwc puts w[f, c, ky, kx] at [f // B, c // B, ky, kx, c % B, f % B]."""
    w = rand(RNG, (2 * B, 3 * B, 3, 2))
    packed = fn.pack_conv_weight_nchwc(w, B, B)
    assert packed.shape == (2, 3, 3, 2, B, B)
    f, c, ky, kx = B + 3, 2 * B + 1, 2, 1
    assert packed[f // B, c // B, ky, kx, c % B, f % B] == w[f, c, ky, kx]


def inverted_residual(C=3, H=17, W=19, mid=24, out=40, classes=5):
    """A MobileNetV2-like network: stem, an expanded depthwise block with a residual Add (24
    channels: not a whole number of blocks on 16-lane targets), a strided depthwise layer, a
    pointwise projection, then global pooling and a classifier."""
    p = {"w0": rand(RNG, (mid, C, 3, 3)), "b0": rand(RNG, (mid,)),
         "w1": rand(RNG, (2 * mid, mid, 1, 1)), "b1": rand(RNG, (2 * mid,)),
         "w2": rand(RNG, (2 * mid, 1, 3, 3)), "b2": rand(RNG, (2 * mid,)),
         "w3": rand(RNG, (mid, 2 * mid, 1, 1)), "b3": rand(RNG, (mid,)),
         "w4": rand(RNG, (mid, 1, 3, 3)), "b4": rand(RNG, (mid,)),
         "w5": rand(RNG, (out, mid, 1, 1)), "b5": rand(RNG, (out,)),
         "fc": rand(RNG, (classes, out)), "fcb": rand(RNG, (classes,)),
         "lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)}
    conv = lambda x, w, b, y, **a: helper.make_node("Conv", [x, w, b], [y], name=y, **a)  # noqa: E731
    clip = lambda x, y: helper.make_node("Clip", [x, "lo", "hi"], [y], name=y)  # noqa: E731
    nodes = [conv("x", "w0", "b0", "s", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), clip("s", "s6"),
             conv("s6", "w1", "b1", "e", kernel_shape=[1, 1]), clip("e", "e6"),
             conv("e6", "w2", "b2", "d", kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=2 * mid), clip("d", "d6"),
             conv("d6", "w3", "b3", "p", kernel_shape=[1, 1]),
             helper.make_node("Add", ["p", "s6"], ["r"], name="residual"),
             conv("r", "w4", "b4", "d2", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], group=mid),
             helper.make_node("Relu", ["d2"], ["d2r"], name="relu"),
             conv("d2r", "w5", "b5", "q", kernel_shape=[1, 1]),
             helper.make_node("GlobalAveragePool", ["q"], ["g"], name="pool"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], name="fc", transB=1)]
    m = model(nodes, {"x": ((1, C, H, W), "float32")}, {"y": (None, "float32")}, p)
    return m, p


def np_inverted_residual(x, p):
    mid = p["w0"].shape[0]
    s6 = np.clip(np_conv(x, p["w0"], p["b0"], (2, 2), (1, 1, 1, 1)), 0, 6)
    e6 = np.clip(np_conv(s6, p["w1"], p["b1"]), 0, 6)
    d6 = np.clip(np_conv(e6, p["w2"], p["b2"], pads=(1, 1, 1, 1), groups=2 * mid), 0, 6)
    r = np_conv(d6, p["w3"], p["b3"]) + s6
    d2 = np.maximum(np_conv(r, p["w4"], p["b4"], (2, 2), (1, 1, 1, 1), groups=mid), 0)
    q = np_conv(d2, p["w5"], p["b5"])
    return q.mean(axis=(2, 3)) @ p["fc"].T.astype(np.float64) + p["fcb"]


def test_a_network_with_depthwise_layers_runs_blocked_and_matches_numpy():
    m, p = inverted_residual()
    graph = from_onnx(m)
    compiled = for_target(graph, TARGET)
    ops = [n.op_type for n in compiled.nodes]
    assert ops.count("ConvNCHWc") == 6 and "Conv" not in ops
    # the stem reads the RGB image as it is; the only way back out is before the global pool
    assert ops.count("ToNCHWc") == 0 and ops.count("FromNCHWc") == 1
    x = rand(RNG, (1, 3, 17, 19))
    (y,) = build_model(graph).run(x=x)
    assert_close(y, np_inverted_residual(x, p))


def test_a_lone_convolution_and_mostly_padding_channels_keep_nchw():
    w = rand(RNG, (B, 4, 3, 3))
    lone = model([helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
                 {"x": ((1, 4, 6, 6), "float32")}, {"y": (None, "float32")}, {"w": w})
    ops = [n.op_type for n in for_target(from_onnx(lone), TARGET).nodes]
    assert "ConvNCHWc" not in ops and "ToNCHWc" not in ops
    narrow = model([helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[1, 1]),
                    helper.make_node("Conv", ["a", "w2"], ["y"], kernel_shape=[1, 1])],
                   {"x": ((1, 4, 6, 6), "float32")}, {"y": (None, "float32")},
                   {"w1": rand(RNG, (4, 4, 1, 1)), "w2": rand(RNG, (4, 4, 1, 1))})   # 4 channels: 3/4 padding
    assert "ConvNCHWc" not in [n.op_type for n in for_target(from_onnx(narrow), TARGET).nodes]


@pytest.mark.parametrize("ceil_mode", [0, 1])
def test_a_residual_network_pools_blocked_and_matches_numpy(ceil_mode):
    """Stem (RGB, read as NCHW) → relu → max pool in the blocked layout (padding never wins, nor
    do ceil mode's overhanging windows) → a residual pair → global pool."""
    p = {"w0": rand(RNG, (B, 3, 3, 3)), "w1": rand(RNG, (B, B, 3, 3)), "b1": rand(RNG, (B,))}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["s"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["s"], ["sr"]),
             helper.make_node("MaxPool", ["sr"], ["m"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                              ceil_mode=ceil_mode),
             helper.make_node("Conv", ["m", "w1", "b1"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "m"], ["r"]), helper.make_node("Relu", ["r"], ["rr"]),
             helper.make_node("GlobalAveragePool", ["rr"], ["y"])]
    m = model(nodes, {"x": ((1, 3, 22, 20), "float32")}, {"y": (None, "float32")}, p, opset=11)
    graph = from_onnx(m)
    ops = [n.op_type for n in for_target(graph, TARGET).nodes]
    assert ops.count("ConvNCHWc") == 2 and "MaxPoolNCHWc" in ops and "MaxPool" not in ops
    x = rand(RNG, (1, 3, 22, 20))
    (y,) = build_model(graph).run(x=x)
    sr = np.maximum(np_conv(x, p["w0"], stride=(2, 2), pads=(1, 1, 1, 1)), 0)   # 11 x 10
    # ceil mode: a sixth window over the 10 columns, one more column of -inf padding
    pooled = np_pool(sr, (3, 3), (2, 2), (1, 1, 1, 2 if ceil_mode else 1), "max")
    assert pooled.shape[3] == (6 if ceil_mode else 5)
    rr = np.maximum(np_conv(pooled, p["w1"], p["b1"], pads=(1, 1, 1, 1)) + pooled, 0)
    assert_close(y, rr.mean(axis=(2, 3), keepdims=True))


def test_a_blocked_value_read_by_an_nchw_node_and_as_an_output_is_converted_once():
    """A depthwise layer's output is both a graph output and read by a Softmax (not kept in
    the layout): one FromNCHWc serves both."""
    w1, w2 = rand(RNG, (B, 1, 3, 3)), rand(RNG, (B, 1, 3, 3))
    m = model([helper.make_node("Conv", ["x", "w1"], ["e"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=B),
               helper.make_node("Conv", ["e", "w2"], ["d"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=B),
               helper.make_node("Softmax", ["d"], ["s"], axis=1)],
              {"x": ((1, B, 5, 7), "float32")}, {"d": (None, "float32"), "s": (None, "float32")},
              {"w1": w1, "w2": w2})
    graph = from_onnx(m)
    ops = [n.op_type for n in for_target(graph, TARGET).nodes]
    assert ops.count("ToNCHWc") == 1 and ops.count("FromNCHWc") == 1
    x = rand(RNG, (1, B, 5, 7))
    d, s = build_model(graph).run(x=x)
    want = np_conv(np_conv(x, w1, pads=(1, 1, 1, 1), groups=B), w2, pads=(1, 1, 1, 1), groups=B)
    assert_close(d, want)
    e = np.exp(want - want.max(axis=1, keepdims=True))
    assert_close(s, e / e.sum(axis=1, keepdims=True))


def test_the_layout_operators_are_not_read_from_onnx():
    m = model([helper.make_node("ToNCHWc", ["x"], ["y"], block=16)], {"x": ((1, 16, 2, 2), "float32")},
              {"y": (None, "float32")})
    with pytest.raises(UnsupportedModelError, match="ToNCHWc"):
        from_onnx(m)


def test_a_dense_block_concatenates_normalizes_and_pools_blocked():
    """DenseNet's pattern: the block's input and each layer's output concatenated along channels,
    a BatchNorm that cannot fold (after the Concat) and a ReLU, then a transition's average
    pool (with and without the padding counted) and a global max pool. The whole region stays
    blocked: one copy in, one out (before the Flatten)."""
    C, G = 2 * B, B
    bn = {k: rand(RNG, (C + G,)) for k in ("g", "beta", "mean")}
    bn["var"] = RNG.uniform(0.5, 1.5, C + G).astype(np.float32)
    p = {"w1": rand(RNG, (G, C, 3, 3)), "w2": rand(RNG, (C, C + G, 1, 1)), **bn}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["x", "c1"], ["cat"], axis=1),
             helper.make_node("BatchNormalization", ["cat", "g", "beta", "mean", "var"], ["n"], epsilon=1e-3),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["c2"], kernel_shape=[1, 1]),
             helper.make_node("AveragePool", ["c2"], ["a1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["c2"], ["a2"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                              count_include_pad=1),
             helper.make_node("Concat", ["a1", "a2"], ["a"], axis=-3),
             helper.make_node("GlobalMaxPool", ["a"], ["gm"]), helper.make_node("Flatten", ["gm"], ["y"])]
    m = model(nodes, {"x": ((1, C, 9, 10), "float32")}, {"y": (None, "float32")}, p)
    graph = from_onnx(m)
    ops = [n.op_type for n in for_target(graph, TARGET).nodes]
    assert ops.count("ToNCHWc") == 1 and ops.count("FromNCHWc") == 1
    assert ops.count("AveragePoolNCHWc") == 2 and "GlobalPoolNCHWc" in ops and ops.count("Concat") == 2
    assert "AveragePool" not in ops and "GlobalMaxPool" not in ops
    x = rand(RNG, (1, C, 9, 10))
    (y,) = build_model(graph).run(x=x)
    cat = np.concatenate([x, np_conv(x, p["w1"], pads=(1, 1, 1, 1))], axis=1)
    r = np.maximum(np_bn(cat, p["g"], p["beta"], p["mean"], p["var"], 1e-3), 0)
    c2 = np_conv(r, p["w2"])
    a = np.concatenate([np_pool(c2, (3, 3), (2, 2), (1, 1, 1, 1), "avg"),
                        np_pool(c2, (3, 3), (2, 2), (1, 1, 1, 1), "avg", count_include_pad=True)], axis=1)
    assert_close(y, a.max(axis=(2, 3)))


def test_a_squeeze_excite_block_and_a_pad_before_a_conv_stay_blocked():
    """EfficientNet's squeeze-excite: a global average pool, two 1x1 convolutions on the pooled
    map, a sigmoid gate multiplied into the activation (broadcast over rows and columns), then
    a Pad node before an average pool. Channels that do not fill their blocks (1.5 blocks)
    keep the padding channels finite: the gate multiplies them, Div is left NCHW."""
    C, S = B + B // 2, B
    p = {"w0": rand(RNG, (C, 3, 3, 3)), "wr": rand(RNG, (S, C, 1, 1)), "br": rand(RNG, (S,)),
         "we": rand(RNG, (C, S, 1, 1)), "be": rand(RNG, (C,)), "w3": rand(RNG, (C, C, 3, 3)),
         "shift": rand(RNG, (C, 1, 1)), "pads": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64),
         "two": np.array([2.0], np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["h"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["h"], ["hs"]), helper.make_node("Mul", ["h", "hs"], ["act"]),
             helper.make_node("GlobalAveragePool", ["act"], ["sq"]),
             helper.make_node("Conv", ["sq", "wr", "br"], ["z"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["z"], ["zr"]),
             helper.make_node("Conv", ["zr", "we", "be"], ["e"], kernel_shape=[1, 1]),
             helper.make_node("Sigmoid", ["e"], ["gate"]), helper.make_node("Mul", ["act", "gate"], ["scaled"]),
             helper.make_node("Add", ["scaled", "shift"], ["shifted"]),
             helper.make_node("Pad", ["shifted", "pads"], ["padded"]),
             helper.make_node("AveragePool", ["padded"], ["pooled"], kernel_shape=[2, 2], strides=[1, 1]),
             helper.make_node("Conv", ["pooled", "w3"], ["c3"], kernel_shape=[3, 3]),
             helper.make_node("Div", ["c3", "two"], ["y"])]
    m = model(nodes, {"x": ((1, 3, 8, 9), "float32")}, {"y": (None, "float32")}, p)
    graph = from_onnx(m)
    ops = [n.op_type for n in for_target(graph, TARGET).nodes]
    assert ops.count("ConvNCHWc") == 4 and "GlobalPoolNCHWc" in ops and "Pad" in ops and "AveragePoolNCHWc" in ops
    assert ops.count("ToNCHWc") == 0 and ops.count("FromNCHWc") == 1 and ops.index("FromNCHWc") < ops.index("Div")
    x = rand(RNG, (1, 3, 8, 9))
    (y,) = build_model(graph).run(x=x)
    h = np_conv(x, p["w0"], pads=(1, 1, 1, 1))
    act = h / (1 + np.exp(-h))
    z = np.maximum(np_conv(act.mean(axis=(2, 3), keepdims=True), p["wr"], p["br"]), 0)
    gate = 1 / (1 + np.exp(-np_conv(z, p["we"], p["be"])))
    shifted = np.pad(act * gate + p["shift"], ((0, 0), (0, 0), (1, 2), (2, 1)))
    assert_close(y, np_conv(np_pool(shifted, (2, 2), (1, 1), (0, 0, 0, 0), "avg"), p["w3"]) / 2)


@pytest.mark.parametrize("groups, cpg_blocks, fpg_blocks, k, stride", [(2, 1, 2, 3, (1, 1)), (3, 2, 1, 1, (2, 2)),
                                                                       (4, 1, 1, 3, (2, 1))])
def test_grouped_convolutions_of_whole_blocks_run_blocked_and_match_numpy(groups, cpg_blocks, fpg_blocks, k, stride):
    """AlexNet's two groups, ResNeXt-like groups: every group's channels whole blocks, so the
    convolution stays blocked (each output block reads its own group's input blocks), between
    two dense layers, with a bias and a per-channel PRelu."""
    C, F = groups * cpg_blocks * B, groups * fpg_blocks * B
    p = {"w0": rand(RNG, (C, 3, 3, 3)), "wg": rand(RNG, (F, C // groups, k, k)), "bg": rand(RNG, (F,)),
         "w2": rand(RNG, (B, F, 1, 1))}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["ar"]),
             helper.make_node("Conv", ["ar", "wg", "bg"], ["g"], kernel_shape=[k, k], strides=list(stride),
                              pads=[k // 2] * 4, group=groups),
             helper.make_node("PRelu", ["g", "slope"], ["gr"]),
             helper.make_node("Conv", ["gr", "w2"], ["y"], kernel_shape=[1, 1])]
    p["slope"] = rand(RNG, (F, 1, 1))
    m = model(nodes, {"x": ((1, 3, 9, 11), "float32")}, {"y": (None, "float32")}, p)
    graph = from_onnx(m)
    ops = [n.op_type for n in for_target(graph, TARGET).nodes]
    assert ops.count("ConvNCHWc") == 3 and "Conv" not in ops and ops.count("FromNCHWc") == 1
    x = rand(RNG, (1, 3, 9, 11))
    (y,) = build_model(graph).run(x=x)
    ar = np.maximum(np_conv(x, p["w0"], pads=(1, 1, 1, 1)), 0)
    g = np_conv(ar, p["wg"], p["bg"], stride, (k // 2,) * 4, groups=groups)
    gr = np.where(g < 0, g * p["slope"], g)
    assert_close(y, np_conv(gr, p["w2"]))


def test_a_blocked_concat_read_back_as_nchw_in_the_same_kernel():
    """SqueezeNet's fire module ends in a Concat of two blocked convolutions; read back as NCHW
    (here a graph output), the copy out and the concat are one kernel whose reads are guarded
    by the quotient c // B (LoweringError before the bounds check used such guards)."""
    p = {"w1": rand(RNG, (B, B, 1, 1)), "w2": rand(RNG, (B, B, 3, 3)), "w0": rand(RNG, (B, 3, 1, 1))}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["s"], kernel_shape=[1, 1]),
             helper.make_node("Conv", ["s", "w1"], ["a"], kernel_shape=[1, 1]),
             helper.make_node("Conv", ["s", "w2"], ["b"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["a", "b"], ["y"], axis=1)]
    m = model(nodes, {"x": ((1, 3, 5, 6), "float32")}, {"y": (None, "float32")}, p)
    graph = from_onnx(m)
    ops = [n.op_type for n in for_target(graph, TARGET).nodes]
    assert ops.count("ConvNCHWc") == 3 and ops[-2:] == ["Concat", "FromNCHWc"]
    x = rand(RNG, (1, 3, 5, 6))
    (y,) = build_model(graph).run(x=x)
    s = np_conv(x, p["w0"])
    assert_close(y, np.concatenate([np_conv(s, p["w1"]), np_conv(s, p["w2"], pads=(1, 1, 1, 1))], axis=1))


def test_a_concat_whose_last_input_part_fills_a_block_stays_blocked():
    """ShuffleNet v1 concatenates a grouped conv's 112 channels with a pool's 24: the inputs but
    the last fill whole blocks, so the concat of the blocks is the blocked concat, the last
    input's padding channels the output's; the Relu and the conv after it read it blocked, and
    nothing changes in the values."""
    half = B + B // 2
    p = {"w0": rand(RNG, (2 * B, 3, 1, 1)), "w1": rand(RNG, (half, 3, 1, 1)), "w2": rand(RNG, (B, 2 * B + half, 3, 3))}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], kernel_shape=[1, 1]),
             helper.make_node("Conv", ["x", "w1"], ["b0"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["b0"], ["b"]),
             helper.make_node("Concat", ["a", "b"], ["c"], axis=1),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    m = model(nodes, {"x": ((1, 3, 6, 7), "float32")}, {"y": (None, "float32")}, p)
    graph = from_onnx(m)
    compiled = for_target(graph, TARGET)
    ops = [n.op_type for n in compiled.nodes]
    assert "FromNCHWc" not in ops[:-1] and ops.count("ToNCHWc") == 0
    assert len(compiled.values[next(n for n in compiled.nodes if n.op_type == "Concat").outputs[0]].shape) == 5
    x = rand(RNG, (1, 3, 6, 7))
    (y,) = build_model(graph).run(x=x)
    c = np.concatenate([np_conv(x, p["w0"]), np.maximum(np_conv(x, p["w1"]), 0)], axis=1)
    assert_close(y, np_conv(np.maximum(c, 0), p["w2"], pads=(1, 1, 1, 1)))


@pytest.mark.parametrize("groups, cpg, fpg, k, stride", [(4, B + B // 2, B + B // 2, 1, (1, 1)),
                                                         (3, B + B // 2, B, 3, (2, 1)),
                                                         (2, 3 * B // 2 + 2, B, 1, (1, 1)),
                                                         (4, 2 * B + 2, 2 * B + 2, 1, (1, 1))])
def test_grouped_convolutions_whose_groups_split_blocks_read_group_windows(groups, cpg, fpg, k, stride):
    """ShuffleNet v1's groups (4 x 136 channels in blocks of 16): each output block reads a
    window of input blocks holding its channels' groups, the weights zero outside each lane's
    group; the data's channels need not fill whole blocks, nor the output's (the last two cases
    pad)."""
    from compiler.graph.layout import _group_window
    C, F = groups * cpg, groups * fpg
    assert _group_window(C, F, groups, B) is not None
    p = {"w0": rand(RNG, (C, 3, 1, 1)), "wg": rand(RNG, (F, cpg, k, k)), "bg": rand(RNG, (F,)),
         "w2": rand(RNG, (B, F, 1, 1))}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], kernel_shape=[1, 1]),
             helper.make_node("Conv", ["a", "wg", "bg"], ["g"], kernel_shape=[k, k], strides=list(stride),
                              pads=[k // 2] * 4, group=groups),
             helper.make_node("Relu", ["g"], ["gr"]),
             helper.make_node("Conv", ["gr", "w2"], ["y"], kernel_shape=[1, 1])]
    m = model(nodes, {"x": ((1, 3, 7, 9), "float32")}, {"y": (None, "float32")}, p)
    graph = from_onnx(m)
    compiled = for_target(graph, TARGET)
    assert [n.op_type for n in compiled.nodes].count("ConvNCHWc") == 3
    assert any(n.attrs.get("group_window") == (fpg, cpg, groups) for n in compiled.nodes)
    x = rand(RNG, (1, 3, 7, 9))
    (y,) = build_model(graph).run(x=x)
    a = np_conv(x, p["w0"])
    gr = np.maximum(np_conv(a, p["wg"], p["bg"], stride, (k // 2,) * 4, groups=groups), 0)
    assert_close(y, np_conv(gr, p["w2"]))


def test_group_window_weights_hold_each_lane_s_group_and_zeros():
    """A block of one group reduces over that group's channels only; one across two groups over
    both, each lane's weights at its own group's channels and zero at the other's."""
    groups, cpg, fpg = 4, B + B // 2 + 2, B + B // 2 + 2
    F = groups * fpg
    w = rand(RNG, (F, cpg, 1, 1))
    packed = fn.pack_group_window_weight(w, groups, B)
    unit = fn.group_window_unit(cpg)
    FO, steps = -(-F // B), packed.shape[1]
    assert packed.shape == (FO, steps, 1, 1, unit, B) and steps * unit == 2 * cpg
    full = packed.transpose(0, 5, 1, 4, 2, 3).reshape(FO * B, steps * unit)   # [f, window channel]
    for f in range(FO * B):
        first, span = fn.group_window_span(f // B, B, fpg, cpg, groups)
        assert 0 <= first and first + span <= groups * cpg and span <= steps * unit
        if f >= F:
            assert not full[f].any()
            continue
        lo = (f // fpg) * cpg - first
        assert lo + cpg <= span
        assert_close(full[f, lo:lo + cpg], w[f, :, 0, 0])
        assert not full[f, :lo].any() and not full[f, lo + cpg:].any()
    spans = [fn.group_window_span(fo, B, fpg, cpg, groups)[1] for fo in range(FO)]
    assert set(spans) == {cpg, 2 * cpg}


def test_an_expand_of_a_blocked_value_stays_nchw():
    """Expand takes its target shape as a 4-d input, which a blocked value's 5-d shape does not
    fit (a shape of four elements looked like a per-column constant to the elementwise rule)."""
    p = {"w0": rand(RNG, (B, 3, 1, 1)), "w1": rand(RNG, (B, B, 1, 1)), "shape": np.array([1, 1, 1, 4], np.int64)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], kernel_shape=[1, 1]),
             helper.make_node("Conv", ["a", "w1"], ["b"], kernel_shape=[1, 1]),
             helper.make_node("Expand", ["b", "shape"], ["e"]),
             helper.make_node("Relu", ["e"], ["y"])]
    m = model(nodes, {"x": ((1, 3, 3, 4), "float32")}, {"y": (None, "float32")}, p)
    graph = from_onnx(m)
    ops = [n.op_type for n in for_target(graph, TARGET).nodes]
    assert ops.index("FromNCHWc") < ops.index("Expand")
    x = rand(RNG, (1, 3, 3, 4))
    (y,) = build_model(graph).run(x=x)
    assert_close(y, np.maximum(np_conv(np_conv(x, p["w0"]), p["w1"]), 0))


@pytest.mark.parametrize("op", ["Sum", "Mean", "Gelu"])
def test_a_residual_of_partial_blocks_stays_blocked(op):
    """ShuffleNet v1's residual is a variadic Sum over 136 channels (8.5 blocks of 16): an
    elementwise node that keeps finite values finite stays blocked on padded channels, so the
    units between convolutions pay no copies out of the layout and back; the values match."""
    half = B + B // 2
    p = {"w0": rand(RNG, (half, 3, 1, 1)), "w1": rand(RNG, (half, half, 3, 3)), "w2": rand(RNG, (B, half, 1, 1))}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], kernel_shape=[1, 1]),
             helper.make_node("Conv", ["a", "w1"], ["b"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    if op == "Gelu":
        nodes.append(helper.make_node("Add", ["a", "b"], ["s0"]))
        nodes.append(helper.make_node("Gelu", ["s0"], ["s"], domain=""))
    else:
        nodes.append(helper.make_node(op, ["a", "b", "a"], ["s"]))
    nodes.append(helper.make_node("Conv", ["s", "w2"], ["y"], kernel_shape=[1, 1]))
    m = model(nodes, {"x": ((1, 3, 7, 9), "float32")}, {"y": (None, "float32")}, p,
              opset=20 if op == "Gelu" else 13)
    graph = from_onnx(m)
    ops = [n.op_type for n in for_target(graph, TARGET).nodes]
    assert "ToNCHWc" not in ops and ops.count("FromNCHWc") == 1, ops
    x = rand(RNG, (1, 3, 7, 9))
    y = build_model(graph).run(x=x)[0]
    a = np_conv(x, p["w0"])
    b = np_conv(a, p["w1"], pads=(1, 1, 1, 1))
    if op == "Gelu":
        from math import erf
        t = a + b
        s = 0.5 * t * (1 + np.vectorize(erf)(t / np.sqrt(2)))
    else:
        s = (2 * a + b) / (3 if op == "Mean" else 1)
    assert_close(y, np_conv(s, p["w2"]))


@pytest.mark.parametrize("parts", [(B + B // 2, B + B // 2), (B - 2, B + B // 2 + 1, B - 1), (2 * B, B // 2 + 3, B)])
def test_a_concat_of_parts_that_end_inside_blocks_stays_blocked(parts):
    """ShuffleNet's stride-2 units concatenate 136 + 136 channels (8.5 blocks each): each output
    lane takes its channel from the part that holds it (ConcatNCHWc), the parts' padding
    channels dropped, so the Relu, the pool and the conv after it read blocked values; values
    match numpy, the output's own padding channels included (a conv reads them with zero weights)."""
    total = sum(parts)
    p = {f"w{i}": rand(RNG, (c, 3, 1, 1)) for i, c in enumerate(parts)}
    p["wy"] = rand(RNG, (B, total, 3, 3))
    nodes = [helper.make_node("Conv", ["x", f"w{i}"], [f"a{i}"], kernel_shape=[1, 1]) for i in range(len(parts))]
    nodes += [helper.make_node("Concat", [f"a{i}" for i in range(len(parts))], ["c"], axis=1),
              helper.make_node("Relu", ["c"], ["r"]),
              helper.make_node("MaxPool", ["r"], ["m"], kernel_shape=[2, 2], strides=[1, 1]),
              helper.make_node("Conv", ["m", "wy"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    m = model(nodes, {"x": ((1, 3, 6, 9), "float32")}, {"y": (None, "float32")}, p)
    graph = from_onnx(m)
    ops = [n.op_type for n in for_target(graph, TARGET).nodes]
    assert "ConcatNCHWc" in ops and "ToNCHWc" not in ops and ops.count("FromNCHWc") == 1, ops
    x = rand(RNG, (1, 3, 6, 9))
    out = build_model(graph)
    y = out.run(x=x)[0]
    c = np.maximum(np.concatenate([np_conv(x, p[f"w{i}"]) for i in range(len(parts))], axis=1), 0)
    mp = np_pool(c, (2, 2), (1, 1), (0, 0, 0, 0), "max")
    assert_close(y, np_conv(mp, p["wy"], pads=(1, 1, 1, 1)))


def test_a_dropout_between_convolutions_passes_the_blocked_value_through():
    """SqueezeNet's Dropout before its last conv, its mask output named but read by no one: an
    alias of the blocked value (no kernel, no layout copies); a Dropout whose mask is read stays
    NCHW, the mask all true."""
    p = {"w0": rand(RNG, (2 * B, 3, 3, 3)), "w1": rand(RNG, (B, 2 * B, 1, 1))}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], kernel_shape=[3, 3]),
             helper.make_node("Dropout", ["a"], ["d", "mask"]),
             helper.make_node("Identity", ["d"], ["i"]),
             helper.make_node("Conv", ["i", "w1"], ["y"], kernel_shape=[1, 1])]
    graph = from_onnx(model(nodes, {"x": ((1, 3, 7, 8), "float32")}, {"y": (None, "float32")}, p))
    ops = [n.op_type for n in for_target(graph, TARGET).nodes]
    assert ops.count("FromNCHWc") == 1 and "ToNCHWc" not in ops and ops[-1] == "FromNCHWc", ops
    x = rand(RNG, (1, 3, 7, 8))
    assert_close(build_model(graph).run(x=x)[0], np_conv(np_conv(x, p["w0"]), p["w1"]))
    read = model(nodes[:2] + [helper.make_node("Conv", ["d", "w1"], ["y"], kernel_shape=[1, 1])],
                 {"x": ((1, 3, 7, 8), "float32")}, {"y": (None, "float32"), "mask": (None, "bool")}, p)
    y, mask = build_model(from_onnx(read)).run(x=x)
    assert mask.all() and mask.shape == (1, 2 * B, 5, 6)
    assert_close(y, np_conv(np_conv(x, p["w0"]), p["w1"]))


def test_a_squeeze_excite_of_few_channels_stays_blocked():
    """EfficientNet's squeeze-excite reduces a pooled pixel to a few channels (480 -> 20, 96 ->
    8): most of those blocks are padding, but on one pixel that is a few hundred multiply-adds,
    less than the copies out of the layout and back it saves; the gate matches numpy."""
    C, R = 3 * B, B // 2
    p = {"w0": rand(RNG, (C, 3, 3, 3)), "wr": rand(RNG, (R, C, 1, 1)), "br": rand(RNG, (R,)),
         "we": rand(RNG, (C, R, 1, 1)), "be": rand(RNG, (C,))}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["a"], ["g"]),
             helper.make_node("Conv", ["g", "wr", "br"], ["r0"], kernel_shape=[1, 1]),
             helper.make_node("Sigmoid", ["r0"], ["r1"]),
             helper.make_node("Mul", ["r0", "r1"], ["r"]),
             helper.make_node("Conv", ["r", "we", "be"], ["e0"], kernel_shape=[1, 1]),
             helper.make_node("Sigmoid", ["e0"], ["e"]),
             helper.make_node("Mul", ["a", "e"], ["y"])]
    graph = from_onnx(model(nodes, {"x": ((1, 3, 9, 7), "float32")}, {"y": (None, "float32")}, p))
    ops = [n.op_type for n in for_target(graph, TARGET).nodes]
    assert ops.count("ConvNCHWc") == 3 and ops.count("FromNCHWc") == 1 and "ToNCHWc" not in ops, ops
    x = rand(RNG, (1, 3, 9, 7))
    a = np_conv(x, p["w0"], pads=(1, 1, 1, 1))
    g = a.mean(axis=(2, 3), keepdims=True)
    r0 = np_conv(g, p["wr"]) + p["br"].reshape(1, -1, 1, 1)
    r = r0 / (1 + np.exp(-r0))
    e0 = np_conv(r, p["we"]) + p["be"].reshape(1, -1, 1, 1)
    assert_close(build_model(graph).run(x=x)[0], a / (1 + np.exp(-e0)))


def test_a_concat_of_a_blocked_part_and_an_nchw_activation_at_a_partial_block():
    """A part that is not blocked yet (the RGB input itself) joins a conv's 24 channels: the
    concat reads it through a ToNCHWc copy fused into the same kernel, its lane index split into
    (block, lane) and joined again, which the bounds check must still see is guarded (the model
    fuzzer's finding: 'the read in0[...] can leave the tensor')."""
    F = B + B // 2
    p = {"w0": rand(RNG, (F, 3, 3, 3)), "w1": rand(RNG, (B, F + 3, 1, 1))}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["x"], ["xr"]),
             helper.make_node("Concat", ["a", "xr"], ["c"], axis=1),
             helper.make_node("Conv", ["c", "w1"], ["y"], kernel_shape=[1, 1])]
    graph = from_onnx(model(nodes, {"x": ((1, 3, 5, 6), "float32")}, {"y": (None, "float32")}, p))
    assert "ConcatNCHWc" in [n.op_type for n in for_target(graph, TARGET).nodes]
    x = rand(RNG, (1, 3, 5, 6))
    c = np.concatenate([np_conv(x, p["w0"], pads=(1, 1, 1, 1)), np.maximum(x, 0)], axis=1)
    assert_close(build_model(graph).run(x=x)[0], np_conv(c, p["w1"]))


def _squeeze_excite(reduce_node, opset):
    """conv -> spatial reduction -> 1x1 conv -> sigmoid -> scale the conv's channels, the
    reduction spelled as `reduce_node` (a ReduceMean / ReduceMax over the spatial axes)."""
    C = 2 * B
    p = {"w0": rand(RNG, (C, 3, 3, 3)), "w1": rand(RNG, (C, C, 1, 1)), "b1": rand(RNG, (C,))}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             reduce_node,
             helper.make_node("Conv", ["s", "w1", "b1"], ["e"], kernel_shape=[1, 1]),
             helper.make_node("Sigmoid", ["e"], ["g"]), helper.make_node("Mul", ["c", "g"], ["y"])]
    return nodes, p


@pytest.mark.parametrize("op, opset, how", [("ReduceMean", 13, "attr"), ("ReduceMean", 18, "input"),
                                             ("ReduceMax", 18, "input"), ("ReduceMean", 18, "negative")])
def test_a_spatial_reduction_is_a_global_pool_and_stays_blocked(op, opset, how):
    """The dynamo exporter writes a squeeze-excite's average pool as ReduceMean over [2, 3]:
    it runs as the blocked global pool, no copy out of the layout and back."""
    axes = [-2, -1] if how == "negative" else [2, 3]
    if how == "attr":
        red = helper.make_node(op, ["c"], ["s"], axes=axes, keepdims=1)
        inits = {}
    else:
        red = helper.make_node(op, ["c", "axes"], ["s"], keepdims=1)
        inits = {"axes": np.array(axes, np.int64)}
    nodes, p = _squeeze_excite(red, opset)
    m = model(nodes, {"x": ((2, 3, 9, 11), "float32")}, {"y": (None, "float32")}, {**p, **inits}, opset=opset)
    graph = from_onnx(m)
    ops = [n.op_type for n in for_target(graph, TARGET).nodes]
    assert op not in ops and "GlobalPoolNCHWc" in ops and "FromNCHWc" in ops and ops.count("FromNCHWc") == 1
    x = rand(RNG, (2, 3, 9, 11))
    (y,) = build_model(graph).run(x=x)
    c = np_conv(x, p["w0"], pads=(1, 1, 1, 1))
    s = c.mean(axis=(2, 3), keepdims=True) if op == "ReduceMean" else c.max(axis=(2, 3), keepdims=True)
    g = 1 / (1 + np.exp(-np_conv(s, p["w1"], p["b1"])))
    assert_close(y, c * g)


@pytest.mark.parametrize("axes, keepdims", [([2, 3], 0), ([1, 2, 3], 1), ([3], 1)])
def test_other_reductions_keep_their_meaning(axes, keepdims):
    """Without keepdims the pool is reshaped to [N, C]; reductions over other axes stay reductions."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("ReduceMean", ["r"], ["y"], axes=axes, keepdims=keepdims)]
    m = model(nodes, {"x": ((2, 5, 4, 6), "float32")}, {"y": (None, "float32")}, opset=13)
    x = rand(RNG, (2, 5, 4, 6), lo=-1)
    (y,) = build_model(from_onnx(m)).run(x=x)
    want = np.maximum(x.astype(np.float64), 0).mean(axis=tuple(axes), keepdims=bool(keepdims))
    assert y.shape == want.shape
    assert_close(y, want)


@pytest.mark.parametrize("channels", [3, B // 2 + 1])
def test_a_blocked_concat_of_an_nchw_last_part_read_back_as_nchw(channels):
    """A conv's whole blocks and an activation not yet blocked, concatenated and read back as
    NCHW (a graph output): one kernel in which the last part's channel is the blocked concat's
    (block - k)·B + lane, clamped to the part, under the branch test block >= k; the bounds
    check reads that test as a bound on the channel itself (the model fuzzer's finding on
    8-lane targets: 'the read in0[i0, min(((i1 // 8) - 6) * 8 + i1 % 8, 4), ...] can leave the
    tensor')."""
    p = {"w0": rand(RNG, (3 * B, channels, 3, 3)), "w1": rand(RNG, (2 * B, 3 * B, 1, 1))}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "w1"], ["b"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["x"], ["xr"]),
             helper.make_node("Concat", ["b", "xr"], ["y"], axis=1)]
    graph = from_onnx(model(nodes, {"x": ((1, channels, 5, 6), "float32")}, {"y": (None, "float32")}, p))
    x = rand(RNG, (1, channels, 5, 6))
    ref = np.concatenate([np_conv(np_conv(x, p["w0"], pads=(1, 1, 1, 1)), p["w1"]), np.maximum(x, 0)], axis=1)
    assert_close(build_model(graph).run(x=x)[0], ref)
