"""Reads never leave their tensor: every index of every read is bounded before code is made.

For each read of a stage body (inlined producers already substituted), the index range follows
from the axis ranges and from the conditions guarding the read: the condition of an enclosing
`if_then_else` (its negation for the else branch) and a reduction's `where`. A guard `G >= 0`
bounds an index `I` by `I >= min(I - G)` and `I <= max(I + G)`, which is how
`if_then_else(h >= 1, A[h - 1], 0)` is proven in bounds.

- provably inside: nothing to do;
- provably able to leave the tensor: LoweringError naming the stage, the tensor and the index;
- unknown (an index computed from tensor data, a gather): checked at run time
  (`expr.checked_index` against [0, dim)): a kernel that meets an index outside its tensor
  stops and the call raises KernelRuntimeError naming the stage, the read and the value. It
  used to be clamped (numpy's `take(mode="clip")`), which never read outside a buffer but gave
  an embedding lookup of id 10^9 the last row, silently.
"""

from __future__ import annotations

from . import arith
from .errors import LoweringError
from .expr import INDEX_DTYPE, Binary, Compare, Const, Logical, Not, Select, by_kind, checked_index, children, fold, rebuild
from .loop_ir import FORMAT_TABLE, format_expr
from .tensor import Reduce, TensorRead

_NEGATED = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}


def checked_body(stage_name: str, body, ranges: dict):
    """`body` with data-dependent indices checked at run time; LoweringError for a read that can
    leave its tensor. `ranges`: Var -> (lo, hi) of the stage's axes and reduce axes."""
    checker = _Checker(stage_name, ranges)
    if isinstance(body, Reduce):
        where = checker.visit(body.where, ()) if body.where is not None else None
        guards = _conjuncts(body.where, ranges) if body.where is not None else ()
        return Reduce(body.combiner, checker.visit(body.source, guards), body.axes, where)
    return checker.visit(body, ())


class _Checker:
    def __init__(self, stage_name: str, ranges: dict):
        self.stage_name = stage_name
        self.ranges = ranges

    def visit(self, e, guards: tuple):
        if isinstance(e, Logical):  # codegen evaluates b only where a decides nothing yet
            a = self.visit(e.a, guards)
            b = self.visit(e.b, guards + (_conjuncts(e.a, self.ranges) if e.op == "and"
                                          else _negated(e.a, self.ranges)))
            return e if a is e.a and b is e.b else Logical(e.op, a, b)
        if isinstance(e, Select):
            cond = self.visit(e.cond, guards)
            t = self.visit(e.t, guards + _conjuncts(e.cond, self.ranges))
            f = self.visit(e.f, guards + _negated(e.cond, self.ranges))
            if cond is e.cond and t is e.t and f is e.f:
                return e
            return Select(cond, t, f)
        kids = children(e)
        new = tuple(self.visit(k, guards) for k in kids)
        if any(n is not k for n, k in zip(new, kids)):
            e = rebuild(e, new)
        if isinstance(e, TensorRead):
            e = self._checked_read(e, guards)
        return e

    def _checked_read(self, read: TensorRead, guards: tuple):
        indices = list(read.indices)
        for d, (idx, dim) in enumerate(zip(indices, read.tensor.shape)):
            r = self._index_range(idx, guards)
            if r is None:
                where = ", ".join(fold(i, _SITE_TEXT) for i in read.indices)
                indices[d] = checked_index(idx, 0, dim, f"{self.stage_name}: {read.tensor.name}[{where}] dimension {d}"[:200])
            elif r[0] < 0 or r[1] > dim - 1:
                raise LoweringError(
                    f"{self.stage_name}: the read {read.tensor.name}[{', '.join(format_expr(i) for i in read.indices)}] "
                    f"can leave the tensor: its index {format_expr(idx)} in dimension {d} takes values {r[0]}..{r[1]}, "
                    f"but {read.tensor.name} has {dim} there; guard the read with if_then_else(...) "
                    "or change the compute's shape")
        if all(a is b for a, b in zip(indices, read.indices)):
            return read
        return TensorRead(read.tensor, tuple(indices))

    def _index_range(self, idx, guards: tuple):
        ranges = _narrowed(self.ranges, guards)
        if ranges is None:
            return (0, 0)  # the guards never hold together: the read never happens
        if isinstance(idx, Binary) and idx.op == "floordiv" and isinstance(idx.b, Const) and idx.b.value > 0:
            inner = self._index_range(idx.a, guards)  # (r_o*16 + r_i) // 2 under r_o*16 + r_i < 36
            by_inner = None if inner is None else (inner[0] // idx.b.value, inner[1] // idx.b.value)
            # a guard on the quotient itself (a blocked concat read back as NCHW: c // 16 < 16)
            by_guards = self._linear_range(idx, guards, ranges)
            if by_inner is None or by_guards is None:
                return by_inner or by_guards
            return max(by_inner[0], by_guards[0]), min(by_inner[1], by_guards[1])
        if isinstance(idx, Binary) and idx.op in ("min", "max") and idx.dtype == INDEX_DTYPE:
            a, b = self._index_range(idx.a, guards), self._index_range(idx.b, guards)  # max(j - 1, 0) under j < 16
            if a is None or b is None:
                return None
            pick = min if idx.op == "min" else max
            by_arms = pick(a[0], b[0]), pick(a[1], b[1])
            # a guard on the min itself (a Concat's branch test on ToNCHWc's clamped channel min(c, C - 1))
            by_guards = self._linear_range(idx, guards, ranges)
            if by_guards is None:
                return by_arms
            return max(by_arms[0], by_guards[0]), min(by_arms[1], by_guards[1])
        return self._linear_range(idx, guards, ranges)

    @staticmethod
    def _linear_range(idx, guards: tuple, ranges: dict):
        """The index's range from the variables' ranges, narrowed by each guard G >= 0."""
        base = arith.expr_range(idx, ranges)
        if base is None:
            return None
        lo, hi = base
        lin = arith.to_lin(idx, ranges)
        for g in guards:
            for scale in _scales(lin, g):  # I = s·G + R with G >= 0: s > 0 bounds I below, s < 0 above
                r = arith.lin_range(lin.add(g, -scale), ranges)
                if r is None:
                    continue
                if scale > 0:
                    lo = max(lo, r[0])
                else:
                    hi = min(hi, r[1])
        return lo, hi


def _scales(lin, g) -> set:
    """Integer factors s worth trying in I - s·G: ±1, and every ratio of a coefficient of I to
    the same atom's in G that is a whole number (I = 2i + 1 under i <= 2 gives s = -2)."""
    out = {1, -1}
    for key, (_, c) in g.terms.items():
        ci = lin.terms.get(key)
        if ci is not None and ci[1] % c == 0:
            out.add(ci[1] // c)
    out.discard(0)
    return out


def _narrowed(ranges: dict, guards: tuple):
    """The variable ranges with every single-variable guard (c·v + k >= 0, or c·(v // b) + k >= 0)
    applied; None when some range becomes empty."""
    out = dict(ranges)
    for g in guards:
        if len(g.terms) != 1:
            continue
        ((atom, c),) = g.terms.values()
        block = 1
        if (isinstance(atom, Binary) and atom.op == "floordiv" and isinstance(atom.b, Const)
                and atom.b.value > 0 and atom.a in out):
            # a guard on a block number bounds the variable itself: c // 8 >= 6 is c >= 48 (a
            # Concat's branch test on a channel block, read back through a clamp of the channel)
            block = atom.b.value
            atom = atom.a
        if atom not in out:
            continue
        lo, hi = out[atom]
        if c > 0:
            lo = max(lo, -(g.const // c) * block)              # v // b >= ceil(-k / c)
        else:
            hi = min(hi, (g.const // -c) * block + block - 1)  # v // b <= floor(k / -c)
        if lo > hi:
            return None
        out[atom] = (lo, hi)
    return out


# a read's indices as the runtime's message shows them: tensor reads by name (idx[i])
_SITE_TEXT = by_kind({**FORMAT_TABLE, TensorRead: lambda n, k: f"{n.tensor.name}[{', '.join(k)}]"},
                     lambda n, k: f"<{type(n).__name__}>")


def _conjuncts(cond, ranges: dict) -> tuple:
    """Linear forms G with G >= 0 implied by `cond` (the index comparisons of a conjunction)."""
    if isinstance(cond, Logical) and cond.op == "and":
        return _conjuncts(cond.a, ranges) + _conjuncts(cond.b, ranges)
    if isinstance(cond, Not):
        return _negated(cond.a, ranges)
    if not isinstance(cond, Compare) or cond.a.dtype != INDEX_DTYPE:
        return ()
    a, b = arith.to_lin(cond.a, ranges), arith.to_lin(cond.b, ranges)
    diff = a.add(b, -1)  # a - b
    return {"ge": (diff,), "gt": (diff.add(arith.Lin({}, 1), -1),),
            "le": (diff.scale(-1),), "lt": (diff.scale(-1).add(arith.Lin({}, 1), -1),),
            "eq": (diff, diff.scale(-1)), "ne": ()}[cond.op]


def _negated(cond, ranges: dict) -> tuple:
    """What the else branch of `if_then_else(cond, ...)` knows."""
    if isinstance(cond, Compare):
        return _conjuncts(Compare(_NEGATED[cond.op], cond.a, cond.b), ranges)
    if isinstance(cond, Not):
        return _conjuncts(cond.a, ranges)
    if isinstance(cond, Logical) and cond.op == "or":
        return _negated(cond.a, ranges) + _negated(cond.b, ranges)
    return ()


__all__ = ["checked_body"]
