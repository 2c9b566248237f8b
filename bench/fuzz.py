"""Run the differential kernel fuzzer (tests/kernel_fuzz.py) over many seeds and report.

    .venv/bin/python bench/fuzz.py --seeds 300 [--start 0] [--jobs 2] [--timeout 20]
    .venv/bin/python bench/fuzz.py --seed 1234 --verbose   # one case: compute, schedule, loop IR, result

Prints a table of outcomes per generator, every finding on one line (seed, kind, phase, message,
case), findings and rejections grouped by message, and as its LAST line one JSON object:
{"seeds": N, "start": S, "counts": {outcome: n}, "by_generator": {generator: {outcome: n}},
 "findings": [{"seed": s, "kind": k, "message": m}], "seconds": t}.
The exit status is 0 even with findings: this is a measurement; the findings are printed.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from kernel_fuzz import DEFAULT_TIMEOUT, FINDINGS, GENERATORS, OUTCOMES, Worker, describe, run_seeds  # noqa: E402


def signature(message: str) -> str:
    """A message with its numbers and names of generated things blanked: one line per cause."""
    text = " ".join(message.split())
    text = re.sub(r"\b[A-Za-z_]*\d[\w.]*|-?\d+(\.\d+)?(e[-+]?\d+)?", "#", text)
    return text[:140]


def table(results) -> str:
    counts = {g: collections.Counter(r.outcome for r in results if r.generator == g) for g in GENERATORS}
    rows = [f"{'outcome':<10}" + "".join(f"{g:>11}" for g in GENERATORS) + f"{'total':>9}"]
    for o in OUTCOMES:
        rows.append(f"{o:<10}" + "".join(f"{counts[g][o]:>11}" for g in GENERATORS)
                    + f"{sum(c[o] for c in counts.values()):>9}")
    rows.append(f"{'all':<10}" + "".join(f"{sum(counts[g].values()):>11}" for g in GENERATORS) + f"{len(results):>9}")
    return "\n".join(rows)


def grouped(results, outcomes, top: int) -> list:
    groups = collections.Counter((r.outcome, r.phase, signature(r.message)) for r in results if r.outcome in outcomes)
    return [f"{n:>4} x {o} in {p}: {sig}" for (o, p, sig), n in groups.most_common(top)]


def report(results, seconds: float, start: int) -> None:
    print(table(results))
    findings = [r for r in results if r.outcome in FINDINGS]
    print(f"\n{len(findings)} findings" + (":" if findings else ""))
    for r in findings:
        print("  " + r.line())
    if findings:
        print("\nfindings by message:")
        print("\n".join("  " + line for line in grouped(results, FINDINGS, 30)))
    rejected = grouped(results, ("rejected",), 12)
    if rejected:
        print("\nmost common rejections (a valid case rejected is worth a look):")
        print("\n".join("  " + line for line in rejected))
    summary = {
        "seeds": len(results), "start": start,
        "counts": {o: sum(r.outcome == o for r in results) for o in OUTCOMES},
        "by_generator": {g: {o: sum(r.outcome == o and r.generator == g for r in results) for o in OUTCOMES}
                         for g in GENERATORS},
        "findings": [{"seed": r.seed, "kind": r.outcome, "message": r.message} for r in findings],
        "seconds": round(seconds, 1),
    }
    print(json.dumps(summary))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=100, help="how many seeds to run")
    ap.add_argument("--start", type=int, default=0, help="first seed")
    ap.add_argument("--seed", type=int, help="run this one seed (same as --start SEED --seeds 1)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per case before it is a hang")
    ap.add_argument("--verbose", action="store_true", help="print each case's compute, schedule and loop IR "
                    "(with --seed) or each result as it arrives")
    args = ap.parse_args(argv)
    start, n = (args.seed, 1) if args.seed is not None else (args.start, args.seeds)
    t0 = time.perf_counter()
    if args.seed is not None:
        if args.verbose:
            print(describe(args.seed), flush=True)
        with Worker(args.timeout) as w:
            results = [w.run(args.seed)]
        print(results[0].line())
    else:
        progress = (lambda r: print(r.line(), flush=True)) if args.verbose else None
        results = run_seeds(range(start, start + n), jobs=args.jobs, timeout=args.timeout, on_result=progress)
    report(results, time.perf_counter() - t0, start)


if __name__ == "__main__":
    main()
