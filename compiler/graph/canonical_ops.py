"""Graph → graph rewrites that put operators in the form the compiler handles best.

Run at the end of passes.simplify (after constant folding and dead-code elimination); each is a
small function of the graph, changed in place and returned:
- constant_dropout_masks: a Dropout's mask output (all true at inference) becomes a constant,
  and the node keeps only its data output, an alias of its input. Exporters keep the mask
  output even when nothing reads it (the onnx zoo's VGG-19, SqueezeNet and AlexNet do).
- resize_constant_inputs: a Resize reads its region of interest only in tf_crop_and_resize
  mode, and that and its scales or sizes only at compile time: the unused and empty ones
  (PyTorch exports an empty roi, and empty scales beside sizes) are dropped, since a kernel has
  no zero-element arguments.
- flatten_norm_spatial: InstanceNormalization and GroupNormalization of [N, C, H, W, ...] data
  run on [N, C, H·W·...] between two Reshapes (aliases, no copies), so their statistics and
  output stream each plane as one unit-stride run (ops/normalization.py).
- conv_transpose_to_conv: a 2-d ConvTranspose with constant weights (stride s in both axes, no
  dilation) becomes a Conv computing its s² output phases as s²·F channels (each phase's taps of
  the flipped kernel, ceil(K/s) per axis), a DepthToSpace interleaving them and a Slice of the
  padding: the convolution's register-tiled schedules and channel-blocked layout instead of a
  gather per tap (the direct lowering, ops/conv_transpose.py, stays for the other cases).
- spatial_reductions_to_global_pools: a ReduceMean or ReduceMax of float [N, C, spatial...] data
  over exactly its spatial axes (the dynamo exporter's spelling of a squeeze-excite's average
  pool, where TorchScript writes GlobalAveragePool) becomes GlobalAveragePool / GlobalMaxPool
  (and a Reshape to [N, C] without keepdims): the pools the channel-blocked layout keeps blocked.
  As a reduction it left the layout: a copy out of blocks, the reduction and the SE block's
  convolutions in NCHW, a copy back (EfficientNet blocks, batch 8: 0.67x onnxruntime by dynamo,
  1.04x by TorchScript).
- einsum_to_matmul: an Einsum of two operands that is a (batched) matrix product up to
  transposes ("bhid,bhjd->bhij", "bhij,bhjd->bhid", "bid,jd->bij", "ij,jk->ik") becomes
  Transpose / Reshape nodes around a MatMul, which gets the GEMM schedules, its weight
  pre-packed and its epilogue fused. Constant operands are transposed at compile time. Other
  Einsums (traces, diagonals, a sum over one operand's axis) keep their direct lowering
  (ops/einsum.py).
"""

from __future__ import annotations

import math

import numpy as np

from .grouped_heads import group_query_heads
from .ir import Graph, Node, Value
from .node_builder import NodeBuilder
from .ops.conv_transpose import geometry as conv_transpose_geometry
from .ops.einsum import parse
from .ops.nn import reduce_axes
from .ops.shape import dropout_mask_dtype

NORMS = ("InstanceNormalization", "GroupNormalization")


def canonicalize(graph: Graph) -> Graph:
    constant_dropout_masks(graph)
    resize_constant_inputs(graph)
    flatten_norm_spatial(graph)
    conv_transpose_to_conv(graph)
    spatial_reductions_to_global_pools(graph)
    einsum_to_matmul(graph)
    group_query_heads(graph)
    return graph


GLOBAL_POOL_OF = {"ReduceMean": "GlobalAveragePool", "ReduceMax": "GlobalMaxPool"}


def spatial_reductions_to_global_pools(graph: Graph) -> Graph:
    rewrites = {}
    for n in graph.nodes:
        if n.op_type not in GLOBAL_POOL_OF:
            continue
        ins = [graph.values[i] if i else None for i in n.inputs]
        x = graph.values[n.inputs[0]]
        if x.const is not None or len(x.shape) < 3 or x.dtype not in ("float32", "float64"):
            continue
        if reduce_axes(n, ins, graph.opset) != tuple(range(2, len(x.shape))):
            continue
        b = NodeBuilder(graph, n)
        keep = int(n.attrs.get("keepdims", 1))
        pooled = b.emit(GLOBAL_POOL_OF[n.op_type], [n.inputs[0]], {}, n.outputs[0] if keep else None)
        if not keep:
            b.reshape(pooled, tuple(x.shape[:2]), out=n.outputs[0])
        rewrites[id(n)] = b.nodes
    _replace(graph, rewrites)
    return graph


def constant_dropout_masks(graph: Graph) -> Graph:
    for n in graph.nodes:
        if n.op_type != "Dropout" or len(n.outputs) < 2 or not n.outputs[1]:
            continue
        mask, x = graph.values[n.outputs[1]], graph.values[n.inputs[0]]
        dtype = dropout_mask_dtype(x.dtype, graph.opset)
        graph.values[mask.name] = Value(mask.name, mask.shape, mask.dtype, np.ones(mask.shape, dtype))
        n.outputs = [n.outputs[0]]
    return graph


def resize_constant_inputs(graph: Graph) -> Graph:
    for n in graph.nodes:
        if n.op_type != "Resize" or graph.opset < 11:
            continue
        crop = n.attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize"
        for i in range(1, len(n.inputs)):
            v = graph.values.get(n.inputs[i]) if n.inputs[i] else None
            if v is not None and ((i == 1 and not crop) or v.size == 0):
                n.inputs[i] = ""
    return graph


def _replace(graph: Graph, rewrites: dict) -> None:
    """Each node of `rewrites` (by id) replaced by its list of nodes, in place."""
    graph.nodes = [m for n in graph.nodes for m in rewrites.get(id(n), [n])]


def flatten_norm_spatial(graph: Graph) -> Graph:
    rewrites = {}
    for n in graph.nodes:
        if n.op_type not in NORMS:
            continue
        x = graph.values[n.inputs[0]]
        if len(x.shape) <= 3 or x.const is not None:
            continue
        b = NodeBuilder(graph, n)
        flat = (x.shape[0], x.shape[1], math.prod(x.shape[2:]))
        x3 = b.reshape(n.inputs[0], flat)
        y3 = b.value("flat", flat, x.dtype)
        b.nodes.append(Node(n.op_type, n.name, [x3, *n.inputs[1:]], [y3], dict(n.attrs)))
        b.reshape(y3, x.shape, out=n.outputs[0])
        rewrites[id(n)] = b.nodes
    _replace(graph, rewrites)
    return graph


def conv_transpose_to_conv(graph: Graph) -> Graph:
    rewrites = {}
    for n in graph.nodes:
        if n.op_type != "ConvTranspose":
            continue
        x, w = graph.values[n.inputs[0]], graph.values[n.inputs[1]]
        bias = graph.values[n.inputs[2]] if len(n.inputs) > 2 and n.inputs[2] else None
        if len(x.shape) != 4 or w.const is None or (bias is not None and bias.const is None):
            continue
        strides, dil, begin, out = conv_transpose_geometry(n, x.shape, w.shape)
        if dil != (1, 1) or strides[0] != strides[1] or min(begin) < 0:
            continue
        b = NodeBuilder(graph, n)
        s = strides[0]
        groups = int(n.attrs.get("group", 1))
        weight, taps = phase_weights(w.const, s, groups)
        inputs = [n.inputs[0], b.const("weight", weight)]
        if bias is not None:
            inputs.append(b.const("bias", np.repeat(bias.const, s * s)))
        last = n.outputs[0]
        attrs = {"kernel_shape": list(taps), "group": groups}
        ends = [out[d] - x.shape[2 + d] - (taps[d] - 1 - begin[d]) + taps[d] - 1 for d in range(2)]
        if s == 1 and max(begin) <= min(taps) - 1 and min(ends) >= 0:
            # the flipped kernel's correlation, its padding the crop: no phases, no slice
            b.emit("Conv", inputs, {**attrs, "pads": [taps[0] - 1 - begin[0], taps[1] - 1 - begin[1], *ends]}, last)
            rewrites[id(n)] = b.nodes
            continue
        # rows m of each phase reach output row s·m + phase - begin: enough of them for the crop
        rows = [max(0, -(-(b0 + o) // s) - i) for b0, o, i in zip(begin, out, x.shape[2:])]
        z = b.emit("Conv", inputs, {**attrs, "pads": [taps[0] - 1, taps[1] - 1, rows[0], rows[1]]})
        full = graph.values[z].shape[2:]
        crop = [b0 != 0 or b0 + o != f * s for b0, o, f in zip(begin, out, full)]
        if s > 1:
            z = b.emit("DepthToSpace", [z], {"blocksize": s, "mode": "CRD"}, None if any(crop) else last)
        if any(crop):
            b.slice(z, list(begin), [b0 + o for b0, o in zip(begin, out)], [2, 3], last)
        elif s == 1:
            b.nodes[-1].outputs = [last]
            graph.values.pop(z)
        rewrites[id(n)] = b.nodes
    _replace(graph, rewrites)
    return graph


def phase_weights(w: np.ndarray, s: int, groups: int) -> tuple:
    """A ConvTranspose weight [C, F/g, KH, KW] as a Conv weight [F·s², C/g, JH, JW] (J = ceil(K/s))
    computing the s² output phases: output channel f·s² + rh·s + rw is the phase (rh, rw) of
    channel f, its tap (th, tw) the transposed kernel's tap (rh + s·(JH-1-th), rw + s·(JW-1-tw)),
    zero past the kernel. Returns (weight, (JH, JW))."""
    C, Fg, KH, KW = w.shape
    Cg, F = C // groups, Fg * groups
    JH, JW = -(-KH // s), -(-KW // s)
    by_group = w.reshape(groups, Cg, Fg, KH, KW).transpose(0, 2, 1, 3, 4)    # [g, F/g, C/g, KH, KW]
    out = np.zeros((F, s, s, Cg, JH, JW), w.dtype)
    for rh in range(s):
        for rw in range(s):
            for th in range(JH):
                for tw in range(JW):
                    kh, kw = rh + s * (JH - 1 - th), rw + s * (JW - 1 - tw)
                    if kh < KH and kw < KW:
                        out[:, rh, rw, :, th, tw] = by_group[..., kh, kw].reshape(F, Cg)
    return np.ascontiguousarray(out.reshape(F * s * s, Cg, JH, JW)), (JH, JW)


def matmul_form(spec):
    """(batch, m, n, k) labels when a two-operand Einsum is a batched matrix product up to
    transposes: every label in both operands (batch if kept, k if summed, at least one summed)
    or in one operand and the output (m, n), each once per operand; else None."""
    if len(spec.inputs) != 2:
        return None
    a, b = spec.inputs
    if len(set(a)) != len(a) or len(set(b)) != len(b):
        return None     # a diagonal
    out = spec.output
    batch = [lab for lab in out if lab in a and lab in b]
    m = [lab for lab in out if lab in a and lab not in b]
    n = [lab for lab in out if lab in b and lab not in a]
    k = [lab for lab in a if lab in b and lab not in out]
    if len(batch) + len(m) + len(n) != len(out) or len(batch) + len(m) + len(k) != len(a) \
            or len(batch) + len(n) + len(k) != len(b):
        return None     # a label summed over one operand only
    if not k:
        return None     # nothing summed: an outer or elementwise product, no matrix product
    return batch, m, n, k


def einsum_to_matmul(graph: Graph) -> Graph:
    rewrites = {}
    for n in graph.nodes:
        if n.op_type != "Einsum" or len(n.inputs) != 2:
            continue
        va, vb = graph.values[n.inputs[0]], graph.values[n.inputs[1]]
        if va.dtype not in ("float32", "float64") or va.dtype != vb.dtype:
            continue
        spec = parse(n, [va.shape, vb.shape])
        form = matmul_form(spec)
        if form is None:
            continue
        labels_a, labels_b = spec.inputs
        if any(s != spec.sizes[lab] for labels, v in ((labels_a, va), (labels_b, vb))
               for lab, s in zip(labels, v.shape)):
            continue    # a size-1 axis broadcast against a larger one
        batch, m, nn, k = form
        size = spec.sizes
        b = NodeBuilder(graph, n)
        a2 = b.transpose(n.inputs[0], [labels_a.index(lab) for lab in batch + m + k])
        b2 = b.transpose(n.inputs[1], [labels_b.index(lab) for lab in batch + k + nn])
        bshape = tuple(size[lab] for lab in batch)
        M, N, K = (math.prod(size[lab] for lab in group) for group in (m, nn, k))
        a3 = b.reshape(a2, bshape + (M, K))
        b3 = b.reshape(b2, bshape + (K, N))
        prod = b.value("matmul", bshape + (M, N), va.dtype)
        b.nodes.append(Node("MatMul", b.name("matmul"), [a3, b3], [prod]))
        order = batch + m + nn
        unflat = tuple(size[lab] for lab in order)
        perm = [order.index(lab) for lab in spec.output]
        out = n.outputs[0]
        if perm == list(range(len(perm))):
            if unflat == bshape + (M, N):
                b.nodes[-1].outputs = [out]
                graph.values.pop(prod)
            else:
                b.reshape(prod, unflat, out=out)
        else:
            b.transpose(b.reshape(prod, unflat), perm, out=out)
        rewrites[id(n)] = b.nodes
    _replace(graph, rewrites)
    return graph


__all__ = ["canonicalize", "constant_dropout_masks", "resize_constant_inputs", "flatten_norm_spatial",
           "conv_transpose_to_conv", "phase_weights", "einsum_to_matmul", "matmul_form"]
