"""A differential fuzzer for the compiler: seeded random kernels checked against numpy.

A wrong result that looks plausible, or a kernel that takes the user's process down, is the worst
thing the compiler can do, and hand-written tests only find the bugs someone already thought of.
Every seed deterministically generates one case, from one of two generators:

- "inventory": a random operator of `compiler.ops.INVENTORY` at small, often odd shapes (tails),
  with random stride/padding/dilation/groups and dtypes, scheduled with its default schedule or a
  candidate sampled from the tuner's search space for it (its template where one exists,
  sketches otherwise); checked against the operator's numpy reference.
- "compute": a random compute DAG written in the tensor language (elementwise chains, sum/max/min
  over one or two axes with math functions inside, integer floordiv/floormod by divisors that
  can be zero or negative, bounds-guarded selects) under a naive or random schedule; checked
  against the same expression tree evaluated by numpy (float64 for floats, integers in their
  dtype with numpy's wrap-around and `x // 0 == x % 0 == 0`).

Each case is built and run in a worker subprocess (`Worker`), so a crash or a hang is a result and
not the end of the run. Only the seed crosses the pipe: the worker regenerates the case. Outcomes:

- ok; rejected: the compiler (or the tuner's space) refused the case with a CompilerError /
  SpaceError, which is what it promises to do with anything invalid;
- findings: wrong (a result outside tolerance, an unwritten element, a written input, or an
  invalid program accepted), crash (the worker died: its signal and last stderr lines), hang
  (no answer within the timeout: the worker's process group is killed), exception (anything but
  a CompilerError escaped the compiler: users must only ever see CompilerErrors).

    results = run_seeds(range(100), jobs=2)     # tests/test_fuzz.py and bench/fuzz.py
    print(describe(1234))                       # the compute, schedule steps and loop IR of a seed
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections import deque
from dataclasses import asdict, dataclass, field

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # the worker runs this file as a script
    sys.path.insert(0, ROOT)

import compiler as tc  # noqa: E402
from compiler.errors import CompilerError  # noqa: E402
from compiler.ops import INVENTORY, default_schedule, get_op, random_inputs  # noqa: E402
from compiler.ops.base import OpDef  # noqa: E402
from compiler.tensor import Reduce  # noqa: E402
from device_agent.worker import signal_name, watch_parent  # noqa: E402

OUTCOMES = ("ok", "rejected", "wrong", "crash", "hang", "exception")
FINDINGS = ("wrong", "crash", "hang", "exception")
GENERATORS = ("inventory", "compute")
RTOL = {"float32": 1e-4, "float64": 1e-9}
DEFAULT_TIMEOUT = 20.0
SELF_TEST_FAULTS = ("none", "wrong", "crash", "hang", "exception")  # checks of the checker


@dataclass
class Result:
    """What happened to one seed."""

    seed: int
    generator: str
    outcome: str
    message: str = ""
    phase: str = ""
    title: str = ""
    seconds: float = 0.0

    @property
    def is_finding(self) -> bool:
        return self.outcome in FINDINGS

    def line(self) -> str:
        msg = " ".join(self.message.split())
        if len(msg) > 300:
            msg = msg[:297] + "..."
        return f"seed {self.seed} [{self.generator}] {self.outcome} in {self.phase or '?'}: {msg} | {self.title}"


# ============================================================================= random helpers

ODD_SIZES = (1, 3, 5, 7, 9, 11, 13, 15, 17, 31, 33, 63, 65)


def _pick(rng, seq):
    seq = list(seq)
    return seq[int(rng.integers(len(seq)))]


def _size(rng, hi: int = 65) -> int:
    """A loop extent in 1..hi: often an odd size (tails that no vector or tile divides), often up
    to 16 (where vector widths, unrolling and tails interact most), otherwise anything."""
    r = rng.random()
    if r < 0.4:
        return _pick(rng, [s for s in ODD_SIZES if s <= hi])
    return int(rng.integers(1, (min(hi, 16) if r < 0.7 else hi) + 1))


def _shape(rng, ndim_lo: int, ndim_hi: int, hi: int = 65, max_elems: int = 20000) -> tuple:
    """Random extents, shrunk until the tensor is small enough to check in milliseconds."""
    dims = [_size(rng, hi) for _ in range(int(rng.integers(ndim_lo, ndim_hi + 1)))]
    while math.prod(dims) > max_elems:
        d = int(np.argmax(dims))
        dims[d] = max(1, dims[d] // 2 | 1)
    return tuple(dims)


def _dtype(rng, allowed) -> str:
    """float32 most of the time (the common case), otherwise any dtype the operator allows."""
    if "float32" in allowed and rng.random() < 0.55:
        return "float32"
    return _pick(rng, allowed)


# ============================================================================= generator (a): inventory

FLOAT = ("float32", "float64")
NUMERIC = ("float32", "float64", "int8", "int32", "int64")
MATMUL_DTYPES = ("float32", "float64", "int8", "int32")
CONV_DTYPES = ("float32", "float64", "int8")


def _p_matmul(rng):
    return dict(M=_size(rng), N=_size(rng), K=_size(rng), dtype=_dtype(rng, MATMUL_DTYPES),
                transpose_b=bool(rng.random() < 0.3))


def _p_matmul_int8(rng):
    return dict(M=_size(rng), N=_size(rng), K=_size(rng), transpose_b=bool(rng.random() < 0.3))


def _p_batch_matmul(rng):
    return dict(B=_size(rng, 4), M=_size(rng, 33), N=_size(rng, 33), K=_size(rng, 33),
                dtype=_dtype(rng, MATMUL_DTYPES), transpose_b=bool(rng.random() < 0.3))


def _p_dense(rng):
    return dict(batch=_size(rng, 33), in_dim=_size(rng), out_dim=_size(rng), dtype=_dtype(rng, FLOAT),
                epilogue=_pick(rng, ("none", "relu", "gelu")))


def _padding(rng, hi: int):
    """An int, a (ph, pw) pair or (top, left, bottom, right): every form the operators accept."""
    form = int(rng.integers(3))
    if form == 0:
        return int(rng.integers(0, hi + 1))
    return tuple(int(rng.integers(0, hi + 1)) for _ in range(2 if form == 1 else 4))


def _pads4(padding) -> tuple:
    if isinstance(padding, int):
        return (padding,) * 4
    return padding * 2 if len(padding) == 2 else padding


def _window(rng, max_kernel: int, pad_below_kernel: bool):
    """Kernel, stride, padding, dilation and an input size that the window fits."""
    KH, KW = _size(rng, max_kernel), _size(rng, max_kernel)
    stride = (_size(rng, 3), _size(rng, 3))
    dil = (1, 1) if pad_below_kernel or rng.random() < 0.6 else (_size(rng, 3), _size(rng, 3))
    padding = _padding(rng, min(KH, KW) - 1 if pad_below_kernel else 2)
    top, left, bottom, right = _pads4(padding)
    H = max(_size(rng, 17), (KH - 1) * dil[0] + 1 - top - bottom)
    W = max(_size(rng, 17), (KW - 1) * dil[1] + 1 - left - right)
    return dict(KH=KH, KW=KW, stride=stride, padding=padding, dilation=dil, H=H, W=W)


def _p_conv(rng):
    groups = _pick(rng, (1, 1, 1, 2, 3))
    w = _window(rng, 5, False)
    return dict(N=_size(rng, 2), C=groups * _size(rng, 4), F=groups * _size(rng, 4), H=w["H"], W=w["W"],
                KH=w["KH"], KW=w["KW"], stride=w["stride"], padding=w["padding"], dilation=w["dilation"],
                groups=groups, dtype=_dtype(rng, CONV_DTYPES))


def _p_conv_bias_relu(rng):
    return dict(_p_conv(rng), dtype=_dtype(rng, FLOAT))


def _p_dense_gelu(rng):
    return {k: v for k, v in _p_dense(rng).items() if k != "epilogue"}


def _p_depthwise(rng):
    w = _window(rng, 5, False)
    return dict(N=_size(rng, 2), C=_size(rng, 8), H=w["H"], W=w["W"], KH=w["KH"], KW=w["KW"],
                stride=w["stride"], padding=w["padding"], dilation=w["dilation"],
                multiplier=_size(rng, 3), dtype=_dtype(rng, CONV_DTYPES))


def _p_pool(dtypes):
    def params(rng):
        w = _window(rng, 4, True)
        stride = None if rng.random() < 0.3 else w["stride"]
        return dict(N=_size(rng, 2), C=_size(rng, 6), H=w["H"], W=w["W"], kernel=(w["KH"], w["KW"]),
                    stride=stride, padding=w["padding"], dtype=_dtype(rng, dtypes))
    return params


def _p_norm(rng):
    shape = _shape(rng, 1, 3)
    return dict(shape=shape, axis=int(rng.integers(-len(shape), len(shape))), dtype=_dtype(rng, FLOAT))


def _p_binary(rng):
    """Equal shapes, or numpy broadcasting: some dims of B set to 1 and/or leading dims dropped."""
    a = _shape(rng, 1, 3)
    b = list(a)
    if rng.random() < 0.5:
        b = [1 if rng.random() < 0.5 else d for d in b][int(rng.integers(0, len(b))):] or [1]
    if rng.random() < 0.5:
        a, b = tuple(b), a
    return dict(shape_a=tuple(a), shape_b=tuple(b), dtype=_dtype(rng, NUMERIC))


def _p_unary(dtypes):
    return lambda rng: dict(shape=_shape(rng, 1, 3), dtype=_dtype(rng, dtypes))


def _p_bias_add(rng):
    shape = _shape(rng, 2, 4)
    return dict(shape=shape, axis=int(rng.integers(-len(shape), len(shape))), dtype=_dtype(rng, NUMERIC))


def _p_reduce(rng):
    shape = _shape(rng, 1, 3)
    nd = len(shape)
    r = rng.random()
    if r < 0.25:
        axis = None
    elif r < 0.65:
        axis = int(rng.integers(-nd, nd))
    else:
        axis = tuple(sorted({int(a) for a in rng.integers(0, nd, size=int(rng.integers(1, nd + 1)))}))
    return dict(shape=shape, axis=axis, keepdims=bool(rng.random() < 0.3), dtype=_dtype(rng, NUMERIC))


def _p_transpose(rng):
    shape = _shape(rng, 2, 4)
    axes = None if rng.random() < 0.3 else tuple(int(a) for a in rng.permutation(len(shape)))
    return dict(shape=shape, axes=axes, dtype=_dtype(rng, NUMERIC))


def _p_pad(rng):
    shape = _shape(rng, 1, 3)
    dtype = _dtype(rng, NUMERIC)

    def pads():
        if rng.random() < 0.3:
            return int(rng.integers(0, 4))
        return tuple(int(rng.integers(0, 4)) for _ in shape)
    value = _pick(rng, (0, 1, -3)) if dtype.startswith("int") else _pick(rng, (0.0, 1.5, -2.25))
    return dict(shape=shape, pad_before=pads(), pad_after=pads(), value=value, dtype=dtype)


OP_PARAMS = {
    "matmul": _p_matmul, "matmul_int8": _p_matmul_int8, "batch_matmul": _p_batch_matmul, "dense": _p_dense,
    "conv2d_nchw": _p_conv, "conv2d_nhwc": _p_conv, "depthwise_conv2d_nchw": _p_depthwise,
    "conv2d_bias_relu": _p_conv_bias_relu, "dense_gelu": _p_dense_gelu,
    "max_pool2d": _p_pool(NUMERIC), "avg_pool2d": _p_pool(FLOAT),
    "softmax": _p_norm, "layer_norm": _p_norm,
    "add": _p_binary, "mul": _p_binary, "relu": _p_unary(NUMERIC), "gelu": _p_unary(FLOAT),
    "bias_add": _p_bias_add, "reduce_sum": _p_reduce, "reduce_max": _p_reduce, "reduce_min": _p_reduce,
    "transpose": _p_transpose, "pad": _p_pad,
}
assert set(OP_PARAMS) == set(INVENTORY), "every inventory operator needs a parameter generator"


def _fmt_params(params: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


@dataclass
class InventoryCase:
    """An inventory operator under its default schedule or a schedule from the tuner's space."""

    seed: int
    op: str
    params: dict
    source: str              # "default" | "template" | "sketch"
    nan_inputs: bool = False
    threads: bool = False
    invalid: str = ""        # never set: inventory parameters are drawn valid
    generator: str = "inventory"

    @property
    def precision(self) -> str:
        return "float64" if self.params.get("dtype") == "float64" else "float32"

    @property
    def title(self) -> str:
        extras = "".join([", NaN inputs" if self.nan_inputs else "", ", 4 threads" if self.threads else ""])
        return f"{self.op}({_fmt_params(self.params)}) with a {self.source} schedule{extras}"

    def define(self) -> OpDef:
        return get_op(self.op, **self.params)

    def text(self, opdef) -> str:
        return f"{self.op}({_fmt_params(self.params)})\n{tc.canonical_text([opdef.output])}"

    def schedule(self, opdef):
        """(schedule, args, how it was chosen) — the tuner's own sampling and instantiation."""
        if self.source == "default":
            return default_schedule(opdef), opdef.tensors, "the operator's default schedule"
        from tuner.space import SketchSpace, TemplateSpace
        rng = np.random.default_rng([self.seed, 1])
        if self.source == "template":
            space = TemplateSpace(opdef)
            cand = space.sample(rng)
            s, args = space.schedule(opdef, cand)
            return s, args, f"template {space.template_name} knobs {json.dumps(cand.payload['knobs'])}"
        space = SketchSpace(opdef)
        cand = space.sample(rng)
        s = tc.apply_steps([opdef.output], cand.payload["steps"])  # unwrapped: no SpaceError hides a bug
        return s, opdef.tensors, f"sketch {cand.payload['sketch']} params {json.dumps(cand.payload['params'])}"


def _inventory_case(seed: int, rng) -> InventoryCase:
    from tuner.space import template_for_op
    op = _pick(rng, sorted(INVENTORY))
    params = OP_PARAMS[op](rng)
    # half default schedules (what build_op gives every user), half the tuner's candidates
    source = "default" if rng.random() < 0.5 else ("template" if op in template_for_op() else "sketch")
    floats = params.get("dtype", "float32") in FLOAT and op != "matmul_int8"
    return InventoryCase(seed, op, params, source, nan_inputs=floats and rng.random() < 0.1,
                         threads=rng.random() < 0.1)


# ============================================================================= generator (b): random computes
#
# A compute is drawn as a small tree of nodes that can be built twice from the same code: with
# the tensor language (`_TE`) and with numpy (`_NP`). Python operators (+ - * // % < & |) mean
# the same on both; everything else goes through the backend object.

INT_RANGE = {"int8": (-2**7, 2**7 - 1), "int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1)}
EXACT_FLOATS = (0.5, -0.5, 0.25, 1.0, -1.5, 2.0, 3.0, -0.75)  # exact in float32: compares stay exact


def _is_float(dtype: str) -> bool:
    return dtype.startswith("float")


def _castable(src: str, dst: str) -> bool:
    """Casts the fuzzer uses: never float -> int (NaN or out-of-range values are undefined in
    LLVM and platform-specific in numpy, and rounding makes the result flaky near integers)."""
    return _is_float(dst) or not _is_float(src)


def _np_dtype(dtype: str):
    """The dtype numpy evaluates a value of `dtype` in: float64 for every float, ints as they are."""
    return np.float64 if _is_float(dtype) else np.dtype(dtype)


@dataclass(eq=False)
class Axis:
    name: str
    extent: int
    reduce: bool = False


@dataclass(eq=False)
class TensorSpec:
    name: str
    shape: tuple
    dtype: str
    mag: float = 1.0           # bound of |value| for floats (keeps exp() finite)


@dataclass(eq=False)
class Index:
    """An index expression: lin (k·a + c), rev (c - a), div (a // k), mod (a % k), sum (a + b + c), const (c)."""

    kind: str
    a: Axis | None = None
    b: Axis | None = None
    k: int = 1
    c: int = 0

    def bounds(self) -> tuple:
        ea = self.a.extent - 1 if self.a else 0
        if self.kind == "lin":
            return self.c, self.k * ea + self.c
        if self.kind == "rev":
            return self.c - ea, self.c
        if self.kind == "div":
            return 0, ea // self.k
        if self.kind == "mod":
            return 0, min(self.k - 1, ea)
        if self.kind == "sum":
            return self.c, ea + self.b.extent - 1 + self.c
        return self.c, self.c

    def build(self, env):
        if self.kind == "const":
            return self.c
        x = env[self.a]
        if self.kind == "lin":
            x = x * self.k if self.k != 1 else x
            return x + self.c if self.c else x
        if self.kind == "rev":
            return self.c - x
        if self.kind == "div":
            return x // self.k
        if self.kind == "mod":
            return x % self.k
        x = x + env[self.b]
        return x + self.c if self.c else x

    def text(self) -> str:
        a = self.a.name if self.a else ""
        plus = f"{self.c:+d}" if self.c else ""
        return {"lin": (f"{self.k}*{a}" if self.k != 1 else a) + plus, "rev": f"{self.c}-{a}",
                "div": f"{a}//{self.k}", "mod": f"{a}%{self.k}", "sum": f"{a}+{self.b.name if self.b else ''}{plus}",
                "const": str(self.c)}[self.kind]


class _TE:
    """Builds nodes with the tensor language."""

    def __init__(self, tensors: dict):
        self.tensors = tensors

    @staticmethod
    def const(value, dtype):
        return tc.const(value, dtype)

    @staticmethod
    def cast(x, dtype):
        return tc.cast(dtype, x)

    exp, tanh, sigmoid, erf, abs = (staticmethod(f) for f in (tc.exp, tc.tanh, tc.sigmoid, tc.erf, tc.abs))
    maximum, minimum, where = staticmethod(tc.maximum), staticmethod(tc.minimum), staticmethod(tc.if_then_else)
    equal, not_equal = staticmethod(tc.equal), staticmethod(tc.not_equal)

    def read(self, spec, idx, guard, fill):
        value = self.tensors[spec.name][tuple(idx)]
        return value if guard is None else tc.if_then_else(guard, value, fill)


class _NP:
    """Evaluates nodes with numpy: float64 for floats, ints in their dtype (numpy's wrap-around)."""

    def __init__(self, arrays: dict):
        self.arrays = arrays

    @staticmethod
    def const(value, dtype):
        return np.asarray(value, _np_dtype(dtype))

    @staticmethod
    def cast(x, dtype):
        return np.asarray(x).astype(_np_dtype(dtype))

    exp, tanh, abs, maximum, minimum, where = (staticmethod(f) for f in (
        np.exp, np.tanh, np.abs, np.maximum, np.minimum, np.where))
    equal, not_equal = staticmethod(np.equal), staticmethod(np.not_equal)

    @staticmethod
    def sigmoid(x):
        return 1.0 / (1.0 + np.exp(-x))

    @staticmethod
    def erf(x):
        return np.vectorize(math.erf, otypes=[np.float64])(x)

    def read(self, spec, idx, guard, fill):
        arr = self.arrays[spec.name]
        if guard is None:
            if any(np.min(i) < 0 or np.max(i) >= s for i, s in zip(idx, spec.shape)):
                raise AssertionError(f"fuzzer bug: an unguarded read of {spec.name} leaves its bounds")
            return arr[tuple(idx)]
        idx = [np.clip(i, 0, s - 1) for i, s in zip(idx, spec.shape)]  # the guard drops what is clamped
        return np.where(guard, arr[tuple(idx)], fill)


class Node:
    """A value of the random compute. `mag` bounds |value| for floats: exp() only gets small arguments."""

    dtype: str
    mag: float = 1.0

    def build(self, bk, env):  # pragma: no cover - overridden
        raise NotImplementedError

    def text(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError


class Read(Node):
    """tensor[idx]; `guarded` wraps it in select(in bounds, read, fill), which must never read outside."""

    def __init__(self, spec: TensorSpec, idx: list, guarded: bool = False, fill=0):
        self.spec, self.idx, self.guarded, self.fill = spec, idx, guarded, fill
        self.dtype = spec.dtype
        self.mag = max(spec.mag, abs(fill)) if guarded else spec.mag

    def build(self, bk, env):
        values = [i.build(env) for i in self.idx]
        guard = None
        if self.guarded:
            for i, v, s in zip(self.idx, values, self.spec.shape):
                lo, hi = i.bounds()
                for cond in ([v >= 0] if lo < 0 else []) + ([v < s] if hi >= s else []):
                    guard = cond if guard is None else guard & cond
        fill = bk.const(self.fill, self.dtype) if guard is not None else None
        return bk.read(self.spec, values, guard, fill)

    def text(self):
        r = f"{self.spec.name}[{', '.join(i.text() for i in self.idx)}]"
        return f"guarded({r}, fill={self.fill})" if self.guarded else r


class Const(Node):
    def __init__(self, value, dtype: str):
        self.value, self.dtype = value, dtype
        self.mag = float(abs(value))

    def build(self, bk, env):
        return bk.const(self.value, self.dtype)

    def text(self):
        return f"{self.value}:{self.dtype}"


class IndexValue(Node):
    """An index expression used as data (cast from int64 unless the dtype is int64)."""

    def __init__(self, index: Index, dtype: str):
        self.index, self.dtype = index, dtype
        self.mag = float(max(abs(b) for b in index.bounds()))

    def build(self, bk, env):
        v = self.index.build(env)
        if isinstance(v, int):  # a constant index
            return bk.const(v, self.dtype)
        return v if self.dtype == "int64" else bk.cast(v, self.dtype)

    def text(self):
        return f"({self.index.text()}):{self.dtype}"


class Cast(Node):
    def __init__(self, x: Node, dtype: str):
        self.x, self.dtype = x, dtype
        self.mag = x.mag if _is_float(x.dtype) or x.mag < 2**24 else float(INT_RANGE[x.dtype][1])

    def build(self, bk, env):
        return bk.cast(self.x.build(bk, env), self.dtype)

    def text(self):
        return f"cast<{self.dtype}>({self.x.text()})"


class Unary(Node):
    def __init__(self, func: str, x: Node):
        self.func, self.x, self.dtype = func, x, x.dtype
        self.mag = math.exp(x.mag) if func == "exp" else (1.0 if func in ("tanh", "sigmoid", "erf") else x.mag)

    def build(self, bk, env):
        v = self.x.build(bk, env)
        return -v if self.func == "neg" else getattr(bk, self.func)(v)

    def text(self):
        return f"{self.func}({self.x.text()})"


BINARY_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "floormod": "%"}


class Binary(Node):
    def __init__(self, op: str, a: Node, b: Node):
        self.op, self.a, self.b, self.dtype = op, a, b, a.dtype
        self.mag = {"add": a.mag + b.mag, "sub": a.mag + b.mag, "mul": a.mag * b.mag,
                    "div": a.mag}.get(op, max(a.mag, b.mag))

    def build(self, bk, env):
        x, y = self.a.build(bk, env), self.b.build(bk, env)
        if self.op in ("max", "min"):
            return (bk.maximum if self.op == "max" else bk.minimum)(x, y)
        return {"add": lambda: x + y, "sub": lambda: x - y, "mul": lambda: x * y, "div": lambda: x / y,
                "floordiv": lambda: x // y, "floormod": lambda: x % y}[self.op]()

    def text(self):
        if self.op in ("max", "min"):
            return f"{self.op}({self.a.text()}, {self.b.text()})"
        return f"({self.a.text()} {BINARY_SYMBOL[self.op]} {self.b.text()})"


class Select(Node):
    def __init__(self, cond: Node, t: Node, f: Node):
        self.cond, self.t, self.f, self.dtype = cond, t, f, t.dtype
        self.mag = max(t.mag, f.mag)

    def build(self, bk, env):
        return bk.where(self.cond.build(bk, env), self.t.build(bk, env), self.f.build(bk, env))

    def text(self):
        return f"select({self.cond.text()}, {self.t.text()}, {self.f.text()})"


class Compare(Node):
    dtype = "bool"

    def __init__(self, op: str, a: Node, b: Node):
        self.op, self.a, self.b = op, a, b

    def build(self, bk, env):
        x, y = self.a.build(bk, env), self.b.build(bk, env)
        if self.op in ("eq", "ne"):
            return (bk.equal if self.op == "eq" else bk.not_equal)(x, y)
        return {"lt": lambda: x < y, "le": lambda: x <= y, "gt": lambda: x > y, "ge": lambda: x >= y}[self.op]()

    def text(self):
        return f"{self.op}({self.a.text()}, {self.b.text()})"


class Logic(Node):
    """and / or of two conditions, or not of one (b is None)."""

    dtype = "bool"

    def __init__(self, op: str, a: Node, b: Node | None = None):
        self.op, self.a, self.b = op, a, b

    def build(self, bk, env):
        x = self.a.build(bk, env)
        if self.op == "not":
            return ~x
        y = self.b.build(bk, env)
        return x & y if self.op == "and" else x | y

    def text(self):
        return f"not({self.a.text()})" if self.op == "not" else f"{self.op}({self.a.text()}, {self.b.text()})"


@dataclass(eq=False)
class StageSpec:
    """out[axes] = body, or combiner(body over raxes where `where`) for a reduction."""

    spec: TensorSpec
    axes: list
    raxes: list
    combiner: str              # "" (elementwise) | "sum" | "max" | "min"
    body: Node
    where: Node | None = None
    orphans: list = field(default_factory=list)  # reduce axes used outside any reduction (invalid)

    def text(self) -> str:
        lhs = f"{self.spec.name}[{', '.join(a.name for a in self.axes)}]: {self.spec.dtype}{list(self.spec.shape)}"
        if not self.combiner:
            return f"{lhs} = {self.body.text()}"
        axes = ", ".join(f"{r.name}<{r.extent}" for r in self.raxes)
        where = f" where {self.where.text()}" if self.where is not None else ""
        return f"{lhs} = {self.combiner}({self.body.text()}, axes=[{axes}]){where}"


def _reduce_identity(combiner: str, dtype: str):
    if combiner == "sum":
        return 0
    if _is_float(dtype):
        return -np.inf if combiner == "max" else np.inf
    info = np.iinfo(dtype)
    return info.min if combiner == "max" else info.max


def _np_stage(st: StageSpec, arrays: dict):
    """Evaluate a stage over its whole grid: spatial dims first, then the reduction dims."""
    grid = [a.extent for a in st.axes] + [r.extent for r in st.raxes]
    axes = st.axes + st.raxes
    env = {a: np.arange(a.extent).reshape([-1 if d == n else 1 for d in range(len(grid))])
           for n, a in enumerate(axes)}
    bk = _NP(arrays)
    value = np.broadcast_to(np.asarray(st.body.build(bk, env), _np_dtype(st.spec.dtype)), grid)
    if not st.combiner:
        return np.array(value)
    if st.where is not None:
        keep = np.broadcast_to(st.where.build(bk, env), grid)
        value = np.where(keep, value, np.asarray(_reduce_identity(st.combiner, st.spec.dtype), value.dtype))
    red = tuple(range(len(st.axes), len(grid)))
    if st.combiner == "sum":
        return np.sum(value, axis=red, dtype=value.dtype)
    return (np.max if st.combiner == "max" else np.min)(value, axis=red)


def _te_stage(st: StageSpec, tensors: dict, raw_axes: bool):
    """The stage in the tensor language; with raw_axes, reduce axes enter index arithmetic as the
    reduce_axis objects themselves (`2 * k`), as users write them."""
    rks = {r: tc.reduce_axis(r.extent, r.name) for r in st.raxes}
    orphans = {o: tc.reduce_axis(o.extent, o.name).var for o in st.orphans}
    bk = _TE(tensors)

    def fcompute(*idx):
        env = dict(zip(st.axes, idx))
        env.update({r: (rk if raw_axes else rk.var) for r, rk in rks.items()})
        env.update(orphans)
        value = st.body.build(bk, env)
        if not st.combiner:
            return value
        where = st.where.build(bk, env) if st.where is not None else None
        return getattr(tc, st.combiner)(value, axis=list(rks.values()), where=where)

    return tc.compute(st.spec.shape, fcompute, name=st.spec.name)


@dataclass
class ComputeProgram:
    """A random compute DAG: inputs, stages (the last one is the output) and why it is invalid."""

    inputs: list
    stages: list
    invalid: str = ""
    raw_axes: bool = False
    precision: str = "float64"  # the least precise float type anything is computed in

    def text(self) -> str:
        ins = ", ".join(f"{t.name}: {t.dtype}{list(t.shape)}" for t in self.inputs)
        flags = " (reduce axes used raw in index arithmetic)" if self.raw_axes else ""
        return "\n".join([f"inputs {ins}{flags}"] + [st.text() for st in self.stages])

    def define(self) -> OpDef:
        tensors = {t.name: tc.placeholder(t.shape, t.dtype, t.name) for t in self.inputs}
        for st in self.stages:
            tensors[st.spec.name] = _te_stage(st, tensors, self.raw_axes)
        inputs = [tensors[t.name] for t in self.inputs]
        return OpDef("fuzz_compute", inputs, tensors[self.stages[-1].spec.name], {}, 0, self.reference)

    def reference(self, *arrays):
        values = {t.name: np.asarray(a).astype(_np_dtype(t.dtype)) for t, a in zip(self.inputs, arrays)}
        with np.errstate(all="ignore"):
            for st in self.stages:
                values[st.spec.name] = _np_stage(st, values)
        return values[self.stages[-1].spec.name]


class _ComputeGen:
    """Draws a ComputeProgram. Pure Python with no compiler calls: the parent process draws the
    same case again to name it when the worker dies on it."""

    MAX_INPUT_ELEMS = 40000

    def __init__(self, rng):
        self.rng = rng
        self.inputs: list = []
        self.stages: list = []
        self.invalid = ""
        self.pending: list = []  # leaves the current stage must contain
        self.float32 = False     # computes in float32 somewhere: float32 tolerance even for a float64 output

    def p(self, prob: float) -> bool:
        return bool(self.rng.random() < prob)

    def mark_invalid(self, why: str):
        self.invalid = self.invalid or why

    # ---------------------------------------------------------------- the program
    def program(self) -> ComputeProgram:
        raw = self.p(0.05)
        n = _pick(self.rng, (1, 1, 1, 2, 2, 3))
        dtype = self.stage_dtype()
        for k in range(n):
            if k and self.p(0.2):  # a later stage reads the previous one: float stays float
                new = self.stage_dtype()
                dtype = new if _castable(dtype, new) else "float32"
            self.stages.append(self.stage(k, dtype))
            self.float32 |= dtype == "float32"
        return ComputeProgram(self.inputs, self.stages, self.invalid, raw, "float32" if self.float32 else "float64")

    def stage_dtype(self) -> str:
        r = self.rng.random()
        return "float32" if r < 0.5 else "float64" if r < 0.65 else "int32" if r < 0.85 else \
            "int8" if r < 0.93 else "int64"

    def stage(self, k: int, dtype: str) -> StageSpec:
        prev = self.stages[-1] if self.stages else None
        shape = prev.spec.shape if prev is not None and self.p(0.6) else _shape(self.rng, 1, 3, max_elems=4000)
        axes = [Axis(f"i{d}", e) for d, e in enumerate(shape)]
        combiner = _pick(self.rng, ("sum", "sum", "max", "min")) if self.p(0.55) else ""
        raxes = self.reduce_axes(math.prod(shape)) if combiner else []
        every = axes + raxes
        orphans = self.require_leaves(dtype, every, prev, elementwise=not combiner)
        body = self.value(int(self.rng.integers(0, 4)), dtype, every)
        while self.pending:  # the tree was too small to hold them all
            op = _pick(self.rng, ("add", "mul" if body.mag < 1e3 else "add"))
            body = Binary(op, body, self.castable(self.pending.pop(), dtype))
        where = self.cond(every) if combiner and self.p(0.25) else None
        mag = body.mag * (math.prod(r.extent for r in raxes) if combiner == "sum" else 1)
        return StageSpec(TensorSpec(f"s{k}", tuple(shape), dtype, mag), axes, raxes, combiner, body, where, orphans)

    def reduce_axes(self, spatial: int) -> list:
        """One or two reduce axes, within a budget of grid points (the reference is a dense grid)."""
        budget, out = max(1, 60000 // spatial), []
        for d in range(1 if self.p(0.6) else 2):
            out.append(Axis(f"r{d}", min(_size(self.rng), budget)))
            budget = max(1, budget // out[-1].extent)
        return out

    def require_leaves(self, dtype: str, axes: list, prev, elementwise: bool) -> list:
        """Reads the stage body must contain: a new input over all its axes, the previous stage,
        and rarely (an invalid program) an input indexed by an orphan reduce axis; returns the orphans."""
        self.pending = [self.new_input(dtype, axes, require=axes)]
        if prev is not None:
            self.pending.append(self.castable(self.read(prev.spec, axes), dtype))
        if not elementwise or not self.p(0.02):
            return []
        orphan = Axis("r_orphan", _size(self.rng, 9), reduce=True)
        self.pending.append(self.new_input(dtype, [orphan]))
        self.mark_invalid("a reduce axis is used outside its reduction")
        return [orphan]

    # ---------------------------------------------------------------- values
    def value(self, depth: int, dtype: str, axes: list) -> Node:
        if depth <= 0 or self.p(0.2):
            return self.leaf(dtype, axes)
        r = self.rng.random()
        if r < 0.2:
            return self.unary(depth, dtype, axes)
        if r < 0.75:
            return self.binary(depth, dtype, axes)
        if r < 0.9:
            return Select(self.cond(axes), self.value(depth - 1, dtype, axes), self.value(depth - 1, dtype, axes))
        return self.castable(self.value(depth - 1, self.other_dtype(dtype), axes), dtype)

    def other_dtype(self, dtype: str) -> str:
        """A dtype that casts to `dtype` exactly enough to compare (never float -> int)."""
        if _is_float(dtype):
            return _pick(self.rng, ("float32", "float64", "int32", "int8"))
        return _pick(self.rng, ("int8", "int32", "int64"))

    def castable(self, node: Node, dtype: str) -> Node:
        assert _castable(node.dtype, dtype), f"fuzzer bug: cast {node.dtype} -> {dtype}"
        self.float32 |= "float32" in (node.dtype, dtype)
        return node if node.dtype == dtype else Cast(node, dtype)

    def unary(self, depth, dtype, axes) -> Node:
        x = self.value(depth - 1, dtype, axes)
        if not _is_float(dtype):
            return Unary(_pick(self.rng, ("abs", "neg")), x)
        func = _pick(self.rng, ("exp", "tanh", "sigmoid", "abs", "neg", "erf"))
        if func == "exp" and x.mag > 8:
            func = "tanh"
        return Unary(func, x)

    def binary(self, depth, dtype, axes) -> Node:
        if _is_float(dtype):
            op = _pick(self.rng, ("add", "sub", "mul", "mul", "max", "min", "div"))
        else:
            op = _pick(self.rng, ("add", "sub", "mul", "max", "min", "floordiv", "floormod", "floordiv", "floormod"))
        a = self.value(depth - 1, dtype, axes)
        if op in ("floordiv", "floormod"):
            return Binary(op, a, self.divisor(dtype, axes))
        b = self.value(depth - 1, dtype, axes)
        if op == "mul" and a.mag * b.mag > 1e5:
            op = "add"
        if op == "div":  # a denominator of at least 1: no inf, no cancellation blow-up
            b = Binary("add", Unary("abs", b), Const(1.0, dtype))
        return Binary(op, a, b)

    def divisor(self, dtype, axes) -> Node:
        """Often zero or negative somewhere at run time: read + c with c in [-4, 4], or a constant."""
        r = self.rng.random()
        if r < 0.6:
            return Binary("add", self.read_input(dtype, axes), Const(int(self.rng.integers(-4, 5)), dtype))
        if r < 0.9:
            return self.read_input(dtype, axes)
        return Const(_pick(self.rng, (-1, 3, -7, 0)), dtype)

    def leaf(self, dtype: str, axes: list) -> Node:
        if self.pending and _castable(self.pending[-1].dtype, dtype):
            return self.castable(self.pending.pop(), dtype)
        r = self.rng.random()
        if r < 0.6:
            return self.castable(self.read_any(dtype, axes), dtype)
        if r < 0.85:
            return self.const(dtype)
        return IndexValue(self.fit_index(axes, 65), dtype)

    def const(self, dtype: str) -> Const:
        if _is_float(dtype):
            return Const(_pick(self.rng, EXACT_FLOATS), dtype)
        lo, hi = INT_RANGE[dtype]
        r = self.rng.random()
        if r < 0.03:
            return Const(lo, dtype)  # INT_MIN: INT_MIN // -1 overflows
        if r < 0.045:
            value = _pick(self.rng, (hi + 1, lo - 1, 300 if dtype == "int8" else 2**40))
            if not lo <= value <= hi:
                self.mark_invalid(f"the constant {value} does not fit {dtype}")
            return Const(value, dtype)
        return Const(int(self.rng.integers(-5, 6)), dtype)

    COMPARES = ("lt", "le", "gt", "ge", "eq", "ne")

    def cond(self, axes: list) -> Node:
        """A condition that is exact in float32 and float64 alike (a flip between the kernel and the
        reference would be noise): over indices, input values and exact constants only."""
        r = self.rng.random()
        c = self.index_compare(axes) if r < 0.4 else self.value_compare(axes) if r < 0.8 else self.parity(axes)
        if self.p(0.2):
            return Logic(_pick(self.rng, ("and", "or")), c, self.cond(axes))
        return Logic("not", c) if self.p(0.1) else c

    def index_compare(self, axes: list) -> Node:
        a = IndexValue(self.fit_index(axes, 65), "int64")
        b = IndexValue(self.fit_index(axes, 65), "int64") if self.p(0.5) else self.exact_const("int64")
        return Compare(_pick(self.rng, self.COMPARES), a, b)

    def value_compare(self, axes: list) -> Node:
        dtype = _pick(self.rng, ("float32", "int32"))
        a = self.read_input(dtype, axes)
        b = self.read_input(dtype, axes) if self.p(0.5) else self.exact_const(dtype)
        return Compare(_pick(self.rng, self.COMPARES), a, b)

    def parity(self, axes: list) -> Node:
        k = int(self.rng.integers(2, 4))
        index = IndexValue(Index("mod", _pick(self.rng, axes), k=k), "int64")
        return Compare("eq", index, Const(int(self.rng.integers(0, k)), "int64"))

    def exact_const(self, dtype: str) -> Const:
        if _is_float(dtype):
            return Const(_pick(self.rng, EXACT_FLOATS), dtype)
        return Const(int(self.rng.integers(-4, 9)), dtype)

    # ---------------------------------------------------------------- reads and indices
    def read_any(self, dtype: str, axes: list) -> Read:
        """A read of an existing tensor of a compatible dtype, or of a new input."""
        tensors = [t for t in self.inputs + [s.spec for s in self.stages]
                   if t.dtype == dtype or _castable(t.dtype, dtype) and self.p(0.3)]
        if tensors and self.p(0.6):
            return self.read(_pick(self.rng, tensors), axes)
        return self.new_input(dtype if self.p(0.85) else self.other_dtype(dtype), axes)

    def read_input(self, dtype: str, axes: list) -> Read:
        existing = [t for t in self.inputs if t.dtype == dtype]
        if existing and self.p(0.5):
            return self.read(_pick(self.rng, existing), axes)
        return self.new_input(dtype, axes)

    def read(self, spec: TensorSpec, axes: list) -> Read:
        """A read of `spec` that stays in bounds, is guarded, or (rarely) is neither (invalid)."""
        guarded = self.p(0.15)
        idx = [self.loose_index(axes) if guarded and self.p(0.6) else self.fit_index(axes, s) for s in spec.shape]
        outside = any(lo < 0 or hi >= s for i, s in zip(idx, spec.shape) for lo, hi in [i.bounds()])
        if outside and self.p(0.05):
            self.mark_invalid(f"an unguarded read of {spec.name} goes out of bounds")
            return Read(spec, idx)
        fill = (_pick(self.rng, EXACT_FLOATS) if _is_float(spec.dtype) else int(self.rng.integers(-3, 4)))
        return Read(spec, idx, guarded=outside, fill=fill)

    def new_input(self, dtype: str, axes: list, require=()) -> Read:
        """A new placeholder shaped to fit the index expressions drawn for it; `require`d axes are
        all used, in a random order (a reduction's main read runs over every reduce axis)."""
        if require:
            spatial = [a for a in require if not a.reduce]
            chosen = [a for a in require if a.reduce] + [spatial[int(p)] for p in self.rng.permutation(len(spatial))]
            chosen = chosen[:max(4, len(chosen) - len(spatial))]
            idx = [self.free_index(chosen[int(p)], axes) for p in self.rng.permutation(len(chosen))]
        else:
            idx = [self.free_index(_pick(self.rng, axes), axes) for _ in range(int(self.rng.integers(1, 4)))]
        shape = [max(1, i.bounds()[1] + 1 + int(self.rng.integers(0, 2))) for i in idx]
        while math.prod(shape) > self.MAX_INPUT_ELEMS:  # coarser indices until it fits
            d = int(np.argmax(shape))
            idx[d] = Index("div", idx[d].a, k=idx[d].k * 2 if idx[d].kind == "div" else 2)
            shape[d] = idx[d].bounds()[1] + 1
        n = len(self.inputs)
        name = chr(ord("A") + n % 26) + (str(n // 26) if n >= 26 else "")
        spec = TensorSpec(name, tuple(shape), dtype, 1.0 if _is_float(dtype) else 4.0)
        self.inputs.append(spec)
        return Read(spec, idx)

    def free_index(self, ax: Axis, axes: list) -> Index:
        """An index over `ax` for a tensor sized to fit it: mostly the plain axis."""
        r = self.rng.random()
        if r < 0.55:
            return Index("lin", ax)
        if r < 0.7:
            return Index("lin", ax, k=_pick(self.rng, (1, 2)), c=int(self.rng.integers(0, 3)))
        if r < 0.8:
            return Index("rev", ax, c=ax.extent - 1)
        if r < 0.87:
            return Index("div", ax, k=int(self.rng.integers(2, 4)))
        if r < 0.93:
            return Index("mod", ax, k=int(self.rng.integers(2, 5)))
        return Index("sum", ax, b=_pick(self.rng, axes))

    def fit_index(self, axes: list, size: int) -> Index:
        """An index that always lies in [0, size)."""
        options = [Index("const", c=int(self.rng.integers(0, size)))]
        for a in axes:
            if a.extent <= size:
                options += [Index("lin", a, c=int(self.rng.integers(0, size - a.extent + 1)))] * 4
                options.append(Index("rev", a, c=size - 1 - int(self.rng.integers(0, size - a.extent + 1))))
            if 2 * (a.extent - 1) < size:
                options.append(Index("lin", a, k=2))
            if (a.extent - 1) // 2 < size:
                options.append(Index("div", a, k=2))
            if size >= 2:
                options.append(Index("mod", a, k=int(self.rng.integers(2, min(size, 5) + 1))))
        return _pick(self.rng, options)

    def loose_index(self, axes: list) -> Index:
        """An index that may leave the tensor on either side (for guarded reads)."""
        return Index("lin", _pick(self.rng, axes), c=int(self.rng.integers(-2, 3)))


@dataclass
class ComputeCase:
    """A random compute under a naive or random schedule."""

    seed: int
    program: ComputeProgram
    naive: bool
    nan_inputs: bool = False
    threads: bool = False
    generator: str = "compute"

    @property
    def invalid(self) -> str:
        return self.program.invalid

    @property
    def precision(self) -> str:
        return self.program.precision

    @property
    def title(self) -> str:
        st = self.program.stages
        kinds = "+".join((s.combiner or "elemwise") + f"<{s.spec.dtype}>" for s in st)
        shape = list(st[-1].spec.shape)
        extras = "".join([", NaN inputs" if self.nan_inputs else "", ", 4 threads" if self.threads else "",
                          f", invalid: {self.invalid}" if self.invalid else ""])
        return f"compute {kinds} -> {shape} with a {'naive' if self.naive else 'random'} schedule{extras}"

    def define(self) -> OpDef:
        return self.program.define()

    def text(self, opdef) -> str:
        return self.program.text()

    def schedule(self, opdef):
        s = tc.create_schedule(opdef.output)
        if not self.naive:
            _RandomScheduler(s, np.random.default_rng([self.seed, 1])).run()
        return s, opdef.tensors, "naive" if self.naive else "random primitives"


def _compute_case(seed: int, rng) -> ComputeCase:
    program = _ComputeGen(rng).program()
    floats = any(_is_float(t.dtype) for t in program.inputs)
    return ComputeCase(seed, program, naive=rng.random() < 0.25, nan_inputs=floats and rng.random() < 0.1,
                       threads=rng.random() < 0.1)


# ============================================================================= random schedules

class _RandomScheduler:
    """Random schedule primitives over every stage, with arguments valid most of the time.

    Order matters to the compiler: cache_write / rfactor before a stage's loops change, inline
    before anything else, compute_at last (it names a loop of the consumer that must stay a loop).
    """

    def __init__(self, s, rng):
        self.s, self.rng = s, rng

    def p(self, prob: float) -> bool:
        return bool(self.rng.random() < prob)

    def run(self):
        for st in list(self.s.stages):
            self.structure(st)
        for st in list(self.s.stages):
            if not st.is_inline:
                self.loops(st)
        for st in list(self.s.stages):
            if not st.is_output and not st.is_inline and self.p(0.35):
                self.attach(st)

    def structure(self, st):
        reduction = isinstance(st.op.body, Reduce)
        if not st.is_output and not reduction and self.p(0.4):
            st.compute_inline()
            return
        if self.p(0.1) and self.s.placeholders:
            reads = [t for t in st.op.input_tensors() if t in self.s.placeholders]
            if reads:
                t = _pick(self.rng, reads)
                block = {int(self.rng.integers(t.ndim)): _pick(self.rng, (2, 4, 8))} if self.p(0.3) else None
                self.s.cache_read(t, _pick(self.rng, ("local", "global")), [st], block=block)
        if reduction and self.p(0.15):
            self.rfactor(st)
        elif st.is_output and self.p(0.15):
            self.s.cache_write(st.tensor, "local")

    def rfactor(self, st):
        raxis = _pick(self.rng, st.op.reduce_axis)
        if self.p(0.6):
            outer, inner = st.split(raxis, factor=_pick(self.rng, (2, 4, 8, 16)))
            raxis = inner if self.p(0.7) else outer
        self.s.rfactor(st.tensor, raxis, factor_axis=int(self.rng.integers(0, len(st.op.axis) + 1)))

    def factor(self, extent: int) -> int:
        if self.p(0.01):
            return _pick(self.rng, (0, -2))  # invalid: must be a ScheduleError
        if self.p(0.5):
            divs = [d for d in range(2, extent + 1) if extent % d == 0]
            if divs:
                return _pick(self.rng, divs)
        return _pick(self.rng, (2, 3, 4, 5, 8, 16, 17, extent + 1))

    def loops(self, st):
        for iv in list(st.leaf_iter_vars):
            if iv.extent > 1 and self.p(0.35):
                if self.p(0.85):
                    st.split(iv, factor=self.factor(iv.extent))
                else:
                    st.split(iv, nparts=self.factor(iv.extent))
        leaves = st.leaf_iter_vars
        if len(leaves) > 1 and self.p(0.15):
            k = int(self.rng.integers(len(leaves) - 1))
            if leaves[k].kind == leaves[k + 1].kind:
                st.fuse(leaves[k], leaves[k + 1])
        if len(st.leaf_iter_vars) > 1 and self.p(0.4):
            st.reorder(*[st.leaf_iter_vars[int(i)] for i in self.rng.permutation(len(st.leaf_iter_vars))])
        self.annotate(st)

    def annotate(self, st):
        self.vectorize(st)
        outer = st.leaf_iter_vars[0]
        if outer.kind != "reduce" and outer not in st.annotations and self.p(0.35):
            st.parallel(outer)
        self.unroll(st)
        if self.p(0.15):
            st.auto_unroll(_pick(self.rng, (0, 8, 16, 64, 512)))
        if self.p(0.15):
            self.prefetch(st)

    def prefetch(self, st):
        """A tensor the stage reads, prefetched at any of its loops some iterations ahead (past
        the tensor's end on the last ones): results must not change; lowering may refuse a
        region too large, a vectorized loop or a data-dependent read."""
        reads = list(st.op.input_tensors())
        if reads:
            st.prefetch(_pick(self.rng, reads), _pick(self.rng, st.leaf_iter_vars), _pick(self.rng, (1, 2, 3, 8, 100)))

    def vectorize(self, st):
        """Mostly the innermost loop (split to at most 64 lanes first); rarely another spatial loop,
        which lowering may refuse."""
        inner = st.leaf_iter_vars[-1]
        if inner.kind != "reduce" and self.p(0.5):
            if inner.extent > 64 and self.p(0.9):
                _, inner = st.split(inner, factor=_pick(self.rng, (4, 8, 16)))
            st.vectorize(inner)
        elif self.p(0.05):
            spatial = [iv for iv in st.leaf_iter_vars if iv.kind != "reduce"]
            if spatial:
                st.vectorize(_pick(self.rng, spatial))

    def unroll(self, st):
        """Mostly a short loop; rarely any loop (a huge unroll must be refused, not hang the build)."""
        free = [iv for iv in st.leaf_iter_vars if iv not in st.annotations]
        small = [iv for iv in free if iv.extent <= 16]
        if small and self.p(0.3):
            st.unroll(_pick(self.rng, small))
        elif free and self.p(0.02):
            st.unroll(_pick(self.rng, free))

    def consumers(self, st) -> list:
        """Stages with loops that read `st`, directly or through inlined stages."""
        out, todo = [], [st]
        while todo:
            for reader in self.s.readers_of(todo.pop().tensor):
                (todo if reader.is_inline else out).append(reader)
        return out

    def attach(self, st):
        """compute_at a loop of a consumer; rarely a vectorized one (which lowering refuses)."""
        consumers = self.consumers(st)
        if consumers:
            parent = _pick(self.rng, consumers)
            loops = [iv for iv in parent.leaf_iter_vars if parent.annotations.get(iv) != "vectorize"]
            st.compute_at(parent, _pick(self.rng, loops if loops and self.p(0.9) else parent.leaf_iter_vars))


# ============================================================================= cases

SELF_TEST_CASE = InventoryCase(0, "add", {"shape_a": (3, 5), "shape_b": (3, 5), "dtype": "float32"}, "default")


def make_case(seed: int):
    """The case of a seed: the same seed draws the same case in every process."""
    rng = np.random.default_rng([seed, 0])
    if rng.random() < 0.5:
        return _inventory_case(seed, rng)
    return _compute_case(seed, rng)


def case_for(seed: int, fault: str | None):
    """The case a worker runs: a seed's, or with a fault (one of SELF_TEST_FAULTS) the fixed
    self-test case, so the checker's own test does not depend on what a seed draws."""
    if fault is None:
        return make_case(seed)
    if fault not in SELF_TEST_FAULTS:
        raise ValueError(f"unknown fault {fault!r}; faults: {', '.join(SELF_TEST_FAULTS)}")
    return SELF_TEST_CASE


# ============================================================================= checking (in the worker)

class _Phase:
    """Which step of a case is running; the worker also prints it to stderr so the parent can say
    where a crash or a hang happened."""

    def __init__(self, announce: bool):
        self.name, self.announce = "", announce

    def __call__(self, name: str):
        self.name = name
        if self.announce:
            print(f"@@phase {name}", file=sys.stderr, flush=True)


def _poison(shape, dtype: str, variant: int) -> np.ndarray:
    """An output buffer a correct kernel overwrites entirely: NaN / a sentinel (two variants, so an
    unwritten element cannot hide behind a reference value equal to the poison)."""
    if _is_float(dtype):
        return np.full(shape, np.nan if variant == 0 else -1.2345678e-7, dtype)
    info = np.iinfo(dtype)
    return np.full(shape, info.min + 3 if variant == 0 else info.max - 5, dtype)


def _inputs(case, opdef) -> list:
    """random_inputs (non-zero: zeros hide indexing bugs); with nan_inputs, ~2% NaNs in each float input."""
    rng = np.random.default_rng([case.seed, 2])
    arrays = random_inputs(opdef, rng)
    if case.nan_inputs:
        for a in arrays:
            if a.dtype.kind == "f":
                a.reshape(-1)[rng.random(a.size) < 0.02] = np.nan
    return arrays


def compare(got: np.ndarray, ref: np.ndarray, dtype: str, precision: str | None = None) -> str:
    """'' when `got` matches `ref`, else how it differs. Integers must match exactly; floats within
    rtol·(|ref| + max|ref|) (sums are reordered, and an element near zero has no useful relative
    error), rtol being that of `precision` (the least precise float type the kernel computes in,
    `dtype` by default), with NaN and ±inf in the same places."""
    ref = np.broadcast_to(np.asarray(ref), got.shape)
    if not _is_float(dtype):
        bad = got != ref.astype(got.dtype)
        if not bad.any():
            return ""
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        return (f"{int(bad.sum())} of {bad.size} elements differ (exact match required for {dtype}); "
                f"first at {at}: expected {ref[at]!r}, got {got[at]!r}")
    g, r = got.astype(np.float64), ref.astype(np.float64)
    same = (g == r) | (np.isnan(g) & np.isnan(r))
    finite = np.isfinite(r)
    scale = float(np.abs(r[finite]).max()) if finite.any() else 0.0
    with np.errstate(invalid="ignore"):
        err = np.where(same, 0.0, np.abs(g - r))
        rtol = RTOL[precision or dtype]
        bad = ~same & ~(finite & (err <= rtol * (np.abs(r) + scale)))
    if not bad.any():
        return ""
    err = np.where(bad, np.nan_to_num(err, nan=np.inf), -1.0)
    at = tuple(int(i) for i in np.unravel_index(int(np.argmax(err)), err.shape))
    with np.errstate(all="ignore"):
        rel = err[at] / abs(r[at]) if r[at] else np.inf
    return (f"{int(bad.sum())} of {bad.size} elements beyond rtol {rtol:g}; max abs error {err[at]:.3g} "
            f"(rel {rel:.3g}) at {at}: expected {r[at]:.7g}, got {g[at]:.7g}")


def _run_and_compare(kernel, inputs, ref, dtype, precision, variant: int) -> str:
    ins = [a.copy() for a in inputs]
    out = _poison(ref.shape, dtype, variant)
    kernel(*ins, out)
    for n, (a, b) in enumerate(zip(ins, inputs)):
        if not np.array_equal(a, b, equal_nan=a.dtype.kind == "f"):
            return f"the kernel wrote to its input #{n}"
    return compare(out, ref, dtype, precision)


def _run_in_threads(kernel, inputs, ref, dtype, precision, n: int = 4, calls: int = 10) -> str:
    """A fresh copy of the kernel (not loaded yet: the first calls race to load it) called from n
    threads at once, each with its own arrays, as a user's thread pool does."""
    kernel = tc.load_kernel(kernel.to_bytes())
    errors = [""] * n

    def work(k):
        for _ in range(calls):
            errors[k] = errors[k] or _run_and_compare(kernel, inputs, ref, dtype, precision, 0)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return next((f"from {n} threads: {e}" for e in errors if e), "")


def _where(exc: BaseException) -> str:
    """The innermost frame of the project's code that raised (where to look)."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if f"{os.sep}compiler{os.sep}" in f.filename or f"{os.sep}tuner{os.sep}" in f.filename]
    f = (ours or frames or [None])[-1]
    return f" at {os.path.relpath(f.filename, ROOT)}:{f.lineno} in {f.name}" if f else ""


def _verify(case, fault, phase):
    """(outcome, message) of one case; raises whatever the compiler raised (see check)."""
    phase("define")
    opdef = case.define()
    phase("schedule")
    s, args, _ = case.schedule(opdef)
    phase("build")
    if fault == "hang":
        while True:
            time.sleep(1)
    if fault == "exception":
        raise RuntimeError("injected fault")
    kernel = tc.build(s, args, name="fuzz")
    if case.invalid:
        return "wrong", f"accepted an invalid program: {case.invalid}"
    phase("reference")
    inputs = _inputs(case, opdef)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = np.asarray(opdef.reference(*[a.copy() for a in inputs])).reshape(opdef.output.shape)
    if fault == "wrong":
        ref = ref + 1
    dtype = opdef.output.dtype
    phase("run")
    if fault == "crash":
        ctypes.string_at(0)
    msg = _run_and_compare(kernel, inputs, ref, dtype, case.precision, 0)
    if not msg and (np.isnan(ref).any() if _is_float(dtype) else (ref == _poison((1,), dtype, 0)[0]).any()):
        phase("run again")  # an unwritten element could hide behind a reference value equal to the poison
        msg = _run_and_compare(kernel, inputs, ref, dtype, case.precision, 1)
    if not msg and case.threads:
        phase("run from 4 threads")
        msg = _run_in_threads(kernel, inputs, ref, dtype, case.precision)
    return ("wrong", msg) if msg else ("ok", "")


def check(seed: int, fault: str | None = None, announce: bool = False) -> Result:
    """Generate, build, run and compare one case in this process (a crash takes it down)."""
    from tuner.space import SpaceError
    case = case_for(seed, fault)
    phase = _Phase(announce)
    t0 = time.perf_counter()
    try:
        outcome, message = _verify(case, fault, phase)
    except (CompilerError, SpaceError) as e:
        clean = phase.name in ("define", "schedule", "build") and not _refuses_valid_reads(case, e)
        outcome = "rejected" if clean else "exception"
        message = f"{type(e).__name__}: {e}" + ("" if clean else _where(e))
    except Exception as e:  # noqa: BLE001 - every other exception is a finding
        outcome, message = "exception", f"{type(e).__name__}: {e}{_where(e)}"
    return Result(seed, case.generator, outcome, message, phase.name, case.title, time.perf_counter() - t0)


def _refuses_valid_reads(case, e: Exception) -> bool:
    """Inventory operators, and random computes not drawn invalid on purpose, only read inside
    their tensors, and no schedule changes what a computation reads: refusing one of their
    schedules for out-of-bounds reads is a finding."""
    return "can leave the tensor" in str(e) and not case.invalid


def describe(seed: int) -> str:
    """The compute, schedule and loop IR of a seed, generated in this process (no native code
    runs, so nothing here can crash): what `bench/fuzz.py --seed N --verbose` prints."""
    case = make_case(seed)
    lines = [f"seed {seed} [{case.generator}]: {case.title}"]
    try:
        opdef = case.define()
        lines += ["-- compute", case.text(opdef)]
        s, args, how = case.schedule(opdef)
        lines += ["-- schedule: " + how] + [json.dumps(step) for step in s.steps]
        lines += ["-- loop IR", str(tc.lower(s, args, "fuzz"))]
    except Exception as e:  # noqa: BLE001 - show how far it got
        if len(lines) == 1 and hasattr(case, "program"):
            lines += ["-- compute", case.program.text()]
        lines.append(f"-- stopped: {type(e).__name__}: {e}{_where(e)}")
    return "\n".join(lines)


# ============================================================================= the worker process

def serve():
    """Worker main loop: one JSON request per line on stdin ({"seed": n, "fault": f}), one Result per
    line on the original stdout. fd 1 then points at stderr, so whatever LLVM or a kernel prints
    cannot corrupt the answers."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    watch_parent()
    import tuner.space  # noqa: F401 - pay the imports before answering "ready"
    answers.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        answers.write(json.dumps(asdict(check(req["seed"], req.get("fault"), announce=True))) + "\n")


class Worker:
    """A long-lived worker subprocess; replaced after a crash or a hang (killed with its process
    group, so nothing it started lives on)."""

    STARTUP_TIMEOUT = 120.0

    def __init__(self, timeout: float = DEFAULT_TIMEOUT):
        self.timeout = timeout
        self.proc = None
        self.phase = ""
        self.tail: deque = deque(maxlen=12)
        self._buf = b""
        self._drain = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _start(self):
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve"], cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)
        self._buf = b""
        self._drain = threading.Thread(target=self._read_stderr, args=(self.proc.stderr,), daemon=True)
        self._drain.start()
        if self._readline(time.monotonic() + self.STARTUP_TIMEOUT) is None:
            raise RuntimeError(f"the fuzz worker did not start: {' | '.join(self.tail)}")

    def _read_stderr(self, stream):
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip()
            if line.startswith("@@phase "):
                self.phase = line[8:]
            elif line.strip():
                self.tail.append(line)

    def _readline(self, deadline: float):
        """The next answer line; None at EOF (the worker died); TimeoutError past the deadline."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def _kill(self):
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        if self._drain is not None:
            self._drain.join(timeout=2)
        for f in (proc.stdin, proc.stdout, proc.stderr):
            f.close()

    def run(self, seed: int, fault: str | None = None) -> Result:
        """Check one seed; a dead or hung worker becomes a crash / hang result."""
        if self.proc is None:
            self._start()
        self.phase = ""
        self.tail.clear()
        t0 = time.monotonic()
        try:
            self.proc.stdin.write((json.dumps({"seed": seed, "fault": fault}) + "\n").encode())
            self.proc.stdin.flush()
            line = self._readline(t0 + self.timeout)
        except TimeoutError:
            phase = self.phase
            self._kill()
            return self._lost(seed, fault, "hang", f"no answer within {self.timeout:g} s (worker killed)", phase, t0)
        except BrokenPipeError:
            line = None
        if line is None:
            phase, rc = self.phase, self.proc.wait()
            self._kill()
            last = " | ".join(self.tail)
            return self._lost(seed, fault, "crash", f"the worker died ({signal_name(rc)})" +
                              (f": {last}" if last else ""), phase, t0)
        return Result(**json.loads(line))

    @staticmethod
    def _lost(seed, fault, outcome, message, phase, t0) -> Result:
        case = case_for(seed, fault)
        return Result(seed, case.generator, outcome, message, phase, case.title, time.monotonic() - t0)

    def close(self):
        if self.proc is not None:
            try:
                self.proc.stdin.close()  # EOF: the worker leaves its loop
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
            self._kill()


def run_seeds(seeds, jobs: int = 1, timeout: float = DEFAULT_TIMEOUT, on_result=None) -> list:
    """Check every seed with `jobs` workers; results in seed order. `on_result(result)` is called as
    each one arrives (from the worker threads, one at a time)."""
    todo: queue.Queue = queue.Queue()
    for s in seeds:
        todo.put(s)
    results, lock = [], threading.Lock()

    def drive():
        with Worker(timeout) as w:
            while True:
                try:
                    seed = todo.get_nowait()
                except queue.Empty:
                    return
                r = w.run(seed)
                with lock:
                    results.append(r)
                    if on_result is not None:
                        on_result(r)

    threads = [threading.Thread(target=drive, daemon=True) for _ in range(max(1, jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(results, key=lambda r: r.seed)


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    serve()
