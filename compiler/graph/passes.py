"""Graph → graph passes run after import: constant folding, BatchNormalization folding, dead code.

Each pass is a small function of the graph (changed in place and returned):
- fold_constants: a node whose inputs are all constants is computed at compile time, and so are
  Shape and Size of any value (shapes are static), so the Shape → Gather → Unsqueeze → Concat →
  Reshape chains exported transformers carry disappear and the Reshape sees a constant shape.
- split_to_slices: a Split becomes one Slice per output (fusion takes one-output nodes).
- fold_pad_into_conv: a zero Pad of the rows and columns that only convolutions read becomes
  part of their padding (TensorFlow exports, and torch's ZeroPad2d, write it as its own node).
- fold_batch_norm: a BatchNormalization reading a convolution's only output with constant
  weights becomes part of that convolution (weights scaled per output channel, shift added to
  the bias); any other one becomes x · scale + shift, two broadcast nodes that fuse like any
  epilogue.
- transpose_gemm_weights: a linear layer's constant [out, in] weight laid out [in, out].
- eliminate_dead_nodes: nodes nothing reads on the way to the outputs.
- prepack_conv_weights (at build, for a target): constant convolution weights in the blocked
  layout the target's channel-vector schedule would pack them into on every call.
- prepack_matmul_weights (at build, for a target): a MatMul's constant B in the column panels
  the target's GEMM schedule would copy it into on every call.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .canonical_ops import canonicalize
from .errors import ShapeError
from .ir import Graph, Node, Value
from .ops import OPS
from .ops.elementwise import bn_scale_shift
from .ops.shape import shape_value, split_sizes

STATIC_FOLD = ("Shape", "Size")


def simplify(graph: Graph) -> Graph:
    fold_constants(graph)
    split_to_slices(graph)
    fold_pad_into_conv(graph)
    fold_batch_norm(graph)
    transpose_gemm_weights(graph)
    eliminate_dead_nodes(graph)
    canonicalize(graph)
    eliminate_dead_nodes(graph)   # what a rewrite left unread (grouped_heads' expanded copies)
    return graph


def split_to_slices(graph: Graph) -> Graph:
    """Each output of a Split becomes a Slice of its own (a one-output node, which fusion needs:
    a transformer's fused QKV projection is split three ways, each part read by other nodes)."""
    kept = []
    for n in graph.nodes:
        if n.op_type != "Split":
            kept.append(n)
            continue
        ins = [graph.values[i] if i else None for i in n.inputs]
        axis, sizes = split_sizes(n, ins, graph.opset)
        start = 0
        for out, size in zip(n.outputs, sizes):
            if out:
                names = []
                for what, v in (("starts", start), ("ends", start + size), ("axes", axis)):
                    name = f"{n.name}/{out}/{what}"
                    graph.values[name] = Value(name, (1,), "int64", np.array([v], np.int64))
                    names.append(name)
                kept.append(Node("Slice", f"{n.name}/{out}", [n.inputs[0], *names], [out]))
            start += size
    graph.nodes = kept
    return graph


def prepack_conv_weights(graph: Graph, target) -> Graph:
    """A copy of `graph` whose convolutions with constant weights read them packed in blocks of
    output channels ([F/FB, C, KH, KW, FB], conv2d_nchw_packed), where the target's default
    schedule vectorizes over output channels (schedule_conv_nchw_channels), with that
    schedule's FB: the schedule would otherwise copy the weights into that layout on every call
    (9.4 MB per 512-channel 3x3 layer; those layers ran at half the speed of the others). The
    fused workloads, and so their keys, then depend on the target's channel block."""
    from ..ops import get_op
    from ..ops.functions import pack_conv_weight
    from ..ops.schedule_conv import channel_tile, channel_vectors_pay
    from .ops.nn import window_geometry
    out = Graph(dict(graph.values), [replace(n) for n in graph.nodes], list(graph.inputs), list(graph.outputs),
                graph.opset, graph.name)
    for n in out.nodes:
        if n.op_type != "Conv" or "weight_block" in n.attrs:
            continue
        x, w = out.values[n.inputs[0]], out.values[n.inputs[1]]
        if w.const is None or x.dtype != "float32" or len(w.shape) != 4:
            continue
        dil = tuple(n.attrs.get("dilations") or (1, 1))
        strides, pads, _ = window_geometry(n, x.shape[2:], w.shape[2:], dil)
        N, C, H, W = x.shape
        F, _, KH, KW = w.shape
        view = get_op("conv2d_nchw", N=N, C=C, H=H, W=W, F=F, KH=KH, KW=KW, stride=strides, padding=pads,
                      dilation=dil, groups=int(n.attrs.get("group", 1)))
        if not channel_vectors_pay(view, target):
            continue
        fb = channel_tile(view, target)[0]
        name = f"{n.inputs[1]}/packed{fb}"
        if name not in out.values:
            packed = pack_conv_weight(w.const, fb)
            out.values[name] = Value(name, tuple(packed.shape), w.dtype, packed)
        n.inputs = [n.inputs[0], name, *n.inputs[2:]]
        n.attrs = {**n.attrs, "weight_block": fb}
    return out


def prepack_matmul_weights(graph: Graph, target) -> Graph:
    """A copy of `graph` whose MatMuls (and Gemms, their B already [K, N]) with a constant 2-d B
    read it in column panels [N/NB, K, NB] (zero-padded to whole panels). Two cases, both a
    layout the default schedule would otherwise read badly:
    - more than one row: NB the columns of the target's GEMM register tile. Where several row
      tiles share a panel, schedule_gemm copied B into that layout on every call: 9.4 MB for each
      of BERT's FFN layers, a fifth of their time. Where one row tile reads each panel once (a
      decode step of batch 2-6), B in place gave each k step the tile's columns of a row N floats
      long, lines a page apart that no prefetcher follows: 4 x 2048 x 5632 streamed 8 GB/s in
      place, 16-20 in panels (bench/matmul_spellings.py, 0.41-0.45x -> 1.07-1.11x onnxruntime;
      Zen 3, 2 threads);
    - one row (a batch-1 layer, schedule_gemv): NB the columns each core streams, so a core's
      part of B is one contiguous block. In place, a core read half of every row of a 512-wide
      B, lines whose address bit 10 is always the same: half of the L2's sets, and an MLP's
      784-512-512 weights (2.6 MB, 1.3 MB a core) no longer stayed in the 2 MB L2 between calls
      (in a model run 25 + 17 us for the two layers against 11 + 7 us each alone).
    The workloads' keys then depend on NB."""
    import math

    from ..ops.schedule_gemm import gemm_tile, gemv_panel_columns
    from .workloads import shared_b_rows
    out = Graph(dict(graph.values), [replace(n) for n in graph.nodes], list(graph.inputs), list(graph.outputs),
                graph.opset, graph.name)
    for n in out.nodes:
        if n.op_type not in ("MatMul", "Gemm") or "weight_block" in n.attrs:
            continue
        if n.op_type == "Gemm" and (int(n.attrs.get("transA", 0)) or int(n.attrs.get("transB", 0))):
            continue
        a, b = out.values[n.inputs[0]], out.values[n.inputs[1]]
        if b.const is None or len(b.shape) != 2 or len(a.shape) < 2 or b.dtype != "float32" or a.dtype != b.dtype:
            continue
        K, N = b.shape
        lanes = target.vector_lanes(b.dtype)
        rows = math.prod(a.shape[:-1])
        # a batch of A sharing B is one product of all its rows (workloads.row_view)
        M = a.shape[-2] if shared_b_rows(a.shape, b.shape) is None else rows
        _, nb = gemm_tile(M, N, lanes, target.capabilities.vector_registers,
                           fmas_per_cycle=target.capabilities.fmas_per_cycle)
        if rows == 1:
            nb = gemv_panel_columns(K, N, lanes, target.num_cores)
            if nb is None:
                continue
        name = f"{n.inputs[1]}/panels{nb}"
        if name not in out.values:
            panels = pack_matmul_weight(b.const, nb)
            out.values[name] = Value(name, tuple(panels.shape), b.dtype, panels)
        n.inputs = [n.inputs[0], name, *n.inputs[2:]]
        n.attrs = {**n.attrs, "weight_block": nb, "weight_columns": N}
    return out


def pack_matmul_weight(b: np.ndarray, block: int) -> np.ndarray:
    """B [K, N] as column panels [ceil(N/block), K, block], the columns past N zero."""
    K, N = b.shape
    panels = -(-N // block)
    padded = np.zeros((K, panels * block), b.dtype)
    padded[:, :N] = b
    return np.ascontiguousarray(padded.reshape(K, panels, block).transpose(1, 0, 2))


def transpose_gemm_weights(graph: Graph) -> Graph:
    """Gemm(transB=1) with a constant B (a linear layer's [out, in] weight) reads B.T, laid out
    [in, out] once at compile time: the product's vector of output columns is then unit-stride in
    the weight, so a batch-1 layer can read it in place instead of packing it on every call."""
    for n in graph.nodes:
        if n.op_type != "Gemm" or not int(n.attrs.get("transB", 0)):
            continue
        b = graph.values[n.inputs[1]]
        if b.const is None:
            continue
        name = f"{n.inputs[1]}/transposed"
        if name not in graph.values:
            graph.values[name] = Value(name, b.shape[::-1], b.dtype, np.array(b.const.T, order="C"))
        n.inputs = [n.inputs[0], name, *n.inputs[2:]]
        n.attrs = {**n.attrs, "transB": 0}
    return graph


def fold_constants(graph: Graph) -> Graph:
    """Drop the nodes whose outputs are all constants (computing them first if need be)."""
    kept = []
    for n in graph.nodes:
        if not fold_node(graph, n):
            kept.append(n)
    graph.nodes = kept
    return graph


def fold_node(graph: Graph, n: Node) -> bool:
    """Give n's outputs their constant values when they are known at compile time; True if so.
    Shape inference calls it node by node, since a later node's shape may need the value."""
    if all(graph.values[o].const is not None for o in n.outputs if o):
        return True
    outs = _fold(graph, n)
    if outs is None:
        return False
    for name, arr in zip(n.outputs, outs):
        if not name:
            continue
        v = graph.values[name]
        arr = np.asarray(arr)
        if tuple(arr.shape) != v.shape:
            raise ShapeError(f"{n.op_type} node {n.name!r}: folded to shape {arr.shape}, inferred {v.shape}")
        graph.values[name] = Value(name, v.shape, v.dtype, np.array(arr, dtype=v.dtype, order="C"))
    return True


def _fold(graph: Graph, n: Node):
    if n.op_type in STATIC_FOLD:
        return [shape_value(n, graph.values[n.inputs[0]])]
    spec = OPS[n.op_type]
    if spec.fold is None:
        return None
    ins = [graph.values[i] if i else None for i in n.inputs]
    if any(v is not None and v.const is None for v in ins):
        return None
    return spec.fold(n, [None if v is None else v.const for v in ins], graph.opset)


def fold_pad_into_conv(graph: Graph) -> Graph:
    """A constant Pad with value 0 of the rows and columns of 4-d data, read only by Conv nodes
    (not a graph output): each Conv reads the Pad's input with the Pad's amounts added to its
    own padding (auto_pad resolved first), and the Pad goes. Anything else (a non-zero or
    computed value, channel or batch padding, another reader) keeps the Pad."""
    from .ops.nn import window_geometry
    users = graph.consumers()
    for n in graph.nodes:
        found = spatial_constant_pads(graph, n)
        if found is None or found[1] != 0.0 or n.outputs[0] in graph.outputs:
            continue
        amounts = found[0]
        readers = users.get(n.outputs[0], [])
        if not readers or any(r.op_type != "Conv" or r.inputs[0] != n.outputs[0] or n.outputs[0] in r.inputs[1:]
                              for r in readers):
            continue
        padded = graph.values[n.outputs[0]].shape
        for conv in readers:
            w = graph.values[conv.inputs[1]]
            if len(w.shape) != 4:
                break
            dil = tuple(conv.attrs.get("dilations") or (1, 1))
            _, pads, _ = window_geometry(conv, padded[2:], w.shape[2:], dil)
            conv.attrs = {**{k: v for k, v in conv.attrs.items() if k != "auto_pad"},
                          "pads": [p + a for p, a in zip(pads, amounts)]}
            conv.inputs = [n.inputs[0], *conv.inputs[1:]]
    return eliminate_dead_nodes(graph)


def spatial_constant_pads(graph: Graph, n: Node) -> tuple | None:
    """((top, left, bottom, right), value) of a Pad node that pads only the rows and columns of
    4-d data with a constant known at compile time; None for anything else (another mode, batch
    or channel padding, an axes input, computed pads or value)."""
    if n.op_type != "Pad" or n.attrs.get("mode", "constant") != "constant" or len(graph.values[n.inputs[0]].shape) != 4:
        return None
    if graph.opset < 11:
        pads, value = n.attrs.get("pads"), float(n.attrs.get("value", 0.0))
    else:
        if len(n.inputs) < 2 or not n.inputs[1] or graph.values[n.inputs[1]].const is None:
            return None
        if len(n.inputs) > 3 and n.inputs[3]:
            return None   # an axes input
        pads = [int(p) for p in graph.values[n.inputs[1]].const.reshape(-1)]
        value = 0.0
        if len(n.inputs) > 2 and n.inputs[2]:
            c = graph.values[n.inputs[2]].const
            if c is None:
                return None
            value = float(c.reshape(-1)[0])
    if pads is None or len(pads) != 8 or any(pads[i] for i in (0, 1, 4, 5)) or min(pads) < 0:
        return None
    return (int(pads[2]), int(pads[3]), int(pads[6]), int(pads[7])), value


def fold_batch_norm(graph: Graph) -> Graph:
    producer, users = graph.producer(), graph.consumers()
    kept, counter = [], 0
    for n in graph.nodes:
        if n.op_type != "BatchNormalization":
            kept.append(n)
            continue
        ins = [graph.values[i] if i else None for i in n.inputs]
        scale, shift = bn_scale_shift(n, ins)
        conv = producer.get(n.inputs[0])
        if conv is not None and _foldable_conv(graph, conv, n, users):
            _fold_into_conv(graph, conv, n, scale, shift)
            continue
        # x · scale + shift, the vectors shaped to broadcast along axis 1
        x = graph.values[n.inputs[0]]
        bshape = (x.shape[1],) + (1,) * (len(x.shape) - 2)
        counter += 1
        s_name, b_name, tmp = (f"{n.name}/{what}" for what in ("scale", "shift", "scaled"))
        graph.values[s_name] = Value(s_name, bshape, x.dtype, scale.astype(x.dtype).reshape(bshape))
        graph.values[b_name] = Value(b_name, bshape, x.dtype, shift.astype(x.dtype).reshape(bshape))
        graph.values[tmp] = Value(tmp, x.shape, x.dtype)
        kept.append(Node("Mul", f"{n.name}/mul", [n.inputs[0], s_name], [tmp]))
        kept.append(Node("Add", f"{n.name}/add", [tmp, b_name], [n.outputs[0]]))
    graph.nodes = kept
    return graph


def _foldable_conv(graph, conv, bn, users) -> bool:
    """Whether `bn` can become part of `conv`: a Conv (of a weight and maybe a bias, both
    constant) whose one output only the BatchNormalization reads. Anything else (a Concat, as in
    DenseNet, a pool, a Conv whose weight is computed) keeps the BatchNormalization."""
    if conv.op_type != "Conv" or len(conv.inputs) < 2 or len([o for o in conv.outputs if o]) != 1:
        return False
    out = conv.outputs[0]
    weight = graph.values.get(conv.inputs[1])
    bias = graph.values.get(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else None
    return (weight is not None and weight.const is not None and len(weight.shape) >= 1
            and (bias is None or bias.const is not None)
            and len(users.get(out, [])) == 1 and out not in graph.outputs)


def _fold_into_conv(graph, conv, bn, scale, shift):
    weight = graph.values[conv.inputs[1]]
    F = weight.shape[0]
    w = weight.const.astype(np.float64) * scale.reshape(F, 1, 1, 1)
    old_b = graph.values[conv.inputs[2]].const.astype(np.float64) if len(conv.inputs) > 2 and conv.inputs[2] else 0.0
    b = old_b * scale + shift
    w_name, b_name = f"{conv.name}/weight_bn", f"{conv.name}/bias_bn"
    graph.values[w_name] = Value(w_name, weight.shape, weight.dtype, np.array(w, dtype=weight.dtype, order="C"))
    graph.values[b_name] = Value(b_name, (F,), weight.dtype, b.astype(weight.dtype))
    conv.inputs = [conv.inputs[0], w_name, b_name]
    conv.outputs = [bn.outputs[0]]


def eliminate_dead_nodes(graph: Graph) -> Graph:
    needed = set(graph.outputs)
    kept = []
    for n in reversed(graph.nodes):
        if any(o in needed for o in n.outputs if o):
            kept.append(n)
            needed.update(i for i in n.inputs if i)
    graph.nodes = kept[::-1]
    return graph


__all__ = ["simplify", "fold_constants", "fold_pad_into_conv", "spatial_constant_pads", "fold_node", "transpose_gemm_weights",
           "prepack_conv_weights", "prepack_matmul_weights", "pack_matmul_weight", "fold_batch_norm",
           "eliminate_dead_nodes"]
