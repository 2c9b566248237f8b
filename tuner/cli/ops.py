"""`tunefarm version`, `tunefarm ops` and `tunefarm lower`: the compiler's side of the CLI.

`ops` is the quickest end-to-end check that a machine works: every operator is compiled with
its default schedule, checked against its numpy reference and timed next to plain numpy, so a
broken toolchain, a wrong kernel or a slow one shows up in one table.
"""

from __future__ import annotations

import sys
import time
import traceback

import numpy as np

from .common import (
    DEFAULT_PARAMS,
    DEMO_OPS,
    EXIT_FAIL,
    EXIT_OK,
    SMALL_PARAMS,
    UsageError,
    check_op_names,
    check_output,
    make_op,
    parse_param,
    poisoned_output,
    resolve_target,
    shape_text,
)

# ----------------------------------------------------------------------------- version


def cmd_version(args) -> int:
    import llvmlite
    import llvmlite.binding as llvm

    import compiler
    from compiler.target import Target
    try:
        from importlib.metadata import version
        tf_version = version("tunefarm")
    except Exception:  # noqa: BLE001 - not installed as a distribution: running from a checkout
        tf_version = compiler.__version__
    llvm_version = ".".join(map(str, llvm.llvm_version_info))
    print(f"tunefarm {tf_version}")
    print(f"llvmlite {llvmlite.__version__} (LLVM {llvm_version})")
    print(f"numpy {np.__version__}")
    print(f"python {sys.version.split()[0]}")
    print(f"host target: {Target.host()}")
    return EXIT_OK


# ----------------------------------------------------------------------------- ops

def _run_one(name, params, target, repeat, min_repeat_ms, rng):
    """Build, check and time one operator; returns a result row (a dict)."""
    from compiler.errors import CompilerError
    from compiler.ops import build_op, random_inputs  # build_op: lazily, default schedules live there
    from compiler.timing import TimingOptions

    from ..numpy_baselines import numpy_baseline, time_callable

    opdef = make_op(name, params)
    row = dict(op=name, shape=shape_text(opdef), build_ms=None, ours=None, numpy=None, unit="GFLOPS",
               ratio=None, ok=False, note="")
    try:
        t0 = time.perf_counter()
        kernel = build_op(opdef, target=target)
        row["build_ms"] = (time.perf_counter() - t0) * 1000.0

        inputs = random_inputs(opdef, rng)
        out = poisoned_output(opdef.output)
        kernel(*inputs, out)
        row["ok"], why = check_output(out, opdef.reference(*inputs), opdef.output.dtype)
        if not row["ok"]:
            row["note"] = why

        t_ours = kernel.measure(*inputs, out, options=TimingOptions(min_samples=repeat,
                                                                    min_seconds=min_repeat_ms / 1000.0)).median
        baseline = numpy_baseline(opdef)
        t_np = time_callable(baseline, inputs, repeat=repeat, min_repeat_ms=min_repeat_ms).median
    except CompilerError as e:
        row["note"] = f"{type(e).__name__}: {e}"
        return row
    except Exception as e:  # noqa: BLE001 - a bug: report it with its traceback, go on with the others
        traceback.print_exc(file=sys.stderr)
        row["note"] = f"{type(e).__name__}: {e}"
        return row

    if opdef.flops:
        work, row["unit"] = opdef.flops / 1e9, "GFLOPS"
    else:  # pure data movement: bytes read and written
        nbytes = sum(a.nbytes for a in inputs) + out.nbytes
        work, row["unit"] = nbytes / 1e9, "GB/s"
    row["ours"], row["numpy"] = work / t_ours, work / t_np
    row["ratio"] = t_np / t_ours
    return row


def _fmt_rows(rows):
    out = []
    def num(v, unit):
        if v is None:
            return "-"
        return f"{v:.0f} {unit}" if v >= 100 else f"{v:.{1 if v >= 10 else 2}f} {unit}"
    for r in rows:
        out.append([r["op"], r["shape"], "-" if r["build_ms"] is None else f"{r['build_ms']:.0f}",
                    num(r["ours"], r["unit"]), num(r["numpy"], r["unit"]),
                    "-" if r["ratio"] is None else f"{r['ratio']:.2f}x", "OK" if r["ok"] else "FAIL"])
    return out


HEADERS = ["op", "shape", "build ms", "ours", "numpy", "ours vs numpy", "check"]
_RIGHT = {2, 3, 4, 5}


def _print_table(rows, target, plain: bool):
    cells = _fmt_rows(rows)
    title = f"tunefarm operators on {target.cpu} ({target.num_cores} cores), default schedules"
    console = None
    if not plain:
        try:
            from rich.console import Console
            from rich.table import Table
        except ImportError:
            plain = True
    if not plain:
        # piped to a file or another program: a wide table rather than wrapped cells
        console = Console(width=None if sys.stdout.isatty() else 160)
        table = Table(title=title)
        for i, h in enumerate(HEADERS):
            table.add_column(h, justify="right" if i in _RIGHT else "left", no_wrap=i != 1)
        for c in cells:
            c = list(c)
            c[-1] = "[green]OK[/green]" if c[-1] == "OK" else "[bold red]FAIL[/bold red]"
            table.add_row(*c)
        console.print(table)
    else:
        widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(HEADERS)]

        def line(vals):
            return "  ".join(v.rjust(w) if i in _RIGHT else v.ljust(w)
                             for i, (v, w) in enumerate(zip(vals, widths))).rstrip()
        print(title)
        print(line(HEADERS))
        print(line(["-" * w for w in widths]))
        for c in cells:
            print(line(c))
    for r in rows:
        if r["note"]:
            print(f"{r['op']}: {r['note']}")
    print("'ours vs numpy' is numpy's time / our time: above 1x our kernel is faster. "
          "GB/s counts bytes read plus written.")


def cmd_ops(args) -> int:
    names = list(dict.fromkeys(args.only)) if args.only else list(DEMO_OPS)
    check_op_names(names)
    target = resolve_target(args.target)
    if args.repeat < 1:
        raise UsageError("--repeat must be at least 1")
    table = SMALL_PARAMS if args.small else DEFAULT_PARAMS
    rng = np.random.default_rng(args.seed)
    progress = sys.stderr.isatty()
    rows = []
    for n, name in enumerate(names, 1):
        if progress:
            print(f"[{n}/{len(names)}] {name} ...", file=sys.stderr, flush=True)
        rows.append(_run_one(name, table[name], target, args.repeat, 1.0 if args.small else 20.0, rng))
    _print_table(rows, target, args.plain)
    failed = [r["op"] for r in rows if not r["ok"]]
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK


# ----------------------------------------------------------------------------- lower

def cmd_lower(args) -> int:
    import compiler
    from compiler.errors import CompilerError

    check_op_names([args.op])
    params = dict(DEFAULT_PARAMS[args.op])
    params.update(parse_param(p) for p in args.param)
    opdef = make_op(args.op, params)
    target = resolve_target(args.target)
    from compiler.ops import default_schedule
    try:
        s = default_schedule(opdef, target)
        print(compiler.lower(s, opdef.tensors, args.op))
    except CompilerError as e:
        raise UsageError(f"{type(e).__name__}: {e}") from None
    return EXIT_OK




def register(sub):
    """Add `version`, `ops` and `lower` to the `tunefarm` parser."""
    p = sub.add_parser("version", help="print tunefarm, llvmlite/LLVM versions and the host target")
    p.set_defaults(func=cmd_version)

    p = sub.add_parser("ops", help="build, check and time every operator against numpy",
                       description="Build each operator with its default schedule, check it against the "
                                   "numpy reference on random inputs, and time it next to plain numpy.")
    p.add_argument("--only", nargs="+", action="extend", metavar="NAME",
                   help=f"operators to run (default: {', '.join(DEMO_OPS)})")
    p.add_argument("--target", default=None, help="target string, e.g. 'llvm -mtriple=x86_64-linux-gnu -mcpu=haswell' (default: host)")
    p.add_argument("--repeat", type=int, default=5, help="timing measurements per operator; the median is shown")
    p.add_argument("--small", action="store_true", help="tiny sizes: a quick smoke test of every operator")
    p.add_argument("--plain", action="store_true", help="plain-text table even if rich is installed")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.set_defaults(func=cmd_ops)

    p = sub.add_parser("lower", help="print the loop IR of an operator's default schedule",
                       description="Print the loop IR of OPNAME's default schedule. Parameters not given "
                                   "keep the sizes `tunefarm ops` uses.")
    p.add_argument("op", metavar="OPNAME")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="operator parameter, a Python literal: M=64, shape=64,128, dtype=float64")
    p.add_argument("--target", default=None, help="target string (default: host)")
    p.set_defaults(func=cmd_lower)
