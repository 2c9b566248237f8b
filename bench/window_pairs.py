"""How far a kernel's ratio to itself strays through the local runner: timed one after the other,
or together, taking turns (compiler.timing.time_together; issue 56).

A search and a re-timing decide by ratios: a candidate against the default, one candidate
against another. Here the same kernel is built twice and the pair is measured by
`LocalRunner.run` over `--rounds` rounds, quietly and with a busy core (a plain busy-loop
process), once with the runner timing a window's kernels one after the other (`interleave=False`,
the reference) and once together. Every ratio should be 1; how far it strays is what the host's
drift between one timing and the next puts into a comparison.

Prints a table, then one JSON object: `spread` ({mode: {"one_by_one" | "together": largest
|ratio - 1|}}), `ratios` (every round's ratio), `steadier` (one-by-one spread / together spread,
over both modes), `kernel`, `cpu`.

    .venv/bin/python bench/window_pairs.py [--rounds 8] [--workload conv|matmul256|matmul512]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from measure_trust import WORKLOADS, busy_core  # noqa: E402 - the trust bench's workloads and busy core

NAMES = {"conv": "conv 1x64x56x56 k3", "matmul256": "matmul 256³", "matmul512": "matmul 512³"}


def pair_ratios(task, builds, interleave: bool, rounds: int) -> list:
    """first / second of the same kernel measured as one runner window, per round."""
    from tuner.measure import LocalRunner
    out = []
    with LocalRunner(interleave=interleave) as runner:
        runner.run(task, builds[:1])       # a started, calibrated worker before the first pair
        for _ in range(rounds):
            first, second = runner.run(task, builds)
            out.append(first.cost / second.cost)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--workload", choices=sorted(NAMES), default="conv")
    args = ap.parse_args()

    import compiler
    from tuner.measure import BuilderPool
    from tuner.space import default_candidate
    from tuner.workload import Task, Workload

    target = compiler.Target.host()
    op, params = WORKLOADS[NAMES[args.workload]]
    task = Task(Workload(op, params), str(target), "local")
    default = default_candidate(task.workload.opdef().workload_key())
    with BuilderPool() as pool:
        builds = pool.build(task, [default, default])
    ratios: dict = {}
    for mode in ("quiet", "busy"):
        for way, interleave in (("one_by_one", False), ("together", True)):
            if mode == "busy":
                with busy_core(600):
                    ratios.setdefault(mode, {})[way] = pair_ratios(task, builds, interleave, args.rounds)
            else:
                ratios.setdefault(mode, {})[way] = pair_ratios(task, builds, interleave, args.rounds)
    spread = {mode: {way: round(max(abs(r - 1.0) for r in v), 4) for way, v in ways.items()}
              for mode, ways in ratios.items()}
    print(f"host target: -mcpu={target.cpu}, {target.num_cores} cores; kernel: {NAMES[args.workload]} default, "
          f"measured against itself; busy core: a plain Python busy loop\n")
    print(f"{'mode':<6} {'timed':<11} {'largest |ratio - 1|':>20}  ratios")
    for mode, ways in ratios.items():
        for way, v in ways.items():
            print(f"{mode:<6} {way:<11} {spread[mode][way]:>20.3f}  " + " ".join(f"{r:.3f}" for r in v))
    worst = {way: max(spread[m][way] for m in spread) for way in ("one_by_one", "together")}
    print(json.dumps({"spread": spread, "steadier": round(worst["one_by_one"] / max(worst["together"], 1e-4), 2),
                      "ratios": {m: {w: [round(r, 4) for r in v] for w, v in ways.items()} for m, ways in ratios.items()},
                      "kernel": NAMES[args.workload], "rounds": args.rounds, "cpu": target.cpu}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
