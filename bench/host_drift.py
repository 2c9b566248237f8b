"""How much this host's speed drifts, and whether the calibration kernels see the same drift (issue 56).

A measuring worker's calibration (device_agent/calibration.py) judges a window by two fixed
yardsticks, an FMA-bound matmul tile and a memory-bound stream. Whether a yardstick timed beside a
kernel could also *correct* the kernel's figure for the host's drift depends on whether the two
slow down together. For each kernel (default schedules: a 256³ and a 512³ matmul, ResNet's
1x64x56x56 3x3 conv, a 4 Mi-float add), this times the kernel, the FMA tile and the stream in
turn, a batch of about a millisecond each, for `--seconds`, on all cores, in a process prepared as
a measuring worker is (compiler/timing.py: bound team, priority) and holding the host's timing lock.

Per window length (0.05 to 2 s): the coefficient of variation over windows of the kernel's median
time (the reference: what a timing of that length sees), and of its median ratio to each
yardstick timed beside it. A ratio steadier than the raw time means that yardstick drifts with
the kernel.

Prints a table, then one JSON object: {"kernels": {name: {"raw_cv" | "over_fma_cv" |
"over_stream_cv": {window: cv}, "yardstick": the steadier ratio's at 1 s, "steadier_1s": raw cv /
that ratio's cv}}, "numpy_blas", "cpu", "seconds"}.

    .venv/bin/python bench/host_drift.py [--seconds 20] [--kernels matmul256 conv ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

KERNELS = {
    "matmul256": ("matmul", dict(M=256, N=256, K=256)),
    "matmul512": ("matmul", dict(M=512, N=512, K=512)),
    "conv": ("conv2d_nchw", dict(N=1, C=64, H=56, W=56, F=64, KH=3, KW=3, stride=1, padding=1)),
    "add4M": ("add", dict(shape_a=(4096, 1024))),
}
WINDOWS = (0.05, 0.2, 0.5, 1.0, 2.0)
BATCH_S = 1e-3     # each of the three timed in batches of about this long


def cv(values) -> float | None:
    """Coefficient of variation; None below two windows (a run shorter than the window)."""
    return round(float(statistics.pstdev(values) / statistics.mean(values)), 4) if len(values) > 1 else None


def drift(samples: np.ndarray) -> dict:
    """samples: rows of (start time, kernel s/call, fma s/call, stream s/call) → cv per window."""
    out: dict = {"raw_cv": {}, "over_fma_cv": {}, "over_stream_cv": {}}
    for w in WINDOWS:
        group = ((samples[:, 0] - samples[0, 0]) // w).astype(int)
        raw, fma, stream = [], [], []
        for g in np.unique(group):
            rows = samples[group == g]
            if len(rows) < 3:
                continue
            raw.append(np.median(rows[:, 1]))
            fma.append(np.median(rows[:, 1] / rows[:, 2]))
            stream.append(np.median(rows[:, 1] / rows[:, 3]))
        for key, values in (("raw_cv", raw), ("over_fma_cv", fma), ("over_stream_cv", stream)):
            out[key][str(w)] = cv(values)
    # at 1 s (a long timing): which yardstick drifts with the kernel, and how much steadier it makes it
    if out["raw_cv"]["1.0"] is not None:
        steadier = min(("fma", "stream"), key=lambda y: out[f"over_{y}_cv"]["1.0"])
        out["yardstick"] = steadier
        out["steadier_1s"] = round(out["raw_cv"]["1.0"] / max(out[f"over_{steadier}_cv"]["1.0"], 1e-6), 2)
    return out


def measure(name: str, seconds: float, target) -> np.ndarray:
    import compiler
    from compiler.ops.base import random_inputs
    from compiler.timing import calls_per_sample
    from compiler.verify import poisoned
    from device_agent.calibration import calibration_kernels
    from tuner.space import default_candidate, instantiate
    from tuner.workload import Workload

    op, params = KERNELS[name]
    opdef = Workload(op, params).opdef()
    sched, args = instantiate(opdef, default_candidate(opdef.workload_key()), target)
    kernel = compiler.build(sched, args, target)
    arrays = [*random_inputs(opdef, np.random.default_rng(0)), poisoned(opdef.output.shape, opdef.output.dtype, 0)]
    cal = calibration_kernels()
    runs = [kernel.batch_runner(arrays), cal["fma"][0].batch_runner(cal["fma"][1]),
            cal["stream"][0].batch_runner(cal["stream"][1])]
    counts = []
    for run, _ in runs:
        run(3)                                   # warm: its data in cache, the team started
        counts.append(calls_per_sample(run, BATCH_S))
    rows = []
    perf = time.perf_counter
    end = perf() + seconds
    while perf() < end:
        row = [perf()]
        for (run, _), n in zip(runs, counts):
            t0 = perf()
            run(n)
            row.append((perf() - t0) / n)
        rows.append(row)
    return np.array(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="per kernel")
    ap.add_argument("--kernels", nargs="+", choices=list(KERNELS), default=list(KERNELS))
    args = ap.parse_args()

    from compiler.timing import prepare_timing_process
    prepare_timing_process()
    import compiler
    from compiler import host_lock
    from compiler.runtime import set_num_threads

    target = compiler.Target.host()
    set_num_threads(target.num_cores)
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    blas_text = f"{blas.get('name')} {blas.get('openblas configuration', '')}".strip()
    print(f"host target: -mcpu={target.cpu}, {target.num_cores} threads; numpy's BLAS (not timed here): {blas_text}\n")
    results = {}
    t0 = time.perf_counter()
    with host_lock.exclusive():
        for name in args.kernels:
            results[name] = drift(measure(name, args.seconds, target))
    print(f"{'kernel':<10} {'window s':>8} {'raw cv':>8} {'/ fma cv':>9} {'/ stream cv':>12}")
    for name, r in results.items():
        for w in WINDOWS:
            k = str(w)
            shown = ["-" if r[c][k] is None else f"{r[c][k]:.3f}" for c in ("raw_cv", "over_fma_cv", "over_stream_cv")]
            print(f"{name:<10} {w:>8} {shown[0]:>8} {shown[1]:>9} {shown[2]:>12}")
    print(json.dumps({"kernels": results, "numpy_blas": blas_text, "cpu": target.cpu,
                      "seconds": round(time.perf_counter() - t0, 1)}))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
