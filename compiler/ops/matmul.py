"""Matrix products: matmul (float and int8→int32), dense with a fused epilogue, batch_matmul."""

from __future__ import annotations

import numpy as np

from .. import expr as E
from ..dtypes import is_int
from ..errors import ExprError
from ..tensor import compute, placeholder, reduce_axis
from ..tensor import sum as te_sum
from .base import FLOAT, OpDef, check_dtype_for, check_int, np_gelu

EPILOGUES = ("none", "relu", "gelu")


def _acc_dtype(op, dtype, out_dtype):
    """int8 products accumulate in int32 (an int8 sum would overflow after a few terms)."""
    if out_dtype is None:
        out_dtype = "int32" if dtype == "int8" else dtype
    out_dtype = check_dtype_for(op, out_dtype, ("float32", "float64", "int32", "int64"))
    if is_int(dtype) != is_int(out_dtype):
        raise ExprError(f"{op}: out_dtype {out_dtype} must be an {'int' if is_int(dtype) else 'float'} "
                        f"type for {dtype} inputs")
    return out_dtype


def _ref_matmul(a, b, out_dtype):
    acc = np.int64 if is_int(out_dtype) else np.float64
    return np.matmul(a.astype(acc), b.astype(acc)).astype(out_dtype)


def matmul(M, N, K, dtype="float32", transpose_b=False, out_dtype=None, name="matmul") -> OpDef:
    """C[M,N] = A[M,K] @ B[K,N] (B is [N,K] with transpose_b); int8 accumulates into int32."""
    op = name
    M, N, K = (check_int(op, n, v) for n, v in (("M", M), ("N", N), ("K", K)))
    dtype = check_dtype_for(op, dtype, ("float32", "float64", "int8", "int32"))
    out_dtype = _acc_dtype(op, dtype, out_dtype)
    A = placeholder((M, K), dtype, "A")
    B = placeholder((N, K) if transpose_b else (K, N), dtype, "B")
    k = reduce_axis(K, "k")

    def term(i, j):
        a, b = A[i, k], (B[j, k] if transpose_b else B[k, j])
        return a.astype(out_dtype) * b.astype(out_dtype)

    C = compute((M, N), lambda i, j: te_sum(term(i, j), axis=k), name=name, tag="matmul")

    def reference(a, b):
        return _ref_matmul(a, b.T if transpose_b else b, out_dtype)

    params = dict(M=M, N=N, K=K, dtype=dtype, transpose_b=bool(transpose_b), out_dtype=out_dtype)
    return OpDef(op, [A, B], C, params, 2 * M * N * K, reference)


def matmul_int8(M, N, K, transpose_b=False) -> OpDef:
    """int8 × int8 → int32 matmul (its own inventory entry: a different kernel family)."""
    return matmul(M, N, K, "int8", transpose_b, "int32", name="matmul_int8")


def batch_matmul(B, M, N, K, dtype="float32", transpose_b=False, out_dtype=None) -> OpDef:
    """C[b,M,N] = A[b,M,K] @ W[b,K,N] (W is [b,N,K] with transpose_b)."""
    op = "batch_matmul"
    B, M, N, K = (check_int(op, n, v) for n, v in (("B", B), ("M", M), ("N", N), ("K", K)))
    dtype = check_dtype_for(op, dtype, ("float32", "float64", "int8", "int32"))
    out_dtype = _acc_dtype(op, dtype, out_dtype)
    X = placeholder((B, M, K), dtype, "A")
    W = placeholder((B, N, K) if transpose_b else (B, K, N), dtype, "B")
    k = reduce_axis(K, "k")

    def term(b, i, j):
        w = W[b, j, k] if transpose_b else W[b, k, j]
        return X[b, i, k].astype(out_dtype) * w.astype(out_dtype)

    C = compute((B, M, N), lambda b, i, j: te_sum(term(b, i, j), axis=k), name="batch_matmul",
                tag="batch_matmul")

    def reference(x, w):
        return _ref_matmul(x, np.swapaxes(w, 1, 2) if transpose_b else w, out_dtype)

    params = dict(B=B, M=M, N=N, K=K, dtype=dtype, transpose_b=bool(transpose_b), out_dtype=out_dtype)
    return OpDef(op, [X, W], C, params, 2 * B * M * N * K, reference)


def dense(batch, in_dim, out_dim, dtype="float32", epilogue="none") -> OpDef:
    """out = act(data @ weight.T + bias): a reduction stage `dense_matmul` and an elementwise
    stage `dense_epilogue` (bias + activation) the schedule can inline or compute_at."""
    op = "dense"
    batch, in_dim, out_dim = (check_int(op, n, v) for n, v in
                              (("batch", batch), ("in_dim", in_dim), ("out_dim", out_dim)))
    dtype = check_dtype_for(op, dtype, FLOAT)
    if epilogue not in EPILOGUES:
        raise ExprError(f"{op}: epilogue must be one of {', '.join(EPILOGUES)}, got {epilogue!r}")
    data = placeholder((batch, in_dim), dtype, "data")
    weight = placeholder((out_dim, in_dim), dtype, "weight")
    bias = placeholder((out_dim,), dtype, "bias")
    k = reduce_axis(in_dim, "k")
    mm = compute((batch, out_dim), lambda i, j: te_sum(data[i, k] * weight[j, k], axis=k),
                 name="dense_matmul", tag="dense")

    def act(x):
        if epilogue == "relu":
            return E.maximum(x, 0.0)
        if epilogue == "gelu":
            return E.gelu(x)
        return x

    out = compute((batch, out_dim), lambda i, j: act(mm[i, j] + bias[j]), name="dense_epilogue",
                  tag="elemwise")

    def reference(x, w, b):
        y = x.astype(np.float64) @ w.astype(np.float64).T + b.astype(np.float64)
        if epilogue == "relu":
            y = np.maximum(y, 0.0)
        elif epilogue == "gelu":
            y = np_gelu(y)
        return y.astype(dtype)

    params = dict(batch=batch, in_dim=in_dim, out_dim=out_dim, dtype=dtype, epilogue=epilogue)
    return OpDef(op, [data, weight, bias], out, params, 2 * batch * in_dim * out_dim + batch * out_dim, reference)
