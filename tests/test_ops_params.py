"""Operator parameters: checked at definition with an ExprError naming operator and parameter,
numpy scalars taken wherever Python scalars are, and only plain Python values in `params`; and
layer_norm's numerics (constant rows, rows far from zero).

Most of these failed before the checks existed (a few guard what already worked, such as numpy
bools as flags or refusing a string as pad value): flags were taken by truthiness
(`transpose_b='no'` built a transposed matmul), numpy scalars were refused in some places
(`eps=np.float32(1e-5)`, transpose axes, a pad width) and kept in others, a pad value an
integer dtype cannot hold wrapped (1000 → -24 in int8) or escaped as ValueError/OverflowError,
and layer_norm of a constant row missed beta by up to 1e-4 (a row of 1.0) or 1.3 (of 1000.0).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from compiler import Target, lower
from compiler.errors import ExprError
from compiler.ops import build_op, default_schedule, get_op, random_inputs

# ----------------------------------------------------------------------------- flags

FLAGS = [
    ("matmul", dict(M=2, N=3, K=4), "transpose_b"),
    ("matmul_int8", dict(M=2, N=3, K=4), "transpose_b"),
    ("batch_matmul", dict(B=2, M=2, N=3, K=4), "transpose_b"),
    ("reduce_sum", dict(shape=(2, 3), axis=1), "keepdims"),
    ("reduce_max", dict(shape=(2, 3), axis=1), "keepdims"),
    ("reduce_min", dict(shape=(2, 3), axis=1), "keepdims"),
]
NOT_BOOLS = ["no", "False", "", 0, 1, 1.0, None, np.int64(1), [True]]


@pytest.mark.parametrize("value", NOT_BOOLS, ids=repr)
@pytest.mark.parametrize("name,params,flag", FLAGS, ids=[f"{n}-{f}" for n, _, f in FLAGS])
def test_flags_must_be_bools(name, params, flag, value):
    with pytest.raises(ExprError, match=rf"^{name}: {flag} must be True or False, got "):
        get_op(name, **params, **{flag: value})


@pytest.mark.parametrize("name,params,flag", FLAGS, ids=[f"{n}-{f}" for n, _, f in FLAGS])
def test_numpy_bools_are_flags(name, params, flag):
    for value in (np.True_, np.False_, True, False):
        got = get_op(name, **params, **{flag: value}).params[flag]
        assert type(got) is bool and got == bool(value)


# ----------------------------------------------------------------------------- numpy scalars

i64 = np.int64


def assert_plain(value):
    """Only what JSON round-trips: the tuner stores params as JSON."""
    if isinstance(value, dict):
        for v in value.values():
            assert_plain(v)
    elif isinstance(value, (tuple, list)):
        for v in value:
            assert_plain(v)
    else:
        assert type(value) in (bool, int, float, str), f"{value!r} is a {type(value).__name__}"


NUMPY_PARAMS = [
    ("layer_norm", dict(shape=(i64(2), i64(3)), axis=i64(-1), eps=np.float32(1e-5)),
     dict(shape=(2, 3), axis=-1, eps=1e-5)),
    ("layer_norm", dict(shape=(2, 3), eps=np.float64(1e-3)), dict(shape=(2, 3), eps=1e-3)),
    ("transpose", dict(shape=(2, 3, 4), axes=(i64(2), i64(0), i64(1))), dict(shape=(2, 3, 4), axes=(2, 0, 1))),
    ("transpose", dict(shape=(2, 3, 4), axes=np.array([2, 0, 1])), dict(shape=(2, 3, 4), axes=(2, 0, 1))),
    ("reduce_sum", dict(shape=(2, 3, 4), axis=(i64(0), np.int32(-1)), keepdims=np.True_),
     dict(shape=(2, 3, 4), axis=(0, 2), keepdims=True)),
    ("reduce_max", dict(shape=np.array([2, 3]), axis=i64(1)), dict(shape=(2, 3), axis=1)),
    ("pad", dict(shape=(2, 3), pad_before=i64(1), pad_after=(i64(0), np.int8(2)), value=np.float32(1.5)),
     dict(shape=(2, 3), pad_before=1, pad_after=(0, 2), value=1.5)),
    ("pad", dict(shape=(2, 3), pad_before=1, pad_after=1, value=np.int64(-3), dtype="int8"),
     dict(shape=(2, 3), pad_before=1, pad_after=1, value=-3, dtype="int8")),
    ("conv2d_nchw", dict(N=i64(1), C=i64(4), H=i64(7), W=i64(7), F=i64(4), KH=i64(3), KW=i64(3),
                         stride=i64(2), padding=(i64(1), i64(0)), dilation=(i64(1), i64(2)), groups=i64(2)),
     dict(N=1, C=4, H=7, W=7, F=4, KH=3, KW=3, stride=2, padding=(1, 0), dilation=(1, 2), groups=2)),
    ("max_pool2d", dict(N=1, C=2, H=i64(7), W=7, kernel=np.array([3, 2]), stride=i64(2), padding=i64(1)),
     dict(N=1, C=2, H=7, W=7, kernel=(3, 2), stride=2, padding=1)),
    ("matmul", dict(M=i64(2), N=np.uint8(3), K=np.int32(4), dtype=np.float32, transpose_b=np.True_),
     dict(M=2, N=3, K=4, transpose_b=True)),
    ("bias_add", dict(shape=(2, 3), axis=i64(0), dtype=np.dtype("int8")), dict(shape=(2, 3), axis=0, dtype="int8")),
]


@pytest.mark.parametrize("name,numpy_params,python_params", NUMPY_PARAMS,
                         ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(NUMPY_PARAMS)])
def test_numpy_scalars_give_the_same_operator_as_python_scalars(name, numpy_params, python_params):
    op = get_op(name, **numpy_params)
    assert_plain(op.params)
    assert json.loads(json.dumps(op.params)) == json.loads(json.dumps(get_op(name, **python_params).params))
    assert op.workload_key() == get_op(name, **python_params).workload_key()


def test_numpy_scalar_params_build_a_correct_kernel():
    op = get_op("layer_norm", shape=(i64(4), i64(9)), axis=i64(0), eps=np.float32(1e-3))
    arrays = random_inputs(op, np.random.default_rng(0))
    out = np.full(op.output.shape, np.nan, np.float32)
    build_op(op)(*arrays, out)
    np.testing.assert_allclose(out, op.reference(*arrays), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("eps", [0, -1e-5, float("nan"), float("inf"), np.float32("nan"), np.float64("-inf"),
                                 10 ** 400, True, "1e-5", None, np.array(1e-5)], ids=repr)
def test_layer_norm_eps_must_be_finite_and_positive(eps):
    with pytest.raises(ExprError, match=r"^layer_norm: eps must be a finite positive number"):
        get_op("layer_norm", shape=(2, 3), eps=eps)


@pytest.mark.parametrize("name,params,msg", [
    ("transpose", dict(shape=(2, 3), axes=5), "transpose: axes 5 is not a permutation"),
    ("transpose", dict(shape=(2, 3), axes=(True, False)), "transpose: axes .* is not a permutation"),
    ("transpose", dict(shape=(2, 3), axes=(1.0, 0.0)), "transpose: axes .* is not a permutation"),
    ("reduce_sum", dict(shape=(2, 3), axis="1"), "reduce_sum: axis must be an int, a tuple of ints or None"),
    ("reduce_sum", dict(shape=(2, 3), axis={1}), "reduce_sum: axis must be an int, a tuple of ints or None"),
    ("reduce_sum", dict(shape=(2, 3), axis=(0, 2)), r"reduce_sum: axis 2 out of range for a 2-d tensor; use -2..1"),
    ("softmax", dict(shape=(2, 3), axis=1.0), "softmax: axis must be an integer, got 1.0"),
    ("bias_add", dict(shape=(2, 3), axis=np.True_), "bias_add: axis must be an integer"),
    ("matmul", dict(M=2, N=3, K=4, out_dtype="int8"), "matmul: out_dtype 'int8' not supported"),
    ("matmul", dict(M=2, N=3, K=4, name="conv2d_nchw"), "matmul: got an unexpected keyword argument 'name'"),
    ("dense", dict(batch=2, in_dim=3, out_dim=4, epilogue=["relu"]), "dense: epilogue must be one of"),
    ("relu", dict(shape=(2 ** 64,)), r"relu: shape\[0\]=18446744073709551616 is too large"),
    ("relu", dict(shape=(2 ** 31, 2 ** 31, 2 ** 31)), "relu: shape .* has more than 2\\*\\*60 elements"),
    ("matmul", dict(M=2 ** 40, N=2 ** 40, K=1), "matmul: tensor matmul of shape .* has more than 2\\*\\*60"),
    ("relu", dict(shape=(2, 3), dtype=float), "relu: dtype <class 'float'> not supported"),
])
def test_bad_parameters_name_operator_and_parameter(name, params, msg):
    with pytest.raises(ExprError, match=f"^{msg}"):
        get_op(name, **params)


# ----------------------------------------------------------------------------- pad values

@pytest.mark.parametrize("value,dtype", [
    (1000, "int8"), (-129, "int8"), (128, "int8"), (2 ** 31, "int32"), (2 ** 63, "int64"),
    (1.5, "int8"), (np.float32(-0.5), "int32"), (float("nan"), "int8"), (float("inf"), "int32"),
    (-float("inf"), "int64"), (np.float64("nan"), "int32"), (1e300, "int64"),
    (1e39, "float32"), (-np.float64(1e39), "float32"), (10 ** 400, "float64"),
], ids=repr)
def test_pad_value_the_dtype_cannot_hold_is_refused(value, dtype):
    with pytest.raises(ExprError, match=rf"^pad: value .* is not representable in {dtype}"):
        get_op("pad", shape=(2, 3), pad_before=1, pad_after=1, value=value, dtype=dtype)


@pytest.mark.parametrize("value", [True, np.False_, "0", None, [0], np.array(0.0)], ids=repr)
def test_pad_value_must_be_a_number(value):
    with pytest.raises(ExprError, match="^pad: value must be a number"):
        get_op("pad", shape=(2, 3), pad_before=1, pad_after=1, value=value)


@pytest.mark.parametrize("value,dtype", [
    (127, "int8"), (-128, "int8"), (-7.0, "int8"), (np.int64(100), "int8"), (np.float32(3.0), "int32"),
    (2 ** 31 - 1, "int32"), (float("nan"), "float32"), (-float("inf"), "float32"), (np.float32("inf"), "float64"),
    (np.float64(-1.25), "float32"), (3, "float64"),
], ids=repr)
def test_pad_fills_the_border_with_exactly_the_value(value, dtype):
    op = get_op("pad", shape=(2, 3), pad_before=(1, 0), pad_after=(0, 2), value=value, dtype=dtype)
    assert_plain(op.params)
    arrays = random_inputs(op, np.random.default_rng(0))
    out = np.zeros(op.output.shape, dtype)
    build_op(op)(*arrays, out)
    np.testing.assert_array_equal(out, op.reference(*arrays))
    np.testing.assert_array_equal(out[0], np.full(5, value, dtype))


# ----------------------------------------------------------------------------- layer_norm numerics

def _gamma_beta(n, rng):
    return (rng.uniform(0.5, 2.0, n).astype(np.float32),
            (rng.choice([-1.0, 1.0], n) * rng.uniform(0.1, 3.0, n)).astype(np.float32))


def _run_layer_norm(op, x, g, b):
    out = np.full(op.output.shape, np.nan, np.float32)
    build_op(op)(x, g, b, out)
    return out


@pytest.mark.parametrize("shape,axis", [((8, 768), -1), ((13, 31), -1), ((4, 1000), -1), ((33,), 0),
                                        ((5, 40, 7), 1), ((24, 6), 0)])
def test_layer_norm_of_constant_rows_is_beta(shape, axis):
    """Zero deviations normalize to exactly 0 whatever the constant; an fp32 mean off by an ulp of
    the constant used to come out as beta + (error / sqrt(eps)) · gamma, up to 1.3 at 1000."""
    rng = np.random.default_rng(1)
    n = shape[axis]
    op = get_op("layer_norm", shape=shape, axis=axis)
    g, b = _gamma_beta(n, rng)
    bshape = [1] * len(shape)
    bshape[axis] = n
    for c in (0.1, 1.0, 3.7, -1000.0, 1234.567, 3e4):
        out = _run_layer_norm(op, np.full(shape, c, np.float32), g, b)
        want = np.broadcast_to(b.reshape(bshape), shape)
        assert np.all(np.abs(out - want) <= 1e-6 * np.abs(want)), f"constant {c}: max error {np.abs(out - want).max()}"


@pytest.mark.parametrize("shape", [(64, 768), (32, 1024), (64, 31), (16, 100)])
def test_layer_norm_far_from_zero_is_as_accurate_as_numpy(shape):
    """Rows 1e3 + N(0, 1): the error against a float64 reference is at most numpy's own float32
    error (it was 2-6x numpy's: the fp32 mean of 1e3-sized values loses the spread's digits)."""
    rng = np.random.default_rng(2)
    x = (1e3 + rng.standard_normal(shape)).astype(np.float32)
    g, b = _gamma_beta(shape[-1], rng)
    exact = get_op("layer_norm", shape=shape, dtype="float64").reference(x, g, b)
    numpy32 = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + np.float32(1e-5)) * g + b
    ours = _run_layer_norm(get_op("layer_norm", shape=shape), x, g, b)
    err_ours, err_numpy = np.abs(ours - exact).max(), np.abs(numpy32 - exact).max()
    assert err_ours <= err_numpy, f"ours {err_ours:.3g} vs numpy {err_numpy:.3g}"


@pytest.mark.parametrize("params", [dict(shape=(256, 256)), dict(shape=(16, 32, 64), axis=1)])
def test_layer_norm_default_schedule_is_vectorized_and_parallel(params):
    op = get_op("layer_norm", **params)
    ir = str(lower(default_schedule(op, Target.host()), op.tensors))
    assert "parallel for" in ir and "vectorized for" in ir
    # the statistics accumulate in vectors too (partial sums per lane along a last-axis row)
    for stat in ("layer_norm_mean", "layer_norm_var"):
        body = ir.split(f"allocate {stat}")[1].split("allocate")[0]
        assert "vectorized for" in body, f"{stat} is not vectorized:\n{ir}"
