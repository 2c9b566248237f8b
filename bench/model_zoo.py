"""Any model, not only the four of model_e2e.py: tunefarm against onnxruntime on networks it was
never fitted to (issue 34), at the batch sizes and sequence lengths they are deployed at and as
either of torch's ONNX exporters writes them (issue 54).

Models (random weights):
- every model the `onnx` package ships under onnx/backend/test/data/light/ (AlexNet, DenseNet-121,
  Inception v1 and v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19, ZFNet-512: Caffe2 exports of
  opset 9 whose weights are ConstantOfShape nodes of one value), each ConstantOfShape replaced by
  seeded random weights of its shape, scaled by role (He-scaled convolution and linear weights,
  BatchNorm statistics near identity), and the last layer before the Softmax rescaled so the
  logits have a spread of LOGIT_STD (a flat Softmax would hide errors); the input's batch
  dimension made symbolic, and every Reshape of activations whose target shape starts with the
  file's batch of 1 given 0 there instead (copy the input's dimension: any batch);
- the four models of bench/model_e2e.py (ResNet-18, MobileNetV2, an MLP, a BERT-base layer);
- networks written here in torch.nn, each spelling its layers the way its reference
  implementation does: ResNet-50 with the stride on the 3x3 (torchvision v1.5), ShuffleNetV2 x1.0
  (channel split, shuffle as Reshape/Transpose/Reshape), a DenseNet block pair (BatchNorm after
  Concat), Inception-v3 blocks (Concat of four branches, an average-pool branch), EfficientNet-B0
  MBConv blocks (squeeze-excite, Swish) and MobileNetV3 blocks (HardSwish, HardSigmoid gate),
  ConvNeXt blocks (7x7 depthwise, LayerNorm over channels, layer scale), a ViT-S encoder layer with
  its patch embedding (fused QKV projection unbound into three), and the whole ViT-B/16 with
  nn.MultiheadAttention (`vit_b16_mha`, torchvision's layout);
- transformers built from configs (transformers 5.x, default attention implementation):
  `bert_base` (BertModel of BertConfig()'s defaults, input_ids and an attention_mask whose last
  10% are padding in batch row 0), `llama_prefill` (LlamaModel of LLAMA_CONFIG: RMSNorm, rotary,
  SiLU gate, grouped-query attention, causal mask; a prompt with an attention_mask like BERT's)
  and `llama_decode` (LlamaForCausalLM's step for one new token: input_ids, attention_mask over
  the past and the token, position_ids and the KV cache of the past `seq - 1` tokens as inputs
  past_key_I / past_value_I; logits and present_key_I / present_value_I out).

Every torch-defined model (model_e2e's four, the torch.nn networks, the transformers) is exported
once per exporter in a child process (torch's OpenMP runtime never enters the timing process):
`torchscript` is torch.onnx.export(dynamo=False, opset_version=17) with dynamic_axes, `dynamo` is
torch.onnx.export(dynamo=True, opset_version=18) (onnxscript) with dynamic_shapes: the batch axis,
and the transformers' sequence axis, symbolic. Where an exporter refuses the symbolic axes, the
model is exported at each shape instead (listed under `static_exports`). The ONNX-shipped light
zoo runs once under either exporter, as exporter `onnx`. Each shape is then imported with
`compiler.graph.from_onnx(path, input_shapes=...)` pinning the batch (and sequence), built
untuned (default schedules), checked against onnxruntime on the same inputs (one session per
file, its dimensions left symbolic), and both are timed alternately for `--rounds` rounds on
`--threads` threads each (the protocol of model_e2e.py); a ratio is the median of the rounds'
ratios (model_e2e.round_ratio), so a host that slows down between rounds moves both sides of it.
`GraphModule.profile` then times the module's kernels one by one against its whole run.
`--tune TRIALS` first tunes each shape's fused workloads with that many trials (fresh SQLite
records), then times tuned, untuned and onnxruntime in the same rounds.

Flags: --models NAME [NAME ...], --exporter torchscript|dynamo|both (default torchscript),
--batch N [N ...] (default 1), --seq N [N ...] (default 128; the transformers only: bert_layer,
bert_base, llama_prefill, llama_decode), --rounds R (default 5), --threads T (default 2), --tune
TRIALS.

A key is `model/exporter/bN` (`model/onnx/bN` for the light zoo), with `/sM` added for a
transformer at a sequence length M other than 128. A shape tunefarm refuses or fails on (or an
exporter or onnxruntime fails on) is listed under `refused` with the reason; the run goes on.

Prints a table, then one JSON line, every per-model dict keyed by those keys:
`ratio_vs_onnxruntime` (onnxruntime's time / ours), `geomean` and `min` over all keys,
`max_rel_error`, `tunefarm_ms`, `onnxruntime_ms`, `build_seconds`, `workloads`, `disturbed`,
`outside_kernels_fraction` (the profile's time outside the one native call of the kernels / its
run time, at least 0: the share of a run spent outside kernels), `decode_gbps_by_key` (llama_decode: bytes of weights and KV cache one
step reads / tunefarm's time), `decode_gbps` (the lowest of those at batch 1, the matrix-vector
step bound by memory; of all when no batch-1 step ran), `memory_gbps` (this host's read bandwidth, measured in the run: the
best of several max-reductions of a buffer far larger than the L3, on 1 and --threads threads,
read before, between and after the models: the fastest reading), `refused` and `refused_reasons`, `static_exports` (model/exporter),
`export_seconds` (of the file a key's shape came from, a failed symbolic export included),
`tuned`, and the run's `exporters`, `batches` and `seqs`; with --tune also the untuned ratios and
the tuning seconds and trials.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import model_e2e  # noqa: E402 - the four models, the timing protocol, tuning, the shared setup

LIGHT = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet",
         "vgg19", "zfnet512")
E2E = model_e2e.MODELS
TORCH = ("resnet50_v15", "shufflenet_v2", "densenet_blocks", "inception_v3_blocks", "efficientnet_blocks",
         "mobilenet_v3_blocks", "convnext_blocks", "vit_s_layer", "vit_b16_mha")
TRANSFORMERS = ("bert_base", "llama_prefill", "llama_decode")
MODELS = tuple(f"light_{n}" for n in LIGHT) + E2E + TORCH + TRANSFORMERS
EXPORTERS = ("torchscript", "dynamo")
SEQ_MODELS = ("bert_layer",) + TRANSFORMERS    # inputs with a sequence axis: --seq applies
DEFAULT_SEQ = 128
LOGIT_STD = 3.0
# the input of the single-input torch models, one sample (the batch axis comes first)
SAMPLE_SHAPES = {"resnet18": (3, 224, 224), "mobilenet_v2": (3, 224, 224), "mlp": (784,),
                 "bert_layer": (DEFAULT_SEQ, 768), "inception_v3_blocks": (192, 35, 35),
                 **{n: (3, 224, 224) for n in TORCH if n != "inception_v3_blocks"}}
BERT_VOCAB = 30522   # BertConfig()'s
LLAMA_CONFIG = dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                    intermediate_size=2816, vocab_size=32000, max_position_embeddings=2048)
PAD_SHARE = 0.1      # of batch row 0's positions masked out at the end (padding)


# ----------------------------------------------------------------------------- the light zoo

def light_dir() -> Path:
    import onnx
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def light_model(name: str, path: str, seed: int = 0) -> None:
    """The light zoo's model `name` with random weights, written to `path`."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(light_dir() / f"light_{name}.onnx"))
    g = model.graph
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    readers: dict = {}
    for n in g.node:
        for pos, i in enumerate(n.input):
            readers.setdefault(i, []).append((n, pos))
    rng = np.random.default_rng(seed)
    weights, kept = {}, []
    for n in g.node:
        if n.op_type != "ConstantOfShape":
            kept.append(n)
            continue
        shape = tuple(int(s) for s in inits[n.input[0]])
        weights[n.output[0]] = random_weight(rng, shape, _role(n.output[0], readers))
    del g.node[:]
    g.node.extend(kept)
    used = {i for n in kept for i in n.input}
    for name_, arr in weights.items():
        g.initializer.append(numpy_helper.from_array(arr.astype(np.float32), name_))
    # initializers only the ConstantOfShape nodes read, and the graph inputs naming initializers
    # (IR 3 listed every initializer as an input too), go
    keep_init = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(keep_init)
    init_names = {i.name for i in keep_init}
    keep_inputs = [i for i in g.input if i.name not in init_names and i.name in used]
    del g.input[:]
    g.input.extend(keep_inputs)
    if model.ir_version < 4:
        model.ir_version = 4
    onnx.save(model, path)


def _role(value: str, readers: dict, depth: int = 0) -> tuple:
    """(op type, input position, op attributes) of the first real reader of a weight, looking
    through Unsqueeze/Reshape (DenseNet's BatchNorm written as Unsqueeze → Mul/Add)."""
    for n, pos in readers.get(value, []):
        if n.op_type in ("Unsqueeze", "Reshape", "Identity") and depth < 3:
            return _role(n.output[0], readers, depth + 1)
        attrs = {a.name: a for a in n.attribute}
        return n.op_type, pos, attrs
    return "", 0, {}


def random_weight(rng, shape: tuple, role: tuple) -> np.ndarray:
    op, pos, attrs = role
    if op in ("Conv", "ConvTranspose") and pos == 1:
        fan_in = math.prod(shape[1:])
        return rng.standard_normal(shape) * math.sqrt(2.0 / fan_in)
    if op in ("Gemm", "MatMul") and pos == 1 and len(shape) == 2:
        trans_b = op == "Gemm" and "transB" in attrs and attrs["transB"].i
        fan_in = shape[1] if trans_b else shape[0]
        return rng.standard_normal(shape) * math.sqrt(2.0 / fan_in)
    if op == "BatchNormalization" and pos in (1, 4):      # scale, variance
        return rng.uniform(0.5, 1.5, shape)
    if op == "Mul":
        return rng.uniform(0.5, 1.5, shape)
    return rng.uniform(-0.1, 0.1, shape)                  # biases, shifts, means


def rescale_last_layer(path: str, threads: int) -> float:
    """Scale the weight and bias of the last Conv/Gemm/MatMul before the model's Softmax so
    the logits' standard deviation is LOGIT_STD (ReLU and pooling between them are positively
    homogeneous, so the logits scale with it); the factor, or 1.0 without a Softmax."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(path)
    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    soft = next((n for n in g.node if n.op_type == "Softmax" and n.output[0] in {o.name for o in g.output}), None)
    if soft is None:
        return 1.0
    logits = soft.input[0]
    layer = producer.get(logits)
    while layer is not None and layer.op_type not in ("Conv", "Gemm", "MatMul"):
        layer = producer.get(layer.input[0])
    if layer is None:
        return 1.0
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(onnx.helper.make_tensor_value_info(logits, onnx.TensorProto.FLOAT, None))
    session = model_e2e.ort_session(probe.SerializeToString(), threads)
    feeds = model_inputs(model, seed=1)
    out = session.run([logits], feeds)[0]
    std = float(np.std(out))
    if not std > 0:
        return 1.0
    factor = LOGIT_STD / std
    inits = {i.name: i for i in g.initializer}
    for name in layer.input[1:3]:
        if name in inits:
            arr = numpy_helper.to_array(inits[name]) * factor
            inits[name].CopyFrom(numpy_helper.from_array(arr.astype(np.float32), name))
    onnx.save(model, path)
    return factor


def model_inputs(model, seed: int = 0, batch: int = 1) -> dict:
    """Random standard-normal float32 arrays for the model's non-initializer inputs, `batch` for
    a symbolic dimension."""
    inits = {i.name for i in model.graph.initializer}
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        shape = tuple(d.dim_value if d.HasField("dim_value") else batch for d in vi.type.tensor_type.shape.dim)
        feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def symbolic_batch(path: str) -> list:
    """Make the batch dimension of the model at `path` symbolic ("N"): its inputs' and outputs'
    first dimension, and every Reshape of activations (a value computed from an input) whose
    constant target shape starts with the file's batch of 1, which gets 0 there (ONNX: copy the
    input's dimension) in a constant of its own. Returns the Reshapes so rewritten."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(path)
    g = model.graph
    consts = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    for n in g.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    live = {vi.name for vi in g.input if vi.name not in consts}   # values computed from the inputs
    for n in g.node:
        if any(i in live for i in n.input):
            live.update(n.output)
    rewritten = []
    for n in g.node:
        if n.op_type != "Reshape" or n.input[0] not in live or n.input[1] not in consts:
            continue
        target = consts[n.input[1]]
        if target.ndim == 1 and target.size and target[0] == 1:
            target = target.copy()
            target[0] = 0
            name = f"{n.input[1]}/any_batch/{len(rewritten)}"
            g.initializer.append(numpy_helper.from_array(target.astype(np.int64), name))
            n.input[1] = name
            rewritten.append(n.name or n.output[0])
    read = {i for n in g.node for i in n.input}
    kept = [i for i in g.initializer if i.name in read]   # the rewritten Reshapes' old targets go
    del g.initializer[:]
    g.initializer.extend(kept)
    for vi in list(g.input) + list(g.output):
        if vi.name in consts or not vi.type.tensor_type.shape.dim:
            continue
        dim = vi.type.tensor_type.shape.dim[0]
        if dim.HasField("dim_value") and dim.dim_value == 1:
            dim.dim_param = "N"
    del g.value_info[:]   # intermediate shapes, if any, were inferred at batch 1
    onnx.save(model, path)
    return rewritten


# ----------------------------------------------------------------------------- torch.nn networks

def torch_networks():
    """name -> module class of the networks written here (see the module docstring; their
    inputs' shapes are SAMPLE_SHAPES')."""
    import torch
    from torch import nn
    F = nn.functional

    def conv_bn(cin, cout, k, s=1, groups=1, act: type | None = nn.ReLU, dilation=1):
        mods = [nn.Conv2d(cin, cout, k, s, dilation * (k // 2), dilation=dilation, groups=groups, bias=False),
                nn.BatchNorm2d(cout)]
        return nn.Sequential(*(mods + [act()] if act is not None else mods))

    class Bottleneck(nn.Module):
        """torchvision's ResNet v1.5 bottleneck: the stride on the 3x3."""

        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * 4
            self.body = nn.Sequential(conv_bn(cin, width, 1), conv_bn(width, width, 3, stride),
                                      conv_bn(width, cout, 1, act=None))
            self.down = None if stride == 1 and cin == cout else conv_bn(cin, cout, 1, stride, act=None)

        def forward(self, x):
            return torch.relu(self.body(x) + (x if self.down is None else self.down(x)))

    class ResNet50(nn.Module):
        def __init__(self):
            super().__init__()
            layers, cin = [conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1)], 64
            for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
                for i in range(blocks):
                    layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
                    cin = width * 4
            self.features = nn.Sequential(*layers)
            self.fc = nn.Linear(2048, 1000)

        def forward(self, x):
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))

    def channel_shuffle(x, groups):
        b, c, h, w = x.shape
        return x.view(b, groups, c // groups, h, w).transpose(1, 2).reshape(b, c, h, w)

    class ShuffleUnit(nn.Module):
        """ShuffleNetV2's unit: stride 1 splits the channels in two and transforms one half; stride 2
        transforms both copies; then the halves are concatenated and shuffled."""

        def __init__(self, cin, cout, stride):
            super().__init__()
            self.stride = stride
            half = cout // 2
            if stride > 1:
                self.left = nn.Sequential(conv_bn(cin, cin, 3, stride, groups=cin, act=None), conv_bn(cin, half, 1))
            inner = cin if stride > 1 else half
            self.right = nn.Sequential(conv_bn(inner, half, 1), conv_bn(half, half, 3, stride, groups=half, act=None),
                                       conv_bn(half, half, 1))

        def forward(self, x):
            if self.stride == 1:
                a, b = x.chunk(2, dim=1)
                out = torch.cat((a, self.right(b)), dim=1)
            else:
                out = torch.cat((self.left(x), self.right(x)), dim=1)
            return channel_shuffle(out, 2)

    class ShuffleNetV2(nn.Module):
        def __init__(self):
            super().__init__()
            layers, cin = [conv_bn(3, 24, 3, 2), nn.MaxPool2d(3, 2, 1)], 24
            for cout, repeats in ((116, 4), (232, 8), (464, 4)):
                for i in range(repeats):
                    layers.append(ShuffleUnit(cin, cout, 2 if i == 0 else 1))
                    cin = cout
            layers.append(conv_bn(cin, 1024, 1))
            self.features = nn.Sequential(*layers)
            self.fc = nn.Linear(1024, 1000)

        def forward(self, x):
            return self.fc(self.features(x).mean((2, 3)))

    class DenseLayer(nn.Module):
        def __init__(self, cin, growth=32):
            super().__init__()
            self.body = nn.Sequential(nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, 4 * growth, 1, bias=False),
                                      nn.BatchNorm2d(4 * growth), nn.ReLU(),
                                      nn.Conv2d(4 * growth, growth, 3, 1, 1, bias=False))

        def forward(self, features):
            return self.body(torch.cat(features, 1))

    class DenseBlock(nn.Module):
        def __init__(self, cin, layers):
            super().__init__()
            self.layers = nn.ModuleList(DenseLayer(cin + 32 * i) for i in range(layers))

        def forward(self, x):
            features = [x]
            for layer in self.layers:
                features.append(layer(features))
            return torch.cat(features, 1)

    class DenseNetBlocks(nn.Module):
        """DenseNet-121's stem, first two dense blocks and the transition between them."""

        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1))
            self.block1 = DenseBlock(64, 6)
            self.trans = nn.Sequential(nn.BatchNorm2d(256), nn.ReLU(), nn.Conv2d(256, 128, 1, bias=False),
                                       nn.AvgPool2d(2, 2))
            self.block2 = DenseBlock(128, 12)
            self.norm = nn.BatchNorm2d(512)
            self.fc = nn.Linear(512, 1000)

        def forward(self, x):
            x = self.norm(self.block2(self.trans(self.block1(self.stem(x)))))
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(torch.relu(x), 1), 1))

    class InceptionA(nn.Module):
        def __init__(self, cin, pool_features):
            super().__init__()
            self.b1 = conv_bn(cin, 64, 1)
            self.b5 = nn.Sequential(conv_bn(cin, 48, 1), conv_bn(48, 64, 5))
            self.b3 = nn.Sequential(conv_bn(cin, 64, 1), conv_bn(64, 96, 3), conv_bn(96, 96, 3))
            self.bp = conv_bn(cin, pool_features, 1)

        def forward(self, x):
            pooled = F.avg_pool2d(x, 3, 1, 1)
            return torch.cat((self.b1(x), self.b5(x), self.b3(x), self.bp(pooled)), 1)

    class InceptionB(nn.Module):
        """The grid reduction: a strided 3x3, a strided double 3x3 and a strided max pool, concatenated."""

        def __init__(self, cin):
            super().__init__()
            self.b3 = nn.Sequential(nn.Conv2d(cin, 384, 3, 2, bias=False), nn.BatchNorm2d(384), nn.ReLU())
            self.bd = nn.Sequential(conv_bn(cin, 64, 1), conv_bn(64, 96, 3),
                                    nn.Conv2d(96, 96, 3, 2, bias=False), nn.BatchNorm2d(96), nn.ReLU())

        def forward(self, x):
            return torch.cat((self.b3(x), self.bd(x), F.max_pool2d(x, 3, 2)), 1)

    class InceptionBlocks(nn.Module):
        """Inception-v3's 35x35 blocks (Mixed_5b..5d) and the reduction after them, on a 35x35x192 input."""

        def __init__(self):
            super().__init__()
            self.blocks = nn.Sequential(InceptionA(192, 32), InceptionA(256, 64), InceptionA(288, 64),
                                        InceptionB(288))
            self.fc = nn.Linear(768, 1000)

        def forward(self, x):
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.blocks(x), 1), 1))

    class SqueezeExcite(nn.Module):
        def __init__(self, channels, squeeze, act, gate):
            super().__init__()
            self.reduce, self.expand = nn.Conv2d(channels, squeeze, 1), nn.Conv2d(squeeze, channels, 1)
            self.act, self.gate = act(), gate()

        def forward(self, x):
            return x * self.gate(self.expand(self.act(self.reduce(F.adaptive_avg_pool2d(x, 1)))))

    class MBConv(nn.Module):
        """EfficientNet's and MobileNetV3's inverted residual with squeeze-excite."""

        def __init__(self, cin, cout, k, stride, hidden, act, gate, squeeze):
            super().__init__()
            layers = [conv_bn(cin, hidden, 1, act=act)] if hidden != cin else []
            layers += [conv_bn(hidden, hidden, k, stride, groups=hidden, act=act)]
            if squeeze:
                layers.append(SqueezeExcite(hidden, max(8, int(squeeze)), act, gate))
            layers.append(conv_bn(hidden, cout, 1, act=None))
            self.body = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            return x + self.body(x) if self.residual else self.body(x)

    class EfficientNetBlocks(nn.Module):
        """EfficientNet-B0's stem and stages 1-4 (Swish, squeeze-excite at a quarter of the block's input)."""

        def __init__(self):
            super().__init__()
            cfg = [(1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 80, 3, 2, 3), (6, 112, 3, 1, 5)]
            layers, cin = [conv_bn(3, 32, 3, 2, act=nn.SiLU)], 32
            for t, c, n, s, k in cfg:
                for i in range(n):
                    layers.append(MBConv(cin, c, k, s if i == 0 else 1, cin * t, nn.SiLU, nn.Sigmoid, cin / 4))
                    cin = c
            self.features = nn.Sequential(*layers)
            self.fc = nn.Linear(cin, 1000)

        def forward(self, x):
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))

    class MobileNetV3Blocks(nn.Module):
        """MobileNetV3-Large's stem and blocks (HardSwish from the fourth stage, HardSigmoid gates)."""

        def __init__(self):
            super().__init__()
            # (kernel, expanded, out, squeeze-excite, hardswish, stride)
            cfg = [(3, 16, 16, 0, 0, 1), (3, 64, 24, 0, 0, 2), (3, 72, 24, 0, 0, 1), (5, 72, 40, 1, 0, 2),
                   (5, 120, 40, 1, 0, 1), (5, 120, 40, 1, 0, 1), (3, 240, 80, 0, 1, 2), (3, 200, 80, 0, 1, 1),
                   (3, 480, 112, 1, 1, 1), (3, 672, 112, 1, 1, 1), (5, 672, 160, 1, 1, 2), (5, 960, 160, 1, 1, 1)]
            layers, cin = [conv_bn(3, 16, 3, 2, act=nn.Hardswish)], 16
            for k, exp, c, se, hs, s in cfg:
                act = nn.Hardswish if hs else nn.ReLU
                layers.append(MBConv(cin, c, k, s, exp, act, nn.Hardsigmoid, exp / 4 if se else 0))
                cin = c
            layers.append(conv_bn(cin, 960, 1, act=nn.Hardswish))
            self.features = nn.Sequential(*layers)
            self.head = nn.Sequential(nn.Linear(960, 1280), nn.Hardswish(), nn.Linear(1280, 1000))

        def forward(self, x):
            return self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))

    class ConvNeXtBlock(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
            self.norm = nn.LayerNorm(dim, eps=1e-6)
            self.pw1, self.pw2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
            self.gamma = nn.Parameter(torch.full((dim,), 0.5))

        def forward(self, x):
            y = self.dw(x).permute(0, 2, 3, 1)
            y = self.gamma * self.pw2(F.gelu(self.pw1(self.norm(y))))
            return x + y.permute(0, 3, 1, 2)

    class ConvNeXtBlocks(nn.Module):
        """ConvNeXt-T's patchify stem and first stage (three blocks at 56x56, 96 channels)."""

        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 96, 4, 4)
            self.stem_norm = nn.LayerNorm(96, eps=1e-6)
            self.blocks = nn.Sequential(*(ConvNeXtBlock(96) for _ in range(3)))
            self.head = nn.Linear(96, 1000)

        def forward(self, x):
            x = self.stem_norm(self.stem(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
            return self.head(self.blocks(x).mean((2, 3)))

    class ViTLayer(nn.Module):
        """ViT-S/16's patch embedding, class token, position embedding and one pre-LN encoder layer
        (timm's Attention: one QKV projection, reshaped, permuted and unbound)."""

        def __init__(self, dim=384, heads=6):
            super().__init__()
            self.heads, self.hd = heads, dim // heads
            self.patch = nn.Conv2d(3, dim, 16, 16)
            self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
            self.pos = nn.Parameter(torch.randn(1, 197, dim) * 0.02)
            self.n1, self.n2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
            self.norm, self.head = nn.LayerNorm(dim, eps=1e-6), nn.Linear(dim, 1000)

        def forward(self, x):
            x = self.patch(x).flatten(2).transpose(1, 2)
            x = torch.cat((self.cls.expand(x.shape[0], -1, -1), x), 1) + self.pos
            b, n, c = x.shape
            qkv = self.qkv(self.n1(x)).reshape(b, n, 3, self.heads, self.hd).permute(2, 0, 3, 1, 4)
            q, k, v = qkv.unbind(0)
            attn = torch.softmax((q @ k.transpose(-2, -1)) * self.hd ** -0.5, dim=-1)
            x = x + self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))
            x = x + self.fc2(F.gelu(self.fc1(self.n2(x))))
            return self.head(self.norm(x)[:, 0])

    class ViTB16(nn.Module):
        """ViT-B/16 as torchvision writes it: patch-embedding convolution, class token, position
        embedding, 12 pre-LN encoder blocks of nn.MultiheadAttention(768, 12, batch_first=True)
        (need_weights=False) and an erf-GELU MLP of 3072, the final LayerNorm, a head on the class
        token."""

        class Block(nn.Module):
            def __init__(self, dim, heads, mlp):
                super().__init__()
                self.ln_1, self.ln_2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
                self.self_attention = nn.MultiheadAttention(dim, heads, batch_first=True)
                self.mlp = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(), nn.Linear(mlp, dim))

            def forward(self, x):
                y = self.ln_1(x)
                x = x + self.self_attention(y, y, y, need_weights=False)[0]
                return x + self.mlp(self.ln_2(x))

        def __init__(self, dim=768, heads=12, layers=12, mlp=3072):
            super().__init__()
            self.conv_proj = nn.Conv2d(3, dim, 16, 16)
            self.class_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
            self.pos_embedding = nn.Parameter(torch.randn(1, 197, dim) * 0.02)
            self.layers = nn.Sequential(*(self.Block(dim, heads, mlp) for _ in range(layers)))
            self.ln, self.head = nn.LayerNorm(dim, eps=1e-6), nn.Linear(dim, 1000)

        def forward(self, x):
            x = self.conv_proj(x).flatten(2).transpose(1, 2)
            x = torch.cat((self.class_token.expand(x.shape[0], -1, -1), x), 1) + self.pos_embedding
            return self.head(self.ln(self.layers(x))[:, 0])

    return {"resnet50_v15": ResNet50, "shufflenet_v2": ShuffleNetV2, "densenet_blocks": DenseNetBlocks,
            "inception_v3_blocks": InceptionBlocks, "efficientnet_blocks": EfficientNetBlocks,
            "mobilenet_v3_blocks": MobileNetV3Blocks, "convnext_blocks": ConvNeXtBlocks, "vit_s_layer": ViTLayer,
            "vit_b16_mha": ViTB16}


# ----------------------------------------------------------------------------- transformers

def transformer_module(name: str):
    """The transformers model `name` (random weights from its config, seeded) wrapped to take its
    inputs positionally and return a tuple of tensors (what both exporters want)."""
    from torch import nn

    if name == "bert_base":
        from transformers import BertConfig, BertModel

        class Bert(nn.Module):
            def __init__(self):
                super().__init__()
                self.bert = BertModel(BertConfig())

            def forward(self, input_ids, attention_mask):
                out = self.bert(input_ids=input_ids, attention_mask=attention_mask)
                return out.last_hidden_state, out.pooler_output

        return Bert()
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, LlamaModel
    config = LlamaConfig(**LLAMA_CONFIG)
    if name == "llama_prefill":

        class Prefill(nn.Module):
            def __init__(self):
                super().__init__()
                self.model = LlamaModel(config)

            def forward(self, input_ids, attention_mask):
                return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state

        return Prefill()

    class Decode(nn.Module):
        """One decode step: the past keys and values (flat: layer 0's key, its value, layer 1's key,
        ...) become a DynamicCache; logits of the new token and the present keys and values out."""

        def __init__(self):
            super().__init__()
            self.lm = LlamaForCausalLM(config)

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache([(past[i], past[i + 1]) for i in range(0, len(past), 2)])
            out = self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          cache=cache, use_cache=True)
            present = []
            for layer in out.cache.layers:
                present += [layer.keys, layer.values]
            return (out.logits, *present)

    return Decode()


def padded_mask(batch: int, seq: int) -> np.ndarray:
    """All ones but the last PAD_SHARE of batch row 0 (padding)."""
    mask = np.ones((batch, seq), np.int64)
    mask[0, seq - max(1, round(seq * PAD_SHARE)):] = 0
    return mask


def model_feeds(name: str, batch: int, seq: int) -> dict:
    """The inputs of torch-defined model `name` at `batch` (and sequence length `seq`), as numpy
    arrays (the timing process never imports torch); seeded."""
    rng = np.random.default_rng(0)
    if name == "bert_layer":
        return {"input": rng.standard_normal((batch, seq, 768)).astype(np.float32)}
    if name in SAMPLE_SHAPES:
        return {"input": rng.standard_normal((batch,) + SAMPLE_SHAPES[name]).astype(np.float32)}
    if name == "bert_base":
        return {"input_ids": rng.integers(0, BERT_VOCAB, (batch, seq)), "attention_mask": padded_mask(batch, seq)}
    vocab = LLAMA_CONFIG["vocab_size"]
    if name == "llama_prefill":
        return {"input_ids": rng.integers(0, vocab, (batch, seq)), "attention_mask": padded_mask(batch, seq)}
    assert name == "llama_decode", name
    kv_heads = LLAMA_CONFIG["num_key_value_heads"]
    head_dim = LLAMA_CONFIG["hidden_size"] // LLAMA_CONFIG["num_attention_heads"]
    feeds = {"input_ids": rng.integers(0, vocab, (batch, 1)), "attention_mask": np.ones((batch, seq), np.int64),
             "position_ids": np.full((batch, 1), seq - 1, np.int64)}
    for i in range(LLAMA_CONFIG["num_hidden_layers"]):
        for kind in ("key", "value"):
            feeds[f"past_{kind}_{i}"] = rng.standard_normal((batch, kv_heads, seq - 1, head_dim)).astype(np.float32)
    return feeds


def io_names(name: str) -> tuple:
    """(input names, output names, {name: {axis: symbolic name}}) of torch-defined model `name`."""
    b, s = {0: "batch"}, {0: "batch", 1: "seq"}
    if name == "bert_base":
        return (["input_ids", "attention_mask"], ["last_hidden_state", "pooler_output"],
                {"input_ids": s, "attention_mask": s, "last_hidden_state": s, "pooler_output": b})
    if name == "llama_prefill":
        return (["input_ids", "attention_mask"], ["last_hidden_state"],
                {"input_ids": s, "attention_mask": s, "last_hidden_state": s})
    if name == "llama_decode":
        layers = range(LLAMA_CONFIG["num_hidden_layers"])
        past = [f"past_{k}_{i}" for i in layers for k in ("key", "value")]
        present = [f"present_{k}_{i}" for i in layers for k in ("key", "value")]
        axes = {"input_ids": b, "attention_mask": {0: "batch", 1: "total"}, "position_ids": b, "logits": b}
        axes.update({n: {0: "batch", 2: "past"} for n in past})
        axes.update({n: {0: "batch", 2: "total"} for n in present})
        return ["input_ids", "attention_mask", "position_ids"] + past, ["logits"] + present, axes
    axes = {"input": s if name == "bert_layer" else b, "output": s if name == "bert_layer" else b}
    return ["input"], ["output"], axes


# ----------------------------------------------------------------------------- exports (child process)

def export_torch_here(name: str, path: str, exporter: str, batch: int, seq: int, dynamic: bool) -> None:
    """Random weights (torch's initialization, seeded; norms randomized as model_e2e's), exported
    by `exporter` at (`batch`, `seq`), those axes symbolic where `dynamic`."""
    import torch
    torch.manual_seed(0)
    if name in E2E:
        module = model_e2e.torch_models()[name][0]
    elif name in TORCH:
        module = torch_networks()[name]()
    else:
        module = transformer_module(name)
    model_e2e.randomize_norms(module)
    module.eval()
    inputs, outputs, axes = io_names(name)
    feeds = model_feeds(name, batch, seq)
    args = tuple(torch.from_numpy(feeds[n]) for n in inputs)
    # grad left enabled, as torch.onnx.export's examples run: under no_grad nn.MultiheadAttention takes its
    # fused fast path (aten::_native_multi_head_attention), which the TorchScript exporter cannot write
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the TorchScript exporter's deprecation notice, tracer warnings
        if exporter == "torchscript":
            torch.onnx.export(module, args, path, dynamo=False, opset_version=17, input_names=inputs,
                              output_names=outputs, dynamic_axes=axes if dynamic else None)
        else:
            shapes = None
            if dynamic:
                shapes = [{a: torch.export.Dim.DYNAMIC for a in axes.get(n, {})} or None for n in inputs]
                params = inspect.signature(module.forward).parameters.values()
                if any(p.kind is p.VAR_POSITIONAL for p in params):   # *past: one entry, a tuple
                    fixed = sum(p.kind is p.POSITIONAL_OR_KEYWORD for p in params)
                    shapes = shapes[:fixed] + [tuple(shapes[fixed:])]
                shapes = tuple(shapes)
            torch.onnx.export(module, args, path, dynamo=True, opset_version=18, input_names=inputs,
                              output_names=outputs, dynamic_shapes=shapes, verbose=False)


def export_torch(name: str, path: str, exporter: str, batch: int, seq: int, dynamic: bool, timeout: float = 1800):
    """export_torch_here in a child process; None, or the reason it failed (its last words)."""
    cmd = [sys.executable, __file__, "--export", name, path, "--exporter", exporter, "--batch", str(batch),
           "--seq", str(seq)] + ([] if dynamic else ["--static"])
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"export timed out after {timeout:.0f} s"
    if done.returncode == 0 and Path(path).is_file():
        return None
    lines = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    return " | ".join((errors or lines)[-3:])[:400] or f"export exited {done.returncode}"


# ----------------------------------------------------------------------------- measuring

def memory_gbps(threads: int, mib: int = 1024, repeat: int = 5) -> float:
    """This host's read bandwidth, GB/s: the best of `repeat` max-reductions (numpy's SIMD loop,
    the GIL released) of a float32 buffer of `mib` MiB (far beyond the L3), on one thread and
    split over `threads` threads, whichever reads faster."""
    buf = np.ones(mib * (1 << 20) // 4, np.float32)
    best = math.inf
    for n in sorted({1, threads}):
        parts = np.array_split(buf, n)
        with ThreadPoolExecutor(n) as pool:
            for _ in range(repeat + 1):            # the first pass warms the pages and the threads
                t0 = time.perf_counter()
                list(pool.map(np.maximum.reduce, parts))
                best = min(best, time.perf_counter() - t0)
    return buf.nbytes / best / 1e9


def decode_step_bytes(path: str, feeds: dict) -> int:
    """Bytes one decode step reads at least: every weight of the model at `path` (initializers)
    once, but only the gathered rows of a table a Gather reads (the token embedding: one row per
    new token), plus the KV cache (the past_* inputs)."""
    import onnx
    from onnx import helper

    model = onnx.load(path, load_external_data=False)
    tables = {n.input[0] for n in model.graph.node if n.op_type == "Gather"}
    tokens = feeds["input_ids"].size
    total = 0
    for init in model.graph.initializer:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
        dims = list(init.dims)
        total += itemsize * (tokens * math.prod(dims[1:]) if init.name in tables and dims else math.prod(dims))
    return total + sum(a.nbytes for n, a in feeds.items() if n.startswith("past_"))


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 0.0


def outside_fraction(module, feeds: dict) -> float:
    """The share of a run outside the native call of its kernels (ModelProfile.overhead_seconds /
    run_seconds, short timings: at least 3 clean samples each), at least 0."""
    from compiler.timing import TimingOptions
    opts = TimingOptions(min_samples=3, max_samples=50, min_seconds=0.01, max_seconds=0.3, attempts=2)
    prof = module.profile(feeds, options=opts)
    return max(0.0, prof.overhead_seconds / prof.run_seconds) if prof.run_seconds > 0 else 0.0


# ----------------------------------------------------------------------------- the run

_STARTED = time.perf_counter()


def elapsed() -> str:
    """mm:ss since the run started: where a long run's time goes, read off its log."""
    s = int(time.perf_counter() - _STARTED)
    return f"{s // 60:02d}:{s % 60:02d}"


def key_of(name: str, exporter: str, batch: int, seq: int) -> str:
    return f"{name}/{exporter}/b{batch}" + (f"/s{seq}" if name in SEQ_MODELS and seq != DEFAULT_SEQ else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_e2e.add_common_args(ap, MODELS, rounds=5)
    ap.add_argument("--exporter", choices=EXPORTERS + ("both",), default="torchscript",
                    help="torch's ONNX exporter for the torch-defined models (the light zoo is ONNX already)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1], help="batch sizes")
    ap.add_argument("--seq", type=int, nargs="+", default=[DEFAULT_SEQ],
                    help=f"sequence lengths of the transformers ({', '.join(SEQ_MODELS)})")
    ap.add_argument("--static", action="store_true", help=argparse.SUPPRESS)   # export child: fixed shapes
    args = ap.parse_args()
    if args.export:
        export_torch_here(args.export[0], args.export[1], args.exporter, args.batch[0], args.seq[0], not args.static)
        return 0
    if args.tune is not None and args.tune < 1:
        ap.error(f"--tune needs at least 1 trial, got {args.tune}")
    if min(args.batch) < 1 or min(args.seq) < 2:
        ap.error("--batch needs sizes of at least 1, --seq lengths of at least 2")
    versions = model_e2e.bench_versions()
    if versions is None:
        return 2
    import onnx

    import compiler
    from compiler.graph import ShapeSpecializedModel, from_onnx

    exporters = EXPORTERS if args.exporter == "both" else (args.exporter,)
    batches, seqs = list(dict.fromkeys(args.batch)), list(dict.fromkeys(args.seq))
    compiler.set_num_threads(args.threads)
    mode = f"tuned with {args.tune} trials per model" if args.tune else "untuned (default schedules)"
    bandwidth = round(memory_gbps(args.threads), 1)
    print(f"host target {compiler.Target.host()}; {args.threads} threads; onnxruntime {versions[0]}, torch "
          f"{versions[1]} (exports only); {mode}; exporters {', '.join(exporters)}; batches {batches}; "
          f"seqs {seqs}; memory read {bandwidth} GB/s\n", flush=True)

    keys = ("ratio_vs_onnxruntime", "tunefarm_ms", "onnxruntime_ms", "max_rel_error", "build_seconds", "workloads",
            "disturbed", "outside_kernels_fraction")
    report: dict = {k: {} for k in keys}
    report.update(decode_gbps_by_key={}, export_seconds={})
    if args.tune:
        for k in ("untuned_ratio_vs_onnxruntime", "tunefarm_untuned_ms", "tuning_seconds", "tuning_trials"):
            report[k] = {}
    refused: dict = {}
    static_exports: list = []

    def refuse(key, e):
        refused[key] = (f"{type(e).__name__}: {e}" if isinstance(e, BaseException) else str(e))[:400]
        print(f"{key:<34} REFUSED  {refused[key]}", flush=True)
        if isinstance(e, BaseException) and not isinstance(e, (compiler.graph.GraphError, compiler.CompilerError)):
            traceback.print_exc()

    def run_shape(key, name, path, session, feeds, compiled):
        """Build, check, time and profile one shape of one model file; fills the report. Untuned,
        the shape runs through `compiled`, the file's ShapeSpecializedModel: each batch or length
        compiled on first use from the one file, as a deployed model runs; tuned, the shape is
        pinned for its tuning and built with its records."""
        feeds = {i.name: feeds[i.name] for i in session.get_inputs()}   # exporters drop unread inputs
        print(f"[{elapsed()}] {key}: building ...", flush=True)
        refs = session.run(None, feeds)
        shapes = {n: a.shape for n, a in feeds.items()}
        records = trials = n_tasks = None
        t0 = time.perf_counter()
        if args.tune:
            graph = from_onnx(path, input_shapes=shapes)
            print(f"{key}: tuning {args.tune} trials ...", flush=True)
            records, tune_s, trials, n_tasks = model_e2e.tune(graph, args.tune, tempfile.mkdtemp(dir=tmp))
            report["tuning_seconds"][key], report["tuning_trials"][key] = round(tune_s, 1), trials
            t0 = time.perf_counter()
            module = model_e2e.build_quiet(graph, records)
            del graph
            run_ours = module.run
        else:
            module = compiled.module_for(compiled.shapes_of(feeds))
            run_ours = compiled.run
        build_s = round(time.perf_counter() - t0, 1)
        untuned = compiled.module_for(compiled.shapes_of(feeds)) if args.tune else None
        outs = run_ours(**feeds)
        t0 = time.perf_counter()
        session.run(None, feeds)
        once = time.perf_counter() - t0
        report["build_seconds"][key] = build_s
        report["workloads"][key] = len(module.sources)
        report["max_rel_error"][key] = max(model_e2e.max_rel_error(o, r) for o, r in zip(outs, refs))
        del outs, refs
        runs = {"ours": lambda r=run_ours, f=feeds: r(**f), "onnxruntime": lambda s=session, f=feeds: s.run(None, f)}
        if untuned is not None:
            runs["untuned"] = lambda m=untuned, f=feeds: m.run(**f)
        # slow shapes (a second a call) get fewer samples a round: the rounds still alternate
        timed = model_e2e.time_interleaved(runs, args.rounds, repeat=5 if once < 0.25 else 3 if once < 1 else 2)
        ours, theirs = timed["ours"][0], timed["onnxruntime"][0]
        report["tunefarm_ms"][key], report["onnxruntime_ms"][key] = ours, theirs
        report["ratio_vs_onnxruntime"][key] = round(model_e2e.round_ratio(timed, "onnxruntime", "ours"), 3)
        report["disturbed"][key] = any(t[1] for t in timed.values())
        report["outside_kernels_fraction"][key] = round(outside_fraction(module, feeds), 3)
        line = (f"{key:<34} tunefarm {ours:9.3f} ms   onnxruntime {theirs:9.3f} ms   ratio "
                f"{report['ratio_vs_onnxruntime'][key]:5.2f}x   max rel. error {report['max_rel_error'][key]:.1e}   "
                f"{len(module.steps)} kernels, {report['workloads'][key]} workloads, built in {build_s} s, "
                f"{report['outside_kernels_fraction'][key]:.0%} outside kernels")
        if name == "llama_decode":
            gbps = decode_step_bytes(path, feeds) / (ours / 1e3) / 1e9
            report["decode_gbps_by_key"][key] = round(gbps, 1)
            line += f"   decode reads {gbps:.1f} GB/s (memory {bandwidth} GB/s so far)"
        if untuned is not None:
            u = timed["untuned"][0]
            report["tunefarm_untuned_ms"][key] = u
            report["untuned_ratio_vs_onnxruntime"][key] = round(model_e2e.round_ratio(timed, "onnxruntime", "untuned"), 3)
            line += (f"\n{'':<34} untuned  {u:9.3f} ms   ratio {report['untuned_ratio_vs_onnxruntime'][key]:5.2f}x"
                     f"   tuned {trials} trials over {n_tasks} workloads in {report['tuning_seconds'][key]} s")
        if report["disturbed"][key]:
            line += "   DISTURBED"
        print(line, flush=True)

    def run_file(path, name, keyed_shapes):
        """run_shape for each (key, feeds) of one model file under one onnxruntime session."""
        try:
            session = model_e2e.ort_session(path, args.threads)
        except Exception as e:  # noqa: BLE001 - onnxruntime refusing a file is a figure too
            for key, _ in keyed_shapes:
                refuse(key, f"onnxruntime: {type(e).__name__}: {e}")
            return
        compiled = None
        for key, feeds in keyed_shapes:
            try:
                if compiled is None:
                    compiled = ShapeSpecializedModel(path, max_shapes=2)
                run_shape(key, name, path, session, feeds, compiled)
            except Exception as e:  # noqa: BLE001 - a refusal or a crash is a figure, the run goes on
                refuse(key, e)
            gc.collect()
        del session, compiled
        gc.collect()

    def export_all(tmp: str) -> dict:
        """{(name, exporter): (seconds, None or why it failed)}: each torch-defined model exported
        with symbolic axes into tmp/NAME.EXPORTER/NAME.onnx before anything is timed, several export
        processes at a time (an export is minutes of mostly one-threaded Python: one after another
        they were a sixth of the run; nothing is timed while they run)."""
        todo = [(name, exporter) for name in args.models if not name.startswith("light_") for exporter in exporters]

        def one(job):
            name, exporter = job
            where = Path(f"{tmp}/{name}.{exporter}")
            where.mkdir()
            seq = seqs[0] if name in SEQ_MODELS else DEFAULT_SEQ
            t0 = time.perf_counter()
            # an example batch of 2: the dynamo exporter specializes axes of size 1
            failed = export_torch(name, str(where / f"{name}.onnx"), exporter, 2, seq, dynamic=True)
            print(f"[{elapsed()}] {name}/{exporter}: exported" + (f" (failed: {failed})" if failed else ""), flush=True)
            return round(time.perf_counter() - t0, 1), failed

        # two at a time on 2 cores; on a many-core machine half its cores (at most 8: each is a
        # torch process of a few GB)
        at_once = max(2, min(8, (os.cpu_count() or 2) // 2))
        print(f"[{elapsed()}] exporting {len(todo)} files, {at_once} at a time ...", flush=True)
        with ThreadPoolExecutor(at_once) as pool:
            return dict(zip(todo, pool.map(one, todo)))

    with tempfile.TemporaryDirectory() as tmp:
        exported = export_all(tmp)
        for i, name in enumerate(args.models):
            if i:   # the host is shared: another reading between models, the fastest is the figure
                bandwidth = round(max(bandwidth, memory_gbps(args.threads)), 1)
            shapes = [(b, s) for b in batches for s in (seqs if name in SEQ_MODELS else [DEFAULT_SEQ])]
            if name.startswith("light_"):
                path = f"{tmp}/{name}.onnx"
                try:
                    light_model(name[len("light_"):], path)
                    rescale_last_layer(path, args.threads)
                    symbolic_batch(path)
                    model = onnx.load(path)
                except Exception as e:  # noqa: BLE001 - reported for each of its shapes
                    for b, s in shapes:
                        refuse(key_of(name, "onnx", b, s), e)
                    continue
                keyed = [(key_of(name, "onnx", b, s), model_inputs(model, batch=b)) for b, s in shapes]
                del model
                run_file(path, name, keyed)
                Path(path).unlink()
                continue
            for exporter in exporters:
                tag, where = f"{name}/{exporter}", f"{tmp}/{name}.{exporter}"
                path = f"{where}/{name}.onnx"
                export_s, failed = exported[(name, exporter)]
                if failed is None:
                    keyed = [(key_of(name, exporter, b, s), model_feeds(name, b, s)) for b, s in shapes]
                    report["export_seconds"].update((key, export_s) for key, _ in keyed)
                    run_file(path, name, keyed)
                else:
                    print(f"{tag}: no export with symbolic axes ({failed}); exporting each shape", flush=True)
                    static_exports.append(tag)
                    for b, s in shapes:
                        key, path = key_of(name, exporter, b, s), f"{where}/{name}_b{b}_s{s}.onnx"
                        t0 = time.perf_counter()
                        failed = export_torch(name, path, exporter, b, s, dynamic=False)
                        report["export_seconds"][key] = round(export_s + time.perf_counter() - t0, 1)
                        if failed is not None:
                            refuse(key, f"{exporter} export: {failed}")
                            continue
                        run_file(path, name, [(key, model_feeds(name, b, s))])
                        for f in Path(where).glob(f"{name}_b{b}_s{s}.onnx*"):
                            f.unlink()
                for f in Path(where).iterdir():
                    f.unlink()
    bandwidth = round(max(bandwidth, memory_gbps(args.threads)), 1)
    ratios = report["ratio_vs_onnxruntime"]
    report.update(geomean=round(geomean(ratios.values()), 3), min=min(ratios.values(), default=0.0),
                  memory_gbps=bandwidth, refused=sorted(refused), refused_reasons=refused,
                  static_exports=static_exports, tuned=bool(args.tune), threads=args.threads,
                  exporters=list(exporters), batches=batches, seqs=seqs)
    by_key = report["decode_gbps_by_key"]
    # the matrix-vector step is batch 1's: a batch-8 step shares each weight among 8 tokens
    vector_steps = [v for k, v in by_key.items() if "/b1" in k] or list(by_key.values())
    if vector_steps:
        report["decode_gbps"] = min(vector_steps)
    if args.tune:
        report["tune_trials_per_model"] = args.tune
    print(f"\ngeomean {report['geomean']:.3f}x onnxruntime over {len(ratios)} shapes, min {report['min']:.3f}x; "
          f"refused {len(refused)}; memory read {bandwidth} GB/s"
          + "".join(f"; {k} decode {v} GB/s" for k, v in by_key.items()), flush=True)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
