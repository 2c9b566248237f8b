"""Math functions in generated code.

float32 exp/log/tanh/sigmoid/erf are polynomial approximations built from vector instructions
(Cephes-style range reduction), so softmax or GELU stay vectorized instead of calling libm once
per lane. Relative error is a few ulp, well under the 1e-5 that kernel tests allow. Other cases
use LLVM intrinsics (sqrt, fabs, floor, ...) or libm, scalarized per lane for vectors.
"""

from __future__ import annotations

from llvmlite import ir

F32, F64, I32 = ir.FloatType(), ir.DoubleType(), ir.IntType(32)
FAST = ("contract",)


def _c(ty, value):
    if isinstance(ty, ir.VectorType):
        return ir.Constant(ty, [value] * ty.count)
    return ir.Constant(ty, value)


def _int_ty(ty):
    return ir.VectorType(I32, ty.count) if isinstance(ty, ir.VectorType) else I32


def _intrinsic(em, name, x, nargs=1):
    fn = em.mb.intrinsic(f"llvm.{name}", x.type, [x.type] * nargs, [x.type])
    return fn


def _poly(b, x, coefs):
    acc = _c(x.type, coefs[0])
    for c in coefs[1:]:
        acc = b.fadd(b.fmul(acc, x, flags=FAST), _c(x.type, c), flags=FAST)
    return acc


def exp_f32(em, x):
    """e^x: x = n·ln2 + r, e^r by a degree-6 polynomial, 2^n by building the exponent bits.

    2^n is applied as two factors 2^(n>>1)·2^(n-(n>>1)), each a normal float, so the result
    overflows to inf above ln(FLT_MAX) and underflows gradually (denormals, then 0) below
    -87.3 instead of saturating. n = round(x·log2 e) comes from adding and subtracting 1.5·2^23
    (the sum's low mantissa bits are n: no round or convert instruction), the reductions and the
    polynomial are multiply-adds. The clamps are compare + select, never llvm.minnum/maxnum
    (see FunctionEmitter._float_min_max), with unordered compares: a NaN passes them and every
    step after them, so it comes out NaN without a test of its own. About 25 vector
    instructions where the floor/convert/NaN-select form took 38 (a softmax spends most of its
    time here).
    """
    b = em.builder
    ty = x.type
    x = b.select(b.fcmp_unordered("<", x, _c(ty, 89.0)), x, _c(ty, 89.0))
    x = b.select(b.fcmp_unordered(">", x, _c(ty, -104.0)), x, _c(ty, -104.0))
    magic = 12582912.0   # 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits
    biased = b.fadd(b.fmul(x, _c(ty, 1.44269504088896341), flags=FAST), _c(ty, magic), flags=FAST)
    fx = b.fsub(biased, _c(ty, magic))
    r = b.fsub(x, b.fmul(fx, _c(ty, 0.693359375), flags=FAST), flags=FAST)
    r = b.fsub(r, b.fmul(fx, _c(ty, -2.12194440e-4), flags=FAST), flags=FAST)
    p = _poly(b, r, [1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                     1.6666665459e-1, 5.0000001201e-1])
    y = b.fadd(b.fadd(b.fmul(b.fmul(p, r, flags=FAST), r, flags=FAST), r, flags=FAST), _c(ty, 1.0), flags=FAST)
    ity = _int_ty(ty)
    n = b.sub(b.bitcast(biased, ity), b.bitcast(_c(ty, magic), ity))
    n1 = b.ashr(n, _c(ity, 1))
    n2 = b.sub(n, n1)
    scale1 = b.bitcast(b.shl(b.add(n1, _c(ity, 127)), _c(ity, 23)), ty)
    scale2 = b.bitcast(b.shl(b.add(n2, _c(ity, 127)), _c(ity, 23)), ty)
    return b.fmul(b.fmul(y, scale1), scale2)


def tanh_f32(em, x):
    """Odd polynomial near 0 (no cancellation), 1 - 2/(e^{2|x|}+1) elsewhere."""
    b = em.builder
    ty = x.type
    ax = b.call(_intrinsic(em, "fabs", x), [x])
    z = b.fmul(x, x)
    small = b.fadd(b.fmul(b.fmul(_poly(b, z, [-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2,
                                                1.33314422036e-1, -3.33332819422e-1]), z), x), x)
    e = exp_f32(em, b.fmul(ax, _c(ty, 2.0)))
    big = b.fsub(_c(ty, 1.0), b.fdiv(_c(ty, 2.0), b.fadd(e, _c(ty, 1.0))))
    big = b.call(em.mb.intrinsic("llvm.copysign", ty, [ty, ty], [ty]), [big, x])
    return b.select(b.fcmp_ordered("<", ax, _c(ty, 0.625)), small, big)


def sigmoid_f32(em, x):
    b = em.builder
    e = exp_f32(em, b.fsub(_c(x.type, 0.0), x))
    return b.fdiv(_c(x.type, 1.0), b.fadd(e, _c(x.type, 1.0)))


# erf(x) ~ x·P(x²)/Q(x²) on [-4, 4] (beyond, erf is 1 to float32's precision): a rational
# fit of relative error 3.8e-7 over the range in float32 arithmetic (weighted least squares,
# iterated; tests/test_language.py::test_erf_dense_grid holds it to 1e-6). Coefficients lowest
# degree first.
ERF_P = (1.1283791065216064, 0.18532316386699677, 0.05212070792913437, 0.0035628590267151594,
         0.00028288777684792876, 2.1202167772571556e-06)
ERF_Q = (1.0, 0.49757155776023865, 0.11204894632101059, 0.014557103626430035, 0.0011184215545654297,
         3.872048910125159e-05)


def erf_f32(em, x):
    """x·P(x²)/Q(x²) on x clamped to [-4, 4], the result clamped to [-1, 1]: twelve multiply-adds
    and one division per vector, no branch. The erfc-and-exp form it replaces evaluated two
    series, a division and an exp: GELU's erf was a third of a ConvNeXt MLP layer's time."""
    b = em.builder
    ty = x.type
    xc = b.select(b.fcmp_ordered("<", x, _c(ty, 4.0)), x, _c(ty, 4.0))
    xc = b.select(b.fcmp_ordered(">", xc, _c(ty, -4.0)), xc, _c(ty, -4.0))
    z = b.fmul(xc, xc)
    num = b.fmul(xc, _poly(b, z, list(reversed(ERF_P))), flags=FAST)
    den = _poly(b, z, list(reversed(ERF_Q)))
    r = b.fdiv(num, den)
    r = b.select(b.fcmp_ordered("<", r, _c(ty, 1.0)), r, _c(ty, 1.0))
    r = b.select(b.fcmp_ordered(">", r, _c(ty, -1.0)), r, _c(ty, -1.0))
    return b.select(b.fcmp_unordered("uno", x, x), x, r)


LOG_P = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
         -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)   # Cephes logf


def log_f32(em, x):
    """ln x: x = m·2^e with m in [sqrt(1/2), sqrt(2)) from the bits (subnormals scaled by 2^23
    first), ln m = t - t²/2 + t³·P(t) with t = m - 1, plus e·ln 2 in two parts (Cephes' logf,
    about one ulp). 0 -> -inf, negative or NaN -> NaN, +inf -> +inf. The libm call it replaces ran
    once per lane: 8x slower than exp on a vector."""
    b = em.builder
    ty = x.type
    ity = _int_ty(ty)
    tiny = b.fcmp_ordered("<", x, _c(ty, 1.17549435e-38))          # subnormal (or zero, negative)
    xs = b.select(tiny, b.fmul(x, _c(ty, 8388608.0)), x)             # 2^23
    bits = b.bitcast(xs, ity)
    e = b.sub(b.and_(b.lshr(bits, _c(ity, 23)), _c(ity, 0xFF)), _c(ity, 126))
    e = b.select(tiny, b.sub(e, _c(ity, 23)), e)
    m = b.bitcast(b.or_(b.and_(bits, _c(ity, 0x007FFFFF)), _c(ity, 0x3F000000)), ty)   # [0.5, 1)
    low = b.fcmp_ordered("<", m, _c(ty, 0.707106781186547524))
    ef = b.sitofp(b.select(low, b.sub(e, _c(ity, 1)), e), ty)
    t = b.fsub(b.select(low, b.fadd(m, m), m), _c(ty, 1.0))
    z = b.fmul(t, t)
    y = b.fmul(b.fmul(_poly(b, t, list(LOG_P)), t, flags=FAST), z, flags=FAST)
    y = b.fadd(y, b.fmul(ef, _c(ty, -2.12194440e-4)), flags=FAST)
    y = b.fsub(y, b.fmul(z, _c(ty, 0.5)), flags=FAST)
    r = b.fadd(b.fadd(t, y), b.fmul(ef, _c(ty, 0.693359375)), flags=FAST)
    r = b.select(b.fcmp_ordered("==", x, _c(ty, 0.0)), _c(ty, float("-inf")), r)
    r = b.select(b.fcmp_unordered("<", x, _c(ty, 0.0)), _c(ty, float("nan")), r)   # negative or NaN
    return b.select(b.fcmp_ordered("==", x, _c(ty, float("inf"))), x, r)


_FAST_F32 = {"exp": exp_f32, "log": log_f32, "tanh": tanh_f32, "sigmoid": sigmoid_f32, "erf": erf_f32}
_LLVM_INTRINSIC = {"sqrt": "sqrt", "abs": "fabs", "floor": "floor", "ceil": "ceil", "exp": "exp", "log": "log",
                   "sin": "sin", "cos": "cos", "round": "roundeven"}
_LIBM = {"tanh": "tanh", "erf": "erf"}


def emit_math(em, func: str, x, dtype: str):
    """Emit func(x) for a scalar or vector x of `dtype`."""
    b = em.builder
    elem = x.type.element if isinstance(x.type, ir.VectorType) else x.type
    if dtype.startswith("int"):
        if func != "abs":
            raise TypeError(f"{func} on {dtype}")
        fn = em.mb.intrinsic("llvm.abs", x.type, [x.type, ir.IntType(1)], [x.type])
        return b.call(fn, [x, ir.Constant(ir.IntType(1), 0)])
    if elem == F32 and func in _FAST_F32:
        return _FAST_F32[func](em, x)
    if func in _LLVM_INTRINSIC:
        return b.call(_intrinsic(em, _LLVM_INTRINSIC[func], x), [x])
    if func == "sigmoid":
        e = emit_math(em, "exp", b.fsub(_c(x.type, 0.0), x), dtype)
        return b.fdiv(_c(x.type, 1.0), b.fadd(e, _c(x.type, 1.0)))
    name = _LIBM[func] + ("f" if elem == F32 else "")
    fn = em.mb.declare(name, elem, [elem])
    if not isinstance(x.type, ir.VectorType):
        return b.call(fn, [x])
    out = ir.Constant(x.type, None)
    for lane in range(x.type.count):
        v = b.call(fn, [b.extract_element(x, ir.Constant(I32, lane))])
        out = b.insert_element(out, v, ir.Constant(I32, lane))
    return out
