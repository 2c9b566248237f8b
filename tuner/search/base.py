"""The ask/tell seam every search strategy implements, plus early stopping and budgets.

A tuning loop (tuner.engine.TaskTuner) does, until the budget is spent, the strategy has nothing
left or early stopping says so:

    batch = strategy.next_batch(budget.take(batch_size))   # ask
    results = measure(batch)                                # build + run (local or the farm)
    strategy.update(batch, results)                         # tell
    budget.consume(len(batch)); early.update(results)

A strategy never proposes a candidate whose fingerprint it has proposed or been told about;
`visited` (fingerprints already measured, from the records) makes a resumed job skip them too.
Where a strategy can say which loop program a candidate lowers to (`program_key`: the guided
strategies lower every candidate they rank), it never proposes a second candidate of a program
it has proposed or been told about either: one build and one timing per program. Such a twin is
*adopted* instead: once its program's result is known it joins the history with that result (a
parent for evolution, as the measured candidate is), without a build, a timing or a record.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod

import numpy as np

from ..candidate import Candidate, MeasureResult


def as_generator(rng) -> np.random.Generator:
    """A numpy Generator from a Generator, a seed, or None (fresh entropy)."""
    if isinstance(rng, np.random.Generator):
        return rng
    return np.random.default_rng(rng)


def throughput(result: MeasureResult) -> float:
    """1 / mean cost of a successful measurement, 0 for a failed one (higher = better)."""
    if not result.ok:
        return 0.0
    c = result.cost
    return 1.0 / c if c > 0 and math.isfinite(c) else 0.0


class Strategy(ABC):
    """Base of every search strategy: proposes unvisited candidates of `space`, learns from results.

    Subclasses implement `_propose(n)` (and optionally `_learn(candidates, results)`); the base
    class does the bookkeeping: visited fingerprints, measured history, best so far, exhaustion.
    """

    #: tries of `space.sample` / `space.mutate` per wanted candidate before giving up
    max_tries_per_candidate = 30

    def __init__(self, space, rng=None, visited=()):
        self.space = space
        self.rng = as_generator(rng)
        self.visited: set = set(visited)   # fingerprints proposed by us or measured by anyone
        self.history: list = []            # [(Candidate, MeasureResult)] told to this strategy
        self.best_candidate: Candidate | None = None
        self.best_cost = math.inf
        self._exhausted = False
        # program key -> the MeasureResult of the candidate measured with it (None: proposed, not
        # yet told); twins waiting for that result; how many candidates were adopted so
        self.visited_programs: dict = {}
        self._twins: dict = {}
        self.adopted = 0

    # ------------------------------------------------------------------ the seam
    def next_batch(self, n: int) -> list:
        """Up to `n` new candidates (fewer, possibly none, when the space runs out)."""
        if n <= 0 or not self.has_next():
            return []
        batch = self._propose(n)
        out, seen, programs = [], set(), set()
        for c in batch:  # the seam's promise, whatever a subclass did
            fp = c.fingerprint
            if fp in self.visited or fp in seen:
                continue
            key = self.program_key(c)
            if key is not None and (key in self.visited_programs or key in programs):
                self._adopt(c, key)
                continue
            seen.add(fp)
            if key is not None:
                programs.add(key)
            out.append(c)
        self.visited.update(seen)
        for key in programs:
            self.visited_programs.setdefault(key, None)
        if not out:
            self._exhausted = True
        return out[:n]

    def update(self, candidates, results) -> None:
        """Tell the strategy the measured results of (some of) the candidates it proposed."""
        candidates, results = list(candidates), list(results)
        if len(candidates) != len(results):
            raise ValueError(f"{len(candidates)} candidates but {len(results)} results")
        for c, r in zip(candidates, results):
            self.visited.add(c.fingerprint)
            self.history.append((c, r))
            if r.ok and r.cost < self.best_cost:
                self.best_cost, self.best_candidate = r.cost, c
        self._learn(candidates, results)
        for c, r in zip(candidates, results):   # (after _learn: a guided strategy has their keys now)
            key = self.program_key(c)
            if key is not None:
                self.know_program(key, r)

    # ------------------------------------------------------------------ one program, one timing
    def program_key(self, cand: Candidate) -> str | None:
        """The loop program `cand` lowers to (tuner.program_key), or None where this strategy
        cannot say without lowering it (the model-free strategies: they never compare programs)."""
        return None

    def know_program(self, key: str, result: MeasureResult) -> None:
        """A program's measured result (a told candidate's, or the baseline's: the engine tells
        the default schedule's program, which a starting point may lower to); twins of it that
        waited for it join the history with it."""
        self.visited_programs[key] = result
        for twin in self._twins.pop(key, ()):
            self.history.append((twin, result))

    def _adopt(self, cand: Candidate, key: str) -> None:
        """`cand` lowers to a program proposed or measured already: never proposed itself, it
        takes that program's result into the history (now, or when the result is told)."""
        fp = cand.fingerprint
        if fp in self.visited:
            return
        self.visited.add(fp)
        self.adopted += 1
        known = self.visited_programs.get(key)
        if known is not None:
            self.history.append((cand, known))
        else:
            self._twins.setdefault(key, []).append(cand)

    def has_next(self) -> bool:
        """False once the space has no unvisited candidate left (as far as the strategy can tell)."""
        if self._exhausted:
            return False
        if self.space.enumerable:  # (assumes `visited` holds fingerprints of this task only)
            return len(self.visited) < len(self.space)
        return True

    # ------------------------------------------------------------------ for subclasses
    @abstractmethod
    def _propose(self, n: int) -> list:
        """Up to n candidates, preferably unvisited and distinct (the base class filters)."""

    def _learn(self, candidates, results) -> None:  # noqa: B027 - an optional hook, not abstract
        """Hook: react to results (retrain a model, update a population)."""

    def _fresh(self, cand: Candidate, taken: set) -> bool:
        """Is `cand` neither visited nor already in the batch being built (`taken`), nor a twin of
        a program that is (`program_key`; a twin is adopted)? Marks it taken."""
        fp = cand.fingerprint
        if fp in self.visited or fp in taken:
            return False
        key = self.program_key(cand)
        if key is not None:
            mark = "program:" + key
            if key in self.visited_programs or mark in taken:
                self._adopt(cand, key)
                return False
            taken.add(mark)
        taken.add(fp)
        return True

    def _random_unvisited(self, n: int, taken: set | None = None) -> list:
        """Up to n uniformly random unvisited candidates not in `taken` (which it extends)."""
        taken = set() if taken is None else taken
        out: list[Candidate] = []
        space = self.space
        tries = self.max_tries_per_candidate * max(n, 1)
        if space.enumerable:
            size = len(space)
            while len(out) < n and tries > 0:
                tries -= 1
                c = space.get(int(self.rng.integers(size)))
                if self._fresh(c, taken):
                    out.append(c)
            if len(out) < n and size <= 200_000:  # rejection failed: scan what is left
                rest = [c for c in (space.get(i) for i in range(size))
                        if c.fingerprint not in self.visited and c.fingerprint not in taken]
                for k in self.rng.permutation(len(rest))[: n - len(out)]:
                    taken.add(rest[k].fingerprint)
                    out.append(rest[k])
            return out
        while len(out) < n and tries > 0:
            tries -= 1
            c = space.sample(self.rng)
            if self._fresh(c, taken):
                out.append(c)
        return out

    def _fitness(self) -> tuple:
        """(candidates, normalized throughput in [0, 1]) of everything measured so far."""
        if not self.history:
            return [], np.zeros(0)
        cands = [c for c, _ in self.history]
        t = np.array([throughput(r) for _, r in self.history])
        best = t.max()
        return cands, (t / best if best > 0 else t)


class EarlyStopping:
    """Stop when `patience` trials in a row did not improve the best cost (by `min_delta`, relative)."""

    def __init__(self, patience: int, min_delta: float = 0.0):
        if patience < 1:
            raise ValueError("patience must be at least 1")
        self.patience, self.min_delta = int(patience), float(min_delta)
        self.trials = 0
        self.best_cost = math.inf
        self.best_trial = 0   # trials count when the best was found (0: nothing valid yet)

    def update(self, results) -> bool:
        """Count the results of one batch; True when the search should stop."""
        for r in results:
            self.trials += 1
            if r.ok and r.cost < self.best_cost * (1.0 - self.min_delta):
                self.best_cost = r.cost
                self.best_trial = self.trials
        return self.should_stop

    @property
    def should_stop(self) -> bool:
        return self.trials - self.best_trial >= self.patience


class Budget:
    """Trials and wall-clock seconds a tuning job may spend; either limit may be None.

    `used_trials` lets a resumed job count what its records already hold. The clock starts at
    `start()` (or at the first `take`/`consume`).
    """

    def __init__(self, max_trials: int | None = None, max_seconds: float | None = None,
                 used_trials: int = 0, clock=time.monotonic):
        if max_trials is not None and max_trials < 0:
            raise ValueError("max_trials must be >= 0")
        if max_seconds is not None and max_seconds < 0:
            raise ValueError("max_seconds must be >= 0")
        self.max_trials, self.max_seconds = max_trials, max_seconds
        self.used_trials = int(used_trials)
        self._clock = clock
        self._t0 = None

    def start(self) -> "Budget":
        if self._t0 is None:
            self._t0 = self._clock()
        return self

    @property
    def elapsed(self) -> float:
        return 0.0 if self._t0 is None else self._clock() - self._t0

    @property
    def remaining_trials(self):
        return None if self.max_trials is None else max(self.max_trials - self.used_trials, 0)

    @property
    def remaining_seconds(self):
        return None if self.max_seconds is None else max(self.max_seconds - self.elapsed, 0.0)

    @property
    def exhausted(self) -> bool:
        if self.max_trials is not None and self.used_trials >= self.max_trials:
            return True
        return self.max_seconds is not None and self._t0 is not None and self.elapsed >= self.max_seconds

    def take(self, n: int) -> int:
        """How many of the next `n` trials the budget allows (0 when exhausted)."""
        self.start()
        if self.exhausted:
            return 0
        r = self.remaining_trials
        return n if r is None else min(n, r)

    def consume(self, n: int) -> None:
        self.start()
        self.used_trials += int(n)

    def __repr__(self):
        return (f"Budget(trials={self.used_trials}/{self.max_trials}, "
                f"seconds={self.elapsed:.1f}/{self.max_seconds})")
