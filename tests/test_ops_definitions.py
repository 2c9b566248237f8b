"""Operator inventory: shapes, references against naive loops, DAGs against references, errors, keys.

There is no code generator in these tests: `evaluate` below interprets a compute DAG with numpy
(vectorized over the whole iteration space) so the definitions themselves are checked. It also
asserts every tensor read is in bounds, since Select evaluates both branches in compiled code.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from compiler import expr as E
from compiler.canonical import workload_key
from compiler.errors import ExprError
from compiler.ops import INVENTORY, OpDef, UnknownOpError, get_op, random_inputs
from compiler.tensor import ComputeOp, PlaceholderOp, Reduce, TensorRead, reduce_identity, topo_order

# ----------------------------------------------------------------------------- a numpy interpreter

_BIN = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "floordiv": np.floor_divide,
        "floormod": np.mod, "min": np.minimum, "max": np.maximum, "pow": np.power}
_CMP = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
        "ne": np.not_equal}
_CALL = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh, "abs": np.abs, "floor": np.floor,
         "ceil": np.ceil, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
         "erf": np.vectorize(math.erf, otypes=[np.float64])}
_REDUCE = {"sum": np.sum, "max": np.max, "min": np.min}


def _eval_expr(e, env, values):
    def ev(x):
        return _eval_expr(x, env, values)

    if isinstance(e, E.Var):
        return env[e]
    if isinstance(e, E.Const):
        return np.array(e.value, dtype=e.dtype)
    if isinstance(e, E.Binary):
        with np.errstate(over="ignore"):
            return _BIN[e.op](ev(e.a), ev(e.b)).astype(e.dtype)
    if isinstance(e, E.Compare):
        return _CMP[e.op](ev(e.a), ev(e.b))
    if isinstance(e, E.Logical):
        return (np.logical_and if e.op == "and" else np.logical_or)(ev(e.a), ev(e.b))
    if isinstance(e, E.Not):
        return np.logical_not(ev(e.a))
    if isinstance(e, E.Select):
        return np.where(ev(e.cond), ev(e.t), ev(e.f)).astype(e.dtype)
    if isinstance(e, E.Cast):
        return ev(e.value).astype(e.dtype)
    if isinstance(e, E.Call):
        return _CALL[e.func](*[ev(a) for a in e.args]).astype(e.dtype)
    if isinstance(e, TensorRead):
        arr = values[id(e.tensor.op)]
        idx = [np.asarray(ev(i)) for i in e.indices]
        for d, (i, n) in enumerate(zip(idx, arr.shape)):
            assert i.min() >= 0 and i.max() < n, f"read of {e.tensor.name} dim {d} out of bounds [{i.min()}, {i.max()}]"
        return arr[tuple(idx)]
    raise TypeError(type(e).__name__)


def evaluate(output, feeds: dict) -> np.ndarray:
    """Run the DAG of `output` on numpy arrays (`feeds`: placeholder Tensor -> array)."""
    values = {id(t.op): np.asarray(a) for t, a in feeds.items()}
    for op in topo_order([output]):
        if isinstance(op, PlaceholderOp):
            assert id(op) in values, f"no value for placeholder {op.name}"
            continue
        assert isinstance(op, ComputeOp)
        axes = list(op.axis) + list(op.reduce_axis)
        env = {}
        for d, ax in enumerate(axes):
            shp = [1] * len(axes)
            shp[d] = ax.extent
            env[ax.var] = np.arange(ax.extent, dtype=np.int64).reshape(shp)
        full = tuple(ax.extent for ax in axes)
        if isinstance(op.body, Reduce):
            src = np.broadcast_to(_eval_expr(op.body.source, env, values), full)
            if op.body.where is not None:
                src = np.where(np.broadcast_to(_eval_expr(op.body.where, env, values), full), src,
                               np.array(reduce_identity(op.body.combiner, op.dtype), op.dtype))
            red = tuple(range(len(op.axis), len(axes)))
            kw = {"dtype": op.dtype} if op.body.combiner == "sum" else {}
            val = _REDUCE[op.body.combiner](src, axis=red, **kw)
        else:
            val = _eval_expr(op.body, env, values)
        values[id(op)] = np.ascontiguousarray(np.broadcast_to(val, op.shape).astype(op.dtype))
    return values[id(output.op)]


def run_dag(opdef: OpDef, arrays):
    return evaluate(opdef.output, dict(zip(opdef.inputs, arrays)))


def assert_close(got, want, dtype):
    assert got.shape == want.shape and got.dtype == want.dtype
    if np.issubdtype(np.dtype(dtype), np.integer):
        np.testing.assert_array_equal(got, want)
    else:
        tol = 1e-5 if dtype == "float32" else 1e-12
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


# ----------------------------------------------------------------------------- every op: DAG == reference

SMALL = [
    ("matmul", dict(M=3, N=5, K=7)),
    ("matmul", dict(M=4, N=3, K=6, transpose_b=True, dtype="float64")),
    ("matmul", dict(M=2, N=3, K=5, dtype="int8")),
    ("matmul_int8", dict(M=3, N=2, K=9, transpose_b=True)),
    ("batch_matmul", dict(B=2, M=3, N=4, K=5)),
    ("batch_matmul", dict(B=2, M=3, N=4, K=5, transpose_b=True, dtype="int8")),
    ("dense", dict(batch=3, in_dim=5, out_dim=4)),
    ("dense", dict(batch=2, in_dim=6, out_dim=3, epilogue="relu")),
    ("dense", dict(batch=2, in_dim=4, out_dim=5, epilogue="gelu")),
    ("conv2d_nchw", dict(N=1, C=2, H=5, W=5, F=2, KH=3, KW=3, stride=2, padding=1, dilation=2, groups=2)),
    ("conv2d_nchw", dict(N=2, C=3, H=7, W=6, F=4, KH=3, KW=2, stride=(2, 1), padding=(1, 0, 2, 1))),
    ("conv2d_nchw", dict(N=1, C=4, H=6, W=6, F=6, KH=1, KW=1, groups=2, dtype="int8")),
    ("conv2d_nhwc", dict(N=1, C=2, H=5, W=5, F=2, KH=3, KW=3, stride=2, padding=1, dilation=2, groups=2)),
    ("conv2d_nhwc", dict(N=2, C=4, H=6, W=7, F=6, KH=3, KW=3, stride=1, padding=1, groups=2)),
    ("conv2d_bias_relu", dict(N=1, C=2, H=5, W=5, F=2, KH=3, KW=3, stride=2, padding=1, dilation=2, groups=2)),
    ("conv2d_bias_relu", dict(N=2, C=3, H=7, W=6, F=4, KH=3, KW=2, stride=(2, 1), padding=(1, 0, 2, 1),
                              dtype="float64")),
    ("dense_gelu", dict(batch=2, in_dim=4, out_dim=5)),
    ("depthwise_conv2d_nchw", dict(N=1, C=3, H=6, W=5, KH=3, KW=3, stride=2, padding=1)),
    ("depthwise_conv2d_nchw", dict(N=2, C=2, H=5, W=5, KH=2, KW=3, padding=(1, 2), dilation=(2, 1),
                                   multiplier=3)),
    ("max_pool2d", dict(N=1, C=2, H=7, W=6, kernel=3, stride=2, padding=1)),
    ("max_pool2d", dict(N=1, C=1, H=5, W=5, kernel=2, dtype="int8")),
    ("avg_pool2d", dict(N=1, C=2, H=7, W=6, kernel=3, stride=2, padding=1)),
    ("avg_pool2d", dict(N=2, C=1, H=6, W=6, kernel=(2, 3), stride=(2, 1))),
    ("softmax", dict(shape=(3, 7))),
    ("softmax", dict(shape=(2, 5, 3), axis=1, dtype="float64")),
    ("layer_norm", dict(shape=(4, 6))),
    ("layer_norm", dict(shape=(2, 3, 5), axis=1, eps=1e-3)),
    ("add", dict(shape_a=(3, 1, 5), shape_b=(4, 1))),
    ("mul", dict(shape_a=(2, 3), shape_b=(3,), dtype="int32")),
    ("relu", dict(shape=(4, 5))),
    ("relu", dict(shape=(7,), dtype="int8")),
    ("gelu", dict(shape=(3, 4))),
    ("bias_add", dict(shape=(2, 3, 4, 4))),
    ("reduce_sum", dict(shape=(3, 4, 5), axis=1)),
    ("reduce_sum", dict(shape=(3, 4, 5), axis=(0, 2), keepdims=True)),
    ("reduce_sum", dict(shape=(3, 4), dtype="int32")),
    ("reduce_max", dict(shape=(3, 4, 5), axis=-1)),
    ("reduce_min", dict(shape=(3, 4, 5), axis=(0, 1))),
    ("transpose", dict(shape=(2, 3, 4), axes=(2, 0, 1))),
    ("transpose", dict(shape=(3, 5))),
    ("pad", dict(shape=(3, 4), pad_before=(1, 0), pad_after=(2, 3), value=1.5)),
    ("pad", dict(shape=(2, 3), pad_before=1, pad_after=0, value=-2, dtype="int32")),
]


@pytest.mark.parametrize("name,params", SMALL, ids=[f"{n}-{i}" for i, (n, _) in enumerate(SMALL)])
def test_dag_matches_reference(name, params):
    op = get_op(name, **params)
    arrays = random_inputs(op, np.random.default_rng(0))
    want = op.reference(*arrays)
    assert want.shape == op.output.shape and str(want.dtype) == op.output.dtype
    assert_close(run_dag(op, arrays), want, op.output.dtype)


def test_every_inventory_entry_is_exercised():
    assert {n for n, _ in SMALL} == set(INVENTORY)


# ----------------------------------------------------------------------------- references vs naive loops

def naive_conv_nchw(x, w, stride, pad, dil, groups):
    N, C, H, W = x.shape
    F, cpg, KH, KW = w.shape
    OH = (H + 2 * pad - dil * (KH - 1) - 1) // stride + 1
    OW = (W + 2 * pad - dil * (KW - 1) - 1) // stride + 1
    out = np.zeros((N, F, OH, OW))
    fpg = F // groups
    for n, f, y, xo in itertools.product(range(N), range(F), range(OH), range(OW)):
        acc = 0.0
        for c, i, j in itertools.product(range(cpg), range(KH), range(KW)):
            h, wi = y * stride - pad + i * dil, xo * stride - pad + j * dil
            if 0 <= h < H and 0 <= wi < W:
                acc += float(x[n, (f // fpg) * cpg + c, h, wi]) * float(w[f, c, i, j])
        out[n, f, y, xo] = acc
    return out


def test_conv_nchw_reference_vs_naive_loops():
    op = get_op("conv2d_nchw", N=1, C=2, H=5, W=5, F=2, KH=3, KW=3, stride=2, padding=1, dilation=2, groups=2)
    x, w = random_inputs(op, np.random.default_rng(1))
    want = naive_conv_nchw(x, w, 2, 1, 2, 2)
    np.testing.assert_allclose(op.reference(x, w), want, rtol=1e-6)
    op = get_op("conv2d_nchw", N=2, C=4, H=7, W=6, F=6, KH=2, KW=3, stride=3, padding=2, groups=2)
    x, w = random_inputs(op, np.random.default_rng(2))
    np.testing.assert_allclose(op.reference(x, w), naive_conv_nchw(x, w, 3, 2, 1, 2), rtol=1e-6)


def test_conv_nhwc_reference_vs_naive_loops():
    op = get_op("conv2d_nhwc", N=2, C=4, H=7, W=6, F=6, KH=3, KW=2, stride=2, padding=1, dilation=2, groups=2)
    x, w = random_inputs(op, np.random.default_rng(3))
    # HWIO [KH, KW, C/g, F] -> OIHW [F, C/g, KH, KW]; NHWC -> NCHW
    want = naive_conv_nchw(x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1), 2, 1, 2, 2).transpose(0, 2, 3, 1)
    np.testing.assert_allclose(op.reference(x, w), want, rtol=1e-6)


def test_depthwise_reference_vs_naive_loops():
    op = get_op("depthwise_conv2d_nchw", N=1, C=3, H=6, W=7, KH=3, KW=3, stride=2, padding=1, dilation=2,
                multiplier=2)
    x, w = random_inputs(op, np.random.default_rng(4))
    # a depthwise conv is a grouped conv with groups=C and weight [C*m, 1, KH, KW]
    want = naive_conv_nchw(x, w.reshape(6, 1, 3, 3), 2, 1, 2, 3)
    np.testing.assert_allclose(op.reference(x, w), want, rtol=1e-6)


def test_pool_references_vs_naive_loops():
    kw = dict(N=1, C=2, H=6, W=5, kernel=3, stride=2, padding=1)
    mx, avg = get_op("max_pool2d", **kw), get_op("avg_pool2d", **kw)
    (x,) = random_inputs(mx, np.random.default_rng(5))
    OH, OW = mx.output.shape[2:]
    want_max, want_avg = np.zeros((1, 2, OH, OW)), np.zeros((1, 2, OH, OW))
    for c, y, xo in itertools.product(range(2), range(OH), range(OW)):
        vals = [x[0, c, y * 2 - 1 + i, xo * 2 - 1 + j] for i in range(3) for j in range(3)
                if 0 <= y * 2 - 1 + i < 6 and 0 <= xo * 2 - 1 + j < 5]
        want_max[0, c, y, xo], want_avg[0, c, y, xo] = max(vals), sum(map(float, vals)) / len(vals)
    np.testing.assert_allclose(mx.reference(x), want_max, rtol=1e-6)
    np.testing.assert_allclose(avg.reference(x), want_avg, rtol=1e-6)
    # an all-negative input: the lowest-value padding must never win
    neg = -np.abs(x) - 1
    assert (run_dag(mx, [neg]) < -1).all()


def test_simple_references():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 4))
    sm = get_op("softmax", shape=(3, 4), dtype="float64").reference(x)
    np.testing.assert_allclose(sm, np.exp(x) / np.exp(x).sum(1, keepdims=True))
    g, b = rng.standard_normal(4), rng.standard_normal(4)
    ln = get_op("layer_norm", shape=(3, 4), dtype="float64").reference(x, g, b)
    want = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5) * g + b
    np.testing.assert_allclose(ln, want)
    y = np.linspace(-3, 3, 13)
    ge = get_op("gelu", shape=(13,), dtype="float64").reference(y)
    np.testing.assert_allclose(ge, [v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in y])
    a, bb = rng.integers(-100, 100, (8, 16)).astype(np.int8), rng.integers(-100, 100, (16, 8)).astype(np.int8)
    mm = get_op("matmul_int8", M=8, N=8, K=16).reference(a, bb)
    assert mm.dtype == np.int32
    np.testing.assert_array_equal(mm, a.astype(np.int64) @ bb.astype(np.int64))


# ----------------------------------------------------------------------------- shapes and structure

@pytest.mark.parametrize("H,W,K,stride,pad,dil", [
    (7, 7, 3, 1, 0, 1), (7, 7, 3, 2, 1, 1), (8, 9, 3, 2, 1, 1), (224, 224, 7, 2, 3, 1),
    (5, 5, 3, 2, 1, 2), (11, 13, 5, 3, 2, 2), (1, 1, 1, 1, 0, 1), (6, 6, 4, 4, 0, 1), (3, 3, 3, 1, 2, 3),
])
def test_conv_output_sizes(H, W, K, stride, pad, dil):
    oh = math.floor((H + 2 * pad - dil * (K - 1) - 1) / stride) + 1
    ow = math.floor((W + 2 * pad - dil * (K - 1) - 1) / stride) + 1
    kw = dict(N=2, C=4, H=H, W=W, F=8, KH=K, KW=K, stride=stride, padding=pad, dilation=dil)
    assert get_op("conv2d_nchw", **kw).output.shape == (2, 8, oh, ow)
    assert get_op("conv2d_nhwc", **kw).output.shape == (2, oh, ow, 8)
    dw = dict(kw, multiplier=2)
    del dw["F"]
    assert get_op("depthwise_conv2d_nchw", **dw).output.shape == (2, 8, oh, ow)


def test_shapes_of_other_ops():
    assert get_op("max_pool2d", N=1, C=3, H=112, W=112, kernel=3, stride=2, padding=1).output.shape == (1, 3, 56, 56)
    assert get_op("avg_pool2d", N=1, C=3, H=7, W=7, kernel=2).output.shape == (1, 3, 3, 3)
    assert get_op("add", shape_a=(8, 1, 6, 1), shape_b=(7, 1, 5)).output.shape == (8, 7, 6, 5)
    assert get_op("reduce_sum", shape=(3, 4, 5), axis=(0, 2)).output.shape == (4,)
    assert get_op("reduce_max", shape=(3, 4), axis=None).output.shape == (1,)
    assert get_op("reduce_min", shape=(3, 4), axis=1, keepdims=True).output.shape == (3, 1)
    assert get_op("transpose", shape=(2, 3, 4), axes=(1, 2, 0)).output.shape == (3, 4, 2)
    assert get_op("matmul", M=2, N=3, K=4, transpose_b=True).inputs[1].shape == (3, 4)
    assert get_op("matmul_int8", M=2, N=3, K=4).output.dtype == "int32"
    assert get_op("conv2d_nhwc", N=1, C=4, H=5, W=5, F=6, KH=3, KW=2, groups=2).inputs[1].shape == (3, 2, 2, 6)


def _stage_names(op):
    return [o.name for o in topo_order([op.output]) if isinstance(o, ComputeOp)]


def test_stages():
    kw = dict(N=1, C=2, H=5, W=5, F=2, KH=3, KW=3)
    assert _stage_names(get_op("conv2d_nchw", **kw, padding=1)) == ["pad", "conv2d_nchw"]
    assert _stage_names(get_op("conv2d_nchw", **kw, padding=0)) == ["conv2d_nchw"]
    assert _stage_names(get_op("dense", batch=2, in_dim=3, out_dim=4, epilogue="gelu")) == \
        ["dense_matmul", "dense_epilogue"]
    assert _stage_names(get_op("softmax", shape=(2, 3))) == ["softmax_max", "softmax_exp", "softmax_sum", "softmax"]
    assert _stage_names(get_op("layer_norm", shape=(2, 3))) == ["layer_norm_mean", "layer_norm_var", "layer_norm"]
    A, B, C = get_op("matmul", M=2, N=3, K=4)
    assert (A.shape, B.shape, C.shape) == ((2, 4), (4, 3), (2, 3))
    op = get_op("dense", batch=2, in_dim=3, out_dim=4)
    *ins, out = op
    assert ins == op.inputs and out is op.output and op.flops == 2 * 2 * 3 * 4 + 2 * 4


def test_random_inputs_are_nonzero_and_typed():
    for name, params in SMALL:
        op = get_op(name, **params)
        for t, a in zip(op.inputs, random_inputs(op, np.random.default_rng(7))):
            assert a.shape == t.shape and str(a.dtype) == t.dtype and np.all(a != 0)


# ----------------------------------------------------------------------------- errors

@pytest.mark.parametrize("name,params,msg", [
    ("conv2d_nchw", dict(N=1, C=3, H=5, W=5, F=4, KH=3, KW=3, groups=2), "groups"),
    ("conv2d_nhwc", dict(N=1, C=4, H=5, W=5, F=3, KH=3, KW=3, groups=2), "groups"),
    ("conv2d_nchw", dict(N=1, C=3, H=5, W=5, F=4, KH=7, KW=3), "larger than the padded input"),
    ("conv2d_nchw", dict(N=1, C=3, H=5, W=5, F=4, KH=3, KW=3, dilation=3), "larger than the padded input"),
    ("conv2d_nchw", dict(N=1, C=3, H=5, W=5, F=4, KH=3, KW=3, stride=0), "stride"),
    ("conv2d_nchw", dict(N=1, C=3, H=5, W=5, F=4, KH=3, KW=3, padding=-1), "padding"),
    ("conv2d_nchw", dict(N=1, C=3, H=5, W=5, F=4, KH=3, KW=3, padding=(1, 2, 3)), "padding"),
    ("conv2d_nchw", dict(N=0, C=3, H=5, W=5, F=4, KH=3, KW=3), "N"),
    ("conv2d_nchw", dict(N=1, C=3, H=5, W=5, F=4, KH=3, KW=3, dtype="int64"), "dtype"),
    ("depthwise_conv2d_nchw", dict(N=1, C=3, H=5, W=5, KH=3, KW=3, multiplier=0), "multiplier"),
    ("max_pool2d", dict(N=1, C=1, H=5, W=5, kernel=3, padding=3), "padding"),
    ("avg_pool2d", dict(N=1, C=1, H=2, W=5, kernel=3), "larger than the padded input"),
    ("avg_pool2d", dict(N=1, C=1, H=5, W=5, kernel=3, dtype="int32"), "dtype"),
    ("matmul", dict(M=2, N=3, K=2.5), "K"),
    ("matmul", dict(M=2, N=3, K=4, dtype="int8", out_dtype="float32"), "out_dtype"),
    ("dense", dict(batch=2, in_dim=3, out_dim=4, epilogue="tanh"), "epilogue"),
    ("dense", dict(batch=2, in_dim=3, out_dim=4, dtype="int8"), "dtype"),
    ("softmax", dict(shape=(2, 3), axis=2), "axis"),
    ("layer_norm", dict(shape=(2, 3), eps=0), "eps"),
    ("add", dict(shape_a=(2, 3), shape_b=(4,)), "broadcast"),
    ("reduce_sum", dict(shape=(2, 3), axis=(0, 0)), "distinct"),
    ("transpose", dict(shape=(2, 3, 4), axes=(0, 0, 1)), "permutation"),
    ("pad", dict(shape=(2, 3), pad_before=(1,), pad_after=0), "pad_before"),
    ("pad", dict(shape=(2, 3), pad_before=1, pad_after=1, value=0.5, dtype="int32"), "representable"),
    ("relu", dict(shape=(0, 3)), "shape"),
    ("matmul", dict(M=2, N=3), "missing"),
    ("matmul", dict(M=2, N=3, K=4, bogus=1), "bogus"),
])
def test_bad_parameters_raise_expr_error(name, params, msg):
    with pytest.raises(ExprError, match=msg):
        get_op(name, **params)


def test_unknown_operator():
    with pytest.raises(UnknownOpError) as info:
        get_op("conv3d", N=1)
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    assert "conv3d" in str(info.value) and "conv2d_nchw" in str(info.value) and "softmax" in str(info.value)


# ----------------------------------------------------------------------------- workload keys

def test_workload_keys_stable_and_distinct():
    conv = dict(N=1, C=4, H=8, W=8, F=8, KH=3, KW=3, stride=1, padding=1)
    k1 = workload_key(get_op("conv2d_nchw", **conv).output)
    assert k1 == workload_key([get_op("conv2d_nchw", **conv).output]) == get_op("conv2d_nchw", **conv).workload_key()
    variants = [
        get_op("conv2d_nchw", **dict(conv, H=9)), get_op("conv2d_nchw", **dict(conv, stride=2)),
        get_op("conv2d_nchw", **dict(conv, padding=0)), get_op("conv2d_nchw", **dict(conv, groups=2)),
        get_op("conv2d_nchw", **dict(conv, dilation=2)), get_op("conv2d_nhwc", **conv),
        get_op("conv2d_nchw", **dict(conv, dtype="float64")),
    ]
    keys = [k1] + [v.workload_key() for v in variants]
    assert len(set(keys)) == len(keys)
    mm = [get_op("matmul", M=64, N=64, K=64), get_op("matmul", M=64, N=64, K=32),
          get_op("matmul", M=64, N=64, K=64, transpose_b=True), get_op("matmul_int8", M=64, N=64, K=64),
          get_op("dense", batch=64, in_dim=64, out_dim=64), get_op("dense", batch=64, in_dim=64, out_dim=64,
                                                                   epilogue="relu")]
    assert len({o.workload_key() for o in mm}) == len(mm)
    assert get_op("matmul", M=64, N=64, K=64).workload_key() == mm[0].workload_key()
