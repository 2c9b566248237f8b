"""`tunefarm tune`, `tunefarm best` and `tunefarm records`: the tuner's command line.

`tune` runs a real tuning job on this machine (records in SQLite by default, or --db URL) with
a progress bar of trials, best GFLOPS and errors, then builds the operator with the best
record (apply-best) and times it beside numpy in the same run.
"""

from __future__ import annotations

import sys
import time

import numpy as np


def _task_from_args(args):
    from . import cli
    from .workload import Task, Workload

    cli._check_op_names([args.op])
    params = dict(cli.DEFAULT_PARAMS[args.op])
    params.update(cli._parse_param(p) for p in args.param)
    opdef = cli._make_op(args.op, params)  # validates the parameters (UsageError on bad ones)
    target = cli._resolve_target(args.target)
    return Task(Workload(args.op, params), str(target), args.key), opdef, target


def _open_store(url):
    from . import cli
    from .records import StoreError, open_store
    try:
        return open_store(url)
    except StoreError as e:
        raise cli.UsageError(str(e)) from None


def cmd_tune(args) -> int:
    from . import cli
    from .measure import FarmError
    from .tune import tune

    task, opdef, target = _task_from_args(args)
    store = _open_store(args.db)
    progress = _Progress(args.trials, opdef.flops, plain=args.plain)
    runner = _farm_runner(args)
    try:
        with progress:
            result = tune(task, store, space=args.space, strategy=args.strategy, trials=args.trials,
                          seconds=args.seconds, batch_size=args.batch, seed=args.seed,
                          early_stopping=args.early_stopping, on_batch=progress.update, runner=runner)
    except ValueError as e:
        raise cli.UsageError(str(e)) from None
    except FarmError as e:
        print(f"tunefarm tune: the farm refused the run: {e}", file=sys.stderr)
        return cli.EXIT_FAIL
    finally:
        if runner is not None:
            runner.close()
    print(f"{args.op}: {result.trials} trials measured now, {result.resumed_trials} from earlier runs, "
          f"{result.errors} errors, {result.tune_seconds:.1f} s "
          f"(strategy and cost model {100 * result.tuner_overhead_fraction:.1f} %)")
    if result.best_candidate is None:
        print("no valid candidate measured", file=sys.stderr)
        return cli.EXIT_FAIL
    print(f"best {result.best_gflops:.1f} GFLOPS, {result.speedup_over_default:.2f}x over the default schedule "
          f"({result.baseline_gflops:.1f} GFLOPS; both re-measured together)")
    return _report_best(store, opdef, target, args.repeat)


def _farm_runner(args):
    """An RPCRunner when --tracker is given (measure on the farm's agents of --key), else None (local)."""
    if not args.tracker:
        return None
    from . import cli
    from .measure import RPCRunner
    if args.key == "local":
        raise cli.UsageError("--tracker needs --key: the device key of the agents to measure on")
    return RPCRunner(args.tracker, args.key, token=args.token, tls_ca=args.tls_ca)


def _report_best(store, opdef, target, repeat: int) -> int:
    """Build with apply-best, check against the reference, time beside numpy (same run)."""
    from compiler.ops import build_op
    from compiler.ops.base import random_inputs

    from . import cli
    from .apply_best import ApplyHistoryBest
    from .numpy_baselines import numpy_baseline, time_callable

    with ApplyHistoryBest(store):
        kernel = build_op(opdef, target)
    ins = random_inputs(opdef, np.random.default_rng(0))
    out = cli._poisoned(opdef.output)
    kernel(*ins, out)
    ok = cli.check_output(out, opdef.reference(*ins), opdef.output.dtype)
    ours = kernel.time_evaluator(number=1, repeat=repeat, min_repeat_ms=50)(*ins, out).median
    ref_fn = numpy_baseline(opdef)
    time.sleep(0.2)  # let our idle libgomp threads stop spinning before numpy's threads start
    theirs = time_callable(lambda *a: ref_fn(*a), ins, repeat=repeat, min_repeat_ms=50).median
    gf = lambda t: opdef.flops / t / 1e9  # noqa: E731
    print(f"tuned kernel: {gf(ours):.1f} GFLOPS   numpy: {gf(theirs):.1f} GFLOPS   "
          f"ratio {theirs / ours:.2f}x   check {'OK' if ok else 'FAIL'}")
    return cli.EXIT_OK if ok else cli.EXIT_FAIL


def cmd_best(args) -> int:
    import json

    import compiler

    from . import cli
    from .apply_best import ApplyHistoryBest
    from .space import instantiate

    task, opdef, target = _task_from_args(args)
    store = _open_store(args.db)
    rec = ApplyHistoryBest(store).best_record(opdef, target)
    if rec is None:
        print(f"no valid record for {args.op} ({opdef.workload_key()}) on this target", file=sys.stderr)
        return cli.EXIT_FAIL
    print(f"workload {opdef.workload_key()}  {rec.gflops(opdef.flops):.1f} GFLOPS  "
          f"measured by {rec.result.measured_by} at {rec.created_at:%Y-%m-%d %H:%M}")
    print(f"candidate ({rec.candidate.kind}): {json.dumps(rec.candidate.payload)}")
    schedule, tensors = instantiate(opdef, rec.candidate, target)
    print(compiler.lower(schedule, tensors, args.op))
    return cli.EXIT_OK


def cmd_records(args) -> int:
    from . import cli
    from .records import StoreError

    store = _open_store(args.db)
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
        raise cli.UsageError(str(e)) from None
    return cli.EXIT_OK


class _Progress:
    """A rich progress bar (plain lines without rich or with --plain)."""

    def __init__(self, total: int, flops: int, plain: bool):
        self.total, self.flops, self.plain = total, flops, plain
        self._bar = None

    def __enter__(self):
        try:
            if self.plain:
                raise ImportError
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
            self._bar = Progress(TextColumn("tuning"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn())
            self._bar.__enter__()
            self._id = self._bar.add_task("tune", total=self.total, info="")
        except ImportError:
            self._bar = None
        return self

    def update(self, report):
        result = report.result
        done = result.trials
        info = f"best {result.best_gflops:.1f} GFLOPS, {result.errors} errors"
        if self._bar is not None:
            self._bar.update(self._id, completed=done, info=info)
        else:
            print(f"trials {done}/{self.total}  {info}", flush=True)

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

    p = sub.add_parser("tune", help="tune an operator on this machine and record every measurement")
    task_args(p)
    p.add_argument("--space", choices=("sketch", "template"), default="sketch")
    p.add_argument("--strategy", default=None,
                   help="random, grid, genetic, model, evolutionary (default: model for templates, "
                        "evolutionary for sketches)")
    p.add_argument("--trials", type=int, default=64,
                   help="new measurements of this run (earlier records are reused, never measured again)")
    p.add_argument("--seconds", type=float, default=None, help="time budget in seconds")
    p.add_argument("--batch", type=int, default=8, help="candidates built and measured per round")
    p.add_argument("--early-stopping", type=int, default=None, metavar="TRIALS",
                   help="stop after this many trials without improvement")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=5, help="timing repeats of the final comparison")
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
