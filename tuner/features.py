"""Features of a lowered loop program, for the cost model (Ansor-like, aggregated to a fixed length).

One walk over the loop IR visits every statement once (never once per loop iteration). At each
`Store` it records the enclosing loop nest (extents, kinds), the arithmetic of the store by kind,
and one *access row* per distinct (buffer, index) the store reads or writes, with the coefficient
of every enclosing loop variable in the flat index (its stride, from `compiler.arith.to_lin`).
Everything that depends on several loops at once (footprints at each loop level, cache lines,
reuse distance, strides w.r.t. the innermost / vectorized loop) is then computed for all access
rows of the function together with numpy.

Per store (`STORE_FEATURES`, then `BUFFER_FEATURES` for its `TOP_BUFFERS` largest accesses):
- arithmetic counts by kind × the iterations of the enclosing loops, loads, iterations;
- loop structure: depth, vector lanes (raw and relative to the target's), whether the vectorized
  loop is innermost, unroll product, parallel extent, whether the outermost loop is parallel and
  how evenly it divides the cores, innermost extent, work per thread, guards;
- memory: per buffer whether it is read/written, its scope, bytes touched, unique bytes over the
  innermost 1/2/3 loops and the whole nest, unique cache lines, stride w.r.t. the innermost and
  the vectorized loop (0 / 1 / other), Ansor's reuse (count, distance in iterations and bytes),
  the buffer's allocation size; local allocations around the store; arithmetic intensity.

The function's vector: `GLOBAL_FEATURES`, then the `TOP_STORES` most expensive stores, then the
cost-weighted mean and the maximum of every store feature over all stores. Counts, sizes and
extents are log-transformed (log2(1 + x)); flags, lanes, depths and ratios are raw.
"""

from __future__ import annotations

import math

import numpy as np

from compiler.arith import struct_key, to_lin
from compiler.dtypes import is_float, nbytes
from compiler.expr import Binary, Call, Cast, Compare, Const, Logical, Not, Select, Var
from compiler.loop_ir import Allocate, Buffer, For, IfThenElse, LetStmt, Load, LoweredFunc, Seq, Store
from compiler.target import resolve_target

FEATURE_VERSION = 1
TOP_STORES = 2
TOP_BUFFERS = 3
CACHE_LINE = 64
_LEVELS = (1, 2, 3)  # footprints over the innermost 1, 2, 3 loops (plus the whole nest)

_OP_KINDS = ("f_addsub", "f_mul", "f_div", "f_minmax", "f_cmp", "f_math",
             "i_addsub", "i_mul", "i_divmod", "i_minmax", "i_cmp", "bool_op", "select", "cast")
_OP_INDEX = {k: i for i, k in enumerate(_OP_KINDS)}

# (name, log-transformed?)
STORE_FEATURES = [(f"ops_{k}", True) for k in _OP_KINDS] + [
    ("loads", True), ("iterations", True), ("depth", False),
    ("vec_lanes", False), ("vec_lanes_rel", False), ("vec_innermost", False),
    ("unroll_product", True), ("unroll_loops", False),
    ("parallel_extent", True), ("parallel_outermost", False), ("parallel_balance", False),
    ("innermost_extent", True), ("work_per_thread", True),
    ("guards", False), ("guard_ops", True), ("reduction_update", False),
    ("store_local", False), ("store_arg", False),
    ("local_alloc_bytes", True), ("local_allocs", False),
    ("bytes_total", True), ("unique_bytes_total", True), ("arith_intensity", True), ("flops", True),
]
BUFFER_FEATURES = [
    ("is_read", False), ("is_write", False), ("scope_local", False), ("scope_arg", False),
    ("accesses", False), ("bytes", True), ("unique_bytes", True), ("unique_lines", True),
    ("unique_bytes_l1", True), ("unique_bytes_l2", True), ("unique_bytes_l3", True),
    ("stride_inner_0", False), ("stride_inner_1", False), ("stride_inner", True),
    ("stride_vec_0", False), ("stride_vec_1", False), ("stride_vec_other", False),
    ("reuse_ct", True), ("reuse_dis_iter", True), ("reuse_dis_bytes", True),
    ("reuse_ratio", True), ("alloc_bytes", True),
]
GLOBAL_FEATURES = [
    ("stores", False), ("loops", False), ("root_parallel_loops", False),
    ("flops", True), ("bytes", True), ("iterations", True),
    ("global_alloc_bytes", True), ("local_alloc_bytes_max", True),
    ("frac_vectorized", False), ("frac_parallel", False), ("frac_unrolled", False),
    ("target_lanes", False), ("target_cores", False),
]

_COL = {n: i for i, (n, _) in enumerate(STORE_FEATURES)}
_NB = len(BUFFER_FEATURES)
_NS = len(STORE_FEATURES)
PER_STORE = _NS + TOP_BUFFERS * _NB
_STORE_LOG = np.array([lg for _, lg in STORE_FEATURES] +
                      [lg for _, lg in BUFFER_FEATURES] * TOP_BUFFERS, dtype=bool)
_GLOBAL_LOG = np.array([lg for _, lg in GLOBAL_FEATURES], dtype=bool)
NUM_FEATURES = len(GLOBAL_FEATURES) + (TOP_STORES + 2) * PER_STORE


def _store_names():
    names = [n for n, _ in STORE_FEATURES]
    for b in range(TOP_BUFFERS):
        names += [f"buf{b}_{n}" for n, _ in BUFFER_FEATURES]
    return names


def feature_names() -> list:
    """Names of the columns of `extract_features`, in order."""
    per = _store_names()
    out = [f"g_{n}" for n, _ in GLOBAL_FEATURES]
    for s in range(TOP_STORES):
        out += [f"s{s}_{n}" for n in per]
    out += [f"mean_{n}" for n in per]
    out += [f"max_{n}" for n in per]
    assert len(out) == NUM_FEATURES
    return out


# ----------------------------------------------------------------------------- the IR walk

class _Access:
    __slots__ = ("buffer", "coefs", "read", "write", "count")

    def __init__(self, buffer, coefs):
        self.buffer, self.coefs = buffer, coefs
        self.read = self.write = False
        self.count = 0


class _StoreInfo:
    __slots__ = ("loops", "ops", "loads", "guards", "guard_ops", "local_allocs", "local_alloc_bytes",
                 "accesses", "buffer", "reduction")
    # filled in by _Walker._store
    loops: list[tuple[Var, int, str]]   # the enclosing loops, outermost first
    ops: list[int]                      # arithmetic counts, indexed like _OP_KINDS
    loads: int
    guards: int
    guard_ops: float
    local_allocs: int
    local_alloc_bytes: int
    accesses: list[_Access]
    buffer: Buffer
    reduction: bool


def _coefs(e, ranges) -> dict:
    """{loop Var: coefficient} of an int64 index expression (approximate through min/max/div)."""
    try:
        lin = to_lin(e, ranges)
    except TypeError:
        return {}
    out: dict = {}
    for atom, c in lin.terms.values():
        if isinstance(atom, Var):
            out[atom] = out.get(atom, 0) + c
        else:
            for v, k in _atom_coefs(atom, ranges).items():
                out[v] = out.get(v, 0) + c * k
    return out


def _atom_coefs(atom, ranges) -> dict:
    if isinstance(atom, Binary):
        if atom.op in ("min", "max"):
            side = atom.b if isinstance(atom.a, Const) else atom.a
            return _coefs(side, ranges)
        if atom.op in ("floordiv", "floormod") and isinstance(atom.b, Const) and atom.b.value > 0:
            c = atom.b.value
            inner = _coefs(atom.a, ranges)
            if atom.op == "floordiv":
                return {v: k / c for v, k in inner.items()}
            return {v: k % c for v, k in inner.items() if k % c}
        return {}
    if isinstance(atom, Select):
        return _coefs(atom.t, ranges)
    if isinstance(atom, Cast):
        return _coefs(atom.value, ranges)
    return {}


def _count_ops(e, ops: list, loads: list):
    """Arithmetic of an expression tree by kind into `ops`; every Load node into `loads`."""
    stack = [e]
    while stack:
        n = stack.pop()
        t = type(n)
        if t is Load:
            loads.append(n)
            stack.append(n.index)
        elif t is Binary:
            f = is_float(n.dtype)
            op = n.op
            if op in ("add", "sub"):
                k = "f_addsub" if f else "i_addsub"
            elif op == "mul":
                k = "f_mul" if f else "i_mul"
            elif op in ("div", "floordiv", "floormod"):
                k = "f_div" if f else "i_divmod"
            elif op in ("min", "max"):
                k = "f_minmax" if f else "i_minmax"
            else:  # pow
                k = "f_math"
            ops[_OP_INDEX[k]] += 1
            stack.append(n.a)
            stack.append(n.b)
        elif t is Compare:
            ops[_OP_INDEX["f_cmp" if is_float(n.a.dtype) else "i_cmp"]] += 1
            stack.append(n.a)
            stack.append(n.b)
        elif t is Logical:
            ops[_OP_INDEX["bool_op"]] += 1
            stack.append(n.a)
            stack.append(n.b)
        elif t is Not:
            ops[_OP_INDEX["bool_op"]] += 1
            stack.append(n.a)
        elif t is Select:
            ops[_OP_INDEX["select"]] += 1
            stack.extend((n.cond, n.t, n.f))
        elif t is Cast:
            ops[_OP_INDEX["cast"]] += 1
            stack.append(n.value)
        elif t is Call:
            ops[_OP_INDEX["f_math"]] += 1
            stack.extend(n.args)


class _Walker:
    def __init__(self):
        self.loops = []        # [(Var, extent, kind)] outermost first
        self.ranges = {}       # Var -> (0, extent - 1)
        self.guards = []       # [(cond, depth)]
        self.allocs = []       # enclosing Allocate buffers
        self.stores: list = []
        self.n_loops = 0
        self.root_parallel = 0
        self.global_alloc = 0
        self.local_alloc_max = 0

    def visit(self, s):
        t = type(s)
        if t is Seq:
            for x in s.stmts:
                self.visit(x)
        elif t is For:
            self.n_loops += 1
            if s.kind == "parallel" and not self.loops:
                self.root_parallel += 1
            self.loops.append((s.var, s.extent, s.kind))
            self.ranges[s.var] = (0, s.extent - 1)
            self.visit(s.body)
            self.loops.pop()
            del self.ranges[s.var]
        elif t is Store:
            self._store(s)
        elif t is Allocate:
            b = s.buffer
            if b.scope == "local":
                self.local_alloc_max = max(self.local_alloc_max, b.nbytes)
            else:
                self.global_alloc += b.nbytes
            self.allocs.append(b)
            self.visit(s.body)
            self.allocs.pop()
        elif t is IfThenElse:
            self.guards.append((s.cond, len(self.loops)))
            self.visit(s.then)
            if s.else_ is not None:
                self.visit(s.else_)
            self.guards.pop()
        elif t is LetStmt:
            self.visit(s.body)

    def _store(self, s: Store):
        info = _StoreInfo()
        info.loops = list(self.loops)
        ops = [0] * len(_OP_KINDS)
        loads: list = []
        _count_ops(s.value, ops, loads)
        _count_ops(s.index, ops, loads)
        info.ops = ops
        info.loads = len(loads)
        # guards: their comparisons run once per iteration of the loops outside them
        gops = 0.0
        for cond, depth in self.guards:
            g = [0] * len(_OP_KINDS)
            _count_ops(cond, g, [])
            execs = 1
            for _, ext, _ in self.loops[:depth]:
                execs *= ext
            gops += sum(g) * execs
        info.guards = len(self.guards)
        info.guard_ops = gops
        local = [b for b in self.allocs if b.scope == "local"]
        info.local_allocs = len(local)
        info.local_alloc_bytes = sum(b.nbytes for b in local)
        info.buffer = s.buffer
        accesses: dict = {}
        store_key = (id(s.buffer), struct_key(s.index))
        acc = accesses[store_key] = _Access(s.buffer, _coefs(s.index, self.ranges))
        acc.write = True
        acc.count = 1
        info.reduction = False
        for ld in loads:
            key = (id(ld.buffer), struct_key(ld.index))
            a = accesses.get(key)
            if a is None:
                a = accesses[key] = _Access(ld.buffer, _coefs(ld.index, self.ranges))
            a.read = True
            a.count += 1
            if key == store_key:
                info.reduction = True
        info.accesses = list(accesses.values())
        self.stores.append(info)


# ----------------------------------------------------------------------------- numpy part

def _log(x):
    return np.log2(1.0 + np.maximum(x, 0.0))


def _access_features(stores):
    """Per access row: the BUFFER_FEATURES (linear scale) and the store each row belongs to."""
    rows = [(si, a) for si, st in enumerate(stores) for a in st.accesses]
    R = len(rows)
    D = max((len(st.loops) for st in stores), default=0)
    D = max(D, 1)
    coef = np.zeros((R, D))
    ext = np.ones((R, D))
    vec_col = np.full(R, -1, dtype=np.int64)
    eb = np.empty(R)
    store_of = np.empty(R, dtype=np.int64)
    flags = np.zeros((R, 5))  # read, write, local, arg, count
    alloc = np.empty(R)
    for r, (si, a) in enumerate(rows):
        loops = stores[si].loops
        off = D - len(loops)
        for c, (var, e, kind) in enumerate(loops):
            ext[r, off + c] = e
            k = a.coefs.get(var)
            if k:
                coef[r, off + c] = k
            if kind == "vectorized":
                vec_col[r] = off + c
        b = a.buffer
        eb[r] = nbytes(b.dtype)
        store_of[r] = si
        flags[r] = (a.read, a.write, b.scope == "local", b.scope == "arg", a.count)
        alloc[r] = b.nbytes
    acoef = np.abs(coef)
    nz = acoef > 0
    # footprint over the innermost L loops, for every L: cumulative from the right
    cnt = np.cumprod(np.where(nz, ext, 1.0)[:, ::-1], axis=1)[:, ::-1]    # [R, D], col c: loops c..D-1
    span = np.cumsum((acoef * (ext - 1.0))[:, ::-1], axis=1)[:, ::-1] + 1.0
    uniq = np.minimum(cnt, span)                                            # elements
    uniq_b = uniq * eb[:, None]
    iters = np.prod(ext, axis=1)
    bytes_ = iters * eb * flags[:, 4]
    # cache lines of the whole-nest footprint: elements closer than a line share it
    minstride = np.where(nz, acoef, np.inf).min(axis=1)
    step_b = np.where(np.isfinite(minstride), np.minimum(CACHE_LINE, np.maximum(minstride * eb, eb)), 0.0)
    lines = np.maximum(1.0, np.ceil(uniq[:, 0] * step_b / CACHE_LINE))
    lvl = [uniq_b[:, max(D - L, 0)] for L in _LEVELS]
    s_in = acoef[:, D - 1]
    has_vec = vec_col >= 0
    s_vec = np.where(has_vec, acoef[np.arange(R), np.maximum(vec_col, 0)], -1.0)
    # reuse (Ansor's loop-carried reuse): the innermost loop that does not move the access
    carried = (~nz) & (ext > 1)
    has_reuse = carried.any(axis=1)
    rev_first = np.argmax(carried[:, ::-1], axis=1)
    rcol = D - 1 - rev_first
    reuse_ct = np.where(has_reuse, ext[np.arange(R), rcol], 0.0)
    inner_iters = np.concatenate([np.cumprod(ext[:, ::-1], axis=1)[:, ::-1][:, 1:], np.ones((R, 1))], axis=1)
    reuse_iter = np.where(has_reuse, inner_iters[np.arange(R), rcol], 0.0)
    # bytes every access of the same store touches inside the reuse loop's body
    S = len(stores)
    per_store_lvl = np.zeros((S, D + 1))
    per_store_lvl_body = np.concatenate([uniq_b, eb[:, None]], axis=1)  # col D: one iteration
    np.add.at(per_store_lvl, store_of, per_store_lvl_body)
    reuse_bytes = np.where(has_reuse, per_store_lvl[store_of, np.minimum(rcol + 1, D)], 0.0)
    feats = np.column_stack([
        flags[:, 0], flags[:, 1], flags[:, 2], flags[:, 3], flags[:, 4],
        bytes_, uniq_b[:, 0], lines, lvl[0], lvl[1], lvl[2],
        s_in == 0, s_in == 1, s_in,
        has_vec & (s_vec == 0), has_vec & (s_vec == 1), has_vec & (s_vec != 0) & (s_vec != 1),
        reuse_ct, reuse_iter, reuse_bytes,
        bytes_ / np.maximum(uniq_b[:, 0], 1.0), alloc,
    ]).astype(np.float64)
    return feats, store_of, bytes_, uniq_b[:, 0]


def _lanes_of(target):
    """A memoized `dtype -> vector lanes` for `target` (its capabilities; one dict lookup per
    store instead of a cached call per store)."""
    key = str(target)
    fn = _LANES_CACHE.get(key)
    if fn is None:
        table = {dt: target.vector_lanes(dt) for dt in ("float32", "float64", "int8", "int32", "int64")}
        fn = _LANES_CACHE[key] = table.__getitem__
    return fn


_LANES_CACHE: dict = {}


def extract_features(func: LoweredFunc, target=None) -> np.ndarray:
    """Fixed-length feature vector (float64[NUM_FEATURES]) of a lowered function.

    `target` (a compiler Target, the host by default, like everywhere in the compiler) gives the
    vector width and core count the vector and parallel features are measured against.
    """
    if target is None:
        target = resolve_target(None)
    lanes_fn = _lanes_of(target)
    cores = target.num_cores
    w = _Walker()
    w.visit(func.body)
    stores = w.stores
    out = np.zeros(NUM_FEATURES)
    if not stores:
        return out
    S = len(stores)
    afeat, store_of, abytes, auniq = _access_features(stores)

    # per store, non-buffer features (linear scale)
    sf = np.zeros((S, _NS))
    iters_all = np.empty(S)
    for si, st in enumerate(stores):
        exts = [e for _, e, _ in st.loops]
        iters = float(math.prod(exts)) if exts else 1.0
        iters_all[si] = iters
        lanes, vec_inner, unroll_p, unroll_n, par_ext, par_outer = 1, 0, 1, 0, 0, 0
        for d, (_, e, kind) in enumerate(st.loops):
            if kind == "vectorized":
                lanes = e
                vec_inner = int(d == len(st.loops) - 1)
            elif kind == "unrolled":
                unroll_p *= e
                unroll_n += 1
            elif kind == "parallel":
                par_ext = e if par_ext == 0 else par_ext * e
                par_outer = par_outer or int(d == 0)
        balance = par_ext / (math.ceil(par_ext / cores) * cores) if par_ext else 0.0
        work = iters / par_ext if par_ext else iters
        flops = sum(st.ops[:6]) * iters  # the f_* kinds come first in _OP_KINDS
        dt = st.buffer.dtype
        tl = max(lanes_fn(dt if dt != "bool" else "int8"), 1)
        row = [o * iters for o in st.ops]
        row += [st.loads * iters, iters, len(st.loops), lanes, lanes / tl, vec_inner,
                unroll_p, unroll_n, par_ext, par_outer, balance,
                exts[-1] if exts else 1, work, st.guards, st.guard_ops, int(st.reduction),
                int(st.buffer.scope == "local"), int(st.buffer.scope == "arg"),
                st.local_alloc_bytes, st.local_allocs]
        sf[si, :len(row)] = row
        sf[si, _COL["flops"]] = flops
    tot_bytes = np.bincount(store_of, weights=abytes, minlength=S)
    tot_uniq = np.bincount(store_of, weights=auniq, minlength=S)
    sf[:, _COL["bytes_total"]] = tot_bytes
    sf[:, _COL["unique_bytes_total"]] = tot_uniq
    sf[:, _COL["arith_intensity"]] = sf[:, _COL["flops"]] / np.maximum(tot_uniq, 1.0)

    # top buffers of each store, by bytes touched
    order = np.lexsort((-abytes, store_of))
    so = store_of[order]
    first = np.searchsorted(so, np.arange(S))
    rank = np.arange(len(order)) - first[so]
    keep = rank < TOP_BUFFERS
    bf = np.zeros((S, TOP_BUFFERS, _NB))
    bf[so[keep], rank[keep]] = afeat[order[keep]]
    per = np.concatenate([sf, bf.reshape(S, -1)], axis=1)
    per = np.where(_STORE_LOG, _log(per), per)

    # aggregate: top stores by cost, cost-weighted mean, max
    cost = sf[:, :len(_OP_KINDS)].sum(axis=1) + tot_bytes / 4.0 + iters_all
    top = np.argsort(-cost, kind="stable")[:TOP_STORES]
    wgt = cost / cost.sum()
    g = len(GLOBAL_FEATURES)
    for k, si in enumerate(top):
        out[g + k * PER_STORE: g + (k + 1) * PER_STORE] = per[si]
    base = g + TOP_STORES * PER_STORE
    out[base: base + PER_STORE] = wgt @ per
    out[base + PER_STORE: base + 2 * PER_STORE] = per.max(axis=0)

    # global
    total_iters = iters_all.sum()
    glob = np.array([
        S, w.n_loops, w.root_parallel, sf[:, _COL["flops"]].sum(), tot_bytes.sum(), total_iters,
        w.global_alloc, w.local_alloc_max,
        iters_all[sf[:, _COL["vec_lanes"]] > 1].sum() / total_iters,
        iters_all[sf[:, _COL["parallel_extent"]] > 0].sum() / total_iters,
        iters_all[sf[:, _COL["unroll_product"]] > 1].sum() / total_iters,
        lanes_fn("float32"), cores,
    ], dtype=np.float64)
    out[:g] = np.where(_GLOBAL_LOG, _log(glob), glob)
    return out


# ----------------------------------------------------------------------------- candidates

def features_for(opdef, candidates, target=None, lowered=None, keys: dict | None = None) -> np.ndarray:
    """[len(candidates), NUM_FEATURES] features; rows of candidates that fail to instantiate or
    lower are NaN (test with `np.isnan(X).any(axis=1)`).

    The same `opdef` serves every candidate: a schedule never changes its compute definition.
    `lowered(candidate)` may hand over a loop program already lowered for it (the search
    space's `take_lowered`), which saves half of the ranking time. `keys`, a dict, receives each
    lowered candidate's `program_key` by fingerprint (the program is at hand here, and a key is
    what tells a search that two candidates are one kernel).
    """
    from compiler.lower import lower

    from .program_key import program_key
    from .space.base import instantiate

    tgt = resolve_target(target) if not _is_target(target) else target
    out = np.full((len(candidates), NUM_FEATURES), np.nan)
    for i, cand in enumerate(candidates):
        try:
            func = lowered(cand) if lowered is not None else None
            if func is None:
                s, args = instantiate(opdef, cand, tgt)
                func = lower(s, args)
            if keys is not None:
                keys[cand.fingerprint] = program_key(func)
            out[i] = extract_features(func, tgt)
        except Exception:  # noqa: BLE001 - a broken candidate is marked, never fatal
            continue
    return out


def _is_target(t) -> bool:
    return hasattr(t, "vector_lanes") and hasattr(t, "num_cores")


__all__ = ["extract_features", "features_for", "feature_names", "NUM_FEATURES", "FEATURE_VERSION"]
