"""Layout propagation: a model's convolutions and what lies between them run channel-blocked.

The libraries compute convolutions on [N, C/B, H, W, B] blocks of B channels, B the vector
length (oneDNN's nChw16c, onnxruntime's NCHWc transformer, TVM's AlterOpLayout): a register
tile's channel vector is then one load and one store, a depthwise tap one unit-stride vector.
Per layer in NCHW, the channel-vector schedules copy the input into blocks and store each tile
transposed; MobileNetV2's depthwise layers spent most of their time in those copies. Here the
layout is chosen once per graph, so the copies happen only where the blocked region begins and
ends (MobileNetV2 0.56x -> 1.0-1.3x onnxruntime, ResNet-18 0.72x -> 0.78-0.87x, same runs on
Emerald Rapids, 2 threads; ResNet's stride-2 layers need no de-interleaving copy blocked, and its
max pool runs on whole vectors of channels: 0.15 ms against 0.4-0.5). A graph takes the layout
when at least MIN_CONVS of its convolutions can (a lone one would pay both border copies).

- every convolution with constant weights that is dense (one group), depthwise (a group per
  channel), grouped in whole blocks (each group's input and output channels a whole number
  of blocks) or grouped across blocks at a bounded cost (_group_window), whose output
  channels fill their blocks to at least 1/MAX_CHANNEL_PADDING, becomes a ConvNCHWc: weights
  packed [F/B, C, KH, KW, B] and the bias [F/B, B], both zero-padded to whole blocks, its
  output blocked. Its data is the blocked value when there is one, else a
  ToNCHWc copy of it, except for data of fewer channels than a block (an RGB image), which it
  reads as NCHW;
- a dense 3x3 stride-1 convolution of blocked data with channels and work enough
  (compiler.ops.winograd.winograd_tile) becomes the Winograd form instead: WinogradInputNCHWc,
  WinogradGemm (the weights transformed here) and WinogradOutputNCHWc, its output blocked;
- every other node whose input is blocked stays blocked when a rule of its kind allows, so
  the layout follows what the graph computes, not how an exporter spelled it:
  - MaxPool and AveragePool (MaxPoolNCHWc, AveragePoolNCHWc: the padding the lowest value, or
    zero with the count ONNX divides by), GlobalAveragePool and GlobalMaxPool (GlobalPoolNCHWc:
    the pooled [N, C/B, 1, 1, B] stays blocked for a squeeze-excite's 1x1 convolutions and its
    gate);
  - Concat along the channels: when every input's channels but the last one's fill whole
    blocks, the concatenated blocks are the blocks of the concatenation (DenseNet, Inception,
    ShuffleNet v1's 112 + 24 channels; placed in place by the memory plan); otherwise a
    ConcatNCHWc picks each output lane's channel from the part that holds it (ShuffleNet's
    136 + 136), one kernel instead of copies out of the layout and back;
  - constant Pad of the rows and columns only;
  - Identity, and Dropout whose mask is not read (an alias of the blocked value);
  - elementwise and broadcast nodes whose output has a blocked input's shape: the other inputs
    are blocked values (an [N, C, 1, 1] gate included), scalars, or constants broadcast against
    NCHW (a BatchNorm after a Concat left as a per-channel scale and shift), laid out blocked
    once at compile time; an NCHW activation of the same shape is copied in (ToNCHWc);
- any other reader of a blocked value gets it back as NCHW through a FromNCHWc (a Flatten, a
  Softmax, a Reshape, a graph output), made once per value.

Padding channels (24 channels in blocks of 16) start as zeros (zero weights, zero bias, zero
constants) and may become anything finite through the elementwise nodes kept in the layout
(ELEMENTWISE_SAFE: no division, logarithm or root, which could make them infinite; where the
channels fill whole blocks there is no padding and any elementwise node stays); every reader
multiplies them by a zero weight, pools them among themselves, or drops them.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..ops.functions import group_window_span, pack_conv_weight_nchwc, pack_group_window_weight
from ..ops.winograd import tile_grid, transform_weight, winograd_tile
from ..target import resolve_target
from .ir import Graph, Node, Value
from .ops import OPS, Kind
from .ops.layout import blocked_shape
from .ops.nn import pool_geometry, window_geometry
from .passes import spatial_constant_pads

# elementwise operators that keep finite inputs finite: kept in the blocked layout
# (Sum and Mean too: ShuffleNet's residual is a Sum over 136 channels, 8.5 blocks; left NCHW, each of
# its units paid three layout copies around it, 8% of the run)
ELEMENTWISE_SAFE = ("Relu", "Clip", "Add", "Sub", "Mul", "Sum", "Mean", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid",
                    "HardSwish", "Neg", "Abs", "PRelu", "Elu", "Selu", "Celu", "Softsign", "Max", "Min", "Erf", "Gelu",
                    "Floor", "Ceil", "Round", "Sign", "ThresholdedRelu", "Sin", "Cos")
# broadcast operators the blocked layout leaves NCHW: their lowering reads the channel axis by
# position (BatchNormalization) or takes a 4-d shape as an input (Expand)
CHANNEL_AWARE = ("BatchNormalization", "Expand")
MIN_BLOCK = 4
MIN_CONVS = 2   # a lone convolution would pay both border copies for nothing
MAX_CHANNEL_PADDING = 1.5   # padded / real output channels of a convolution that goes blocked
MAX_PADDED_WORK = 1 << 16   # multiply-adds of padding channels a conv of blocked data may add (_convertible)
MAX_GROUP_WINDOW = 2.5      # a group window's input channels / the group's own (_group_window)


def propagate_blocked_layout(graph: Graph, target) -> Graph:
    """A copy of `graph` whose convolutions run channel-blocked (see the module docstring), for
    `target`'s float32 vector length; the graph itself when the target has no vectors or fewer
    than MIN_CONVS convolutions can go blocked."""
    target = resolve_target(target)
    block = target.vector_lanes("float32")
    if block < MIN_BLOCK or sum(1 for n in graph.nodes if _convertible(graph, n, block)) < MIN_CONVS:
        return graph
    return _Rewrite(graph, block).run()


def _convertible(graph: Graph, n: Node, block: int, data_blocked: bool = False) -> bool:
    """A dense or depthwise Conv with constant weights whose output channels fill their blocks
    to at least 1/MAX_CHANNEL_PADDING (24 channels in blocks of 16 do; 4 would compute 16), or,
    when its data is blocked already (`data_blocked`), whose padding channels add at most
    MAX_PADDED_WORK multiply-adds: a squeeze-excite's 480 -> 20 channel 1x1 convolution of a
    pooled pixel then stays in the layout instead of paying two copies and a kernel each way."""
    if n.op_type != "Conv" or "weight_block" in n.attrs or len(n.inputs) < 2:
        return False
    x, w = graph.values[n.inputs[0]], graph.values[n.inputs[1]]
    if w.const is None or x.dtype != "float32" or len(x.shape) != 4 or len(w.shape) != 4:
        return False
    if len(n.inputs) > 2 and n.inputs[2] and graph.values[n.inputs[2]].const is None:
        return False
    groups = int(n.attrs.get("group", 1))
    C, F = x.shape[1], w.shape[0]
    padded = -(-F // block) * block
    if padded > MAX_CHANNEL_PADDING * F:
        extra = (padded - F) * w.shape[1] * w.shape[2] * w.shape[3] * x.shape[0] * x.shape[2] * x.shape[3]
        if not data_blocked or extra > MAX_PADDED_WORK:
            return False
    return (groups == 1 or (groups == C == F and w.shape[1] == 1) or _whole_block_groups(C, F, groups, block)
            or _group_window(C, F, groups, block) is not None)


def _group_window(C: int, F: int, groups: int, block: int) -> tuple | None:
    """conv2d_nchwc's `group_window` (output, input channels per group, groups) for a grouped
    convolution whose groups split channel blocks, when the channels its output blocks reduce
    over (the groups of each block's lanes, group_window_span) cost at most MAX_GROUP_WINDOW
    times the group's own reduction; else None (the convolution stays NCHW). ShuffleNet v1's 4
    groups of 34 channels in blocks of 16: a block of one group reduces over its 34 channels, a
    block across two over 68, 1.33x on average; blocked, those layers need no copies around
    them, and the NCHW schedule ran them at 38-74 GFLOPS (7 of 16 lanes on 7-wide rows)."""
    if groups < 2 or C % groups or F % groups or C < block:
        return None
    cpg, fpg, blocks = C // groups, F // groups, -(-F // block)
    reduced = sum(group_window_span(fo, block, fpg, cpg, groups)[1] for fo in range(blocks))
    return (fpg, cpg, groups) if reduced <= MAX_GROUP_WINDOW * cpg * blocks else None


def _whole_block_groups(C: int, F: int, groups: int, block: int) -> bool:
    """A grouped convolution whose every group reads and writes whole channel blocks (AlexNet's
    two groups of 48 channels, ResNeXt's wide groups): blocked, each output block reads its
    group's input blocks."""
    return groups > 1 and C % groups == 0 and F % groups == 0 and (C // groups) % block == 0 and (F // groups) % block == 0


class _Rewrite:
    def __init__(self, graph: Graph, block: int):
        self.g = Graph(dict(graph.values), [], list(graph.inputs), list(graph.outputs), graph.opset, graph.name)
        self.source = graph
        self.block = block
        self.blocked: dict = {}     # value name -> the name of its blocked form
        self.plain: set = set(graph.inputs) | {v for v, val in graph.values.items() if val.const is not None}
        self.read: set = set(graph.outputs) | {i for n in graph.nodes for i in n.inputs if i}

    def run(self) -> Graph:
        for n in self.source.nodes:
            if _convertible(self.source, n, self.block, data_blocked=bool(n.inputs) and n.inputs[0] in self.blocked):
                self._conv(n)
            elif not self._blocked_rule(n):
                node = replace(n, inputs=[self._plain(i) if i else i for i in n.inputs])
                self.g.nodes.append(node)
                self.plain.update(node.outputs)
        for v in self.g.outputs:
            self._plain(v)
        return self.g

    def _blocked_rule(self, n: Node) -> bool:
        """Rewrite `n` in the blocked layout when a rule of its op kind allows; False if none does
        (the caller then keeps it NCHW, its blocked inputs converted back)."""
        if n.op_type in ("Identity", "Dropout") and n.inputs and n.inputs[0] in self.blocked:
            return self._pass_through(n)
        outs = [o for o in n.outputs if o]
        if len(outs) != 1 or not any(i in self.blocked for i in n.inputs if i):
            return False
        if n.op_type in ("MaxPool", "AveragePool"):
            return self._pool(n)
        if n.op_type in ("GlobalAveragePool", "GlobalMaxPool"):
            return self._global_pool(n)
        if n.op_type == "Concat":
            return self._concat(n)
        if n.op_type == "Pad":
            return self._pad(n)
        if OPS[n.op_type].kind <= Kind.BROADCAST and n.op_type not in CHANNEL_AWARE:
            return self._elementwise(n)
        return False

    # ------------------------------------------------------------------ values in either layout

    def _value(self, name: str, shape: tuple, dtype: str, const=None) -> str:
        self.g.values[name] = Value(name, tuple(shape), dtype, const)
        return name

    def _blocked_of(self, v: str) -> str:
        """The blocked form of value v, a ToNCHWc copy made the first time it is needed."""
        if v not in self.blocked:
            val = self.g.values[v]
            name = self._value(f"{v}/nchw{self.block}c", blocked_shape(val.shape, self.block), val.dtype)
            self.g.nodes.append(Node("ToNCHWc", f"{v}/to_nchw{self.block}c", [v], [name], {"block": self.block}))
            self.blocked[v] = name
        return self.blocked[v]

    def _plain(self, v: str) -> str:
        """Value v as NCHW: itself, made by a FromNCHWc of its blocked form the first time."""
        if v in self.plain or v not in self.blocked:
            return v
        self.g.nodes.append(Node("FromNCHWc", f"{v}/from_nchwc", [self.blocked[v]], [v],
                                 {"channels": self.source.values[v].shape[1]}))
        self.plain.add(v)
        return v

    # ------------------------------------------------------------------ nodes

    def _pass_through(self, n: Node) -> bool:
        """Identity, and Dropout at inference whose mask nobody reads: the blocked value passes
        through (an alias, no kernel); SqueezeNet's and GoogLeNet's Dropout before their last
        layers otherwise cost a copy out of the layout and one back."""
        if any(o and o in self.read for o in n.outputs[1:]) or (len(n.inputs) > 2 and n.inputs[2]):
            return False   # a mask someone reads, or a training_mode input: the NCHW node decides
        data = self.g.values[self.blocked[n.inputs[0]]]
        self._emit(n, "Identity", [data.name], data.shape, data.dtype, {})
        return True

    def _conv(self, n: Node):
        B = self.block
        x, w = self.source.values[n.inputs[0]], self.source.values[n.inputs[1]]
        N, C, H, W = x.shape
        F, _, KH, KW = w.shape
        groups = int(n.attrs.get("group", 1))
        window = None if groups == 1 or _whole_block_groups(C, F, groups, B) else _group_window(C, F, groups, B)
        depthwise = groups != 1 and window is None and not _whole_block_groups(C, F, groups, B)
        blocked_data = n.inputs[0] in self.blocked or C >= B or groups != 1
        if blocked_data:
            data = self._blocked_of(n.inputs[0])
            cin = -(-C // B) * B if groups == 1 else w.shape[1]
        else:   # fewer channels than a block (an RGB image): read as NCHW
            data = self._plain(n.inputs[0])
            cin = C
        fout = -(-F // B) * B
        dil = tuple(n.attrs.get("dilations") or (1, 1))
        strides, pads, (OH, OW) = window_geometry(n, (H, W), (KH, KW), dil)
        if blocked_data and not depthwise and window is None:
            m = winograd_tile(C, F, (KH, KW), strides, dil, groups, (OH, OW), N)
            if m:
                return self._winograd(n, data, cin, fout, pads, (OH, OW), m)
        attrs: dict = {}
        if window is not None:
            packed = pack_group_window_weight(np.asarray(w.const, np.float32), groups, B)
            attrs["group_window"] = window
        else:
            weight = np.zeros((fout, 1 if depthwise else cin, KH, KW), np.float32)
            weight[:F, :w.shape[1]] = w.const
            packed = pack_conv_weight_nchwc(weight, B, B if blocked_data and not depthwise else 0)
        wname = f"{n.inputs[1]}/nchw{B}c" + ("" if blocked_data else "/nchw_data")   # one weight, two readers
        inputs = [data, self._value(wname, packed.shape, "float32", packed)]
        if len(n.inputs) > 2 and n.inputs[2]:
            bias = np.zeros(fout, np.float32)
            bias[:F] = self.source.values[n.inputs[2]].const
            inputs.append(self._value(f"{n.inputs[2]}/nchw{B}c", (fout // B, B), "float32", bias.reshape(-1, B)))
        out = n.outputs[0]
        name = self._value(f"{out}/nchw{B}c", (N, fout // B, OH, OW, B), "float32")
        self.g.nodes.append(Node("ConvNCHWc", n.name, inputs, [name],
                                 {"strides": strides, "pads": pads, "dilations": dil, "depthwise": int(depthwise),
                                  **attrs}))
        self.blocked[out] = name

    def _winograd(self, n: Node, data: str, cin: int, fout: int, pads: tuple, out_hw: tuple, m: int):
        """The convolution as WinogradInputNCHWc -> WinogradGemm -> WinogradOutputNCHWc (see
        compiler.ops.winograd), its weights transformed here, its bias added by the output
        transform."""
        B = self.block
        w = self.source.values[n.inputs[1]]
        weight = np.zeros((fout, cin, 3, 3), np.float32)
        weight[:w.shape[0], :w.shape[1]] = w.const
        u = transform_weight(weight, m, B)
        out = n.outputs[0]
        N, a = self._logical(n.inputs[0])[0], m + 2
        TH, TW = tile_grid(out_hw, m)
        V = self._value(f"{out}/winograd_input", (a, a, cin // B, N * TH * TW, B), "float32")
        self.g.nodes.append(Node("WinogradInputNCHWc", n.name, [data], [V], {"pads": pads, "tile": m}))
        M = self._value(f"{out}/winograd_products", (a, a, fout // B, N * TH * TW, B), "float32")
        U = self._value(f"{n.inputs[1]}/winograd{m}_nchw{B}c", u.shape, "float32", u)
        self.g.nodes.append(Node("WinogradGemm", n.name, [V, U], [M], {}))
        inputs = [M]
        if len(n.inputs) > 2 and n.inputs[2]:
            bias = np.zeros(fout, np.float32)
            bias[:w.shape[0]] = self.source.values[n.inputs[2]].const
            inputs.append(self._value(f"{n.inputs[2]}/nchw{B}c", (fout // B, B), "float32", bias.reshape(-1, B)))
        name = self._value(f"{out}/nchw{B}c", (N, fout // B, *out_hw, B), "float32")
        self.g.nodes.append(Node("WinogradOutputNCHWc", n.name, inputs, [name], {"out_hw": tuple(out_hw), "tile": m}))
        self.blocked[out] = name

    def _logical(self, v: str) -> tuple:
        return self.source.values[v].shape

    def _pool(self, n: Node) -> bool:
        x = self._logical(n.inputs[0])
        if len(x) != 4:
            return False
        kernel, strides, pads, (OH, OW) = pool_geometry(n, x)
        data = self.g.values[self.blocked[n.inputs[0]]]
        attrs = {"kernel": kernel, "strides": strides, "pads": pads}
        op = "MaxPoolNCHWc"
        if n.op_type == "AveragePool":
            if data.dtype not in ("float32", "float64"):
                return False
            op = "AveragePoolNCHWc"
            attrs["count_include_pad"] = int(n.attrs.get("count_include_pad", 0))
            attrs["in_hw"] = tuple(x[2:])
        self._emit(n, op, [data.name], (data.shape[0], data.shape[1], OH, OW, self.block), data.dtype, attrs)
        return True

    def _global_pool(self, n: Node) -> bool:
        data = self.g.values[self.blocked[n.inputs[0]]]
        mode = "avg" if n.op_type == "GlobalAveragePool" else "max"
        if mode == "avg" and data.dtype not in ("float32", "float64"):
            return False
        N, CB, _, _, B = data.shape
        self._emit(n, "GlobalPoolNCHWc", [data.name], (N, CB, 1, 1, B), data.dtype, {"mode": mode})
        return True

    def _concat(self, n: Node) -> bool:
        """Concat along channels of 4-d values. Where every input but the last fills whole
        blocks, the blocked concat is the concat of the blocks, the last input's padding
        channels the output's (finite, as every value's padding is): ShuffleNet v1's 112 + 24
        channels. Otherwise a ConcatNCHWc reads each lane from its part (136 + 136): one
        gathering kernel, where NCHW it was copies out of the layout, the concat, and a copy back."""
        shapes = [self._logical(i) for i in n.inputs]
        if any(len(s) != 4 for s in shapes) or int(n.attrs.get("axis", 0)) % 4 != 1:
            return False
        inputs = [self._blocked_of(i) for i in n.inputs]
        out = self._logical(n.outputs[0])
        dtype = self.source.values[n.outputs[0]].dtype
        if any(s[1] % self.block for s in shapes[:-1]):   # a part ends inside a block
            self._emit(n, "ConcatNCHWc", inputs, blocked_shape(out, self.block), dtype,
                       {"channels": [s[1] for s in shapes]})
        else:
            self._emit(n, "Concat", inputs, blocked_shape(out, self.block), dtype, {"axis": 1})
        return True

    def _pad(self, n: Node) -> bool:
        """Constant padding of the spatial axes only (the channel padding stays what it was)."""
        found = spatial_constant_pads(self.g, n)
        if found is None:
            return False
        (top, left, bottom, right), value = found
        if value != 0.0 and self._logical(n.inputs[0])[1] % self.block:
            return False   # the padding channels would take a non-zero value
        data = self.g.values[self.blocked[n.inputs[0]]]
        blocked_pads = [0, 0, top, left, 0, 0, 0, bottom, right, 0]
        shape = (data.shape[0], data.shape[1], data.shape[2] + top + bottom, data.shape[3] + left + right, self.block)
        if self.g.opset < 11:   # the pads and the value are attributes
            self._emit(n, "Pad", [data.name], shape, data.dtype, {"mode": "constant", "pads": blocked_pads, "value": value})
            return True
        pname = self._value(f"{n.name}/pads_nchw{self.block}c", (10,), "int64", np.array(blocked_pads, np.int64))
        vname = self._value(f"{n.name}/value_nchw{self.block}c", (1,), data.dtype, np.array([value], data.dtype))
        self._emit(n, "Pad", [data.name, pname, vname], shape, data.dtype, {"mode": "constant"})
        return True

    def _elementwise(self, n: Node) -> bool:
        """An elementwise or broadcast node whose output is a blocked 4-d value's shape: every
        input is then blocked (a ToNCHWc copy for an NCHW activation of the output's channels),
        a constant laid out blocked once, at compile time, or a scalar. Operators that could make
        a padding channel infinite stay NCHW where the channels do not fill whole blocks."""
        out = self._logical(n.outputs[0])
        if len(out) != 4 or (out[1] % self.block and n.op_type not in ELEMENTWISE_SAFE):
            return False
        if not any(i in self.blocked and self._logical(i) == out for i in n.inputs if i):
            return False
        inputs = []
        for i in n.inputs:
            if not i:
                inputs.append(i)
                continue
            made = self._blocked_operand(i, out)
            if made is None:
                return False
            inputs.append(made)
        self._emit(n, n.op_type, inputs, blocked_shape(out, self.block), self.source.values[n.outputs[0]].dtype, n.attrs)
        return True

    def _blocked_operand(self, v: str, out: tuple) -> str | None:
        """Value v as an operand of a blocked elementwise node of logical shape `out`: its blocked
        form, a blocked constant, itself when one element; None when it cannot be (an NCHW
        activation broadcast along the channels)."""
        if v in self.blocked:
            shape = self._logical(v)
            return self.blocked[v] if len(shape) == 4 and shape[1] == out[1] else None
        val = self.g.values[v]
        if val.const is not None and val.size == 1:
            return v
        shape = (1,) * (4 - len(val.shape)) + tuple(val.shape)
        if len(shape) != 4 or any(s not in (1, o) for s, o in zip(shape, out)):
            return None
        if val.const is not None:
            name = f"{v}/nchw{self.block}c"
            if name not in self.g.values:
                self._value(name, *_blocked_constant(val.const.reshape(shape), self.block))
            return name
        if shape[1] != out[1]:
            return None
        if len(val.shape) != 4:
            return None
        return self._blocked_of(v)

    def _emit(self, n: Node, op_type: str, inputs: list, shape: tuple, dtype: str, attrs: dict):
        out = n.outputs[0]
        name = self._value(f"{out}/nchw{self.block}c", shape, dtype)
        self.g.nodes.append(Node(op_type, n.name, inputs, [name], dict(attrs)))
        self.blocked[out] = name


def _blocked_constant(a: np.ndarray, block: int) -> tuple:
    """A constant broadcast against [N, C, H, W] as one against [N, C/B, H, W, B]: ((shape),
    dtype, array); channels padded with zeros to whole blocks, a channel dimension of 1 kept
    as 1 in both blocked axes."""
    n, c, h, w = a.shape
    if c == 1:
        return (n, 1, h, w, 1), str(a.dtype), np.ascontiguousarray(a.reshape(n, 1, h, w, 1))
    cb = -(-c // block)
    padded = np.zeros((n, cb * block, h, w), a.dtype)
    padded[:, :c] = a
    blocked = np.ascontiguousarray(padded.reshape(n, cb, block, h, w).transpose(0, 1, 3, 4, 2))
    return blocked.shape, str(a.dtype), blocked


__all__ = ["propagate_blocked_layout", "ELEMENTWISE_SAFE"]
