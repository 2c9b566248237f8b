"""The sketch search space: its sketches, random annotation of their parameters, and the
evolution operators (mutation, switching sketch, crossover) a guided search uses.
"""

from __future__ import annotations

import json
import math

from compiler.dtypes import nbytes
from compiler.errors import CompilerError
from compiler.lower import lower
from compiler.schedule import Schedule

from ...candidate import Candidate, copy_json
from ..base import SearchSpace, SpaceError, resolve_task
from . import recipe
from .apply import SketchApplier, replay_checked
from .dag import SketchDag
from .generate import Sketch, generate_sketches
from .sampling import move_factor, pick, sample_factor, sample_levels, vector_sizes

MAX_INNER = 16            # innermost tile of a non-vector spatial axis, inner reduction tile
MAX_MIDDLE = 8            # the S2 level (register tiles per attached region)
MAX_KEPT_LOWERED = 4096   # validated loop programs kept for the cost model's features
MAX_MADE = 50_000         # candidates (or errors) remembered by their parameters (make_candidate)
REGISTER_TILE_P = 0.8     # how often a sampled tile's accumulators are held to the target's
SWITCH_SKETCH_P = 0.1     # how often a mutation moves a candidate to another sketch
MAX_TRIES = 24


class SketchSpace(SearchSpace):
    """Sketches of one compute definition for one target, and their random annotations."""

    kind = "trace"

    def __init__(self, task_or_opdef, target=None, validate: bool = True):
        self.opdef, self.target = resolve_task(task_or_opdef, target)
        self.validate = validate
        self._lowered: dict = {}  # fingerprint -> loop program lowered while validating it
        self._made: dict = {}     # (sketch id, params) as JSON -> the Candidate made of them, or its SpaceError
        self.dag = SketchDag(self.opdef)
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

    def lanes(self, i) -> int:
        """The vector width stage i's rules sample and apply with (at least 4)."""
        return max(4, self.target.vector_lanes(self.dag.op(i).dtype))

    # ------------------------------------------------------------------ parameters
    def sample_params(self, sketch: Sketch, rng) -> dict:
        if sketch.choices:
            return recipe.sample(sketch.choices, rng)
        params = {}
        for i, rule in sketch.rules.items():
            p = rule.sample(self, sketch, i, rng)
            if p is not None:
                params[self.dag.names[i]] = p
        return params

    def _vec_axis(self, i, vec: int | None) -> int:
        return len(self.dag.op(i).axis) - 1 if vec is None else vec

    def _sample_axis_tile(self, i, d, rng, vec: int | None = None) -> list:
        op = self.dag.op(i)
        ext = op.axis[d].extent
        if d == self._vec_axis(i, vec):
            sizes = vector_sizes(ext, self.lanes(i))
            inner = 1 if rng.random() < 0.05 else pick(rng, sizes)
        else:
            inner = sample_factor(rng, ext, MAX_INNER)
        rest = -(-ext // inner)
        s1, s2 = sample_levels(rng, rest, 2, [rest, 1 if rng.random() < 0.5 else MAX_MIDDLE])
        return [s1, s2, inner]

    def sample_tile(self, i, rng, vec: int | None = None) -> dict:
        """A random tile of stage i: per spatial axis [S1, S2, S3] factors (the vector axis's
        innermost a whole vector length), per reduction axis its inner factor."""
        op = self.dag.op(i)
        # mostly register-sized micro-kernels: no more vector accumulators than the target
        # has registers for
        want_regs = rng.random() < REGISTER_TILE_P
        for _ in range(16):
            tile = {f"s{d}": self._sample_axis_tile(i, d, rng, vec) for d in range(len(op.axis))}
            if not want_regs or self._acc_regs(i, tile, vec) <= self.target.capabilities.accumulator_registers:
                break
        for d, ax in enumerate(op.reduce_axis):
            tile[f"r{d}"] = [sample_factor(rng, ax.extent, MAX_INNER)]
        self.fit_region(i, tile)
        return tile

    def _acc_regs(self, i, tile, vec: int | None = None) -> int:
        n = len(self.dag.op(i).axis)
        v = self._vec_axis(i, vec)
        regs = -(-tile[f"s{v}"][2] // self.lanes(i))
        return regs * math.prod(tile[f"s{d}"][2] for d in range(n) if d != v)

    def fit_region(self, i, tile: dict):
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

    def sample_parallel(self, extents: list, rng) -> int:
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

    # ------------------------------------------------------------------ applying a sketch
    def apply(self, sketch_id: str, params: dict, opdef=None) -> Schedule:
        """The schedule of sketch `sketch_id` with `params` on `opdef` (the space's by default);
        raises SpaceError when the params do not fit the sketch."""
        sk = self.sketch(sketch_id)
        opdef = opdef or self.opdef
        try:
            if sk.choices:
                return recipe.schedule(opdef, self.target, params)
            return SketchApplier(self, sk, params, opdef).run()
        except (CompilerError, KeyError, TypeError, IndexError, ValueError) as e:
            if isinstance(e, SpaceError):
                raise
            raise SpaceError(f"sketch {sketch_id!r} does not apply with params {params}: "
                             f"{type(e).__name__}: {e}") from None

    def make_candidate(self, sketch_id: str, params: dict) -> Candidate:
        """The candidate of sketch `sketch_id` with `params`, applied and (when validating)
        lowered; SpaceError where they do not fit. Parameters met before give the candidate (or
        the error) made of them then, without applying and lowering them again: evolution breeds
        the same child many times (a 64-trial matmul 512 run asked for 1253 candidates, 893
        distinct), and lowering is most of the search's time."""
        try:
            key = json.dumps([sketch_id, params], sort_keys=True)
        except (TypeError, ValueError):
            key = None
        made = self._made.get(key) if key is not None else None
        if isinstance(made, SpaceError):
            raise SpaceError(str(made))
        if made is not None:
            return made
        try:
            made = self._make_candidate(sketch_id, params)
        except SpaceError as e:
            made = e
        if key is not None:
            if len(self._made) >= MAX_MADE:
                self._made.clear()
            self._made[key] = made
        if isinstance(made, SpaceError):
            raise made
        return made

    def _make_candidate(self, sketch_id: str, params: dict) -> Candidate:
        s = self.apply(sketch_id, params)
        func = None
        if self.validate:
            try:
                func = lower(s, self.opdef.tensors)
            except CompilerError as e:
                raise SpaceError(f"sketch {sketch_id!r} with params {params} does not lower: {e}") from None
        cand = Candidate("trace", {"sketch": sketch_id, "params": copy_json(params),
                                   "steps": copy_json(s.steps), "workload_key": self.workload_key})
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
            sk = chosen or pick(rng, self.sketches)
            return sk.id, self.sample_params(sk, rng)
        return self._first_valid(gen, "sample")

    def starting_points(self) -> list:
        from .defaults import default_sketch_candidate
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
            new = copy_json(params)
            name = pick(rng, stages)
            i = self.dag.names.index(name)
            p = new[name]
            key = pick(rng, sorted(p))
            if key == "tile":
                axis = pick(rng, sorted(p["tile"]))
                if axis.startswith("s") and rng.random() < 0.5:
                    p["tile"][axis] = move_factor(p["tile"][axis], rng)
                else:
                    p["tile"][axis] = self.sample_tile(i, rng, sk.vec.get(i))[axis]
                self.fit_region(i, p["tile"])
            else:
                fresh = sk.rules[i].sample(self, sk, i, rng)
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
            new_sk = pick(rng, others)
            fresh = self.sample_params(new_sk, rng)
            if new_sk.choices or sk.choices:   # the recipe shares no parameter with a sketch's stages
                return new_sk.id, fresh
            for name, p in fresh.items():
                old = params.get(name)
                i = self.dag.names.index(name)
                if not isinstance(old, dict) or getattr(sk.rules.get(i), "tiled", False) != new_sk.rules[i].tiled:
                    continue
                for key, value in old.items():
                    if key == "tile" and "tile" in p:
                        v_old, v_new = self._vec_axis(i, sk.vec.get(i)), self._vec_axis(i, new_sk.vec.get(i))
                        for axis, t in value.items():
                            d = int(axis[1:]) if axis.startswith("s") else None
                            if d is None or (d != v_old and d != v_new) or v_old == v_new:
                                p["tile"][axis] = copy_json(t)
                        self.fit_region(i, p["tile"])
                    elif key in p and key != "tile":
                        p[key] = copy_json(value)
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
                        c["tile"] = {ax: copy_json((x if rng.random() < 0.5 else y)["tile"][ax])
                                     for ax in x["tile"]}
                        self.fit_region(self.dag.names.index(name), c["tile"])
                    elif key in ("inner", "split"):
                        src = x if rng.random() < 0.5 else y
                        c["inner"], c["split"] = src["inner"], src["split"]
                    else:
                        c[key] = copy_json((x if rng.random() < 0.5 else y).get(key, x[key]))
                child[name] = c
            return ska.id, child
        return self._first_valid(gen, "crossover")

    def schedule(self, opdef, cand: Candidate):
        return replay_checked(opdef, cand)


__all__ = ["SketchSpace"]
