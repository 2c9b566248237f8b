"""Winograd convolution F(m x m, 3 x 3) in the channel-blocked layout: fewer multiplications
for the 3x3 stride-1 convolutions that dominate VGG and ResNet.

A 3x3 convolution computes each m x m tile of its output from an a x a tile of its input
(a = m + 2). Winograd's minimal filtering (Lavin and Gray, "Fast Algorithms for Convolutional
Neural Networks", 2016) does it as Y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A: the input tile and the filter
are transformed into a x a matrices, multiplied elementwise, and transformed back. Summed over
input channels, the elementwise products are a² independent matrix products, [F x C] · [C x
tiles], so a convolution becomes

1. the input transform, V[a, a, C/B, tiles, B] = Bᵀ d B per tile and channel (adds and a few
   multiplies by small integers, one vector of B channels at a time);
2. a² channel-blocked matrix products, M[a, a, F/B, tiles, B] = Σ_c U · V, with the weights'
   transform U = G g Gᵀ made once at compile time (transform_weight, float64, then float32);
3. the output transform, Y = Aᵀ M A per tile, written into the convolution's output, through
   which the fused epilogue (bias, residual add, activation) is stored.

F(2x2, 3x3), the default (DEFAULT_TILE), does 16 multiplications per output tile and channel
pair where the direct form does 36: 2.25x fewer, for transforms that are passes over memory
(winograd_tile decides where that pays). Its Bᵀ and Aᵀ hold only 0 and ±1, so its float32
results are as close to float64 as the direct form's. F(4x4, 3x3) does 36 where the direct form
does 144, but sums with coefficients up to 8 (Aᵀ) and 5 (Bᵀ): measured 5e-6 to 2.6e-5 of the
output's magnitude against float64 (the direct form: 1e-6 to 3e-6).

The matrices' rows become expressions written out term by term (winograd_rows): no
multiplication by 0 or 1; a row is picked by a Select on its index, a loop every schedule of
these stages unrolls, so code generation emits the one row the constant index selects.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from .. import expr as E
from ..canonical import canonical_text
from ..errors import ExprError, ScheduleError
from ..rewrite import register_rewrite
from ..tensor import ComputeOp, compute, reduce_axis
from ..tensor import sum as te_sum
from .functions import conv2d_nchw
from .transform import pad_tensor

KERNEL = 3


def _matrices(m: int) -> tuple:
    """(Bᵀ, G, Aᵀ) of F(m x m, 3 x 3) with exact rational entries, from the interpolation points
    Lavin's kernels use (0, ±1, ±2, ..., and infinity), by the Toom-Cook construction."""
    points = {2: [0, 1, -1], 4: [0, 1, -1, 2, -2]}
    if m not in points:
        raise ExprError(f"winograd: output tiles of {sorted(points)} only, got {m}")
    return _toom_cook([Fraction(p) for p in points[m]], m, KERNEL)


def _toom_cook(pts: list, m: int, r: int) -> tuple:
    """Toom-Cook matrices for F(m, r) on the finite points `pts` plus infinity (a = m + r - 1).

    Aᵀ[i][k] = pts[k]^i (the last column: 1 at i = m - 1, infinity's leading coefficient);
    G[k][j] = pts[k]^j / Π_{l≠k}(pts[k] - pts[l]) (the last row: 1 at j = r - 1); Bᵀ is the
    transpose of the inverse of the Vandermonde-like matrix these imply, scaled to keep the
    points' normalization in G: written out as the coefficients of Π_{l≠k}(x - pts[l]) per row.
    """
    a = m + r - 1
    n = len(pts)   # finite points: a - 1
    AT = [[pts[k] ** i for k in range(n)] + [Fraction(1 if i == m - 1 else 0)] for i in range(m)]
    G = []
    for k in range(n):
        denom = Fraction(1)
        for l_ in range(n):
            if l_ != k:
                denom *= pts[k] - pts[l_]
        G.append([pts[k] ** j / denom for j in range(r)])
    G.append([Fraction(1 if j == r - 1 else 0) for j in range(r)])
    # Bᵀ row k < n: coefficients (by power of x, ascending) of Π_{l≠k} (x - pts[l]), padded to a;
    # the last row: the polynomial Π_l (x - pts[l]) itself (infinity's row)
    BT = []
    for k in range(n):
        poly = [Fraction(1)]
        for l_ in range(n):
            if l_ != k:
                poly = _times_linear(poly, -pts[l_])
        BT.append(poly + [Fraction(0)] * (a - len(poly)))
    full = [Fraction(1)]
    for p in pts:
        full = _times_linear(full, -p)
    BT.append(full + [Fraction(0)] * (a - len(full)))
    return BT, G, AT


def _times_linear(poly: list, c: Fraction) -> list:
    """poly(x) * (x + c), coefficients ascending."""
    out = [Fraction(0)] * (len(poly) + 1)
    for i, p in enumerate(poly):
        out[i] += p * c
        out[i + 1] += p
    return out


def winograd_matrices(m: int) -> tuple:
    """(Bᵀ [a, a], G [a, 3], Aᵀ [m, a]) of F(m x m, 3 x 3) as float64 arrays."""
    return tuple(np.array([[float(v) for v in row] for row in mat]) for mat in _matrices(m))


def tile_grid(out_hw: tuple, m: int, dilation: tuple = (1, 1)) -> tuple:
    """(tile rows, tile columns) covering an output of `out_hw` in m x m tiles; with a dilation d,
    per dimension d phases (the outputs ≡ p mod d, a dense convolution of the inputs ≡ p mod d)
    of ceil(ceil(size / d) / m) tiles each, phase after phase."""
    return tuple(d * _ceil_div(_ceil_div(size, d), m) for size, d in zip(out_hw, dilation))


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def phase_extent(out_hw: tuple, m: int, dilation: tuple) -> tuple:
    """The height and width of a dilated convolution's output in phase-major order (each phase's
    rows, padded to whole tiles, one after the other: tile_grid's tiles times m); the output
    itself where there is no dilation."""
    if tuple(dilation) == (1, 1):
        return tuple(out_hw)
    return tuple(t * m for t in tile_grid(out_hw, m, dilation))


# F(2x2, 3x3): 2.25x fewer multiplications at the direct form's accuracy (its Bᵀ and Aᵀ are 0
# and ±1: float32 results as close to float64 as the direct convolution's). F(4x4, 3x3) ran
# 1.2-1.7x faster still on Zen 4 but with ten times the rounding error (up to 2.6e-5 of the
# output's magnitude at 512 channels), which a model's outputs carry through every layer.
DEFAULT_TILE = 2
MIN_CHANNEL_HARMONIC = 16   # C·F/(C+F): 32 -> 32 channels ran 1.37x faster, 16 -> 16 1.05x, 16 -> 32 0.94x
MIN_DIRECT_FLOPS = 20e6     # three kernels' fixed cost: 32 -> 64 channels at 8x8 (2.4 MFLOP) ran 0.75x


def winograd_tile(channels: int, filters: int, kernel: tuple, strides: tuple, dilations: tuple, groups: int,
                  out_hw: tuple, batch: int = 1) -> int:
    """The output tile m of the Winograd form of a convolution, or 0 where the direct form stays:
    dense (one group), 3x3, stride 1, no dilation, with channels enough that the matrix products
    dominate the transforms (MIN_CHANNEL_HARMONIC) and work enough to pay three kernels
    (MIN_DIRECT_FLOPS). Measured on Zen 4 (2 threads), F(2x2, 3x3) against the register-tiled
    direct convolution: ResNet's and VGG's 3x3 layers 1.3x (64 channels at 224x224, where
    the transforms are passes over memory) to 2.1x (256 at 14x14)."""
    if groups != 1 or tuple(kernel) != (KERNEL, KERNEL) or tuple(strides) != (1, 1) or tuple(dilations) != (1, 1):
        return 0
    if channels * filters < MIN_CHANNEL_HARMONIC * (channels + filters):
        return 0
    if 2 * KERNEL * KERNEL * channels * filters * out_hw[0] * out_hw[1] * batch < MIN_DIRECT_FLOPS:
        return 0
    return DEFAULT_TILE


def transform_weight(weight: np.ndarray, m: int, block: int) -> np.ndarray:
    """U = G g Gᵀ of [F, C, 3, 3] weights (F and C whole blocks), blocked as the matrix products
    read it: [a, a, F/B, C/B, B (input channel), B (output channel)]; computed in float64."""
    F, C, KH, KW = weight.shape
    if (KH, KW) != (KERNEL, KERNEL) or F % block or C % block:
        raise ExprError(f"winograd: weights must be [F, C, 3, 3] in whole blocks of {block}, got {weight.shape}")
    _, G, _ = winograd_matrices(m)
    u = np.einsum("ai,fcij,bj->abfc", G, weight.astype(np.float64), G)
    a = m + KERNEL - 1
    u = u.reshape(a, a, F // block, block, C // block, block).transpose(0, 1, 2, 4, 5, 3)
    return np.ascontiguousarray(u, dtype=np.float32)


def winograd_rows(matrix, row, term) -> E.Expr:
    """Σ_k matrix[row][k] · term(k), written out: `row` an index expression (a Select over the
    rows; an unrolled loop makes it a constant), terms with coefficient 0 left out, ±1 added or
    subtracted without a multiplication."""
    rows = [_row_sum(coeffs, term) for coeffs in matrix]
    expr = rows[-1]
    for k in range(len(rows) - 2, -1, -1):
        expr = E.if_then_else(E.equal(row, k), rows[k], expr)
    return expr


def _row_sum(coeffs, term) -> E.Expr:
    total = None
    for k, c in enumerate(coeffs):
        c = float(c)
        if c == 0.0:
            continue
        t = term(k)
        if total is None:
            total = t if c == 1.0 else (-t if c == -1.0 else t * c)
        elif c == 1.0:
            total = total + t
        elif c == -1.0:
            total = total - t
        else:
            total = total + t * c
    if total is None:
        raise ExprError("winograd: a transform row of zeros")
    return total


def winograd_input(data, pads: tuple, m: int, dilation: tuple = (1, 1)):
    """V [a, a, C/B, N·TH·TW, B] = Bᵀ d B of each input tile of blocked data [N, C/B, H, W, B]
    zero-padded by `pads` (top, left, bottom, right) and at the bottom and right to whole tiles:
    rows first (the stage winograd_input_rows, per tile), then columns. With a `dilation` (dh,
    dw) the tiles are tile_grid's phases: tile row t of phase t // (TH / dh) reads every dh-th
    input row from that phase's first, so each phase is a dense 3x3 convolution."""
    N, CB, H, W, B = data.shape
    pt, pl, pb, pr = pads
    dh, dw = dilation
    OH, OW = H + pt + pb - dh * (KERNEL - 1), W + pl + pr - dw * (KERNEL - 1)
    TH, TW = tile_grid((OH, OW), m, dilation)
    per_phase_h, per_phase_w = TH // dh, TW // dw
    a = m + KERNEL - 1
    # the last row (column) a tile reads, in padded coordinates, is the padded input's last
    high = dh - 1 + dh * ((per_phase_h - 1) * m + a - 1)
    wide = dw - 1 + dw * ((per_phase_w - 1) * m + a - 1)
    padded = pad_tensor(data, (0, 0, pt, pl, 0), (0, 0, max(0, high + 1 - H - pt), max(0, wide + 1 - W - pl), 0),
                        name="pad")
    BT, _, _ = _matrices(m)
    P = N * TH * TW

    def origin(t, per_phase, d):
        """A tile's first input row (column) in padded coordinates, from its tile row (column)."""
        return t * m if d == 1 else t // per_phase + d * (t % per_phase) * m

    def at(p, i, j, cb, b):
        n, th, tw = p // (TH * TW), p // TW % TH, p % TW
        return padded[n, cb, origin(th, per_phase_h, dh) + dh * i, origin(tw, per_phase_w, dw) + dw * j, b]

    rows = compute((a, a, CB, P, B), lambda i, j, cb, p, b: winograd_rows(BT, i, lambda k: at(p, k, j, cb, b)),
                   name="winograd_input_rows", tag="winograd_input_rows")
    return compute((a, a, CB, P, B), lambda i, j, cb, p, b: winograd_rows(BT, j, lambda k: rows[i, k, cb, p, b]),
                   name="winograd_input", tag="winograd_input", attrs={"tile": m})


def winograd_gemm(V, U):
    """M [a, a, F/B, P, B] = Σ over input channels of U · V, one channel-blocked matrix product
    per point of the a x a tile: V [a, a, C/B, P, B], U [a, a, F/B, C/B, B, B]."""
    a, _, CB, P, B = V.shape
    if U.ndim != 6 or tuple(U.shape[:2]) != (a, a) or U.shape[3] != CB or U.shape[4] != B:
        raise ExprError(f"winograd_gemm: weights {U.shape} do not match transformed data {V.shape}")
    FO, FB = U.shape[2], U.shape[5]
    rc, rci = reduce_axis(CB, "rc"), reduce_axis(B, "rci")
    return compute((a, a, FO, P, FB),
                   lambda i, j, fo, p, fb: te_sum(V[i, j, rc.var, p, rci.var] * U[i, j, fo, rc.var, rci.var, fb],
                                                  axis=[rc, rci]),
                   name="winograd_gemm", tag="winograd_gemm")


def winograd_output(M, out_shape: tuple, m: int):
    """The convolution's output [N, F/B, OH, OW, B] from M [a, a, F/B, P, B]: Aᵀ M A per tile,
    rows first (winograd_output_rows, per tile), each output element one row of Aᵀ over them.
    A dilated convolution's output comes in phase-major order (phase_extent's OH and OW)."""
    a, _, FO, P, FB = M.shape
    N, _, OH, OW, _ = out_shape
    TH, TW = tile_grid((OH, OW), m)
    if P != N * TH * TW:
        raise ExprError(f"winograd_output: {P} tiles cannot make an output of {out_shape} in tiles of {m}")
    _, _, AT = _matrices(m)
    rows = compute((m, a, FO, P, FB), lambda i, j, fo, p, fb: winograd_rows(AT, i, lambda k: M[k, j, fo, p, fb]),
                   name="winograd_output_rows", tag="winograd_output_rows")

    def body(n, fo, h, w, fb):
        p = (n * TH + h // m) * TW + w // m
        return winograd_rows(AT, w % m, lambda k: rows[h % m, k, fo, p, fb])
    return compute(tuple(out_shape), body, name="winograd_output", tag="winograd_output", attrs={"tile": m})


def winograd_weight(weight, m: int, block: int):
    """U = G g Gᵀ of OIHW weights [F, C, 3, 3] computed by the kernel (transform_weight's layout,
    [a, a, F/B, C/B, B (input channel), B (output channel)]): for an operator whose weights are
    an input, not a model's constant; rows first (winograd_weight_rows), then columns."""
    F, C, KH, KW = weight.shape
    if (KH, KW) != (KERNEL, KERNEL) or F % block or C % block:
        raise ExprError(f"winograd: weights must be [F, C, 3, 3] in whole blocks of {block}, got {weight.shape}")
    _, G, _ = _matrices(m)
    a = m + KERNEL - 1
    shape = (F // block, C // block, block, block)
    rows = compute((a, KERNEL) + shape,
                   lambda i, l_, fo, cb, ci, fb: winograd_rows(G, i, lambda k: weight[fo * block + fb, cb * block + ci, k, l_]),
                   name="winograd_weight_rows", tag="winograd_weight_rows")
    return compute((a, a) + shape, lambda i, j, fo, cb, ci, fb: winograd_rows(G, j, lambda k: rows[i, k, fo, cb, ci, fb]),
                   name="winograd_weight", tag="winograd_weight")


def winograd_conv2d_nchw(data, weight, pads: tuple, m: int, block: int, name: str = "conv2d_winograd",
                         dilation: tuple = (1, 1)):
    """The 3x3 stride-1 NCHW convolution of data [N, C, H, W] and weights [F, C, 3, 3] by
    F(m x m, 3 x 3), channels in blocks of `block` (which divides C and F): the data copied into
    blocks, both transforms, the matrix products and the output transform in the blocked
    layout, then the output copied back to NCHW (stage winograd_nchw). A `dilation` (dh, dw) is
    dh x dw dense convolutions of the input's phases (winograd_input), their outputs in
    phase-major order until the copy back interleaves them."""
    N, C, H, W = data.shape
    F = weight.shape[0]
    dh, dw = dilation
    if C % block or F % block:
        raise ExprError(f"winograd: {C} input and {F} output channels must be whole blocks of {block}")
    blocked = compute((N, C // block, H, W, block), lambda n, cb, h, w, b: data[n, cb * block + b, h, w],
                      name="data_blocked", tag="winograd_data_blocked")
    V = winograd_input(blocked, pads, m, dilation)
    M = winograd_gemm(V, winograd_weight(weight, m, block))
    pt, pl, pb, pr = pads
    OH, OW = H + pt + pb - dh * (KERNEL - 1), W + pl + pr - dw * (KERNEL - 1)
    PH, PW = phase_extent((OH, OW), m, dilation)
    out = winograd_output(M, (N, F // block, PH, PW, block), m)

    def interleaved(size, d, phased):
        """Where output row (column) `size` of the NCHW output sits in the phase-major order."""
        return size if d == 1 else size % d * (phased // d) + size // d
    return compute((N, F, OH, OW), lambda n, f, h, w: out[n, f // block, interleaved(h, dh, PH), interleaved(w, dw, PW), f % block],
                   name=name, tag="winograd_nchw")


def rewrite_conv2d_nchw(op, tile: int = DEFAULT_TILE, block: int = 0):
    """The `winograd` rewrite (compiler/rewrite.py) of a conv2d_nchw stage: dense, 3x3, stride 1,
    any dilation, float32, channels in whole blocks of `block` (the target's vector lanes, which
    the schedule gives). The stage must be exactly functions.conv2d_nchw of its two inputs (its
    canonical text is rebuilt and compared), so no other reduction is taken for a convolution."""
    def refuse(why):
        return ScheduleError(f"rewrite winograd: {op.name} {why}")
    if not isinstance(op, ComputeOp) or op.tag != "conv2d_nchw" or op.attrs.get("layout") != "NCHW":
        raise refuse("is not an NCHW convolution")
    if isinstance(tile, bool) or tile not in (2, 4) or isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise refuse(f"needs tile 2 or 4 and a block of channels, got tile={tile!r} block={block!r}")
    if len(op.input_tensors()) != 2:
        raise refuse("is not a float32 3x3 convolution")
    source, weight = op.input_tensors()
    if weight.ndim != 4 or tuple(weight.shape[2:]) != (KERNEL, KERNEL) or op.dtype != "float32":
        raise refuse("is not a float32 3x3 convolution")
    dilation = tuple(op.attrs.get("dilation", ()))
    if op.attrs.get("groups") != 1 or tuple(op.attrs.get("stride", ())) != (1, 1) or len(dilation) != 2:
        raise refuse("is grouped or strided")
    pads = tuple(op.attrs.get("padding", (0, 0, 0, 0)))
    data = source.op.input_tensors()[0] if any(pads) and source.op.input_tensors() else source
    if data.ndim != 4 or data.dtype != "float32":
        raise refuse("does not read NCHW float32 data")
    direct = conv2d_nchw(data, weight, 1, pads, dilation, 1)
    if canonical_text([direct]) != canonical_text([op.output]):
        raise refuse("computes something other than the convolution of its inputs")
    try:
        return winograd_conv2d_nchw(data, weight, pads, tile, block, name=op.name, dilation=dilation)
    except ExprError as e:
        raise refuse(str(e)) from None


register_rewrite("winograd", rewrite_conv2d_nchw)

__all__ = ["winograd_tile", "DEFAULT_TILE", "winograd_matrices", "transform_weight", "winograd_input", "winograd_gemm", "winograd_output",
           "winograd_rows", "tile_grid", "phase_extent", "winograd_weight", "winograd_conv2d_nchw", "rewrite_conv2d_nchw"]
