"""The identity of a lowered loop program: two candidates with the same key compile to the same
kernel, so one build and one timing serve both.

Different candidates often lower to one program: a sketch's tile factor on an axis of extent 1,
an unroll limit above a loop's whole body, a crossover child equal to a parent in every knob that
reaches the loop nest. Their fingerprints (their JSON) differ, so the strategy's
never-twice rule does not see them; measuring each again spends a build and a timing on a
figure already known. The key is a digest of the program's structure: every statement and
expression with its kind, dtype, operator, extent, loop kind and constant, variables and buffers
numbered by first appearance (their names are left out: a name is not what the kernel does, and
two programs that differ only in names are the same kernel). A node kind this module does not
know makes the key None, and None never equals anything: an unknown program is never merged.
"""

from __future__ import annotations

import hashlib

from compiler.expr import Binary, Call, Cast, CheckedIndex, Compare, Const, Expr, Logical, Not, Select, Var
from compiler.loop_ir import Allocate, Buffer, For, IfThenElse, LetStmt, Load, LoweredFunc, Seq, Store


class _Unknown(Exception):
    """A node kind the key does not describe: no key for this program."""


class _Tokens:
    def __init__(self):
        self.out: list[str] = []
        self.vars: dict[int, int] = {}
        self.bufs: dict[int, int] = {}

    def var(self, v: Var) -> str:
        n = self.vars.setdefault(id(v), len(self.vars))
        return f"v{n}:{v.dtype}"

    def buf(self, b: Buffer) -> str:
        known = id(b) in self.bufs
        n = self.bufs.setdefault(id(b), len(self.bufs))
        return f"b{n}" if known else f"b{n}<{b.dtype}{b.shape}{b.scope}>"

    def expr(self, e: Expr) -> None:
        out = self.out
        stack = [e]
        while stack:
            n = stack.pop()
            if isinstance(n, Var):
                out.append(self.var(n))
                continue
            if isinstance(n, Const):
                out.append(f"c:{n.dtype}:{n.value!r}")
                continue
            if isinstance(n, (Binary, Compare, Logical)):
                out.append(f"{type(n).__name__}:{n.op}:{n.dtype}")
            elif isinstance(n, (Not, Select, Cast)):
                out.append(f"{type(n).__name__}:{n.dtype}")
            elif isinstance(n, Call):
                out.append(f"call:{n.func}:{n.dtype}:{len(n.args)}")
            elif isinstance(n, Load):
                out.append(f"ld:{self.buf(n.buffer)}:{n.dtype}")
            elif isinstance(n, CheckedIndex):
                out.append(f"chk:{n.lo}:{n.hi}:{n.site}:{int(n.wrap)}")
            else:
                raise _Unknown(type(n).__name__)
            stack.extend(reversed(n.children()))

    def stmt(self, s) -> None:
        out = self.out
        stack = [s]
        while stack:
            n = stack.pop()
            if n is None:
                out.append("none")
            elif isinstance(n, Seq):
                out.append(f"seq:{len(n.stmts)}")
                stack.extend(reversed(n.stmts))
            elif isinstance(n, For):
                out.append(f"for:{self.var(n.var)}:{n.extent}:{n.kind}")
                stack.append(n.body)
            elif isinstance(n, Store):
                out.append(f"st:{self.buf(n.buffer)}")
                self.expr(n.index)
                self.expr(n.value)
            elif isinstance(n, Allocate):
                out.append(f"alloc:{self.buf(n.buffer)}")
                stack.append(n.body)
            elif isinstance(n, IfThenElse):
                out.append(f"if:{n.else_ is not None}")
                self.expr(n.cond)
                stack.extend([n.else_, n.then] if n.else_ is not None else [n.then])
            elif isinstance(n, LetStmt):
                out.append(f"let:{self.var(n.var)}")
                self.expr(n.value)
                stack.append(n.body)
            else:
                raise _Unknown(type(n).__name__)


def program_key(func: LoweredFunc) -> str | None:
    """A digest of `func`'s structure (see the module docstring); None for a program with a node
    kind it does not describe."""
    t = _Tokens()
    try:
        for b in func.args:
            t.out.append(f"arg:{t.buf(b)}")
        t.stmt(func.body)
    except _Unknown:
        return None
    return hashlib.blake2b("\n".join(t.out).encode(), digest_size=16).hexdigest()


__all__ = ["program_key"]
