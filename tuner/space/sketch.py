"""Sketches (Ansor-style): schedules generated from the compute definition alone.

A *sketch* fixes the structure of a schedule: which stages are inlined, which are tiled and
where each stage is computed. It is derived by rules, per stage in reverse topological order:

- inline:     an elementwise stage that is not the output is substituted into its readers
              (a variant sketch instead materializes the producers of tiled stages at the root,
              e.g. a convolution's padding);
- tile:       a reduction with data reuse (an input read that does not depend on every spatial
              axis: matmul, convolutions) gets a multi-level tiling of the "SSRSRS" kind: each
              spatial axis split into 4 levels, each reduction axis into 2, ordered
              S0 S1 R0 S2 R1 S3 (the outer S0 S1 levels may take the last axis first);
- tile_fused: … and when its only reader is an elementwise stage reading it point for point
              (dense's epilogue, a user's `C * 2 + D[j]`), that reader is tiled S0 S1 S2 S3 and
              the reduction is computed at its last S1 loop (R0 S2 R1 S3 inside): the epilogue is
              fused into the register tile;
- tile_cache_write: a tiled output with no such reader accumulates into a local tile
              (cache_write) computed at the output's last S1 loop; the plain "tile" (accumulate
              in the output) is the variant sketch;
- reduce:     a reduction without reuse (row sums, pooling, softmax's max): spatial loops
              outside, reduction loops, the last spatial axis inside (vectorized or unrolled);
- rfactor:    (only if the schedule has the `rfactor` primitive) for a reduction with little
              spatial parallelism: the innermost reduction split, its inner part factored out
              as a vector of partial results;
- elementwise: an elementwise output (or a materialized producer): fused outer loops in
              parallel, the last axis split and vectorized.
Packing the reused operand of a tiled stage into a blocked layout (cache_read with block=,
the B panels of GEMM, a convolution's weight panels) is an option of the tiled stage; so is,
with a vector axis other than the last (channel vectors), `block_input`: what the tile reads
with its first reduction axis as an index (a convolution's padded input) copied in blocks of
that axis's inner tile, a padding stage inlined into the copy (the NCHWc input of the deep
layers' default schedule).

*Annotation* then samples the sketch's parameters at random: tile sizes (factors of the
extents, sometimes non-dividing sizes), how many outer spatial loops are fused and run in
parallel, the vector length of the innermost spatial loop (whole registers up to 64 lanes),
unrolling of the micro-kernel's inner loops and an auto_unroll step limit.

A candidate is `Candidate("trace", {"sketch": id, "params": {...}, "steps": [...],
"workload_key": key})`: `steps` are the recorded schedule steps of the sketch applied with the
params, so `instantiate` replays them with `apply_steps` and no knowledge of the sketch; params
let `mutate` (one parameter changed) and `crossover` (parameters of two parents of one sketch)
regenerate the steps. A trace replayed on another workload (another key) raises SpaceError.
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass, field

from compiler.dtypes import nbytes
from compiler.errors import CompilerError
from compiler.expr import free_vars, substitute, transform, walk
from compiler.lower import lower
from compiler.ops.schedule_conv import schedule_block_copy, schedule_weight_panels
from compiler.schedule import MAX_VECTOR_LANES, Schedule, Stage, create_schedule
from compiler.target import resolve_target
from compiler.tensor import PlaceholderOp, Reduce, TensorRead

from ..candidate import Candidate
from . import sketch_recipe as recipe  # noqa: I001 - the recipe sketch's sampling and evolution
from .base import SearchSpace, SpaceError, register_space_kind, replay_trace, resolve_task

NICE_SIZES = (2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 24, 32, 48, 64)
AUTO_UNROLL_STEPS = (0, 16, 64, 512)
MAX_INNER = 16            # innermost tile of a non-vector spatial axis, inner reduction tile
MAX_MIDDLE = 8            # the S2 level (register tiles per attached region)
MAX_KEPT_LOWERED = 4096   # validated loop programs kept for the cost model's features
MAX_UNROLLED_BODY = 128   # statements of an unrolled micro-kernel step
NONDIVIDING_P = 0.15      # how often a tile size that does not divide its extent is drawn
REGISTER_TILE_P = 0.8     # how often a sampled tile's accumulators are held to the target's
                          # accumulator registers (12 of AVX2's 16, 28 of AVX-512's or NEON's 32)
MAX_SKETCHES = 16
SWITCH_SKETCH_P = 0.1     # how often a mutation moves a candidate to another sketch
RED_AS_DEFINED_P = 0.6    # how often a tile's reduction loops keep the definition's order
MAX_TRIES = 24


# ----------------------------------------------------------------------------- DAG analysis

class _Dag:
    """The stages of a compute definition (as a fresh schedule lists them) and their relations."""

    def __init__(self, opdef):
        s = create_schedule(opdef.output)
        self.stages = list(s.stages)
        self.n = len(self.stages)
        self.names = [st.name for st in self.stages]
        self.index = {id(st.tensor): i for i, st in enumerate(self.stages)}
        self.inputs = list(s.placeholders)
        self.output = self.index[id(opdef.output)]

    def op(self, i):
        return self.stages[i].op

    def is_reduce(self, i) -> bool:
        return isinstance(self.op(i).body, Reduce)

    def is_output(self, i) -> bool:
        return i == self.output

    def expanded(self, i, inlined: set):
        """The body of stage i with the inlined stages substituted (as lowering will)."""
        body = self.op(i).body
        if isinstance(body, Reduce):
            where = self._expand(body.where, inlined) if body.where is not None else None
            return Reduce(body.combiner, self._expand(body.source, inlined), body.axes, where)
        return self._expand(body, inlined)

    def _expand(self, e, inlined: set):
        def fn(n):
            if isinstance(n, TensorRead):
                j = self.index.get(id(n.tensor))
                if j is not None and j in inlined:
                    op = self.op(j)
                    mapping = {ax.var: idx for ax, idx in zip(op.axis, n.indices)}
                    return self._expand(substitute(op.body, mapping), inlined)
            return None
        return transform(e, fn)

    @staticmethod
    def reads(body) -> list:
        """Every tensor read of a stage body (a reduction's condition included)."""
        if isinstance(body, Reduce):
            roots = [body.source] + ([body.where] if body.where is not None else [])
        else:
            roots = [body]
        return [n for r in roots for n in walk(r) if isinstance(n, TensorRead)]

    def effective_readers(self, i, inlined: set) -> list:
        """Stages that are not inlined and read stage i, directly or through inlined stages."""
        t = self.stages[i].tensor
        return [j for j in range(self.n) if j not in inlined and j != i and
                any(r.tensor is t for r in self.reads(self.expanded(j, inlined)))]

    def has_reuse(self, i, inlined: set) -> bool:
        """Some read runs over the reduction but not over every (non-trivial) spatial axis (B of
        a matmul is the same for every row i): a multi-level tile reuses it from registers and
        cache."""
        op = self.op(i)
        spatial = {ax.var for ax in op.axis if ax.extent > 1}
        reduce = {ax.var for ax in op.reduce_axis}
        if not spatial:
            return False
        for r in self.reads(self.expanded(i, inlined)):
            used = set()
            for idx in r.indices:
                used |= free_vars(idx)
            if used & reduce and spatial - used:
                return True
        return False

    def fusible_consumer(self, i, inlined: set):
        """The elementwise stage that alone reads stage i, point for point, or None."""
        readers = self.effective_readers(i, inlined)
        if len(readers) != 1:
            return None
        j = readers[0]
        op_i, op_j = self.op(i), self.op(j)
        if self.is_reduce(j) or tuple(op_j.shape) != tuple(op_i.shape):
            return None
        t = self.stages[i].tensor
        axis_vars = [ax.var for ax in op_j.axis]
        for r in self.reads(self.expanded(j, inlined)):
            if r.tensor is t and any(idx is not v for idx, v in zip(r.indices, axis_vars)):
                return None
        return j

    def pack_target(self, i, vec: int | None = None):
        """(input index, tensor axis) of an input the tile reuses and reads with spatial axis
        `vec` (the vector axis; the last by default) as one index: packing it blocks that axis by
        the vector tile."""
        op = self.op(i)
        live = [ax for ax in op.axis if ax.extent > 1]
        if not live:
            return None
        axis_var = op.axis[len(op.axis) - 1 if vec is None else vec].var
        spatial = {ax.var for ax in live}
        for r in self.reads(op.body):
            if not isinstance(r.tensor.op, PlaceholderOp):
                continue
            dims = [d for d, idx in enumerate(r.indices) if idx is axis_var]
            used = set()
            for idx in r.indices:
                used |= free_vars(idx)
            if dims and spatial - used and used & {ax.var for ax in op.reduce_axis}:
                return self.inputs.index(r.tensor), dims[0]
        return None

    def block_target(self, i, packed_input: int):
        """("stage", index, axis) or ("input", index, axis) of what tiled stage i reads with its first reduction axis alone
        as one index (a convolution's input channels), other than the packed input: copied in
        blocks along that axis, the reduction's inner steps read consecutive elements (the
        channel-vector default's NCHWc input: schedule_conv.input_channel_block). The stage is
        a placeholder's or a producer's (a padding stage, inlined into the copy)."""
        op = self.op(i)
        if not op.reduce_axis:
            return None
        r0 = op.reduce_axis[0].var
        for r in self.reads(op.body):
            if r.tensor is self.inputs[packed_input]:
                continue
            dims = [d for d, idx in enumerate(r.indices) if idx is r0]
            if not dims:
                continue
            j = self.index.get(id(r.tensor))
            if j is not None:
                return ("stage", j, dims[0])
            if r.tensor in self.inputs:
                return ("input", self.inputs.index(r.tensor), dims[0])
        return None

    def vector_axes(self, i) -> list:
        """Spatial axes of tiled stage i, besides the last, that may be its vector axis: those a
        reused input reads as one index while it does not read the last axis (a convolution's
        output channels, which index the weights; a matmul's rows, which index A). Packing that
        input makes the axis unit-stride; the accumulators are cached with it last."""
        op = self.op(i)
        last = op.axis[-1].var
        out = []
        for d, ax in enumerate(op.axis[:-1]):
            if ax.extent <= 1:
                continue
            target = self.pack_target(i, d)
            if target is None:
                continue
            tensor = self.inputs[target[0]]
            reads_last = any(last in free_vars(idx) for r in self.reads(op.body) if r.tensor is tensor
                             for idx in r.indices)
            if not reads_last:
                out.append(d)
        return out


# ----------------------------------------------------------------------------- sketches

@dataclass
class Sketch:
    """The structure of a schedule: a rule per stage (by the stage's index in a fresh schedule)."""

    id: str
    rules: dict                                   # stage index -> rule
    consumer: dict = field(default_factory=dict)  # tiled stage -> fused consumer stage
    pack: dict = field(default_factory=dict)      # tiled stage -> (input index, axis)
    vec: dict = field(default_factory=dict)       # tiled stage -> its vector axis, when not the last
    block_in: dict = field(default_factory=dict)  # tiled stage -> ("stage"/"input", index, axis) it may block
    choices: dict = field(default_factory=dict)   # the recipe sketch's knobs (sketch_recipe), else empty


TILE_RULES = ("tile", "tile_cache_write", "tile_fused")


def generate_sketches(opdef, target=None) -> list:
    """Sketches of `opdef` derived by the rules of this module (see its docstring)."""
    target = resolve_target(target)
    dag = _Dag(opdef)
    inlinable = {i for i in range(dag.n) if not dag.is_reduce(i) and not dag.is_output(i)}
    tiled = [i for i in range(dag.n) if dag.is_reduce(i) and dag.has_reuse(i, inlinable)]
    consumer: dict[int, int] = {}
    for i in reversed(tiled):
        j = dag.fusible_consumer(i, inlinable)
        if j is not None and j not in consumer.values() and j not in tiled:
            consumer[i] = j
    # producers of tiled stages may stay materialized (one choice for all of them)
    feeding = sorted(i for i in inlinable if any(r in tiled for r in dag.effective_readers(i, inlinable - {i})))
    choices = []  # (stages, options): every stage of the group takes the same option
    for i in reversed(range(dag.n)):
        if i in inlinable:
            if i not in feeding:
                choices.append(([i], ["inline"]))
        elif i in consumer.values():
            choices.append(([i], ["fused_consumer"]))
        elif i in tiled:
            if i in consumer:
                choices.append(([i], ["tile_fused"]))
            elif dag.is_output(i):
                choices.append(([i], ["tile_cache_write", "tile"]
                                + [f"tile_cache_write@{d}" for d in dag.vector_axes(i)]))
            else:
                choices.append(([i], ["tile"]))
        elif dag.is_reduce(i):
            opts = ["reduce"]
            if _little_parallelism(dag.op(i), target):
                opts.append("rfactor")
            choices.append(([i], opts))
        else:
            choices.append(([i], ["elementwise"]))
    if feeding:
        choices.append((feeding, ["inline", "root"]))
    sketches = []
    for combo in itertools.product(*[opts for _, opts in choices]):
        rules = {}
        for (stages, _), rule in zip(choices, combo):
            for i in stages:
                rules[i] = rule
        sid = "|".join(f"{dag.names[i]}:{rules[i]}" for i in range(dag.n))
        sk = Sketch(sid, dict(sorted(rules.items())))
        for i, r in list(sk.rules.items()):
            if "@" in r:   # tile_cache_write@d: vectorized along spatial axis d
                r, vec = r.split("@")
                sk.rules[i] = r
                sk.vec[i] = int(vec)
            if r in TILE_RULES:
                if r == "tile_fused":
                    sk.consumer[i] = consumer[i]
                pt = dag.pack_target(i, sk.vec.get(i))
                if pt is not None:
                    sk.pack[i] = pt
                    bt = dag.block_target(i, pt[0]) if i in sk.vec else None
                    if bt is not None:
                        sk.block_in[i] = bt
        sketches.append(sk)
        if len(sketches) >= MAX_SKETCHES:
            break
    return sketches


def _little_parallelism(op, target) -> bool:
    lanes = target.vector_lanes(op.dtype)
    spatial = math.prod(ax.extent for ax in op.axis)
    return op.reduce_axis[-1].extent >= lanes and spatial <= 4 * lanes * target.num_cores


# ----------------------------------------------------------------------------- sampling helpers

def _divisors(n: int) -> list:
    return [d for d in range(1, n + 1) if n % d == 0]


def _pick(rng, seq):
    seq = list(seq)
    return seq[int(rng.integers(len(seq)))]


def _sample_factor(rng, extent: int, cap: int) -> int:
    """A tile size for a loop of `extent`: a divisor up to `cap`, sometimes (more often when the
    extent has few small divisors, a prime) a size that does not divide it."""
    divs = [d for d in _divisors(extent) if d <= cap]
    others = [d for d in NICE_SIZES if d <= min(cap, extent) and extent % d]
    # a long loop whose only small divisor is 1 (a prime like 67) mostly gets non-dividing tiles
    p = 0.5 if divs == [1] or (len(divs) == 2 and extent > cap) else NONDIVIDING_P
    if others and rng.random() < p:
        return _pick(rng, others)
    return _pick(rng, divs)


def _vector_sizes(extent: int, lanes: int) -> list:
    """Lengths of a vectorized innermost loop: whole registers up to 64 lanes (not past the
    extent's last register), or the whole loop when it fits."""
    out = [lanes * m for m in range(1, MAX_VECTOR_LANES // lanes + 1) if lanes * (m - 1) < extent]
    if extent <= MAX_VECTOR_LANES:
        out.append(extent)
    return sorted(set(v for v in out if v > 1)) or [1]


def _sample_levels(rng, rest: int, n: int, caps) -> list:
    """n factors (outer to inner) of `rest` (their product divides it), each within its cap."""
    out = []
    for c in reversed(caps[:n]):
        f = _pick(rng, [d for d in _divisors(rest) if d <= c])
        out.append(f)
        rest //= f
    return list(reversed(out))


# ----------------------------------------------------------------------------- the space

class SketchSpace(SearchSpace):
    """Sketches of one compute definition for one target, and their random annotations."""

    kind = "trace"

    def __init__(self, task_or_opdef, target=None, validate: bool = True):
        self.opdef, self.target = resolve_task(task_or_opdef, target)
        self.validate = validate
        self._lowered: dict = {}  # fingerprint -> loop program lowered while validating it
        self.dag = _Dag(self.opdef)
        self.sketches = generate_sketches(self.opdef, self.target)
        if not self.sketches:  # pragma: no cover - every DAG has at least one sketch
            raise SpaceError(f"no sketch for {self.opdef.name}")
        choices = recipe.recipe_choices(self.opdef, self.target)
        if choices is not None:
            self.sketches.append(Sketch(recipe.RECIPE_SKETCH_ID, {}, choices=choices))
        self._by_id = {sk.id: sk for sk in self.sketches}
        self.workload_key = self.opdef.workload_key()

    def __repr__(self):
        return f"SketchSpace({self.opdef.name}, {len(self.sketches)} sketches)"

    def sketch(self, sketch_id: str) -> Sketch:
        sk = self._by_id.get(sketch_id)
        if sk is None:
            raise SpaceError(f"this space has no sketch {sketch_id!r}; sketches: "
                             f"{', '.join(self._by_id)}")
        return sk

    def _lanes(self, i) -> int:
        return max(4, self.target.vector_lanes(self.dag.op(i).dtype))

    # ------------------------------------------------------------------ parameters
    def sample_params(self, sketch: Sketch, rng) -> dict:
        if sketch.choices:
            return recipe.sample(sketch.choices, rng)
        params = {}
        for i, rule in sketch.rules.items():
            p = self._sample_stage(sketch, i, rule, rng)
            if p is not None:
                params[self.dag.names[i]] = p
        return params

    def _sample_stage(self, sketch, i, rule, rng):
        if rule in TILE_RULES:
            return self._sample_tile_params(sketch, i, rng)
        if rule in ("reduce", "elementwise", "root"):
            return self._sample_loop_params(i, rule, rng)
        if rule == "rfactor":
            r = self.dag.op(i).reduce_axis[-1].extent
            return {"factor": _pick(rng, _vector_sizes(r, self._lanes(i))),
                    "parallel": bool(rng.random() < 0.7)}
        return None

    def _vec_axis(self, i, vec: int | None) -> int:
        return len(self.dag.op(i).axis) - 1 if vec is None else vec

    def _sample_axis_tile(self, i, d, rng, vec: int | None = None) -> list:
        op = self.dag.op(i)
        ext = op.axis[d].extent
        if d == self._vec_axis(i, vec):
            sizes = _vector_sizes(ext, self._lanes(i))
            inner = 1 if rng.random() < 0.05 else _pick(rng, sizes)
        else:
            inner = _sample_factor(rng, ext, MAX_INNER)
        rest = -(-ext // inner)
        s1, s2 = _sample_levels(rng, rest, 2, [rest, 1 if rng.random() < 0.5 else MAX_MIDDLE])
        return [s1, s2, inner]

    def _sample_tile(self, i, rng, vec: int | None = None) -> dict:
        op = self.dag.op(i)
        # mostly register-sized micro-kernels: no more vector accumulators than the target
        # has registers for
        want_regs = rng.random() < REGISTER_TILE_P
        for _ in range(16):
            tile = {f"s{d}": self._sample_axis_tile(i, d, rng, vec) for d in range(len(op.axis))}
            if not want_regs or self._acc_regs(i, tile, vec) <= self.target.capabilities.accumulator_registers:
                break
        for d, ax in enumerate(op.reduce_axis):
            tile[f"r{d}"] = [_sample_factor(rng, ax.extent, MAX_INNER)]
        self._fit_region(i, tile)
        return tile

    def _acc_regs(self, i, tile, vec: int | None = None) -> int:
        n = len(self.dag.op(i).axis)
        v = self._vec_axis(i, vec)
        regs = -(-tile[f"s{v}"][2] // self._lanes(i))
        return regs * math.prod(tile[f"s{d}"][2] for d in range(n) if d != v)

    def _fit_region(self, i, tile: dict):
        """Shrink the S2 levels until the local accumulator region of stage i fills at most half
        of the target's L1 data cache (it stays there beside the operands streaming through)."""
        op = self.dag.op(i)
        n_spatial = len(op.axis)
        max_elems = self.target.capabilities.l1d // 2 // nbytes(op.dtype)

        def region():
            return math.prod(tile[f"s{d}"][1] * tile[f"s{d}"][2] for d in range(n_spatial))
        d = 0
        while region() > max_elems and d < n_spatial:
            tile[f"s{d}"] = [tile[f"s{d}"][0], 1, tile[f"s{d}"][2]]
            d += 1

    def _sample_parallel(self, extents: list, rng) -> int:
        """How many outer loops (of the given extents) are fused and run in parallel."""
        if self.target.num_cores < 2 or not extents:
            return 0
        if rng.random() < 0.7:
            acc, k = 1, 0
            for e in extents:
                acc *= e
                k += 1
                if acc >= 2 * self.target.num_cores:
                    break
            return k
        return int(rng.integers(0, len(extents) + 1))

    def _sample_tile_params(self, sketch, i, rng) -> dict:
        op = self.dag.op(i)
        tile = self._sample_tile(i, rng, sketch.vec.get(i))
        outer = [-(-ax.extent // math.prod(tile[f"s{d}"])) for d, ax in enumerate(op.axis)]
        last_outer = bool(rng.random() < 0.5)
        vec = sketch.vec.get(i)
        vec_last = vec is not None and bool(rng.random() < 0.5)
        outer = _outer_order(outer, last_outer, vec if vec_last else None)
        p = {"tile": tile, "last_outer": last_outer, "parallel": self._sample_parallel(outer, rng),
             "unroll_inner": bool(rng.random() < 0.7), "auto_unroll": _pick(rng, AUTO_UNROLL_STEPS)}
        if vec is not None:
            p["vec_last"] = vec_last
        n_red = len(op.reduce_axis)
        if n_red > 1:  # mostly as defined; else one reduction axis moved innermost
            perm = list(range(n_red))
            if rng.random() >= RED_AS_DEFINED_P:
                perm.append(perm.pop(int(rng.integers(n_red - 1))))
            p["red_perm"] = perm
        if i in sketch.pack:
            p["pack"] = bool(rng.random() < 0.5)
        if i in sketch.block_in:
            p["block_input"] = bool(rng.random() < 0.5)
        return p

    def _sample_loop_params(self, i, rule, rng) -> dict:
        op = self.dag.op(i)
        last = op.axis[-1].extent
        lanes = self._lanes(i)
        if rule == "reduce":
            inner = _pick(rng, ["vec", "unroll", "none"])
        else:
            inner = "vec" if rng.random() < 0.8 else "none"
        if inner == "vec":
            split = _pick(rng, _vector_sizes(last, lanes))
        elif inner == "unroll":
            split = _pick(rng, [f for f in (2, 4, 8, 16) if f < last] + ([last] if last <= MAX_INNER else []) or [1])
        else:
            split = 1
        outer = [ax.extent for ax in _loop_outer(op.axis, rule, inner, split)]
        p = {"inner": inner, "split": split, "parallel": self._sample_parallel(outer, rng)}
        if rule == "reduce":
            p["auto_unroll"] = _pick(rng, AUTO_UNROLL_STEPS)
        return p

    # ------------------------------------------------------------------ applying a sketch
    def apply(self, sketch_id: str, params: dict, opdef=None) -> Schedule:
        """The schedule of sketch `sketch_id` with `params` on `opdef` (the space's by default);
        raises SpaceError when the params do not fit the sketch."""
        sk = self.sketch(sketch_id)
        opdef = opdef or self.opdef
        try:
            if sk.choices:
                return recipe.schedule(opdef, self.target, params)
            return _Applier(self, sk, params, opdef).run()
        except (CompilerError, KeyError, TypeError, IndexError, ValueError) as e:
            if isinstance(e, SpaceError):
                raise
            raise SpaceError(f"sketch {sketch_id!r} does not apply with params {params}: "
                             f"{type(e).__name__}: {e}") from None

    def make_candidate(self, sketch_id: str, params: dict) -> Candidate:
        s = self.apply(sketch_id, params)
        func = None
        if self.validate:
            try:
                func = lower(s, self.opdef.tensors)
            except CompilerError as e:
                raise SpaceError(f"sketch {sketch_id!r} with params {params} does not lower: {e}") from None
        cand = Candidate("trace", {"sketch": sketch_id, "params": copy.deepcopy(params),
                                   "steps": copy.deepcopy(s.steps), "workload_key": self.workload_key})
        if func is not None:
            if len(self._lowered) >= MAX_KEPT_LOWERED:  # candidates never featurized: drop the oldest
                del self._lowered[next(iter(self._lowered))]
            self._lowered[cand.fingerprint] = func
        return cand

    def take_lowered(self, cand: Candidate):
        return self._lowered.pop(cand.fingerprint, None)

    def _first_valid(self, gen, what: str) -> Candidate:
        last = None
        for _ in range(MAX_TRIES):
            sid, params = gen()
            try:
                return self.make_candidate(sid, params)
            except SpaceError as e:
                last = e
        raise SpaceError(f"{what}: no valid candidate in {MAX_TRIES} tries; last error: {last}")

    # ------------------------------------------------------------------ SearchSpace
    def sample(self, rng, sketch: str | None = None) -> Candidate:
        """A random annotation of a random sketch (or of the sketch with id `sketch`)."""
        chosen = self.sketch(sketch) if sketch is not None else None

        def gen():
            sk = chosen or _pick(rng, self.sketches)
            return sk.id, self.sample_params(sk, rng)
        return self._first_valid(gen, "sample")

    def starting_points(self) -> list:
        from .sketch_defaults import default_sketch_candidate
        cand = default_sketch_candidate(self)
        out = [cand] if cand is not None else []
        for sk in self.sketches:
            for params in recipe.starting_points(sk.choices) if sk.choices else ():
                try:
                    out.append(self.make_candidate(sk.id, params))
                except SpaceError:
                    continue
        return out

    def structure(self):
        return ("trace", "sketch", frozenset(self._by_id))

    def same_structure(self, cand: Candidate) -> bool:
        return (cand.kind == "trace" and isinstance(cand.payload, dict)
                and cand.payload.get("sketch") in self._by_id)

    def _parts(self, cand: Candidate):
        if cand.kind != "trace" or not isinstance(cand.payload, dict):
            raise SpaceError(f"expected a trace candidate, got kind {cand.kind!r}")
        sid, params = cand.payload.get("sketch"), cand.payload.get("params")
        if not isinstance(params, dict):
            raise SpaceError("trace candidate has no sketch params (a hand-written trace cannot be mutated)")
        if sid is None:
            raise SpaceError("trace candidate names no sketch")
        return self.sketch(sid), params

    def mutate(self, cand: Candidate, rng) -> Candidate:
        """One parameter changed, or (with probability SWITCH_SKETCH_P, when there are other
        sketches) the candidate moved to another sketch keeping what carries over."""
        sk, params = self._parts(cand)
        if len(self.sketches) > 1 and rng.random() < SWITCH_SKETCH_P:
            try:
                return self.switch_sketch(cand, rng)
            except SpaceError:
                pass   # no other sketch took the parameters in MAX_TRIES: change one within this one
        if sk.choices:
            return self._first_valid(lambda: (sk.id, recipe.mutate(params, sk.choices, rng)), "mutate")
        stages = [n for n in params if params[n]]
        if not stages:
            return cand

        def change_one():
            new = copy.deepcopy(params)
            name = _pick(rng, stages)
            i = self.dag.names.index(name)
            p = new[name]
            key = _pick(rng, sorted(p))
            if key == "tile":
                axis = _pick(rng, sorted(p["tile"]))
                if axis.startswith("s") and rng.random() < 0.5:
                    p["tile"][axis] = _move_factor(p["tile"][axis], rng)
                else:
                    p["tile"][axis] = self._sample_tile(i, rng, sk.vec.get(i))[axis]
                self._fit_region(i, p["tile"])
            else:
                fresh = self._sample_stage(sk, i, sk.rules[i], rng)
                if key in ("inner", "split"):  # the vector/unroll choice and its length go together
                    p["inner"], p["split"] = fresh["inner"], fresh["split"]
                else:
                    p[key] = fresh[key]
            return new

        def gen():
            for _ in range(8):  # a redraw may give the same value: try for a real change
                new = change_one()
                if new != params:
                    break
            return sk.id, new
        return self._first_valid(gen, "mutate")

    def switch_sketch(self, cand: Candidate, rng) -> Candidate:
        """The candidate in another sketch: fresh parameters for the new sketch, overlaid with
        the parent's where they mean the same there (a stage's parallel, unroll and loop-order
        choices, and the tiles of axes whose role, vector or not, is unchanged). Mutation and
        crossover otherwise never leave a sketch, so evolution would stay wherever its first good
        measurement was (on conv2d, in a sketch that plateaus at a third of the best kernels)."""
        sk, params = self._parts(cand)
        others = [o for o in self.sketches if o.id != sk.id]

        def gen():
            new_sk = _pick(rng, others)
            fresh = self.sample_params(new_sk, rng)
            if new_sk.choices or sk.choices:   # the recipe shares no parameter with a sketch's stages
                return new_sk.id, fresh
            for name, p in fresh.items():
                old = params.get(name)
                i = self.dag.names.index(name)
                if not isinstance(old, dict) or (sk.rules.get(i) in TILE_RULES) != (new_sk.rules[i] in TILE_RULES):
                    continue
                for key, value in old.items():
                    if key == "tile" and "tile" in p:
                        v_old, v_new = self._vec_axis(i, sk.vec.get(i)), self._vec_axis(i, new_sk.vec.get(i))
                        for axis, t in value.items():
                            d = int(axis[1:]) if axis.startswith("s") else None
                            if d is None or (d != v_old and d != v_new) or v_old == v_new:
                                p["tile"][axis] = copy.deepcopy(t)
                        self._fit_region(i, p["tile"])
                    elif key in p and key != "tile":
                        p[key] = copy.deepcopy(value)
            return new_sk.id, fresh
        return self._first_valid(gen, "switch_sketch")

    def crossover(self, a: Candidate, b: Candidate, rng) -> Candidate:
        ska, pa = self._parts(a)
        skb, pb = self._parts(b)
        if ska.id != skb.id:
            return self.mutate(a, rng)
        if ska.choices:
            return self._first_valid(lambda: (ska.id, recipe.crossover(pa, pb, rng)), "crossover")

        def gen():
            child = {}
            for name in pa:
                x, y = pa[name], pb.get(name, pa[name])
                c = {}
                for key in x:
                    if key == "tile":
                        c["tile"] = {ax: copy.deepcopy((x if rng.random() < 0.5 else y)["tile"][ax])
                                     for ax in x["tile"]}
                        self._fit_region(self.dag.names.index(name), c["tile"])
                    elif key in ("inner", "split"):
                        src = x if rng.random() < 0.5 else y
                        c["inner"], c["split"] = src["inner"], src["split"]
                    else:
                        c[key] = copy.deepcopy((x if rng.random() < 0.5 else y).get(key, x[key]))
                child[name] = c
            return ska.id, child
        return self._first_valid(gen, "crossover")

    def schedule(self, opdef, cand: Candidate):
        return replay_checked(opdef, cand)


def _loop_outer(axes, rule, inner, split) -> list:
    """The loops in front of a reduce/elementwise stage's inner part, which a parallel prefix
    fuses: the spatial axes but the last, plus the last one's outer part when it is split; with
    no inner annotation, a reduction's spatial loops all (they precede its reduction loops), an
    elementwise stage's all but the last row loop (left to LLVM's vectorizer) unless it has one."""
    axes = list(axes)
    last = axes[-1]
    if inner != "none" and last.extent > 1 and split > 1:
        return axes[:-1] + ([_Outer(-(-last.extent // split))] if split < last.extent else [])
    if rule == "reduce" or len(axes) == 1:
        return axes
    return axes[:-1]


def _outer_order(items: list, last_outer: bool, vec_last: int | None) -> list:
    """Per-axis items (loops or extents) in the order of a tile's outer levels: the last axis
    first when `last_outer`; then the vector axis `vec_last` (if given) moved last."""
    order = list(range(len(items)))
    if last_outer:
        order = order[-1:] + order[:-1]
    if vec_last is not None:
        order = [d for d in order if d != vec_last] + [vec_last]
    return [items[d] for d in order]


class _Outer:
    """Stands for the outer loop a split will create (sampling only needs its extent)."""

    def __init__(self, extent):
        self.extent = extent


def _move_factor(levels: list, rng) -> list:
    """Ansor-style tile mutation: move a factor of one level to another (the innermost level of
    a vector axis keeps its length)."""
    levels = list(levels)
    src = int(rng.integers(len(levels)))
    divs = [d for d in _divisors(levels[src]) if d > 1]
    if not divs:
        return levels
    f = _pick(rng, divs)
    dst = _pick(rng, [k for k in range(len(levels) + 1) if k != src + 1])  # 0 = the outer loop
    levels[src] //= f
    if dst > 0:
        levels[dst - 1] *= f
    if levels[-1] > MAX_VECTOR_LANES:
        levels[-1] = MAX_VECTOR_LANES
    return levels


# ----------------------------------------------------------------------------- applying a sketch

class _Applier:
    """Builds the schedule of a sketch with given params, primitive by primitive (recorded)."""

    def __init__(self, space: SketchSpace, sketch: Sketch, params: dict, opdef):
        self.space, self.sk, self.params = space, sketch, params
        self.opdef = opdef
        self.s = create_schedule(opdef.output)
        self.orig = list(self.s.stages)
        if len(self.orig) != space.dag.n or [st.name for st in self.orig] != space.dag.names:
            raise SpaceError("the definition's stages differ from the space's")
        self.lanes = {i: space._lanes(i) for i in range(space.dag.n)}
        self.inlined_into_copy: set = set()   # producers that block_input copied through

    def p(self, i) -> dict:
        return self.params.get(self.space.dag.names[i], {})

    def run(self) -> Schedule:
        rules = self.sk.rules
        for i, r in rules.items():
            if r == "inline":
                self.orig[i].compute_inline()
        for i in reversed(range(len(self.orig))):
            r = rules[i]
            if r == "tile":
                self.tile_root(i)
            elif r == "tile_cache_write":
                n = len(self.orig[i].op.axis)
                vec = self.sk.vec.get(i, n - 1)
                order = [d for d in range(n) if d != vec] + [vec]   # accumulators: the vector axis last
                acc = self.s[self.s.cache_write(self.orig[i].tensor, "local", order=order)]
                self.tile_attached(i, acc, self.orig[i], order)
            elif r == "tile_fused":
                self.tile_attached(i, self.orig[i], self.orig[self.sk.consumer[i]])
            elif r == "reduce":
                self.reduce(i)
            elif r == "rfactor":
                self.rfactor(i)
            elif r in ("elementwise", "root") and i not in self.inlined_into_copy:
                self.elementwise(i)
        return self.s

    # -- helpers
    @staticmethod
    def split_levels(st, ax, factors) -> list:
        loops, cur = [], ax
        for d in range(len(factors)):
            outer, cur = st.split(cur, factor=math.prod(factors[d:]))
            loops.append(outer)
        loops.append(cur)
        return loops

    @staticmethod
    def parallel_prefix(st, loops, k):
        k = min(int(k), len(loops))
        if k <= 0:
            return None
        loop = loops[0] if k == 1 else st.fuse(*loops[:k])
        st.parallel(loop)
        return loop

    def micro_kernel(self, i, st, spatial_inner, red_inner, p):
        """Vectorize the innermost spatial loop; unroll the other inner loops (innermost
        first) while the unrolled body stays small; auto_unroll."""
        vec = spatial_inner[-1]
        body = 1
        if vec.extent > 1:
            st.vectorize(vec)
            body = -(-vec.extent // self.lanes[i])
        if p.get("unroll_inner"):
            order = st.leaf_iter_vars
            cands = sorted([a for a in spatial_inner[:-1] + red_inner if a.extent > 1],
                           key=lambda a: -order.index(a))
            for a in cands:
                if body * a.extent <= MAX_UNROLLED_BODY:
                    st.unroll(a)
                    body *= a.extent
        if p.get("auto_unroll"):
            st.auto_unroll(int(p["auto_unroll"]))

    def tile_of(self, i, key, n):
        t = self.p(i)["tile"][key]
        if not isinstance(t, list) or len(t) != n or not all(isinstance(f, int) and f > 0 for f in t):
            raise SpaceError(f"tile {key} of {self.space.dag.names[i]} must be {n} positive integers, got {t!r}")
        return t

    def pack(self, i, reader):
        p = self.p(i)
        if not p.get("pack") or i not in self.sk.pack:
            return
        inp, axis = self.sk.pack[i]
        vec = self.sk.vec.get(i, len(self.space.dag.op(i).axis) - 1)
        width = self.tile_of(i, f"s{vec}", 3)[-1]
        if width <= 1:
            return
        tensor = self.s.placeholders[inp]
        packed_tensor = self.s.cache_read(tensor, "global", [reader], block={axis: width})
        packed = self.s[packed_tensor]
        if axis == 0 and tensor.ndim > 2:   # blocks of rows (a conv's OIHW weights): see schedule_weight_panels
            schedule_weight_panels(self.s, packed_tensor, self.lanes[i], lambda work: bool(p.get("parallel")))
            return
        rows = packed.op.axis[:-1]
        if p.get("parallel") and rows and rows[0].extent > 1:
            packed.parallel(rows[0])
        packed.vectorize(packed.op.axis[-1])

    def block_input(self, i, reader):
        """`block_input`: what the tile reads along its first reduction axis (a conv's padded
        input) copied in blocks of that axis's inner tile (r0), a producer inlined into the copy."""
        p = self.p(i)
        if not p.get("block_input") or i not in self.sk.block_in:
            return
        kind, j, axis = self.sk.block_in[i]
        width = self.tile_of(i, "r0", 1)[0]
        if width <= 1:
            return
        src = self.orig[j] if kind == "stage" else None
        tensor = src.tensor if src is not None else self.s.placeholders[j]
        copy_stage = self.s[self.s.cache_read(tensor, "global", [reader], block={axis: width})]
        if src is not None and not src.is_inline:
            src.compute_inline()
            self.inlined_into_copy.add(j)
        schedule_block_copy(copy_stage, lambda work: bool(p.get("parallel")))

    # -- rules
    def outer_first(self, i, sp: list, p: dict) -> list:
        """The spatial axes' split loops in the order of the outer (S0, S1) levels: the last axis
        first when `last_outer` (a matmul's column panels outermost, so a packed B panel stays in
        cache while every row tile uses it: the GEMM default's order), the vector axis last when
        `vec_last` (a convolution's spatial tiles outside its channel blocks, so the smaller
        weights stay in cache), else as defined."""
        vec = self.sk.vec.get(i) if p.get("vec_last") else None
        return _outer_order(sp, bool(p.get("last_outer")), vec)

    def red_order(self, p: dict, rd: list) -> list:
        """The reduction loops (per axis: [outer, inner]) in the tile's `red_perm` order (both
        levels): e.g. a convolution's channel loop innermost, the taps outside it."""
        perm = p.get("red_perm")
        if perm is None:
            return rd
        if sorted(perm) != list(range(len(rd))):
            raise SpaceError(f"red_perm {perm!r} is not a permutation of the {len(rd)} reduction axes")
        return [rd[k] for k in perm]

    def tile_root(self, i):
        st, p = self.orig[i], self.p(i)
        sp = [self.split_levels(st, ax, self.tile_of(i, f"s{d}", 3)) for d, ax in enumerate(st.op.axis)]
        rd = [self.split_levels(st, ax, self.tile_of(i, f"r{d}", 1)) for d, ax in enumerate(st.op.reduce_axis)]
        outer = self.outer_first(i, sp, p)
        rd = self.red_order(p, rd)
        order = [l[0] for l in outer] + [l[1] for l in outer] + [l[0] for l in rd] + [l[2] for l in sp] + \
            [l[1] for l in rd] + [l[3] for l in sp]
        st.reorder(*order)
        self.micro_kernel(i, st, [l[3] for l in sp], [l[1] for l in rd], p)
        self.parallel_prefix(st, [l[0] for l in outer], p.get("parallel", 0))
        self.pack(i, st)

    def tile_attached(self, i, red: Stage, out: Stage, order=None):
        """`out` (the output copy or the fused consumer) tiled S0 S1 S2 S3 and stored along its
        last axis; the reduction `red` computed at its last S1 loop as R0 S2 R1 S3. `order`: the
        cache's dimensions (red's axes) as dimensions of `out`, its vector axis last."""
        p = self.p(i)
        n_sp = len(out.op.axis)
        order = order or list(range(n_sp))
        tiles = [self.tile_of(i, f"s{d}", 3) for d in range(n_sp)]
        sp = [self.split_levels(out, ax, t) for ax, t in zip(out.op.axis, tiles)]
        outer = self.outer_first(i, sp, p)
        out.reorder(*[l[k] for k in range(2) for l in outer], *[l[k] for k in range(2, 4) for l in sp])
        if sp[-1][3].extent > 1:
            out.vectorize(sp[-1][3])
        if i in self.sk.vec:
            self.unroll_store(out, [l[3] for l in sp[:-1]])
        red.compute_at(out, outer[-1][1])
        self.parallel_prefix(out, [l[0] for l in outer], p.get("parallel", 0))
        inner = [red.split(red.op.axis[k], factor=tiles[d][2]) for k, d in enumerate(order)]
        rd = self.red_order(p, [red.split(ax, factor=self.tile_of(i, f"r{d}", 1)[0])
                                for d, ax in enumerate(red.op.reduce_axis)])
        red.reorder(*[r[0] for r in rd], *[x[0] for x in inner], *[r[1] for r in rd], *[x[1] for x in inner])
        self.micro_kernel(i, red, [x[1] for x in inner], [r[1] for r in rd], p)
        self.block_input(i, red)
        self.pack(i, red)

    @staticmethod
    def unroll_store(out: Stage, loops: list):
        """Unroll the store of a tile cached across another vector axis (its rows, innermost
        first, while the copy stays under MAX_UNROLLED_BODY statements): every accumulator is
        then read at a constant offset, so LLVM keeps the whole tile in registers. Left rolled,
        the tile lives on the stack and each FMA loads and stores its accumulator (a 16-channel
        x 4 x 7 conv tile ran at a third of the default schedule's speed)."""
        body = 1
        for loop in reversed(loops):
            if loop.extent > 1 and body * loop.extent <= MAX_UNROLLED_BODY:
                out.unroll(loop)
                body *= loop.extent

    def reduce(self, i):
        st, p = self.orig[i], self.p(i)
        axes, red = list(st.op.axis), list(st.op.reduce_axis)
        last = axes[-1]
        inner, f = p.get("inner", "none"), int(p.get("split", 1))
        outer = _loop_outer(axes, "reduce", inner, f)
        if inner != "none" and last.extent > 1 and f > 1:
            outer, li = self.split_last(st, axes, f)
            st.reorder(*outer, *red, li)
            if inner == "vec":
                st.vectorize(li)
            else:
                st.unroll(li)
        self.parallel_prefix(st, outer, p.get("parallel", 0))
        if p.get("auto_unroll"):
            st.auto_unroll(int(p["auto_unroll"]))

    def rfactor(self, i):
        st, p = self.orig[i], self.p(i)
        f = int(p.get("factor", self.lanes[i]))
        r = st.op.reduce_axis[-1]
        _, ri = st.split(r, factor=f)
        rf = self.s[self.s.rfactor(st.tensor, ri, factor_axis=len(st.op.axis))]
        *sp, lane = rf.op.axis
        rf.reorder(*sp, *rf.op.reduce_axis, lane)
        if lane.extent > 1:
            rf.vectorize(lane)
        if p.get("parallel"):
            live = [a for a in sp]
            if live and math.prod(a.extent for a in live) > 1:
                loop = live[0] if len(live) == 1 else rf.fuse(*live)
                rf.parallel(loop)

    def elementwise(self, i):
        st, p = self.orig[i], self.p(i)
        axes = list(st.op.axis)
        last = axes[-1]
        inner, f = p.get("inner", "none"), int(p.get("split", 1))
        outer = _loop_outer(axes, "elementwise", inner, f)
        if inner == "vec" and last.extent > 1 and f > 1:
            outer, li = self.split_last(st, axes, f)
            st.vectorize(li)
        self.parallel_prefix(st, outer, p.get("parallel", 0))

    @staticmethod
    def split_last(st, axes: list, f: int) -> tuple:
        """(the outer loops, the inner loop) of the last axis split by `f` (whole when it is no
        longer than f): what a reduce or elementwise stage vectorizes or unrolls."""
        outer, last = list(axes[:-1]), axes[-1]
        if f < last.extent:
            lo, li = st.split(last, factor=f)
            return outer + [lo], li
        return outer, last


# ----------------------------------------------------------------------------- replay

def replay_checked(opdef, cand: Candidate):
    """`instantiate` for traces: the recorded steps replayed on `opdef`, after checking that the
    trace was recorded on this workload (when it says which)."""
    payload = cand.payload if isinstance(cand.payload, dict) else {}
    key = payload.get("workload_key")
    if key is not None:
        mine = opdef.workload_key()
        if key != mine:
            raise SpaceError(f"trace does not apply to this workload: it was recorded on workload {key}, "
                             f"this is {getattr(opdef, 'name', '?')} with key {mine}")
    if not isinstance(payload.get("steps"), list):
        raise SpaceError("trace candidate has no 'steps' list")
    return replay_trace(opdef, cand)


register_space_kind("trace", lambda opdef, cand, target: replay_checked(opdef, cand))

__all__ = ["SketchSpace", "Sketch", "generate_sketches", "replay_checked"]
