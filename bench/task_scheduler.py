"""Task scheduling: the ResNet-50 convolutions under one trial budget, round-robin vs gradient.

The 23 distinct conv2d layers of ResNet-50 (v1.5, batch 1, NCHW), each weighted by how often it
occurs in the network, are tuned as one job: the objective is the weighted sum of their best
latencies, which is what the model's convolutions cost. Both schedulers get the same budget,
batch size, search strategy and seeds, and a fresh records database each (no warm start), so
only the allocation of batches to tasks differs.

Reported per scheduler: the weighted latency after `--trials` trials (mean over seeds), and
`gradient_trials_to_rr_final / rr_trials`: the fraction of round-robin's trials the gradient
scheduler needed to reach round-robin's final weighted latency (per seed, then the mean; 1.0 or
more when it never got there). The curves are not drawn from the tuning measurements, taken
minutes apart on a shared machine: every candidate that was some task's best at some point of
either run is re-timed in one interleaved session at the end, and both curves are computed from
those costs. Last line: one JSON object.

By default no task measures its default schedule (`--baseline` turns it on): the hand-written
defaults of these convolutions are within noise of the best the search finds in a few hundred
trials, so with them every curve starts at its end and both schedulers "reach" round-robin's final
latency at once. Without them the bench measures what it is about: how fast each allocation rule
brings the search's own best schedules down, as in Ansor's evaluation.

    .venv/bin/python bench/task_scheduler.py --trials 600 --seeds 3
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


def run_once(scheduler: str, tasks, weights, trials: int, seed: int, batch: int, space: str, baseline: bool,
             builder, runner):
    """[(trials so far, {task: best candidate so far})] after every search batch, and the
    allocation of batches to tasks, of one tuning job on a fresh records database."""
    from tuner.engine import Callbacks
    from tuner.records import open_store
    from tuner.tune import tune_tasks

    best: dict = {}
    steps, done = [], [0]

    def on_batch(report):
        if report.result.best_candidate is not None:
            best[report.task] = report.result.best_candidate
        if report.kind == "search":
            done[0] += len(report.candidates)
            steps.append((done[0], dict(best)))

    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(f"sqlite:///{Path(tmp) / 'records.db'}")
        out = tune_tasks(tasks, store, weights=weights, scheduler=scheduler, space=space, trials=trials,
                         batch_size=batch, seed=seed, builder=builder, runner=runner, top_k=0, baseline=baseline,
                         callbacks=Callbacks(on_batch=on_batch))
        store.close()
    return steps, out.allocations


def retime(pairs, builder, runner, rounds: int = 3) -> dict:
    """Median cost of every (task, candidate) over `rounds` interleaved rounds in one session: the
    two runs' curves are drawn from these, not from timings taken minutes apart on a shared machine."""
    import statistics
    by_task: dict = {}
    for task, cand in pairs:
        by_task.setdefault(task, {})[cand.fingerprint] = cand
    builds = {task: (list(c.values()), builder.build(task, list(c.values()))) for task, c in by_task.items()}
    costs: dict = {}
    for _ in range(rounds):
        for task, (cands, brs) in builds.items():
            for cand, res in zip(cands, runner.run(task, brs)):
                if res.ok:
                    costs.setdefault((task, cand.fingerprint), []).append(res.cost)
    return {key: statistics.median(v) for key, v in costs.items()}


def curve_of(steps, tasks, weights, costs) -> list:
    """(trials, weighted latency) from the re-timed costs of the best candidates at each step."""
    out = []
    for n, best in steps:
        if len(best) == len(tasks):
            out.append((n, sum(w * costs.get((t, best[t].fingerprint), math.inf) for t, w in zip(tasks, weights))))
    return out


def print_layers(tasks, weights, rr_best, gr_best, rr_alloc, gr_alloc, costs) -> None:
    """Per layer: weight, batches each scheduler gave it, its re-timed best under each (ms), and
    its share of the weighted latency: where the two objectives differ."""
    print(f"  {'layer (C,H,W,F,K,s)':<26}{'w':>3}{'rr b':>6}{'gr b':>6}{'rr ms':>9}{'gr ms':>9}{'rr w*ms':>9}{'gr w*ms':>9}")
    for i, (t, w) in enumerate(zip(tasks, weights)):
        p = t.workload.params
        name = f"{p['C']},{p['H']},{p['W']},{p['F']},{p['KH']},{p['stride']}"
        rr, gr = (1e3 * costs.get((t, best[t].fingerprint), math.inf) for best in (rr_best, gr_best))
        print(f"  {name:<26}{w:>3g}{rr_alloc.count(i):>6}{gr_alloc.count(i):>6}{rr:>9.3f}{gr:>9.3f}"
              f"{w * rr:>9.3f}{w * gr:>9.3f}")


def trials_to_reach(curve, target: float) -> int | None:
    return next((n for n, v in curve if v <= target), None)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=600)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--space", choices=("sketch", "template"), default="template")
    ap.add_argument("--layers", type=int, default=None, help="only the first N layers (a quick run)")
    ap.add_argument("--baseline", action="store_true", help="measure every task's default schedule first")
    ap.add_argument("--min-repeat-ms", type=float, default=20.0, help="timing floor per measurement")
    args = ap.parse_args()

    from tuner.measure import BuilderPool, LocalRunner, MeasureOptions

    t0 = time.perf_counter()
    entries = resnet50_tasks(args.layers)
    tasks, weights = [t for t, _ in entries], [w for _, w in entries]
    finals = {"round-robin": [], "gradient": []}
    fractions = []
    with BuilderPool(timeout=60) as builder, LocalRunner(MeasureOptions(min_repeat_ms=args.min_repeat_ms)) as runner:
        for seed in range(args.seeds):
            rr_steps, rr_alloc = run_once("round-robin", tasks, weights, args.trials, seed, args.batch, args.space,
                                   args.baseline, builder, runner)
            gr_steps, alloc = run_once("gradient", tasks, weights, args.trials, seed, args.batch, args.space,
                                       args.baseline, builder, runner)
            pairs = {(t, c.fingerprint): (t, c) for _, best in rr_steps + gr_steps for t, c in best.items()}.values()
            costs = retime(pairs, builder, runner)
            rr_curve, gr_curve = (curve_of(st, tasks, weights, costs) for st in (rr_steps, gr_steps))
            rr_final, gr_final = rr_curve[-1][1], gr_curve[-1][1]
            finals["round-robin"].append(rr_final)
            finals["gradient"].append(gr_final)
            reached = trials_to_reach(gr_curve, rr_final)
            rr_trials = rr_curve[-1][0]
            fractions.append(reached / rr_trials if reached is not None else 1.0 + 1e-9)
            print(f"seed {seed}: weighted latency round-robin {1e3 * rr_final:.3f} ms, gradient "
                  f"{1e3 * gr_final:.3f} ms (re-timed together); gradient reached round-robin's final after "
                  f"{reached} of {rr_trials} trials (batches per task: "
                  f"{[alloc.count(i) for i in range(len(tasks))]})", flush=True)
            print_layers(tasks, weights, rr_steps[-1][1], gr_steps[-1][1], rr_alloc, alloc, costs)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    print(f"{'scheduler':<14}{'weighted latency ms':>22}")
    for name, vals in finals.items():
        print(f"{name:<14}{1e3 * mean(vals):>22.3f}")
    frac = mean(fractions)
    print(f"gradient needs {100 * frac:.0f} % of round-robin's trials to reach its final weighted latency "
          f"({args.seeds} seeds, {args.trials} trials, {len(resnet50_tasks(args.layers))} tasks)")
    print(json.dumps({
        "tasks": len(resnet50_tasks(args.layers)), "trials": args.trials, "seeds": args.seeds, "batch": args.batch,
        "space": args.space, "baseline": args.baseline,
        "weighted_latency_ms": {k: round(1e3 * mean(v), 4) for k, v in finals.items()},
        "weighted_latency_ms_per_seed": {k: [round(1e3 * x, 4) for x in v] for k, v in finals.items()},
        "gradient_trials_to_rr_final_over_rr_trials": round(frac, 3),
        "per_seed_fraction": [round(f, 3) for f in fractions],
        "seconds": round(time.perf_counter() - t0, 1),
    }))


if __name__ == "__main__":
    main()
