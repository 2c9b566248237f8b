"""Model-free strategies: random, grid (enumerable spaces) and a genetic algorithm."""

from __future__ import annotations

import numpy as np

from ..candidate import Candidate
from ..space.base import SpaceError
from .base import Strategy


class RandomSearch(Strategy):
    """Uniformly random unvisited candidates (by index on enumerable spaces, else `space.sample`)."""

    def _propose(self, n: int) -> list:
        return self._random_unvisited(n)


class GridSearch(Strategy):
    """Every candidate of an enumerable space once, in index order (visited ones skipped)."""

    def __init__(self, space, rng=None, visited=()):
        if not space.enumerable:
            raise SpaceError(f"grid search needs an enumerable space; {type(space).__name__} is not")
        super().__init__(space, rng, visited)
        self._next = 0

    def has_next(self) -> bool:
        return self._next < len(self.space)

    def _propose(self, n: int) -> list:
        out: list[Candidate] = []
        taken: set[str] = set()
        size = len(self.space)
        while len(out) < n and self._next < size:
            c = self.space.get(self._next)
            self._next += 1
            if self._fresh(c, taken):
                out.append(c)
        return out


class GeneticSearch(Strategy):
    """AutoTVM-style GA over measured candidates.

    The population is the best `pop_size` measured candidates; the `elite_num` best always take
    part as parents; parents are drawn with probability ∝ normalized throughput. A child is the
    crossover of two parents (probability `crossover_prob`, else a copy of the first) mutated
    with probability `mutation_prob` (always, when the child is already visited). Until
    something has been measured, batches are random.
    """

    def __init__(self, space, rng=None, visited=(), pop_size: int = 64, elite_num: int = 4,
                 crossover_prob: float = 0.7, mutation_prob: float = 0.3):
        super().__init__(space, rng, visited)
        self.pop_size, self.elite_num = int(pop_size), int(elite_num)
        self.crossover_prob, self.mutation_prob = float(crossover_prob), float(mutation_prob)

    def _population(self):
        cands, fit = self._fitness()
        if not cands or fit.max() <= 0:
            return [], np.zeros(0)
        order = np.argsort(-fit, kind="stable")[: self.pop_size]
        return [cands[i] for i in order], fit[order]

    def _propose(self, n: int) -> list:
        pop, fit = self._population()
        if not pop:
            return self._random_unvisited(n)
        p = fit + 1e-3  # even a failed member has a small chance
        p = p / p.sum()
        elites = list(range(min(self.elite_num, len(pop))))
        out: list[Candidate] = []
        taken: set[str] = set()
        tries = self.max_tries_per_candidate * n
        k = 0
        while len(out) < n and tries > 0:
            tries -= 1
            # the elites are parents first, then fitness-proportional draws
            a = elites[k % len(elites)] if k < 2 * len(elites) else int(self.rng.choice(len(pop), p=p))
            k += 1
            child = pop[a]
            if len(pop) > 1 and self.rng.random() < self.crossover_prob:
                b = int(self.rng.choice(len(pop), p=p))
                if b != a:
                    child = self.space.crossover(child, pop[b], self.rng)
            if self.rng.random() < self.mutation_prob or child.fingerprint in self.visited or \
                    child.fingerprint in taken:
                child = self.space.mutate(child, self.rng)
            if self._fresh(child, taken):
                out.append(child)
        if len(out) < n:  # a converged population: fill up with random candidates
            out += self._random_unvisited(n - len(out), taken)
        return out
