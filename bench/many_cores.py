"""Kernels and models from 1 to 16 threads, beside the scaling model's prediction (issue 58).

The one prepared run for a lent many-core machine: within `--budget` seconds (default 450, so a
15-minute lease keeps room for the machine's start and a second try), it runs

- `bench/tune_conv.py --trials 0` (ResNet-50's conv defaults against oneDNN),
- `bench/model_zoo.py` (networks against onnxruntime; `--models` picks some), and
- `bench/compiler_matmul.py --n 2048` (the default matmul against numpy)

at each of `--threads` (default 1 2 4 8 16, those this process may use), each run in its own
process on that many threads of every library, its CPU affinity restricted to that many cores
(so no side's threads wander onto cores another run's leave warm). tunefarm's kernels are made
for every core of the machine either way, the kernels `bench/scaling.py --cores` predicts: a
measured speed-up is one kernel's time on one thread over its time on N.
The most-threads runs come first, then one thread (each speed-up's base), then the rest while
the budget lasts: a run that would not fit, judged by the same benchmark's last run, is skipped
and named. Beside each measured speed-up (a kernel's or a network's time on one thread over its
time on N) stands the scaling model's prediction: `--predicted FILE` holds the last line of a
`bench/scaling.py` run (made beforehand, on a 2-core machine: the point of the model), or
`--predict` runs it here first.

Prints a table per benchmark (reference ratio at each thread count; measured and predicted
speed-ups) and, last, one JSON object: `threads`, `conv_default_vs_onednn`, `zoo_vs_onnxruntime`,
`matmul_vs_numpy` ({threads: {name: ratio, "geomean": ...}}), `measured_speedup` and
`predicted_speedup` ({name: {threads: speed-up}}), `prediction_error` ({name: {threads:
predicted / measured - 1}}), `skipped`, `failed`, `seconds`. `--log FILE` keeps every run's
own output.

    python bench/many_cores.py [--threads 1 2 4 8 16] [--budget 450] [--models ...]
                               [--predicted scaling.json | --predict] [--log many_cores.log]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROUNDS = {"conv": 2, "zoo": 3, "matmul": 3}
SLOWER_AT_FEWER = 2.0     # a run on fewer threads is judged this much longer than the last one


def usable_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:          # not Linux: no affinity, every core
        return list(range(os.cpu_count() or 1))


def command(bench: str, threads: int, models: list[str] | None) -> list[str]:
    if bench == "conv":
        return ["tune_conv.py", "--trials", "0", "--rounds", str(ROUNDS["conv"]), "--threads", str(threads)]
    if bench == "matmul":
        return ["compiler_matmul.py", "--n", "2048", "--rounds", str(ROUNDS["matmul"]), "--builds", "3",
                "--threads", str(threads)]
    return ["model_zoo.py", "--threads", str(threads), "--rounds", str(ROUNDS["zoo"])] + (
        ["--models", *models] if models else [])


def plan(threads: list[int]) -> list[tuple[str, int]]:
    """(benchmark, threads) in the order they run: the most threads first (the figures the issue
    judges), then one thread (every speed-up's base), then the matmul at every count (cheap), then
    the rest from many threads to few."""
    top, rest = max(threads), sorted(set(threads) - {max(threads)}, reverse=True)
    order = [("conv", top), ("zoo", top)]
    if 1 in rest:
        order += [("conv", 1), ("zoo", 1)]
    order += [("matmul", n) for n in [top] + rest]
    order += [(b, n) for n in rest if n != 1 for b in ("conv", "zoo")]
    return order


def run_one(bench: str, threads: int, cpus: list[int], models, timeout: float, log) -> tuple[dict | None, str, float]:
    """One benchmark in a child process on the first `threads` of `cpus`: (its JSON, "" or why
    not, seconds)."""
    allowed = set(cpus[:threads])
    script, *flags = command(bench, threads, models)
    cmd = [sys.executable, str(BENCH / script), *flags]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1.0, timeout), cwd=BENCH.parent,
                              preexec_fn=lambda: os.sched_setaffinity(0, allowed))
    except subprocess.TimeoutExpired as e:
        seconds = time.perf_counter() - t0
        _log(log, bench, threads, seconds, e.stdout or "", e.stderr or "")
        return None, f"timed out after {seconds:.0f} s", seconds
    seconds = time.perf_counter() - t0
    _log(log, bench, threads, seconds, proc.stdout, proc.stderr)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    try:
        return json.loads(last), ("" if proc.returncode == 0 else f"exit {proc.returncode}"), seconds
    except json.JSONDecodeError:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"exit {proc.returncode}: {tail[:200]}", seconds


def _log(log, bench, threads, seconds, out, err) -> None:
    if log is None:
        return
    text = lambda s: s.decode(errors="replace") if isinstance(s, bytes) else s   # noqa: E731
    log.write(f"===== {bench} at {plural(threads)} ({seconds:.0f} s)\n{text(out)}\n--- stderr\n{text(err)}\n")
    log.flush()


def plural(threads: int) -> str:
    return f"{threads} thread{'s' if threads > 1 else ''}"


def geomean(values) -> float:
    values = [v for v in values if v and v > 0]
    return round(statistics.geometric_mean(values), 3) if values else 0.0


def figures(bench: str, result: dict) -> tuple[dict, dict]:
    """({name: ratio against the reference}, {name: tunefarm's milliseconds}) of one run."""
    if bench == "conv":
        ratios = {k: v for k, v in result["default_vs_onednn"].items() if k != "geomean"}
        return ratios, result.get("default_ms", {})
    if bench == "zoo":
        return dict(result["ratio_vs_onnxruntime"]), dict(result["tunefarm_ms"])
    n = result["n"]
    return {f"matmul {n}": result["ratio"]}, {f"matmul {n}": 2.0 * n ** 3 / result["gflops"] / 1e6}


def predicted_for(name: str, predicted: dict) -> dict | None:
    """The scaling model's speed-ups of a conv layer (bench/scaling.py names it "conv LAYER") or
    of a zoo key ("model/exporter/b1": the model's)."""
    return predicted.get(name) or predicted.get(f"conv {name}") or predicted.get(name.split("/", 1)[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--budget", type=float, default=450.0, help="seconds for all runs together")
    ap.add_argument("--models", nargs="+", default=None, help="zoo models (default: model_zoo.py's own)")
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--predicted", type=Path, help="a bench/scaling.py run's output (its last line is read)")
    how.add_argument("--predict", action="store_true", help="run bench/scaling.py here first (minutes)")
    ap.add_argument("--log", type=Path, help="every run's own output, appended")
    args = ap.parse_args()
    cpus = usable_cpus()
    threads = sorted({n for n in args.threads if 1 <= n <= len(cpus)})
    if not threads:
        ap.error(f"no thread count in {args.threads} fits the {len(cpus)} cores this process may use")
    predicted: dict = {}
    if args.predicted:
        lines = args.predicted.read_text().strip().splitlines()
        predicted = json.loads(lines[-1])["predicted_speedup"] if lines else {}
    t_start = time.perf_counter()
    log = open(args.log, "a") if args.log else None
    if args.predict:
        proc = subprocess.run([sys.executable, str(BENCH / "scaling.py"), "--cores", str(max(threads))]
                              + (["--models", *args.models] if args.models else []),
                              capture_output=True, text=True, cwd=BENCH.parent)
        _log(log, "scaling", 1, time.perf_counter() - t_start, proc.stdout, proc.stderr)
        predicted = json.loads(proc.stdout.strip().splitlines()[-1])["predicted_speedup"]
    deadline = time.perf_counter() + args.budget
    print(f"{len(cpus)} cores usable; threads {threads}; budget {args.budget:.0f} s; "
          f"predictions for {len(predicted)} kernels or models", flush=True)

    ratios: dict = {b: {} for b in ("conv", "zoo", "matmul")}
    ms: dict = {b: {} for b in ("conv", "zoo", "matmul")}
    last_seconds: dict = {}
    skipped, failed = [], {}
    for bench, n in plan(threads):
        left = deadline - time.perf_counter()
        guess = last_seconds.get(bench, 0.0) * (SLOWER_AT_FEWER if bench in last_seconds else 1.0)
        if left <= 0 or guess > left:
            skipped.append(f"{bench}@{n}")
            print(f"skip {bench} at {plural(n)}: {left:.0f} s left" + (f", its last run took {last_seconds[bench]:.0f} s"
                                                                      if bench in last_seconds else ""), flush=True)
            continue
        result, why, seconds = run_one(bench, n, cpus, args.models, left, log)
        last_seconds[bench] = seconds
        print(f"{bench} at {plural(n)}: {seconds:.0f} s" + (f" ({why})" if why else ""), flush=True)
        if result is None:
            failed[f"{bench}@{n}"] = why
            continue
        r, t = figures(bench, result)
        ratios[bench][n] = {**r, "geomean": geomean(r.values())}
        ms[bench][n] = t

    measured, errors = {}, {}
    for bench in ms:
        base = ms[bench].get(1, {})
        for n, times in ms[bench].items():
            for name, t in times.items():
                if name in base and t > 0:
                    measured.setdefault(name, {})[str(n)] = round(base[name] / t, 2)
    for name, speedups in measured.items():
        pred = predicted_for(name, predicted)
        for n, s in speedups.items():
            if pred and n in pred and n != "1":
                errors.setdefault(name, {})[n] = round(pred[n] / s - 1, 3)

    refs = {"conv": "oneDNN", "zoo": "onnxruntime", "matmul": "numpy"}
    for bench, by_n in ratios.items():
        if not by_n:
            continue
        cols = sorted(by_n)
        names = sorted({k for r in by_n.values() for k in r if k != "geomean"}) + ["geomean"]
        print(f"\n{bench}: {refs[bench]}'s time / tunefarm's at each thread count; speed-up over 1 thread measured "
              f"(predicted)")
        print(f"{'':<34}" + "".join(f"{str(n) + ' thr':>10}" for n in cols) + "   speed-up at " + " / ".join(map(str, cols)))
        for name in names:
            cells = "".join(f"{by_n[n].get(name, float('nan')):>10.3f}" for n in cols)
            pred = predicted_for(name, predicted) or {}
            sp = " / ".join(f"{measured.get(name, {}).get(str(n), float('nan')):.1f}"
                            + (f" ({pred[str(n)]:.1f})" if str(n) in pred else "") for n in cols)
            print(f"{name[:33]:<34}{cells}   {sp if name != 'geomean' else ''}")
    if skipped:
        print(f"\nskipped for the budget: {', '.join(skipped)}")
    for key, why in failed.items():
        print(f"failed: {key}: {why}")
    if log:
        log.close()
    key = lambda b: {str(n): r for n, r in ratios[b].items()}   # noqa: E731
    print(json.dumps({"threads": threads, "conv_default_vs_onednn": key("conv"), "zoo_vs_onnxruntime": key("zoo"),
                      "matmul_vs_numpy": key("matmul"), "measured_speedup": measured,
                      "predicted_speedup": {k: predicted_for(k, predicted) for k in measured if predicted_for(k, predicted)},
                      "prediction_error": errors, "skipped": skipped, "failed": failed,
                      "seconds": round(time.perf_counter() - t_start, 1)}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
