"""Tune an fp32 matmul and compare the best kernel with numpy's `@` in the same run.

Runs a real tuning job (builder pool + isolated measuring worker + records in a fresh SQLite
file; at its end the top candidates and the default schedule are re-measured interleaved), then
times the best record (built through apply-best, which ranks by the re-measured costs)
interleaved with numpy. Last line: JSON with best_gflops (that final timing), numpy_gflops,
ratio (numpy time / ours, same run), best_gflops_during_tuning (the maximum of the noisy tuning
measurements), best_gflops_retimed (the end-of-run re-measurement), speedup_over_default,
tune_seconds, trials_to_90pct, tuner_overhead_fraction.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from blas_info import blas_line, blas_report
from matmul_check import checked_square_matmul


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--trials", type=int, default=512)
    ap.add_argument("--space", choices=("sketch", "template"), default="sketch")
    ap.add_argument("--strategy", default=None)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--db", default=None, help="records URL (default: a fresh SQLite file)")
    args = ap.parse_args()

    import compiler
    from compiler.ops import build_op
    from tuner.apply_best import ApplyHistoryBest
    from tuner.records import open_store
    from tuner.tune import tune
    from tuner.workload import Task, Workload

    n = args.n
    tmp = tempfile.TemporaryDirectory()
    store = open_store(args.db or f"sqlite:///{Path(tmp.name) / 'records.db'}")
    task = Task.create(Workload("matmul", dict(M=n, N=n, K=n)))

    def progress(report):
        r = report.result
        print(f"  {report.kind:8s} trials {r.trials:4d}  best {r.best_gflops:7.1f} GFLOPS  "
              f"errors {r.errors}  {time.strftime('%H:%M:%S')}", flush=True)

    result = tune(task, store, space=args.space, strategy=args.strategy, trials=args.trials,
                  batch_size=args.batch, seed=args.seed, on_batch=progress)

    # trials until the tuning run's own measurements first reached 90 % of its best
    best = min((c for _, c in result.history), default=float("inf"))
    trials_to_90 = next((i for i, c in result.history if c <= best / 0.9), None)

    opdef = task.workload.opdef()
    with ApplyHistoryBest(store):
        kernel = build_op(opdef)
    a, b, c, _ = checked_square_matmul(kernel, n)

    def med(fn, number):
        time.sleep(0.2)  # the other side's worker threads stop spinning first
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            ts.append((time.perf_counter() - t0) / number)
        return statistics.median(ts)

    number = max(1, int(1e9 / opdef.flops))
    ours, theirs = [], []
    for _ in range(5):
        ours.append(med(lambda: kernel(a, b, c), number))
        theirs.append(med(lambda: a @ b, number))
    t_ours, t_np = statistics.median(ours), statistics.median(theirs)
    out = {
        "n": n, "space": args.space, "strategy": args.strategy or ("evolutionary" if args.space == "sketch" else "model"),
        "trials": result.trials,
        "best_gflops": round(opdef.flops / t_ours / 1e9, 1),
        "numpy_gflops": round(opdef.flops / t_np / 1e9, 1),
        "ratio": round(t_np / t_ours, 3),
        "best_gflops_during_tuning": round(opdef.flops / best / 1e9, 1),
        "best_gflops_retimed": round(result.best_gflops, 1),
        "speedup_over_default": round(result.speedup_over_default, 3),
        "tune_seconds": round(result.tune_seconds, 1),
        "trials_to_90pct": trials_to_90,
        "tuner_overhead_fraction": round(result.tuner_overhead_fraction, 3),
        "errors": result.errors,
        "target": compiler.Target.host().cpu,
        "blas": blas_report(),
    }
    print(blas_line())
    print(f"{'':<24}{'GFLOPS':>10}")
    print(f"{'best during tuning':<24}{out['best_gflops_during_tuning']:>10}")
    print(f"{'best re-measured':<24}{out['best_gflops_retimed']:>10}")
    print(f"{'tuned (best record)':<24}{out['best_gflops']:>10}")
    print(f"{'numpy @':<24}{out['numpy_gflops']:>10}")
    print(f"ratio {out['ratio']}  tune {out['tune_seconds']} s  trials to 90% {trials_to_90}  "
          f"tuner overhead {100 * out['tuner_overhead_fraction']:.1f} %")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
