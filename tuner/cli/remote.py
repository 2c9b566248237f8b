"""`tunefarm submit` and `tunefarm jobs`: the tuning service from the command line (over REST).

    tunefarm submit matmul --param M=512 --trials 64 [--watch]
    tunefarm submit --workloads resnet.yaml --scheduler gradient --trials 800
    tunefarm submit --model resnet18.onnx --trials 2000 [--input-shape input=1,3,224,224]
    tunefarm jobs [--state running]          newest first
    tunefarm jobs show ID | watch ID | cancel ID | resume ID

The server is --server (default $TUNEFARM_SERVER, else http://127.0.0.1:8080), the token
--token (default $TUNEFARM_TOKEN). Workloads are read and checked here as for `tunefarm tune`;
a --compute FILE.py is run here, on the user's machine, and only its DAG (JSON) is sent. A --model
FILE.onnx is sent as it is: the server reads it and answers with its tasks, or why it cannot.
"""

from __future__ import annotations

import math
import os
import re
import sys

from ..option_forms import JOB_TUNING, MEASURE_FLAGS, values_from_flags
from .common import DEFAULT_PARAMS, EXIT_FAIL, EXIT_OK, UsageError, add_tuning_flags, check_op_names, parse_param


def _client(args):
    from ..service.client import ServiceClient
    return ServiceClient(args.server, token=args.token)


def _spec_from_args(args) -> dict:
    from ..compute_file import load_compute_file
    from ..workload import WorkloadError
    from ..workload_file import read_workloads

    if not args.ops and not args.workloads and not args.compute:
        raise UsageError("give one or more operators (e.g. `tunefarm submit matmul`), --workloads FILE, "
                         "--compute FILE.py or --model FILE.onnx")
    check_op_names(args.ops)
    workloads: list[dict] = []
    for op in args.ops:
        params = dict(DEFAULT_PARAMS.get(op, {}))
        params.update(parse_param(p) for p in args.param)
        workloads.append({"op": op, "params": params})
    try:
        if args.workloads:
            workloads += [{"op": w.name, "params": dict(w.params), "weight": weight}
                          for w, weight in read_workloads(args.workloads)]
        for path in args.compute:
            w = load_compute_file(path)
            workloads.append({"compute": w.definition, "name": w.name})
    except WorkloadError as e:
        raise UsageError(str(e)) from None
    spec = {"workloads": workloads, "priority": args.priority, "device_key": args.key, **_job_options(args)}
    for name in ("target", "name"):
        if getattr(args, name) is not None:
            spec[name] = getattr(args, name)
    return spec


def _job_options(args) -> dict:
    """The job's tuning fields and its `measure` section, from the flags made from the options."""
    return {**values_from_flags(args, JOB_TUNING), "measure": values_from_flags(args, MEASURE_FLAGS)}


def _model_bytes(args) -> bytes:
    if args.ops or args.workloads or args.compute:
        raise UsageError("--model is a job of its own: give it without operators, --workloads or --compute")
    try:
        with open(args.model, "rb") as f:
            return f.read()
    except OSError as e:
        raise UsageError(f"--model {args.model}: {e.strerror or e}") from None


def _submit_model(c, args, data: bytes) -> dict:
    options = _job_options(args)
    params = {**{k: v for k, v in options.items() if k != "measure"}, **options["measure"], "priority": args.priority,
              "device_key": args.key, "target": args.target, "name": args.name,
              "file_name": os.path.basename(args.model)}
    return c.submit_model(data, input_shape=args.input_shape, **params)


def cmd_submit(args) -> int:
    from ..service.client import APIError
    data = _model_bytes(args) if args.model else None
    spec = _spec_from_args(args) if data is None else None
    with _client(args) as c:
        try:
            job = c.submit(spec) if data is None else _submit_model(c, args, data)
        except APIError as e:
            return _failed("submit", e)
        print(f"job {job['id']} {job['state']}: {len(job['tasks'])} task(s), {job['trials']} trials on {_short_target(job['target'])}")
        if args.watch:
            try:
                job = c.watch(job["id"], interval=args.interval, on_update=_print_update)
            except APIError as e:
                return _failed("submit", e)
            except KeyboardInterrupt:
                print(f"(still {job['state']}; `tunefarm jobs watch {job['id']}` follows it again)")
                return 130
            _print_job(job)
            return EXIT_OK if job["state"] == "done" else EXIT_FAIL
    return EXIT_OK


def cmd_jobs(args) -> int:
    from ..service.client import APIError
    with _client(args) as c:
        try:
            if args.action == "list":
                page = c.jobs(state=args.state, workload=args.workload, target=args.target, limit=args.limit)
                _print_table(page["items"])
                if page.get("next_before") is not None:
                    print(f"(more: newest first, {args.limit} shown; --limit N for more)")
                return EXIT_OK
            if args.id is None:
                raise UsageError(f"`tunefarm jobs {args.action}` needs a job id")
            if args.action == "show":
                _print_job(c.job(args.id))
            elif args.action == "cancel":
                _print_job(c.cancel(args.id))
            elif args.action == "resume":
                _print_job(c.resume(args.id))
            elif args.action == "watch":
                job = c.watch(args.id, interval=args.interval, on_update=_print_update)
                _print_job(job)
                return EXIT_OK if job["state"] == "done" else EXIT_FAIL
        except APIError as e:
            return _failed("jobs", e)
        except KeyboardInterrupt:
            return 130
    return EXIT_OK


def _failed(command: str, e) -> int:
    print(f"tunefarm {command}: error: {e}", file=sys.stderr)
    return EXIT_FAIL


def _short_target(target: str) -> str:
    """The target with its -mattr list counted, not spelled out (a host's has ~60 features)."""
    return re.sub(r"-mattr=(\S+)", lambda m: f"-mattr=({m.group(1).count(',') + 1} features)", target)


def _fmt(x, spec: str = ".3g", none: str = "-") -> str:
    return none if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def _best(job: dict) -> str:
    tasks = job["tasks"]
    if len(tasks) == 1:
        t = tasks[0]
        return f"{_fmt(t['best_gflops'])} GFLOPS ({_fmt(t['speedup'], '.2f')}x)"
    done = [t for t in tasks if t["best_cost"] is not None]
    if len(done) < len(tasks):
        return f"{len(done)}/{len(tasks)} tasks measured"
    return f"{1e3 * sum(t['weight'] * t['best_cost'] for t in tasks):.3f} ms weighted"


def _print_table(jobs: list) -> None:
    print(f"{'id':>6}  {'state':<10} {'progress':>12}  {'workloads':<32} best")
    for j in jobs:
        names = ", ".join(t["workload"]["name"] for t in j["tasks"])
        names = names if len(names) <= 32 else names[:29] + "..."
        print(f"{j['id']:>6}  {j['state']:<10} {j['trials_done']:>5}/{j['trials']:<6}  {names:<32} {_best(j)}")


def _print_job(job: dict) -> None:
    print(f"job {job['id']}{' (' + job['name'] + ')' if job.get('name') else ''}: {job['state']}, "
          f"{job['trials_done']}/{job['trials']} trials, {job['attempts']} attempt(s), {job['space']} space, "
          f"{job['strategy']}, {job['scheduler']} scheduler, target {_short_target(job['target'])}, device key {job['device_key']}")
    for t in job["tasks"]:
        base = t["flops"] / t["baseline_cost"] / 1e9 if t["flops"] and t["baseline_cost"] else None
        print(f"  [{t['position']}] {t['workload']['name']} (weight {t['weight']:g}): {t['trials']} trials, best "
              f"{_fmt(t['best_gflops'])} GFLOPS, default {_fmt(base)} GFLOPS, {_fmt(t['speedup'], '.2f')}x over "
              "the default")
    model = job.get("model")
    if model:
        est, base = model.get("estimated_seconds"), model.get("default_seconds")
        print(f"  model {model['name']}: {model['kernels']} kernels per run; estimated latency "
              f"{_fmt(est * 1e3 if est else None, '.4g')} ms (default schedules {_fmt(base * 1e3 if base else None, '.4g')} ms, "
              f"{_fmt(model.get('speedup'), '.2f')}x)")
    busy = busy_machine_note(job["tasks"])
    if busy:
        print(f"  {busy}")
    if job.get("error"):
        print(f"  error: {job['error']}")


def busy_machine_note(tasks: list) -> str:
    """A plain warning when a job's figures were measured on a busy machine ('' when quiet)."""
    worst = max((t.get("disturbed_fraction") or 0.0 for t in tasks), default=0.0)
    return disturbed_note(worst, "the timings of its most disturbed task")


def disturbed_note(fraction: float, whose: str = "the timings") -> str:
    """The warning `tunefarm tune` and `tunefarm jobs show` print when `fraction` of `whose` were
    disturbed ('' when none were)."""
    if fraction <= 0:
        return ""
    return (f"measured on a busy machine: {100 * fraction:.0f} % of {whose} were disturbed by other processes "
            "even after retries; re-run on a quiet machine before trusting these figures")


def _print_update(job: dict, events: list) -> None:
    for e in events:
        print(f"  {e['at'][11:19]} {e['kind']}: {e['message']}", flush=True)


def _server_args(p) -> None:
    p.add_argument("--server", default=None, help="the service's URL (default $TUNEFARM_SERVER, else http://127.0.0.1:8080)")
    p.add_argument("--token", default=os.environ.get("TUNEFARM_TOKEN"), help="API token (default $TUNEFARM_TOKEN)")


def register(sub) -> None:
    """Add submit and jobs to the `tunefarm` parser."""
    p = sub.add_parser("submit", help="submit a tuning job to a tunefarm server",
                       description="Submit a tuning job over REST: operators (default sizes, --param applied to each), "
                                   "a --workloads FILE with weights, or --compute FILE.py (its DAG is sent as JSON).")
    p.add_argument("ops", nargs="*", metavar="OPNAME", help="operators to tune (one task each)")
    p.add_argument("--param", action="append", default=[], metavar="K=V", help="operator parameter (repeatable)")
    p.add_argument("--workloads", default=None, metavar="FILE", help="JSON/YAML file of workloads with weights")
    p.add_argument("--compute", action="append", default=[], metavar="FILE.py", help="a file defining a compute")
    p.add_argument("--model", default=None, metavar="FILE.onnx",
                   help="a whole ONNX model: its fused workloads under one budget (a model job)")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,...",
                   help="with --model: pin an input the model leaves dynamic")
    p.add_argument("--priority", type=int, default=0, help="higher runs first")
    p.add_argument("--target", default=None, help="LLVM target string (default: the server's host)")
    p.add_argument("--key", default="local", help="device key ('local': the worker's own machine)")
    p.add_argument("--name", default=None, help="a name for the job")
    p.add_argument("--watch", action="store_true", help="follow the job until it ends")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between polls with --watch")
    _server_args(p)
    add_tuning_flags(p, JOB_TUNING)   # a model job's --trials is the budget of the whole model
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("jobs", help="list, show, watch, cancel or resume jobs on a tunefarm server")
    p.add_argument("action", nargs="?", default="list", choices=("list", "show", "watch", "cancel", "resume"))
    p.add_argument("id", nargs="?", type=int, default=None, help="job id (show, watch, cancel, resume)")
    p.add_argument("--state", default=None, choices=("queued", "running", "done", "failed", "cancelled"))
    p.add_argument("--workload", default=None, help="workload key or operator name")
    p.add_argument("--target", default=None)
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--interval", type=float, default=2.0, help="seconds between polls (watch)")
    _server_args(p)
    p.set_defaults(func=cmd_jobs)
