"""`tunefarm model profile MODEL.onnx`: where a compiled model's time goes, kernel by kernel.

`model run` says how long the whole model takes; this says which layers take it. The model is
compiled as `model run` compiles it (best records, else default schedules), each fused kernel
timed where it stands in a run (compiler.graph.profile), and the table printed slowest first:
the ONNX nodes each kernel covers, its time and share, its GFLOPS (convolutions, matrix products)
or GB/s (everything else), and whether its schedule came from the records. `--compare` runs
onnxruntime's own profiler on the same inputs and threads and puts its time for the same nodes
beside each kernel (tuner.ort_profile), so the layer where tunefarm loses is found in one command.
`--scaling` measures each kernel's parallel regions on one thread and adds its chunks and predicted
efficiency at 16 threads (compiler.graph.model_scaling), so a kernel that cannot scale shows
before anyone has a many-core machine.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from .common import EXIT_FAIL, EXIT_OK, UsageError, build_graph_module, load_graph, random_inputs, resolve_target

NODES_WIDTH = 34
OPS_WIDTH = 26
WORKLOAD_WIDTH = 28
SCALING_THREADS = 16   # --scaling predicts this many threads (a typical server's core count)


def cmd_profile(args) -> int:
    from compiler.runtime import set_num_threads

    from .. import ort_profile

    if args.repeat < 1:
        raise UsageError(f"--repeat must be at least 1, got {args.repeat}")
    if args.top is not None and args.top < 1:
        raise UsageError(f"--top must be at least 1, got {args.top}")
    if args.threads < 0:
        raise UsageError(f"--threads must be >= 0, got {args.threads}")
    if args.compare:
        try:
            ort_profile.require_onnxruntime()   # before minutes of compiling and timing
        except ort_profile.OnnxRuntimeError as e:
            raise UsageError(f"--compare: {e}") from None
    target = resolve_target(None)
    graph = load_graph(args.model, args.input_shape, args.dim, symbolic_default=1)
    if args.threads:
        set_num_threads(args.threads)
    module = build_graph_module(graph, target, args.db, args.no_records)
    inputs = random_inputs(graph, np.random.default_rng(args.seed))
    profile = module.profile(inputs, repeat=args.repeat)
    if args.scaling:
        _add_scaling(module, profile, inputs, args)
    matched = theirs = None
    failed = None
    if args.compare:
        try:
            theirs = ort_profile.profile_onnxruntime(args.model, inputs, threads=args.threads, runs=args.repeat)
        except ort_profile.OnnxRuntimeError as e:
            failed = str(e)
        else:
            producers = {o: n.name for n in graph.nodes for o in n.outputs}
            matched = ort_profile.match_kernels(theirs, [k.nodes for k in profile.kernels], producers)
    if args.json:
        print(json.dumps(_as_json(module, profile, theirs, matched, args.top, failed), indent=1))
    else:
        _print_table(module, profile, theirs, matched, args.top)
        if failed:
            print(f"tunefarm model profile: {failed}", file=sys.stderr)
    return EXIT_FAIL if failed else EXIT_OK


def _add_scaling(module, profile, inputs, args) -> None:
    """Each kernel's regions measured on one thread and predicted at SCALING_THREADS threads,
    on the profile's kernels and on the profile itself (`scaling`: the model's figure)."""
    from compiler.graph.model_scaling import attach_to_profile, measure_model_scaling

    records = None
    if not args.no_records and any(src == "records" for src in module.sources.values()):
        from ..apply_best import ApplyHistoryBest
        from .common import open_store
        records = ApplyHistoryBest(open_store(args.db))
    scaling = measure_model_scaling(module, inputs, records=records)
    attach_to_profile(profile, scaling, SCALING_THREADS)
    profile.scaling = {"threads": SCALING_THREADS, "predicted_speedup": scaling.speedup(SCALING_THREADS),
                       "predicted_efficiency": scaling.efficiency(SCALING_THREADS),
                       "parallel_costs": scaling.costs.to_dict(), "host": scaling.host.to_dict()}


def _scaling_cell(k) -> str:
    s = k.scaling
    if s is None:
        return ""
    chunks = "/".join(str(c) for c in s["chunks"]) or "serial"
    return f" {_clip(chunks, 14):>14} {s['predicted_efficiency']:>5.2f}  {s['limit']}"


def _sources(module) -> str:
    tuned = sum(1 for src in module.sources.values() if src == "records")
    return f"{len(module.sources)} unique workloads: {tuned} from records, {len(module.sources) - tuned} default schedules"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _rate(k) -> str:
    if k.gflops is not None:
        return f"{k.gflops:8.2f} GFLOPS"
    return f"{k.gb_per_s:8.2f} GB/s  " if k.gb_per_s is not None else ""


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4f} ms"


def _print_table(module, profile, theirs, matched, top) -> None:
    shown = profile.ranked(top)
    print(f"{profile.model}: {len(profile.kernels)} kernels ({_sources(module)}), {profile.threads} "
          f"thread{'s' if profile.threads != 1 else ''}; medians of each kernel's calls in run order, slowest first")
    head = (f"{'#':>3}  {'kernel':<{OPS_WIDTH}} {'workload':<{WORKLOAD_WIDTH}} {'nodes':<{NODES_WIDTH}} "
            f"{'ms':>9} {'share':>6} {'throughput':>15}  {'source':<7}")
    if profile.kernels and profile.kernels[0].scaling is not None:
        head += f" {'chunks@' + str(SCALING_THREADS):>14} {'eff' + str(SCALING_THREADS):>5}  limit"
    if matched is not None:
        head += f" | {'onnxrt ms':>9}  onnxruntime nodes"
    print(head)
    for k in shown:
        line = (f"{k.index:>3}  {_clip(k.ops, OPS_WIDTH):<{OPS_WIDTH}} {_clip(k.name, WORKLOAD_WIDTH):<{WORKLOAD_WIDTH}} "
                f"{_clip(', '.join(k.nodes), NODES_WIDTH):<{NODES_WIDTH}} {k.seconds * 1e3:>9.4f}"
                f"{'*' if k.disturbed else ' '}{k.share:>6.1%} {_rate(k):>15}  {k.source:<7}{_scaling_cell(k)}")
        if matched is not None:
            nodes = matched.per_kernel[k.index]
            line += (f" | {matched.kernel_seconds(k.index) * 1e3:>9.4f}  " + ", ".join(n.name for n in nodes)
                     if nodes else f" | {'-':>9}")
        print(line)
    rest = len(profile.kernels) - len(shown)
    if rest:
        hidden = sum(k.seconds for k in profile.kernels) - sum(k.seconds for k in shown)
        print(f"     ... {rest} more kernels, {_ms(hidden)} ({hidden / profile.kernel_seconds:.1%})")
    overhead = profile.overhead_seconds
    print(f"tunefarm:    kernels {_ms(profile.kernel_seconds)} (sum of medians), in one native call "
          f"{_ms(profile.sequence_seconds)} (median), whole run {_ms(profile.run_seconds)} (median), "
          f"outside kernels {_ms(overhead)}"
          + (f" ({overhead / profile.run_seconds:.1%} of the run)" if profile.run_seconds > 0 else ""))
    if profile.in_place:
        print(f"in place:    {len(profile.in_place)} Concat nodes run no kernel (their inputs are written where the "
              f"output keeps them): " + ", ".join(profile.in_place))
    scaling = getattr(profile, "scaling", None)
    if scaling:
        c = scaling["parallel_costs"]
        print(f"scaling:     predicted {scaling['predicted_speedup']:.1f}x at {scaling['threads']} threads "
              f"(efficiency {scaling['predicted_efficiency']:.2f}), kernels weighted by their one-thread time; "
              f"fork/join {c['fork_join_us']} us and a team's barrier {c.get('barrier_us', {})} us measured "
              f"(+{c.get('barrier_slope_us_per_thread', c['fork_join_slope_us_per_thread']):.2f} us a further "
              f"thread); assumed {scaling['host']['gbps_per_core']} GB/s and {scaling['host']['l2_mib_per_core']} "
              f"MiB L2 a core on the many-core host")
    if profile.disturbed:
        print("* the host was busy during this timing (other processes took CPU time from it): rerun on a quiet host")
    if theirs is not None and matched is not None:
        unmatched = sorted(matched.unmatched, key=lambda n: -n.seconds)
        print(f"onnxruntime: nodes {_ms(theirs.node_seconds)} (sum, mean of {theirs.runs} profiled runs after warm-up; "
              f"the profiled run {_ms(theirs.run_seconds)}), unmatched nodes {_ms(matched.unmatched_seconds)}"
              + (": " + ", ".join(f"{n.name} ({n.op_type}{', in place here' if n.name in profile.in_place else ''}) "
                                  f"{_ms(n.seconds)}" for n in unmatched[:8]) if unmatched else "")
              + (f" and {len(unmatched) - 8} more" if len(unmatched) > 8 else ""))
        if theirs.plain_run_seconds is not None:
            line = f"onnxruntime: whole run {_ms(theirs.plain_run_seconds)} (median, not profiling)"
            if profile.run_seconds > 0:
                line += f"; onnxruntime / tunefarm {theirs.plain_run_seconds / profile.run_seconds:.2f}x"
            print(line)


def _as_json(module, profile, theirs, matched, top, failed) -> dict:
    out = profile.to_dict()
    out["sources"] = {"records": sum(1 for s in module.sources.values() if s == "records"),
                      "default": sum(1 for s in module.sources.values() if s == "default")}
    kernels = []
    for k in profile.ranked(top):
        d = k.to_dict()
        if matched is not None:
            d["onnxruntime"] = {"ms": matched.kernel_seconds(k.index) * 1e3,
                                "nodes": [n.to_dict() for n in matched.per_kernel[k.index]]}
        kernels.append(d)
    out["kernels"] = kernels   # slowest first; `index` is the position in the run
    if getattr(profile, "scaling", None):
        out["scaling"] = profile.scaling
    if theirs is not None and matched is not None:
        plain = theirs.plain_run_seconds
        out["onnxruntime"] = {"run_ms": None if plain is None else plain * 1e3,
                              "profiled_run_ms": theirs.run_seconds * 1e3, "nodes_ms": theirs.node_seconds * 1e3,
                              "runs": theirs.runs, "unmatched_ms": matched.unmatched_seconds * 1e3,
                              "unmatched": [n.to_dict() for n in matched.unmatched]}
    if failed:
        out["onnxruntime_error"] = failed
    return out


def register(msub, common) -> None:
    q = msub.add_parser("profile", help="time each fused kernel of the model: the slow layers, slowest first",
                        description="Compile the model (best records, else default schedules), time each fused "
                                    "kernel where it stands in a run on random inputs, and print them slowest "
                                    "first with the ONNX nodes they cover, their share, GFLOPS or GB/s and "
                                    "the schedule's source. --compare puts onnxruntime's profile of the same "
                                    "nodes beside them.")
    common(q)
    q.add_argument("--db", default=None, help="records database URL (default: $TUNEFARM_DB_URL or "
                                              "sqlite:///~/.tunefarm/records.db)")
    q.add_argument("--no-records", action="store_true", help="default schedules only")
    q.add_argument("--threads", type=int, default=0, help="threads for both (default: all cores)")
    q.add_argument("--top", type=int, default=None, metavar="K", help="the K slowest kernels only (default: all)")
    q.add_argument("--repeat", type=int, default=10,
                   help="clean timing samples per kernel at least; onnxruntime's profiled runs (default 10)")
    q.add_argument("--compare", action="store_true",
                   help="also profile onnxruntime (the `bench` extra) on the same inputs and threads")
    q.add_argument("--scaling", action="store_true",
                   help=f"also measure each kernel's parallel regions on one thread and show its chunks and "
                        f"predicted efficiency at {SCALING_THREADS} threads (the scaling model)")
    q.add_argument("--json", action="store_true", help="print JSON instead of a table")
    q.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    q.set_defaults(func=cmd_profile)


__all__ = ["register", "cmd_profile"]
