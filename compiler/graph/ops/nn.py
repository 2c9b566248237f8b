"""Neural-network ONNX operators: Conv, Gemm and MatMul (the anchors epilogues fuse into),
pooling, Softmax, LayerNormalization and reductions.

Anchors lower through the compiler's tensor functions (`conv2d_nchw`, `dense`, `matmul`), so a
fused group's anchor stage is the one the inventory's operator has and its default schedule
(compiler/ops/schedule_anchor.py) is the operator's register tiling. Pools, Softmax,
LayerNormalization and ReduceSum/Max/Min are inventory operators when alone (`inventory`), so
they get the inventory's default schedules and templates.
"""

from __future__ import annotations

import math

from ... import expr as E
from ...ops import functions as fn
from ...tensor import compute, reduce_axis
from ...tensor import max as te_max
from ...tensor import sum as te_sum
from ..errors import ShapeError
from .base import FLOATS, Kind, Lazy, axis_of, broadcast, const_input, ints, materialize, register

# ----------------------------------------------------------------------------- Conv


def _window_check(node, opset, what="Conv"):
    k = node.attrs.get("kernel_shape")
    if k is not None and len(k) != 2:
        return f"a {len(k)}-d {what} (only 2-d, NCHW)"
    pad = node.attrs.get("auto_pad", "NOTSET")
    if pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        return f"auto_pad={pad!r}"
    return None


def window_geometry(node, in_hw, kernel, dilations=(1, 1), ceil_mode=False):
    """(strides, pads (top, left, bottom, right), output (H, W)) of a 2-d window op, with auto_pad."""
    strides = ints(node, "strides") or (1, 1)
    auto = node.attrs.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0, 0, 0, 0]
        for d in range(2):
            out = -(-in_hw[d] // strides[d])
            total = max((out - 1) * strides[d] + (kernel[d] - 1) * dilations[d] + 1 - in_hw[d], 0)
            small, big = total // 2, total - total // 2
            pads[d], pads[d + 2] = (small, big) if auto == "SAME_UPPER" else (big, small)
    elif auto == "VALID":
        pads = [0, 0, 0, 0]
    else:
        pads = list(ints(node, "pads") or (0, 0, 0, 0))
    if len(pads) != 4 or len(strides) != 2:
        raise ShapeError(f"{node.op_type} node {node.name!r}: pads {pads} / strides {strides} are not 2-d")
    out = []
    for d in range(2):
        eff = (kernel[d] - 1) * dilations[d] + 1
        span = in_hw[d] + pads[d] + pads[d + 2] - eff
        if span < 0:
            raise ShapeError(f"{node.op_type} node {node.name!r}: window {eff} larger than the padded input")
        n = (-(-span // strides[d]) if ceil_mode else span // strides[d]) + 1
        if ceil_mode and (n - 1) * strides[d] >= in_hw[d] + pads[d]:
            n -= 1  # the last window must start inside the input or its leading padding
        out.append(n)
    return tuple(strides), tuple(pads), tuple(out)


def _conv_infer(node, ins, opset):
    x, w = ins[0], ins[1]
    packed = "weight_block" in node.attrs   # passes.prepack_conv_weights: [F/FB, C, KH, KW, FB]
    if len(x.shape) != 4 or len(w.shape) != (5 if packed else 4):
        raise ShapeError(f"Conv node {node.name!r}: only 2-d convolutions (4-d NCHW data and weight), "
                         f"got data {x.shape} and weight {w.shape}")
    groups = int(node.attrs.get("group", 1))
    N, C, H, W = x.shape
    F, cpg, KH, KW = (w.shape[0] * w.shape[4], *w.shape[1:4]) if packed else w.shape
    if C % groups or F % groups or cpg != C // groups:
        raise ShapeError(f"Conv node {node.name!r}: weight {w.shape} does not fit data {x.shape} with group={groups}")
    if len(ins) > 2 and ins[2] is not None and ins[2].shape != (F,):
        raise ShapeError(f"Conv node {node.name!r}: bias shape {ins[2].shape}, expected ({F},)")
    dil = ints(node, "dilations") or (1, 1)
    _, _, (OH, OW) = window_geometry(node, (H, W), (KH, KW), dil)
    if x.dtype not in FLOATS:
        raise ShapeError(f"Conv node {node.name!r}: float data only, got {x.dtype}")
    return [((N, F, OH, OW), x.dtype)]


def _conv_lower(node, xs, ins, opset):
    x, w = materialize(xs[0], "data"), materialize(xs[1], "weight")
    dil = ints(node, "dilations") or (1, 1)
    strides, pads, _ = window_geometry(node, x.shape[2:], w.shape[2:4], dil)
    conv_fn = fn.conv2d_nchw_packed if "weight_block" in node.attrs else fn.conv2d_nchw
    out = conv_fn(x, w, strides, pads, dil, int(node.attrs.get("group", 1)))
    conv = Lazy.of(out)
    if len(xs) > 2 and xs[2] is not None:
        b = xs[2]
        return Lazy(conv.shape, conv.dtype, lambda idx: conv.read(idx) + b.read((idx[1],)))
    return conv


register("Conv", Kind.OUT_ELEMWISE_FUSABLE, _conv_infer, _conv_lower, check=_window_check)


# ----------------------------------------------------------------------------- Gemm and MatMul

def _gemm_dims(node, ins):
    a, b = ins[0].shape, ins[1].shape
    if "weight_block" in node.attrs and len(a) == 2 and len(b) == 3:   # B in column panels [N/NB, K, NB]
        return a[0], int(node.attrs["weight_columns"]), b[1]
    if len(a) != 2 or len(b) != 2:
        raise ShapeError(f"Gemm node {node.name!r}: A and B must be 2-d, got {a} and {b}")
    ta, tb = int(node.attrs.get("transA", 0)), int(node.attrs.get("transB", 0))
    M, K = (a[1], a[0]) if ta else a
    KB, N = (b[1], b[0]) if tb else b
    if K != KB:
        raise ShapeError(f"Gemm node {node.name!r}: A {a} (transA={ta}) and B {b} (transB={tb}) do not multiply")
    return M, N, K


def _gemm_infer(node, ins, opset):
    M, N, _ = _gemm_dims(node, ins)
    if len(ins) > 2 and ins[2] is not None:
        try:
            import numpy as np
            np.broadcast_shapes(ins[2].shape, (M, N))
        except ValueError:
            raise ShapeError(f"Gemm node {node.name!r}: C {ins[2].shape} does not broadcast to ({M}, {N})") from None
    if ins[0].dtype not in FLOATS:
        raise ShapeError(f"Gemm node {node.name!r}: float inputs only, got {ins[0].dtype}")
    return [((M, N), ins[0].dtype)]


def _transposed(x: Lazy, name: str):
    return compute((x.shape[1], x.shape[0]), lambda i, j: x.read((j, i)), name=name, tag="injective")


def _gemm_lower(node, xs, ins, opset):
    """alpha · A' B' + beta · C: dense when B is transposed (the [out, in] weight of a linear
    layer), matmul otherwise; alpha and C are the epilogue."""
    ta, tb = int(node.attrs.get("transA", 0)), int(node.attrs.get("transB", 0))
    alpha, beta = float(node.attrs.get("alpha", 1.0)), float(node.attrs.get("beta", 1.0))
    a = _transposed(xs[0], "transpose_a") if ta else materialize(xs[0], "a")
    b = materialize(xs[1], "b")
    if "weight_block" in node.attrs:
        prod = Lazy.of(_matmul_packed(node, a, b))
    else:
        prod = Lazy.of(fn.dense(a, b) if tb else fn.matmul(a, b))
    read = prod.read
    if alpha != 1.0:
        read0 = read
        read = lambda idx: read0(idx) * alpha  # noqa: E731
    if len(xs) > 2 and xs[2] is not None:
        c, read1 = broadcast(xs[2], prod.shape), read
        if beta == 1.0:
            read = lambda idx: read1(idx) + c(idx)  # noqa: E731
        elif beta != 0.0:
            read = lambda idx: read1(idx) + c(idx) * beta  # noqa: E731
    return prod if read is prod.read else Lazy(prod.shape, prod.dtype, read)


register("Gemm", Kind.OUT_ELEMWISE_FUSABLE, _gemm_infer, _gemm_lower)


def _matmul_shape(node, a, b):
    if len(a) < 2 or len(b) < 2:
        raise ShapeError(f"MatMul node {node.name!r}: 1-d operands are not supported (shapes {a} and {b})")
    if a[-1] != b[-2]:
        raise ShapeError(f"MatMul node {node.name!r}: shapes {a} and {b} do not multiply")
    try:
        import numpy as np
        batch = tuple(int(s) for s in np.broadcast_shapes(a[:-2], b[:-2]))
    except ValueError:
        raise ShapeError(f"MatMul node {node.name!r}: batch dimensions of {a} and {b} do not broadcast") from None
    return batch + (a[-2], b[-1])


def _matmul_infer(node, ins, opset):
    if ins[0].dtype not in FLOATS or ins[1].dtype != ins[0].dtype:
        raise ShapeError(f"MatMul node {node.name!r}: float inputs of one dtype only, got {ins[0].dtype}, {ins[1].dtype}")
    return [(_matmul_shape(node, ins[0].shape, ins[1].shape), ins[0].dtype)]


def _matmul_lower(node, xs, ins, opset):
    a, b = materialize(xs[0], "a"), materialize(xs[1], "b")
    if "weight_block" in node.attrs:
        return Lazy.of(_matmul_packed(node, a, b))
    if a.ndim == 2 and b.ndim == 2:
        return Lazy.of(fn.matmul(a, b))
    shape = _matmul_shape(node, a.shape, b.shape)
    k = reduce_axis(a.shape[-1], "k")
    nb = len(shape) - 2

    def operand(t, idx, row, col):
        lead = t.ndim - 2
        batch = tuple(0 if t.shape[d] == 1 else idx[nb - lead + d] for d in range(lead))
        return t[batch + (row, col)]

    def body(*idx):
        i, j = idx[-2], idx[-1]
        return te_sum(operand(a, idx, i, k.var) * operand(b, idx, k.var, j), axis=k)
    return Lazy.of(compute(shape, body, name="batch_matmul", tag="batch_matmul"))


def _matmul_packed(node, a, panels):
    """A @ B with the constant B [K, N] handed over in column panels [N/NB, K, NB]
    (passes.prepack_matmul_weights): B[k, j] is panels[j // NB, k, j % NB], the layout the GEMM
    schedule would copy B into on every call, or one panel per core for a one-row product."""
    _, K, NB = panels.shape
    N = int(node.attrs["weight_columns"])
    if a.shape[-1] != K:
        raise ShapeError(f"{node.op_type} node {node.name!r}: A {a.shape} and packed B {panels.shape} do not multiply")
    shape = tuple(a.shape[:-1]) + (N,)
    k = reduce_axis(K, "k")

    def body(*idx):
        j = idx[-1]
        return te_sum(a[tuple(idx[:-1]) + (k.var,)] * panels[j // NB, k.var, j % NB], axis=k)
    tag = "matmul" if a.ndim == 2 else "batch_matmul"
    return compute(shape, body, name=tag, tag=tag, attrs={"weight_block": NB})


register("MatMul", Kind.OUT_ELEMWISE_FUSABLE, _matmul_infer, _matmul_lower)


# ----------------------------------------------------------------------------- pooling

def _pool_check(node, opset):
    reason = _window_check(node, opset, node.op_type)
    if reason:
        return reason
    if any(d != 1 for d in (node.attrs.get("dilations") or ())):
        return "dilations other than 1"
    if node.op_type == "MaxPool":
        if int(node.attrs.get("storage_order", 0)):
            return "storage_order=1"
        if len([o for o in node.outputs if o]) > 1:
            return "the Indices output"
    if node.op_type == "AveragePool" and int(node.attrs.get("ceil_mode", 0)) and int(node.attrs.get("count_include_pad", 0)):
        return "ceil_mode=1 with count_include_pad=1"
    return None


def pool_geometry(node, shape):
    if len(shape) != 4:
        raise ShapeError(f"{node.op_type} node {node.name!r}: only 2-d pooling of NCHW data, got shape {shape}")
    kernel = ints(node, "kernel_shape")
    if kernel is None or len(kernel) != 2:
        raise ShapeError(f"{node.op_type} node {node.name!r}: kernel_shape {kernel} is not 2-d")
    ceil = bool(int(node.attrs.get("ceil_mode", 0)))
    strides, pads, out = window_geometry(node, shape[2:], kernel, (1, 1), ceil)
    # ceil mode: the last windows overhang the bottom/right; extra end padding the windows ignore
    H, W = shape[2:]
    pads = list(pads)
    for d, size in enumerate((H, W)):
        need = (out[d] - 1) * strides[d] + kernel[d] - size - pads[d]
        pads[d + 2] = max(pads[d + 2], need)
    for p, k in zip(pads, kernel * 2):
        if p >= k:
            raise ShapeError(f"{node.op_type} node {node.name!r}: padding {p} not smaller than the kernel {k}")
    return tuple(kernel), strides, tuple(pads), out


def _pool_infer(node, ins, opset):
    _, _, _, (OH, OW) = pool_geometry(node, ins[0].shape)
    N, C = ins[0].shape[:2]
    if node.op_type == "AveragePool" and ins[0].dtype not in FLOATS:
        raise ShapeError(f"AveragePool node {node.name!r}: float input only, got {ins[0].dtype}")
    return [((N, C, OH, OW), ins[0].dtype)]


def _pool_inventory(node, ins, opset):
    kernel, strides, pads, _ = pool_geometry(node, ins[0].shape)
    N, C, H, W = ins[0].shape
    name = "max_pool2d" if node.op_type == "MaxPool" else "avg_pool2d"
    if name == "avg_pool2d" and int(node.attrs.get("count_include_pad", 0)) and any(pads):
        return None  # the inventory divides by the valid taps; lowered below
    params = dict(N=N, C=C, H=H, W=W, kernel=kernel, stride=strides, padding=pads, dtype=ins[0].dtype)
    return name, params, [0]


def _avg_pool_lower(node, xs, ins, opset):
    """AveragePool with count_include_pad=1 and padding: window sums over zero padding / KH·KW."""
    kernel, strides, pads, (OH, OW) = pool_geometry(node, xs[0].shape)
    x = materialize(xs[0], "data")
    padded = fn.pad_tensor(x, (0, 0, pads[0], pads[1]), (0, 0, pads[2], pads[3]))
    ry, rx = reduce_axis(kernel[0], "ry"), reduce_axis(kernel[1], "rx")
    inv = 1.0 / (kernel[0] * kernel[1])
    N, C = x.shape[:2]
    out = compute((N, C, OH, OW), lambda n, c, y, w: te_sum(
        padded[n, c, y * strides[0] + ry.var, w * strides[1] + rx.var] * inv, axis=[ry, rx]),
        name="avg_pool2d_include_pad", tag="avg_pool_sum")
    return Lazy.of(out)


register("MaxPool", Kind.OPAQUE, _pool_infer, check=_pool_check, inventory=_pool_inventory)
register("AveragePool", Kind.OPAQUE, _pool_infer, _avg_pool_lower, check=_pool_check, inventory=_pool_inventory)


def _global_infer(node, ins, opset):
    if len(ins[0].shape) < 3:
        raise ShapeError(f"{node.op_type} node {node.name!r}: input rank {len(ins[0].shape)} < 3")
    if node.op_type == "GlobalAveragePool" and ins[0].dtype not in FLOATS:
        raise ShapeError(f"GlobalAveragePool node {node.name!r}: float input only")
    return [(ins[0].shape[:2] + (1,) * (len(ins[0].shape) - 2), ins[0].dtype)]


def _global_avg_lower(node, xs, ins, opset):
    """The mean over the spatial axes, as one reduction stage (the 1/HW factor in its body)."""
    x = materialize(xs[0], "data")
    spatial = x.shape[2:]
    raxes = [reduce_axis(s, f"r{d}") for d, s in enumerate(spatial)]
    inv = 1.0 / math.prod(spatial)
    out = compute(_global_infer(node, ins, opset)[0][0], lambda n, c, *_: te_sum(
        x[(n, c) + tuple(r.var for r in raxes)] * inv, axis=raxes), name="global_avg_pool", tag="reduce_mean")
    return Lazy.of(out)


def _global_max_inventory(node, ins, opset):
    shape = ins[0].shape
    return "reduce_max", dict(shape=shape, axis=tuple(range(2, len(shape))), keepdims=True, dtype=ins[0].dtype), [0]


register("GlobalAveragePool", Kind.COMM_REDUCE, _global_infer, _global_avg_lower)
register("GlobalMaxPool", Kind.COMM_REDUCE, _global_infer, inventory=_global_max_inventory)


# ----------------------------------------------------------------------------- Softmax and LayerNormalization

def _softmax_view(node, shape, opset):
    """(shape, axis) the inventory softmax runs on: opset < 13 flattens [axis:] into one row."""
    axis = axis_of(node, int(node.attrs.get("axis", 1 if opset < 13 else -1)), len(shape))
    if opset < 13 and axis != len(shape) - 1:
        return (math.prod(shape[:axis]), math.prod(shape[axis:])), 1
    return tuple(shape), axis


def _softmax_infer(node, ins, opset):
    if ins[0].dtype not in FLOATS:
        raise ShapeError(f"Softmax node {node.name!r}: float input only, got {ins[0].dtype}")
    _softmax_view(node, ins[0].shape, opset)
    return [(ins[0].shape, ins[0].dtype)]


def _softmax_inventory(node, ins, opset):
    shape, axis = _softmax_view(node, ins[0].shape, opset)
    return "softmax", dict(shape=shape, axis=axis, dtype=ins[0].dtype), [0]


def softmax_fusable(node, shape, opset) -> bool:
    """A Softmax that can run fused (a prologue on its row read, an epilogue on its store): one
    whose inventory view is its own shape (opset >= 13, or the axis already last)."""
    return _softmax_view(node, tuple(shape), opset)[0] == tuple(shape)


def _softmax_lower(node, xs, ins, opset):
    """The softmax of a fused group (fuse.py: elementwise producers of its input, consumers of its
    output): the inventory softmax's stages over the Lazy input, so the row max and the exp read
    the prologue expression; the division is left as a Lazy read, so the group's output stage
    (the epilogue) stores through it. Stages tagged as the inventory's: schedule_graph_ops
    schedules the group with schedule_nn.schedule_norm."""
    x = xs[0]
    shape, axis = _softmax_view(node, x.shape, opset)
    if tuple(shape) != tuple(x.shape):
        raise ShapeError(f"Softmax node {node.name!r}: opset {opset} flattens axis {axis}; it runs alone")

    def along(idx, value):
        return tuple(value if d == axis else i for d, i in enumerate(idx))

    stat = tuple(1 if d == axis else s for d, s in enumerate(shape))
    k1, k2 = reduce_axis(shape[axis], "k"), reduce_axis(shape[axis], "k")
    mx = compute(stat, lambda *i: te_max(x.read(along(i, k1)), axis=k1), name="softmax_max", tag="softmax_max")
    ex = compute(shape, lambda *i: E.exp(x.read(i) - mx[along(i, 0)]), name="softmax_exp", tag="elemwise")
    sm = compute(stat, lambda *i: te_sum(ex[along(i, k2)], axis=k2), name="softmax_sum", tag="softmax_sum")
    return Lazy(tuple(shape), x.dtype, lambda idx: ex[tuple(idx)] / sm[along(idx, 0)])


register("Softmax", Kind.OPAQUE, _softmax_infer, _softmax_lower, inventory=_softmax_inventory)


def _ln_check(node, opset):
    if len([o for o in node.outputs if o]) > 1:
        return "the Mean / InvStdDev outputs"
    if int(node.attrs.get("stash_type", 1)) != 1:
        return "stash_type other than float"
    return None


def _ln_infer(node, ins, opset):
    x = ins[0]
    axis = axis_of(node, int(node.attrs.get("axis", -1)), len(x.shape))
    if x.dtype not in FLOATS:
        raise ShapeError(f"LayerNormalization node {node.name!r}: float input only")
    for v in ins[1:]:
        if v is not None and math.prod(v.shape) != math.prod(x.shape[axis:]):
            raise ShapeError(f"LayerNormalization node {node.name!r}: {v.name!r} of shape {v.shape} does not match "
                             f"the normalized shape {x.shape[axis:]}")
    return [(x.shape, x.dtype)]


def _ln_inventory(node, ins, opset):
    """The inventory layer_norm over one row: the normalized axes flattened into it."""
    import numpy as np
    x = ins[0]
    axis = axis_of(node, int(node.attrs.get("axis", -1)), len(x.shape))
    row = math.prod(x.shape[axis:])
    shape = (math.prod(x.shape[:axis]) or 1, row)
    eps = float(node.attrs.get("epsilon", 1e-5))
    bias = 2 if len(ins) > 2 and ins[2] is not None else np.zeros(row, x.dtype)
    return "layer_norm", dict(shape=shape, axis=1, eps=eps, dtype=x.dtype), [0, 1, bias]


register("LayerNormalization", Kind.OPAQUE, _ln_infer, check=_ln_check, inventory=_ln_inventory, min_opset=17)


# ----------------------------------------------------------------------------- reductions

def reduce_axes(node, ins, opset) -> tuple:
    """The sorted axes a Reduce* node reduces (attribute or, from its opset on, constant input)."""
    since = 13 if node.op_type == "ReduceSum" else 18
    rank = len(ins[0].shape)
    if opset >= since and len(ins) > 1 and ins[1] is not None:
        axes = [int(a) for a in const_input(node, ins, 1, "axes")]
    else:
        axes = node.attrs.get("axes")
    if not axes:
        if int(node.attrs.get("noop_with_empty_axes", 0)):
            raise ShapeError(f"{node.op_type} node {node.name!r}: noop_with_empty_axes is not supported")
        return tuple(range(rank))
    return tuple(sorted({axis_of(node, int(a), rank) for a in axes}))


def _reduce_infer(node, ins, opset):
    axes = reduce_axes(node, ins, opset)
    keep = int(node.attrs.get("keepdims", 1))
    shape = ins[0].shape
    out = tuple(1 if d in axes else s for d, s in enumerate(shape)) if keep else \
        tuple(s for d, s in enumerate(shape) if d not in axes)
    if node.op_type == "ReduceMean" and ins[0].dtype not in FLOATS:
        raise ShapeError(f"ReduceMean node {node.name!r}: float input only")
    if ins[0].dtype == "bool":     # the reduction operators take numbers only
        raise ShapeError(f"{node.op_type} node {node.name!r}: bool input is not supported")
    return [(out, ins[0].dtype)]


def _reduce_mean_lower(node, xs, ins, opset):
    x = materialize(xs[0], "data")
    axes = reduce_axes(node, ins, opset)
    keep = int(node.attrs.get("keepdims", 1))
    raxes = {d: reduce_axis(x.shape[d], f"r{d}") for d in axes}
    inv = 1.0 / math.prod(x.shape[d] for d in axes)
    out_shape = _reduce_infer(node, ins, opset)[0][0] or (1,)

    def body(*idx):
        it = iter(idx)
        src = []
        for d in range(x.ndim):
            if d in raxes:
                if keep:
                    next(it)
                src.append(raxes[d].var)
            else:
                src.append(next(it))
        return te_sum(x[tuple(src)] * inv, axis=list(raxes.values()))
    return Lazy.of(compute(out_shape, body, name="reduce_mean", tag="reduce_mean"))


def _reduce_inventory(node, ins, opset):
    kind = {"ReduceSum": "reduce_sum", "ReduceMax": "reduce_max", "ReduceMin": "reduce_min"}[node.op_type]
    return kind, dict(shape=ins[0].shape, axis=reduce_axes(node, ins, opset),
                      keepdims=bool(int(node.attrs.get("keepdims", 1))), dtype=ins[0].dtype), [0]


register("ReduceMean", Kind.COMM_REDUCE, _reduce_infer, _reduce_mean_lower)
for _op in ("ReduceSum", "ReduceMax", "ReduceMin"):
    register(_op, Kind.COMM_REDUCE, _reduce_infer, inventory=_reduce_inventory)

__all__ = ["window_geometry", "pool_geometry", "reduce_axes"]
