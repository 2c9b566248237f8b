"""The `tunefarm` command line.

    tunefarm version                      versions and the host target string
    tunefarm ops [--only NAME ...]        build, check and time every operator (the inventory demo)
    tunefarm lower OPNAME --param k=v     print the loop IR of an operator's default schedule
    tunefarm tune OPNAME ... | --workloads FILE    tune operators, record every measurement
    tunefarm best OPNAME / records export|import   the records
    tunefarm tracker / agent / farm status         the measurement farm
    tunefarm serve / worker / db upgrade / token   the tuning service (REST API, job workers)
    tunefarm submit / jobs [show|watch|cancel ID]  jobs on a tunefarm server, over REST
    tunefarm model tasks|tune|run MODEL.onnx       a whole ONNX model: its fused workloads, tune them, compile and run it
    tunefarm model profile MODEL.onnx [--compare]  each fused kernel's time, slowest first (beside onnxruntime's)
    tunefarm model conformance                     ONNX's backend node tests, pass counts per supported op type

One module per family of subcommands (ops.py, tune.py, farm.py, service.py, remote.py, model.py,
model_tune.py, model_profile.py, model_export.py, model_conformance.py), the helpers they share in
common.py. User errors (an unknown operator, a bad parameter or target) print one line and exit
with status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from compiler.errors import KernelRuntimeError

from . import farm, model, ops, remote, service, tune
from .common import DEFAULT_PARAMS, DEMO_OPS, EXIT_FAIL, EXIT_OK, EXIT_USAGE, SMALL_PARAMS, UsageError, check_output


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tunefarm",
        description="tunefarm: auto-tuning for tensor operators, and the tensor compiler underneath it.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    ops.register(sub)
    tune.register(sub)
    farm.register(sub)
    service.register(sub)
    remote.register(sub)
    model.register(sub)
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
    except KernelRuntimeError as e:   # a run refused its inputs (an index out of range): what and where
        print(f"tunefarm {args.command}: error: the run failed: {e}", file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `tunefarm lower ... | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return EXIT_OK




__all__ = ["main", "build_parser", "UsageError", "check_output", "DEFAULT_PARAMS", "SMALL_PARAMS", "DEMO_OPS",
           "EXIT_OK", "EXIT_FAIL", "EXIT_USAGE"]
