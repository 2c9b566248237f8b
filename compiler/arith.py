"""Integer index arithmetic: linear forms, range-aware simplification and interval bounds.

Index expressions after splits and layout changes look like `((jo*16 + ji) // 16, (jo*16 + ji) % 16)`.
Turning them back into `(jo, ji)` is what lets the code generator emit unit-stride vector loads, so
the simplifier works on linear forms `Σ coef·atom + const` and uses the loop ranges it is given.
Only `INDEX_DTYPE` expressions are linearized; other integer types keep their wrap-around semantics.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .expr import INDEX_DTYPE, Binary, Cast, CheckedIndex, Compare, Const, Expr, Logical, Not, Select, Var, children, rebuild, walk


class Lin:
    """Σ coef·atom + const over int64; atoms are Vars or non-linear sub-expressions. The terms
    dict (key -> (atom, coef)) is never changed once made, so forms share it freely."""

    __slots__ = ("terms", "const")

    def __init__(self, terms=None, const=0):
        self.terms = terms if terms is not None else {}
        self.const = const

    def add(self, other: "Lin", scale: int = 1) -> "Lin":
        const = self.const + other.const * scale
        if not other.terms:
            return Lin(self.terms, const)
        if not self.terms and scale == 1:
            return Lin(other.terms, const)
        terms = dict(self.terms)
        for k, (a, c) in other.terms.items():
            c *= scale
            old = terms.get(k)
            if old is not None:
                c += old[1]
                if c:
                    terms[k] = (old[0], c)
                else:
                    del terms[k]
            elif c:
                terms[k] = (a, c)
        return Lin(terms, const)

    def scale(self, s: int) -> "Lin":
        if s == 0:
            return Lin()
        if s == 1:
            return self
        return Lin({k: (a, c * s) for k, (a, c) in self.terms.items()}, self.const * s)

    def is_const(self) -> bool:
        return not self.terms

    def coef_of(self, var: Var) -> int:
        t = self.terms.get(var)
        return t[1] if t else 0


def struct_key(e: Expr):
    """A hashable key equal for structurally equal expressions (variables by identity)."""
    if isinstance(e, Var):
        return e
    if isinstance(e, Const):
        return ("c", e.value, e.dtype)
    head: tuple = (type(e).__name__, getattr(e, "op", None), getattr(e, "func", None), e.dtype,
            id(getattr(e, "buffer", None)) if hasattr(e, "buffer") else None)
    if type(e) is CheckedIndex:   # two checks of one value against other ranges are other atoms
        head += (e.lo, e.hi, e.site, e.wrap)
    return head + tuple(struct_key(c) for c in children(e))


def _atom(e: Expr) -> Lin:
    if isinstance(e, Const):
        return Lin({}, e.value)
    return Lin({struct_key(e): (e, 1)}, 0)


def expr_range(e: Expr, ranges: dict):
    """Inclusive integer range (lo, hi) of an int64 expression, or None when unknown."""
    return lin_range(to_lin(e, ranges), ranges)


def lin_range(lin: Lin, ranges: dict):
    lo = hi = lin.const
    for atom, c in lin.terms.values():
        r = _atom_range(atom, ranges)
        if r is None:
            return None
        a, b = (r[0] * c, r[1] * c) if c > 0 else (r[1] * c, r[0] * c)
        lo += a
        hi += b
    return lo, hi


def _atom_range(atom: Expr, ranges: dict):
    if isinstance(atom, Var):
        return ranges.get(atom)
    if isinstance(atom, CheckedIndex):   # the kernel stops where it is not in [lo, hi)
        return atom.result_range
    if isinstance(atom, Binary):
        if atom.op in ("floordiv", "floormod") and isinstance(atom.b, Const) and atom.b.value > 0:
            c = atom.b.value
            r = expr_range(atom.a, ranges)
            if atom.op == "floordiv":
                return None if r is None else (r[0] // c, r[1] // c)
            if r is not None and r[0] // c == r[1] // c:
                return (r[0] % c, r[1] % c)
            return (0, c - 1)
        ra, rb = expr_range(atom.a, ranges), expr_range(atom.b, ranges)
        if ra is None or rb is None:
            return None
        if atom.op == "min":
            return (min(ra[0], rb[0]), min(ra[1], rb[1]))
        if atom.op == "max":
            return (max(ra[0], rb[0]), max(ra[1], rb[1]))
        if atom.op == "mul":
            prods = [x * y for x in ra for y in rb]
            return (min(prods), max(prods))
    if isinstance(atom, Select):
        rt, rf = expr_range(atom.t, ranges), expr_range(atom.f, ranges)
        if rt is None or rf is None:
            return None
        return (min(rt[0], rf[0]), max(rt[1], rf[1]))
    return None


def to_lin(e: Expr, ranges: dict) -> Lin:
    """Linear form of an int64 expression, simplifying floordiv/floormod with the known ranges
    (a Lin is never changed once made: forms share their terms)."""
    if type(e) is Const:
        return Lin({}, e.value)
    t = type(e)
    if t is Var:
        r = ranges.get(e)
        if r is not None and r[0] == r[1]:  # a loop of one iteration: its variable is a constant
            return Lin({}, r[0])
        return Lin({e: (e, 1)}, 0)
    return _to_lin(e, t, ranges)


def _to_lin(e: Any, t: type, ranges: dict) -> Lin:   # e: a node of kind t (Binary, Cast, ...)
    if t is Binary and e.dtype == INDEX_DTYPE:
        op = e.op
        if op == "add" or op == "sub":
            lin = to_lin(e.a, ranges).add(to_lin(e.b, ranges), 1 if op == "add" else -1)
            return _recombine_divmod(lin, ranges) if len(lin.terms) > 1 else lin
        if op == "mul":
            la, lb = to_lin(e.a, ranges), to_lin(e.b, ranges)
            if not la.terms:
                return lb.scale(la.const)
            if not lb.terms:
                return la.scale(lb.const)
            return _atom(Binary("mul", from_lin(la), from_lin(lb), e.dtype))
        if op == "floordiv" or op == "floormod":
            lb = to_lin(e.b, ranges)
            if not lb.terms and lb.const > 0:
                return _divmod(op, to_lin(e.a, ranges), lb.const, ranges)
            return _atom(Binary(op, from_lin(to_lin(e.a, ranges)), from_lin(lb), e.dtype))
        if op == "min" or op == "max":
            la, lb = to_lin(e.a, ranges), to_lin(e.b, ranges)
            r = lin_range(la.add(lb, -1), ranges)
            if r is not None:
                if r[1] <= 0:
                    return la if op == "min" else lb
                if r[0] >= 0:
                    return lb if op == "min" else la
            return _atom(Binary(op, from_lin(la), from_lin(lb), e.dtype))
    if t is Cast and e.dtype == INDEX_DTYPE and e.value.dtype in ("int32", "int8"):
        inner = simplify(e.value, ranges)
        if isinstance(inner, Const):
            return Lin({}, inner.value)
        return _atom(Cast(e.dtype, inner))
    if e.dtype != INDEX_DTYPE:
        raise TypeError(f"to_lin on a {e.dtype} expression")
    return _atom(simplify(e, ranges))


def _recombine_divmod(lin: Lin, ranges: dict) -> Lin:
    """m·c·(x // c) + m·(x % c) is m·x, whatever the sign of x (floor division). A channel index
    split into (block, lane) and joined again, `(k // 16) * 16 + k % 16`, then reads as k, so a
    guard on k bounds it (a concat's part read through a layout copy: k = c - 24 >= 0)."""
    mods = {}
    for k, (a, coef) in lin.terms.items():
        if type(a) is Binary and a.op == "floormod" and type(a.b) is Const:
            mods[(struct_key(a.a), a.b.value)] = (k, coef)
    if not mods:
        return lin
    for k, (a, coef) in list(lin.terms.items()):
        if type(a) is not Binary or a.op != "floordiv" or type(a.b) is not Const or k not in lin.terms:
            continue
        hit = mods.get((struct_key(a.a), a.b.value))
        if hit is None or hit[0] not in lin.terms or coef != hit[1] * a.b.value:
            continue
        lin = Lin({kk: v for kk, v in lin.terms.items() if kk not in (k, hit[0])}, lin.const).add(to_lin(a.a, ranges), hit[1])
    return lin


def _divmod(op: str, la: Lin, c: int, ranges: dict) -> Lin:
    """floor(la / c) or la mod c, pulling out the part of la that is a multiple of c."""
    q_terms, r_terms = {}, {}
    for k, (a, coef) in la.terms.items():
        if coef % c == 0:
            q_terms[k] = (a, coef // c)
        else:
            r_terms[k] = (a, coef)
    qc, rc = divmod(la.const, c)
    rest = Lin(r_terms, rc)
    r = lin_range(rest, ranges)
    if r is not None and r[0] // c == r[1] // c:
        m = r[0] // c
        if op == "floordiv":
            return Lin(q_terms, qc + m)
        return rest.add(Lin({}, -m * c))
    if rest.is_const():
        return Lin(q_terms, qc + rest.const // c) if op == "floordiv" else Lin({}, rest.const % c)
    nested = _divmod_by_part(op, rest, c, ranges)
    if nested is not None:
        return Lin(q_terms, qc).add(nested) if op == "floordiv" else nested
    atom = _atom(Binary(op, from_lin(rest), Const(c, INDEX_DTYPE), INDEX_DTYPE))
    if op == "floordiv":
        return Lin(q_terms, qc).add(atom)
    return atom


def _divmod_by_part(op: str, rest: Lin, c: int, ranges: dict) -> Lin | None:
    """floor(rest / c) or rest mod c when rest = m·A + S with m a divisor of c, every term of A a
    multiple of m and S within one block of m (m·q0 <= S < m·q0 + m): floor(rest / c) is then
    floor((A + q0) / (c/m)), the part S drops out. A vector of 8 lanes of a group of 16,
    `(8·fo + fi) // 16` with fi in [0, 8), is `fo // 2`: one value across the vector's lanes
    (a grouped convolution's input channel, schedule_tile.tile_group). None otherwise."""
    for m in range(c // 2, 1, -1):
        if c % m:
            continue
        a_terms = {k: (a, coef // m) for k, (a, coef) in rest.terms.items() if coef % m == 0}
        if not a_terms or len(a_terms) == len(rest.terms):
            continue
        part = Lin({k: t for k, t in rest.terms.items() if k not in a_terms}, rest.const)
        r = lin_range(part, ranges)
        if r is None or r[0] // m != r[1] // m:
            continue
        q0 = r[0] // m
        inner = _divmod(op, Lin(a_terms, q0), c // m, ranges)
        if op == "floordiv":
            return inner
        return inner.scale(m).add(part).add(Lin({}, -m * q0))
    return None


def from_lin(lin: Lin) -> Expr:
    """Back to an expression tree; terms with positive coefficients first for readable output."""
    items = sorted(lin.terms.values(), key=lambda t: t[1] < 0)
    out = None
    for atom, c in items:
        if out is None:
            term = atom if c == 1 else Binary("mul", atom, Const(c, INDEX_DTYPE), INDEX_DTYPE)
            out = term if c > 0 else Binary("mul", atom, Const(c, INDEX_DTYPE), INDEX_DTYPE)
            continue
        mag = abs(c)
        term = atom if mag == 1 else Binary("mul", atom, Const(mag, INDEX_DTYPE), INDEX_DTYPE)
        out = Binary("add" if c > 0 else "sub", out, term, INDEX_DTYPE)
    if out is None:
        return Const(lin.const, INDEX_DTYPE)
    if lin.const:
        out = Binary("add" if lin.const > 0 else "sub", out, Const(abs(lin.const), INDEX_DTYPE), INDEX_DTYPE)
    return out


# ----------------------------------------------------------------------------- general simplify

_CMP = {"lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
        "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b}


def simplify(e: Expr, ranges: dict | None = None) -> Expr:
    """Fold constants, normalize index arithmetic, decide comparisons the ranges settle.
    Dispatches on the node's kind through `_SIMPLIFY` (kinds it lacks, Load and Call: children
    simplified, the node rebuilt when one changed)."""
    return _SIMPLIFY.get(type(e), _simplify_children)(e, ranges if ranges is not None else {})


def _leaf(e: Expr, ranges) -> Expr:
    return e


def _simplify_children(e: Expr, ranges) -> Expr:
    kids = children(e)
    new = tuple(simplify(k, ranges) for k in kids)
    if any(n is not k for n, k in zip(new, kids)):
        return rebuild(e, new)
    return e


def _simplify_binary(e: Binary, ranges) -> Expr:
    if e.dtype == INDEX_DTYPE:
        return from_lin(to_lin(e, ranges))
    a, b = simplify(e.a, ranges), simplify(e.b, ranges)
    if isinstance(a, Const) and isinstance(b, Const):
        folded = _fold_binary(e.op, a.value, b.value, e.dtype)
        if folded is not None:
            return Const(folded, e.dtype)
    return e if a is e.a and b is e.b else rebuild(e, (a, b))


def _simplify_cast(e: Cast, ranges) -> Expr:
    if e.dtype == INDEX_DTYPE and e.value.dtype in ("int32", "int8"):
        return from_lin(to_lin(e, ranges))   # (a cast from float/bool is not linear: folded below)
    v = simplify(e.value, ranges)
    if isinstance(v, Const):
        return Const(_cast_value(v.value, e.dtype), e.dtype)
    return e if v is e.value else rebuild(e, (v,))


def _simplify_logical(e: Logical, ranges) -> Expr:
    a, b = simplify(e.a, ranges), simplify(e.b, ranges)
    for x, y in ((a, b), (b, a)):
        if isinstance(x, Const):
            if e.op == "and":
                return y if x.value else Const(False, "bool")
            return Const(True, "bool") if x.value else y
    return Logical(e.op, a, b)


def _simplify_not(e: Not, ranges) -> Expr:
    a = simplify(e.a, ranges)
    return Const(not a.value, "bool") if isinstance(a, Const) else Not(a)


def _simplify_select(e: Select, ranges) -> Expr:
    cond = simplify(e.cond, ranges)
    if isinstance(cond, Const):   # only the branch taken is simplified
        return simplify(e.t if cond.value else e.f, ranges)
    return Select(cond, simplify(e.t, ranges), simplify(e.f, ranges))


def _simplify_compare(e: Compare, ranges) -> Expr:
    a, b = simplify(e.a, ranges), simplify(e.b, ranges)
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(_CMP[e.op](a.value, b.value), "bool")
    if a.dtype == INDEX_DTYPE:
        d = to_lin(a, ranges).add(to_lin(b, ranges), -1)
        r = lin_range(d, ranges)
        if r is not None:
            lo, hi = r
            verdict = {"lt": (hi < 0, lo >= 0), "le": (hi <= 0, lo > 0), "gt": (lo > 0, hi <= 0),
                       "ge": (lo >= 0, hi < 0), "eq": (lo == hi == 0, lo > 0 or hi < 0),
                       "ne": (lo > 0 or hi < 0, lo == hi == 0)}[e.op]
            if verdict[0]:
                return Const(True, "bool")
            if verdict[1]:
                return Const(False, "bool")
        return Compare(e.op, from_lin(Lin(d.terms, 0)), Const(-d.const, INDEX_DTYPE))
    return Compare(e.op, a, b)


def _simplify_checked(e: CheckedIndex, ranges) -> Expr:
    """The check dropped where the ranges prove the value inside [lo, hi) (a constant index),
    and with a wrap, on one side of 0."""
    v = simplify(e.value, ranges)
    r = expr_range(v, ranges)
    if r is not None and e.lo <= r[0] and r[1] < e.hi and (not e.wrap or r[0] >= 0):
        return v
    if r is not None and e.lo <= r[0] and r[1] < 0 and e.wrap:
        return simplify(Binary("add", v, Const(e.hi, INDEX_DTYPE), INDEX_DTYPE), ranges)
    return e if v is e.value else CheckedIndex(v, e.lo, e.hi, e.site, e.wrap)


def _check_keys(e: Expr) -> set:
    """The run-time index checks in `e` (expr.CheckedIndex), by what they check and where."""
    found, stack = set(), [e]
    while stack:
        n = stack.pop()
        if type(n) is CheckedIndex:
            found.add((n.site, n.lo, n.hi, n.wrap))
        stack.extend(children(n))
    return found


def _keeps_checks(rule: Callable[[Any, dict], Expr]) -> Callable[[Any, dict], Expr]:
    """`rule`, except where its result would lose a run-time index check of the expression: then
    only the children are simplified. A rule may decide what a checked index's range settles (a
    comparison of an index into a one-element axis with 0, `i % 1`, a term that cancels), but the
    check itself is what stops a bad index: dropping it let ScatterND write index 1 of a
    one-element axis into element 0."""
    def guarded(e, ranges) -> Expr:
        out = rule(e, ranges)
        if out is e:
            return out
        checks = _check_keys(e)
        if not checks or checks <= _check_keys(out):
            return out
        return _simplify_children(e, ranges)
    guarded.__doc__ = rule.__doc__
    return guarded


_SIMPLIFY: dict[type, Callable[[Any, dict], Expr]] = {
    Var: _leaf, Const: _leaf, Binary: _keeps_checks(_simplify_binary), Cast: _simplify_cast,
    Compare: _keeps_checks(_simplify_compare), Logical: _keeps_checks(_simplify_logical),
    Not: _simplify_not, Select: _keeps_checks(_simplify_select), CheckedIndex: _simplify_checked}


def _cast_value(v, dtype):
    """Constant folding with the generated code's semantics: int -> int wraps, float -> int
    truncates and saturates with NaN giving 0 (codegen's llvm.fptosi.sat)."""
    if dtype == "bool":
        return bool(v)
    if dtype.startswith("int"):
        bits = int(dtype[3:])
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        if isinstance(v, float):
            if math.isnan(v):
                return 0
            return hi if v >= hi else lo if v <= lo else math.trunc(v)
        v = int(v) & ((1 << bits) - 1)
        return v - (1 << bits) if v > hi else v
    return float(v)


def _fold_binary(op, a, b, dtype):
    try:
        if op == "add":
            v = a + b
        elif op == "sub":
            v = a - b
        elif op == "mul":
            v = a * b
        elif op == "div":
            v = a / b
        elif op == "floordiv":
            v = a // b
        elif op == "floormod":
            v = a % b
        elif op == "min":
            v = min(a, b)
        elif op == "max":
            v = max(a, b)
        elif op == "pow":
            v = a ** b
        else:
            return None
    except (ZeroDivisionError, OverflowError, ValueError):
        return None
    return _cast_value(v, dtype) if dtype.startswith("int") else float(v)


def prove(cond: Expr, ranges: dict) -> bool:
    """True when the ranges show `cond` always holds."""
    s = simplify(cond, ranges)
    return isinstance(s, Const) and bool(s.value)


# ----------------------------------------------------------------------------- bounds

def bound(e: Expr, relax: dict, ranges: dict) -> tuple[Lin, Lin] | None:
    """(lo, hi) Lin forms of `e` when the vars in `relax` (Var -> (lo, hi)) take every value.

    Other variables stay symbolic. Returns None when a relaxed variable sits inside something
    non-monotonic the analysis cannot bound.
    """
    all_ranges = dict(ranges)
    all_ranges.update(relax)
    lin = to_lin(e, all_ranges) if e.dtype == INDEX_DTYPE else None
    if lin is None:
        return None
    lo, hi = Lin({}, lin.const), Lin({}, lin.const)
    for atom, c in lin.terms.values():
        r = _atom_bound(atom, relax, ranges)
        if r is None:
            return None
        alo, ahi = r
        if c > 0:
            lo, hi = lo.add(alo, c), hi.add(ahi, c)
        else:
            lo, hi = lo.add(ahi, c), hi.add(alo, c)
    return lo, hi


def _mentions(e: Expr, vars_) -> bool:
    if isinstance(e, Var):
        return e in vars_
    return any(_mentions(c, vars_) for c in children(e))


def _atom_bound(atom: Expr, relax: dict, ranges: dict) -> tuple[Lin, Lin] | None:
    if not _mentions(atom, relax):
        lin = _atom(atom)
        return lin, lin
    if isinstance(atom, Var):
        lo, hi = relax[atom]
        return Lin({}, lo), Lin({}, hi)
    if isinstance(atom, CheckedIndex):
        lo, hi = atom.result_range
        return Lin({}, lo), Lin({}, hi)
    if isinstance(atom, Binary) and isinstance(atom.b, Const) and atom.op in ("floordiv", "floormod"):
        c = atom.b.value
        inner = bound(atom.a, relax, ranges)
        if inner is None:
            return None
        lo, hi = inner
        if atom.op == "floordiv":
            return _divmod("floordiv", lo, c, ranges), _divmod("floordiv", hi, c, ranges)
        return Lin({}, 0), Lin({}, c - 1)
    if isinstance(atom, Binary) and atom.op in ("min", "max"):
        ba, bb = bound(atom.a, relax, ranges), bound(atom.b, relax, ranges)
        if ba is None or bb is None:
            return None
        pick = lin_min if atom.op == "min" else lin_max
        return pick(ba[0], bb[0], ranges), pick(ba[1], bb[1], ranges)
    if isinstance(atom, Select):
        bt, bf = bound(atom.t, relax, ranges), bound(atom.f, relax, ranges)
        if bt is None or bf is None:
            return None
        return lin_min(bt[0], bf[0], ranges), lin_max(bt[1], bf[1], ranges)
    return None


def lin_min(a: Lin, b: Lin, ranges) -> Lin:
    """min(a, b): one of them where their difference's range (over `ranges`) decides it, else
    a min atom (a bound of a region lowering takes the tighter of two access bounds)."""
    r = lin_range(a.add(b, -1), ranges)
    if r is not None and r[1] <= 0:
        return a
    if r is not None and r[0] >= 0:
        return b
    return _atom(Binary("min", from_lin(a), from_lin(b), INDEX_DTYPE))


def lin_max(a: Lin, b: Lin, ranges) -> Lin:
    """max(a, b), as lin_min."""
    r = lin_range(a.add(b, -1), ranges)
    if r is not None and r[1] <= 0:
        return b
    if r is not None and r[0] >= 0:
        return a
    return _atom(Binary("max", from_lin(a), from_lin(b), INDEX_DTYPE))



def substitute_var(e: Expr, var: Var, value: Expr, ranges: dict) -> Expr:
    """`e` with `var` replaced by `value`, simplified."""
    from .expr import substitute
    return simplify(substitute(e, {var: value}), ranges)


def unit_step(index: Expr, var: Var, ranges: dict | None = None) -> bool:
    """Whether the index expression `index` is `var` + terms without it: consecutive values of
    `var` read consecutive elements along that index (`ranges`: the loop variables' bounds, as
    to_lin takes them, which simplify `(16 * x + lane) // 16` and the like)."""
    lin = to_lin(index, ranges or {})
    return lin.coef_of(var) == 1 and not any(a is not var and var in walk(a) for a, _ in lin.terms.values())
