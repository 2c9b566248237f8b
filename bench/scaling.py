"""Predicted speed-up at 4 to 128 threads, checked on this 2-core machine (issue 58).

For every ResNet-50 conv default (bench/tune_conv.py's layers) and every zoo model
(bench/model_zoo.py's models, `--models` picks some; `--models none` only the convs), each kernel
is measured on one thread here (compiler/kernel_scaling.py: the plain kernel's time and a
profiling build's per-iteration cost of each parallel region), this machine's fork/join cost is
measured (compiler/parallel_probe.py, at 1 and 2 threads, extrapolated linearly beyond), and the
scaling model (compiler/scaling.py) predicts each kernel at N threads: per region the makespan
of its dynamic chunks on min(N, team cap) threads plus fork/join, the serial part as it is, and
a bandwidth bound for data beyond the team's L2 at an assumed per-core bandwidth of the
many-core host (printed; this machine's own 1- and all-core read bandwidth are printed beside
it). A model's figure weighs its kernels by their one-thread time.

The kernels are those a machine of `--cores` cores (default 16, the figure's thread count) would
run: default schedules for this host's instruction set with `-num-cores=16`, whose parallel loops
are cut for 16 threads (a 2-core target's schedule packs a layer's weights per channel block
inside a parallel loop of as few as 8 blocks, since 8 blocks keep 2 cores busy; a 16-core one
packs first and spreads the tiles). They run here on one thread, as every kernel is measured.

Prints a table (speed-up at each N, efficiency at 16 and what limits it: the kernel and region
and whether the loss is the serial part, fork/join, the team cap, too few or uneven chunks, or
bandwidth), then one JSON line: `predicted_efficiency_16` ({conv layer or model: speed-up at 16
/ 16}), `predicted_speedup` ({name: {threads: speed-up}}), `limits_16`, `details` (per conv and
per model's slowest-to-scale kernels: one-thread ms, regions with extent, team cap, entries and
chunks at 16, efficiency and limit), `parallel_costs`, `host_assumption`, `memory_gbps_here`,
`refused`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import model_zoo  # noqa: E402 - the zoo's models, their inputs and exports
import tune_conv  # noqa: E402 - ResNet-50's conv layers

SHOWN_KERNELS = 5   # per model in `details`: the kernels losing most at 16 threads


def kernel_details(kt, predictions) -> dict:
    p16 = predictions[16]
    return {"t1_ms": round(kt.seconds * 1e3, 4), "serial_ms": round(kt.serial_seconds * 1e3, 4),
            "regions": [{**rt.region.to_dict(), "chunks_16": len(rt.region.chunks(16)),
                         "compute_ms": round(rt.compute_seconds * 1e3, 4)} for rt in kt.regions],
            "efficiency_16": round(p16.efficiency, 3), "limit_16": p16.limit(),
            "losses_16_ms": {k: round(v * 1e3, 4) for k, v in p16.losses.items()}}


def conv_layers(names, costs, host, threads, out, target) -> None:
    from compiler.kernel_scaling import measure_kernel
    from compiler.ops import default_schedule, get_op
    from compiler.scaling import predict

    rng = np.random.default_rng(0)
    for layer in names:
        opdef = get_op("conv2d_nchw", **tune_conv.params(layer))
        arrays = [rng.standard_normal(t.shape).astype(t.dtype) for t in opdef.tensors]
        kt = measure_kernel(default_schedule(opdef, target), opdef.tensors, arrays, costs, target, name=layer)
        preds = {n: predict(kt, n, costs.fork_join, host, costs.barrier) for n in threads}
        record(out, f"conv {layer}", {n: p.speedup for n, p in preds.items()}, preds[16].limit(),
               kernel_details(kt, preds))


def model_graph(name: str, tmp: str):
    """(graph at batch 1, feeds) of a zoo model, as model_zoo builds it (TorchScript exporter)."""
    import onnx

    from compiler.graph import from_onnx

    path = f"{tmp}/{name}.onnx"
    if name.startswith("light_"):
        model_zoo.light_model(name[len("light_"):], path)
        model_zoo.symbolic_batch(path)
        feeds = model_zoo.model_inputs(onnx.load(path), batch=1)
    else:
        failed = model_zoo.export_torch(name, path, "torchscript", 2, model_zoo.DEFAULT_SEQ, dynamic=True)
        if failed is not None:
            failed = model_zoo.export_torch(name, path, "torchscript", 1, model_zoo.DEFAULT_SEQ, dynamic=False)
        if failed is not None:
            raise RuntimeError(f"export failed: {failed}")
        feeds = model_zoo.model_feeds(name, 1, model_zoo.DEFAULT_SEQ)
    graph = from_onnx(path, input_shapes={n: a.shape for n, a in feeds.items()})
    return graph, {n: feeds[n] for n in graph.inputs}


def models(names, costs, host, threads, out, refused, target) -> None:
    import model_e2e

    from compiler.graph.model_scaling import measure_model_scaling

    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            t0 = time.perf_counter()
            try:
                graph, feeds = model_graph(name, tmp)
                module = model_e2e.build_quiet(graph, target=target)
                sc = measure_model_scaling(module, feeds, costs=costs, host=host, threads=threads)
            except Exception as e:  # noqa: BLE001 - a model that fails is reported, the run goes on
                refused[name] = f"{type(e).__name__}: {e}"[:300]
                traceback.print_exc()
                continue
            total = sum(k.timing.seconds for k in sc.kernels)
            worst = sc.worst(16, SHOWN_KERNELS)
            limit = (f"{worst[0].name}#{worst[0].index} ({worst[0].timing.seconds / total:.0%} of t1): "
                     f"{worst[0].predictions[16].limit()}") if worst else "-"
            details = {"kernels": len(sc.kernels), "t1_ms": round(total * 1e3, 3),
                       "worst_16": [{"index": k.index, "name": k.name, "share_t1": round(k.timing.seconds / total, 3),
                                     **kernel_details(k.timing, k.predictions)} for k in worst],
                       "seconds": round(time.perf_counter() - t0, 1)}
            record(out, name, {n: sc.speedup(n) for n in threads}, limit, details)


def record(out, name, speedups, limit, details) -> None:
    out["predicted_speedup"][name] = {str(n): round(s, 2) for n, s in speedups.items()}
    out["predicted_efficiency_16"][name] = round(speedups[16] / 16, 3)
    out["limits_16"][name] = limit
    out["details"][name] = details
    cells = " ".join(f"{s:6.1f}" for s in speedups.values())
    eff = speedups[16] / 16
    print(f"{name:<28} {cells}   {eff:5.2f}{' ' if eff >= 0.7 else '<'}  {limit}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(model_zoo.MODELS),
                    help="zoo models (default: all of bench/model_zoo.py's); 'none' for the convs only")
    ap.add_argument("--layers", nargs="+", default=list(tune_conv.LAYERS),
                    help="ResNet-50 conv layers (default: all); 'none' for none")
    ap.add_argument("--gbps-per-core", type=float, default=None,
                    help="the many-core host's DRAM bandwidth per core with all cores streaming (default: "
                         "compiler.scaling.ManyCoreHost's)")
    ap.add_argument("--cores", type=int, default=16,
                    help="the cores of the target the kernels are made for (this host's instruction set; default 16)")
    args = ap.parse_args()
    if args.cores < 1:
        ap.error("--cores must be at least 1")
    names = [] if args.models == ["none"] else args.models
    layers = [] if args.layers == ["none"] else args.layers
    unknown = [m for m in names if m not in model_zoo.MODELS] + [x for x in layers if x not in tune_conv.LAYERS]
    if unknown:
        ap.error(f"unknown models or layers: {unknown}")

    import compiler
    from compiler.openmp import get_max_threads
    from compiler.parallel_probe import measure_parallel_costs
    from compiler.scaling import THREADS, ManyCoreHost

    cores = get_max_threads()
    target = compiler.Target.host()
    target.num_cores = args.cores
    host = ManyCoreHost() if args.gbps_per_core is None else ManyCoreHost(gbps_per_core=args.gbps_per_core)
    costs = measure_parallel_costs()
    here = {"1": round(model_zoo.memory_gbps(1, mib=256), 1), str(cores): round(model_zoo.memory_gbps(cores, mib=256), 1)}
    fj = costs.to_dict()
    print(f"kernels made for {target.cpu} with {target.num_cores} cores, measured here on 1 of {cores} threads; "
          f"fork/join measured {fj['fork_join_us']} us, a team's barrier {fj['barrier_us']} us (beyond 2 threads: "
          f"+{fj['fork_join_slope_us_per_thread']:.2f} / +{fj['barrier_slope_us_per_thread']:.2f} us at the "
          f"second, +{costs.barrier_step() * 1e6:.2f} us a further thread); memory read here {here} GB/s "
          f"(1 / all threads); assumed for the many-core host: {host.gbps_per_core} GB/s and "
          f"{host.l2_bytes_per_core >> 20} MiB L2 a core\n")
    print(f"{'layer or model':<28} " + " ".join(f"{'x' + str(n):>6}" for n in THREADS) + "   eff16   limit at 16")
    out = {"predicted_efficiency_16": {}, "predicted_speedup": {}, "limits_16": {}, "details": {}}
    refused: dict = {}
    t0 = time.perf_counter()
    conv_layers(layers, costs, host, THREADS, out, target)
    models(names, costs, host, THREADS, out, refused, target)
    effs = out["predicted_efficiency_16"]
    below = sorted(k for k, v in effs.items() if v < 0.7)
    print(f"\n{len(effs) - len(below)} of {len(effs)} at >= 0.7 efficiency at 16 threads; below: {', '.join(below) or '-'}"
          f"; refused {sorted(refused) or '-'}; {time.perf_counter() - t0:.0f} s")
    out.update(target=str(target), parallel_costs=fj, host_assumption=host.to_dict(), memory_gbps_here=here, threads=list(THREADS),
               refused=sorted(refused), refused_reasons=refused, below_0_7=below)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
