"""fp32 matmul with the default (hand-written) schedule against numpy's `@`, in the same run.

Reports GFLOPS of both (interleaved, median of repeats), the build time (lower + codegen +
LLVM compile + load), and the speed-up of `--threads` (default: every core; numpy's BLAS on as
many) over 1. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from blas_info import blas_line, blas_report
from matmul_check import checked_square_matmul

import compiler
from compiler.ops import get_op
from compiler.ops.schedule_gemm import schedule_gemm


def median_seconds(fn, repeat: int, number: int) -> float:
    # OpenBLAS and libgomp worker threads spin for a while after a call; let the other side's
    # threads go idle first so each measurement gets both cores.
    time.sleep(0.2)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t0) / number)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of ours vs numpy")
    ap.add_argument("--builds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None,
                    help="threads of ours and numpy's BLAS (default: every core; the kernel is made for every core)")
    args = ap.parse_args()
    n = args.n
    op = get_op("matmul", M=n, N=n, K=n)
    target = compiler.Target.host()
    threads = args.threads or target.num_cores
    if args.threads:
        from threadpoolctl import threadpool_limits
        threadpool_limits(threads, user_api="blas")
    compiler.set_num_threads(threads)

    build_ms = []
    for _ in range(args.builds):
        t0 = time.perf_counter()
        kernel = compiler.build(schedule_gemm(op, target), op.tensors, target)
        kernel.load()
        build_ms.append((time.perf_counter() - t0) * 1e3)

    a, b, c, rel_err = checked_square_matmul(kernel, n)

    flops = 2.0 * n ** 3
    number = max(1, int(2e9 / flops))
    ours, ref_t, ours_1t = [], [], []
    kernel(a, b, c)
    a @ b
    for _ in range(args.rounds):
        ours.append(median_seconds(lambda: kernel(a, b, c), 3, number))
        ref_t.append(median_seconds(lambda: a @ b, 3, number))
        compiler.set_num_threads(1)
        ours_1t.append(median_seconds(lambda: kernel(a, b, c), 3, number))
        compiler.set_num_threads(threads)
    t_ours, t_np, t_1 = statistics.median(ours), statistics.median(ref_t), statistics.median(ours_1t)
    result = {
        "n": n,
        "gflops": round(flops / t_ours / 1e9, 1),
        "numpy_gflops": round(flops / t_np / 1e9, 1),
        "ratio": round(t_np / t_ours, 3),
        "build_ms_median": round(statistics.median(build_ms), 1),
        "threads_speedup": round(t_1 / t_ours, 2),
        "gflops_1_thread": round(flops / t_1 / 1e9, 1),
        "rel_err": rel_err,
        "target": target.cpu,
        "threads": threads,
    }
    result["blas"] = blas_report()
    print(blas_line())
    print(f"{'kernel':<28}{'GFLOPS':>10}")
    print(f"{f'tunefarm ({threads} thread' + ('s)' if threads > 1 else ')'):<28}{result['gflops']:>10}")
    print(f"{'tunefarm (1 thread)':<28}{result['gflops_1_thread']:>10}")
    print(f"{'numpy @ (OpenBLAS)':<28}{result['numpy_gflops']:>10}")
    print(f"ratio {result['ratio']}  build {result['build_ms_median']} ms  threads speed-up {result['threads_speedup']}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
