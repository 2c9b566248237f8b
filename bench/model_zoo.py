"""Any model, not only the four of model_e2e.py: tunefarm against onnxruntime on networks it was
never fitted to (issue 34).

Models, batch 1:
- every model the `onnx` package ships under onnx/backend/test/data/light/ (AlexNet, DenseNet-121,
  Inception v1 and v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19, ZFNet-512: Caffe2 exports of
  opset 9 whose weights are ConstantOfShape nodes of one value), each ConstantOfShape replaced by
  seeded random weights of its shape, scaled by role (He-scaled convolution and linear weights,
  BatchNorm statistics near identity), and the last layer before the Softmax rescaled so the
  logits have a spread of LOGIT_STD (a flat Softmax would hide errors);
- the four models of bench/model_e2e.py (ResNet-18, MobileNetV2, an MLP, a BERT-base layer);
- networks written here in torch.nn and exported with torch's CPU build (TorchScript exporter,
  opset 17), each spelling its layers the way its reference implementation does: ResNet-50 with
  the stride on the 3x3 (torchvision v1.5), ShuffleNetV2 x1.0 (channel split, shuffle as
  Reshape/Transpose/Reshape), a DenseNet block pair (BatchNorm after Concat), Inception-v3
  blocks (Concat of four branches, an average-pool branch), EfficientNet-B0 MBConv blocks
  (squeeze-excite, Swish) and MobileNetV3 blocks (HardSwish, HardSigmoid gate), ConvNeXt blocks
  (7x7 depthwise, LayerNorm over channels, layer scale), a ViT-S encoder layer with its patch
  embedding (fused QKV projection unbound into three).

Each is imported with `compiler.graph.from_onnx` and built untuned (default schedules), checked
against onnxruntime on the same input, and both are timed alternately for `--rounds` rounds on
`--threads` threads each (the protocol of model_e2e.py); a ratio is the median of the rounds'
ratios (model_e2e.round_ratio), so a host that slows down between rounds moves both sides of it. `--tune TRIALS` first tunes each model's
fused workloads with that many trials (fresh SQLite records), then times tuned, untuned and
onnxruntime in the same rounds.

A model tunefarm refuses or fails on is listed under `refused` with the reason; the run goes on.

Prints a table, then one JSON line: `ratio_vs_onnxruntime` ({model: onnxruntime's time / ours}),
`geomean`, `min`, `max_rel_error`, `refused`, `tuned`, and per model the latencies, build seconds
and workload counts; with --tune also the untuned ratios and the tuning seconds and trials.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import model_e2e  # noqa: E402 - the four models, the timing protocol, tuning

LIGHT = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet",
         "vgg19", "zfnet512")
E2E = model_e2e.MODELS
TORCH = ("resnet50_v15", "shufflenet_v2", "densenet_blocks", "inception_v3_blocks", "efficientnet_blocks",
         "mobilenet_v3_blocks", "convnext_blocks", "vit_s_layer")
MODELS = tuple(f"light_{n}" for n in LIGHT) + E2E + TORCH
LOGIT_STD = 3.0


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
    import onnxruntime as ort
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
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    session = ort.InferenceSession(probe.SerializeToString(), so, providers=["CPUExecutionProvider"])
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


def model_inputs(model, seed: int = 0) -> dict:
    """Random standard-normal float32 arrays for the model's non-initializer inputs."""
    inits = {i.name for i in model.graph.initializer}
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        shape = tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
        feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


# ----------------------------------------------------------------------------- torch.nn networks

def torch_networks():
    """name -> (module, input shape) of the networks written here (see the module docstring)."""
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

    return {"resnet50_v15": (ResNet50(), (1, 3, 224, 224)), "shufflenet_v2": (ShuffleNetV2(), (1, 3, 224, 224)),
            "densenet_blocks": (DenseNetBlocks(), (1, 3, 224, 224)),
            "inception_v3_blocks": (InceptionBlocks(), (1, 192, 35, 35)),
            "efficientnet_blocks": (EfficientNetBlocks(), (1, 3, 224, 224)),
            "mobilenet_v3_blocks": (MobileNetV3Blocks(), (1, 3, 224, 224)),
            "convnext_blocks": (ConvNeXtBlocks(), (1, 3, 224, 224)), "vit_s_layer": (ViTLayer(), (1, 3, 224, 224))}


def export_torch_here(name: str, path: str) -> None:
    """Random weights (torch's initialization, seeded), exported as model_e2e.py exports."""
    import torch
    torch.manual_seed(0)
    module, shape = torch_networks()[name]
    model_e2e.export_module(module, shape, path)


def make_model(name: str, directory: str) -> str:
    """The model's ONNX file in `directory`; torch exports run in a child process (its OpenMP
    runtime never enters the timing process)."""
    path = f"{directory}/{name}.onnx"
    if name.startswith("light_"):
        light_model(name[len("light_"):], path)
    elif name in E2E:
        return model_e2e.export(name, directory)
    else:
        subprocess.run([sys.executable, __file__, "--export", name, path], check=True)
    return path


# ----------------------------------------------------------------------------- the run

def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument("--rounds", type=int, default=5, help="alternating timing rounds per model")
    ap.add_argument("--threads", type=int, default=2, help="threads of both runtimes")
    ap.add_argument("--tune", type=int, default=None, metavar="TRIALS",
                    help="tune each model first with this many trials (fresh records), then time tuned and untuned")
    ap.add_argument("--export", nargs=2, metavar=("MODEL", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.export:
        export_torch_here(*args.export)
        return 0
    if args.tune is not None and args.tune < 1:
        ap.error(f"--tune needs at least 1 trial, got {args.tune}")
    try:
        import onnx
        import onnxruntime as ort
    except ImportError:
        print("needs the bench extra: pip install -e '.[bench]' (torch 2.13.0 CPU, onnxruntime)", file=sys.stderr)
        return 2

    import compiler
    from compiler.graph import build_model, extract_tasks, from_onnx

    compiler.set_num_threads(args.threads)
    mode = f"tuned with {args.tune} trials per model" if args.tune else "untuned (default schedules)"
    print(f"host target {compiler.Target.host()}; {args.threads} threads; onnxruntime {ort.__version__}; "
          f"{mode}\n", flush=True)

    def build(graph, records):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # "no tuned schedule": the default schedule, as intended
            return build_model(graph, records=records)

    keys = ("ratio_vs_onnxruntime", "tunefarm_ms", "onnxruntime_ms", "max_rel_error", "build_seconds", "workloads",
            "disturbed")
    report: dict = {k: {} for k in keys}
    if args.tune:
        for k in ("untuned_ratio_vs_onnxruntime", "tunefarm_untuned_ms", "tuning_seconds", "tuning_trials"):
            report[k] = {}
    refused: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            path = make_model(name, tmp)
            rescale_last_layer(path, args.threads)
            model = onnx.load(path)
            feeds = model_inputs(model)
            so = ort.SessionOptions()
            so.intra_op_num_threads, so.inter_op_num_threads = args.threads, 1
            session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            refs = session.run(None, feeds)
            try:
                graph = from_onnx(path)
                records = None
                if args.tune:
                    print(f"{name}: tuning {args.tune} trials ...", flush=True)
                    records, tune_s, trials, n_tasks = model_e2e.tune(graph, args.tune, tempfile.mkdtemp(dir=tmp))
                    report["tuning_seconds"][name], report["tuning_trials"][name] = round(tune_s, 1), trials
                t0 = time.perf_counter()
                module = build(graph, records)
                report["build_seconds"][name] = round(time.perf_counter() - t0, 1)
                untuned = build(graph, None) if args.tune else None
                outs = module.run(**feeds)
            except Exception as e:  # noqa: BLE001 - a refusal or a crash is a figure, the run goes on
                refused[name] = f"{type(e).__name__}: {e}"[:400]
                print(f"{name:<22} REFUSED  {refused[name]}", flush=True)
                if not isinstance(e, compiler.graph.GraphError):
                    traceback.print_exc()
                continue
            report["workloads"][name] = len(extract_tasks(graph))
            report["max_rel_error"][name] = max(model_e2e.max_rel_error(o, r) for o, r in zip(outs, refs))
            runs = {"ours": lambda m=module, f=feeds: m.run(**f),
                    "onnxruntime": lambda s=session, f=feeds: s.run(None, f)}
            if untuned is not None:
                runs["untuned"] = lambda m=untuned, f=feeds: m.run(**f)
            timed = model_e2e.time_interleaved(runs, args.rounds)
            ours, theirs = timed["ours"][0], timed["onnxruntime"][0]
            report["tunefarm_ms"][name], report["onnxruntime_ms"][name] = ours, theirs
            report["ratio_vs_onnxruntime"][name] = round(model_e2e.round_ratio(timed, "onnxruntime", "ours"), 3)
            report["disturbed"][name] = any(t[1] for t in timed.values())
            line = (f"{name:<22} tunefarm {ours:9.3f} ms   onnxruntime {theirs:9.3f} ms   ratio "
                    f"{report['ratio_vs_onnxruntime'][name]:5.2f}x"
                    f"   max rel. error {report['max_rel_error'][name]:.1e}   {len(module.steps)} kernels, "
                    f"{report['workloads'][name]} workloads, built in {report['build_seconds'][name]} s")
            if untuned is not None:
                u = timed["untuned"][0]
                report["tunefarm_untuned_ms"][name] = u
                report["untuned_ratio_vs_onnxruntime"][name] = round(model_e2e.round_ratio(timed, "onnxruntime", "untuned"), 3)
                line += (f"\n{'':<22} untuned  {u:9.3f} ms   ratio {report['untuned_ratio_vs_onnxruntime'][name]:5.2f}x"
                         f"   tuned {trials} trials over {n_tasks} workloads in {report['tuning_seconds'][name]} s")
            if report["disturbed"][name]:
                line += "   DISTURBED"
            print(line, flush=True)
    ratios = report["ratio_vs_onnxruntime"]
    report.update(geomean=round(geomean(ratios.values()), 3), min=min(ratios.values(), default=0.0),
                  refused=sorted(refused), refused_reasons=refused, tuned=bool(args.tune), threads=args.threads)
    if args.tune:
        report["tune_trials_per_model"] = args.tune
    print(f"\ngeomean {report['geomean']:.3f}x onnxruntime over {len(ratios)} models, min {report['min']:.3f}x; "
          f"refused {len(refused)}", flush=True)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
