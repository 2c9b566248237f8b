"""The tensor language: placeholder, compute, reduce_axis and reductions.

Shapes are concrete Python ints: a workload is an operator with concrete shapes and dtypes, and
every schedule decision (tile sizes, vector lengths) depends on them.
"""

from __future__ import annotations

import inspect
import itertools

from .dtypes import check_dtype, is_float, is_int
from .errors import DTypeError, ExprError
from .expr import INDEX_DTYPE, Expr, Var, as_expr, binary, substitute, walk

REDUCE_COMBINERS = ("sum", "max", "min")


class IterVar:
    """A named iteration range [0, extent) of a tensor axis, a reduction, or a split/fused loop."""

    __slots__ = ("var", "extent", "kind")

    def __init__(self, name: str, extent: int, kind: str = "spatial"):
        if not isinstance(extent, int) or extent <= 0:
            raise ExprError(f"axis {name!r} needs a positive integer extent, got {extent!r}")
        self.var = Var(name, INDEX_DTYPE)
        self.extent = extent
        self.kind = kind

    @property
    def name(self) -> str:
        return self.var.name

    def __repr__(self):
        return f"IterVar({self.name}, {self.extent}, {self.kind})"

    def as_expr(self) -> Var:
        """The axis in an expression is its variable: `A[2 * k]`, `y + ry`, `k < 3` all work."""
        return self.var

    # Arithmetic and comparisons act on the variable; equality and hashing stay by identity,
    # because schedules key their loops by IterVar.
    def __add__(self, o): return self.var + o
    def __radd__(self, o): return o + self.var
    def __sub__(self, o): return self.var - o
    def __rsub__(self, o): return o - self.var
    def __mul__(self, o): return self.var * o
    def __rmul__(self, o): return o * self.var
    def __floordiv__(self, o): return self.var // o
    def __rfloordiv__(self, o): return o // self.var
    def __mod__(self, o): return self.var % o
    def __rmod__(self, o): return o % self.var
    def __neg__(self): return -self.var
    def __lt__(self, o): return self.var < o
    def __le__(self, o): return self.var <= o
    def __gt__(self, o): return self.var > o
    def __ge__(self, o): return self.var >= o

    def astype(self, dtype) -> Expr:
        return self.var.astype(dtype)

    __hash__ = object.__hash__


class ReduceAxis(IterVar):
    """A reduction axis over [lo, hi); `var` ranges over it directly (lo is folded into reads)."""

    __slots__ = ("lo",)

    def __init__(self, name: str, lo: int, hi: int):
        super().__init__(name, hi - lo, "reduce")
        self.lo = lo


class Operation:
    """What produces a tensor: a placeholder (an input) or a compute."""

    name: str
    shape: tuple
    dtype: str
    output: Tensor  # set by the Tensor that wraps the operation

    def input_tensors(self) -> list:
        return []


class PlaceholderOp(Operation):
    def __init__(self, shape, dtype, name):
        self.shape, self.dtype, self.name = shape, dtype, name


class ComputeOp(Operation):
    """out[axis...] = body, where body may be a top-level Reduce over `reduce_axis`."""

    def __init__(self, name, shape, axis, body, tag="", attrs=None):
        self.name, self.shape, self.axis, self.body = name, shape, axis, body
        self.dtype = body.dtype
        self.reduce_axis = list(body.axes) if isinstance(body, Reduce) else []
        self.tag = tag
        self.attrs = dict(attrs or {})

    def input_tensors(self) -> list:
        seen, out = set(), []
        for n in walk(self.body):
            if isinstance(n, TensorRead) and id(n.tensor) not in seen:
                seen.add(id(n.tensor))
                out.append(n.tensor)
        return out


class Tensor:
    """The output of an operation; index it to read an element inside a compute."""

    def __init__(self, op: Operation):
        self.op = op
        op.output = self

    shape = property(lambda self: self.op.shape)
    dtype = property(lambda self: self.op.dtype)
    name = property(lambda self: self.op.name)
    ndim = property(lambda self: len(self.op.shape))

    def __getitem__(self, indices):
        if not isinstance(indices, tuple):
            indices = (indices,)
        if len(indices) != self.ndim:
            raise ExprError(f"tensor {self.name} has {self.ndim} dimensions, indexed with {len(indices)}")
        idx = []
        for i in indices:
            if isinstance(i, IterVar):
                i = i.var
            e = as_expr(i, INDEX_DTYPE)
            if not is_int(e.dtype):
                raise DTypeError(f"index of {self.name} must be an integer expression, got {e.dtype}")
            if e.dtype != INDEX_DTYPE:
                e = e.astype(INDEX_DTYPE)
            idx.append(e)
        return TensorRead(self, tuple(idx))

    def __repr__(self):
        return f"Tensor({self.name}, {self.shape}, {self.dtype})"

    __hash__ = object.__hash__


class TensorRead(Expr):
    __slots__ = ("tensor", "indices")

    def __init__(self, tensor: Tensor, indices: tuple):
        self.tensor, self.indices, self.dtype = tensor, indices, tensor.dtype

    def children(self):
        return self.indices

    def rebuild(self, kids):
        return TensorRead(self.tensor, tuple(kids))


class Reduce(Expr):
    """combiner(source over axes [where condition]); only allowed as the whole body of a compute."""

    __slots__ = ("combiner", "source", "axes", "where")

    def __init__(self, combiner, source, axes, where=None):
        self.combiner, self.source, self.axes, self.where = combiner, source, tuple(axes), where
        self.dtype = source.dtype

    def children(self):
        return (self.source,) if self.where is None else (self.source, self.where)

    def rebuild(self, kids):
        return Reduce(self.combiner, kids[0], self.axes, kids[1] if len(kids) > 1 else None)


_name_counter = itertools.count()


def _fresh(prefix: str) -> str:
    return f"{prefix}{next(_name_counter)}"


def _check_shape(shape, what):
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(shape)
    for d in shape:
        if not isinstance(d, int) or isinstance(d, bool) or d <= 0:
            raise ExprError(f"{what} shape must be positive integers, got {shape}")
    return shape


def placeholder(shape, dtype="float32", name=None) -> Tensor:
    """An input tensor of the operator."""
    return Tensor(PlaceholderOp(_check_shape(shape, "placeholder"), check_dtype(dtype), name or _fresh("placeholder")))


def reduce_axis(dom, name=None) -> ReduceAxis:
    """A reduction axis over `dom` = (lo, hi) or an extent."""
    lo, hi = (0, dom) if isinstance(dom, int) else dom
    if not all(isinstance(v, int) for v in (lo, hi)) or hi <= lo:
        raise ExprError(f"reduce_axis needs integer bounds lo < hi, got {dom!r}")
    return ReduceAxis(name or _fresh("rk"), lo, hi)


def compute(shape, fcompute, name=None, tag="", attrs=None) -> Tensor:
    """out[i...] = fcompute(i...); fcompute may return a reduction (sum/max/min) at the top."""
    shape = _check_shape(shape, "compute")
    name = name or _fresh("compute")
    params = list(inspect.signature(fcompute).parameters)
    if len(params) != len(shape) and not any(
            p.kind == inspect.Parameter.VAR_POSITIONAL for p in inspect.signature(fcompute).parameters.values()):
        raise ExprError(f"compute {name}: fcompute takes {len(params)} indices but the shape has {len(shape)}")
    names = params if len(params) == len(shape) else [f"i{d}" for d in range(len(shape))]
    axis = [IterVar(n, ext) for n, ext in zip(names, shape)]
    body = fcompute(*[a.var for a in axis])
    if isinstance(body, bool):
        raise DTypeError(f"compute {name}: the body is a Python bool, not an expression: "
                        "== and != on expressions compare object identity; use equal(a, b) / not_equal(a, b)")
    body = as_expr(body)
    if isinstance(body, Reduce):
        body = _normalize_reduce(body)
    return compute_from_axes(name, axis, body, tag, attrs)


def compute_from_axes(name: str, axis: list, body: Expr, tag: str = "", attrs=None) -> Tensor:
    """A compute over axes its caller made (one IterVar per dimension) and a body already in the
    form a ComputeOp holds: every reduce variable runs from 0 (a reduce axis's `lo` is already
    added where the body reads it). This is how a definition stored as data is rebuilt
    (compiler.serialize); `compute` is how one is written. Same checks as `compute`."""
    if isinstance(body, Reduce) and len({id(a) for a in body.axes}) != len(body.axes):
        raise ExprError(f"compute {name}: a reduce axis is listed twice")
    for n in walk(body.source if isinstance(body, Reduce) else body):
        if isinstance(n, Reduce):
            raise ExprError(f"compute {name}: a reduction must be the whole body, not nested inside it")
    _check_variables(body, axis, name)
    return Tensor(ComputeOp(name, tuple(a.extent for a in axis), axis, body, tag, attrs))


def _check_variables(body, axis, name: str):
    """Every variable of the body is an axis of this compute, or a reduce axis inside the
    reduction over it: anything else has no loop to take its value from."""
    own = {a.var for a in axis}
    reduced = {a.var for a in body.axes} if isinstance(body, Reduce) else set()
    for n in walk(body):
        if isinstance(n, Var) and n not in own | reduced:
            raise ExprError(
                f"compute {name}: {n.name} is not an axis of this compute; a reduce_axis can only "
                "be used inside the sum/max/min that reduces over it (axis=...), and the axes of "
                "another compute not at all")


def _normalize_reduce(body: Reduce) -> Reduce:
    """Shift reduce axes with lo != 0 so every loop variable starts at 0."""
    shift = {a.var: a.var + a.lo for a in body.axes if a.lo}
    if not shift:
        return body
    where = substitute(body.where, shift) if body.where is not None else None
    return Reduce(body.combiner, substitute(body.source, shift), body.axes, where)


def _reduce(combiner, expr, axis, where):
    axes = axis if isinstance(axis, (list, tuple)) else [axis]
    if not axes or not all(isinstance(a, ReduceAxis) for a in axes):
        raise ExprError(f"{combiner} needs one or more reduce_axis objects as axis")
    expr = as_expr(expr)
    if expr.dtype == "bool":
        raise DTypeError(f"{combiner} over bool values; cast them first")
    if isinstance(where, bool):
        raise DTypeError(f"{combiner} where= is a Python bool, not an expression: "
                        "== and != on expressions compare object identity; use equal(a, b) / not_equal(a, b)")
    if where is not None:
        where = as_expr(where)
        if where.dtype != "bool":
            raise DTypeError(f"{combiner} where= must be a bool condition, got {where.dtype}")
    return Reduce(combiner, expr, axes, where)


def sum(expr, axis, where=None) -> Reduce:  # noqa: A001 - the language's name for it
    """Sum of `expr` over the reduce axes `axis`."""
    return _reduce("sum", expr, axis, where)


def max(a, b=None, axis=None, where=None):  # noqa: A001
    """`max(expr, axis=k)` reduces; `max(a, b)` is the elementwise maximum."""
    if axis is not None:
        return _reduce("max", a, axis, where)
    return binary("max", a, b)


def min(a, b=None, axis=None, where=None):  # noqa: A001
    """`min(expr, axis=k)` reduces; `min(a, b)` is the elementwise minimum."""
    if axis is not None:
        return _reduce("min", a, axis, where)
    return binary("min", a, b)


def reduce_identity(combiner: str, dtype: str):
    """The value a reduction starts from."""
    if combiner == "sum":
        return 0.0 if is_float(dtype) else 0
    big = {"float32": float("inf"), "float64": float("inf"), "int8": 127,
           "int32": 2**31 - 1, "int64": 2**63 - 1}[dtype]
    if combiner == "min":
        return big
    return -big if is_float(dtype) else -big - 1


def topo_order(outputs) -> list:
    """Operations reachable from `outputs`, producers before consumers, in a deterministic order."""
    order, seen = [], set()

    def visit(t):
        if id(t.op) in seen:
            return
        seen.add(id(t.op))
        for inp in t.op.input_tensors():
            visit(inp)
        order.append(t.op)

    for t in outputs:
        visit(t)
    return order


__all__ = ["IterVar", "ReduceAxis", "Tensor", "TensorRead", "Reduce", "placeholder", "compute",
           "compute_from_axes", "reduce_axis", "sum", "max", "min", "topo_order"]
