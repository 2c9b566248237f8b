"""ResNet-50's batch-1 convolutions: tunefarm's default and tuned kernels against oneDNN (issue 22).

For each layer (the 7x7/2 stem, the 3x3 convolutions of res2-res5 and their stride-2 first
blocks, the 1x1 reductions and expansions, the stride-2 1x1 downsamples; with `--set others`,
other networks' dilated, grouped, depthwise, asymmetric and odd-sized ones): tune conv2d_nchw with
the sketch space for `--trials` measurements (a real run: builder pool, isolated measuring
worker, records in a fresh SQLite file, end-of-run re-timing), build the best record through
apply-best, and check the default and the tuned kernel against a float64 reference. Then, with
nothing else of tunefarm running, time the default, the tuned kernel and
`torch.nn.functional.conv2d` (PyTorch's CPU build calls oneDNN) on the same inputs, alternately
for `--rounds` rounds, all by the measurement protocol.

Prints a table, then one JSON line: `tuned_vs_onednn` and `default_vs_onednn` per layer (oneDNN's
time / ours, same run; > 1 means we are faster) with their `geomean`, `default_ms` and
`onednn_ms` (medians), trials and tuning seconds. Both libraries run on `--threads` (default:
every core); the kernels are the host target's, made for every core.
Needs the `bench` extra (`pip install -e '.[bench]'`: torch 2.13.0, CPU build).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from reference_libs import import_torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# name: (C, H=W, F, K, stride, pad) of ResNet-50 v1.5 at batch 1, 224x224
LAYERS = {
    "stem 7x7/2": (3, 224, 64, 7, 2, 3),
    "res2 3x3": (64, 56, 64, 3, 1, 1),
    "res2 1x1 64>256": (64, 56, 256, 1, 1, 0),
    "res2 1x1 256>64": (256, 56, 64, 1, 1, 0),
    "res3 3x3/2": (128, 56, 128, 3, 2, 1),
    "res3 3x3": (128, 28, 128, 3, 1, 1),
    "res3 1x1 128>512": (128, 28, 512, 1, 1, 0),
    "res3 1x1 512>128": (512, 28, 128, 1, 1, 0),
    "res3 down 1x1/2": (256, 56, 512, 1, 2, 0),
    "res4 3x3/2": (256, 28, 256, 3, 2, 1),
    "res4 3x3": (256, 14, 256, 3, 1, 1),
    "res4 1x1 256>1024": (256, 14, 1024, 1, 1, 0),
    "res4 1x1 1024>256": (1024, 14, 256, 1, 1, 0),
    "res4 down 1x1/2": (512, 28, 1024, 1, 2, 0),
    "res5 3x3/2": (512, 14, 512, 3, 2, 1),
    "res5 3x3": (512, 7, 512, 3, 1, 1),
    "res5 1x1 512>2048": (512, 7, 2048, 1, 1, 0),
    "res5 1x1 2048>512": (2048, 7, 512, 1, 1, 0),
    "res5 down 1x1/2": (1024, 14, 2048, 1, 2, 0),
}


# convolutions of other networks, of the kinds the ResNet-50 list lacks (issue 35: dilated, strided,
# grouped, odd sizes), as conv2d_nchw parameters (N=1; torch gets the same stride, padding,
# dilation and groups)
OTHERS = {
    "deeplab 3x3 dil2": dict(C=256, H=33, W=33, F=256, KH=3, KW=3, stride=1, padding=2, dilation=2),
    "resnext 3x3 g32": dict(C=256, H=28, W=28, F=256, KH=3, KW=3, stride=1, padding=1, groups=32),
    "grouped 3x3 g4": dict(C=128, H=30, W=30, F=128, KH=3, KW=3, stride=1, padding=1, groups=4),
    "depthwise 3x3": dict(C=144, H=56, W=56, F=144, KH=3, KW=3, stride=1, padding=1, groups=144),
    "inception 3x3 35": dict(C=96, H=35, W=35, F=96, KH=3, KW=3, stride=1, padding=1),
    "inception 5x5": dict(C=48, H=35, W=35, F=64, KH=5, KW=5, stride=1, padding=2),
    "inception 1x7": dict(C=128, H=17, W=17, F=128, KH=1, KW=7, stride=1, padding=(0, 3)),
    "inception 3x3/2 valid": dict(C=288, H=35, W=35, F=384, KH=3, KW=3, stride=2, padding=0),
    "vgg 3x3 odd 3>61": dict(C=3, H=57, W=61, F=61, KH=3, KW=3, stride=1, padding=1),
}
SETS = {"resnet50": list(LAYERS), "others": list(OTHERS), "all": [*LAYERS, *OTHERS]}


def params(layer: str) -> dict:
    if layer in OTHERS:
        return dict(N=1, **OTHERS[layer])
    C, H, F, K, stride, pad = LAYERS[layer]
    return dict(N=1, C=C, H=H, W=H, F=F, KH=K, KW=K, stride=stride, padding=pad)


def torch_args(layer: str) -> dict:
    """conv2d's keyword arguments for torch: the layer's stride, padding, dilation and groups."""
    p = params(layer)
    return dict(stride=p["stride"], padding=p["padding"], dilation=p.get("dilation", 1), groups=p.get("groups", 1))


def tune_layer(layer: str, trials: int, db_dir: str, seed: int):
    """Tune one layer in a fresh SQLite store; (TuneResult, store)."""
    from tuner.records import open_store
    from tuner.tune import tune
    from tuner.workload import Task, Workload
    store = open_store(f"sqlite:///{db_dir}/{''.join(c if c.isalnum() else '_' for c in layer)}.db")
    task = Task.create(Workload("conv2d_nchw", params(layer)))
    return tune(task, store, space="sketch", trials=trials, batch_size=8, seed=seed), store


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - ref) / np.linalg.norm(ref))


def pause() -> None:
    time.sleep(0.1)


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=32, help="tuning measurements per layer (0: defaults only)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating timing rounds per layer")
    ap.add_argument("--layers", nargs="+", choices=SETS["all"], default=None, help="layers by name (default: --set's)")
    ap.add_argument("--set", choices=list(SETS), default="resnet50",
                    help="ResNet-50's layers, other networks' convolutions (dilated, grouped, depthwise, odd sizes), or all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None,
                    help="threads of both libraries (default: every core; the kernels are made for every core)")
    args = ap.parse_args()

    torch = import_torch()
    if torch is None:
        return 2
    from blas_info import blas_line

    import compiler
    from compiler.ops import build_op, get_op
    from compiler.ops.base import random_inputs
    from compiler.verify import poisoned
    from tuner.apply_best import ApplyHistoryBest
    from tuner.numpy_baselines import time_callable

    target = compiler.Target.host()
    threads = args.threads or target.num_cores
    torch.set_num_threads(threads)
    compiler.set_num_threads(threads)
    print(f"host target: -mcpu={target.cpu}, {threads} threads; torch {torch.__version__}, "
          f"oneDNN {'on' if torch.backends.mkldnn.is_available() else 'OFF'}; {blas_line()}")
    print(f"sketch space, {args.trials} trials per layer; {args.rounds} alternating rounds\n", flush=True)

    rows, tuned_vs, default_vs, tune_seconds, speedups, default_ms, onednn_ms = [], {}, {}, {}, {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for layer in args.layers or SETS[args.set]:
            opdef = get_op("conv2d_nchw", **params(layer))
            default = build_op(opdef, target)
            if args.trials > 0:
                result, store = tune_layer(layer, args.trials, tmp, args.seed)
                with ApplyHistoryBest(store):
                    tuned = build_op(opdef, target)
                store.close()
                tune_seconds[layer] = round(result.tune_seconds, 1)
                speedups[layer] = round(result.speedup_over_default, 3)
            else:
                tuned = default
            data, weight = random_inputs(opdef, np.random.default_rng(0))
            conv_args = torch_args(layer)
            x, w = torch.from_numpy(data), torch.from_numpy(weight)
            ref = torch.nn.functional.conv2d(x.double(), w.double(), **conv_args).numpy()
            outs = []
            for kernel in (default, tuned):
                out = poisoned(opdef.output.shape, opdef.output.dtype, 0)
                kernel(data, weight, out)
                outs.append(out)
            errs = [rel_err(o, ref) for o in outs] + [rel_err(torch.nn.functional.conv2d(x, w, **conv_args).numpy(), ref)]
            if max(errs[:2]) > 1e-4:
                print(f"{layer}: WRONG RESULT (relative error default {errs[0]:.2e}, tuned {errs[1]:.2e})", file=sys.stderr)
                return 1

            out = poisoned(opdef.output.shape, opdef.output.dtype, 0)
            with torch.no_grad():
                def onednn(x=x, w=w, conv_args=conv_args):
                    torch.nn.functional.conv2d(x, w, **conv_args)
                t_def, t_tuned, t_torch = [], [], []
                for _ in range(args.rounds):
                    # a pause before each side: the other runtime's worker threads stop spinning
                    t_def.append(pause() or default.measure(data, weight, out).median)
                    t_tuned.append(pause() or tuned.measure(data, weight, out).median)
                    t_torch.append(pause() or time_callable(onednn, ()).median)
            d, t, o = (statistics.median(v) for v in (t_def, t_tuned, t_torch))
            tuned_vs[layer], default_vs[layer] = round(o / t, 3), round(o / d, 3)
            default_ms[layer], onednn_ms[layer] = round(d * 1e3, 4), round(o * 1e3, 4)
            gf = [f"{opdef.flops / sec / 1e9:.0f}" for sec in (d, t, o)]
            row = (layer, *gf, f"{o / d:.3f}", f"{o / t:.3f}",
                   f"{tune_seconds.get(layer, 0):.0f}", f"{max(errs):.1e}")
            rows.append(row)
            print("  " + "  ".join(row), file=sys.stderr, flush=True)

    head = ("layer", "default GF", "tuned GF", "oneDNN GF", "default/oneDNN", "tuned/oneDNN", "tune s", "rel err")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(v).rjust(w) if i else str(v).ljust(w) for i, (v, w) in enumerate(zip(r, widths))))
    tuned_vs["geomean"] = round(geomean(v for k, v in tuned_vs.items()), 3)
    default_vs["geomean"] = round(geomean(v for k, v in default_vs.items()), 3)
    print(json.dumps({"tuned_vs_onednn": tuned_vs, "default_vs_onednn": default_vs,
                      "speedup_over_default": speedups, "tune_seconds": tune_seconds,
                      "default_ms": default_ms, "onednn_ms": onednn_ms,
                      "trials": args.trials, "rounds": args.rounds, "threads": threads, "cpu": target.cpu}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
