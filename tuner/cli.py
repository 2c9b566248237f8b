"""The `tunefarm` command line.

    tunefarm version                      versions and the host target string
    tunefarm ops [--only NAME ...]        build, check and time every operator (the inventory demo)
    tunefarm lower OPNAME --param k=v     print the loop IR of an operator's default schedule

`ops` is the quickest end-to-end check that a machine works: every operator is compiled with
its default schedule, checked against its numpy reference and timed next to plain numpy, so a
broken toolchain, a wrong kernel or a slow one shows up in one table. User errors (an unknown
operator, a bad parameter or target) print one line and exit with status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import time
import traceback

import numpy as np

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2

# Moderate, realistic sizes: layers of ResNet-50 / MobileNet / BERT-base, big enough that
# timings mean something, small enough that the whole demo runs in about a minute.
DEFAULT_PARAMS = {
    "matmul": dict(M=512, N=512, K=512),
    "matmul_int8": dict(M=512, N=512, K=512),
    "dense": dict(batch=128, in_dim=1024, out_dim=1024, epilogue="relu"),
    "batch_matmul": dict(B=12, M=128, N=128, K=64),  # BERT-base attention scores
    "conv2d_nchw": dict(N=1, C=64, H=56, W=56, F=64, KH=3, KW=3, padding=1),  # ResNet-50 conv2_x
    "conv2d_nhwc": dict(N=1, C=64, H=56, W=56, F=64, KH=3, KW=3, padding=1),
    "depthwise_conv2d_nchw": dict(N=1, C=128, H=56, W=56, KH=3, KW=3, padding=1),  # MobileNet
    "max_pool2d": dict(N=1, C=64, H=112, W=112, kernel=3, stride=2, padding=1),  # ResNet stem
    "avg_pool2d": dict(N=1, C=256, H=56, W=56, kernel=2, stride=2),
    "softmax": dict(shape=(1024, 1024)),
    "layer_norm": dict(shape=(512, 768)),
    "add": dict(shape_a=(1024, 1024)),
    "mul": dict(shape_a=(1024, 1024)),
    "relu": dict(shape=(1024, 1024)),
    "gelu": dict(shape=(512, 3072)),  # BERT-base FFN
    "bias_add": dict(shape=(1, 256, 56, 56), axis=1),
    "reduce_sum": dict(shape=(1024, 1024), axis=1),
    "reduce_max": dict(shape=(1024, 1024), axis=1),
    "reduce_min": dict(shape=(1024, 1024), axis=1),
    "transpose": dict(shape=(1024, 1024)),
    "pad": dict(shape=(1, 64, 56, 56), pad_before=(0, 0, 1, 1), pad_after=(0, 0, 1, 1)),
}

# `--small`: the same operators at sizes that build and run in milliseconds (tests, smoke checks).
SMALL_PARAMS = {
    "matmul": dict(M=32, N=32, K=32),
    "matmul_int8": dict(M=32, N=32, K=32),
    "dense": dict(batch=8, in_dim=32, out_dim=16, epilogue="relu"),
    "batch_matmul": dict(B=2, M=16, N=16, K=8),
    "conv2d_nchw": dict(N=1, C=4, H=8, W=8, F=4, KH=3, KW=3, padding=1),
    "conv2d_nhwc": dict(N=1, C=4, H=8, W=8, F=4, KH=3, KW=3, padding=1),
    "depthwise_conv2d_nchw": dict(N=1, C=4, H=8, W=8, KH=3, KW=3, padding=1),
    "max_pool2d": dict(N=1, C=4, H=8, W=8, kernel=3, stride=2, padding=1),
    "avg_pool2d": dict(N=1, C=4, H=8, W=8, kernel=2, stride=2),
    "softmax": dict(shape=(8, 32)),
    "layer_norm": dict(shape=(8, 32)),
    "add": dict(shape_a=(16, 32)),
    "mul": dict(shape_a=(16, 32)),
    "relu": dict(shape=(16, 32)),
    "gelu": dict(shape=(16, 32)),
    "bias_add": dict(shape=(1, 4, 8, 8), axis=1),
    "reduce_sum": dict(shape=(16, 32), axis=1),
    "reduce_max": dict(shape=(16, 32), axis=1),
    "reduce_min": dict(shape=(16, 32), axis=1),
    "transpose": dict(shape=(16, 32)),
    "pad": dict(shape=(1, 4, 8, 8), pad_before=(0, 0, 1, 1), pad_after=(0, 0, 1, 1)),
}

# What `tunefarm ops` runs without --only: one representative of each kernel family.
DEMO_OPS = ("matmul", "dense", "batch_matmul", "conv2d_nchw", "conv2d_nhwc", "depthwise_conv2d_nchw",
            "max_pool2d", "avg_pool2d", "softmax", "layer_norm", "add", "relu", "gelu", "reduce_sum",
            "transpose", "pad")

# Largest error allowed, relative to the largest magnitude in the reference output. Generous
# against float32 rounding over long reductions, far below what any indexing bug produces.
TOLERANCE = {"float32": 1e-4, "float64": 1e-10}


class UsageError(Exception):
    """A mistake in the command line: reported in one line, exit status 2."""


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


# ----------------------------------------------------------------------------- shared helpers

def _resolve_target(text):
    from compiler.errors import TargetError
    from compiler.target import resolve_target
    try:
        return resolve_target(text)
    except TargetError as e:
        raise UsageError(f"bad --target: {e}") from None


def _check_op_names(names):
    from compiler.ops import INVENTORY
    unknown = [n for n in names if n not in INVENTORY]
    if unknown:
        raise UsageError(f"unknown operator{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                         f"known operators: {', '.join(sorted(INVENTORY))}")


def _make_op(name, params):
    from compiler.errors import ExprError
    from compiler.ops import get_op
    try:
        return get_op(name, **params)
    except ExprError as e:  # includes UnknownOpError
        raise UsageError(str(e)) from None


def _parse_param(text: str):
    """`k=v` → (k, v); v is a Python literal when it parses as one (16, (1, 64), True), else a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.isidentifier():
        raise UsageError(f"--param {text!r}: expected NAME=VALUE, e.g. --param M=512 or --param shape=64,128")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw
    return key, value


def _shape_text(opdef) -> str:
    dims = ["x".join(map(str, t.shape)) for t in opdef.inputs]
    return f"{', '.join(dims)} -> {'x'.join(map(str, opdef.output.shape))}"


def _poisoned(tensor) -> np.ndarray:
    """An output buffer full of values no kernel computes, so an element it never writes fails the check."""
    dtype = np.dtype(tensor.dtype)
    if dtype.kind == "f":
        return np.full(tensor.shape, np.nan, dtype)
    if dtype.kind in "iu":
        return np.full(tensor.shape, np.iinfo(dtype).max, dtype)
    return np.zeros(tensor.shape, dtype)


def check_output(out: np.ndarray, ref: np.ndarray, dtype: str):
    """(ok, max error relative to the reference's largest magnitude)."""
    ref = np.asarray(ref)
    if out.shape != ref.shape:
        return False, float("inf")
    if np.dtype(dtype).kind in "iub":
        return bool(np.array_equal(out, ref)), float(np.count_nonzero(out != ref))
    out64, ref64 = out.astype(np.float64), ref.astype(np.float64)
    if not np.all(np.isfinite(out64)):
        return False, float("inf")
    scale = max(1.0, float(np.max(np.abs(ref64))) if ref64.size else 1.0)
    err = float(np.max(np.abs(out64 - ref64))) / scale if ref64.size else 0.0
    return err <= TOLERANCE.get(dtype, 1e-4), err


# ----------------------------------------------------------------------------- ops

def _run_one(name, params, target, repeat, min_repeat_ms, rng):
    """Build, check and time one operator; returns a result row (a dict)."""
    from compiler.errors import CompilerError
    from compiler.ops import build_op, random_inputs  # build_op: lazily, default schedules live there

    from .numpy_baselines import numpy_baseline, time_callable

    opdef = _make_op(name, params)
    row = dict(op=name, shape=_shape_text(opdef), build_ms=None, ours=None, numpy=None, unit="GFLOPS",
               ratio=None, ok=False, note="")
    try:
        t0 = time.perf_counter()
        kernel = build_op(opdef, target=target)
        row["build_ms"] = (time.perf_counter() - t0) * 1000.0

        inputs = random_inputs(opdef, rng)
        out = _poisoned(opdef.output)
        kernel(*inputs, out)
        row["ok"], err = check_output(out, opdef.reference(*inputs), opdef.output.dtype)
        if not row["ok"]:
            row["note"] = f"max relative error {err:.3g}"

        t_ours = kernel.time_evaluator(number=1, repeat=repeat, min_repeat_ms=min_repeat_ms)(*inputs, out).median
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
    for r in rows:
        def num(v):
            if v is None:
                return "-"
            return f"{v:.0f} {r['unit']}" if v >= 100 else f"{v:.{1 if v >= 10 else 2}f} {r['unit']}"
        out.append([r["op"], r["shape"], "-" if r["build_ms"] is None else f"{r['build_ms']:.0f}",
                    num(r["ours"]), num(r["numpy"]), "-" if r["ratio"] is None else f"{r['ratio']:.2f}x",
                    "OK" if r["ok"] else "FAIL"])
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
    _check_op_names(names)
    target = _resolve_target(args.target)
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

    _check_op_names([args.op])
    params = dict(DEFAULT_PARAMS[args.op])
    params.update(_parse_param(p) for p in args.param)
    opdef = _make_op(args.op, params)
    target = _resolve_target(args.target)
    try:  # imported lazily, like build_op, so this module loads even without the default schedules
        from compiler.ops import default_schedule
    except ImportError:
        from compiler.ops.default_schedules import default_schedule
    try:
        s = default_schedule(opdef, target)
        print(compiler.lower(s, opdef.tensors, args.op))
    except CompilerError as e:
        raise UsageError(f"{type(e).__name__}: {e}") from None
    return EXIT_OK


# ----------------------------------------------------------------------------- entry point

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tunefarm",
        description="tunefarm: auto-tuning for tensor operators, and the tensor compiler underneath it.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

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

    from . import cli_tune
    cli_tune.register(sub)
    from . import cli_farm
    cli_farm.register(sub)
    return parser


def main(argv=None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 a check failed, 2 usage error)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse already printed the message; return the status, for in-process callers
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    try:
        return args.func(args)
    except UsageError as e:
        print(f"tunefarm {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `tunefarm lower ... | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
