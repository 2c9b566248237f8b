"""Strategies guided by the cost model: many candidates ranked, few measured.

- `ModelBasedSearch` (AutoTVM's model-based tuner, for templates): simulated annealing over the
  space with `space.mutate` as the neighbour move and the cost model's score as the energy; the
  batch is the best-predicted unvisited candidates the chains met.
- `EvolutionarySearch` (Ansor's evolutionary search, for sketches): a population of random
  samples plus the best measured candidates evolves for a few generations by mutation and
  crossover, parents drawn by predicted score; the batch is the best-predicted unvisited ones.

Both measure the space's starting points first (`seeds`: the default schedule as the space says
it), pick a fraction `eps` of every batch at random (ε-greedy exploration; the best-predicted
candidates come first in a batch, the random ones after them), retrain the model after every
batch, and propose random candidates until the model has something to learn from.
Features come from `featurizer(candidates) -> [n, F]` (default: `features_for(opdef, ·, target)`,
lowering each candidate), cached per fingerprint because annealing and evolution revisit points.
The default featurizer also keeps each candidate's `program_key`, so a batch never holds two
candidates of one loop program, nor one of a program measured before (base.Strategy): on the
multi-stage computes a tenth to a fifth of distinct candidates are such twins.
"""

from __future__ import annotations

import numpy as np

from ..candidate import Candidate
from ..cost_model import XGBCostModel
from ..space.base import SpaceError
from .base import Strategy


class _ModelGuided(Strategy):
    def __init__(self, space, opdef=None, target=None, cost_model: XGBCostModel | None = None,
                 featurizer=None, rng=None, visited=(), eps: float = 0.05, group: str = "current",
                 feature_cache_size: int = 200_000, seeds=()):
        super().__init__(space, rng, visited)
        self.seeds = list(seeds)  # measured first, before anything the model picks
        self._keys: dict = {}     # fingerprint -> program key (the default featurizer's)
        if featurizer is None:
            if opdef is None:
                raise ValueError(f"{type(self).__name__} needs an opdef (for features) or a featurizer")
            from compiler.target import resolve_target

            from ..features import features_for
            tgt = resolve_target(target)
            featurizer = lambda cands: features_for(opdef, cands, tgt, lowered=space.take_lowered,  # noqa: E731
                                                    keys=self._keys)
        self.featurizer = featurizer
        self.model = cost_model if cost_model is not None else XGBCostModel()
        self.eps = float(eps)
        self.group = group
        self._cache: dict = {}
        self._cache_size = int(feature_cache_size)
        self.predictions = 0  # candidates scored by the model so far (for reports)
        # set by the engine around an `update` whose retrain it runs later (`retrain`), beside builds
        self.defer_retrain = False

    # ------------------------------------------------------------------ features and scores
    def features(self, cands) -> np.ndarray:
        fps = [c.fingerprint for c in cands]
        missing, seen = [], set()
        for c, fp in zip(cands, fps):
            if fp not in self._cache and fp not in seen:
                seen.add(fp)
                missing.append(c)
        if missing:
            if len(self._cache) + len(missing) > self._cache_size:
                self._cache.clear()
                self._keys.clear()   # (in place: the default featurizer writes into this dict)
            X = np.asarray(self.featurizer(missing), dtype=np.float64)
            for c, row in zip(missing, X):
                self._cache[c.fingerprint] = row
        return np.stack([self._cache[fp] for fp in fps]) if fps else np.zeros((0, 0))

    def program_key(self, cand: Candidate) -> str | None:
        """The program key the featurizer noted for `cand` (featurizing it first if needed)."""
        fp = cand.fingerprint
        if fp not in self._keys and fp not in self._cache:
            self.features([cand])
        return self._keys.get(fp)

    def scores(self, cands) -> np.ndarray:
        """Predicted scores, higher = faster; -inf for candidates without features."""
        if not cands:
            return np.zeros(0)
        self.predictions += len(cands)
        return self.model.predict(self.features(cands))

    def _learn(self, candidates, results) -> None:
        if not candidates:
            return
        self.model.update(self.features(candidates), results, group=self.group, retrain=not self.defer_retrain)

    def retrain(self) -> None:
        """Retrain the model on what `update` told it while `defer_retrain` was set."""
        self.model.retrain()

    # ------------------------------------------------------------------ batches
    def _propose(self, n: int) -> list:
        taken: set[str] = set()
        first = [c for c in self.seeds if self._fresh(c, taken)][:n]
        self.seeds = []
        return first + self._propose_rest(n - len(first), taken)

    def _propose_rest(self, n: int, taken: set) -> list:
        if n <= 0:
            return []
        if not self.model.trained:
            return self._random_unvisited(n, taken)
        ranked = self._ranked(n)
        expected = n * self.eps
        n_random = int(expected) + (1 if self.rng.random() < expected - int(expected) else 0)
        n_random = min(n_random, n - 1) if n > 1 else n_random  # the best-predicted always goes
        out: list[Candidate] = []
        k = 0
        while len(out) < n - n_random and k < len(ranked):  # best predicted first, then random
            if self._fresh(ranked[k], taken):
                out.append(ranked[k])
            k += 1
        if len(out) < n:
            out += self._random_unvisited(n - len(out), taken)
        return out

    def _ranked(self, n: int) -> list:
        """Unvisited candidates, best predicted first (at least n when the space allows)."""
        raise NotImplementedError

    @staticmethod
    def _keep_best(best: dict, cands, scores, visited):
        for c, s in zip(cands, scores):
            if not np.isfinite(s):
                continue
            fp = c.fingerprint
            if fp in visited:
                continue
            old = best.get(fp)
            if old is None or s > old[0]:
                best[fp] = (float(s), c)


class ModelBasedSearch(_ModelGuided):
    """Cost model + simulated annealing (AutoTVM's model-based tuner), for template spaces.

    `n_parallel` chains walk `sa_iters` steps per batch (temperature `temp[0]` → `temp[1]`, in
    units of the current score spread); the chains persist across batches. A step moves every
    chain to `space.mutate(point)`, accepted if better or with probability exp(Δ/T). The
    `plan_size` (default 2·n) best-predicted unvisited points met become the plan; the annealing
    stops early when the plan has not changed for `early_stop` steps.
    """

    def __init__(self, space, opdef=None, target=None, cost_model=None, featurizer=None, rng=None,
                 visited=(), eps: float = 0.05, group: str = "current", n_parallel: int = 64,
                 sa_iters: int = 40, temp=(1.0, 0.0), early_stop: int = 10, plan_size: int | None = None,
                 cold_pool_factor: int = 4, **kw):
        super().__init__(space, opdef, target, cost_model, featurizer, rng, visited, eps, group, **kw)
        self.n_parallel, self.sa_iters = int(n_parallel), int(sa_iters)
        self.cold_pool_factor = max(int(cold_pool_factor), 1)
        self.temp, self.early_stop, self.plan_size = temp, int(early_stop), plan_size
        self._points: list = []

    def _ranked(self, n: int) -> list:
        k = max(self.plan_size or 2 * n, n)
        rng = self.rng
        missing = self.n_parallel - len(self._points)
        if missing > 0 and not self.history:
            missing += self.n_parallel * (self.cold_pool_factor - 1)  # see EvolutionarySearch
        points = self._points + [self.space.sample(rng) for _ in range(max(missing, 0))]
        cur = self.scores(points)
        best: dict = {}
        self._keep_best(best, points, cur, self.visited)
        if len(points) > self.n_parallel:  # chains start from the best-predicted samples
            keep = np.argsort(-np.where(np.isfinite(cur), cur, -np.inf), kind="stable")[: self.n_parallel]
            points, cur = [points[i] for i in keep], cur[keep]
        t0, t1 = self.temp
        unchanged, last = 0, None
        for it in range(self.sa_iters):
            t = t0 + (t1 - t0) * it / max(self.sa_iters - 1, 1)
            new = [self.space.mutate(p, rng) for p in points]
            ns = self.scores(new)
            self._keep_best(best, new, ns, self.visited)
            finite = np.isfinite(cur) & np.isfinite(ns)
            spread = np.ptp(ns[np.isfinite(ns)]) if np.isfinite(ns).any() else 1.0
            scale = max(spread, 1e-9) * max(t, 1e-9)
            with np.errstate(over="ignore", invalid="ignore"):  # -inf - -inf where neither has features
                delta = np.where(finite, ns - cur, np.where(np.isfinite(ns), np.inf, -np.inf))
                accept = (delta >= 0) | (rng.random(len(points)) < np.exp(np.minimum(delta / scale, 0.0)))
            for i in np.flatnonzero(accept):
                points[i], cur[i] = new[i], ns[i]
            top = frozenset(sorted(best, key=lambda fp: -best[fp][0])[:k])
            unchanged = unchanged + 1 if top == last else 0
            last = top
            if unchanged >= self.early_stop:
                break
        self._points = points
        ranked = sorted(best.values(), key=lambda sc: -sc[0])
        return [c for _, c in ranked[:k]]


class EvolutionarySearch(_ModelGuided):
    """Ansor-like evolutionary search with the cost model, for sketch spaces.

    Population: `population_size` candidates, the `n_best_measured` best measured ones, the
    unmeasured survivors of the previous batch's evolution, and at least a `fresh_share` of
    random samples. Each of `num_generations` generations breeds `population_size` children
    (mutation with probability `mutation_prob`, else crossover of two parents; parents drawn with
    probability softmax(standardized predicted score)) and keeps the best-predicted
    `population_size` of parents + children. The batch: the best-predicted unvisited candidates
    met, with ε-greedy random picks.

    The population persists across batches, as the annealing chains of ModelBasedSearch do:
    Ansor starts each round from new random samples, but every sample is lowered to be ranked
    (most of the search's time), and a survivor the model ranked high last batch is a better
    parent than a new sample. The fresh share (at least one sample) keeps the exploration: a
    64-trial matmul 512 run, 8 per batch, made 1 250 candidates with a whole population of new
    samples per batch, 750 with a quarter.
    """

    def __init__(self, space, opdef=None, target=None, cost_model=None, featurizer=None, rng=None,
                 visited=(), eps: float = 0.05, group: str = "current", population_size: int = 128,
                 num_generations: int = 4, n_best_measured: int = 16, mutation_prob: float = 0.85,
                 cold_pool_factor: int = 2, fresh_share: float = 0.25, **kw):
        super().__init__(space, opdef, target, cost_model, featurizer, rng, visited, eps, group, **kw)
        self.population_size, self.num_generations = int(population_size), int(num_generations)
        self.n_best_measured, self.mutation_prob = int(n_best_measured), float(mutation_prob)
        self.cold_pool_factor = max(int(cold_pool_factor), 1)
        if not 0.0 <= fresh_share <= 1.0:
            raise ValueError(f"fresh_share must be in [0, 1], got {fresh_share!r}")
        self.fresh_share = float(fresh_share)
        self._survivors: list = []   # the last evolution's population, best predicted first

    def _initial_population(self) -> list:
        cands, fit = self._fitness()
        pop, seen = [], set()
        if cands:
            for i in np.argsort(-fit, kind="stable")[: self.n_best_measured]:
                if fit[i] > 0 and cands[i].fingerprint not in seen:
                    seen.add(cands[i].fingerprint)
                    pop.append(cands[i])
        size = self.population_size
        if not pop and not self._survivors:
            # Nothing measured of this workload yet, but the model already ranks (warm-started
            # from other workloads): the first batch is chosen from a wider random pool, since
            # without measured parents evolution has only the samples to start from.
            size *= self.cold_pool_factor
        room = size - len(pop) - max(1, round(self.fresh_share * size))
        for c in self._survivors:
            if room <= 0:
                break
            fp = c.fingerprint
            if fp not in self.visited and fp not in seen:
                seen.add(fp)
                pop.append(c)
                room -= 1
        pop += [self.space.sample(self.rng) for _ in range(size - len(pop))]
        return pop

    def _ranked(self, n: int) -> list:
        rng = self.rng
        pop = self._initial_population()
        sc = self.scores(pop)
        best: dict = {}
        self._keep_best(best, pop, sc, self.visited)
        for _ in range(self.num_generations):
            p = _selection_probs(sc)
            if p is None:
                break
            children = []
            for _ in range(self.population_size):
                a = pop[int(rng.choice(len(pop), p=p))]
                try:
                    if rng.random() < self.mutation_prob:
                        children.append(self.space.mutate(a, rng))
                    else:
                        b = pop[int(rng.choice(len(pop), p=p))]
                        children.append(self.space.crossover(a, b, rng))
                except SpaceError:   # no valid child in the space's tries: this slot stays the parent
                    children.append(a)
            cs = self.scores(children)
            self._keep_best(best, children, cs, self.visited)
            # survivors: the best-predicted distinct members of parents + children
            allc, alls = pop + children, np.concatenate([sc, cs])
            pop, keep, seen = [], [], set()
            for i in np.argsort(-alls, kind="stable"):
                fp = allc[i].fingerprint
                if fp in seen:
                    continue
                seen.add(fp)
                pop.append(allc[i])
                keep.append(alls[i])
                if len(pop) == self.population_size:
                    break
            sc = np.array(keep)
        self._survivors = pop
        ranked = [c for _, c in sorted(best.values(), key=lambda x: -x[0])]
        return _spread_over_sketches(ranked, n)[: 2 * n]


def _spread_over_sketches(ranked: list, n: int) -> list:
    """Half of a batch: the best-predicted candidate of each sketch in turn; then by score.

    Mutation and crossover keep a candidate's sketch, so without this the search locks onto the
    sketch of the first good measurement (on conv2d, 90 % of trials in a sketch that plateaus at
    a third of the best kernels). Spreading keeps measuring every sketch, which also trains the
    cost model on all of them.
    """
    groups: dict = {}
    for c in ranked:
        groups.setdefault(c.payload.get("sketch") if isinstance(c.payload, dict) else None, []).append(c)
    if len(groups) < 2:
        return ranked
    out: list[Candidate] = []
    used: set[str] = set()
    queues = [list(g) for g in groups.values()]  # in order of each sketch's best prediction
    while len(out) < max(n // 2, 1) and any(queues):
        for q in queues:
            if q and len(out) < max(n // 2, 1):
                c = q.pop(0)
                out.append(c)
                used.add(c.fingerprint)
    return out + [c for c in ranked if c.fingerprint not in used]


def _selection_probs(scores: np.ndarray):
    ok = np.isfinite(scores)
    if not ok.any():
        return None
    s = np.where(ok, scores, np.nan)
    std = np.nanstd(s)
    z = (s - np.nanmax(s)) / (std if std > 0 else 1.0)
    w = np.where(ok, np.exp(z), 0.0)
    return w / w.sum()
