"""`tunefarm model tune MODEL.onnx`: tune a whole model's fused workloads under one trial budget.

The model is read and every task extracted before the records are opened, so a bad model (not
ONNX, an unsupported op, a dynamic shape not pinned) is one error line and nothing is written.
The tasks are tuned by the gradient task scheduler sharing one cost model (tuner.model_tuning);
the progress shows the estimated end-to-end latency (Σ weight × best latency) as it falls, and
the end prints each task's best and the estimate. `tunefarm model run` then builds the model with
these records (apply-best per workload).
"""

from __future__ import annotations

import math
import sys

from .common import (
    EXIT_FAIL,
    EXIT_OK,
    UsageError,
    add_tuning_flags,
    check_runs_here,
    farm_runner,
    load_graph,
    open_store,
    resolve_target,
    run_tuning,
    start_progress,
    tuning_from_flags,
)


def _ms(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "-"
    return f"{seconds * 1e6:.3g} us" if seconds < 1e-3 else f"{seconds * 1e3:.4g} ms"


def cmd_tune(args) -> int:
    from compiler.graph import GraphError

    from ..model_tuning import ModelTuningError, model_tasks, tune_model

    target = resolve_target(args.target)
    check_runs_here(args, target)
    options, measure = tuning_from_flags(args)
    graph = load_graph(args.model, args.input_shape, args.dim)
    try:
        tasks = model_tasks(graph, target, args.key)
    except (GraphError, ModelTuningError) as e:
        raise UsageError(str(e)) from None
    if not tasks:
        raise UsageError(f"{args.model}: the model computes nothing to tune (its outputs are inputs or constants)")
    print(f"{graph.name}: {len(tasks)} unique workloads, {sum(t.weight for t in tasks)} kernels per run; "
          f"tuning with {options.trials} trials ({options.scheduler} scheduler)")
    store = open_store(args.db)
    runner = farm_runner(args, measure)
    progress = _EstimateProgress(tasks, options.trials, plain=args.plain)

    def run():
        return tune_model(tasks, store, options, runner=runner, measure=measure,
                          on_estimate=progress.estimate, callbacks=progress.callbacks())

    status, out = run_tuning("model tune", run, progress=progress, runner=runner, store=store)
    return status if status != EXIT_OK else _summary(args, out)


def _summary(args, out) -> int:
    status = EXIT_OK
    print(f"{'#':>3}  {'workload':<34} {'weight':>6} {'trials':>6} {'best':>12} {'default':>12} {'speed-up':>8} "
          f"{'weight x best':>14}")
    for i, (t, r) in enumerate(zip(out.tasks, out.results)):
        speedup = r.speedup_over_default
        print(f"{i:>3}  {t.name:<34} {t.weight:>6} {r.trials:>6} {_ms(r.best_cost):>12} {_ms(r.baseline_cost):>12} "
              f"{(f'{speedup:.2f}x' if speedup == speedup else '-'):>8} {_ms(t.weight * r.best_cost):>14}")
        if r.best_candidate is None:
            print(f"{t.name}: no valid candidate measured (see the records' error codes)", file=sys.stderr)
            status = EXIT_FAIL
    est, base = out.estimated_seconds, out.default_seconds
    ratio = f", {base / est:.2f}x faster" if math.isfinite(est) and math.isfinite(base) and est > 0 else ""
    print(f"estimated end-to-end latency (sum of weight x best kernel latency): {_ms(est)} "
          f"(default schedules {_ms(base)}{ratio}); {out.scheduled.trials} trials in {out.scheduled.seconds:.1f} s")
    db = f" --db {args.db}" if args.db else ""
    shapes = "".join(f" --input-shape {s}" for s in args.input_shape) + "".join(f" --dim {d}" for d in args.dim)
    print(f"run it with these records: tunefarm model run {args.model}{shapes}{db}")
    return status


class _EstimateProgress:
    """A bar of new trials over the budget whose text is the estimated latency, and a line per task
    (rich; plain lines, one per change of the estimate, without rich or with --plain)."""

    MAX_ROWS = 40   # a model with more tasks shows the bar alone

    def __init__(self, tasks, total: int, plain: bool):
        self.tasks, self.total, self.plain = tasks, total, plain
        self.first = math.inf
        self._bar = None
        self._rows: dict = {}

    def callbacks(self):
        from ..engine import Callbacks
        return Callbacks(on_batch=self._batch)

    def __enter__(self):
        self._bar, self._id = start_progress(self.total, "estimated latency: measuring defaults", self.plain)
        if self._bar is not None and len(self.tasks) <= self.MAX_ROWS:
            self._rows = {t.task: self._bar.add_task(f"  {t.name} (x{t.weight})", total=None, info="")
                          for t in self.tasks}
        return self

    def _batch(self, report):
        r = report.result
        if self._bar is not None and report.task in self._rows:
            self._bar.update(self._rows[report.task], info=f"{r.trials} trials, best {_ms(r.best_cost)}")

    def estimate(self, est):
        seconds = est.seconds
        if not math.isfinite(self.first):
            self.first = seconds
        gain = f" ({self.first / seconds:.2f}x from {_ms(self.first)})" if seconds > 0 else ""
        info = f"estimated latency {_ms(seconds)}{gain}"
        if self._bar is not None:
            self._bar.update(self._id, completed=est.total_trials, info=info)
        else:
            print(f"trials {est.total_trials}/{self.total}  {info}", flush=True)

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.__exit__(*exc)
        return False


def register(msub, common) -> None:
    q = msub.add_parser("tune", help="tune the model's fused workloads under one trial budget",
                        description="Tune every unique fused workload of the model with the gradient task "
                                    "scheduler (one shared cost model, one trial budget), record every "
                                    "measurement, and show the estimated end-to-end latency as it falls. "
                                    "`tunefarm model run` then uses the records.")
    common(q)
    q.add_argument("--target", default=None, help="target string (default: host)")
    q.add_argument("--key", default="local", help="device key the measurements belong to")
    q.add_argument("--db", default=None, help="records database URL (default: $TUNEFARM_DB_URL or "
                                              "sqlite:///~/.tunefarm/records.db)")
    add_tuning_flags(q, trials=2000)
    q.add_argument("--plain", action="store_true", help="plain progress lines instead of a bar")
    q.add_argument("--tracker", default=None, metavar="HOST:PORT",
                   help="measure on the farm's agents of --key through this tracker (default: this machine)")
    q.add_argument("--token", default=None, help="tuner token of the farm (default: $TUNEFARM_TUNER_TOKEN)")
    q.add_argument("--tls-ca", default=None, metavar="FILE", help="CA certificate of the tracker (enables TLS)")
    q.set_defaults(func=cmd_tune)


__all__ = ["register", "cmd_tune"]
