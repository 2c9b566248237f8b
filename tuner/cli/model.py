"""`tunefarm model tasks|tune|run|profile|export MODEL.onnx` and `tunefarm model conformance`: whole models.

`tasks` lists what tuning a model means: its unique fused workloads (name, shapes, flops, and the
weight a task scheduler gives each: how many times the model runs it). `run` compiles the model
with the best records of this target (the default schedules where there are none), runs it on
random inputs and, when onnxruntime is installed, compares the outputs and the latency with it in
the same process, the two timed interleaved on the same threads. `tune` (model_tune.py) tunes
the tasks under one budget and stores the records `run` uses; `profile` (model_profile.py) times
each fused kernel of a run, beside onnxruntime's profile of the same nodes with --compare;
`export` (model_export.py) writes the compiled model as a shared library with a C API;
`conformance` (model_conformance.py) runs ONNX's backend node tests per supported op type.
"""

from __future__ import annotations

import json
import time

import numpy as np

from . import model_conformance, model_export, model_profile, model_tune
from .common import EXIT_FAIL, EXIT_OK, UsageError, build_graph_module, load_graph, random_inputs, resolve_target


def _shapes(opdef) -> str:
    return ", ".join("x".join(map(str, t.shape)) for t in opdef.inputs) + " -> " + "x".join(map(str, opdef.output.shape))


def cmd_tasks(args) -> int:
    from compiler.graph import GraphError, extract_tasks
    target = resolve_target(args.target)
    graph = load_graph(args.model, args.input_shape, args.dim)
    try:
        tasks = extract_tasks(graph, target)
    except GraphError as e:
        raise UsageError(str(e)) from None
    if args.json:
        print(json.dumps([dict(name=t.opdef.name, key=t.key, shapes=_shapes(t.opdef), flops=t.opdef.flops,
                               weight=t.weight) for t in tasks], indent=1))
        return EXIT_OK
    total = sum(t.opdef.flops * t.weight for t in tasks)
    print(f"{graph.name}: {len(graph.nodes)} nodes after folding, {sum(t.weight for t in tasks)} kernels, "
          f"{len(tasks)} unique workloads, {total / 1e9:.3f} GFLOP per run")
    print(f"{'#':>3}  {'workload':<34} {'key':<12} {'weight':>6} {'MFLOP':>10}  shapes")
    for i, t in enumerate(tasks):
        print(f"{i:>3}  {t.opdef.name:<34} {t.key[:12]:<12} {t.weight:>6} {t.opdef.flops / 1e6:>10.2f}  {_shapes(t.opdef)}")
    return EXIT_OK


def cmd_run(args) -> int:
    from compiler.graph.run_timing import round_ratio, time_interleaved
    from compiler.runtime import set_num_threads

    target = resolve_target(args.target)
    graph = load_graph(args.model, args.input_shape, args.dim, symbolic_default=1)
    if args.threads:
        set_num_threads(args.threads)
    t0 = time.perf_counter()
    module = build_graph_module(graph, target, args.db, args.no_records)
    build_s = time.perf_counter() - t0
    tuned = sum(1 for src in module.sources.values() if src == "records")
    print(f"built {len(module.steps)} kernels ({len(module.sources)} unique workloads, {tuned} from records, "
          f"{len(module.sources) - tuned} default schedules) in {build_s:.1f} s; buffers "
          f"{module.plan.total_bytes / 1e6:.2f} MB (without reuse {module.plan.unshared_bytes / 1e6:.2f} MB)")
    inputs = random_inputs(graph, np.random.default_rng(args.seed))
    outputs = module.run(**inputs)
    session = _onnxruntime_session(args.model, args.threads)
    ref = session.run(None, inputs) if session is not None else None
    runs = {"tunefarm": lambda: module.run(**inputs)}
    if session is not None:
        runs["onnxruntime"] = lambda: session.run(None, inputs)
    # the protocol model profile and the benchmarks time with (compiler.graph.run_timing)
    times = time_interleaved(runs, rounds=args.repeat)
    ok = True
    disturbed = " (disturbed: other processes took time from a round)" if times["tunefarm"].disturbed else ""
    print(f"tunefarm:    {times['tunefarm'].ms:9.3f} ms (median of {args.repeat} rounds){disturbed}")
    if session is None:
        print("onnxruntime: not installed (pip install 'tunefarm[bench]' to compare)")
    else:
        ratio = round_ratio(times, "onnxruntime", "tunefarm")
        print(f"onnxruntime: {times['onnxruntime'].ms:9.3f} ms   ratio (onnxruntime / tunefarm) {ratio:.2f}x")
        for name, a, b in zip(graph.outputs, outputs, ref):
            scale = float(np.max(np.abs(b))) if b.size else 0.0
            err = float(np.max(np.abs(a.astype(np.float64) - b))) if a.size else 0.0
            rel = err / scale if scale else err
            good = rel <= args.rtol
            ok &= good
            print(f"output {name}: max |diff| {err:.3g} ({rel:.2g} of max |value|) {'ok' if good else 'MISMATCH'}")
    return EXIT_OK if ok else EXIT_FAIL


def _onnxruntime_session(path, threads):
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def register(sub):
    p = sub.add_parser("model", help="whole ONNX models: their tuning tasks, compile and run them")
    msub = p.add_subparsers(dest="model_command", metavar="SUBCOMMAND", required=True)

    def common(q):
        q.add_argument("model", metavar="MODEL.onnx")
        q.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,...",
                       help="pin an input whose shape the model leaves dynamic")
        q.add_argument("--dim", action="append", default=[], metavar="SYMBOL=SIZE",
                       help="set a symbolic dimension by its name in the model, in every input that has it "
                            "(e.g. --dim batch=8); run and profile take 1 for any left open")

    q = msub.add_parser("tasks", help="the model's unique fused workloads with their weights")
    common(q)
    q.add_argument("--json", action="store_true", help="print JSON instead of a table")
    q.add_argument("--target", default=None, help="target string (default: host); weight layouts, and so "
                                                  "some workloads, depend on it")
    q.set_defaults(func=cmd_tasks)

    model_tune.register(msub, common)
    model_export.register(msub, common)
    model_profile.register(msub, common)
    model_conformance.register(msub)

    q = msub.add_parser("run", help="compile the model (best records, else default schedules), run it, "
                                    "compare with onnxruntime when installed")
    common(q)
    q.add_argument("--target", default=None, help="target string (default: host)")
    q.add_argument("--db", default=None, help="records database URL (default: $TUNEFARM_DB_URL or "
                                              "sqlite:///~/.tunefarm/records.db)")
    q.add_argument("--no-records", action="store_true", help="default schedules only")
    q.add_argument("--repeat", type=int, default=5, help="timing rounds of each, alternating (each round "
                                                         "the median of several runs)")
    q.add_argument("--threads", type=int, default=0, help="threads for both (default: all cores)")
    q.add_argument("--rtol", type=float, default=1e-4, help="largest output difference, relative to the "
                                                            "largest output magnitude")
    q.add_argument("--seed", type=int, default=0)
    q.set_defaults(func=cmd_run)


__all__ = ["register"]
