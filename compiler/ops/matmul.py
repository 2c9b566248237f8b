"""Matrix products: matmul (float and int8→int32), batch_matmul, dense with a fused epilogue and
dense_gelu; the computes are the tensor functions of functions.py."""

from __future__ import annotations

import numpy as np

from ..dtypes import is_int
from ..tensor import placeholder
from . import functions as fn
from .base import FLOAT, OpDef, check_bool, check_choice, check_dtype_for, check_int, np_gelu
from .functions import MATMUL_DTYPES, acc_dtype

EPILOGUES = tuple(fn.ACTIVATIONS)


def _ref_matmul(a, b, out_dtype):
    acc = np.int64 if is_int(out_dtype) else np.float64
    return np.matmul(a.astype(acc), b.astype(acc)).astype(out_dtype)


def matmul(M, N, K, dtype="float32", transpose_b=False, out_dtype=None) -> OpDef:
    """C[M,N] = A[M,K] @ B[K,N] (B is [N,K] with transpose_b); int8 accumulates into int32."""
    return _matmul("matmul", M, N, K, dtype, transpose_b, out_dtype)


def matmul_int8(M, N, K, transpose_b=False) -> OpDef:
    """int8 × int8 → int32 matmul (its own inventory entry: a different kernel family)."""
    return _matmul("matmul_int8", M, N, K, "int8", transpose_b, "int32")


def _matmul(op, M, N, K, dtype, transpose_b, out_dtype) -> OpDef:
    """Both matmul entries; `op` names the OpDef and its stage (the default schedule dispatches
    on it), so it is not a user parameter."""
    M, N, K = (check_int(op, n, v) for n, v in (("M", M), ("N", N), ("K", K)))
    dtype = check_dtype_for(op, dtype, MATMUL_DTYPES)
    transpose_b = check_bool(op, "transpose_b", transpose_b)
    out_dtype = acc_dtype(op, dtype, out_dtype)
    A = placeholder((M, K), dtype, "A")
    B = placeholder((N, K) if transpose_b else (K, N), dtype, "B")
    C = fn.matmul(A, B, transpose_b, out_dtype, name=op)

    def reference(a, b):
        return _ref_matmul(a, b.T if transpose_b else b, out_dtype)

    params = dict(M=M, N=N, K=K, dtype=dtype, transpose_b=transpose_b, out_dtype=out_dtype)
    return OpDef(op, [A, B], C, params, 2 * M * N * K, reference)


def batch_matmul(B, M, N, K, dtype="float32", transpose_b=False, out_dtype=None) -> OpDef:
    """C[b,M,N] = A[b,M,K] @ W[b,K,N] (W is [b,N,K] with transpose_b)."""
    op = "batch_matmul"
    B, M, N, K = (check_int(op, n, v) for n, v in (("B", B), ("M", M), ("N", N), ("K", K)))
    dtype = check_dtype_for(op, dtype, MATMUL_DTYPES)
    transpose_b = check_bool(op, "transpose_b", transpose_b)
    out_dtype = acc_dtype(op, dtype, out_dtype)
    X = placeholder((B, M, K), dtype, "A")
    W = placeholder((B, N, K) if transpose_b else (B, K, N), dtype, "B")
    C = fn.batch_matmul(X, W, transpose_b, out_dtype)

    def reference(x, w):
        return _ref_matmul(x, np.swapaxes(w, 1, 2) if transpose_b else w, out_dtype)

    params = dict(B=B, M=M, N=N, K=K, dtype=dtype, transpose_b=transpose_b, out_dtype=out_dtype)
    return OpDef(op, [X, W], C, params, 2 * B * M * N * K, reference)


def dense(batch, in_dim, out_dim, dtype="float32", epilogue="none") -> OpDef:
    """out = act(data @ weight.T + bias): a reduction stage `dense_matmul` and an elementwise
    stage `dense_epilogue` (bias + activation) the schedule can inline or compute_at."""
    return _dense("dense", batch, in_dim, out_dim, dtype, epilogue)


def dense_gelu(batch, in_dim, out_dim, dtype="float32") -> OpDef:
    """gelu(data @ weight.T + bias): dense with its gelu epilogue, as its own inventory entry (the
    transformer MLP's first layer). The compute is dense's with epilogue="gelu", so both share
    one workload key and one set of tuning records."""
    return _dense("dense_gelu", batch, in_dim, out_dim, dtype, "gelu")


def _dense(op, batch, in_dim, out_dim, dtype, epilogue) -> OpDef:
    batch, in_dim, out_dim = (check_int(op, n, v) for n, v in
                              (("batch", batch), ("in_dim", in_dim), ("out_dim", out_dim)))
    dtype = check_dtype_for(op, dtype, FLOAT)
    epilogue = check_choice(op, "epilogue", epilogue, EPILOGUES)
    data = placeholder((batch, in_dim), dtype, "data")
    weight = placeholder((out_dim, in_dim), dtype, "weight")
    bias = placeholder((out_dim,), dtype, "bias")
    mm = fn.dense(data, weight)
    out = fn.bias_add(mm, bias, axis=1, activation=epilogue, name="dense_epilogue", tag="elemwise")

    def reference(x, w, b):
        y = x.astype(np.float64) @ w.astype(np.float64).T + b.astype(np.float64)
        if epilogue == "relu":
            y = np.maximum(y, 0.0)
        elif epilogue == "gelu":
            y = np_gelu(y)
        return y.astype(dtype)

    params = dict(batch=batch, in_dim=in_dim, out_dim=out_dim, dtype=dtype)
    if op == "dense":  # dense_gelu's epilogue is its name, not a parameter
        params["epilogue"] = epilogue
    return OpDef(op, [data, weight, bias], out, params, 2 * batch * in_dim * out_dim + batch * out_dim, reference)
