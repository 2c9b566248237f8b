"""Scalar expression nodes shared by the tensor language and the loop IR.

An expression is an immutable tree. Tensor-language specific nodes (reading a tensor, reductions)
live in `tensor.py`; loop-IR specific ones (reading a flat buffer) in `loop_ir.py`. Variables are
compared by identity: two loops named `i` are different variables.
"""

from __future__ import annotations

import math

from .dtypes import check_dtype, int_range, is_float, is_int
from .errors import DTypeError, ExprError

INDEX_DTYPE = "int64"

BINARY_OPS = ("add", "sub", "mul", "div", "floordiv", "floormod", "min", "max", "pow")
COMPARE_OPS = ("lt", "le", "gt", "ge", "eq", "ne")
LOGICAL_OPS = ("and", "or")
MATH_FUNCS = ("exp", "log", "sqrt", "tanh", "sigmoid", "erf", "abs", "floor", "ceil", "sin", "cos", "round")


class Expr:
    """Base of every scalar expression; operators build new nodes."""

    __slots__ = ("dtype",)
    dtype: str

    def _bin(self, op, other, reverse=False):
        a, b = (other, self) if reverse else (self, other)
        return binary(op, a, b)

    def __add__(self, o): return self._bin("add", o)
    def __radd__(self, o): return self._bin("add", o, True)
    def __sub__(self, o): return self._bin("sub", o)
    def __rsub__(self, o): return self._bin("sub", o, True)
    def __mul__(self, o): return self._bin("mul", o)
    def __rmul__(self, o): return self._bin("mul", o, True)
    def __truediv__(self, o): return self._bin("div", o)
    def __rtruediv__(self, o): return self._bin("div", o, True)
    def __floordiv__(self, o): return self._bin("floordiv", o)
    def __rfloordiv__(self, o): return self._bin("floordiv", o, True)
    def __mod__(self, o): return self._bin("floormod", o)
    def __rmod__(self, o): return self._bin("floormod", o, True)
    def __pow__(self, o): return self._bin("pow", o)
    def __neg__(self): return binary("sub", const(0, self.dtype), self)
    def __lt__(self, o): return compare("lt", self, o)
    def __le__(self, o): return compare("le", self, o)
    def __gt__(self, o): return compare("gt", self, o)
    def __ge__(self, o): return compare("ge", self, o)
    def __and__(self, o): return logical("and", self, o)
    def __rand__(self, o): return logical("and", o, self)
    def __or__(self, o): return logical("or", self, o)
    def __ror__(self, o): return logical("or", o, self)
    def __invert__(self): return Not(self)

    def __bool__(self):
        raise DTypeError("a symbolic expression has no truth value; use if_then_else/select "
                         "or the & | ~ operators instead of and/or/not")

    def astype(self, dtype) -> "Expr":
        return cast(dtype, self)

    # Every node kind with sub-expressions overrides these two (here, and tensor reads and
    # reductions in tensor.py, buffer loads in loop_ir.py); visitors call the module's
    # children()/rebuild().
    def children(self) -> tuple:
        return ()

    def rebuild(self, kids: tuple) -> Expr:
        raise ExprError(f"{type(self).__name__} has no sub-expressions to replace")

    __hash__ = object.__hash__


class Var(Expr):
    """A scalar variable: a loop index, a tensor axis or a let-bound value."""

    __slots__ = ("name",)

    def __init__(self, name: str, dtype: str = INDEX_DTYPE):
        self.name = name
        self.dtype = check_dtype(dtype)

    def __repr__(self):
        return self.name


class Const(Expr):
    __slots__ = ("value",)

    def __init__(self, value, dtype: str):
        self.dtype = check_dtype(dtype)
        if dtype == "bool":
            value = bool(value)
        elif is_int(dtype):
            value = _exact_int(value, dtype)
        else:
            value = float(value)
        self.value = value

    def __repr__(self):
        return repr(self.value)


def _exact_int(value, dtype: str) -> int:
    """`value` as an int of `dtype`, or DTypeError: a constant never silently wraps or truncates
    (`A_int8 + 1000` would otherwise compute with -24)."""
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise DTypeError(f"the constant {value!r} is not an integer, so it cannot be a {dtype} value")
    value = int(value)
    lo, hi = int_range(dtype)
    if not lo <= value <= hi:
        raise DTypeError(f"the constant {value} does not fit {dtype} (range {lo}..{hi}); "
                         "use a wider dtype or a smaller constant")
    return value


class Binary(Expr):
    __slots__ = ("op", "a", "b")

    def __init__(self, op: str, a: Expr, b: Expr, dtype: str):
        self.op, self.a, self.b, self.dtype = op, a, b, dtype

    def children(self) -> tuple:
        return (self.a, self.b)

    def rebuild(self, kids: tuple) -> Expr:
        return Binary(self.op, kids[0], kids[1], self.dtype)


class Compare(Expr):
    __slots__ = ("op", "a", "b")

    def __init__(self, op: str, a: Expr, b: Expr):
        self.op, self.a, self.b, self.dtype = op, a, b, "bool"

    def children(self) -> tuple:
        return (self.a, self.b)

    def rebuild(self, kids: tuple) -> Expr:
        return Compare(self.op, kids[0], kids[1])


class Logical(Expr):
    __slots__ = ("op", "a", "b")

    def __init__(self, op: str, a: Expr, b: Expr):
        self.op, self.a, self.b, self.dtype = op, a, b, "bool"

    def children(self) -> tuple:
        return (self.a, self.b)

    def rebuild(self, kids: tuple) -> Expr:
        return Logical(self.op, kids[0], kids[1])


class Not(Expr):
    __slots__ = ("a",)

    def __init__(self, a: Expr):
        a = as_expr(a)
        if a.dtype != "bool":
            raise DTypeError(f"logical not needs a bool condition, got {a.dtype}")
        self.a, self.dtype = a, "bool"

    def children(self) -> tuple:
        return (self.a,)

    def rebuild(self, kids: tuple) -> Expr:
        return Not(kids[0])


class Select(Expr):
    """`cond ? t : f`.

    A branch that reads memory is only evaluated where the condition selects it (control flow in
    scalar code, masked loads in vector code), so `select(i < n, A[i], 0)` never reads past A.
    """

    __slots__ = ("cond", "t", "f")

    def __init__(self, cond: Expr, t: Expr, f: Expr):
        self.cond, self.t, self.f, self.dtype = cond, t, f, t.dtype

    def children(self) -> tuple:
        return (self.cond, self.t, self.f)

    def rebuild(self, kids: tuple) -> Expr:
        return Select(kids[0], kids[1], kids[2])


class Cast(Expr):
    __slots__ = ("value",)

    def __init__(self, dtype: str, value: Expr):
        self.dtype, self.value = dtype, value

    def children(self) -> tuple:
        return (self.value,)

    def rebuild(self, kids: tuple) -> Expr:
        return Cast(self.dtype, kids[0])


class Call(Expr):
    """An elementwise math function (exp, log, ...)."""

    __slots__ = ("func", "args")

    def __init__(self, func: str, args: tuple, dtype: str):
        self.func, self.args, self.dtype = func, tuple(args), dtype

    def children(self) -> tuple:
        return self.args

    def rebuild(self, kids: tuple) -> Expr:
        return Call(self.func, kids, self.dtype)


class CheckedIndex(Expr):
    """An index computed from data (a gather's row), checked at run time against [lo, hi).

    It evaluates to `value` itself; where `value` falls outside [lo, hi) the kernel stops instead:
    it records the check (`site`) and the offending value in its error record and returns
    KERNEL_INDEX_OUT_OF_RANGE (compiler/codegen_llvm.py), which the runtime raises as
    KernelRuntimeError naming the site, the value and the range. Nothing reads memory through an
    index that left its tensor, and no output built from it is handed back.

    Why a node and not a clamp: a clamped gather (numpy's take(mode="clip")) or a wrapped one
    (`i % n`) returns a plausible row for a bad index, which is a silent wrong answer. The node
    carries its range, so the bounds proof (bounds.py) and the index arithmetic (arith.py) know
    the value lies in [lo, hi) wherever it is used, and code generation turns it into one compare
    and a branch to the kernel's error exit, in scalar, vectorized and parallel loops alike.

    `site` says where the index is read, in words the runtime shows: a stage's read
    (`embed: table[i0] dimension 0`, made by bounds.py) or a model node's input (made by
    compiler.graph.ops.base.node_site). It is part of the expression (its canonical text), so it
    must not name anything a workload key may not depend on (value names, graph positions).

    `wrap` (ONNX's negative indices, lo = -hi): the node evaluates to the checked value plus `hi`
    where it is negative, so to [0, hi). The wrap is part of the node, not a `% hi` around it,
    because index arithmetic is free to drop what it proves constant: `i % 1` is 0 whatever i
    is, and with it went the check of a gather from a one-row table (index 1 read row 0)."""

    __slots__ = ("value", "lo", "hi", "site", "wrap")

    def __init__(self, value: Expr, lo: int, hi: int, site: str, wrap: bool = False):
        self.value, self.lo, self.hi, self.site, self.dtype = value, lo, hi, site, INDEX_DTYPE
        self.wrap = wrap

    @property
    def result_range(self) -> tuple:
        """The inclusive range of what the node evaluates to (the kernel stops on anything else)."""
        return (0, self.hi - 1) if self.wrap else (self.lo, self.hi - 1)

    def children(self) -> tuple:
        return (self.value,)

    def rebuild(self, kids: tuple) -> Expr:
        return CheckedIndex(kids[0], self.lo, self.hi, self.site, self.wrap)


# ----------------------------------------------------------------------------- constructors

def const(value, dtype: str | None = None) -> Const:
    """A constant; without a dtype, bool/int/float map to bool/int64/float32."""
    if dtype is None:
        if isinstance(value, bool):
            dtype = "bool"
        elif isinstance(value, int):
            dtype = INDEX_DTYPE
        else:
            dtype = "float32"
    return Const(value, dtype)


def as_expr(value, hint: str | None = None) -> Expr:
    """Turn a Python scalar into a constant, adopting the dtype of the other operand (`hint`).

    Objects with an `as_expr()` method (the axes of a compute, `IterVar`) stand for their
    variable, so `2 * k` or `y + ry` work on axes directly."""
    if isinstance(value, Expr):
        return value
    if callable(getattr(value, "as_expr", None)):
        return value.as_expr()
    if hasattr(value, "dtype") and hasattr(value, "item"):  # numpy scalar
        return Const(value.item(), check_dtype(value.dtype))
    if isinstance(value, bool):
        return Const(value, "bool")
    if isinstance(value, int):
        return Const(value, hint if hint in ("int8", "int32", "int64", "float32", "float64") else INDEX_DTYPE)
    if isinstance(value, float):
        if hint is not None and not is_float(hint):
            raise DTypeError(f"cannot combine the float constant {value!r} with {hint}; "
                             "cast the integer side with .astype('float32')")
        return Const(value, hint or "float32")
    raise DTypeError(f"cannot use {type(value).__name__} {value!r} in a tensor expression")


def _unify(a, b, what: str):
    hint_a = a.dtype if isinstance(a, Expr) else None
    hint_b = b.dtype if isinstance(b, Expr) else None
    a = as_expr(a, hint_b)
    b = as_expr(b, hint_a)
    if a.dtype != b.dtype:
        raise DTypeError(f"cannot combine {a.dtype} and {b.dtype} in {what}; "
                         "cast one side with .astype(...)")
    return a, b


def binary(op: str, a, b) -> Expr:
    a, b = _unify(a, b, op)
    dt = a.dtype
    if dt == "bool":
        raise DTypeError(f"arithmetic {op} on bool values; cast them first")
    if op == "div" and not is_float(dt):
        raise DTypeError(f"true division '/' of {dt} values; use // (floordiv) for integers")
    if op in ("floordiv", "floormod") and not is_int(dt):
        raise DTypeError(f"{op} needs integer operands, got {dt}")
    if op in ("floordiv", "floormod") and isinstance(b, Const) and b.value == 0:
        raise ExprError(f"{op} by the constant 0; a divisor that is 0 only at run time gives 0, "
                        "as in numpy, but a constant 0 is always a mistake")
    if op == "pow" and not is_float(dt):
        raise DTypeError(f"pow needs float operands, got {dt}")
    return Binary(op, a, b, dt)


def compare(op: str, a, b) -> Expr:
    a, b = _unify(a, b, op)
    return Compare(op, a, b)


def logical(op: str, a, b) -> Expr:
    a, b = as_expr(a), as_expr(b)
    if a.dtype != "bool" or b.dtype != "bool":
        raise DTypeError(f"logical {op} needs bool operands, got {a.dtype} and {b.dtype}")
    return Logical(op, a, b)


def equal(a, b) -> Expr:
    return compare("eq", a, b)


def not_equal(a, b) -> Expr:
    return compare("ne", a, b)


def if_then_else(cond, t, f) -> Expr:
    """Select `t` where `cond` holds, else `f` (alias: select)."""
    if isinstance(cond, bool):
        raise DTypeError("if_then_else condition is a Python bool, not an expression: "
                        "== and != on expressions compare object identity; use equal(a, b) / not_equal(a, b)")
    cond = as_expr(cond)
    if cond.dtype != "bool":
        raise DTypeError(f"if_then_else condition must be bool, got {cond.dtype}")
    t, f = _unify(t, f, "if_then_else")
    return Select(cond, t, f)


select = if_then_else


def cast(dtype, value) -> Expr:
    """`value` converted to `dtype`. float -> int truncates toward zero and saturates (NaN gives 0),
    so a run-time value out of range has a defined result; a constant out of range is an error."""
    dtype = check_dtype(dtype)
    value = as_expr(value)
    if value.dtype == dtype:
        return value
    if isinstance(value, Const) and is_float(value.dtype) and is_int(dtype):
        if not math.isfinite(value.value):
            raise DTypeError(f"cannot cast the constant {value.value!r} to {dtype}")
        Const(math.trunc(value.value), dtype)  # raises DTypeError when out of range
    return Cast(dtype, value)


def checked_index(value, lo: int, hi: int, site: str, wrap: bool = False) -> Expr:
    """`value` (an integer expression computed from data), checked at run time to lie in
    [lo, hi): a kernel that meets a value outside stops with KernelRuntimeError naming `site`,
    the value and the range (see CheckedIndex); with `wrap` (lo must be -hi), a negative value
    counts from the end. The one way a data-dependent index enters an expression; int8/int32
    values are widened to int64 first."""
    value = as_expr(value)
    if not is_int(value.dtype):
        raise DTypeError(f"a checked index must be an integer, got {value.dtype}")
    if isinstance(lo, bool) or isinstance(hi, bool) or not isinstance(lo, int) or not isinstance(hi, int):
        raise ExprError(f"checked index bounds must be ints, got {lo!r} and {hi!r}")
    if lo >= hi:
        raise ExprError(f"checked index range [{lo}, {hi}) is empty")
    if wrap and lo != -hi:
        raise ExprError(f"a wrapped checked index needs the range [-n, n), got [{lo}, {hi})")
    if not isinstance(site, str) or not site or len(site) > 200:
        raise ExprError("a checked index needs a site: a short text naming where it is read")
    if value.dtype != INDEX_DTYPE:
        value = cast(INDEX_DTYPE, value)
    return CheckedIndex(value, lo, hi, site, bool(wrap))


def _math(func: str, x, int_ok: bool = False) -> Expr:
    x = as_expr(x)
    if not is_float(x.dtype) and not (int_ok and is_int(x.dtype)):
        raise DTypeError(f"{func} needs a float argument, got {x.dtype}")
    return Call(func, (x,), x.dtype)


def exp(x): return _math("exp", x)
def log(x): return _math("log", x)
def sqrt(x): return _math("sqrt", x)
def tanh(x): return _math("tanh", x)
def sigmoid(x): return _math("sigmoid", x)
def erf(x): return _math("erf", x)
def floor(x): return _math("floor", x)
def ceil(x): return _math("ceil", x)
def abs(x): return _math("abs", x, int_ok=True)  # noqa: A001 - mirrors numpy's name
def sin(x): return _math("sin", x)
def cos(x): return _math("cos", x)
def round(x): return _math("round", x)  # noqa: A001 - half to even, as numpy's round and ONNX's Round


def power(x, y) -> Expr:
    return binary("pow", x, y)


def floordiv(a, b) -> Expr:
    return binary("floordiv", a, b)


def floormod(a, b) -> Expr:
    return binary("floormod", a, b)


def maximum(a, b) -> Expr:
    return binary("max", a, b)


def minimum(a, b) -> Expr:
    return binary("min", a, b)


def gelu(x) -> Expr:
    """GELU with the exact erf form: 0.5·x·(1 + erf(x/√2))."""
    x = as_expr(x)
    return x * 0.5 * (erf(x * 0.7071067811865476) + 1.0)


# ----------------------------------------------------------------------------- traversal

def children(e: Expr) -> tuple:
    """The sub-expressions of a node, in a fixed order (used by generic visitors)."""
    return e.children()


def rebuild(e: Expr, new_children: tuple) -> Expr:
    """Copy `e` with its children replaced (no dtype checks: the children keep their dtypes)."""
    return e.rebuild(new_children)


def transform(e: Expr, fn) -> Expr:
    """Post-order rewrite: `fn(node)` returns a replacement or None to keep the (rebuilt) node."""
    kids = children(e)
    if kids:
        new = tuple(transform(k, fn) for k in kids)
        if any(n is not k for n, k in zip(new, kids)):
            e = rebuild(e, new)
    out = fn(e)
    return e if out is None else out


def substitute(e: Expr, mapping: dict) -> Expr:
    """Replace variables by expressions (`mapping`: Var -> Expr)."""
    if not mapping:
        return e
    return transform(e, lambda n: mapping.get(n) if isinstance(n, Var) else None)


def fold(e: Expr, visit):
    """Bottom-up evaluation of the tree: `visit(node, its children's results)`. The one walk the
    printers share, each with a table from node kind to code (`by_kind`), instead of an
    isinstance chain of their own."""
    return visit(e, tuple(fold(k, visit) for k in children(e)))


def by_kind(table: dict, default=None):
    """A `fold` visitor that looks the node's class (or its nearest base) up in `table`
    ({class: fn(node, kids)}); `default(node, kids)` for a kind the table lacks, else TypeError."""
    def visit(e, kids):
        for cls in type(e).__mro__:
            fn = table.get(cls)
            if fn is not None:
                return fn(e, kids)
        if default is None:
            raise TypeError(f"no entry for {type(e).__name__}")
        return default(e, kids)
    return visit


def walk(e: Expr):
    """Yield every node of the tree, pre-order."""
    stack = [e]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(children(n)))


def free_vars(e: Expr) -> set:
    return {n for n in walk(e) if isinstance(n, Var)}
