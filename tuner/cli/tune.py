"""`tunefarm tune`, `tunefarm best` and `tunefarm records`: the tuner's command line.

`tune` runs a real tuning job on this machine (records in SQLite by default, or --db URL) with
a progress bar of trials, best GFLOPS and errors, then builds the operator with the best
record (apply-best) and times it beside numpy in the same run.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from .common import (
    DEFAULT_PARAMS,
    EXIT_FAIL,
    EXIT_OK,
    UsageError,
    add_tuning_flags,
    check_op_names,
    check_output,
    check_runs_here,
    farm_runner,
    make_op,
    open_store,
    parse_param,
    poisoned_output,
    resolve_target,
    run_tuning,
    start_progress,
    tuning_from_flags,
)
from .remote import disturbed_note


def _task_from_args(args):
    """The one task of `best` (OPNAME --param ...)."""
    from ..workload import Task, Workload

    check_op_names([args.op])
    params = dict(DEFAULT_PARAMS[args.op])
    params.update(parse_param(p) for p in args.param)
    opdef = make_op(args.op, params)  # validates the parameters (UsageError on bad ones)
    target = resolve_target(args.target)
    return Task(Workload(args.op, params), str(target), args.key), opdef, target


def _tasks_from_args(args):
    """[(task, opdef, weight)] of `tune`: the listed operators (default sizes, --param applied to
    each) and the entries of --workloads FILE; every one checked before anything is tuned."""
    from ..compute_file import load_compute_file
    from ..workload import Task, Workload, WorkloadError
    from ..workload_file import read_workloads

    if not args.ops and not args.workloads and not args.compute:
        raise UsageError("give one or more operators (e.g. `tunefarm tune matmul`), --workloads FILE "
                         "or --compute FILE.py")
    target = resolve_target(args.target)
    check_op_names(args.ops)
    listed = []
    for op in args.ops:
        params = dict(DEFAULT_PARAMS.get(op, {}))
        params.update(parse_param(p) for p in args.param)
        listed.append((Workload(op, params), 1.0))
    try:
        if args.workloads:
            listed += read_workloads(args.workloads)
        for path in args.compute:
            listed.append((load_compute_file(path), 1.0))
    except WorkloadError as e:
        raise UsageError(str(e)) from None
    out = []
    for workload, weight in listed:
        opdef = make_op(workload.name, workload.params) if workload.definition is None else workload.opdef()
        out.append((Task(workload, str(target), args.key), opdef, weight))
    keys = [opdef.workload_key() for _, opdef, _ in out]
    if len(set(keys)) != len(keys):
        raise UsageError("the same workload is listed twice; give it a larger weight in --workloads instead")
    return out, target


def cmd_tune(args) -> int:
    from ..tune import tune, tune_tasks

    entries, target = _tasks_from_args(args)
    check_runs_here(args, target)
    options, measure = tuning_from_flags(args)
    store = open_store(args.db)
    progress = _Progress([(t, o) for t, o, _ in entries], options.trials, plain=args.plain)
    runner = farm_runner(args, measure)

    def run():
        if len(entries) == 1:
            return [tune(entries[0][0], store, options, on_batch=progress.update, runner=runner, measure=measure)]
        return tune_tasks([t for t, _, _ in entries], store, options, weights=[w for _, _, w in entries],
                          on_batch=progress.update, runner=runner, measure=measure).results

    status, results = run_tuning("tune", run, progress=progress, runner=runner)
    if status != EXIT_OK:
        return status
    if runner is not None and runner.timings_emulated():
        print(f"note: the agents of key {args.key!r} run emulated (qemu-user): their timings rank candidates for the "
              "emulator, not for the real device; they are labelled so in the records and kept apart from native ones")
    for (task, opdef, weight), result in zip(entries, results):
        status = max(status, _summarize(task, opdef, weight, result, len(entries) > 1))
        if result.best_candidate is not None:
            status = max(status, _report_best(store, opdef, target, args.compare_repeat))
    if len(entries) > 1:
        total = sum(w * r.best_cost for (_, _, w), r in zip(entries, results))
        print(f"weighted latency of the {len(entries)} tasks: {1e3 * total:.3f} ms ({args.scheduler} scheduler)")
    return status


def _summarize(task, opdef, weight, result, several: bool) -> int:
    label = f"{task.workload.name}{f' (weight {weight:g})' if several else ''}"
    print(f"{label}: {result.trials} trials measured now, {result.resumed_trials} from earlier runs, "
          f"{result.errors} errors, {result.tune_seconds:.1f} s "
          f"(strategy and cost model {100 * result.tuner_overhead_fraction:.1f} %)")
    if result.phase_seconds:
        print(f"{label}: time went to {result.time_summary()}")
    if result.best_candidate is None:
        print(f"{label}: no valid candidate measured", file=sys.stderr)
        return EXIT_FAIL
    print(f"{label}: best {result.best_gflops:.3g} GFLOPS, {result.speedup_over_default:.2f}x over the default "
          f"schedule ({result.baseline_gflops:.3g} GFLOPS; both re-measured together)")
    if result.disturbed_timings:
        print(f"{label}: {disturbed_note(result.disturbed_fraction)}")
    return EXIT_OK


def _report_best(store, opdef, target, repeat: int) -> int:
    """Build with apply-best, check against the reference, time beside numpy (same run)."""
    from compiler.ops import build_op
    from compiler.ops.base import random_inputs
    from compiler.timing import TimingOptions

    from ..apply_best import ApplyHistoryBest
    from ..numpy_baselines import NUMPY_BASELINES, numpy_baseline, time_callable

    with ApplyHistoryBest(store):
        kernel = build_op(opdef, target)
    if not _runs_here(target):  # cross-compiled for the farm's devices: checked and timed there
        print(f"tuned kernel: built with the best record for {target} ({len(kernel.object_code)} bytes of object "
              "code); this machine cannot run it, its agents checked and timed it")
        return EXIT_OK
    ins = random_inputs(opdef, np.random.default_rng(0))
    out = poisoned_output(opdef.output)
    kernel(*ins, out)
    ok, why = check_output(out, opdef.reference(*ins), opdef.output.dtype)
    ours = kernel.measure(*ins, out, options=TimingOptions(min_samples=repeat)).median
    gf = lambda t: opdef.flops / t / 1e9  # noqa: E731
    check = "OK" if ok else "FAIL: " + why
    if opdef.name not in NUMPY_BASELINES:  # a user's own compute: nothing to hold it against
        print(f"tuned kernel: {gf(ours):.3g} GFLOPS   check {check}")
        return EXIT_OK if ok else EXIT_FAIL
    ref_fn = numpy_baseline(opdef)
    time.sleep(0.2)  # let our idle libgomp threads stop spinning before numpy's threads start
    theirs = time_callable(lambda *a: ref_fn(*a), ins, repeat=repeat).median
    print(f"tuned kernel: {gf(ours):.3g} GFLOPS   numpy: {gf(theirs):.3g} GFLOPS   "
          f"ratio {theirs / ours:.2f}x   check {check}")
    return EXIT_OK if ok else EXIT_FAIL


def _runs_here(target) -> bool:
    from compiler.errors import CompilerError
    from compiler.kernel_format import check_runnable
    try:
        check_runnable(target)
    except CompilerError:
        return False
    return True


def cmd_best(args) -> int:
    import json

    import compiler

    from ..apply_best import ApplyHistoryBest
    from ..space import instantiate

    task, opdef, target = _task_from_args(args)
    store = open_store(args.db)
    rec = ApplyHistoryBest(store).best_record(opdef, target)
    if rec is None:
        print(f"no valid record for {args.op} ({opdef.workload_key()}) on this target", file=sys.stderr)
        return EXIT_FAIL
    print(f"workload {opdef.workload_key()}  {rec.gflops(opdef.flops):.1f} GFLOPS  "
          f"measured by {rec.result.measured_by} at {rec.created_at:%Y-%m-%d %H:%M}")
    print(f"candidate ({rec.candidate.kind}): {json.dumps(rec.candidate.payload)}")
    schedule, tensors = instantiate(opdef, rec.candidate, target)
    print(compiler.lower(schedule, tensors, args.op))
    return EXIT_OK


def cmd_records(args) -> int:
    from ..records import StoreError

    store = open_store(args.db)
    try:
        if args.action == "export":
            with (sys.stdout if args.file == "-" else open(args.file, "w")) as f:
                n = store.export_jsonl(f)
            print(f"exported {n} records", file=sys.stderr)
        else:
            with (sys.stdin if args.file == "-" else open(args.file)) as f:
                n = store.import_jsonl(f)
            print(f"imported {n} new records", file=sys.stderr)
    except (StoreError, OSError) as e:
        raise UsageError(str(e)) from None
    return EXIT_OK


class _Progress:
    """One display for the whole run: a bar of new trials over the budget and a line per task
    (rich; plain lines without rich or with --plain)."""

    def __init__(self, tasks, total: int, plain: bool):
        self.total, self.plain = total, plain
        self.flops = {t: opdef.flops for t, opdef in tasks}
        self.labels = {t: t.workload.name for t, _ in tasks}
        self._bar = None
        self._rows: dict = {}
        self._trials: dict = {}  # task -> new trials so far

    def __enter__(self):
        self._bar, self._id = start_progress(self.total, "", self.plain)
        if self._bar is not None and len(self.labels) > 1:
            self._rows = {t: self._bar.add_task(f"  {label}", total=None, info="") for t, label in self.labels.items()}
        return self

    def update(self, report):
        result = report.result
        speedup = result.speedup_over_default
        info = (f"best {result.best_gflops:.3g} GFLOPS" + (f" ({speedup:.2f}x default)" if speedup == speedup else "")
                + f", {result.errors} errors")
        self._trials[report.task] = result.trials
        done = sum(self._trials.values())
        if self._bar is not None:
            self._bar.update(self._id, completed=done, info=info if not self._rows else "")
            if report.task in self._rows:
                self._bar.update(self._rows[report.task], info=f"{result.trials} trials, {info}")
        elif report.kind == "search":
            print(f"trials {done}/{self.total}  {self.labels.get(report.task, '')}: {info}", flush=True)

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.__exit__(*exc)
        return False


def register(sub):
    """Add the tuner's subcommands to the `tunefarm` parser."""
    def task_args(p):
        p.add_argument("op", metavar="OPNAME", help="inventory operator, e.g. matmul, conv2d_nchw")
        p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                       help="operator parameter (default sizes are those of `tunefarm ops`)")
        p.add_argument("--target", default=None, help="target string (default: host)")
        p.add_argument("--key", default="local", help="device key the measurements belong to")
        p.add_argument("--db", default=None, help="records database URL (default: $TUNEFARM_DB_URL or "
                                                  "sqlite:///~/.tunefarm/records.db)")

    p = sub.add_parser("tune", help="tune operators on this machine and record every measurement",
                       description="Tune one or more operators under one trial budget. Operators listed "
                                   "by name keep the sizes of `tunefarm ops` (--param changes them); "
                                   "--workloads FILE (JSON or YAML) gives workloads with parameters "
                                   "and weights. Several tasks share one cost model and a task "
                                   "scheduler decides which one gets each batch.")
    p.add_argument("ops", nargs="*", metavar="OPNAME", help="inventory operators, e.g. matmul conv2d_nchw")
    p.add_argument("--workloads", default=None, metavar="FILE",
                   help='JSON/YAML list of {"op": NAME, "params": {...}, "weight": W}')
    p.add_argument("--compute", action="append", default=[], metavar="FILE.py",
                   help="a Python file defining workload() -> the output tensor (your own operator); "
                        "tuned with the sketch space and stored as data, like any other")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="parameter of the listed operators (default sizes are those of `tunefarm ops`)")
    p.add_argument("--target", default=None, help="target string (default: host)")
    p.add_argument("--key", default="local", help="device key the measurements belong to")
    p.add_argument("--db", default=None, help="records database URL (default: $TUNEFARM_DB_URL or "
                                              "sqlite:///~/.tunefarm/records.db)")
    p.add_argument("--compare-repeat", type=int, default=5, metavar="N",
                   help="timing rounds of the closing comparison of the best kernel with numpy")
    add_tuning_flags(p)
    p.add_argument("--plain", action="store_true", help="plain progress lines instead of a bar")
    p.add_argument("--tracker", default=None, metavar="HOST:PORT",
                   help="measure on the farm's agents of --key through this tracker (default: this machine)")
    p.add_argument("--token", default=None, help="tuner token of the farm (default: $TUNEFARM_TUNER_TOKEN)")
    p.add_argument("--tls-ca", default=None, metavar="FILE", help="CA certificate of the tracker (enables TLS)")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("best", help="print the best recorded schedule of an operator and its loop IR")
    task_args(p)
    p.set_defaults(func=cmd_best)

    p = sub.add_parser("records", help="export or import records as JSON lines")
    p.add_argument("action", choices=("export", "import"))
    p.add_argument("file", help="a .jsonl file, or - for stdout/stdin")
    p.add_argument("--db", default=None, help="records database URL")
    p.set_defaults(func=cmd_records)
