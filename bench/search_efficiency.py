"""Search efficiency: cost-model-guided search vs random search, and templates vs sketches.

For every workload (fp32 matmul 512³; a ResNet-50 conv2d layer: 1×64×56×56 input, 64 filters
3×3, padding 1) and every seed, four real tuning runs, each in its own fresh SQLite file (so no
run resumes from another):

    template space:  random search  vs  model-based search (XGBoost + simulated annealing)
    sketch space:    random search  vs  evolutionary search (XGBoost + evolution, Ansor-like)

History (`--history siblings`, the default): a tuning service is never empty. Before the runs,
SIBLING workloads — other shapes of the same operators (matmul 256×768×512; ResNet-50's conv3_x
layer 1×128×28×28, 128 filters 3×3) — are tuned in both spaces as `tunefarm tune` would tune them
(the space's default guided strategy; `--history-strategy random` for random records), and every
run's fresh database starts with those records imported (as `tunefarm records import` would).
The guided strategies warm-start their cost model from them (records of other workloads on the
same target); random search ignores them. None of them is of a workload under test, so nothing
is resumed and no trial is saved. `--history none` runs from empty databases (the cold start:
the guided search's first batch is then as random as random search's).

Starting points: a guided run measures the space's expression of the operator's default
schedule first (a template's config 0; the GEMM or channel-vector conv recipe as a sketch
annotation), as `tunefarm tune` does: tuning starts from the best schedule we know and the search
evolves from it. Random search never gets it. `--no-starting-points` shows the search alone.
The history's sibling runs are tuned the same way.

The bar of a (workload, space, seed) is 90 % of the best GFLOPS random search found in its whole
budget (cost threshold = random's best cost / 0.9). Trials-to-90 of a run is the first trial
whose own measured cost is at or under that threshold (budget + 1 when it never gets there,
marked "+" in the table). The ratio of a pair is guided / random; `trial_ratio` is the median of
the ratios over workloads, spaces and seeds (bar: ≤ 0.33). The same runs give the best GFLOPS
of templates vs sketches per workload (best over all runs in that space) and the tuner overhead
(strategy + cost-model time / tuning time) per strategy. For sketch runs it also reports the
share of the trials spent in the most measured sketch (mutation and crossover never change a
candidate's sketch, so a guided run can lock onto the sketch of its first good measurement).

One builder pool and one measuring worker serve every run. Measurements are deliberately short
(LocalRunner(number=1, repeat=3, min_repeat_ms=20)) to keep the whole benchmark within ~20 min on
a 2-core machine: GFLOPS here are tuning-time numbers, a few percent noisier than bench/tune_matmul.

Last line: JSON with guided_trials_to_90, random_trials_to_90, trial_ratio and the details.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
from pathlib import Path

WORKLOADS = {
    "matmul512": ("matmul", dict(M=512, N=512, K=512)),
    "resnet50_conv": ("conv2d_nchw", dict(N=1, C=64, H=56, W=56, F=64, KH=3, KW=3, padding=[1, 1])),
}
# Other shapes of the same operators: the records a service already holds when these are tuned.
SIBLINGS = {
    "matmul_256x768x512": ("matmul", dict(M=256, N=768, K=512)),
    "resnet50_conv3x": ("conv2d_nchw", dict(N=1, C=128, H=28, W=28, F=128, KH=3, KW=3, padding=[1, 1])),
}
GUIDED = {"template": "model", "sketch": "evolutionary"}
MEASURE = dict(number=1, repeat=3, min_repeat_ms=20)


def trials_to(history, threshold: float, budget: int) -> tuple[int, bool]:
    """(first trial index whose cost ≤ threshold, reached?); (budget + 1, False) if none."""
    for i, c in history:
        if c <= threshold:
            return i, True
    return budget + 1, False


def top_sketch_share(store, task) -> float:
    """Fraction of a sketch run's trials spent in its most measured sketch (1.0 = one sketch only)."""
    from collections import Counter
    recs = store.history(workload_key=task.workload.key, target=task.target)
    counts = Counter(r.candidate.payload.get("sketch") for r in recs)
    return max(counts.values()) / len(recs) if recs else 0.0


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def rnd(x, nd=3):
    return None if x is None else round(x, nd)


def default_speed(task, builder, runner, rounds: int = 5) -> float:
    """GFLOPS of the task's default schedule, by the same builder and runner as the tuning runs
    (median of `rounds` timings): the speed each space's best must reach."""
    from tuner.space import default_candidate
    opdef = task.workload.opdef()
    (build,) = builder.build(task, [default_candidate(opdef.workload_key())])
    costs = [res.cost for res in (runner.run(task, [build])[0] for _ in range(rounds)) if res.ok]
    if not costs:
        raise RuntimeError(f"the default schedule of {opdef.name} failed to run")
    return opdef.flops / statistics.median(costs) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=64, help="trial budget of every run (default 64)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    ap.add_argument("--batch", type=int, default=8, help="candidates per batch (default 8)")
    ap.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=list(WORKLOADS),
                    help="default: all")
    ap.add_argument("--spaces", nargs="+", choices=("template", "sketch"), default=["template", "sketch"],
                    help="default: both")
    ap.add_argument("--history", choices=("siblings", "none"), default="siblings",
                    help="records every run's database starts with (default: random-search records "
                         "of sibling workloads)")
    ap.add_argument("--history-trials", type=int, default=64, help="trials per sibling and space")
    ap.add_argument("--history-strategy", choices=("guided", "random"), default="guided",
                    help="how the siblings were tuned (default: the space's guided strategy)")
    ap.add_argument("--no-starting-points", action="store_true",
                    help="guided runs do not start from the default schedule as the space says it "
                         "(the search alone; by default they measure it first, random search never)")
    args = ap.parse_args()

    import compiler
    from tuner.measure import BuilderPool, LocalRunner, MeasureOptions
    from tuner.records import open_store
    from tuner.tune import tune
    from tuner.workload import Task, Workload

    t_all = time.perf_counter()
    tmp = tempfile.TemporaryDirectory()
    n_db = 0

    history_jsonl = ""

    def fresh_store():
        nonlocal n_db
        n_db += 1
        store = open_store(f"sqlite:///{Path(tmp.name) / f'records_{n_db}.db'}")
        if history_jsonl:
            store.import_jsonl(io.StringIO(history_jsonl))
        return store

    default_gflops = {}  # workload -> the default schedule's GFLOPS, measured by the runs' runner
    runs = []  # one dict per tuning run
    pairs = []  # one dict per (workload, space, seed)
    history = {}
    builder = BuilderPool()
    runner = LocalRunner(MeasureOptions(**MEASURE))
    try:
        if args.history == "siblings":
            hstore = fresh_store()
            wanted_ops = {WORKLOADS[w][0] for w in args.workloads}
            for hname, (op, params) in SIBLINGS.items():
                if op not in wanted_ops:  # only the history of the operators under test
                    continue
                htask = Task.create(Workload(op, params))
                for space in args.spaces:
                    hstrategy = GUIDED[space] if args.history_strategy == "guided" else "random"
                    r = tune(htask, hstore, space=space, strategy=hstrategy, trials=args.history_trials,
                             batch_size=args.batch, seed=1000, builder=builder, runner=runner)
                    history[f"{hname}/{space}"] = dict(strategy=hstrategy, trials=r.trials,
                                                       best_gflops=round(r.best_gflops, 1))
                    print(f"  history {hname:<20} {space:<8} {hstrategy:<12} trials {r.trials:3d}  "
                          f"best {r.best_gflops:6.1f} GFLOPS  {r.tune_seconds:5.1f} s", flush=True)
            buf = io.StringIO()
            hstore.export_jsonl(buf)
            hstore.close()
            history_jsonl = buf.getvalue()
        for wname in args.workloads:
            op, params = WORKLOADS[wname]
            task = Task.create(Workload(op, params))
            default_gflops[wname] = round(default_speed(task, builder, runner), 1)
            print(f"  {wname:<14} default schedule {default_gflops[wname]:6.1f} GFLOPS (the bar both spaces must reach)",
                  flush=True)
            for seed in range(args.seeds):
                for space in args.spaces:
                    res = {}
                    for kind, strategy in (("random", "random"), ("guided", GUIDED[space])):
                        store = fresh_store()
                        # search trials only: no default-schedule baseline and no end-of-run
                        # re-measurement, so the bar and the curves are the same kind of number
                        # (in-run costs of search candidates)
                        r = tune(task, store, space=space, strategy=strategy, trials=args.trials,
                                 batch_size=args.batch, seed=seed, builder=builder, runner=runner,
                                 baseline=False, top_k=0, starting_points=not args.no_starting_points)
                        share = top_sketch_share(store, task) if space == "sketch" else None
                        store.close()
                        res[kind] = r
                        runs.append(dict(workload=wname, space=space, strategy=strategy, kind=kind, seed=seed,
                                         trials=r.trials, errors=r.errors, best_gflops=r.best_gflops,
                                         tune_seconds=r.tune_seconds, overhead=r.tuner_overhead_fraction,
                                         top_sketch_share=share))
                        print(f"  {wname:<14} {space:<8} {strategy:<12} seed {seed}  trials {r.trials:3d}  "
                              f"errors {r.errors:2d}  best {r.best_gflops:6.1f} GFLOPS  "
                              f"{r.tune_seconds:5.1f} s  overhead {100 * r.tuner_overhead_fraction:4.1f} %  "
                              + (f"top sketch {100 * share:3.0f} %  " if share is not None else "")
                              + time.strftime('%H:%M:%S'), flush=True)
                    rb = res["random"].best_cost
                    if rb == float("inf"):
                        print(f"  ! {wname} {space} seed {seed}: random search measured nothing valid; "
                              f"pair skipped", flush=True)
                        continue
                    threshold = rb / 0.9
                    g_t, g_ok = trials_to(res["guided"].history, threshold, args.trials)
                    r_t, r_ok = trials_to(res["random"].history, threshold, args.trials)
                    pairs.append(dict(workload=wname, space=space, seed=seed,
                                      random_best_gflops=res["random"].best_gflops,
                                      guided_best_gflops=res["guided"].best_gflops,
                                      random_t90=r_t, guided_t90=g_t, guided_reached=g_ok,
                                      ratio=g_t / r_t, guided_top_sketch_share=runs[-1]["top_sketch_share"],
                                      random_top_sketch_share=runs[-2]["top_sketch_share"]))
    finally:
        builder.close()
        runner.close()
    total = time.perf_counter() - t_all

    # ------------------------------------------------------------------ tables
    print()
    print(f"trials to 90% of random's best GFLOPS (budget {args.trials}, batch {args.batch}, "
          f"seeds {args.seeds}; '+' = never reached, counted as budget+1)")
    hdr = f"{'workload':<14}{'space':<10}{'guided':<14}{'seed':>5}{'rand best':>11}{'guid best':>11}" \
          f"{'rand t90':>10}{'guid t90':>10}{'ratio':>8}"
    print(hdr)
    print("-" * len(hdr))
    for p in pairs:
        g = f"{p['guided_t90']}{'' if p['guided_reached'] else '+'}"
        print(f"{p['workload']:<14}{p['space']:<10}{GUIDED[p['space']]:<14}{p['seed']:>5}"
              f"{p['random_best_gflops']:>11.1f}{p['guided_best_gflops']:>11.1f}"
              f"{p['random_t90']:>10}{g:>10}{p['ratio']:>8.2f}")
    print()
    print("medians over seeds")
    hdr2 = f"{'workload':<14}{'space':<10}{'rand t90':>10}{'guid t90':>10}{'ratio':>8}{'reached':>9}" \
           f"{'rand best':>11}{'guid best':>11}{'top sketch r/g':>16}"
    print(hdr2)
    print("-" * len(hdr2))
    by_ws = {}
    for p in pairs:
        by_ws.setdefault((p["workload"], p["space"]), []).append(p)
    per_ws = {}
    for (w, s), ps in by_ws.items():
        d = dict(random_trials_to_90=med([p["random_t90"] for p in ps]),
                 guided_trials_to_90=med([p["guided_t90"] for p in ps]),
                 trial_ratio=med([p["ratio"] for p in ps]),
                 guided_reached=f"{sum(p['guided_reached'] for p in ps)}/{len(ps)}",
                 random_best_gflops=med([p["random_best_gflops"] for p in ps]),
                 guided_best_gflops=med([p["guided_best_gflops"] for p in ps]))
        if s == "sketch":  # how much of the budget went to one sketch (evolution cannot leave a sketch)
            d["random_top_sketch_share"] = med([p["random_top_sketch_share"] for p in ps])
            d["guided_top_sketch_share"] = med([p["guided_top_sketch_share"] for p in ps])
        per_ws[f"{w}/{s}"] = {k: rnd(v, 1 if k.endswith("gflops") else 3) if isinstance(v, float) else v
                              for k, v in d.items()}
        shares = (f"{100 * d['random_top_sketch_share']:.0f}/{100 * d['guided_top_sketch_share']:.0f} %"
                  if s == "sketch" else "-")
        print(f"{w:<14}{s:<10}{d['random_trials_to_90']:>10}{d['guided_trials_to_90']:>10}"
              f"{d['trial_ratio']:>8.2f}{d['guided_reached']:>9}{d['random_best_gflops']:>11.1f}"
              f"{d['guided_best_gflops']:>11.1f}{shares:>16}")

    print()
    print("templates vs sketches: best GFLOPS over all runs (median of the runs' bests)")
    hdr3 = f"{'workload':<14}{'template':>18}{'sketch':>18}{'sketch/template':>17}{'default':>10}"
    print(hdr3)
    print("-" * len(hdr3))
    spaces_best = {}
    for w in args.workloads:
        row = {}
        for s in args.spaces:
            bs = [r["best_gflops"] for r in runs if r["workload"] == w and r["space"] == s]
            row[s] = dict(best_gflops=round(max(bs), 1) if bs else None,
                          median_run_best_gflops=round(med(bs), 1) if bs else None)
        spaces_best[w] = row
        cells = [f"{row[s]['best_gflops']:.1f} ({row[s]['median_run_best_gflops']:.1f})" if s in row else "-"
                 for s in ("template", "sketch")]
        ratio = (row["sketch"]["best_gflops"] / row["template"]["best_gflops"]
                 if "sketch" in row and "template" in row and row["template"]["best_gflops"] else None)
        print(f"{w:<14}{cells[0]:>18}{cells[1]:>18}{(f'{ratio:.2f}' if ratio else '-'):>17}"
              f"{default_gflops.get(w, float('nan')):>10.1f}")

    overhead = {}
    for s in args.spaces:
        for strat in ("random", GUIDED[s]):
            xs = [r["overhead"] for r in runs if r["space"] == s and r["strategy"] == strat]
            if xs:
                overhead[f"{s}/{strat}"] = rnd(med(xs), 3)
    print()
    print("tuner overhead (median fraction of tuning time in strategy + cost model): "
          + ", ".join(f"{k} {100 * v:.1f} %" for k, v in overhead.items()))
    errors = sum(r["errors"] for r in runs)
    print(f"{len(runs)} runs, {sum(r['trials'] for r in runs)} trials, {errors} errors, {total:.0f} s; "
          f"measured with LocalRunner(number=1, repeat=3, min_repeat_ms=20) (short, for speed)")

    g_all = med([p["guided_t90"] for p in pairs])
    r_all = med([p["random_t90"] for p in pairs])
    ratio_all = med([p["ratio"] for p in pairs])
    out = {
        "guided_trials_to_90": g_all,
        "random_trials_to_90": r_all,
        "trial_ratio": rnd(ratio_all, 3),
        "trial_ratio_bar": 0.33,
        "meets_bar": ratio_all is not None and ratio_all <= 0.33,
        "trial_ratio_by_space": {s: rnd(med([p["ratio"] for p in pairs if p["space"] == s]), 3)
                                 for s in args.spaces},
        "per_workload_space": per_ws,
        "guided_reached_90": f"{sum(p['guided_reached'] for p in pairs)}/{len(pairs)}",
        "space_best_gflops": spaces_best,
        "default_gflops": default_gflops,
        "tuner_overhead_fraction": overhead,
        "trials": args.trials, "batch": args.batch, "seeds": args.seeds,
        "workloads": args.workloads, "spaces": args.spaces,
        "measure": "LocalRunner(number=1, repeat=3, min_repeat_ms=20)",
        "history": args.history, "history_runs": history,
        "starting_points": not args.no_starting_points,
        "ratio_definition": "median over (workload, space, seed) of guided_t90 / random_t90; "
                            "threshold = random best cost / 0.9; never reached = budget + 1",
        "errors": errors,
        "seconds": round(total, 1),
        "target": compiler.Target.host().cpu,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
