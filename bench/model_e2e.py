"""Whole models, tunefarm against onnxruntime in the same process (issue 24).

Models (batch 1, random weights, exported from PyTorch's CPU build with torch.onnx.export, the
TorchScript exporter, opset 17): ResNet-18 at 224x224, MobileNetV2 at 224x224, an MLP
784-512-512-10, and one BERT-base encoder layer (sequence 128, hidden 768, 12 heads, FFN 3072,
erf GELU, post-LayerNorm, as Hugging Face's BertLayer; no attention mask). Each is imported with
`compiler.graph.from_onnx`, built with `build_model` (untuned: the default schedules of its fused
workloads; `--db URL` builds with the best records of a records database instead), checked
against onnxruntime on the same inputs (relative error of the outputs), and then both are timed
alternately for `--rounds` rounds by the measurement protocol
(tuner.numpy_baselines.time_callable), both on the same number of threads (2).

`--tune TRIALS` first tunes each model's fused workloads under that budget (tuner.model_tuning:
the gradient task scheduler, measured here, into a fresh SQLite records file in a temp dir), then
builds the model with those records and times tuned, untuned and onnxruntime interleaved in the
same rounds.

Prints a table, then one JSON line: latencies, `ratio_vs_onnxruntime` per model (onnxruntime's
time / ours, the median of the rounds' ratios; > 1 means tunefarm is faster), the output errors, build seconds and the
number of fused workloads; with --tune also `tuned: true`, `untuned_ratio_vs_onnxruntime`,
`tunefarm_untuned_ms`, `tuning_seconds` and `tuning_trials` per model. Needs the `bench` extra
(`pip install -e '.[bench]'`: torch 2.13.0 CPU, onnxruntime).
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
    """Random weights (torch's initialization, seeded), exported by export_module."""
    import torch
    torch.manual_seed(0)
    module, shape = torch_models()[name]
    export_module(module, shape, path)


def export_module(module, shape: tuple, path: str) -> None:
    """`module` at opset 17 by the TorchScript exporter, its norms randomized first
    (randomize_norms; bench/model_zoo.py exports its networks with randomized norms too)."""
    import torch
    randomize_norms(module)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the TorchScript exporter's deprecation notice
        torch.onnx.export(module.eval(), (torch.randn(*shape),), path, dynamo=False, opset_version=17,
                          input_names=["input"], output_names=["output"])


def randomize_norms(module) -> None:
    """BatchNorm statistics and LayerNorm's scale and shift drawn at random (seeded), so folding
    them is not a no-op (and not ones and zeros, which the exporter also shares)."""
    import torch
    g = torch.Generator().manual_seed(1)
    for m in module.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1, generator=g)
            m.running_var.uniform_(0.5, 1.5, generator=g)
            m.weight.data.uniform_(0.5, 1.5, generator=g)
            m.bias.data.uniform_(-0.1, 0.1, generator=g)
        if isinstance(m, torch.nn.LayerNorm) and m.weight is not None:
            m.weight.data.uniform_(0.5, 1.5, generator=g)
            if m.bias is not None:
                m.bias.data.uniform_(-0.1, 0.1, generator=g)


# ----------------------------------------------------------------------------- tuning

def tune(graph, trials: int, directory: str):
    """Tune the model's fused workloads under `trials` new measurements (tuner.model_tuning: the
    gradient task scheduler, one shared cost model, measured on this machine) into a fresh SQLite
    records file in `directory`; returns (schedule provider of its best records, tuning seconds,
    trials spent, number of tasks)."""
    from compiler import Target
    from tuner.apply_best import ApplyHistoryBest
    from tuner.model_tuning import model_tasks, tune_model
    from tuner.records import open_store

    tasks = model_tasks(graph, Target.host())
    store = open_store(f"sqlite:///{directory}/records.db")
    t0 = time.perf_counter()
    out = tune_model(tasks, store, trials=trials, scheduler="gradient")
    return ApplyHistoryBest(store), time.perf_counter() - t0, out.scheduled.trials, len(tasks)


# ----------------------------------------------------------------------------- measuring

def time_interleaved(runs: dict, rounds: int, repeat: int = 5) -> dict:
    """{name: (median ms, disturbed, host busy CPUs, [each round's median ms])} of each callable
    in `runs`, timed by compiler.graph.run_timing.time_interleaved: the protocol `tunefarm model
    run` and `model profile` time a run with (sides alternated for `rounds` rounds, a pause
    between them, at least `repeat` clean samples a round)."""
    from compiler.graph.run_timing import time_interleaved as timed_runs
    return {name: (round(t.ms, 3), t.disturbed, round(t.host_busy, 2), t.rounds_ms)
            for name, t in timed_runs(runs, rounds, repeat).items()}


def round_ratio(timed: dict, reference: str, ours: str) -> float:
    """The median over rounds of reference / ours, each round's pair timed back to back: a host
    whose speed shifts between rounds (2-vCPU cloud hosts run some minutes a third slower, both
    runtimes alike) moves both sides of a round's ratio, not one side of the overall medians."""
    return statistics.median(r / o for r, o in zip(timed[reference][3], timed[ours][3]))


def max_rel_error(ours, ref) -> float:
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


# ----------------------------------------------------------------------------- shared setup (model_zoo.py too)

def add_common_args(ap, models, rounds: int, tune_group=None) -> None:
    """The flags both model benchmarks take: --models, --rounds, --threads, --tune (into
    `tune_group` where given: model_e2e makes it exclusive with --db) and the hidden --export
    MODEL PATH of the export child."""
    ap.add_argument("--models", nargs="+", choices=models, default=list(models))
    ap.add_argument("--rounds", type=int, default=rounds, help="alternating timing rounds per model")
    ap.add_argument("--threads", type=int, default=2, help="threads of both runtimes")
    (tune_group or ap).add_argument(
        "--tune", type=int, default=None, metavar="TRIALS",
        help="tune each model first with this many trials (fresh records in a temp dir), then time tuned and "
             "untuned against onnxruntime")
    ap.add_argument("--export", nargs=2, metavar=("MODEL", "PATH"), help=argparse.SUPPRESS)


def bench_versions() -> tuple | None:
    """(onnxruntime, torch) versions, or None (and a message) without the bench extra."""
    try:
        import onnxruntime as ort
        return ort.__version__, version("torch")
    except (ImportError, PackageNotFoundError):
        print("needs the bench extra: pip install -e '.[bench]' (torch 2.13.0 CPU, onnxruntime)", file=sys.stderr)
        return None


def ort_session(model, threads: int):
    """onnxruntime's CPU session of `model` (a path or the model's bytes) on `threads` intra-op
    threads (one inter-op thread), the reference both benchmarks time."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    src = model if isinstance(model, (bytes, bytearray)) else str(model)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def build_quiet(graph, records=None, target=None):
    """build_model without its "no tuned schedule" warnings (the default schedule, as intended)."""
    from compiler.graph import build_model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_model(graph, target=target, records=records)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--db", default=None, help="records database: build with its best records (default: untuned)")
    add_common_args(ap, MODELS, rounds=3, tune_group=where)
    args = ap.parse_args()
    if args.export:
        export_here(*args.export)
        return 0
    if args.tune is not None and args.tune < 1:
        ap.error(f"--tune needs at least 1 trial, got {args.tune}")
    versions = bench_versions()
    if versions is None:
        return 2
    ort_version, torch_version = versions

    import compiler
    from compiler.graph import extract_tasks, from_onnx

    compiler.set_num_threads(args.threads)
    provider = None
    if args.db:
        from tuner.apply_best import ApplyHistoryBest
        from tuner.records import open_store
        provider = ApplyHistoryBest(open_store(args.db))
    mode = (f"tuned with {args.tune} trials per model" if args.tune else
            "records " + args.db if args.db else "untuned (default schedules)")
    print(f"host target {compiler.Target.host()}; {args.threads} threads; onnxruntime {ort_version}, "
          f"torch {torch_version} (exports only); {mode}\n", flush=True)

    build = build_quiet
    report: dict = {k: {} for k in ("ratio_vs_onnxruntime", "tunefarm_ms", "onnxruntime_ms", "max_rel_error",
                                    "build_seconds", "workloads", "disturbed", "host_busy")}
    if args.tune:
        for k in ("untuned_ratio_vs_onnxruntime", "tunefarm_untuned_ms", "untuned_max_rel_error",
                  "tuning_seconds", "tuning_trials", "tuned_workloads"):
            report[k] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            path = export(name, tmp)
            graph = from_onnx(path)
            records, tuned_from = provider, None
            if args.tune:
                print(f"{name}: tuning {args.tune} trials ...", flush=True)
                records, tune_s, trials, n_tasks = tune(graph, args.tune, tempfile.mkdtemp(dir=tmp))
                report["tuning_seconds"][name], report["tuning_trials"][name] = round(tune_s, 1), trials
            t0 = time.perf_counter()
            module = build(graph, records)
            report["build_seconds"][name] = round(time.perf_counter() - t0, 1)
            report["workloads"][name] = len(extract_tasks(graph))
            if args.tune:
                tuned_from = build(graph, None)   # the untuned module, timed in the same rounds
                report["tuned_workloads"][name] = sum(1 for src in module.sources.values() if src == "records")
            session = ort_session(path, args.threads)
            x = np.random.default_rng(0).standard_normal(graph.values["input"].shape).astype(np.float32)
            (ref,) = session.run(None, {"input": x})
            report["max_rel_error"][name] = max_rel_error(module.run(input=x)[0], ref)
            runs = {"ours": lambda m=module, x=x: m.run(input=x),
                    "onnxruntime": lambda s=session, x=x: s.run(None, {"input": x})}
            if tuned_from is not None:
                report["untuned_max_rel_error"][name] = max_rel_error(tuned_from.run(input=x)[0], ref)
                runs["untuned"] = lambda m=tuned_from, x=x: m.run(input=x)
            timed = time_interleaved(runs, args.rounds)
            ours, theirs = timed["ours"][0], timed["onnxruntime"][0]
            report["tunefarm_ms"][name], report["onnxruntime_ms"][name] = ours, theirs
            report["ratio_vs_onnxruntime"][name] = round(round_ratio(timed, "onnxruntime", "ours"), 3)
            report["disturbed"][name] = any(t[1] for t in timed.values())
            report["host_busy"][name] = max(t[2] for t in timed.values())
            line = (f"{name:<14} tunefarm {ours:9.3f} ms   onnxruntime {theirs:9.3f} ms   ratio "
                    f"{report['ratio_vs_onnxruntime'][name]:5.2f}x   max rel. error {report['max_rel_error'][name]:.1e}   "
                    f"{len(module.steps)} kernels, {report['workloads'][name]} workloads, built in "
                    f"{report['build_seconds'][name]} s")
            if tuned_from is not None:
                untuned = timed["untuned"][0]
                report["tunefarm_untuned_ms"][name] = untuned
                report["untuned_ratio_vs_onnxruntime"][name] = round(round_ratio(timed, "onnxruntime", "untuned"), 3)
                line += (f"\n{'':<14} untuned  {untuned:9.3f} ms   ratio "
                         f"{report['untuned_ratio_vs_onnxruntime'][name]:5.2f}x   tuned "
                         f"{trials} trials over {n_tasks} workloads in {report['tuning_seconds'][name]} s "
                         f"({report['tuned_workloads'][name]} built from records)")
            if report["disturbed"][name]:
                line += f"   DISTURBED (other processes: {report['host_busy'][name]:.1f} CPUs)"
            print(line, flush=True)
    errors = list(report["max_rel_error"].values()) + list(report.get("untuned_max_rel_error", {}).values())
    ok = all(e <= 1e-4 for e in errors)
    if not ok:
        print("OUTPUTS DISAGREE with onnxruntime beyond 1e-4 relative", file=sys.stderr)
    report.update(tuned=bool(args.db or args.tune), threads=args.threads)
    if args.tune:
        report["tune_trials_per_model"] = args.tune
    print(json.dumps(report))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
