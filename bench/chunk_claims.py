"""What a parallel region pays to hand out its chunks: libgomp's work-sharing loop against the
loop's own counter (issue 58).

Every parallel loop the code generator emits hands out about CHUNKS_PER_THREAD contiguous chunks a
thread, each taken by whichever thread comes free. It claims them by an atomic add on a counter
of the loop's own, set to 0 before the fork (codegen_llvm._emit_counted_chunks); a region alone
once went through libgomp's work-sharing loop instead (GOMP_loop_dynamic_start / _next /
_end_nowait). Here both protocols run an empty region (no work: what is left is the fork, the
claims and the join) back to back, as a model's kernels run: the counted one is exactly the fork/
join probe the scaling model measures (compiler/parallel_probe.py), the work-sharing one is
compiled beside it from the same IR with libgomp's calls in its place. Alternating rounds, at
each team size this host has threads for; a round is the lowest of a few runs of `--regions`
regions (a neighbour's thread on a shared core only adds).

Prints a table; the last line is JSON: per team size `us_work_sharing`, `us_counted` (medians
over rounds, us per region) and `ratio` (the median over rounds of work-sharing / counted: above
1, the counter is cheaper), and the threads.

    .venv/bin/python bench/chunk_claims.py [--rounds 15] [--regions 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# the work-sharing region; its driver is the probe's own (`forks_of`), calling it instead
WORK_SHARING_IR = """
declare i8 @GOMP_loop_dynamic_start(i64, i64, i64, i64, ptr, ptr)
declare i8 @GOMP_loop_dynamic_next(ptr, ptr)
declare void @GOMP_loop_end_nowait()

define internal void @tf_ws_region(ptr %data) {
entry:
  %lo = alloca i64
  %hi = alloca i64
  %iters_at = getelementptr i64, ptr %data, i64 2
  %iters = load i64, ptr %iters_at
  %nth32 = call i32 @omp_get_num_threads()
  %nth = sext i32 %nth32 to i64
  %per = mul i64 %nth, CHUNKS
  %up = add i64 %iters, %per
  %up1 = sub i64 %up, 1
  %chunk = sdiv i64 %up1, %per
  %got = call i8 @GOMP_loop_dynamic_start(i64 0, i64 %iters, i64 1, i64 %chunk, ptr %lo, ptr %hi)
  %any = icmp ne i8 %got, 0
  br i1 %any, label %body, label %done
body:
  %l = load volatile i64, ptr %lo
  %more = call i8 @GOMP_loop_dynamic_next(ptr %lo, ptr %hi)
  %again = icmp ne i8 %more, 0
  br i1 %again, label %body, label %done
done:
  call void @GOMP_loop_end_nowait()
  ret void
}
"""


def forks_of(probe_ir: str, region: str, name: str) -> str:
    """The probe's driver of back-to-back regions (tf_probe_forks) as function `name`, forking
    `region` instead of the probe's own; the chunk counter it resets is unused by such a region."""
    start = probe_ir.index("define i32 @tf_probe_forks(")
    end = probe_ir.index("\n}\n", start) + 3
    return (probe_ir[start:end].replace("@tf_probe_forks(", f"@{name}(")
            .replace("@tf_probe_region,", f"@{region},"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--regions", type=int, default=200, help="regions back to back in one run")
    args = ap.parse_args()

    from compiler.timing import prepare_timing_process
    prepare_timing_process()
    from compiler import parallel_probe as probe
    from compiler.codegen_llvm import CHUNKS_PER_THREAD, COUNTER_STRIDE
    from compiler.openmp import get_max_threads
    from compiler.runtime import ArgSpec, Kernel, compile_module
    from compiler.target import resolve_target

    target = resolve_target(None)
    counted = probe.Probes(target)
    ir = (probe.PROBE_IR + WORK_SHARING_IR.replace("CHUNKS", str(CHUNKS_PER_THREAD))
          + forks_of(probe.PROBE_IR, "tf_ws_region", "tf_ws_forks"))
    work_sharing = Kernel("tf_ws_forks", compile_module(ir, target),
                          [ArgSpec("params", (2 * COUNTER_STRIDE,), "int64"), ArgSpec("out", (1,), "int64")], target)
    rate = probe.ticks_per_second(counted)
    out = np.zeros(1, np.int64)

    def per_region(kernel, team: int) -> float:
        params = np.zeros(2 * COUNTER_STRIDE, np.int64)
        params[:3] = team, args.regions, team * CHUNKS_PER_THREAD
        runs = []
        for _ in range(5):
            kernel(params, out)
            runs.append(int(out[0]) / args.regions / rate)
        return min(runs)

    teams = [t for t in (1, 2) if t <= max(get_max_threads(), 1)]
    figures = {}
    print(f"{'threads':>7}  {'work-sharing us':>15}  {'counted us':>10}  {'ratio':>6}")
    for team in teams:
        per_region(work_sharing, team)    # warm: the team exists
        per_region(counted.forks, team)
        ws, ct = [], []
        for _ in range(args.rounds):
            ws.append(per_region(work_sharing, team))
            ct.append(per_region(counted.forks, team))
        ratio = statistics.median(w / c for w, c in zip(ws, ct))
        figures[str(team)] = {"us_work_sharing": round(statistics.median(ws) * 1e6, 3),
                              "us_counted": round(statistics.median(ct) * 1e6, 3), "ratio": round(ratio, 3)}
        print(f"{team:>7}  {figures[str(team)]['us_work_sharing']:>15.3f}  {figures[str(team)]['us_counted']:>10.3f}"
              f"  {ratio:>6.3f}")
    print(json.dumps({"teams": figures, "cpu": target.cpu, "regions": args.regions, "rounds": args.rounds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
