"""Index-map operators: GatherND, GatherElements, ScatterND, Tile and Trilu.

Each output element is an input element chosen by index arithmetic (the index read from an
indices tensor at run time for the gathers and the scatter), so, like Gather, they lower to
reads of their operands' `Lazy` views and fuse as injective nodes. ScatterND is the exception:
which update lands on an output element is a search over the updates, one reduction stage
(below), so it is a kernel of its own.

Index arithmetic from data lives in one helper per operator (`gather_nd_index`,
`gather_elements_index`, `scatter_nd_index`), each through `base.data_index`: ONNX's negative
indices count from the end, and an index outside [-n, n) stops the kernel with a
KernelRuntimeError naming the node, the value and the range (never a clamped or wrapped
element, which would be a silent wrong answer).

Constant uses (a Swin's shifted-window mask built by ScatterND, a LeViT's GatherND of constant
attention biases) never reach these lowerings: the importer folds them (onnx_fold.py).
"""

from __future__ import annotations

import math

import numpy as np

from ... import expr as E
from ...tensor import compute, reduce_axis
from ...tensor import max as te_max
from ...tensor import min as te_min
from ...tensor import sum as te_sum
from ..errors import ShapeError
from .base import Kind, Lazy, axis_of, const_input, data_index, register
from .shape import reshaped

INDEX_DTYPES = ("int32", "int64")


def _check_indices(node, v):
    if v.dtype not in INDEX_DTYPES:
        raise ShapeError(f"{node.op_type} node {node.name!r}: indices must be int32 or int64, got {v.dtype}")


# ----------------------------------------------------------------------------- GatherND

def gather_nd_index(node, i, n: int, j: int):
    """GatherND's index into an axis of extent n: element j of an index tuple, checked."""
    return data_index(node, i, n, f"indices[..., {j}]")


def _gather_nd_params(node, data_shape, idx_shape):
    """(batch_dims, k): the leading axes data and indices share, and how many axes of data one
    index tuple addresses; ShapeError for shapes ONNX does not allow."""
    b, r, q = int(node.attrs.get("batch_dims", 0)), len(data_shape), len(idx_shape)
    if r < 1 or q < 1:
        raise ShapeError(f"GatherND node {node.name!r}: data and indices need rank >= 1, got {r} and {q}")
    if not 0 <= b < min(r, q):
        raise ShapeError(f"GatherND node {node.name!r}: batch_dims {b} must be below both ranks ({r}, {q})")
    if tuple(data_shape[:b]) != tuple(idx_shape[:b]):
        raise ShapeError(f"GatherND node {node.name!r}: the first {b} axes of data {data_shape} and indices "
                         f"{idx_shape} (batch_dims) differ")
    k = idx_shape[-1]
    if not 1 <= k <= r - b:
        raise ShapeError(f"GatherND node {node.name!r}: index tuples of length {k} for data of rank {r} with "
                         f"batch_dims {b} (1..{r - b})")
    return b, k


def _gather_nd_infer(node, ins, opset):
    data, idx = ins
    _check_indices(node, idx)
    b, k = _gather_nd_params(node, data.shape, idx.shape)
    return [(tuple(idx.shape[:-1]) + tuple(data.shape[b + k:]), data.dtype)]


def _gather_nd_lower(node, xs, ins, opset):
    data, idx = xs
    b, k = _gather_nd_params(node, data.shape, idx.shape)
    q = len(idx.shape)
    shape = tuple(idx.shape[:-1]) + tuple(data.shape[b + k:])

    def read(o):
        tup = tuple(o[:q - 1])
        coords = tuple(gather_nd_index(node, idx.read(tup + (j,)), data.shape[b + j], j) for j in range(k))
        return data.read(tuple(o[:b]) + coords + tuple(o[q - 1:]))
    return Lazy(shape, data.dtype, read)


def _gather_nd_fold(node, arrays, opset):
    data, idx = arrays
    b, k = _gather_nd_params(node, data.shape, idx.shape)
    idx = idx.astype(np.int64)
    idx = np.where(idx < 0, idx + np.array(data.shape[b:b + k]), idx)
    batch = math.prod(data.shape[:b])
    flat_data = data.reshape((batch,) + data.shape[b:])
    flat_idx = idx.reshape(batch, -1, k)
    out = np.stack([flat_data[i][tuple(flat_idx[i].T)] for i in range(batch)])
    return [out.reshape(tuple(idx.shape[:-1]) + tuple(data.shape[b + k:]))]


register("GatherND", Kind.INJECTIVE, _gather_nd_infer, _gather_nd_lower, _gather_nd_fold, min_opset=11)


# ----------------------------------------------------------------------------- GatherElements

def gather_elements_index(node, i, n: int):
    """GatherElements' index into its axis of extent n, checked."""
    return data_index(node, i, n)


def _gather_elements_infer(node, ins, opset):
    data, idx = ins
    _check_indices(node, idx)
    r = len(data.shape)
    axis = axis_of(node, int(node.attrs.get("axis", 0)), r)
    if len(idx.shape) != r or r < 1:
        raise ShapeError(f"GatherElements node {node.name!r}: data {data.shape} and indices {idx.shape} need one "
                         "rank >= 1")
    if any(i > d for a, (i, d) in enumerate(zip(idx.shape, data.shape)) if a != axis):
        raise ShapeError(f"GatherElements node {node.name!r}: indices {idx.shape} larger than data {data.shape} "
                         f"outside axis {axis}")
    return [(tuple(idx.shape), data.dtype)]


def _gather_elements_lower(node, xs, ins, opset):
    data, idx = xs
    axis = axis_of(node, int(node.attrs.get("axis", 0)), len(data.shape))
    n = data.shape[axis]

    def read(o):
        i = gather_elements_index(node, idx.read(tuple(o)), n)
        return data.read(tuple(o[:axis]) + (i,) + tuple(o[axis + 1:]))
    return Lazy(tuple(idx.shape), data.dtype, read)


def _gather_elements_fold(node, arrays, opset):
    data, idx = arrays
    axis = int(node.attrs.get("axis", 0)) % data.ndim
    idx = idx.astype(np.int64)
    idx = np.where(idx < 0, idx + data.shape[axis], idx)
    window = tuple(slice(None) if a == axis else slice(0, s) for a, s in enumerate(idx.shape))
    return [np.take_along_axis(data[window], idx, axis=axis)]


register("GatherElements", Kind.INJECTIVE, _gather_elements_infer, _gather_elements_lower, _gather_elements_fold,
         min_opset=11)


# ----------------------------------------------------------------------------- ScatterND

SCATTER_REDUCTIONS = ("none", "add", "max", "min")


def scatter_nd_index(node, i, n: int, j: int):
    """ScatterND's index into an axis of extent n: element j of an index tuple, checked."""
    return data_index(node, i, n, f"indices[..., {j}]")


def _scatter_nd_check(node, opset):
    reduction = node.attrs.get("reduction", "none")
    if reduction not in SCATTER_REDUCTIONS:
        return f"reduction={reduction!r} (kernels take {', '.join(SCATTER_REDUCTIONS)})"
    return None


def _scatter_nd_infer(node, ins, opset):
    data, idx, upd = ins
    _check_indices(node, idx)
    if upd.dtype != data.dtype:
        raise ShapeError(f"ScatterND node {node.name!r}: updates are {upd.dtype}, data {data.dtype}")
    r, k = len(data.shape), idx.shape[-1] if idx.shape else 0
    if not idx.shape or not 1 <= k <= r:
        raise ShapeError(f"ScatterND node {node.name!r}: indices {idx.shape} must end in a tuple length 1..{r}")
    want = tuple(idx.shape[:-1]) + tuple(data.shape[k:])
    if tuple(upd.shape) != want:
        raise ShapeError(f"ScatterND node {node.name!r}: updates have shape {upd.shape}, ONNX wants {want} "
                         f"for data {data.shape} and indices {idx.shape}")
    if data.dtype == "bool" and node.attrs.get("reduction", "none") != "none":
        raise ShapeError(f"ScatterND node {node.name!r}: reduction {node.attrs.get('reduction')!r} of bool data")
    return [(tuple(data.shape), data.dtype)]


def _scatter_nd_lower(node, xs, ins, opset):
    """out = data, where an index tuple of `indices` addresses an element, that tuple's update
    (the last one of several: the order ONNX Runtime applies them in) or, with a reduction, data
    combined with every update addressing it. The tuples are searched per output element (a
    reduction over the M = prod(indices.shape[:-1]) tuples): reduction none finds the last
    matching tuple's number, one stage over data.shape[:k], which the output reads its update
    through; add / max / min reduce the matching updates directly."""
    data, idx, upd = xs
    reduction = node.attrs.get("reduction", "none")
    k, D = idx.shape[-1], tuple(data.shape)
    M = math.prod(idx.shape[:-1])
    tuples = reshaped(idx, (M, k))
    updates = reshaped(upd, (M,) + D[k:])

    def matches(m, p):
        cond = None
        for j in range(k):
            c = E.equal(scatter_nd_index(node, tuples.read((m, j)), D[j], j), p[j])
            cond = c if cond is None else cond & c
        return cond

    if reduction == "none":
        def last(*p):
            m = reduce_axis(M, "m")
            return te_max(m.var, axis=m, where=matches(m.var, p))
        which = compute(D[:k], last, name="scatter_nd_which", tag="scatter_nd_which")

        def read(o):
            w = which[tuple(o[:k])]
            return E.if_then_else(w >= 0, updates.read((w,) + tuple(o[k:])), data.read(tuple(o)))
        return Lazy(D, data.dtype, read)

    def combined(*o):
        m = reduce_axis(M, "m")
        src, where = updates.read((m.var,) + tuple(o[k:])), matches(m.var, o[:k])
        if reduction == "add":
            return te_sum(src, axis=m, where=where)
        if reduction == "max":
            return te_max(src, axis=m, where=where)
        return te_min(src, axis=m, where=where)
    part = compute(D, combined, name=f"scatter_nd_{reduction}", tag="scatter_nd_reduce")
    combine = {"add": lambda a, b: a + b, "max": E.maximum, "min": E.minimum}[reduction]
    return Lazy(D, data.dtype, lambda o: combine(data.read(tuple(o)), part[tuple(o)]))


register("ScatterND", Kind.OPAQUE, _scatter_nd_infer, _scatter_nd_lower, check=_scatter_nd_check, min_opset=11)


# ----------------------------------------------------------------------------- Tile

def _repeats(node, ins):
    reps = [int(r) for r in np.asarray(const_input(node, ins, 1, "repeats")).reshape(-1)]
    if len(reps) != len(ins[0].shape) or any(r < 1 for r in reps):
        raise ShapeError(f"Tile node {node.name!r}: repeats {reps} must be one positive count per axis of "
                         f"{ins[0].shape}")
    return reps


def _tile_infer(node, ins, opset):
    return [(tuple(s * r for s, r in zip(ins[0].shape, _repeats(node, ins))), ins[0].dtype)]


def _tile_lower(node, xs, ins, opset):
    x = xs[0]
    reps = _repeats(node, ins)
    shape = tuple(s * r for s, r in zip(x.shape, reps))

    def read(o):
        return x.read(tuple(0 if s == 1 else (i % s if r > 1 else i) for i, s, r in zip(o, x.shape, reps)))
    return Lazy(shape, x.dtype, read)


register("Tile", Kind.INJECTIVE, _tile_infer, _tile_lower,
         lambda n, a, o: [np.tile(a[0], [int(r) for r in a[1].reshape(-1)])], min_opset=6)


# ----------------------------------------------------------------------------- Trilu

def _trilu_k(node, ins) -> int:
    if len(ins) < 2 or ins[1] is None:
        return 0
    return int(np.asarray(const_input(node, ins, 1, "k")).reshape(-1)[0])


def _trilu_infer(node, ins, opset):
    if len(ins[0].shape) < 2:
        raise ShapeError(f"Trilu node {node.name!r}: input rank {len(ins[0].shape)} < 2")
    _trilu_k(node, ins)
    return [(tuple(ins[0].shape), ins[0].dtype)]


def _trilu_lower(node, xs, ins, opset):
    """Elements with j - i >= k (upper) or j - i <= k (lower) kept, the rest zero. Injective,
    not elementwise: the test reads the position, so the blocked layout must not take it."""
    x = xs[0]
    k, upper = _trilu_k(node, ins), int(node.attrs.get("upper", 1))
    zero = E.const(False if x.dtype == "bool" else 0, x.dtype)

    def read(o):
        d = o[-1] - o[-2]
        keep = (d >= k) if upper else (d <= k)
        return E.if_then_else(keep, x.read(tuple(o)), zero)
    return Lazy(tuple(x.shape), x.dtype, read)


def _trilu_fold(node, arrays, opset):
    k = 0 if len(arrays) < 2 or arrays[1] is None else int(arrays[1].reshape(-1)[0])
    f = np.triu if int(node.attrs.get("upper", 1)) else np.tril
    return [f(arrays[0], k)]


register("Trilu", Kind.INJECTIVE, _trilu_infer, _trilu_lower, _trilu_fold, min_opset=14)

__all__ = ["gather_nd_index", "gather_elements_index", "scatter_nd_index", "SCATTER_REDUCTIONS"]
