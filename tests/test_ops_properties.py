"""Property tests of the operator inventory: random small shapes and parameters of every family.

Valid parameters: the kernel built with the default schedule computes the float64 reference on
random non-zero inputs into a poisoned output (`test_ops_kernels.check`), and `params` holds
only plain Python values. Integer parameters are drawn as Python or numpy integers alike.
Invalid parameters: the definition raises ExprError, never another exception type.

Examples are derandomized (the same ones on every run, nothing stored in .hypothesis) and few
per family: each kernel build takes 0.05-0.5 s, and the whole file stays well under a minute.
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_ops_kernels import check
from test_ops_params import assert_plain

from compiler.errors import ExprError
from compiler.ops import INVENTORY, build_op, get_op

PROFILE = settings(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
BUILDS = settings(PROFILE, max_examples=15)
DEFINITIONS = settings(PROFILE, max_examples=300)

FLOATS = ("float32", "float64")
NUMERIC = ("float32", "float64", "int8", "int32", "int64")


def ints(lo, hi):
    """An int in [lo, hi], as a Python int or a numpy integer (both must be accepted)."""
    return st.integers(lo, hi).flatmap(lambda v: st.sampled_from([v, np.int64(v), np.int32(v)]))


def shapes(max_dims=3, max_size=12):
    return st.lists(ints(1, max_size), min_size=1, max_size=max_dims).map(tuple)


def check_op(name, params):
    """Define, check the params are plain, build with the default schedule, compare."""
    op = get_op(name, **params)
    assert_plain(op.params)
    check(op, build_op(op))


# ----------------------------------------------------------------------------- valid parameters

@BUILDS
@given(st.data())
def test_matrix_products(data):
    name = data.draw(st.sampled_from(["matmul", "matmul_int8", "batch_matmul", "dense", "dense_gelu"]))
    size = ints(1, 20)
    if name.startswith("dense"):
        params = dict(batch=data.draw(size), in_dim=data.draw(size), out_dim=data.draw(size),
                      dtype=data.draw(st.sampled_from(FLOATS)))
        if name == "dense":
            params["epilogue"] = data.draw(st.sampled_from(["none", "relu", "gelu"]))
    else:
        params = dict(M=data.draw(size), N=data.draw(size), K=data.draw(size),
                      transpose_b=data.draw(st.booleans() | st.sampled_from([np.True_, np.False_])))
        if name != "matmul_int8":
            params["dtype"] = data.draw(st.sampled_from(["float32", "float64", "int8", "int32"]))
        if name == "batch_matmul":
            params["B"] = data.draw(ints(1, 3))
    check_op(name, params)


def _padding(draw, limits=(2, 2, 2, 2)):
    """(top, left, bottom, right) below `limits`, and one of the forms the operators accept."""
    pads = tuple(draw(st.integers(0, lim)) for lim in limits)
    forms = [pads]
    if pads[:2] == pads[2:]:
        forms.append(pads[:2])
        if pads[0] == pads[1]:
            forms.append(np.int64(pads[0]))
    return pads, draw(st.sampled_from(forms))


def _window_geometry(draw, max_kernel=3, max_dilation=2):
    """Kernel, stride, dilation, padding and an input size at least as large as one window."""
    KH, KW = draw(ints(1, max_kernel)), draw(ints(1, max_kernel))
    dilation = (draw(ints(1, max_dilation)), draw(ints(1, max_dilation)))
    pads, padding = _padding(draw)
    H = draw(ints(max(1, (KH - 1) * dilation[0] + 1 - pads[0] - pads[2]), 11))
    W = draw(ints(max(1, (KW - 1) * dilation[1] + 1 - pads[1] - pads[3]), 11))
    stride = draw(ints(1, 3) | st.tuples(ints(1, 3), ints(1, 3)))
    return dict(H=H, W=W, KH=KH, KW=KW, stride=stride, padding=padding, dilation=dilation)


@BUILDS
@given(st.data())
def test_conv2d(data):
    """NCHW, NHWC and the fused conv + bias + relu, with stride, asymmetric padding, dilation and groups."""
    name = data.draw(st.sampled_from(["conv2d_nchw", "conv2d_nhwc", "conv2d_bias_relu"]))
    groups = data.draw(st.integers(1, 3))
    params = dict(N=data.draw(ints(1, 2)), C=groups * data.draw(st.integers(1, 3)),
                  F=groups * data.draw(st.integers(1, 3)), groups=groups,
                  dtype=data.draw(st.sampled_from(FLOATS if name == "conv2d_bias_relu" else ["float32", "int8"])),
                  **_window_geometry(data.draw))
    check_op(name, params)


@BUILDS
@given(st.data())
def test_depthwise_conv2d(data):
    params = dict(N=data.draw(ints(1, 2)), C=data.draw(ints(1, 4)), multiplier=data.draw(ints(1, 3)),
                  dtype=data.draw(st.sampled_from(["float32", "float64", "int8"])), **_window_geometry(data.draw))
    check_op("depthwise_conv2d_nchw", params)


@BUILDS
@given(st.data())
def test_pooling(data):
    """Padding smaller than the kernel on each side (pooling refuses windows of padding only)."""
    name = data.draw(st.sampled_from(["max_pool2d", "avg_pool2d"]))
    KH, KW = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    pads, padding = _padding(data.draw, (KH - 1, KW - 1, KH - 1, KW - 1))
    params = dict(N=data.draw(ints(1, 2)), C=data.draw(ints(1, 3)),
                  H=data.draw(ints(max(1, KH - pads[0] - pads[2]), 12)),
                  W=data.draw(ints(max(1, KW - pads[1] - pads[3]), 12)),
                  kernel=data.draw(st.sampled_from([(KH, KW), np.array([KH, KW])] + ([KH] if KH == KW else []))),
                  stride=data.draw(st.none() | ints(1, 3) | st.tuples(ints(1, 3), ints(1, 3))), padding=padding,
                  dtype=data.draw(st.sampled_from(NUMERIC if name == "max_pool2d" else FLOATS)))
    check_op(name, params)


@BUILDS
@given(st.data())
def test_softmax_and_layer_norm_on_any_axis(data):
    name = data.draw(st.sampled_from(["softmax", "layer_norm"]))
    shape = data.draw(shapes(max_size=20))
    params = dict(shape=shape, axis=data.draw(ints(-len(shape), len(shape) - 1)),
                  dtype=data.draw(st.sampled_from(FLOATS)))
    if name == "layer_norm":
        params["eps"] = data.draw(st.floats(1e-6, 1e-1) | st.sampled_from([np.float32(1e-5), 1]))
    check_op(name, params)


@BUILDS
@given(st.data())
def test_layer_norm_of_constant_rows_is_beta(data):
    """Zero deviations normalize to exactly zero, whatever the constant and the row length."""
    shape = data.draw(shapes(max_size=40))
    axis = data.draw(st.integers(0, len(shape) - 1))
    op = get_op("layer_norm", shape=shape, axis=axis)
    c = np.float32(data.draw(st.floats(-1e4, 1e4, width=32)))
    n = shape[axis]
    gamma = np.linspace(0.5, 2.0, n, dtype=np.float32)
    beta = np.linspace(-3.0, 3.0, n, dtype=np.float32) + np.float32(0.25)
    out = np.full(op.output.shape, np.nan, np.float32)
    build_op(op)(np.full(shape, c, np.float32), gamma, beta, out)
    bshape = [1] * len(shape)
    bshape[axis] = n
    want = np.broadcast_to(beta.reshape(bshape), shape)
    assert np.all(np.abs(out - want) <= 1e-6 * np.abs(want))


@st.composite
def _broadcast_operand(draw, out_shape):
    """A shape that broadcasts to `out_shape`: some dimensions 1, some leading ones dropped."""
    dims = [draw(st.sampled_from([s, 1])) for s in out_shape]
    return tuple(dims[draw(st.integers(0, len(dims) - 1)):])


@BUILDS
@given(st.data())
def test_elementwise_with_broadcasting(data):
    name = data.draw(st.sampled_from(["add", "mul", "relu", "gelu", "bias_add"]))
    shape = data.draw(shapes(max_dims=4, max_size=9))
    dtype = data.draw(st.sampled_from(FLOATS if name == "gelu" else NUMERIC))
    if name in ("add", "mul"):
        out = tuple(int(s) for s in shape)
        params = dict(shape_a=data.draw(_broadcast_operand(out)), shape_b=data.draw(_broadcast_operand(out)))
    elif name == "bias_add":
        params = dict(shape=shape, axis=data.draw(ints(-len(shape), len(shape) - 1)))
    else:
        params = dict(shape=shape)
    check_op(name, dict(params, dtype=dtype))


@st.composite
def _reduce_axis(draw, ndim):
    """None, one axis, or distinct axes in any order, each possibly negative."""
    sign = st.sampled_from([0, -ndim])
    one = st.integers(0, ndim - 1).flatmap(lambda a: sign.map(lambda s: a + s))
    many = st.permutations(range(ndim)).flatmap(
        lambda p: st.integers(1, ndim).map(lambda k: p[:k])).flatmap(
        lambda axes: st.tuples(*[sign.map(lambda s, a=a: a + s) for a in axes]))
    return draw(st.none() | one | many | many.map(list) | many.map(np.array))


@BUILDS
@given(st.data())
def test_reductions_over_any_axes(data):
    shape = data.draw(shapes(max_dims=4, max_size=8))
    params = dict(shape=shape, axis=data.draw(_reduce_axis(len(shape))), keepdims=data.draw(st.booleans()),
                  dtype=data.draw(st.sampled_from(NUMERIC)))
    check_op(data.draw(st.sampled_from(["reduce_sum", "reduce_max", "reduce_min"])), params)


@BUILDS
@given(st.data())
def test_transpose(data):
    shape = data.draw(shapes(max_dims=4, max_size=9))
    nd = len(shape)
    perm = data.draw(st.permutations(range(nd)))
    axes = data.draw(st.sampled_from([None, tuple(perm), [a - nd for a in perm], np.array(perm)]))
    check_op("transpose", dict(shape=shape, axes=axes, dtype=data.draw(st.sampled_from(NUMERIC))))


def _fill_values(dtype):
    if dtype.startswith("int"):
        info = np.iinfo(dtype)
        return st.integers(int(info.min), int(info.max)) | st.integers(-9, 9).map(float)
    return st.floats(-1e6, 1e6, width=32) | st.sampled_from([math.inf, -math.inf, np.float32(2.5)])


@BUILDS
@given(st.data())
def test_pad(data):
    shape = data.draw(shapes(max_dims=3, max_size=9))
    dtype = data.draw(st.sampled_from(NUMERIC))
    widths = st.lists(ints(0, 3), min_size=len(shape), max_size=len(shape)).map(tuple) | ints(0, 3)
    check_op("pad", dict(shape=shape, pad_before=data.draw(widths), pad_after=data.draw(widths),
                         value=data.draw(_fill_values(dtype)), dtype=dtype))


# ----------------------------------------------------------------------------- invalid parameters

# A small valid instance of every operator; the properties below replace one parameter.
VALID = {
    "matmul": dict(M=2, N=3, K=4), "matmul_int8": dict(M=2, N=3, K=4), "batch_matmul": dict(B=2, M=2, N=3, K=4),
    "dense": dict(batch=2, in_dim=3, out_dim=4),
    "conv2d_nchw": dict(N=1, C=2, H=5, W=5, F=2, KH=3, KW=3), "conv2d_nhwc": dict(N=1, C=2, H=5, W=5, F=2, KH=3, KW=3),
    "depthwise_conv2d_nchw": dict(N=1, C=2, H=5, W=5, KH=3, KW=3),
    "conv2d_bias_relu": dict(N=1, C=2, H=5, W=5, F=2, KH=3, KW=3), "dense_gelu": dict(batch=2, in_dim=3, out_dim=4),
    "max_pool2d": dict(N=1, C=2, H=5, W=5, kernel=3), "avg_pool2d": dict(N=1, C=2, H=5, W=5, kernel=3),
    "softmax": dict(shape=(2, 3)), "layer_norm": dict(shape=(2, 3)),
    "add": dict(shape_a=(2, 3)), "mul": dict(shape_a=(2, 3)), "relu": dict(shape=(2, 3)), "gelu": dict(shape=(2, 3)),
    "bias_add": dict(shape=(2, 3)),
    "reduce_sum": dict(shape=(2, 3)), "reduce_max": dict(shape=(2, 3)), "reduce_min": dict(shape=(2, 3)),
    "transpose": dict(shape=(2, 3)), "pad": dict(shape=(2, 3), pad_before=1, pad_after=1),
}

JUNK = (st.booleans() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=4) | st.none()
        | st.sampled_from([np.float64(2.0), np.nan, object(), {}, np.zeros((2, 2), int), float, 2 ** 70]))
NOT_POSITIVE = st.integers(max_value=0) | st.sampled_from([np.int64(-1), np.int8(0)])
NOT_NONNEGATIVE = st.integers(max_value=-1) | st.just(np.int64(-2))
SIZE = NOT_POSITIVE | JUNK | st.lists(st.integers(1, 3), max_size=3)
FLAG = st.integers() | st.floats() | st.text(max_size=4) | st.none() | st.sampled_from([np.int64(1), "yes", [True]])
DTYPE = (st.text(max_size=8).filter(lambda s: s not in NUMERIC) | st.integers()
         | st.sampled_from(["bool", "float16", float]))
SHAPE = (st.sampled_from([(), [], (2 ** 31,) * 3, np.zeros((2, 2), int)]) | JUNK
         | st.lists(NOT_POSITIVE | st.booleans() | st.floats(), min_size=1, max_size=3).map(tuple))
WINDOW = (NOT_POSITIVE | JUNK.filter(lambda v: v is not None) | st.lists(st.integers(1, 3), min_size=3, max_size=4)
          | st.tuples(NOT_POSITIVE, st.integers(1, 2)))
LARGER_THAN_INPUT = st.integers(6, 50)  # the inputs of VALID are 5 x 5
PADDING = (NOT_NONNEGATIVE | JUNK | st.lists(st.integers(0, 1), min_size=3, max_size=3)
           | st.lists(st.integers(0, 1), min_size=5, max_size=6) | st.tuples(NOT_NONNEGATIVE, st.integers(0, 1)))
AXIS = st.integers(min_value=2) | st.integers(max_value=-3) | JUNK.filter(lambda v: v is not None)
REDUCE_AXIS = (st.integers(min_value=2) | st.integers(max_value=-3) | JUNK.filter(lambda v: v is not None)
               | st.sampled_from([(), (0, 0), (1, -1), [0, 2], {0}]))
AXES = (st.integers() | JUNK.filter(lambda v: v is not None)
        | st.lists(st.integers(-3, 2), max_size=3).filter(lambda a: sorted(x % 2 for x in a) != [0, 1] or len(a) != 2))
SIZES = ("M", "N", "K", "B", "batch", "in_dim", "out_dim", "C", "H", "W", "F", "KH", "KW", "multiplier")
INVALID = {
    **dict.fromkeys(SIZES, SIZE),
    "transpose_b": FLAG, "keepdims": FLAG, "dtype": DTYPE, "out_dtype": DTYPE,
    "shape": SHAPE, "shape_a": SHAPE, "shape_b": SHAPE.filter(lambda v: v is not None),
    "stride": WINDOW, "dilation": WINDOW | LARGER_THAN_INPUT, "kernel": WINDOW | LARGER_THAN_INPUT,
    "padding": PADDING, "pad_before": PADDING, "pad_after": PADDING, "groups": SIZE | st.integers(3, 9),
    "axes": AXES,
    "eps": st.floats(max_value=0) | st.sampled_from([math.nan, math.inf, -math.inf, True, "1e-5", None,
                                                     np.float32("nan"), 10 ** 400, np.array(1e-5)]),
    "value": st.text(max_size=3) | st.sampled_from([True, np.False_, None, [0], object(), 1e39, -1e300,
                                                    10 ** 400, np.float64(-1e39)]),
    "epilogue": st.text(max_size=5).filter(lambda s: s not in ("none", "relu", "gelu")) | st.integers() | st.none(),
}


def _invalid_values(name, param):
    if param == "axis":
        return REDUCE_AXIS if name.startswith("reduce_") else AXIS
    return INVALID[param]


def _parameters(name):
    return list(inspect.signature(INVENTORY[name]).parameters)


def test_every_operator_and_parameter_has_invalid_values():
    """A parameter added to the inventory needs its invalid values here."""
    assert set(VALID) == set(INVENTORY)
    for name in INVENTORY:
        get_op(name, **VALID[name])
        for param in _parameters(name):
            assert param in INVALID or param == "axis", f"{name}.{param} has no invalid values"


@DEFINITIONS
@given(st.data())
def test_invalid_parameters_raise_expr_error(data):
    name = data.draw(st.sampled_from(sorted(INVENTORY)))
    param = data.draw(st.sampled_from(_parameters(name)))
    value = data.draw(_invalid_values(name, param))
    with pytest.raises(ExprError, match=rf"^{name}: "):
        get_op(name, **dict(VALID[name], **{param: value}))


@DEFINITIONS
@given(st.data())
def test_any_parameter_value_defines_an_operator_or_raises_expr_error(data):
    """Values that may happen to be valid too (0, 5, a pair...): never a TypeError, OverflowError..."""
    name = data.draw(st.sampled_from(sorted(INVENTORY)))
    param = data.draw(st.sampled_from(_parameters(name)))
    value = data.draw(JUNK | st.integers(-3, 12) | st.lists(st.integers(-1, 4), max_size=5)
                      | st.lists(st.integers(-1, 4), max_size=5).map(tuple) | st.text(max_size=8))
    try:
        op = get_op(name, **dict(VALID[name], **{param: value}))
    except ExprError as e:
        assert str(e).startswith(f"{name}: ")
    else:
        assert_plain(op.params)
