"""The tensor language end to end: every elementwise function, casts, integer division, reductions,
compiled both as scalar loops and vectorized (split by 8 + vectorize, with a tail), against numpy;
canonical text / workload keys; dtype and expression errors."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import compiler as C
from compiler.canonical import canonical_text, workload_key
from compiler.errors import DTypeError, ExprError

REPO = Path(__file__).resolve().parents[1]
MODES = ["scalar", "vec8"]
FLOATS = ["float32", "float64"]
INTS = ["int8", "int32", "int64"]
ALL = FLOATS + INTS + ["bool"]

_kernel_counter = iter(range(10**6))


def _vectorize_all(s, outs):
    """Split the innermost spatial axis of every output stage by 8, move it innermost, vectorize it."""
    for o in outs:
        st = s[o]
        ax = [iv for iv in st.leaf_iter_vars if iv.kind == "spatial"][-1]
        _, inner = st.split(ax, factor=8)
        st.reorder(*([iv for iv in st.leaf_iter_vars if iv is not inner] + [inner]))
        st.vectorize(inner)


def build(inputs, outs, mode):
    outs = outs if isinstance(outs, list) else [outs]
    s = C.create_schedule(outs)
    if mode == "vec8":
        _vectorize_all(s, outs)
    return C.build(s, list(inputs) + outs, name=f"k{next(_kernel_counter)}")


def poison(shape, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return np.full(shape, np.nan, dtype)
    if dtype.kind == "b":
        return np.ones(shape, dtype)
    return np.full(shape, 99, dtype)


def run(inputs, outs, arrays, mode):
    """Build and run; returns the output arrays (allocated poisoned)."""
    outs = outs if isinstance(outs, list) else [outs]
    k = build(inputs, outs, mode)
    res = [poison(o.shape, o.dtype) for o in outs]
    k(*arrays, *res)
    return res


def ew(fn, dtypes, name="Y", out_shape=None):
    """placeholders of `dtypes` (1-D, common length) and an elementwise compute over them."""
    def make(n):
        ins = [C.placeholder((n,), d, f"X{i}") for i, d in enumerate(dtypes)]
        out = C.compute((n,), lambda i: fn(*[x[i] for x in ins]), name=name)
        return ins, out
    return make


# ----------------------------------------------------------------------------- unary math

_erf = np.vectorize(math.erf, otypes=[np.float64])
REF = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh, "erf": _erf,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)), "abs": np.abs, "floor": np.floor, "ceil": np.ceil,
}
TINY = {"float32": float(np.finfo(np.float32).tiny), "float64": float(np.finfo(np.float64).tiny)}


def _wide_inputs():
    specials = [0.0, -0.0, 1e-38, -1e-38, 1e-30, -1e-30, 1e-12, -1e-12, 1e-7, -1e-7, 1e-4, -1e-4,
                0.3, 0.5, 0.6, 0.625, 0.65, 1.0, 2.5, 9.0, 10.0, 15.5, 20.0, 40.0, 80.0, 87.0, 88.0, 88.7,
                88.8, 89.0, 100.0, 700.0, 1e4, 1e20, 1e30, 3e38,
                -0.3, -0.5, -0.6, -1.0, -2.5, -9.0, -15.5, -20.0, -40.0, -80.0, -87.0, -87.4, -88.0, -100.0,
                -103.0, -110.0, -1e4, -1e30, -3e38, np.inf, -np.inf, np.nan]
    grid = np.concatenate([np.linspace(-12.0, 12.0, 241), np.geomspace(1e-6, 50.0, 60), -np.geomspace(1e-6, 50.0, 60)])
    return np.concatenate([specials, grid])          # length 420: 52 vectors of 8 and a tail of 4


WIDE = _wide_inputs()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("func", list(REF))
def test_unary_math(func, dtype, mode):
    x = WIDE.astype(dtype)
    ins, out = ew(getattr(C, func), [dtype])(x.size)
    (y,) = run(ins, out, [x], mode)
    assert y.dtype == np.dtype(dtype)
    with np.errstate(all="ignore"):
        ref = REF[func](x.astype(np.float64))
        ref = np.where(np.abs(ref) > np.finfo(dtype).max, ref.astype(dtype), ref)   # overflow: inf
    # float64 reference; results below the smallest normal float only need to be that close
    np.testing.assert_allclose(y.astype(np.float64), ref, rtol=1e-5, atol=TINY[dtype],
                               err_msg=f"{func} {dtype} {mode}")
    if func in ("tanh", "erf", "sigmoid", "exp"):
        np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))     # NaN in, NaN out
    if func in ("exp", "floor", "ceil", "abs", "sqrt"):
        zero = np.flatnonzero(x == 0)
        np.testing.assert_array_equal(y[zero], ref[zero])              # exact at 0


@pytest.mark.parametrize("mode", MODES)
def test_exp_family_exact_points(mode):
    x = np.array([0.0, 1.0, -1.0, 88.72, 89.0, -87.0, -104.0, np.inf, -np.inf, np.nan], np.float32)
    ins = [C.placeholder((x.size,), "float32", "X")]
    outs = [C.compute((x.size,), (lambda fn: lambda i: fn(ins[0][i]))(getattr(C, f)), name=f) for f in
            ("exp", "tanh", "sigmoid", "erf")]
    e, t, s, r = run(ins, outs, [x], mode)
    assert e[0] == 1.0 and t[0] == 0.0 and s[0] == 0.5 and r[0] == 0.0
    np.testing.assert_allclose(e[1:3], [math.e, 1 / math.e], rtol=1e-6)
    assert np.isfinite(e[3]) and e[4] == np.inf and e[6] == 0.0 and e[7] == np.inf and e[8] == 0.0
    np.testing.assert_allclose(e[3], math.exp(float(x[3])), rtol=1e-5)  # near FLT_MAX, not saturated
    assert list(t[7:9]) == [1.0, -1.0] and list(s[7:9]) == [1.0, 0.0] and list(r[7:9]) == [1.0, -1.0]
    assert np.isnan(e[9]) and np.isnan(t[9]) and np.isnan(s[9]) and np.isnan(r[9])


@pytest.mark.parametrize("mode", MODES)
def test_erf_dense_grid(mode):
    """float32 erf within 1e-6 relative of the float64 one on a dense grid through every regime
    (tiny, the Taylor-like core, the tail where it reaches 1), odd, never beyond [-1, 1]."""
    pos = np.concatenate([np.geomspace(1e-30, 1e-2, 300), np.linspace(1e-2, 7.0, 20011)]).astype(np.float32)
    x = np.concatenate([pos, -pos])
    ins, out = ew(C.erf, ["float32"])(x.size)
    (y,) = run(ins, out, [x], mode)
    ref = _erf(x.astype(np.float64))
    np.testing.assert_allclose(y.astype(np.float64), ref, rtol=1e-6, atol=0)
    assert np.max(np.abs(y)) <= 1.0
    np.testing.assert_array_equal(y[:pos.size], -y[pos.size:])


@pytest.mark.parametrize("mode", MODES)
def test_log_dense_grid(mode):
    """float32 log within 1e-6 relative (2e-7 absolute near 1, where it crosses 0) of the float64
    one from the smallest subnormal to the largest float, densely around 1; 0, negatives, inf, NaN."""
    x = np.concatenate([np.geomspace(1.4e-45, 3.4e38, 20000), np.linspace(0.5, 2.0, 20001),
                        [1.0, 2.0, 0.5, np.e, 0.0, -0.0, -1.0, -1e-30, np.inf, -np.inf, np.nan]]).astype(np.float32)
    ins, out = ew(C.log, ["float32"])(x.size)
    (y,) = run(ins, out, [x], mode)
    with np.errstate(all="ignore"):
        ref = np.log(x.astype(np.float64))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(y[finite].astype(np.float64), ref[finite], rtol=1e-6, atol=2e-7)
    np.testing.assert_array_equal(y[~finite], ref[~finite].astype(np.float32))   # -inf, inf, NaN
    assert (y[x == 1.0] == 0.0).all()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", INTS)
def test_integer_abs(dtype, mode):
    info = np.iinfo(dtype)
    x = np.array([0, 1, -1, 5, -7, 100, -100, info.max, info.min + 1] * 3, dtype)
    ins, out = ew(C.abs, [dtype])(x.size)
    (y,) = run(ins, out, [x], mode)
    np.testing.assert_array_equal(y, np.abs(x))


# ----------------------------------------------------------------------------- binary functions

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOATS)
def test_pow(dtype, mode):
    rng = np.random.default_rng(1)
    base = np.concatenate([[0.0, 1.0, 2.0, 10.0, 0.5, 1e-3], rng.uniform(0, 20, 37)]).astype(dtype)
    expo = np.concatenate([[2.0, 0.0, -1.0, 3.5, 0.5, -0.5], rng.uniform(-3, 3, 37)]).astype(dtype)
    make = ew(lambda a, b: C.power(a, b), [dtype, dtype], "P")
    ins, out = make(base.size)
    (y,) = run(ins, out, [base, expo], mode)
    with np.errstate(all="ignore"):
        ref = np.power(base.astype(np.float64), expo.astype(np.float64))
    np.testing.assert_allclose(y, ref, rtol=1e-5)
    ins2 = [C.placeholder((base.size,), dtype, "B")]
    sq = C.compute((base.size,), lambda i: ins2[0][i] ** 2.0, name="Sq")
    (y2,) = run(ins2, sq, [base], mode)
    np.testing.assert_allclose(y2, base.astype(np.float64) ** 2, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_maximum_minimum(dtype, mode):
    rng = np.random.default_rng(2)
    hi = 100 if dtype == "int8" else 10**6
    a = rng.integers(-hi, hi, 45).astype(dtype)
    b = rng.integers(-hi, hi, 45).astype(dtype)
    if dtype in FLOATS:
        a = a / np.asarray(7, dtype)
        b[::5] = a[::5]
        a[3], b[3] = np.inf, -np.inf
    n = a.size
    A, B = C.placeholder((n,), dtype, "A"), C.placeholder((n,), dtype, "B")
    outs = [C.compute((n,), lambda i: C.maximum(A[i], B[i]), name="mx"),
            C.compute((n,), lambda i: C.minimum(A[i], B[i]), name="mn"),
            C.compute((n,), lambda i: C.max(A[i], 3), name="mx3"),             # max(a, b) is elementwise
            C.compute((n,), lambda i: C.min(0, B[i]), name="mn0")]
    mx, mn, mx3, mn0 = run([A, B], outs, [a, b], mode)
    np.testing.assert_array_equal(mx, np.maximum(a, b))
    np.testing.assert_array_equal(mn, np.minimum(a, b))
    np.testing.assert_array_equal(mx3, np.maximum(a, np.asarray(3, dtype)))
    np.testing.assert_array_equal(mn0, np.minimum(np.asarray(0, dtype), b))


@pytest.mark.parametrize("mode", MODES)
def test_arithmetic_operators(mode):
    n = 29
    a = np.linspace(-3, 5, n).astype(np.float32)
    b = np.linspace(1, 4, n).astype(np.float32)
    A, B = C.placeholder((n,), "float32", "A"), C.placeholder((n,), "float32", "B")
    outs = [C.compute((n,), lambda i: (A[i] + B[i]) * 2.0 - A[i] / B[i], name="e1"),
            C.compute((n,), lambda i: 1.0 - A[i] + 3.0 * B[i] - -A[i], name="e2"),
            C.compute((n,), lambda i: 2.0 / B[i] + A[i] * A[i], name="e3")]
    e1, e2, e3 = run([A, B], outs, [a, b], mode)
    np.testing.assert_allclose(e1, (a + b) * 2 - a / b, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(e2, 1 - a + 3 * b + a, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(e3, 2 / b + a * a, rtol=1e-6)


# ----------------------------------------------------------------------------- select and bools

@pytest.mark.parametrize("mode", MODES)
def test_if_then_else_and_bools(mode):
    n = 37
    rng = np.random.default_rng(3)
    a = rng.standard_normal(n).astype(np.float32)
    m = rng.random(n) < 0.4
    A, M = C.placeholder((n,), "float32", "A"), C.placeholder((n,), "bool", "M")
    outs = [
        C.compute((n,), lambda i: C.if_then_else(A[i] > 0.0, A[i], A[i] * 0.1), name="leaky"),
        # loads that would be out of bounds on the lanes that do not take the branch
        C.compute((n,), lambda i: C.if_then_else(i > 0, A[i - 1], 0.0), name="shift"),
        C.compute((n,), lambda i: C.select(i < n - 2, A[i + 2], A[i]), name="ahead"),
        C.compute((n,), lambda i: C.if_then_else(M[i] & (A[i] < 0.5) | ~M[i] & (A[i] > 1.0), 1.0, -1.0),
                  name="logic"),
        C.compute((n,), lambda i: (A[i] >= 0.0) | M[i], name="bool_out"),
        C.compute((n,), lambda i: C.equal(i % 3, 0) & C.not_equal(A[i], 0.0), name="eq"),
        C.compute((n,), lambda i: C.if_then_else(M[i], i, -i).astype("int32"), name="idx"),
    ]
    leaky, shift, ahead, logic, bool_out, eq, idx = run([A, M], outs, [a, m], mode)
    np.testing.assert_allclose(leaky, np.where(a > 0, a, a * np.float32(0.1)), rtol=1e-6)
    np.testing.assert_array_equal(shift, np.concatenate([[0], a[:-1]]))
    np.testing.assert_array_equal(ahead, np.concatenate([a[2:], a[-2:]]))
    np.testing.assert_array_equal(logic, np.where(m & (a < 0.5) | ~m & (a > 1.0), 1.0, -1.0))
    assert bool_out.dtype == np.bool_
    np.testing.assert_array_equal(bool_out, (a >= 0) | m)
    np.testing.assert_array_equal(eq, (np.arange(n) % 3 == 0) & (a != 0))
    np.testing.assert_array_equal(idx, np.where(m, np.arange(n), -np.arange(n)))


# ----------------------------------------------------------------------------- casts

def _cast_source(dtype):
    if dtype == "bool":
        return np.arange(43) % 3 == 0
    base = np.array([0, -0.0, 1.5, -1.5, 2.7, -2.7, 100.9, -128.0, 127.4, 0.25, 3, -3, 7, 1e-3, -99.5, 42,
                     0.5, -0.5, 1, 5, -6, 9, 126.9, -127.9] + [i * 5.3 - 60 for i in range(19)])
    if dtype in FLOATS:
        return base.astype(dtype)   # in range of every integer type: no undefined conversions
    x = np.trunc(base).astype(np.int64)
    if dtype == "int32":
        x[-4:] = [300, -1000, 2**30 + 3, -(2**31)]       # wrap around when narrowed, like numpy
    if dtype == "int64":
        x[-4:] = [300, -1000, 2**40 + 3, 2**53 + 1]
    return x.astype(dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("src", ALL)
def test_casts_between_all_dtypes(src, mode):
    x = _cast_source(src)
    n = x.size
    X = C.placeholder((n,), src, "X")
    targets = [d for d in ALL if d != src]
    outs = [C.compute((n,), (lambda d: lambda i: X[i].astype(d))(d), name=f"to_{d}") for d in targets]
    res = run([X], outs, [x], mode)
    for d, y in zip(targets, res):
        assert y.dtype == np.dtype(d)
        np.testing.assert_array_equal(y, x.astype(d), err_msg=f"{src} -> {d} ({mode})")
    assert C.cast("float32", X[0]) is not X[0] and X[0].astype(src).dtype == src


# ----------------------------------------------------------------------------- integer division

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", INTS)
def test_floordiv_floormod_negative(dtype, mode):
    n = 45
    a = np.array([(-1) ** i * (i * 7 % 23) for i in range(n)], dtype)
    a[:4] = [0, -1, 1, -127]
    b = np.array([((i % 9) - 4) or 3 for i in range(n)], dtype)
    A, B = C.placeholder((n,), dtype, "A"), C.placeholder((n,), dtype, "B")
    outs = [C.compute((n,), lambda i: A[i] // B[i], name="fd"),
            C.compute((n,), lambda i: A[i] % B[i], name="fm"),
            C.compute((n,), lambda i: C.floordiv(A[i], 3), name="fd3"),
            C.compute((n,), lambda i: C.floormod(A[i], 3), name="fm3"),
            C.compute((n,), lambda i: C.floordiv(A[i], -4), name="fdn4"),
            C.compute((n,), lambda i: C.floormod(A[i], -4), name="fmn4"),
            C.compute((n,), lambda i: (A[i] * 2 - 7) // 5 + A[i] % 2, name="mix")]
    res = run([A, B], outs, [a, b], mode)
    three, m4 = np.asarray(3, dtype), np.asarray(-4, dtype)
    refs = [a // b, a % b, a // three, a % three, a // m4, a % m4,
            (a * np.asarray(2, dtype) - np.asarray(7, dtype)) // np.asarray(5, dtype) + a % np.asarray(2, dtype)]
    for o, y, r in zip(outs, res, refs):
        np.testing.assert_array_equal(y, r, err_msg=f"{o.name} {dtype} {mode}")


@pytest.mark.parametrize("mode", MODES)
def test_index_floordiv_floormod_negative_offsets(mode):
    """Index arithmetic (int64 loop variables) with negative intermediate values."""
    n = 21
    x = np.arange(n, dtype=np.float32) * 10
    X = C.placeholder((n,), "float32", "X")
    out = C.compute((n,), lambda i: X[(i - 10) % n] + ((i - 10) // 4).astype("float32"), name="wrap")
    (y,) = run([X], out, [x], mode)
    idx = np.arange(n)
    np.testing.assert_array_equal(y, x[(idx - 10) % n] + (idx - 10) // 4)


@pytest.mark.parametrize("mode", MODES)
def test_int8_inputs_accumulated_in_int32(mode):
    M, K, N = 9, 70, 13      # sums reach ±1.1e6: far outside int8/int16
    A, B = C.placeholder((M, K), "int8", "A"), C.placeholder((K, N), "int8", "B")
    k = C.reduce_axis(K, "k")
    out = C.compute((M, N), lambda i, j: C.sum(A[i, k].astype("int32") * B[k, j].astype("int32"), axis=k), name="O")
    assert out.dtype == "int32"
    rng = np.random.default_rng(4)
    a = rng.integers(-128, 128, (M, K)).astype(np.int8)
    b = rng.integers(-128, 128, (K, N)).astype(np.int8)
    a[0, :] = -128
    b[:, 0] = -128
    (y,) = run([A, B], out, [a, b], mode)
    np.testing.assert_array_equal(y, a.astype(np.int32) @ b.astype(np.int32))
    assert y[0, 0] == K * 128 * 128


# ----------------------------------------------------------------------------- reductions

def _red_data(shape, dtype, seed=5):
    rng = np.random.default_rng(seed)
    if dtype in FLOATS:
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(-50, 50, shape).astype(dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["float32", "int32", "float64", "int64"])
def test_reductions_one_axis(dtype, mode):
    I, J = 11, 19
    x = _red_data((I, J), dtype)
    X = C.placeholder((I, J), dtype, "X")
    outs = []
    for comb in ("sum", "max", "min"):
        k = C.reduce_axis(J, "k")
        f = getattr(C, comb)
        outs.append(C.compute((I,), (lambda k, f: lambda i: f(X[i, k], axis=k))(k, f), name=f"r_{comb}"))
        k2 = C.reduce_axis(I, "k2")
        outs.append(C.compute((J,), (lambda k2, f: lambda j: f(X[k2, j], axis=k2))(k2, f), name=f"c_{comb}"))
    res = run([X], outs, [x], mode)
    refs = [x.sum(1), x.sum(0), x.max(1), x.max(0), x.min(1), x.min(0)]
    for o, y, r in zip(outs, res, refs):
        assert y.dtype == np.dtype(dtype)
        np.testing.assert_allclose(y, r, rtol=1e-5, atol=1e-5, err_msg=o.name)


@pytest.mark.parametrize("mode", MODES)
def test_reductions_several_axes(mode):
    A_, B_, C_, D_ = 3, 5, 4, 10
    x = _red_data((A_, B_, C_, D_), "float32")
    X = C.placeholder((A_, B_, C_, D_), "float32", "X")
    outs = []
    for comb in ("sum", "max", "min"):
        kb, kc = C.reduce_axis(B_, "kb"), C.reduce_axis(C_, "kc")
        f = getattr(C, comb)
        outs.append(C.compute((A_, D_), (lambda kb, kc, f: lambda a, d: f(X[a, kb, kc, d], axis=[kb, kc]))(kb, kc, f),
                              name=f"bc_{comb}"))
    ka, kb, kc, kd = (C.reduce_axis(e) for e in (A_, B_, C_, D_))
    outs.append(C.compute((1,), lambda z: C.sum(X[ka, kb, kc, kd], axis=[ka, kb, kc, kd]), name="all"))
    res = run([X], outs, [x], mode)
    for y, r in zip(res, [x.sum((1, 2)), x.max((1, 2)), x.min((1, 2))]):
        np.testing.assert_allclose(y, r, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(res[3], [x.astype(np.float64).sum()], rtol=1e-4)


@pytest.mark.parametrize("mode", MODES)
def test_reduction_where(mode):
    I, J = 13, 17
    x = _red_data((I, J), "float32", seed=6)
    x[2, :] = -1.0                                    # no positive element: identities survive
    xi = _red_data((I, J), "int32", seed=7)
    X, XI = C.placeholder((I, J), "float32", "X"), C.placeholder((I, J), "int32", "XI")
    k1, k2, k3, k4, k5 = (C.reduce_axis(J, f"k{n}") for n in range(5))
    outs = [C.compute((I,), lambda i: C.sum(X[i, k1], axis=k1, where=X[i, k1] > 0.0), name="pos_sum"),
            C.compute((I,), lambda i: C.max(X[i, k2], axis=k2, where=X[i, k2] > 0.0), name="pos_max"),
            C.compute((I,), lambda i: C.min(XI[i, k3], axis=k3, where=C.equal(k3.var % 2, 0)), name="even_min"),
            C.compute((I,), lambda i: C.max(XI[i, k4], axis=k4, where=XI[i, k4] > 1000), name="none_max"),
            C.compute((I,), lambda i: C.sum(X[i, k5], axis=k5, where=k5.var < i), name="tri_sum")]
    pos_sum, pos_max, even_min, none_max, tri_sum = run([X, XI], outs, [x, xi], mode)
    np.testing.assert_allclose(pos_sum, np.where(x > 0, x, 0).sum(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pos_max, np.where(x > 0, x, -np.inf).max(1))
    assert pos_max[2] == -np.inf and pos_sum[2] == 0
    np.testing.assert_array_equal(even_min, xi[:, ::2].min(1))
    np.testing.assert_array_equal(none_max, np.full(I, np.iinfo(np.int32).min))
    np.testing.assert_allclose(tri_sum, [x[i, :i].sum() for i in range(I)], rtol=1e-5, atol=1e-6)


def test_a_reduction_condition_on_loop_variables_skips_the_step_and_one_on_data_selects():
    """A `where` that reads only loop variables (a triangle, a group window's span) becomes a
    guard on the loop it names: the skipped steps cost nothing. One that reads data stays a
    Select (the lanes of a vector may disagree)."""
    from compiler.loop_ir import format_stmt
    I, J = 9, 13
    x = _red_data((I, J), "float32", seed=9)
    X = C.placeholder((I, J), "float32", "X")
    k1, k2 = C.reduce_axis(J, "k1"), C.reduce_axis(J, "k2")
    tri = C.compute((I,), lambda i: C.sum(X[i, k1], axis=k1, where=k1.var < i), name="tri")
    pos = C.compute((I,), lambda i: C.sum(X[i, k2], axis=k2, where=X[i, k2] > 0.0), name="pos")
    tri_text = format_stmt(C.lower(C.create_schedule(tri), [X, tri]).body)
    pos_text = format_stmt(C.lower(C.create_schedule(pos), [X, pos]).body)
    assert "if (" in tri_text and "select" not in tri_text
    assert "select" in pos_text
    tri_out, pos_out = run([X], [tri, pos], [x], "scalar")
    np.testing.assert_allclose(tri_out, [x[i, :i].sum() for i in range(I)], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pos_out, np.where(x > 0, x, 0).sum(1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_reduce_axis_nonzero_lower_bound(mode):
    I, J = 10, 23
    x = _red_data((I, J), "float32", seed=8)
    X = C.placeholder((I, J), "float32", "X")
    k1 = C.reduce_axis((3, 20), "k1")
    k2 = C.reduce_axis((5, 23), "k2")
    k3 = C.reduce_axis((-2, 3), "k3")
    k4 = C.reduce_axis((1, 9), "k4")
    outs = [C.compute((I,), lambda i: C.sum(X[i, k1], axis=k1), name="mid"),
            C.compute((I,), lambda i: C.max(X[i, k2] * k2.var.astype("float32"), axis=k2), name="weighted"),
            # a window around i+2 with a negative start, clipped by where=
            C.compute((I,), lambda i: C.sum(X[i, C.maximum(C.minimum(i + k3.var, J - 1), 0)], axis=k3,
                                            where=(i + k3.var >= 0)), name="window"),
            C.compute((I,), lambda i: C.sum(X[i, k4], axis=k4, where=C.equal(k4.var % 3, 1)), name="lo_where")]
    mid, weighted, window, lo_where = run([X], outs, [x], mode)
    np.testing.assert_allclose(mid, x[:, 3:20].sum(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(weighted, (x[:, 5:23] * np.arange(5, 23)).max(1), rtol=1e-6)
    np.testing.assert_allclose(window, [x[i, max(i - 2, 0):i + 3].sum() for i in range(I)], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lo_where, x[:, [1, 4, 7]].sum(1), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- canonical text and keys

def _define(names=("A", "B", "C"), args=("i", "j"), M=16, K=24, N=8, dtype="float32", tag="dense", lo=0):
    A = C.placeholder((M, K), dtype, names[0])
    B = C.placeholder((K, N), dtype, names[1])
    k = C.reduce_axis((lo, K), "kk" + names[2])
    ns = {"C": C, "A": A, "B": B, "k": k}
    mm = eval(f"lambda {args[0]}, {args[1]}: C.sum(A[{args[0]}, k] * B[k, {args[1]}], axis=k)", ns)
    out = C.compute((M, N), mm, name=names[2], tag=tag)
    relu = C.compute((M, N), eval(f"lambda {args[1]}, {args[0]}: C.maximum(O[{args[1]}, {args[0]}], 0.0)",
                                  dict(ns, O=out)), name=names[2] + "_relu")
    return relu


_KEY_CHILD = """
import sys
sys.path.insert(0, {repo!r})
import compiler as C
for i in range(7):                         # shift every automatic name counter
    C.placeholder((3,), "float32")
    C.reduce_axis(4)
sys.path.insert(0, {here!r})
from test_language import _define
out = _define(names=("P", "Q", "R"), args=("row", "col"))
print(C.workload_key(out))
print(C.canonical_text(out).replace("\\n", "|"))
"""


def test_workload_key_same_in_another_process():
    out = _define()
    env = dict(os.environ, PYTHONHASHSEED="123")
    proc = subprocess.run([sys.executable, "-c", _KEY_CHILD.format(repo=str(REPO), here=str(Path(__file__).parent))],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    key, text = proc.stdout.split("\n")[:2]
    assert key == workload_key(out)
    assert text == canonical_text(out).replace("\n", "|")


def test_workload_key_ignores_names():
    k1 = workload_key(_define())
    assert len(k1) == 32 and all(c in "0123456789abcdef" for c in k1)
    assert workload_key(_define()) == k1
    assert workload_key(_define(names=("X", "W", "Y"), args=("a", "b"))) == k1
    assert canonical_text(_define(names=("X", "W", "Y"))) == canonical_text(_define())
    # default (generated) names
    def anon():
        A = C.placeholder((4, 5))
        kk = C.reduce_axis(5)
        return C.compute((4,), lambda *i: C.sum(A[i[0], kk], axis=kk), tag="t")
    assert workload_key(anon()) == workload_key(anon())


@pytest.mark.parametrize("change", [dict(M=17), dict(K=25), dict(N=9), dict(dtype="float64"), dict(tag="other"),
                                    dict(lo=1)])
def test_workload_key_differs(change):
    assert workload_key(_define(**change)) != workload_key(_define())


def test_workload_key_sees_index_order():
    A = C.placeholder((8, 8), "float32", "A")
    same = C.compute((8, 8), lambda i, j: A[i, j] + 1.0)
    transposed = C.compute((8, 8), lambda i, j: A[j, i] + 1.0)
    assert workload_key(same) != workload_key(transposed)


def test_workload_key_distinguishes_operations():
    X = C.placeholder((8,), "float32", "X")
    Y = C.placeholder((8,), "float32", "Y")
    keys = {workload_key(C.compute((8,), f)) for f in (
        lambda i: X[i] + Y[i], lambda i: X[i] * Y[i], lambda i: X[i] * 2.0, lambda i: X[i] - Y[i],
        lambda i: C.exp(X[i]), lambda i: C.tanh(X[i]), lambda i: X[i] + 1.0, lambda i: X[i] + 2.0,
        lambda i: X[(i + 1) % 8], lambda i: C.maximum(X[i], 0.0))}
    assert len(keys) == 10
    # inputs are named by first use, so X+Y and Y+X are the same workload (only argument order differs)
    assert workload_key(C.compute((8,), lambda i: X[i] + Y[i])) == workload_key(C.compute((8,), lambda i: Y[i] + X[i]))
    # multiple outputs: order matters, and both are part of the key
    a = C.compute((8,), lambda i: X[i] + 1.0)
    b = C.compute((8,), lambda i: X[i] * 2.0)
    assert workload_key([a, b]) != workload_key([b, a]) != workload_key([a])


# ----------------------------------------------------------------------------- errors

def test_dtype_errors():
    F = C.placeholder((4,), "float32", "F")
    D = C.placeholder((4,), "float64", "D")
    I = C.placeholder((4,), "int32", "I")
    L = C.placeholder((4,), "int64", "L")
    Bo = C.placeholder((4,), "bool", "Bo")
    i = C.compute((4,), lambda i: i, name="idx").op.axis[0].var
    cases = {
        "float32 + int32": lambda: F[i] + I[i],
        "int32 * float32": lambda: I[i] * F[i],
        "float32 + float64": lambda: F[i] + D[i],
        "int32 + int64": lambda: I[i] + L[i],
        "float const with int": lambda: I[i] + 1.5,
        "float const with index": lambda: i * 0.5,
        "float const reversed": lambda: 2.5 - L[i],
        "true division of ints": lambda: I[i] / I[i],
        "true division by int const": lambda: L[i] / 2,
        "floordiv of floats": lambda: F[i] // F[i],
        "floormod of floats": lambda: C.floormod(F[i], 2.0),
        "pow of ints": lambda: I[i] ** I[i],
        "exp of int": lambda: C.exp(I[i]),
        "sqrt of bool": lambda: C.sqrt(Bo[i]),
        "bool arithmetic": lambda: Bo[i] + Bo[i],
        "select on float cond": lambda: C.if_then_else(F[i], 1.0, 0.0),
        "select branches mixed": lambda: C.if_then_else(Bo[i], F[i], I[i]),
        "compare mixed": lambda: F[i] < I[i],
        "logical on floats": lambda: F[i] & F[i],
        "not of int": lambda: ~I[i],
        "python and": lambda: (F[i] > 0) and (F[i] < 1),
        "python if": lambda: 1 if F[i] > 0 else 0,
        "float index": lambda: F[F[i]],
        "bool index": lambda: F[Bo[i]],
        "unsupported dtype": lambda: C.placeholder((4,), "float16"),
        "cast to unsupported": lambda: F[i].astype("uint8"),
        "string operand": lambda: F[i] + "x",
        "sum of bools": lambda: C.sum(Bo[C.reduce_axis(4)], axis=C.reduce_axis(4)),
    }
    for what, fn in cases.items():
        with pytest.raises(DTypeError):
            fn()
            pytest.fail(f"{what}: no DTypeError")
    k = C.reduce_axis(4, "k")
    with pytest.raises(DTypeError, match="where"):
        C.sum(F[k], axis=k, where=F[k])


def test_dtype_error_messages_say_what_to_do():
    F = C.placeholder((4,), "float32", "F")
    I = C.placeholder((4,), "int32", "I")
    with pytest.raises(DTypeError, match=r"cannot combine float32 and int32.*astype"):
        C.compute((4,), lambda i: F[i] + I[i])
    with pytest.raises(DTypeError, match=r"float constant 1\.5 with int32"):
        C.compute((4,), lambda i: I[i] * 1.5)
    with pytest.raises(DTypeError, match=r"true division.*//"):
        C.compute((4,), lambda i: I[i] / I[i])
    ok = C.compute((4,), lambda i: F[i] + I[i].astype("float32") * 2 + 1)   # int literals adopt float32
    assert ok.dtype == "float32"


def test_python_equality_is_not_an_expression():
    """`==` compares object identity and yields a Python bool: refused where a condition is expected."""
    A = C.placeholder((4, 6), "int32", "A")
    k = C.reduce_axis(6, "k")
    with pytest.raises(DTypeError, match="equal"):
        C.compute((4,), lambda i: C.sum(A[i, k], axis=k, where=k.var % 2 == 0))
    with pytest.raises(DTypeError, match="equal"):
        C.compute((4,), lambda i: C.if_then_else(A[i, 0] != 0, 1, 2))
    with pytest.raises(DTypeError, match="equal"):
        C.compute((4,), lambda i: A[i, 0] == 3)
    ok = C.compute((4,), lambda i: C.if_then_else(C.equal(A[i, 0], 0) | C.not_equal(A[i, 1], 2), 1, 2))
    assert ok.dtype == "int64"


def test_expr_errors():
    A = C.placeholder((4, 5), "float32", "A")
    V = C.placeholder((5,), "float32", "V")
    k = C.reduce_axis(5, "k")
    with pytest.raises(ExprError, match="has 2 dimensions, indexed with 1"):
        C.compute((4,), lambda i: A[i])
    with pytest.raises(ExprError, match="indexed with 3"):
        C.compute((4, 5), lambda i, j: A[i, j, 0])
    with pytest.raises(ExprError, match="indexed with 2"):
        C.compute((5,), lambda i: V[i, i])
    with pytest.raises(ExprError, match="nested"):
        C.compute((4,), lambda i: C.sum(A[i, k], axis=k) * 2.0)
    k2 = C.reduce_axis(5, "k2")
    with pytest.raises(ExprError, match="nested"):
        C.compute((4,), lambda i: C.sum(C.sum(A[i, k] * V[k2], axis=k2), axis=k))
    with pytest.raises(ExprError, match="nested"):
        C.compute((4,), lambda i: C.if_then_else(i > 1, C.max(A[i, k], axis=k), 0.0))
    with pytest.raises(ExprError, match="fcompute takes 1 indices but the shape has 2"):
        C.compute((4, 5), lambda i: A[i, 0])
    with pytest.raises(ExprError, match="listed twice"):
        C.compute((4,), lambda i: C.sum(A[i, k], axis=[k, k]))
    with pytest.raises(ExprError, match="reduce_axis"):
        C.compute((4,), lambda i: C.sum(A[i, 0], axis=[]))
    with pytest.raises(ExprError, match="reduce_axis"):
        C.compute((4,), lambda i: C.sum(A[i, 0], axis=i))
    for bad in ((3, 3), (5, 2), (0, 2.5)):
        with pytest.raises(ExprError):
            C.reduce_axis(bad)
    for shape in ((0,), (4, -1), (2.0,), (True,)):
        with pytest.raises(ExprError):
            C.placeholder(shape)
        with pytest.raises(ExprError):
            C.compute(shape, lambda *i: 1.0)
