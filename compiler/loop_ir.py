"""The loop IR that schedules lower to: a handful of statement kinds, printable as pseudo-code.

Buffers are flat: every Load/Store takes one int64 element offset. Loops always start at 0.
"""

from __future__ import annotations

from .dtypes import nbytes
from .expr import Binary, Call, Cast, CheckedIndex, Compare, Const, Expr, Logical, Not, Select, Var, by_kind, fold

LOOP_KINDS = ("serial", "parallel", "vectorized", "unrolled")


class Buffer:
    """A flat memory region: an argument, a global temporary, or a local (per-loop) scratch."""

    def __init__(self, name: str, shape: tuple, dtype: str, scope: str):
        self.name, self.shape, self.dtype, self.scope = name, tuple(shape), dtype, scope

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.size * nbytes(self.dtype)

    def strides(self) -> list:
        out, acc = [], 1
        for d in reversed(self.shape):
            out.append(acc)
            acc *= d
        return out[::-1]

    def __repr__(self):
        return f"Buffer({self.name}, {self.shape}, {self.dtype}, {self.scope})"


class Load(Expr):
    __slots__ = ("buffer", "index")

    def __init__(self, buffer: Buffer, index: Expr):
        self.buffer, self.index, self.dtype = buffer, index, buffer.dtype

    def children(self):
        return (self.index,)

    def rebuild(self, kids):
        return Load(self.buffer, kids[0])


class Stmt:
    pass


class For(Stmt):
    def __init__(self, var: Var, extent: int, kind: str, body: Stmt):
        assert kind in LOOP_KINDS, kind
        self.var, self.extent, self.kind, self.body = var, extent, kind, body


class Store(Stmt):
    def __init__(self, buffer: Buffer, index: Expr, value: Expr):
        self.buffer, self.index, self.value = buffer, index, value


class Prefetch(Stmt):
    """A hint: start bringing the cache line that holds buffer[index] into the cache. Never
    faults (an index past the buffer is allowed) and changes no value; see Stage.prefetch."""

    def __init__(self, buffer: Buffer, index: Expr):
        self.buffer, self.index = buffer, index


class Allocate(Stmt):
    def __init__(self, buffer: Buffer, body: Stmt):
        self.buffer, self.body = buffer, body


class IfThenElse(Stmt):
    def __init__(self, cond: Expr, then: Stmt, else_: Stmt | None = None):
        self.cond, self.then, self.else_ = cond, then, else_


class LetStmt(Stmt):
    def __init__(self, var: Var, value: Expr, body: Stmt):
        self.var, self.value, self.body = var, value, body


class Seq(Stmt):
    stmts: list[Stmt]

    def __init__(self, stmts):
        flat: list[Stmt] = []
        for s in stmts:
            if isinstance(s, Seq):
                flat.extend(s.stmts)
            elif s is not None:
                flat.append(s)
        self.stmts = flat


def seq(stmts) -> Stmt:
    s = Seq(stmts)
    return s.stmts[0] if len(s.stmts) == 1 else s


class LoweredFunc:
    """A lowered kernel: its arguments (buffers, in call order) and body."""

    def __init__(self, name: str, args: list, body: Stmt):
        self.name, self.args, self.body = name, args, body

    def __str__(self):
        return format_func(self)


def stmt_children(s: Stmt) -> list:
    if isinstance(s, Seq):
        return list(s.stmts)
    if isinstance(s, (For, Allocate, LetStmt)):
        return [s.body]
    if isinstance(s, IfThenElse):
        return [s.then] + ([s.else_] if s.else_ is not None else [])
    return []


def stmt_exprs(s: Stmt) -> tuple:
    """The expressions statement `s` itself evaluates (not its children's): what a walk over a
    body's loads, variables or indices reads."""
    if isinstance(s, Store):
        return (s.index, s.value)
    if isinstance(s, Prefetch):
        return (s.index,)
    if isinstance(s, IfThenElse):
        return (s.cond,)
    if isinstance(s, LetStmt):
        return (s.value,)
    return ()


def walk_stmts(s: Stmt):
    stack = [s]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(stmt_children(n)))


# ----------------------------------------------------------------------------- printing

_SYM = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "floormod": "%",
        "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=", "and": "&&", "or": "||"}


def _const_text(c, kids) -> str:
    if c.dtype.startswith("float"):
        return f"{c.value!r}f" if c.dtype == "float32" else repr(c.value)
    return str(c.value).lower() if c.dtype == "bool" else str(c.value)


def _operator_text(n, kids) -> str:
    return f"({kids[0]} {_SYM[n.op]} {kids[1]})" if n.op in _SYM else f"{n.op}({kids[0]}, {kids[1]})"


FORMAT_TABLE = {
    Var: lambda n, k: n.name,
    Const: _const_text,
    Binary: _operator_text, Compare: _operator_text, Logical: _operator_text,
    Not: lambda n, k: f"!{k[0]}",
    Select: lambda n, k: f"select({k[0]}, {k[1]}, {k[2]})",
    Cast: lambda n, k: f"{n.dtype}({k[0]})",
    Call: lambda n, k: f"{n.func}({', '.join(k)})",
    Load: lambda n, k: f"{n.buffer.name}[{k[0]}]",
    CheckedIndex: lambda n, k: f"{'wrapped' if n.wrap else 'checked'}({k[0]} in [{n.lo}, {n.hi}))",
}
_FORMAT_VISIT = by_kind(FORMAT_TABLE, lambda n, k: f"<{type(n).__name__}>")


def format_expr(e: Expr) -> str:
    return fold(e, _FORMAT_VISIT)


def format_stmt(s: Stmt, indent: int = 0) -> str:
    pad = "  " * indent
    if isinstance(s, Seq):
        return "".join(format_stmt(x, indent) for x in s.stmts)
    if isinstance(s, For):
        kind = "" if s.kind == "serial" else f"{s.kind} "
        return f"{pad}{kind}for ({s.var.name}, 0, {s.extent}) {{\n{format_stmt(s.body, indent + 1)}{pad}}}\n"
    if isinstance(s, Store):
        return f"{pad}{s.buffer.name}[{format_expr(s.index)}] = {format_expr(s.value)}\n"
    if isinstance(s, Prefetch):
        return f"{pad}prefetch {s.buffer.name}[{format_expr(s.index)}]\n"
    if isinstance(s, Allocate):
        b = s.buffer
        return (f"{pad}allocate {b.name}[{b.dtype} * {'x'.join(map(str, b.shape))}], {b.scope}\n"
                f"{format_stmt(s.body, indent)}")
    if isinstance(s, IfThenElse):
        out = f"{pad}if ({format_expr(s.cond)}) {{\n{format_stmt(s.then, indent + 1)}{pad}}}"
        if s.else_ is not None:
            out += f" else {{\n{format_stmt(s.else_, indent + 1)}{pad}}}"
        return out + "\n"
    if isinstance(s, LetStmt):
        return f"{pad}let {s.var.name} = {format_expr(s.value)}\n{format_stmt(s.body, indent)}"
    return f"{pad}<{type(s).__name__}>\n"


def format_func(f: LoweredFunc) -> str:
    args = ", ".join(f"{b.name}: {b.dtype}[{', '.join(map(str, b.shape))}]" for b in f.args)
    return f"func {f.name}({args}) {{\n{format_stmt(f.body, 1)}}}\n"
