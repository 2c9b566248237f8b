"""Task scheduling: the ResNet-50 convolutions under one trial budget, round-robin vs gradient.

The 23 distinct conv2d layers of ResNet-50 (v1.5, batch 1, NCHW), each weighted by how often it
occurs in the network, are tuned as one job: the objective is the weighted sum of their best
latencies, which is what the model's convolutions cost. Both schedulers get the same budget,
batch size, search strategy and seeds, and a fresh records database each (no warm start), so
only the allocation of batches to tasks differs.

Reported per scheduler: the weighted latency after `--trials` trials (mean over seeds), and
`gradient_trials_to_rr_final / rr_trials`: the fraction of round-robin's trials the gradient
scheduler needed to reach round-robin's final weighted latency (per seed, then the mean; 1.0 or
more when it never got there). Latencies are the tuning measurements themselves (no end-of-run
re-measurement), the same way for both. Last line: one JSON object.

    .venv/bin/python bench/task_scheduler.py --trials 300 --seeds 3
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

# (C, H, W, F, K, stride, padding, occurrences in ResNet-50)
RESNET50_CONVS = [
    (3, 224, 224, 64, 7, 2, 3, 1),
    (64, 56, 56, 64, 1, 1, 0, 1), (64, 56, 56, 64, 3, 1, 1, 3), (64, 56, 56, 256, 1, 1, 0, 4),
    (256, 56, 56, 64, 1, 1, 0, 2),
    (256, 56, 56, 128, 1, 1, 0, 1), (128, 56, 56, 128, 3, 2, 1, 1), (128, 28, 28, 512, 1, 1, 0, 4),
    (256, 56, 56, 512, 1, 2, 0, 1), (512, 28, 28, 128, 1, 1, 0, 3), (128, 28, 28, 128, 3, 1, 1, 3),
    (512, 28, 28, 256, 1, 1, 0, 1), (256, 28, 28, 256, 3, 2, 1, 1), (256, 14, 14, 1024, 1, 1, 0, 6),
    (512, 28, 28, 1024, 1, 2, 0, 1), (1024, 14, 14, 256, 1, 1, 0, 5), (256, 14, 14, 256, 3, 1, 1, 5),
    (1024, 14, 14, 512, 1, 1, 0, 1), (512, 14, 14, 512, 3, 2, 1, 1), (512, 7, 7, 2048, 1, 1, 0, 3),
    (1024, 14, 14, 2048, 1, 2, 0, 1), (2048, 7, 7, 512, 1, 1, 0, 2), (512, 7, 7, 512, 3, 1, 1, 2),
]


def resnet50_tasks(limit: int | None = None):
    from tuner.workload import Task, Workload
    out = []
    for C, H, W, F, K, stride, pad, count in RESNET50_CONVS[:limit]:
        params = dict(N=1, C=C, H=H, W=W, F=F, KH=K, KW=K, stride=stride, padding=pad)
        out.append((Task.create(Workload("conv2d_nchw", params)), float(count)))
    return out


def run_once(scheduler: str, trials: int, seed: int, batch: int, space: str, limit: int | None):
    """(curve of (trials, weighted latency), final weighted latency) of one tuning job."""
    from tuner.engine import Callbacks
    from tuner.measure import BuilderPool, LocalRunner
    from tuner.records import open_store
    from tuner.tune import tune_tasks

    entries = resnet50_tasks(limit)
    tasks, weights = [t for t, _ in entries], [w for _, w in entries]
    best = {t: math.inf for t in tasks}
    curve, done = [], [0]

    def on_batch(report):
        best[report.task] = report.result.best_cost
        if report.kind == "search":
            done[0] += len(report.candidates)
            curve.append((done[0], sum(w * best[t] for t, w in zip(tasks, weights))))

    with tempfile.TemporaryDirectory() as tmp, BuilderPool(timeout=60) as builder, LocalRunner() as runner:
        store = open_store(f"sqlite:///{Path(tmp) / 'records.db'}")
        out = tune_tasks(tasks, store, weights=weights, scheduler=scheduler, space=space, trials=trials,
                         batch_size=batch, seed=seed, builder=builder, runner=runner, top_k=0,
                         callbacks=Callbacks(on_batch=on_batch))
        store.close()
    return curve, curve[-1][1] if curve else math.inf, out.allocations


def trials_to_reach(curve, target: float) -> int | None:
    return next((n for n, v in curve if v <= target), None)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--space", choices=("sketch", "template"), default="template")
    ap.add_argument("--layers", type=int, default=None, help="only the first N layers (a quick run)")
    args = ap.parse_args()

    t0 = time.perf_counter()
    finals = {"round-robin": [], "gradient": []}
    fractions = []
    for seed in range(args.seeds):
        rr_curve, rr_final, _ = run_once("round-robin", args.trials, seed, args.batch, args.space, args.layers)
        gr_curve, gr_final, alloc = run_once("gradient", args.trials, seed, args.batch, args.space, args.layers)
        finals["round-robin"].append(rr_final)
        finals["gradient"].append(gr_final)
        reached = trials_to_reach(gr_curve, rr_final)
        rr_trials = rr_curve[-1][0]
        fractions.append(reached / rr_trials if reached is not None else 1.0 + 1e-9)
        print(f"seed {seed}: weighted latency round-robin {1e3 * rr_final:.3f} ms, gradient {1e3 * gr_final:.3f} ms; "
              f"gradient reached round-robin's final after {reached} of {rr_trials} trials "
              f"(batches per task: {[alloc.count(i) for i in range(max(alloc) + 1)]})", flush=True)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    print(f"{'scheduler':<14}{'weighted latency ms':>22}")
    for name, vals in finals.items():
        print(f"{name:<14}{1e3 * mean(vals):>22.3f}")
    frac = mean(fractions)
    print(f"gradient needs {100 * frac:.0f} % of round-robin's trials to reach its final weighted latency "
          f"({args.seeds} seeds, {args.trials} trials, {len(resnet50_tasks(args.layers))} tasks)")
    print(json.dumps({
        "tasks": len(resnet50_tasks(args.layers)), "trials": args.trials, "seeds": args.seeds, "batch": args.batch,
        "space": args.space,
        "weighted_latency_ms": {k: round(1e3 * mean(v), 4) for k, v in finals.items()},
        "weighted_latency_ms_per_seed": {k: [round(1e3 * x, 4) for x in v] for k, v in finals.items()},
        "gradient_trials_to_rr_final_over_rr_trials": round(frac, 3),
        "per_seed_fraction": [round(f, 3) for f in fractions],
        "seconds": round(time.perf_counter() - t0, 1),
    }))


if __name__ == "__main__":
    main()
