"""Computes a user writes, not in the operator inventory: the zero-trial schedule, then tuned,
against PyTorch's CPU build and numpy in the same process.

Each case is written with the public tensor-expression API the way a user writes one (a fused
matmul with an elementwise prologue, a transposed-operand matmul, conv1d, a depthwise temporal
conv, batched attention scores, RMSNorm, a 3-D convolution, an einsum-style contraction, a
grouped matmul, a row-wise reduction with a prologue, a causal-masked softmax in four stages, a
transposed 1-D convolution written as zero-stuffing + padding + the flipped kernel, a two-pass
LayerNorm with SiLU, ...), at a realistic size. For each:
- zero trials: `build_op` with no record, the schedule tunefarm derives from the compute alone;
- tuned: `tuner.tune` with the sketch space for `--trials` measurements in a fresh SQLite store
  (its wall time is `tune_seconds`), then `build_op` under apply-best;
- both checked against a float64 numpy reference on random inputs (poisoned outputs);
- timed in alternating rounds with torch (2 threads by default) and numpy on the same inputs,
  a pause before each side so the other runtime's threads stop spinning.

Last line JSON: per case `zero_trial_vs_torch`, `tuned_vs_torch` ({case: torch's time / ours}),
`tuned_over_zero_trial`, `vs_numpy` (tuned), `tune_seconds`, and the geomeans
`zero_trial_vs_torch_geomean`, `tuned_vs_torch_geomean`. Needs the `bench` extra (torch).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
from reference_libs import import_torch


@dataclass
class Case:
    """One compute: `define()` -> (placeholders in argument order, output tensor); `reference`
    the float64 numpy result from the input arrays; `torch_fn` the same in torch (float32)."""

    define: Callable
    reference: Callable
    torch_fn: Callable
    numpy_fn: Callable
    inputs: Callable | None = None   # rng -> the input arrays (index inputs); uniform(-1, 1) otherwise


def _cases() -> dict:
    import compiler as C

    def exp_matmul_bias():
        M = N = K = 512
        A, B, D = C.placeholder((M, K), "float32", "A"), C.placeholder((N, K), "float32", "B"), C.placeholder((M,), "float32", "D")
        k = C.reduce_axis(K, "k")
        P = C.compute((M, N), lambda i, j: C.sum(C.exp(A[i, k]) * B[j, k], axis=k), name="exp_matmul")
        return [A, B, D], C.compute((M, N), lambda i, j: P[i, j] + D[i], name="exp_matmul_bias")

    def matmul_at_b():
        M = N = K = 512
        A, B = C.placeholder((K, M), "float32", "A"), C.placeholder((K, N), "float32", "B")
        k = C.reduce_axis(K, "k")
        return [A, B], C.compute((M, N), lambda i, j: C.sum(A[k, i] * B[k, j], axis=k), name="matmul_at_b")

    def conv1d():
        Ci, Co, L, KW = 256, 256, 1024, 3
        X, W = C.placeholder((1, Ci, L + KW - 1), "float32", "X"), C.placeholder((Co, Ci, KW), "float32", "W")
        c, r = C.reduce_axis(Ci, "c"), C.reduce_axis(KW, "r")
        return [X, W], C.compute((1, Co, L), lambda n, f, t: C.sum(X[n, c, t + r] * W[f, c, r], axis=[c, r]), name="conv1d")

    def depthwise_temporal():
        Ch, T, KW = 768, 2048, 4
        X, W = C.placeholder((1, Ch, T + KW - 1), "float32", "X"), C.placeholder((Ch, KW), "float32", "W")
        r = C.reduce_axis(KW, "r")
        return [X, W], C.compute((1, Ch, T), lambda n, c, t: C.sum(X[n, c, t + r] * W[c, r], axis=r), name="dw_temporal")

    def attention_scores():
        H, S, D = 12, 128, 64
        Q, K = C.placeholder((H, S, D), "float32", "Q"), C.placeholder((H, S, D), "float32", "K")
        d = C.reduce_axis(D, "d")
        QK = C.compute((H, S, S), lambda h, i, j: C.sum(Q[h, i, d] * K[h, j, d], axis=d), name="qk")
        return [Q, K], C.compute((H, S, S), lambda h, i, j: QK[h, i, j] * 0.125, name="attn_scores")

    def rmsnorm():
        R, H = 2048, 768
        X, G = C.placeholder((R, H), "float32", "X"), C.placeholder((H,), "float32", "G")
        h = C.reduce_axis(H, "h")
        ss = C.compute((R,), lambda i: C.sum(X[i, h] * X[i, h], axis=h), name="sumsq")
        return [X, G], C.compute((R, H), lambda i, j: X[i, j] / C.sqrt(ss[i] / H + 1e-6) * G[j], name="rmsnorm")

    def conv3d():
        Ci, Co, Dd, HW, KK = 32, 32, 16, 28, 3
        X = C.placeholder((1, Ci, Dd + 2, HW + 2, HW + 2), "float32", "X")
        W = C.placeholder((Co, Ci, KK, KK, KK), "float32", "W")
        c, rz, ry, rx = (C.reduce_axis(e, n) for e, n in ((Ci, "c"), (KK, "rz"), (KK, "ry"), (KK, "rx")))
        return [X, W], C.compute((1, Co, Dd, HW, HW), lambda n, f, z, y, x: C.sum(
            X[n, c, z + rz, y + ry, x + rx] * W[f, c, rz, ry, rx], axis=[c, rz, ry, rx]), name="conv3d")

    def einsum_contraction():
        # "bihl,hlk->bik": a projection over two axes at once (heads x head dim -> model dim)
        B, I, Hh, L, K = 4, 128, 12, 64, 768
        X, W = C.placeholder((B, I, Hh, L), "float32", "X"), C.placeholder((Hh, L, K), "float32", "W")
        h, l_ = C.reduce_axis(Hh, "h"), C.reduce_axis(L, "l")
        return [X, W], C.compute((B, I, K), lambda b, i, k: C.sum(X[b, i, h, l_] * W[h, l_, k], axis=[h, l_]), name="einsum_bihl_hlk")

    def grouped_matmul():
        G, M, K, N = 8, 256, 256, 128
        A, B = C.placeholder((G, M, K), "float32", "A"), C.placeholder((G, K, N), "float32", "B")
        k = C.reduce_axis(K, "k")
        return [A, B], C.compute((G, M, N), lambda g, i, j: C.sum(A[g, i, k] * B[g, k, j], axis=k), name="grouped_matmul")

    def rowwise_logsumexp_prologue():
        R, H = 4096, 1024
        X = C.placeholder((R, H), "float32", "X")
        h = C.reduce_axis(H, "h")
        return [X], C.compute((R,), lambda i: C.sum(C.exp(X[i, h] * 0.5), axis=h), name="row_sum_exp")

    def column_mean_abs():
        R, H = 4096, 1024
        X = C.placeholder((R, H), "float32", "X")
        r = C.reduce_axis(R, "r")
        total = C.compute((H,), lambda j: C.sum(C.abs(X[r, j]), axis=r), name="col_sum_abs")
        return [X], C.compute((H,), lambda j: total[j] * (1.0 / R), name="col_mean_abs")

    def causal_softmax():
        # attention probabilities with a causal mask, a user's four stages over [head, query] rows
        Hh, S = 8, 256
        X = C.placeholder((Hh, S, S), "float32", "scores")
        k1, k2 = C.reduce_axis(S, "k1"), C.reduce_axis(S, "k2")
        masked = C.compute((Hh, S, S), lambda h, i, j: C.if_then_else(j <= i, X[h, i, j] * 0.125, -1e30), name="masked")
        m = C.compute((Hh, S), lambda h, i: C.max(masked[h, i, k1], axis=k1), name="rowmax")
        e = C.compute((Hh, S, S), lambda h, i, j: C.exp(masked[h, i, j] - m[h, i]), name="e")
        z = C.compute((Hh, S), lambda h, i: C.sum(e[h, i, k2], axis=k2), name="z")
        return [X], C.compute((Hh, S, S), lambda h, i, j: e[h, i, j] / z[h, i], name="causal_softmax")

    def conv_transpose1d_s4():
        # a 4x upsampling layer (audio decoders), written as zero-stuffing, padding and the
        # flipped kernel's correlation
        Ci, Co, L, K, S, P = 64, 32, 512, 8, 4, 2
        X, W = C.placeholder((1, Ci, L), "float32", "X"), C.placeholder((Ci, Co, K), "float32", "W")
        Z = (L - 1) * S + 1
        z = C.compute((1, Ci, Z), lambda n, c, t: C.if_then_else(C.equal(t % S, 0), X[n, c, t // S], 0.0), name="stuffed")
        q = K - 1 - P
        pd = C.compute((1, Ci, Z + 2 * q), lambda n, c, t: C.if_then_else((t >= q) & (t < Z + q), z[n, c, t - q], 0.0),
                       name="padded")
        c, r = C.reduce_axis(Ci, "c"), C.reduce_axis(K, "r")
        OL = (L - 1) * S - 2 * P + K
        return [X, W], C.compute((1, Co, OL), lambda n, f, t: C.sum(pd[n, c, t + r] * W[c, f, K - 1 - r], axis=[c, r]),
                                 name="conv_transpose1d")

    def layernorm_silu():
        # LayerNorm by its two passes then SiLU, the statistics as separate stages
        R, H = 1024, 1536
        X, G, Bt = C.placeholder((R, H), "float32", "X"), C.placeholder((H,), "float32", "G"), C.placeholder((H,), "float32", "B")
        k1, k2 = C.reduce_axis(H, "k1"), C.reduce_axis(H, "k2")
        total = C.compute((R,), lambda i: C.sum(X[i, k1], axis=k1), name="total")
        sq = C.compute((R,), lambda i: C.sum((X[i, k2] - total[i] / H) * (X[i, k2] - total[i] / H), axis=k2), name="sq")
        y = C.compute((R, H), lambda i, j: (X[i, j] - total[i] / H) / C.sqrt(sq[i] / H + 1e-5) * G[j] + Bt[j], name="ln")
        return [X, G, Bt], C.compute((R, H), lambda i, j: y[i, j] * C.sigmoid(y[i, j]), name="ln_silu")

    def gru_cell():
        # a GRU cell as two GEMMs of three gates' width, the gates read at column offsets
        Bt, I, H = 64, 256, 256
        X, Hp = C.placeholder((Bt, I), "float32", "x"), C.placeholder((Bt, H), "float32", "h")
        Wx, Wh = C.placeholder((I, 3 * H), "float32", "Wx"), C.placeholder((H, 3 * H), "float32", "Wh")
        bx, bh = C.placeholder((3 * H,), "float32", "bx"), C.placeholder((3 * H,), "float32", "bh")
        k1, k2 = C.reduce_axis(I, "k1"), C.reduce_axis(H, "k2")
        gx = C.compute((Bt, 3 * H), lambda i, j: C.sum(X[i, k1] * Wx[k1, j], axis=k1), name="gx")
        gh = C.compute((Bt, 3 * H), lambda i, j: C.sum(Hp[i, k2] * Wh[k2, j], axis=k2), name="gh")
        r = C.compute((Bt, H), lambda i, j: C.sigmoid(gx[i, j] + bx[j] + gh[i, j] + bh[j]), name="r")
        z = C.compute((Bt, H), lambda i, j: C.sigmoid(gx[i, H + j] + bx[H + j] + gh[i, H + j] + bh[H + j]), name="z")
        n = C.compute((Bt, H), lambda i, j: C.tanh(gx[i, 2 * H + j] + bx[2 * H + j] + r[i, j] * (gh[i, 2 * H + j] + bh[2 * H + j])),
                      name="n")
        return [X, Hp, Wx, Wh, bx, bh], C.compute((Bt, H), lambda i, j: (1.0 - z[i, j]) * n[i, j] + z[i, j] * Hp[i, j],
                                                  name="gru_cell")

    def maxpool3d():
        # 3x3x3 / 2 max pooling of a video feature map, no padding
        Ch, D, HW = 32, 16, 56
        X = C.placeholder((1, Ch, D, HW, HW), "float32", "X")
        OD, OH = (D - 3) // 2 + 1, (HW - 3) // 2 + 1
        rz, ry, rx = C.reduce_axis(3, "rz"), C.reduce_axis(3, "ry"), C.reduce_axis(3, "rx")
        return [X], C.compute((1, Ch, OD, OH, OH), lambda n, c, z, y, x: C.max(
            X[n, c, 2 * z + rz, 2 * y + ry, 2 * x + rx], axis=[rz, ry, rx]), name="maxpool3d")

    def depthwise_conv3d():
        # a depthwise 3x3x3 convolution (one filter per channel), NCDHW, the padding a stage
        Ch, D, HW = 64, 8, 28
        X, W = C.placeholder((1, Ch, D, HW, HW), "float32", "X"), C.placeholder((Ch, 3, 3, 3), "float32", "W")
        pd = C.compute((1, Ch, D + 2, HW + 2, HW + 2), lambda n, c, z, y, x: C.if_then_else(
            (z >= 1) & (z <= D) & (y >= 1) & (y <= HW) & (x >= 1) & (x <= HW), X[n, c, z - 1, y - 1, x - 1], 0.0), name="pad3d")
        rz, ry, rx = C.reduce_axis(3, "rz"), C.reduce_axis(3, "ry"), C.reduce_axis(3, "rx")
        return [X, W], C.compute((1, Ch, D, HW, HW), lambda n, c, z, y, x: C.sum(
            pd[n, c, z + rz, y + ry, x + rx] * W[c, rz, ry, rx], axis=[rz, ry, rx]), name="dw_conv3d")

    def cumsum_masked():
        # an inclusive scan along rows written as a masked reduction (k <= j)
        R, L = 2048, 64
        X = C.placeholder((R, L), "float32", "X")
        k = C.reduce_axis(L, "k")
        return [X], C.compute((R, L), lambda i, j: C.sum(X[i, k], axis=k, where=k <= j), name="cumsum_masked")

    def cumprod_log():
        # a cumulative product of (1 + x / 4) as the exp of a masked sum of logs
        R, L = 2048, 64
        X = C.placeholder((R, L), "float32", "X")
        k = C.reduce_axis(L, "k")
        s_ = C.compute((R, L), lambda i, j: C.sum(C.log(1.0 + X[i, k] * 0.25), axis=k, where=k <= j), name="logsum")
        return [X], C.compute((R, L), lambda i, j: C.exp(s_[i, j]), name="cumprod")

    EB_V, EB_D, EB_B, EB_MAX = 20000, 128, 512, 24

    def embedding_bag_offsets():
        # EmbeddingBag(mode="sum") with offsets: bag b sums the rows indices[offsets[b]:offsets[b + 1]]
        T = C.placeholder((EB_V, EB_D), "float32", "table")
        N = EB_B * EB_MAX
        idx, off = C.placeholder((N,), "int32", "indices"), C.placeholder((EB_B + 1,), "int32", "offsets")
        k = C.reduce_axis(EB_MAX, "k")
        return [T, idx, off], C.compute((EB_B, EB_D), lambda b, d: C.sum(
            T[idx[C.min(off[b].astype("int64") + k, N - 1)], d], axis=k, where=off[b].astype("int64") + k < off[b + 1].astype("int64")),
            name="embedding_bag")

    def embedding_bag_inputs(rng):
        lengths = rng.integers(0, EB_MAX + 1, EB_B)
        off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        return [rng.uniform(-1, 1, (EB_V, EB_D)).astype(np.float32),
                rng.integers(0, EB_V, EB_B * EB_MAX).astype(np.int32), off]

    BK_N, BK_B = 1 << 18, 32

    def bucketize_int32():
        # the bucket of each value among sorted boundaries, as an int32 count of boundaries <= x
        X, Bd = C.placeholder((BK_N,), "float32", "x"), C.placeholder((BK_B,), "float32", "boundaries")
        k = C.reduce_axis(BK_B, "k")
        return [X, Bd], C.compute((BK_N,), lambda i: C.sum(C.if_then_else(Bd[k] <= X[i], 1, 0), axis=k), name="bucketize")

    def bucketize_inputs(rng):
        return [rng.uniform(-1, 1, BK_N).astype(np.float32), np.sort(rng.uniform(-1, 1, BK_B)).astype(np.float32)]

    def grouped_conv1d_nwc():
        # a grouped 1-D convolution in NWC layout (8 groups of 16 channels), the padding a stage
        L, Ch, G, KW = 1024, 128, 8, 3
        cg = Ch // G
        X, W = C.placeholder((1, L, Ch), "float32", "X"), C.placeholder((KW, cg, Ch), "float32", "W")
        pd = C.compute((1, L + 2, Ch), lambda n, t, c: C.if_then_else((t >= 1) & (t <= L), X[n, t - 1, c], 0.0), name="pad_t")
        r, c = C.reduce_axis(KW, "r"), C.reduce_axis(cg, "c")
        return [X, W], C.compute((1, L, Ch), lambda n, t, f: C.sum(pd[n, t + r, (f // cg) * cg + c] * W[r, c, f], axis=[r, c]),
                                 name="grouped_conv1d_nwc")

    def maxplus():
        # a tropical (max-plus) matrix product: the non-product reduction of shortest paths
        M = N = K = 256
        A, B = C.placeholder((M, K), "float32", "A"), C.placeholder((K, N), "float32", "B")
        k = C.reduce_axis(K, "k")
        return [A, B], C.compute((M, N), lambda i, j: C.max(A[i, k] + B[k, j], axis=k), name="maxplus")

    def l1_distance():
        # pairwise L1 (Manhattan) distances: a sum of absolute differences
        M, N, K = 512, 512, 64
        A, B = C.placeholder((M, K), "float32", "A"), C.placeholder((N, K), "float32", "B")
        k = C.reduce_axis(K, "k")
        return [A, B], C.compute((M, N), lambda i, j: C.sum(C.abs(A[i, k] - B[j, k]), axis=k), name="l1_distance")

    import torch
    F = torch.nn.functional

    def sig(v):
        return 1 / (1 + np.exp(-v))

    def gru_np(x, h, wx, wh, bx, bh):
        gx, gh = x @ wx + bx, h @ wh + bh
        H = h.shape[1]
        r, z = sig(gx[:, :H] + gh[:, :H]), sig(gx[:, H:2 * H] + gh[:, H:2 * H])
        n = np.tanh(gx[:, 2 * H:] + r * gh[:, 2 * H:])
        return (1 - z) * n + z * h

    def gru_torch(x, h, wx, wh, bx, bh):
        return torch._VF.gru_cell(x, h, wx.t(), wh.t(), bx, bh)

    def maxpool3d_np(x):
        v = np.lib.stride_tricks.sliding_window_view(x, (3, 3, 3), axis=(2, 3, 4))[:, :, ::2, ::2, ::2]
        return v.max(axis=(-3, -2, -1))

    def dw3d_np(x, w):
        xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1), (1, 1)))
        D, H, W_ = x.shape[2:]
        return sum(xp[:, :, a:a + D, b:b + H, c:c + W_] * w[None, :, a, b, c, None, None, None]
                   for a in range(3) for b in range(3) for c in range(3))

    def embag_np(t, idx, off):
        idx, off = idx.astype(np.int64), off.astype(np.int64)
        return np.stack([t[idx[off[b]:off[b + 1]]].sum(0) for b in range(len(off) - 1)])

    def embag_torch(t, idx, off):
        return F.embedding_bag(idx.long(), t, off[:-1].long(), mode="sum")

    def gconv_np(x, w):
        L, Ch = x.shape[1], x.shape[2]
        KW, cg, _ = w.shape
        xp = np.pad(x, ((0, 0), (1, 1), (0, 0)))
        out = np.zeros((1, L, Ch))
        for g in range(Ch // cg):
            sl = slice(g * cg, (g + 1) * cg)
            out[..., sl] = sum(xp[:, r:r + L, sl] @ w[r][:, sl] for r in range(KW))
        return out

    def gconv_torch(x, w):
        KW, cg, Ch = w.shape
        wt = w.permute(2, 1, 0).contiguous()   # [F, cg, KW]
        return F.conv1d(x.transpose(1, 2), wt, padding=1, groups=Ch // cg).transpose(1, 2)


    def causal_np(x):
        s = np.where(np.tril(np.ones(x.shape[1:], bool)), x * 0.125, -1e30)
        e = np.exp(s - s.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def causal_torch(x):
        mask = torch.ones(x.shape[1:], dtype=torch.bool).triu(1)
        return (x * 0.125).masked_fill(mask, float("-inf")).softmax(-1)

    def convt1d_np(x, w):
        S, P, K = 4, 2, w.shape[2]
        L = x.shape[2]
        full = np.zeros((w.shape[1], (L - 1) * S + K))
        for t in range(L):
            full[:, t * S:t * S + K] += np.einsum("c,cfk->fk", x[0, :, t], w)
        return full[None, :, P:full.shape[1] - P]

    def ln_silu_np(x, g, b):
        mu = x.mean(1, keepdims=True)
        y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(1, keepdims=True) + 1e-5) * g + b
        return y / (1 + np.exp(-y))

    def conv3d_np(x, w):
        out = np.zeros((1, w.shape[0], x.shape[2] - 2, x.shape[3] - 2, x.shape[4] - 2))
        for dz in range(3):
            for dy in range(3):
                for dx in range(3):
                    patch = x[0, :, dz:dz + out.shape[2], dy:dy + out.shape[3], dx:dx + out.shape[4]]
                    out[0] += np.einsum("cdhw,fc->fdhw", patch, w[:, :, dz, dy, dx])
        return out

    def conv1d_np(x, w):
        L = x.shape[2] - w.shape[2] + 1
        return sum(np.einsum("ct,fc->ft", x[0, :, r:r + L], w[:, :, r]) for r in range(w.shape[2]))[None]

    def dw_np(x, w):
        T = x.shape[2] - w.shape[1] + 1
        return sum(x[0, :, r:r + T] * w[:, r:r + 1] for r in range(w.shape[1]))[None]

    def rms_np(x, g):
        return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6) * g

    return {
        "exp_matmul_bias": Case(exp_matmul_bias, lambda a, b, d: np.exp(a) @ b.T + d[:, None],
                                lambda a, b, d: torch.exp(a) @ b.T + d[:, None], lambda a, b, d: np.exp(a) @ b.T + d[:, None]),
        "matmul_at_b": Case(matmul_at_b, lambda a, b: a.T @ b, lambda a, b: a.T @ b, lambda a, b: a.T @ b),
        "conv1d": Case(conv1d, conv1d_np, lambda x, w: F.conv1d(x, w), conv1d_np),
        "dw_temporal": Case(depthwise_temporal, dw_np, lambda x, w: F.conv1d(x, w[:, None, :], groups=w.shape[0]), dw_np),
        "attn_scores": Case(attention_scores, lambda q, k: q @ k.transpose(0, 2, 1) * 0.125,
                            lambda q, k: q @ k.transpose(1, 2) * 0.125, lambda q, k: q @ k.transpose(0, 2, 1) * 0.125),
        "rmsnorm": Case(rmsnorm, rms_np, lambda x, g: x * torch.rsqrt((x * x).mean(dim=1, keepdim=True) + 1e-6) * g, rms_np),
        "conv3d": Case(conv3d, conv3d_np, lambda x, w: F.conv3d(x, w), conv3d_np),
        "einsum_bihl_hlk": Case(einsum_contraction, lambda x, w: np.einsum("bihl,hlk->bik", x, w),
                                lambda x, w: torch.einsum("bihl,hlk->bik", x, w),
                                lambda x, w: np.einsum("bihl,hlk->bik", x, w, optimize=True)),
        "grouped_matmul": Case(grouped_matmul, lambda a, b: a @ b, lambda a, b: a @ b, lambda a, b: a @ b),
        "row_sum_exp": Case(rowwise_logsumexp_prologue, lambda x: np.exp(x * 0.5).sum(axis=1),
                            lambda x: torch.exp(x * 0.5).sum(dim=1), lambda x: np.exp(x * 0.5).sum(axis=1)),
        "col_mean_abs": Case(column_mean_abs, lambda x: np.abs(x).mean(axis=0), lambda x: x.abs().mean(dim=0),
                             lambda x: np.abs(x).mean(axis=0)),
        "causal_softmax": Case(causal_softmax, causal_np, causal_torch, causal_np),
        "conv_transpose1d_s4": Case(conv_transpose1d_s4, convt1d_np, lambda x, w: F.conv_transpose1d(x, w, stride=4, padding=2),
                                    convt1d_np),
        "layernorm_silu": Case(layernorm_silu, ln_silu_np,
                               lambda x, g, b: F.silu(F.layer_norm(x, (x.shape[1],), g, b, 1e-5)), ln_silu_np),
        "gru_cell": Case(gru_cell, gru_np, gru_torch, gru_np),
        "maxpool3d": Case(maxpool3d, maxpool3d_np, lambda x: F.max_pool3d(x, 3, 2), maxpool3d_np),
        "dw_conv3d": Case(depthwise_conv3d, dw3d_np, lambda x, w: F.conv3d(x, w[:, None], padding=1, groups=w.shape[0]),
                          dw3d_np),
        "cumsum_masked": Case(cumsum_masked, lambda x: np.cumsum(x, 1), lambda x: torch.cumsum(x, 1),
                              lambda x: np.cumsum(x, 1)),
        "cumprod_log": Case(cumprod_log, lambda x: np.cumprod(1 + x / 4, 1), lambda x: torch.cumprod(1 + x / 4, 1),
                            lambda x: np.cumprod(1 + x / 4, 1)),
        "embedding_bag": Case(embedding_bag_offsets, embag_np, embag_torch, embag_np, embedding_bag_inputs),
        "bucketize_int32": Case(bucketize_int32, lambda x, b: np.searchsorted(b, x, side="right"),
                                lambda x, b: torch.bucketize(x, b, right=True, out_int32=True),
                                lambda x, b: np.searchsorted(b, x, side="right"), bucketize_inputs),
        "grouped_conv1d_nwc": Case(grouped_conv1d_nwc, gconv_np, gconv_torch, gconv_np),
        "maxplus": Case(maxplus, lambda a, b: (a[:, :, None] + b[None]).max(1), lambda a, b: (a[:, :, None] + b[None]).amax(1),
                        lambda a, b: (a[:, :, None] + b[None]).max(1)),
        "l1_distance": Case(l1_distance, lambda a, b: np.abs(a[:, None] - b[None]).sum(-1),
                            lambda a, b: torch.cdist(a, b, p=1), lambda a, b: np.abs(a[:, None] - b[None]).sum(-1)),
    }


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - ref)) / max(float(np.max(np.abs(ref))), 1e-30))


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def pause() -> None:
    time.sleep(0.05)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=64, help="tuning measurements per case (0: zero-trial only)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating timing rounds per case")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cases", nargs="+", default=None, help="a subset of the cases (default: all)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch = import_torch()
    if torch is None:
        return 2
    from blas_info import blas_line

    import compiler
    from compiler.ops import build_op
    from compiler.verify import poisoned
    from tuner.apply_best import ApplyHistoryBest
    from tuner.numpy_baselines import time_callable
    from tuner.records import open_store
    from tuner.tune import tune
    from tuner.workload import Task, Workload

    cases = _cases()
    names = args.cases or list(cases)
    unknown = [n for n in names if n not in cases]
    if unknown:
        ap.error(f"unknown cases {unknown}; known: {list(cases)}")
    target = compiler.Target.host()
    torch.set_num_threads(args.threads)
    compiler.set_num_threads(args.threads)
    print(f"host target: -mcpu={target.cpu}, {args.threads} threads; torch {torch.__version__}; {blas_line()}")
    print(f"sketch space, {args.trials} trials per case; {args.rounds} alternating rounds\n", flush=True)

    report: dict = {k: {} for k in ("zero_trial_vs_torch", "tuned_vs_torch", "tuned_over_zero_trial", "vs_numpy",
                                    "tune_seconds", "max_rel_error")}
    rows = []
    rng = np.random.default_rng(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            case = cases[name]
            placeholders, output = case.define()
            workload = Workload.from_compute(output, placeholders, name=name)
            opdef = workload.opdef()
            arrays = (case.inputs(rng) if case.inputs is not None else
                      [rng.uniform(-1.0, 1.0, t.shape).astype(t.dtype) for t in opdef.inputs])
            zero = build_op(opdef, target)
            tuned, seconds = zero, 0.0
            if args.trials > 0:
                store = open_store(f"sqlite:///{tmp}/{name}.db")
                t0 = time.perf_counter()
                result = tune(Task.create(workload), store, space="sketch", trials=args.trials, batch_size=8, seed=args.seed)
                seconds = time.perf_counter() - t0
                print(f"  {name}: tuned in {seconds:.1f} s ({result.time_summary()})", flush=True)
                with ApplyHistoryBest(store):
                    tuned = build_op(opdef, target)
                store.close()
            ref = np.asarray(case.reference(*[a.astype(np.float64) for a in arrays]), np.float64).reshape(opdef.output.shape)
            errs = []
            for kernel in (zero, tuned):
                out = poisoned(opdef.output.shape, opdef.output.dtype, 0)
                kernel(*arrays, out)
                errs.append(rel_err(out, ref))
            if max(errs) > 1e-4:
                print(f"{name}: WRONG RESULT (relative error zero-trial {errs[0]:.2e}, tuned {errs[1]:.2e})", file=sys.stderr)
                return 1
            tensors = [torch.from_numpy(a) for a in arrays]
            out = poisoned(opdef.output.shape, opdef.output.dtype, 0)
            t_zero, t_tuned, t_torch, t_numpy = [], [], [], []
            with torch.no_grad():
                for _ in range(args.rounds):
                    t_zero.append(pause() or zero.measure(*arrays, out).median)
                    t_tuned.append(pause() or tuned.measure(*arrays, out).median)
                    t_torch.append(pause() or time_callable(case.torch_fn, tensors).median)
                    t_numpy.append(pause() or time_callable(case.numpy_fn, arrays).median)
            z, t, o, n = (statistics.median(v) for v in (t_zero, t_tuned, t_torch, t_numpy))
            report["zero_trial_vs_torch"][name] = round(o / z, 3)
            report["tuned_vs_torch"][name] = round(o / t, 3)
            report["tuned_over_zero_trial"][name] = round(z / t, 3)
            report["vs_numpy"][name] = round(n / t, 3)
            report["tune_seconds"][name] = round(seconds, 1)
            report["max_rel_error"][name] = max(errs)
            gf = [f"{opdef.flops / sec / 1e9:.1f}" for sec in (z, t, o, n)]
            row = (name, *gf, f"{o / z:.3f}", f"{o / t:.3f}", f"{seconds:.0f}", f"{max(errs):.1e}")
            rows.append(row)
            print("  " + "  ".join(row), file=sys.stderr, flush=True)

    head = ("case", "zero-trial GF", "tuned GF", "torch GF", "numpy GF", "zero/torch", "tuned/torch", "tune s", "rel err")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(v).rjust(w) if i else str(v).ljust(w) for i, (v, w) in enumerate(zip(r, widths))))
    report["zero_trial_vs_torch_geomean"] = round(geomean(report["zero_trial_vs_torch"].values()), 3)
    report["tuned_vs_torch_geomean"] = round(geomean(report["tuned_vs_torch"].values()), 3)
    report.update(trials=args.trials, rounds=args.rounds, threads=args.threads, cpu=target.cpu)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
