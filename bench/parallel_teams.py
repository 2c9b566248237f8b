"""What one team per kernel saves (issue 58): the same kernels built with and without teams.

Code generation runs the consecutive parallel loops of a kernel as one team: one fork, a barrier
between loops, one join (compiler/parallel_teams.py). Here every ResNet-50 convolution whose
default schedule has more than one parallel loop (`--layers` picks others of bench/tune_conv.py's)
is built twice in one process from the same schedule: as the product builds it, and with
`build(..., teams=False)`, which forks and joins a team for every parallel loop (the code
before teams). The two are timed by the measurement protocol in alternating rounds on the same
inputs, on this host's threads (`--threads`); outputs are checked equal to the product's first.

Prints a table; the last line is JSON: per layer the parallel loops, both medians in us and
`ratio` (the median over rounds of separate / team: above 1, the team is faster), `ratio_geomean`
and `ratio_min` over the layers, and the threads.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import tune_conv  # noqa: E402 - ResNet-50's conv layers

from compiler.timing import TimingOptions  # noqa: E402

OPTIONS = TimingOptions(min_samples=10, max_samples=200, min_seconds=0.05, max_seconds=0.4)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", nargs="+", default=list(tune_conv.LAYERS), choices=[*tune_conv.LAYERS, *tune_conv.OTHERS],
                    help="conv layers (default: ResNet-50's)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating timing rounds per layer")
    ap.add_argument("--threads", type=int, default=None, help="threads (default: the host's cores)")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")

    import compiler as C
    from compiler.lower import lower
    from compiler.openmp import get_max_threads, set_num_threads
    from compiler.ops import default_schedule, get_op
    from compiler.parallel_regions import parallel_regions

    if args.threads is not None:
        set_num_threads(args.threads)
    threads = get_max_threads()
    target = C.Target.host()
    print(f"host {target.cpu}, {target.num_cores} cores, {threads} threads; {args.rounds} alternating rounds\n")
    print(f"{'layer':<24} {'loops':>5} {'team us':>9} {'separate us':>12} {'ratio':>6}")
    rng = np.random.default_rng(0)
    cases: dict = {}
    for layer in args.layers:
        opdef = get_op("conv2d_nchw", **tune_conv.params(layer))
        schedule = default_schedule(opdef, target)
        loops = len(parallel_regions(lower(schedule, opdef.tensors, "k")))
        if loops < 2:
            continue
        team = C.build(schedule, opdef.tensors, target)
        separate = C.build(schedule, opdef.tensors, target, teams=False)
        arrays = [rng.standard_normal(t.shape).astype(t.dtype) for t in opdef.tensors]
        out_team = np.full(opdef.output.shape, np.nan, np.float32)
        out_separate = np.full(opdef.output.shape, np.nan, np.float32)
        team(*arrays[:-1], out_team)
        separate(*arrays[:-1], out_separate)
        if not np.array_equal(out_team, out_separate):
            raise SystemExit(f"{layer}: the two builds disagree")
        times: dict = {"team": [], "separate": []}
        for _ in range(args.rounds):
            times["team"].append(team.measure(*arrays, options=OPTIONS).median)
            times["separate"].append(separate.measure(*arrays, options=OPTIONS).median)
        ratio = statistics.median(s / t for s, t in zip(times["separate"], times["team"]))
        t_us, s_us = (statistics.median(times[k]) * 1e6 for k in ("team", "separate"))
        cases[layer] = {"loops": loops, "team_us": round(t_us, 1), "separate_us": round(s_us, 1), "ratio": round(ratio, 3)}
        print(f"{layer:<24} {loops:>5} {t_us:>9.1f} {s_us:>12.1f} {ratio:>6.3f}", flush=True)
    ratios = [c["ratio"] for c in cases.values()]
    geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else None
    print(f"\ngeomean separate / team {geomean:.3f}, min {min(ratios):.3f}" if ratios else "\nno multi-loop layer")
    print(json.dumps({"cases": cases, "ratio_geomean": round(geomean, 3) if geomean else None,
                      "ratio_min": min(ratios) if ratios else None, "threads": threads}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
