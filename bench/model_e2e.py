"""Whole models, tunefarm against onnxruntime in the same process (issue 24).

Models (batch 1, random weights, exported from PyTorch's CPU build with torch.onnx.export, the
TorchScript exporter, opset 17): ResNet-18 at 224x224, MobileNetV2 at 224x224, and an MLP
784-512-512-10. Each is imported with `compiler.graph.from_onnx`, built with `build_model`
(untuned: the default schedules of its fused workloads; `--db URL` builds with the best records
of a records database instead), checked against onnxruntime on the same inputs (relative error
of the outputs), and then both are timed alternately for `--rounds` rounds by the measurement
protocol (tuner.numpy_baselines.time_callable), both on the same number of threads (2).

Prints a table, then one JSON line: latencies, `ratio_vs_onnxruntime` per model (onnxruntime's
time / ours, same run; > 1 means tunefarm is faster), the output errors, build seconds and the
number of fused workloads. Needs the `bench` extra (`pip install -e '.[bench]'`: torch 2.13.0 CPU,
onnxruntime).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = ("resnet18", "mobilenet_v2", "mlp", "bert_layer")


# ----------------------------------------------------------------------------- the models (PyTorch)

def torch_models():
    """name -> (module, input shape): ResNet-18, MobileNetV2 (torchvision's layouts, written out:
    torchvision is not a dependency) and an MLP."""
    import torch
    from torch import nn

    class Basic(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
            self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    class ResNet18(nn.Module):
        def __init__(self, classes=1000):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
            layers, cin = [], 64
            for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
                layers += [Basic(cin, cout, stride), Basic(cout, cout, 1)]
                cin = cout
            self.layers = nn.Sequential(*layers)
            self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(512, classes)

        def forward(self, x):
            return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))

    def conv_bn(cin, cout, k, s, groups=1, act=True):
        mods = [nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        return nn.Sequential(*(mods + [nn.ReLU6()] if act else mods))

    class Inverted(nn.Module):
        def __init__(self, cin, cout, stride, expand):
            super().__init__()
            hidden = cin * expand
            layers = [conv_bn(cin, hidden, 1, 1)] if expand != 1 else []
            layers += [conv_bn(hidden, hidden, 3, stride, groups=hidden), conv_bn(hidden, cout, 1, 1, act=False)]
            self.body = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            return x + self.body(x) if self.residual else self.body(x)

    class MobileNetV2(nn.Module):
        def __init__(self, classes=1000):
            super().__init__()
            cfg = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                   (6, 320, 1, 1)]
            layers, cin = [conv_bn(3, 32, 3, 2)], 32
            for t, c, n, s in cfg:
                for i in range(n):
                    layers.append(Inverted(cin, c, s if i == 0 else 1, t))
                    cin = c
            layers.append(conv_bn(cin, 1280, 1, 1))
            self.features = nn.Sequential(*layers)
            self.fc = nn.Linear(1280, classes)

        def forward(self, x):
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))

    class BertLayer(nn.Module):
        """One BERT-base encoder layer as Hugging Face's BertLayer writes it (post-LayerNorm,
        separate Q/K/V projections, erf GELU), without the attention mask (batch 1, no padding)."""

        def __init__(self, hidden=768, heads=12, ffn=3072):
            super().__init__()
            self.heads, self.head_dim = heads, hidden // heads
            self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
            self.attn_out, self.ln1 = nn.Linear(hidden, hidden), nn.LayerNorm(hidden, eps=1e-12)
            self.ffn_in, self.ffn_out = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)
            self.ln2 = nn.LayerNorm(hidden, eps=1e-12)

        def split_heads(self, t):
            b, s, _ = t.shape
            return t.view(b, s, self.heads, self.head_dim).permute(0, 2, 1, 3)

        def forward(self, x):
            q, k, v = self.split_heads(self.q(x)), self.split_heads(self.k(x)), self.split_heads(self.v(x))
            scores = torch.matmul(q, k.transpose(-1, -2)) / (self.head_dim ** 0.5)
            context = torch.matmul(torch.softmax(scores, dim=-1), v).permute(0, 2, 1, 3)
            context = context.reshape(x.shape[0], x.shape[1], -1)
            h = self.ln1(x + self.attn_out(context))
            return self.ln2(h + self.ffn_out(nn.functional.gelu(self.ffn_in(h))))

    mlp = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    return {"resnet18": (ResNet18(), (1, 3, 224, 224)), "mobilenet_v2": (MobileNetV2(), (1, 3, 224, 224)),
            "mlp": (mlp, (1, 784)), "bert_layer": (BertLayer(), (1, 128, 768))}


def export(name: str, directory: str) -> str:
    """The model as an ONNX file, written by a child process: PyTorch's own OpenMP runtime and
    threads never enter the process that times (with torch loaded, tunefarm's ResNet-18 ran 10x
    slower in one run here)."""
    path = f"{directory}/{name}.onnx"
    subprocess.run([sys.executable, __file__, "--export", name, path], check=True)
    return path


def export_here(name: str, path: str) -> None:
    """Random weights; BatchNorm statistics and LayerNorm's scale and shift randomized too, so
    folding them is not a no-op."""
    import torch
    torch.manual_seed(0)
    module, shape = torch_models()[name]
    g = torch.Generator().manual_seed(1)
    for m in module.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1, generator=g)
            m.running_var.uniform_(0.5, 1.5, generator=g)
            m.weight.data.uniform_(0.5, 1.5, generator=g)
            m.bias.data.uniform_(-0.1, 0.1, generator=g)
        if isinstance(m, torch.nn.LayerNorm):   # not ones and zeros (which the exporter also shares)
            m.weight.data.uniform_(0.5, 1.5, generator=g)
            m.bias.data.uniform_(-0.1, 0.1, generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the TorchScript exporter's deprecation notice
        torch.onnx.export(module.eval(), (torch.randn(*shape),), path, dynamo=False, opset_version=17,
                          input_names=["input"], output_names=["output"])


# ----------------------------------------------------------------------------- measuring

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument("--rounds", type=int, default=3, help="alternating timing rounds per model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--db", default=None, help="records database: build with its best records (default: untuned)")
    ap.add_argument("--export", nargs=2, metavar=("MODEL", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.export:
        export_here(*args.export)
        return 0
    try:
        import onnxruntime as ort
        torch_version = version("torch")
    except (ImportError, PackageNotFoundError):
        print("needs the bench extra: pip install -e '.[bench]' (torch 2.13.0 CPU, onnxruntime)", file=sys.stderr)
        return 2

    import compiler
    from compiler.graph import build_model, extract_tasks, from_onnx
    from tuner.numpy_baselines import time_callable

    compiler.set_num_threads(args.threads)
    provider = None
    if args.db:
        from tuner.apply_best import ApplyHistoryBest
        from tuner.records import open_store
        provider = ApplyHistoryBest(open_store(args.db))
    print(f"host target {compiler.Target.host()}; {args.threads} threads; onnxruntime {ort.__version__}, "
          f"torch {torch_version} (exports only); {'records ' + args.db if args.db else 'untuned (default schedules)'}\n",
          flush=True)

    ours_ms, theirs_ms, ratios, errors, build_s, workloads, kernels = {}, {}, {}, {}, {}, {}, {}
    disturbed, host_busy = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            path = export(name, tmp)
            graph = from_onnx(path)
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = build_model(graph, records=provider)
            build_s[name] = round(time.perf_counter() - t0, 1)
            workloads[name] = len(extract_tasks(graph))
            kernels[name] = len(module.steps)
            so = ort.SessionOptions()
            so.intra_op_num_threads, so.inter_op_num_threads = args.threads, 1
            session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            x = np.random.default_rng(0).standard_normal(graph.values["input"].shape).astype(np.float32)
            (ours,) = module.run(input=x)
            (ref,) = session.run(None, {"input": x})
            errors[name] = float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))
            t_ours, t_theirs = [], []
            for _ in range(args.rounds):
                t_ours.append(time_callable(lambda m=module, x=x: m.run(input=x), (), repeat=5))
                time.sleep(0.1)
                t_theirs.append(time_callable(lambda s=session, x=x: s.run(None, {"input": x}), (), repeat=5))
                time.sleep(0.1)
            ours_ms[name] = round(statistics.median(t.median for t in t_ours) * 1e3, 3)
            theirs_ms[name] = round(statistics.median(t.median for t in t_theirs) * 1e3, 3)
            disturbed[name] = any(t.disturbed for t in t_ours + t_theirs)
            host_busy[name] = round(max(t.host_busy for t in t_ours + t_theirs), 2)
            ratios[name] = round(theirs_ms[name] / ours_ms[name], 3)
            print(f"{name:<14} tunefarm {ours_ms[name]:9.3f} ms   onnxruntime {theirs_ms[name]:9.3f} ms   "
                  f"ratio {ratios[name]:5.2f}x   max rel. error {errors[name]:.1e}   {kernels[name]} kernels, "
                  f"{workloads[name]} workloads, built in {build_s[name]} s"
                  f"{'   DISTURBED (other processes: %.1f CPUs)' % host_busy[name] if disturbed[name] else ''}", flush=True)
    ok = all(e <= 1e-4 for e in errors.values())
    if not ok:
        print("OUTPUTS DISAGREE with onnxruntime beyond 1e-4 relative", file=sys.stderr)
    print(json.dumps({"ratio_vs_onnxruntime": ratios, "tunefarm_ms": ours_ms, "onnxruntime_ms": theirs_ms,
                      "max_rel_error": errors, "build_seconds": build_s, "workloads": workloads,
                      "disturbed": disturbed, "host_busy": host_busy, "tuned": bool(args.db), "threads": args.threads}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
