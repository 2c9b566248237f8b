"""What every `tunefarm` subcommand shares: exit codes, usage errors, default operator sizes,
parsing operators, parameters and targets, and judging a kernel's output."""

from __future__ import annotations

import ast
import sys

import numpy as np

from compiler.verify import check_output as _check
from compiler.verify import poisoned

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2

# Moderate, realistic sizes: layers of ResNet-50 / MobileNet / BERT-base, big enough that
# timings mean something, small enough that the whole demo runs in about a minute.
DEFAULT_PARAMS = {
    "matmul": dict(M=512, N=512, K=512),
    "matmul_int8": dict(M=512, N=512, K=512),
    "dense": dict(batch=128, in_dim=1024, out_dim=1024, epilogue="relu"),
    "batch_matmul": dict(B=12, M=128, N=128, K=64),  # BERT-base attention scores
    "dense_gelu": dict(batch=128, in_dim=768, out_dim=3072),  # BERT-base FFN
    "conv2d_nchw": dict(N=1, C=64, H=56, W=56, F=64, KH=3, KW=3, padding=1),  # ResNet-50 conv2_x
    "conv2d_nhwc": dict(N=1, C=64, H=56, W=56, F=64, KH=3, KW=3, padding=1),
    "conv2d_bias_relu": dict(N=1, C=64, H=56, W=56, F=64, KH=3, KW=3, padding=1),
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
    "dense_gelu": dict(batch=8, in_dim=32, out_dim=16),
    "conv2d_nchw": dict(N=1, C=4, H=8, W=8, F=4, KH=3, KW=3, padding=1),
    "conv2d_nhwc": dict(N=1, C=4, H=8, W=8, F=4, KH=3, KW=3, padding=1),
    "conv2d_bias_relu": dict(N=1, C=4, H=8, W=8, F=4, KH=3, KW=3, padding=1),
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

class UsageError(Exception):
    """A mistake in the command line: reported in one line, exit status 2."""


def resolve_target(text):
    from compiler.errors import TargetError
    from compiler.target import resolve_target
    try:
        return resolve_target(text)
    except TargetError as e:
        raise UsageError(f"bad --target: {e}") from None


def check_runs_here(args, target) -> None:
    """UsageError when candidates are measured here (no --tracker) and this machine cannot run `target`:
    otherwise every candidate is built, fails to load and is stored as an error record."""
    if args.tracker:
        return
    from compiler.errors import CompilerError
    from compiler.kernel_format import check_runnable
    try:
        check_runnable(target)
    except CompilerError as e:
        raise UsageError(f"this machine cannot run --target '{target}': {e}. Leave --target out to tune for this "
                         "machine, or measure on agents that can run it (--tracker HOST:PORT --key KEY)") from None


def add_tuning_flags(parser, names=None, **defaults) -> None:
    """The tuning and measurement flags of `tune`, `model tune` and `submit`, made from
    TuningOptions' fields (`names`, default option_forms.TUNING_FLAGS) and MeasureOptions'
    (tuner/option_forms.py); `defaults` replaces a field's default."""
    from compiler.measure_options import MeasureOptions

    from ..engine.options import TuningOptions
    from ..option_forms import MEASURE_FLAGS, TUNING_FLAGS, add_option_flags
    add_option_flags(parser, TuningOptions, TUNING_FLAGS if names is None else names, defaults)
    timing = parser.add_argument_group("measurement", "how each candidate is checked and timed")
    add_option_flags(timing, MeasureOptions, MEASURE_FLAGS)


def tuning_from_flags(args):
    """(TuningOptions, MeasureOptions) of the flags `add_tuning_flags` added."""
    from compiler.measure_options import MeasureOptions

    from ..engine.options import TuningOptions
    from ..option_forms import MEASURE_FLAGS, TUNING_FLAGS, values_from_flags
    return (TuningOptions(**values_from_flags(args, TUNING_FLAGS)),
            MeasureOptions(**values_from_flags(args, MEASURE_FLAGS)))


def farm_runner(args, measure=None):
    """An RPCRunner timing with `measure` (MeasureOptions) when --tracker is given (measure on the
    farm's agents of --key), else None (local)."""
    if not args.tracker:
        return None
    from ..measure import RPCRunner
    if args.key == "local":
        raise UsageError("--tracker needs --key: the device key of the agents to measure on")
    return RPCRunner(args.tracker, args.key, token=args.token, tls_ca=args.tls_ca, options=measure)


def run_tuning(command: str, body, *, progress, runner, store=None) -> tuple:
    """(EXIT_OK, what `body()` returned) for a tuning run shown by `progress`; a bad option
    (ValueError) is a UsageError, a farm that refuses the run prints why and gives (EXIT_FAIL,
    None); the runner (and `store`, when given) is closed whatever happens."""
    from ..measure import FarmError
    try:
        with progress:
            return EXIT_OK, body()
    except ValueError as e:
        raise UsageError(str(e)) from None
    except FarmError as e:
        print(f"tunefarm {command}: the farm refused the run: {e}", file=sys.stderr)
        return EXIT_FAIL, None
    finally:
        if runner is not None:
            runner.close()
        if store is not None:
            store.close()


def check_op_names(names):
    from compiler.ops import INVENTORY
    unknown = [n for n in names if n not in INVENTORY]
    if unknown:
        raise UsageError(f"unknown operator{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                         f"known operators: {', '.join(sorted(INVENTORY))}")


def make_op(name, params):
    from compiler.errors import ExprError
    from compiler.ops import get_op
    try:
        return get_op(name, **params)
    except ExprError as e:  # includes UnknownOpError
        raise UsageError(str(e)) from None


def parse_param(text: str):
    """`k=v` → (k, v); v is a Python literal when it parses as one (16, (1, 64), True), else a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.isidentifier():
        raise UsageError(f"--param {text!r}: expected NAME=VALUE, e.g. --param M=512 or --param shape=64,128")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw
    return key, value


def shape_text(opdef) -> str:
    dims = ["x".join(map(str, t.shape)) for t in opdef.inputs]
    return f"{', '.join(dims)} -> {'x'.join(map(str, opdef.output.shape))}"


def poisoned_output(tensor) -> np.ndarray:
    """An output buffer a correct kernel overwrites everywhere (see compiler.verify)."""
    return poisoned(tensor.shape, tensor.dtype)


def check_output(out: np.ndarray, ref: np.ndarray, dtype: str) -> tuple[bool, str]:
    """(ok, why not): the measuring worker's checker, with the dtype's default tolerance."""
    msg = _check(out, ref, dtype)
    return not msg, msg


def open_store(url):
    """The records store at `url` (default: $TUNEFARM_DB_URL or ~/.tunefarm/records.db)."""
    from ..records import StoreError
    from ..records import open_store as _open
    try:
        return _open(url)
    except StoreError as e:
        raise UsageError(str(e)) from None


def input_shapes(items) -> dict:
    """`--input-shape NAME=D0,D1,...` options → {name: shape}."""
    shapes = {}
    for text in items:
        name, sep, dims = text.rpartition("=")
        try:
            shape = tuple(int(d) for d in dims.replace("x", ",").split(",") if d)
        except ValueError:
            shape = ()
        if not sep or not name or not shape or any(d < 1 for d in shape):
            raise UsageError(f"--input-shape {text!r}: expected NAME=D0,D1,... (e.g. input=1,3,224,224)")
        shapes[name] = shape
    return shapes


def dim_sizes(items) -> dict:
    """`--dim NAME=SIZE` options → {symbol: size}."""
    sizes = {}
    for text in items:
        name, sep, size = text.rpartition("=")
        if not sep or not name or not size.isdigit() or int(size) < 1:
            raise UsageError(f"--dim {text!r}: expected SYMBOL=SIZE (e.g. batch=8)")
        sizes[name] = int(size)
    return sizes


def load_graph(path, shape_items, dim_items=(), symbolic_default: int | None = None):
    """The `tunefarm model` commands' model: the ONNX file at `path` imported with its
    `--input-shape` options, and its symbolic dimensions set by name (`--dim batch=8`); those left
    open take `symbolic_default` (with a note on stderr) where the command runs the model on random
    inputs, and are an error where the shapes become records or a library (`symbolic_default`
    None). A file that is not a model, or shapes that do not fit, are usage errors."""
    from compiler.graph import GraphError, from_onnx
    from compiler.graph.dynamic import input_signature
    from compiler.graph.onnx_import import load_model
    try:
        model = load_model(path)
        shapes = input_shapes(shape_items)
        sizes = dim_sizes(dim_items)
        open_dims = []
        for name, (_, dims) in input_signature(model, shapes).items():
            if all(isinstance(s, int) for s in dims):
                continue
            if any(not isinstance(s, int) and s not in sizes for s in dims):
                if symbolic_default is None:
                    continue   # from_onnx names the dimension and how to pin it
                open_dims += [f"{name}[{d}] ({s or '?'})" for d, s in enumerate(dims)
                              if not isinstance(s, int) and s not in sizes]
            shapes[name] = tuple(s if isinstance(s, int) else sizes.get(s, symbolic_default) for s in dims)
        if open_dims:
            print(f"note: symbolic dimensions {', '.join(open_dims)} taken as {symbolic_default} "
                  "(set them with --dim NAME=SIZE or --input-shape)", file=sys.stderr)
        return from_onnx(model, input_shapes=shapes)
    except GraphError as e:
        raise UsageError(str(e)) from None


def build_graph_module(graph, target, db, no_records: bool):
    """`graph` compiled with the best records of `target` in the store at `db` (none with
    `no_records`), default schedules elsewhere: what `tunefarm model run` and `profile` time."""
    import warnings

    from compiler.graph import GraphError, build_model
    provider = None
    if not no_records:
        from ..apply_best import ApplyHistoryBest
        provider = ApplyHistoryBest(open_store(db))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # "no tuned schedule": the callers count module.sources instead
            return build_model(graph, target, records=provider)
    except GraphError as e:
        raise UsageError(str(e)) from None


def random_inputs(graph, rng) -> dict:
    """Random values for every input of `graph` (normal floats, 0/1 integers and booleans)."""
    out = {}
    for name in graph.inputs:
        v = graph.values[name]
        if v.dtype.startswith("float"):
            out[name] = rng.standard_normal(v.shape).astype(v.dtype)
        elif v.dtype == "bool":
            out[name] = rng.integers(0, 2, v.shape).astype(bool)
        else:
            out[name] = rng.integers(0, 2, v.shape).astype(v.dtype)
    return out


def start_progress(total: int, info: str, plain: bool):
    """A started rich progress display with one "tuning" bar of `total` trials (an `info` field
    beside it), as (progress, bar id); (None, None) with --plain or without rich, where the
    callers print plain lines instead."""
    if plain:
        return None, None
    try:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    except ImportError:
        return None, None
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[info]}"), TimeElapsedColumn())
    bar.__enter__()
    return bar, bar.add_task("tuning", total=total, info=info)
