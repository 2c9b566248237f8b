"""Every supported ONNX operator, one small model each, against a float64 numpy reference.

Inputs are random non-zero values; the compiled model runs the generated kernels (default
schedules). Shapes are small so each case compiles in a fraction of a second.
"""

from __future__ import annotations

import numpy as np
import pytest
from graph_models import (
    assert_close,
    model,
    np_bn,
    np_conv,
    np_erf,
    np_pool,
    np_softmax,
    rand,
    run,
)
from onnx import helper

RNG = np.random.default_rng(7)


def one_node(op, x_shapes, out_shape, attrs=None, inits=None, opset=13, dtype="float32", out_dtype=None):
    """A model of one node reading inputs x0, x1, ... (then the initializers) into y."""
    names = [f"x{i}" for i in range(len(x_shapes))]
    node = helper.make_node(op, names + list(inits or {}), ["y"], name=f"the_{op.lower()}", **(attrs or {}))
    return model([node], {n: (s, dtype) for n, s in zip(names, x_shapes)}, {"y": (out_shape, out_dtype or dtype)},
                 inits, opset)


UNARY = {
    "Relu": lambda a: np.maximum(a, 0),
    "Sigmoid": lambda a: 1 / (1 + np.exp(-a)),
    "Tanh": np.tanh,
    "Exp": np.exp,
    "Erf": np_erf,
    "Neg": lambda a: -a,
    "Abs": np.abs,
    "Floor": np.floor,
    "Ceil": np.ceil,
    "Reciprocal": lambda a: 1 / a,
    "Softplus": lambda a: np.log1p(np.exp(a)),
    "HardSwish": lambda a: a * np.clip(a / 6 + 0.5, 0, 1),
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op):
    x = rand(RNG, (2, 3, 5), hi=3.0)
    (y,) = run(one_node(op, [x.shape], x.shape, opset=14), {"x0": x})
    assert_close(y, UNARY[op](x.astype(np.float64)), rtol=2e-6)


@pytest.mark.parametrize("op,attrs,ref", [
    ("LeakyRelu", {"alpha": 0.2}, lambda a: np.where(a < 0, 0.2 * a, a)),
    ("Elu", {"alpha": 0.5}, lambda a: np.where(a < 0, 0.5 * (np.exp(a) - 1), a)),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, lambda a: np.clip(0.3 * a + 0.4, 0, 1)),
    ("Sqrt", {}, lambda a: np.sqrt(np.abs(a))),
    ("Log", {}, lambda a: np.log(np.abs(a))),
])
def test_unary_with_attributes(op, attrs, ref):
    x = rand(RNG, (4, 6), hi=3.0)
    feed = np.abs(x) if op in ("Sqrt", "Log") else x
    (y,) = run(one_node(op, [x.shape], x.shape, attrs), {"x0": feed})
    assert_close(y, ref(x.astype(np.float64)), rtol=2e-6)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_opset20(approximate):
    x = rand(RNG, (3, 8), hi=3.0)
    (y,) = run(one_node("Gelu", [x.shape], x.shape, {"approximate": approximate}, opset=20), {"x0": x})
    a = x.astype(np.float64)
    want = 0.5 * a * (1 + (np_erf(a / np.sqrt(2)) if approximate == "none" else
                           np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a ** 3))))
    assert_close(y, want, rtol=2e-6)


@pytest.mark.parametrize("op,ref", [
    ("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply), ("Div", np.divide),
    ("Max", np.maximum), ("Min", np.minimum), ("Sum", np.add), ("Mean", lambda a, b: (a + b) / 2),
])
@pytest.mark.parametrize("shapes", [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (3, 1)), ((4,), (2, 3, 4)), ((1, 3, 1), (2, 1, 4))])
def test_binary_broadcast(op, ref, shapes):
    a, b = rand(RNG, shapes[0]), rand(RNG, shapes[1])
    out = np.broadcast_shapes(*shapes)
    (y,) = run(one_node(op, [a.shape, b.shape], out), {"x0": a, "x1": b})
    assert_close(y, ref(a.astype(np.float64), b.astype(np.float64)), rtol=2e-6)


def test_variadic_sum_of_three_and_integer_div():
    a, b, c = rand(RNG, (2, 5)), rand(RNG, (5,)), rand(RNG, (2, 1))
    (y,) = run(one_node("Sum", [a.shape, b.shape, c.shape], (2, 5)), {"x0": a, "x1": b, "x2": c})
    assert_close(y, a.astype(np.float64) + b + c)
    p = np.array([[7, -7, 9, -9, 3]], np.int64)
    q = np.array([[2, 2, -4, -4, 5]], np.int64)
    (d,) = run(one_node("Div", [p.shape, q.shape], p.shape, dtype="int64"), {"x0": p, "x1": q})
    assert d.tolist() == [[3, -3, -2, 2, 0]]   # ONNX truncates toward zero


@pytest.mark.parametrize("exponent", [2.0, 0.5, 3.0, 1.7])
def test_pow_constant_exponent(exponent):
    x = np.abs(rand(RNG, (3, 4), hi=2.0))
    m = one_node("Pow", [x.shape], x.shape, inits={"e": np.array(exponent, np.float32)})
    (y,) = run(m, {"x0": x})
    assert_close(y, x.astype(np.float64) ** exponent, rtol=3e-6)


def test_clip_opset9_attributes_and_opset13_inputs():
    x = rand(RNG, (2, 8), hi=8.0)
    (y9,) = run(one_node("Clip", [x.shape], x.shape, {"min": -1.0, "max": 6.0}, opset=9), {"x0": x})
    assert_close(y9, np.clip(x, -1, 6))
    m = one_node("Clip", [x.shape], x.shape, inits={"lo": np.array(0, np.float32), "hi": np.array(6, np.float32)})
    (y13,) = run(m, {"x0": x})
    assert_close(y13, np.clip(x, 0, 6))
    # max only: the min input left out
    node = helper.make_node("Clip", ["x0", "", "hi"], ["y"])
    (y,) = run(model([node], {"x0": (x.shape, "float32")}, {"y": (x.shape, "float32")},
                     {"hi": np.array(1.5, np.float32)}), {"x0": x})
    assert_close(y, np.minimum(x, 1.5))


def test_comparisons_where_cast():
    a, b = rand(RNG, (3, 4)), rand(RNG, (4,))
    nodes = [helper.make_node("Less", ["a", "b"], ["lt"]),
             helper.make_node("Where", ["lt", "a", "b"], ["w"]),
             helper.make_node("Cast", ["lt"], ["ci"], to=7),
             helper.make_node("Equal", ["ci", "one"], ["eq"])]
    m = model(nodes, {"a": ((3, 4), "float32"), "b": ((4,), "float32")},
              {"w": ((3, 4), "float32"), "ci": ((3, 4), "int64"), "eq": ((3, 4), "bool")},
              {"one": np.array(1, np.int64)})
    w, ci, eq = run(m, {"a": a, "b": b})
    assert_close(w, np.where(a < b, a, b))
    assert ci.tolist() == (a < b).astype(np.int64).tolist()
    assert eq.tolist() == (a < b).tolist()


@pytest.mark.parametrize("cfg", [
    dict(C=3, F=4, k=3, stride=(1, 1), pads=(1, 1, 1, 1), dil=(1, 1), groups=1, bias=True),
    dict(C=4, F=8, k=3, stride=(2, 2), pads=(0, 1, 1, 0), dil=(1, 1), groups=1, bias=False),
    dict(C=4, F=4, k=3, stride=(1, 1), pads=(2, 2, 2, 2), dil=(2, 2), groups=1, bias=True),
    dict(C=4, F=6, k=1, stride=(1, 2), pads=(0, 0, 0, 0), dil=(1, 1), groups=2, bias=True),
    dict(C=8, F=8, k=3, stride=(1, 1), pads=(1, 1, 1, 1), dil=(1, 1), groups=8, bias=True),   # depthwise
    dict(C=4, F=8, k=3, stride=(2, 2), pads=(1, 1, 1, 1), dil=(1, 1), groups=4, bias=False),  # multiplier 2
    dict(C=16, F=32, k=3, stride=(1, 1), pads=(1, 1, 1, 1), dil=(1, 1), groups=1, bias=True),  # channel vectors
])
def test_conv(cfg):
    x = rand(RNG, (1, cfg["C"], 9, 10))
    w = rand(RNG, (cfg["F"], cfg["C"] // cfg["groups"], cfg["k"], cfg["k"]))
    b = rand(RNG, (cfg["F"],))
    inits = {"w": w, "b": b} if cfg["bias"] else {"w": w}
    want = np_conv(x, w, b if cfg["bias"] else None, cfg["stride"], cfg["pads"], cfg["dil"], cfg["groups"])
    attrs = dict(kernel_shape=[cfg["k"]] * 2, strides=list(cfg["stride"]), pads=list(cfg["pads"]),
                 dilations=list(cfg["dil"]), group=cfg["groups"])
    (y,) = run(one_node("Conv", [x.shape], want.shape, attrs, inits), {"x0": x})
    assert_close(y, want)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_conv_auto_pad(auto_pad):
    x, w = rand(RNG, (1, 2, 7, 8)), rand(RNG, (3, 2, 2, 3))
    attrs = dict(kernel_shape=[2, 3], strides=[2, 2], auto_pad=auto_pad)
    if auto_pad == "VALID":
        pads = (0, 0, 0, 0)
    else:  # total padding (out - 1) * s + k - in: rows 1, columns 1; UPPER puts the odd one at the end
        pads = (0, 0, 1, 1) if auto_pad == "SAME_UPPER" else (1, 1, 0, 0)
    want = np_conv(x, w, None, (2, 2), pads)
    (y,) = run(one_node("Conv", [x.shape], want.shape, attrs, {"w": w}), {"x0": x})
    assert_close(y, want)


@pytest.mark.parametrize("op,kernel,stride,pads,extra", [
    ("MaxPool", (3, 3), (2, 2), (1, 1, 1, 1), {}),
    ("MaxPool", (2, 2), (2, 2), (0, 0, 0, 0), {}),
    ("AveragePool", (3, 3), (2, 2), (1, 1, 1, 1), {}),
    ("AveragePool", (3, 3), (1, 1), (1, 1, 1, 1), {"count_include_pad": 1}),
    ("AveragePool", (2, 3), (1, 2), (0, 0, 0, 0), {}),
])
def test_pools(op, kernel, stride, pads, extra):
    x = rand(RNG, (1, 3, 9, 9))
    want = np_pool(x, kernel, stride, pads, "max" if op == "MaxPool" else "avg", bool(extra.get("count_include_pad")))
    attrs = dict(kernel_shape=list(kernel), strides=list(stride), pads=list(pads), **extra)
    (y,) = run(one_node(op, [x.shape], want.shape, attrs), {"x0": x})
    assert_close(y, want)


def test_maxpool_ceil_mode():
    x = rand(RNG, (1, 2, 8, 8))
    # ceil((8 - 3) / 2) + 1 = 4 windows per axis, the last one overhanging by one
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (0, 1), (0, 1)), constant_values=-np.inf)
    want = np_pool(xp, (3, 3), (2, 2), (0, 0, 0, 0), "max")
    (y,) = run(one_node("MaxPool", [x.shape], want.shape, dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
               {"x0": x})
    assert_close(y, want)


def test_global_pools():
    x = rand(RNG, (2, 5, 4, 6))
    (avg,) = run(one_node("GlobalAveragePool", [x.shape], (2, 5, 1, 1)), {"x0": x})
    assert_close(avg, x.astype(np.float64).mean(axis=(2, 3), keepdims=True))
    (mx,) = run(one_node("GlobalMaxPool", [x.shape], (2, 5, 1, 1)), {"x0": x})
    assert_close(mx, x.max(axis=(2, 3), keepdims=True))


def test_batch_norm_without_a_conv_before_it():
    x = rand(RNG, (2, 4, 3, 3))
    g, b, m = rand(RNG, (4,)), rand(RNG, (4,)), rand(RNG, (4,))
    v = RNG.uniform(0.5, 1.5, 4).astype(np.float32)
    node = helper.make_node("BatchNormalization", ["x0", "g", "b", "m", "v"], ["y"], epsilon=1e-3)
    mdl = model([node], {"x0": (x.shape, "float32")}, {"y": (x.shape, "float32")}, dict(g=g, b=b, m=m, v=v))
    (y,) = run(mdl, {"x0": x})
    assert_close(y, np_bn(x, g, b, m, v, 1e-3))


@pytest.mark.parametrize("ta,tb,alpha,beta,c_shape", [
    (0, 1, 1.0, 1.0, (5,)), (0, 0, 1.0, 1.0, (3, 5)), (1, 0, 0.5, 2.0, (1, 5)), (1, 1, 1.0, 0.0, None)])
def test_gemm(ta, tb, alpha, beta, c_shape):
    a = rand(RNG, (7, 3) if ta else (3, 7))
    b = rand(RNG, (5, 7) if tb else (7, 5))
    inits = {"b": b}
    if c_shape:
        inits["c"] = rand(RNG, c_shape)
    want = alpha * (a.T if ta else a).astype(np.float64) @ (b.T if tb else b)
    if c_shape:
        want = want + beta * inits["c"]
    m = one_node("Gemm", [a.shape], (3, 5), dict(transA=ta, transB=tb, alpha=alpha, beta=beta), inits)
    (y,) = run(m, {"x0": a})
    assert_close(y, want)


@pytest.mark.parametrize("sa,sb", [((4, 6), (6, 5)), ((2, 3, 6), (6, 5)), ((2, 3, 6), (2, 6, 4)),
                                   ((2, 1, 3, 6), (4, 6, 5))])
def test_matmul(sa, sb):
    a, b = rand(RNG, sa), rand(RNG, sb)
    want = np.matmul(a.astype(np.float64), b)
    (y,) = run(one_node("MatMul", [sa, sb], want.shape), {"x0": a, "x1": b})
    assert_close(y, want)


@pytest.mark.parametrize("opset,axis,shape", [(13, -1, (3, 10)), (13, 1, (2, 4, 5)), (11, 1, (2, 4, 5)),
                                              (11, 2, (2, 4, 5))])
def test_softmax(opset, axis, shape):
    x = rand(RNG, shape, hi=4.0)
    (y,) = run(one_node("Softmax", [shape], shape, {"axis": axis}, opset=opset), {"x0": x})
    if opset < 13:  # softmax over the flattened trailing axes
        rows = int(np.prod(shape[:axis]))
        want = np_softmax(x.reshape(rows, -1), 1).reshape(shape)
    else:
        want = np_softmax(x, axis)
    assert_close(y, want)


@pytest.mark.parametrize("axis,bias", [(-1, True), (1, True), (-1, False)])
def test_layer_normalization(axis, bias):
    x = rand(RNG, (2, 3, 8), hi=3.0)
    norm = x.shape[axis:] if axis >= 0 else x.shape[axis:]
    g, b = rand(RNG, norm), rand(RNG, norm)
    inits = {"g": g, "b": b} if bias else {"g": g}
    (y,) = run(one_node("LayerNormalization", [x.shape], x.shape, {"axis": axis, "epsilon": 1e-5}, inits, opset=17),
               {"x0": x})
    axes = tuple(range(axis % 3, 3))
    a = x.astype(np.float64)
    mu, var = a.mean(axis=axes, keepdims=True), a.var(axis=axes, keepdims=True)
    want = (a - mu) / np.sqrt(var + 1e-5) * g + (b if bias else 0)
    assert_close(y, want, rtol=1e-5)


@pytest.mark.parametrize("op,axes,keep", [("ReduceMean", [-1], 1), ("ReduceMean", [1, 2], 0), ("ReduceSum", [0], 1),
                                          ("ReduceMax", [2], 0), ("ReduceMin", None, 1)])
def test_reductions(op, axes, keep):
    x = rand(RNG, (3, 4, 5))
    np_fn = {"ReduceMean": np.mean, "ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min}[op]
    want = np_fn(x.astype(np.float64), axis=None if axes is None else tuple(axes), keepdims=bool(keep))
    attrs, inits = {"keepdims": keep}, None
    if axes is not None:
        if op == "ReduceSum":   # opset 13: axes is an input
            inits = {"axes": np.array(axes, np.int64)}
        else:
            attrs["axes"] = axes
    (y,) = run(one_node(op, [x.shape], want.shape, attrs, inits), {"x0": x})
    assert_close(y.reshape(want.shape), want)


def test_data_movement():
    x = rand(RNG, (2, 3, 4))
    cases = [
        ("Transpose", {"perm": [2, 0, 1]}, None, np.transpose(x, (2, 0, 1))),
        ("Reshape", {}, {"s": np.array([0, -1, 2], np.int64)}, x.reshape(2, 6, 2)),
        ("Flatten", {"axis": 2}, None, x.reshape(6, 4)),
        ("Unsqueeze", {}, {"a": np.array([0, 3], np.int64)}, x.reshape(1, 2, 3, 1, 4)),
        ("Slice", {}, {"st": np.array([1, -1], np.int64), "en": np.array([3, 0], np.int64),
                       "ax": np.array([1, 2], np.int64), "sp": np.array([1, -2], np.int64)}, x[:, 1:3, -1:0:-2]),
        ("Expand", {}, {"s": np.array([2, 2, 3, 4], np.int64)}, np.broadcast_to(x, (2, 2, 3, 4))),
        ("Pad", {}, {"p": np.array([0, 1, 0, 0, 0, 2], np.int64), "v": np.array(0.5, np.float32)},
         np.pad(x, ((0, 0), (1, 0), (0, 2)), constant_values=0.5)),
        ("Gather", {"axis": 1}, {"i": np.array([[2, 0], [-1, 1]], np.int64)}, np.take(x, [[2, 0], [2, 1]], axis=1)),
        ("Identity", {}, None, x),
    ]
    for op, attrs, inits, want in cases:
        # an Add after the node keeps the model from being a bare alias of its input
        node = helper.make_node(op, ["x0", *(inits or {})], ["t"], **attrs)
        add = helper.make_node("Add", ["t", "t"], ["y"])
        m = model([node, add], {"x0": (x.shape, "float32")}, {"y": (want.shape, "float32")}, inits)
        (y,) = run(m, {"x0": x})
        assert_close(y, 2.0 * want)


def test_concat_and_squeeze():
    a, b, c = rand(RNG, (2, 1, 3)), rand(RNG, (2, 2, 3)), rand(RNG, (2, 4, 3))
    nodes = [helper.make_node("Concat", ["a", "b", "c"], ["cat"], axis=1),
             helper.make_node("Squeeze", ["a", "ax"], ["sq"]),
             helper.make_node("Relu", ["sq"], ["r"])]
    m = model(nodes, {k: (v.shape, "float32") for k, v in dict(a=a, b=b, c=c).items()},
              {"cat": ((2, 7, 3), "float32"), "r": ((2, 3), "float32")}, {"ax": np.array([1], np.int64)})
    cat, r = run(m, {"a": a, "b": b, "c": c})
    assert_close(cat, np.concatenate([a, b, c], axis=1))
    assert_close(r, np.maximum(a[:, 0], 0))


def test_gather_of_embedding_rows_by_runtime_indices():
    table = rand(RNG, (10, 4))
    ids = np.array([[3, 9, 0], [-1, 2, 2]], np.int64)
    node = helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)
    m = model([node], {"ids": (ids.shape, "int64")}, {"y": ((2, 3, 4), "float32")}, {"table": table})
    (y,) = run(m, {"ids": ids})
    assert_close(y, table[ids % 10])


@pytest.mark.parametrize("opset,sizes", [(11, [1, 3, 2]), (13, [2, 2, 2]), (13, None), (18, None)])
def test_split(opset, sizes):
    x = rand(RNG, (2, 6, 3))
    parts = sizes or [2, 2, 2]
    attrs, inits = {"axis": 1}, None
    if sizes is not None and opset < 13:
        attrs["split"] = sizes
    elif sizes is not None:
        inits = {"s": np.array(sizes, np.int64)}
    if opset >= 18 and sizes is None:
        attrs["num_outputs"] = 3
    outs = [f"y{i}" for i in range(3)]
    node = helper.make_node("Split", ["x0", *(inits or {})], outs, **attrs)
    relus = [helper.make_node("Relu", [o], [f"r{i}"]) for i, o in enumerate(outs)]
    m = model([node, *relus], {"x0": (x.shape, "float32")}, {f"r{i}": (None, "float32") for i in range(3)},
              inits, opset)
    got = run(m, {"x0": x})
    for g, want in zip(got, np.split(x, np.cumsum(parts)[:-1], axis=1)):
        assert_close(g, np.maximum(want, 0))


def test_a_conv_whose_fused_tile_is_too_much_code_still_compiles():
    """The model fuzzer's dilated 7x7 depthwise layer with a broadcast add made more unrolled
    code than the lowering takes, fused or not (17.2k nodes): it compiles as the plain loop nest
    and answers right."""
    x = rand(RNG, (2, 32, 32, 19))
    w, c = rand(RNG, (32, 1, 7, 7)), rand(RNG, (1, 32, 1, 1))
    attrs = dict(kernel_shape=[7, 7], strides=[2, 2], pads=[4, 10, 5, 7], dilations=[2, 2], group=32)
    want = np_conv(x, w, None, (2, 2), (4, 10, 5, 7), (2, 2), 32) + c
    nodes = [helper.make_node("Conv", ["x0", "w"], ["h"], **attrs), helper.make_node("Add", ["h", "c"], ["y"])]
    m = model(nodes, {"x0": (x.shape, "float32")}, {"y": (want.shape, "float32")}, {"w": w, "c": c})
    (y,) = run(m, {"x0": x})
    assert_close(y, want)
