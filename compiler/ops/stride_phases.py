"""The `stride_phases` rewrite: a sum over a zero-stuffed input computed by its dense phases.

A transposed convolution, a strided upsampling followed by a filter, a dilated read: written the
way a user writes them, the reduction reads a data-movement stage (a padding, a zero-stuffing)
whose value is `select(cond, X[...], 0)` with a stride test in `cond`, `(y + ry - p) % s == 0`:
for a given output position only every s-th tap is non-zero. Computed as written, (s-1)/s of
the multiply-adds per such axis multiply by a known zero (a stride-2 2-D transposed convolution:
3 in 4), and every read pays the test.

The rewrite (compiler/rewrite.py, `Schedule.rewrite(t, "stride_phases")`) takes any sum whose
summand is a product with such a factor, after its data-movement producers are substituted into
it (stages whose bodies only select and read: paddings, zero-stuffings, slices). A stride test on
`a·v + b·r + c` (v an output axis, r a reduce axis, a and b ±1, s a constant) splits v into its s
phases, v = s·q + φ, and for each phase keeps only the residue of r the test lets through,
r = s·t + ρ(φ), ρ = -b·(a·φ + c) mod s. Each combination of phases is one stage over the
phase's output points and the remaining taps: a dense reduction whose reads, once the phase is a
constant, simplify to plain affine indices (the `// s` and the test fold away). The output
interleaves the phase stages by `v % s`. This is compiler/graph's conv_transpose_to_conv (phase
weights of a constant ConvTranspose) for any DAG, with the weights read in place, so they may be
inputs of the kernel.

`stride_phase_plan(op)` says whether (and on which axes) a stage takes the rewrite; the default
schedules of custom DAGs (compiler/ops/schedule_rules.py) apply it and offer it to the search as a
knob of their recipe.
"""

from __future__ import annotations

import itertools
import math

from ..arith import Lin, from_lin, lin_range, simplify, to_lin
from ..errors import ScheduleError
from ..expr import INDEX_DTYPE, Binary, Cast, Compare, Const, Expr, Logical, Select, Var, substitute, transform, walk
from ..rewrite import register_rewrite
from ..tensor import ComputeOp, IterVar, Reduce, TensorRead, compute_from_axes, reduce_axis

MAX_PHASES = 64       # phase stages one rewrite may make (s^d)


def is_data_movement(op) -> bool:
    """Whether a stage only moves values: its body selects between reads and constants (a padding,
    a zero-stuffing, a slice, a transposition), no arithmetic on values."""
    if not isinstance(op, ComputeOp) or isinstance(op.body, Reduce):
        return False

    def value_only(e) -> bool:
        if isinstance(e, (TensorRead, Const)):
            return True
        if isinstance(e, Select):
            return value_only(e.t) and value_only(e.f)
        if isinstance(e, Cast):
            return value_only(e.value)
        return False
    return value_only(op.body) and any(isinstance(n, Select) for n in walk(op.body))


def expand_data_movement(e):
    """`e` with the data-movement stages it reads substituted in, recursively."""
    def fn(n):
        if isinstance(n, TensorRead) and is_data_movement(n.tensor.op):
            op = n.tensor.op
            assert isinstance(op, ComputeOp)   # is_data_movement says so; narrows the type
            mapping = {ax.var: idx for ax, idx in zip(op.axis, n.indices)}
            return expand_data_movement(substitute(op.body, mapping))
        return None
    return transform(e, fn)


def _conjuncts(cond) -> list:
    if isinstance(cond, Logical) and cond.op == "and":
        return _conjuncts(cond.a) + _conjuncts(cond.b)
    return [cond]


def _stride_test(c):
    """(e, s) when `c` is `e % s == 0` (either side), s a constant >= 2; else None."""
    if not isinstance(c, Compare) or c.op != "eq":
        return None
    for a, b in ((c.a, c.b), (c.b, c.a)):
        if (isinstance(b, Const) and b.value == 0 and isinstance(a, Binary) and a.op == "floormod"
                and isinstance(a.b, Const) and a.b.value >= 2):
            return a.a, int(a.b.value)
    return None


def _factors(e) -> list:
    """The multiplicative factors of a product (through casts of a factor)."""
    if isinstance(e, Binary) and e.op == "mul":
        return _factors(e.a) + _factors(e.b)
    return [e]


def _is_zero(e) -> bool:
    return isinstance(e, Const) and e.value == 0


def stride_phase_plan(op) -> list | None:
    """[(output axis position, reduce axis position, s, a, b, c)] of the stride tests the rewrite
    splits, or None when `op` does not take it: a sum whose summand (data movement substituted)
    has a factor select(cond, x, 0) with `(a·v + b·r + c) % s == 0` among cond's conjuncts."""
    if not isinstance(op, ComputeOp) or not isinstance(op.body, Reduce) or op.body.combiner != "sum":
        return None
    if op.body.where is not None:
        return None
    source = expand_data_movement(op.body.source)
    spatial = {ax.var: d for d, ax in enumerate(op.axis)}
    reduced = {ax.var: d for d, ax in enumerate(op.reduce_axis)}
    plan: dict = {}
    for f in _factors(source):
        while isinstance(f, Cast):
            f = f.value
        conds = []
        while isinstance(f, Select) and _is_zero(f.f):   # nested: a padding of a zero-stuffing
            conds += _conjuncts(f.cond)
            f = f.t
            while isinstance(f, Cast):
                f = f.value
        for c in conds:
            test = _stride_test(c)
            if test is None:
                continue
            e, s = test
            lin = to_lin(e, {})
            vars_ = [a for a, _ in lin.terms.values()]
            if len(vars_) != 2 or not all(isinstance(v, Var) for v in vars_):
                continue
            v = next((x for x in vars_ if x in spatial), None)
            r = next((x for x in vars_ if x in reduced), None)
            if v is None or r is None:
                continue
            a, b = lin.coef_of(v), lin.coef_of(r)
            if abs(a) != 1 or abs(b) != 1 or op.axis[spatial[v]].extent < s:
                continue
            dv, dr = spatial[v], reduced[r]
            if dv in plan or any(p[1] == dr for p in plan.values()):
                continue
            plan[dv] = (dv, dr, s, a, b, lin.const)
    if not plan:
        return None
    if math.prod(p[2] for p in plan.values()) > MAX_PHASES:
        return None
    return [plan[d] for d in sorted(plan)]


def _divide_tests(e):
    """Index comparisons with a common factor g of their variables' coefficients divided by it
    (`2·q + 2·t - 2 >= 0` becomes `q + t >= 1`), so the bounds checker sees the guard of a read
    `X[q + t - 1]` that the phase's substitution made of `X[(y + r - 2) // 2]`."""
    def fn(n):
        if not isinstance(n, Compare) or n.op not in ("lt", "le", "gt", "ge", "eq") or n.a.dtype != INDEX_DTYPE:
            return None
        d = to_lin(Binary("sub", n.a, n.b, INDEX_DTYPE), {})
        g = 0
        for _, c in d.terms.values():
            g = math.gcd(g, c)
        if g <= 1:
            return None
        lin = Lin({k: (a, c // g) for k, (a, c) in d.terms.items()}, 0)
        if n.op == "eq":
            if d.const % g:
                return Const(False, "bool")
            return Compare("eq", from_lin(lin), Const(-d.const // g, INDEX_DTYPE))
        if n.op in ("lt", "le"):    # g·L + c <= k
            k = -1 if n.op == "lt" else 0
            return Compare("le", from_lin(lin), Const((k - d.const) // g, INDEX_DTYPE))
        k = 1 if n.op == "gt" else 0     # g·L + c >= k
        return Compare("ge", from_lin(lin), Const(-((d.const - k) // g), INDEX_DTYPE))
    return transform(e, fn)


def _guarded_read(e):
    """(read, [(dimension, "ge" 0 | "le" n-1)]) when `e` is select(cond, X[idx], 0) and every
    conjunct of cond says that one index of the read is in X's bounds (a padding's test, after
    the phase's substitution): then cond is exactly the read's bounds, and a zero-padded copy of
    X read at idx + its front padding gives the same values with no test. Else None."""
    if not isinstance(e, Select) or not _is_zero(e.f) or not isinstance(e.t, TensorRead):
        return None
    read = e.t
    lins = [to_lin(i, {}) for i in read.indices]
    for c in _conjuncts(e.cond):
        if not isinstance(c, Compare) or c.op not in ("ge", "le") or not isinstance(c.b, Const):
            return None
        lc = to_lin(c.a, {})
        for d, li in enumerate(lins):
            diff = li.add(lc, -1)
            if diff.is_const():
                bound = c.b.value + diff.const     # the conjunct: idx_d (ge|le) bound
                if (c.op == "ge" and bound == 0) or (c.op == "le" and bound == read.tensor.shape[d] - 1):
                    break
        else:
            return None
    return read


def _padded_reads(bodies) -> dict:
    """{id(tensor): (tensor, [front padding per dimension], [back padding])} over the guarded
    reads of every phase (_guarded_read), from the ranges their indices take."""

    pads: dict = {}
    for _, _, body, ranges in bodies.values():
        if body is None:
            continue
        for n in walk(body):
            read = _guarded_read(n)
            if read is None:
                continue
            t = read.tensor
            entry = pads.setdefault(id(t), (t, [0] * t.ndim, [0] * t.ndim))
            for d, i in enumerate(read.indices):
                r = lin_range(to_lin(i, ranges), ranges)
                if r is None:
                    pads[id(t)] = (t, None, None)
                    break
                if entry[1] is not None:
                    entry[1][d] = max(entry[1][d], -r[0])
                    entry[2][d] = max(entry[2][d], r[1] - (t.shape[d] - 1))
    return {k: v for k, v in pads.items() if v[1] is not None}


def _read_padded(body, pads: dict, copies: dict):
    """Guarded reads of `body` as reads of one zero-padded copy of their tensor (a `pad` stage,
    which the default schedules materialize where it pads the last axis), `copies` the copies
    made so far (every phase reads the same)."""

    def padded(t, front, back):
        if id(t) not in copies:
            shape = tuple(n + a + b for n, a, b in zip(t.shape, front, back))
            axes = [IterVar(f"i{d}", n) for d, n in enumerate(shape)]
            cond: Expr | None = None
            for d, ax in enumerate(axes):
                for test in (Compare("ge", ax.var, Const(front[d], INDEX_DTYPE)),
                             Compare("lt", ax.var, Const(front[d] + t.shape[d], INDEX_DTYPE))):
                    cond = test if cond is None else Logical("and", cond, test)
            src = t[tuple(ax.var - front[d] for d, ax in enumerate(axes))]
            zero = Const(0, t.dtype) if t.dtype.startswith("int") else Const(0.0, t.dtype)
            body_ = src if cond is None else Select(cond, src, zero)
            copies[id(t)] = compute_from_axes(f"{t.name}_pad", axes, body_, tag="pad")
        return copies[id(t)]

    def fn(n):
        read = _guarded_read(n)
        if read is None or id(read.tensor) not in pads:
            return None
        t, front, back = pads[id(read.tensor)]
        if not any(front) and not any(back):
            return read
        return padded(t, front, back)[tuple(i + f for i, f in zip(read.indices, front))]
    return transform(body, fn)


def _phase_index(i, s: int, extent: int, full: int):
    q = Binary("floordiv", i, Const(s, INDEX_DTYPE), INDEX_DTYPE)
    if extent * s >= full:
        return q
    return Binary("min", q, Const(extent - 1, INDEX_DTYPE), INDEX_DTYPE)


def rewrite_stride_phases(op):
    """The `stride_phases` rewrite of a stage (see the module docstring); ScheduleError where
    stride_phase_plan finds nothing to split."""
    plan = stride_phase_plan(op)
    if plan is None:
        raise ScheduleError(f"rewrite stride_phases: {getattr(op, 'name', op)} reads no zero-stuffed input "
                            "(a select(… % s == 0, x, 0) factor of a sum)")
    source = expand_data_movement(op.body.source)
    phases_of = {p[0]: p for p in plan}
    bodies = {}
    for phase in itertools.product(*[range(p[2]) for p in plan]):
        at = dict(zip([p[0] for p in plan], phase))
        axes, mapping, ranges = [], {}, {}
        for d, ax in enumerate(op.axis):
            if d in at:
                s, phi = phases_of[d][2], at[d]
                nv = IterVar(f"{ax.name}_q", -(-(ax.extent - phi) // s))
                mapping[ax.var] = nv.var * s + phi
            else:
                nv = IterVar(ax.name, ax.extent)
                mapping[ax.var] = nv.var
            axes.append(nv)
            ranges[nv.var] = (0, nv.extent - 1)
        raxes: list | None = []
        for dr, rax in enumerate(op.reduce_axis):
            p = next((p for p in plan if p[1] == dr), None)
            if p is None:
                nr = reduce_axis(rax.extent, rax.name)
                mapping[rax.var] = nr.var
            else:
                _, _, s, a, b, c = p
                rho = (-b * (a * at[p[0]] + c)) % s
                if rax.extent <= rho:      # no tap of this phase: its value is 0
                    raxes = None
                    break
                nr = reduce_axis(-(-(rax.extent - rho) // s), f"{rax.name}_t")
                mapping[rax.var] = nr.var * s + rho
            assert raxes is not None
            raxes.append(nr)
            ranges[nr.var] = (0, nr.extent - 1)
        body = None if raxes is None else _divide_tests(simplify(substitute(source, mapping), ranges))
        bodies[phase] = (axes, raxes, body, ranges)
    pads = _padded_reads(bodies)
    copies: dict = {}
    phase_tensors = {}
    for phase, (axes, raxes, body, _) in bodies.items():
        name = f"{op.name}_p" + "".join(str(x) for x in phase)
        value: Expr
        if body is None:
            value = Const(0, op.dtype) if op.dtype.startswith("int") else Const(0.0, op.dtype)
        else:
            value = Reduce("sum", _read_padded(body, pads, copies), raxes)
        phase_tensors[phase] = compute_from_axes(name, axes, value, tag="stride_phase")

    def interleave(*idx):
        out = None
        for phase in reversed(list(phase_tensors)):
            at = dict(zip([p[0] for p in plan], phase))
            tensor = phase_tensors[phase]
            # x // s, clamped to the phase's extent where the phase has fewer points than the
            # first (the select takes the phase only where the clamp changes nothing)
            read = tensor[tuple(_phase_index(i, phases_of[d][2], tensor.shape[d], op.axis[d].extent) if d in at else i
                                for d, i in enumerate(idx))]
            if out is None:
                out = read
                continue
            cond: Expr | None = None
            for d, phi in at.items():
                t = Compare("eq", Binary("floormod", idx[d], Const(phases_of[d][2], idx[d].dtype), idx[d].dtype),
                            Const(phi, idx[d].dtype))
                cond = t if cond is None else Logical("and", cond, t)
            assert cond is not None
            out = Select(cond, read, out)
        return out
    axes = [IterVar(ax.name, ax.extent) for ax in op.axis]
    return compute_from_axes(op.name, axes, interleave(*[a.var for a in axes]), tag="stride_phases")


register_rewrite("stride_phases", rewrite_stride_phases)

__all__ = ["is_data_movement", "expand_data_movement", "stride_phase_plan", "rewrite_stride_phases", "MAX_PHASES"]
