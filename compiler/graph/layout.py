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

- every convolution with constant weights that is dense (one group) or depthwise (a group per
  channel), whose output channels fill their blocks to at least 1/MAX_CHANNEL_PADDING, becomes
  a ConvNCHWc: weights packed [F/B, C, KH, KW, B] and the bias [F/B, B], both zero-padded to
  whole blocks, its output blocked. Its data is the blocked value when there is one, else a
  ToNCHWc copy of it, except for data of fewer channels than a block (an RGB image), which it
  reads as NCHW;
- a MaxPool of a blocked value stays blocked (MaxPoolNCHWc, its padding the lowest value);
- elementwise nodes whose every input is blocked (of one shape) or a scalar constant (Relu,
  Clip, a residual Add, ...) stay in the layout, so they fuse into the convolution's tile as
  before;
- any other reader of a blocked value gets it back as NCHW through a FromNCHWc (a global pool,
  a Flatten, a graph output), made once per value.

Padding channels (24 channels in blocks of 16) start as zeros (zero weights, zero bias) and may
become anything finite through the elementwise nodes kept in the layout (ELEMENTWISE_SAFE: no
division, logarithm or root, which could make them infinite); every reader multiplies them by a
zero weight or drops them.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..ops.functions import pack_conv_weight_nchwc
from ..target import resolve_target
from .ir import Graph, Node, Value
from .ops.layout import blocked_shape
from .ops.nn import pool_geometry, window_geometry

# elementwise operators that keep finite inputs finite: kept in the blocked layout
ELEMENTWISE_SAFE = ("Relu", "Clip", "Add", "Sub", "Mul", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid",
                    "HardSwish", "Neg", "Abs")
MIN_BLOCK = 4
MIN_CONVS = 2   # a lone convolution would pay both border copies for nothing
MAX_CHANNEL_PADDING = 1.5   # padded / real output channels of a convolution that goes blocked


def propagate_blocked_layout(graph: Graph, target) -> Graph:
    """A copy of `graph` whose convolutions run channel-blocked (see the module docstring), for
    `target`'s float32 vector length; the graph itself when the target has no vectors or fewer
    than MIN_CONVS convolutions can go blocked."""
    target = resolve_target(target)
    block = target.vector_lanes("float32")
    if block < MIN_BLOCK or sum(1 for n in graph.nodes if _convertible(graph, n, block)) < MIN_CONVS:
        return graph
    return _Rewrite(graph, block).run()


def _convertible(graph: Graph, n: Node, block: int) -> bool:
    """A dense or depthwise Conv with constant weights whose output channels fill their blocks
    to at least 1/MAX_CHANNEL_PADDING (24 channels in blocks of 16 do; 4 would compute 16)."""
    if n.op_type != "Conv" or "weight_block" in n.attrs or len(n.inputs) < 2:
        return False
    x, w = graph.values[n.inputs[0]], graph.values[n.inputs[1]]
    if w.const is None or x.dtype != "float32" or len(x.shape) != 4 or len(w.shape) != 4:
        return False
    if len(n.inputs) > 2 and n.inputs[2] and graph.values[n.inputs[2]].const is None:
        return False
    groups = int(n.attrs.get("group", 1))
    C, F = x.shape[1], w.shape[0]
    if -(-F // block) * block > MAX_CHANNEL_PADDING * F:
        return False
    return groups == 1 or (groups == C == F and w.shape[1] == 1)


class _Rewrite:
    def __init__(self, graph: Graph, block: int):
        self.g = Graph(dict(graph.values), [], list(graph.inputs), list(graph.outputs), graph.opset, graph.name)
        self.source = graph
        self.block = block
        self.blocked: dict = {}     # value name -> the name of its blocked form
        self.plain: set = set(graph.inputs) | {v for v, val in graph.values.items() if val.const is not None}

    def run(self) -> Graph:
        for n in self.source.nodes:
            shape = self._blocked_inputs_shape(n) if n.op_type in ELEMENTWISE_SAFE else None
            if _convertible(self.source, n, self.block):
                self._conv(n)
            elif n.op_type == "MaxPool" and n.inputs[0] in self.blocked and len([o for o in n.outputs if o]) == 1:
                self._max_pool(n)
            elif shape is not None:
                self._elementwise(n, shape)
            else:
                node = replace(n, inputs=[self._plain(i) if i else i for i in n.inputs])
                self.g.nodes.append(node)
                self.plain.update(node.outputs)
        for v in self.g.outputs:
            self._plain(v)
        return self.g

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

    def _conv(self, n: Node):
        B = self.block
        x, w = self.source.values[n.inputs[0]], self.source.values[n.inputs[1]]
        N, C, H, W = x.shape
        F, _, KH, KW = w.shape
        depthwise = int(n.attrs.get("group", 1)) != 1
        blocked_data = n.inputs[0] in self.blocked or C >= B or depthwise
        if blocked_data:
            data = self._blocked_of(n.inputs[0])
            cin = -(-C // B) * B
        else:   # fewer channels than a block (an RGB image): read as NCHW
            data = self._plain(n.inputs[0])
            cin = C
        fout = -(-F // B) * B
        weight = np.zeros((fout, 1 if depthwise else cin, KH, KW), np.float32)
        weight[:F, :w.shape[1]] = w.const
        packed = pack_conv_weight_nchwc(weight, B, B if blocked_data and not depthwise else 0)
        wname = f"{n.inputs[1]}/nchw{B}c" + ("" if blocked_data else "/nchw_data")   # one weight, two readers
        inputs = [data, self._value(wname, packed.shape, "float32", packed)]
        if len(n.inputs) > 2 and n.inputs[2]:
            bias = np.zeros(fout, np.float32)
            bias[:F] = self.source.values[n.inputs[2]].const
            inputs.append(self._value(f"{n.inputs[2]}/nchw{B}c", (fout // B, B), "float32", bias.reshape(-1, B)))
        dil = tuple(n.attrs.get("dilations") or (1, 1))
        strides, pads, (OH, OW) = window_geometry(n, (H, W), (KH, KW), dil)
        out = n.outputs[0]
        name = self._value(f"{out}/nchw{B}c", (N, fout // B, OH, OW, B), "float32")
        self.g.nodes.append(Node("ConvNCHWc", n.name, inputs, [name],
                                 {"strides": strides, "pads": pads, "dilations": dil, "depthwise": int(depthwise)}))
        self.blocked[out] = name

    def _max_pool(self, n: Node):
        kernel, strides, pads, (OH, OW) = pool_geometry(n, self.source.values[n.inputs[0]].shape)
        x = self.g.values[self.blocked[n.inputs[0]]]
        out = n.outputs[0]
        name = self._value(f"{out}/nchw{self.block}c", (x.shape[0], x.shape[1], OH, OW, self.block), x.dtype)
        self.g.nodes.append(Node("MaxPoolNCHWc", n.name, [x.name], [name],
                                 {"kernel": kernel, "strides": strides, "pads": pads}))
        self.blocked[out] = name

    def _blocked_inputs_shape(self, n: Node) -> tuple | None:
        """The blocked shape of n's inputs when every one is blocked (all of one shape) or a
        one-element constant; else None."""
        shapes = set()
        for i in n.inputs:
            if not i:
                continue
            if i in self.blocked:
                shapes.add(self.g.values[self.blocked[i]].shape)
            elif not (self.g.values[i].const is not None and self.g.values[i].size == 1):
                return None
        return shapes.pop() if len(shapes) == 1 and len(n.outputs) == 1 else None

    def _elementwise(self, n: Node, shape: tuple):
        inputs = [self.blocked.get(i, i) if i else i for i in n.inputs]
        out = n.outputs[0]
        name = self._value(f"{out}/nchw{self.block}c", shape, self.source.values[out].dtype)
        self.g.nodes.append(replace(n, inputs=inputs, outputs=[name]))
        self.blocked[out] = name


__all__ = ["propagate_blocked_layout", "ELEMENTWISE_SAFE"]
