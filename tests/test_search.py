"""Search strategies: the ask/tell seam, no duplicates, grid coverage, improvement over random,
early stopping and budgets.

The space is a real one (split / reorder / vectorize / unroll / parallel knobs of a matmul applied
with the schedule API; a candidate is the recorded trace); the objective is a known, cheap
function of the knobs, so every test is deterministic. The model-guided strategies rank
candidates with the real features of the lowered loop programs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from matmul_trace import matmul_knob_trace

from compiler.ops.matmul import matmul
from tuner.candidate import Candidate, ErrorCode, MeasureResult
from tuner.search import (
    Budget,
    EarlyStopping,
    EvolutionarySearch,
    GeneticSearch,
    GridSearch,
    ModelBasedSearch,
    RandomSearch,
)
from tuner.space.base import SearchSpace, SpaceError, instantiate


class MatmulKnobSpace(SearchSpace):
    """Tile sizes, loop order, vectorize, unroll and parallel of a matmul; enumerable by index."""

    kind = "trace"
    DEFAULT = {"ti": [1, 2, 4, 8, 16, 32], "tj": [1, 2, 4, 8, 16, 32, 64], "tk": [1, 2, 4, 8, 16, 32, 64],
               "vec": [0, 1], "par": [0, 1], "order": [0, 1], "unroll": [0, 1]}

    def __init__(self, opdef, knobs=None):
        self.opdef = opdef
        self.values = dict(knobs or self.DEFAULT)
        self.names = list(self.values)
        self.sizes = [len(self.values[n]) for n in self.names]
        self._index_of: dict = {}

    @property
    def enumerable(self):
        return True

    def __len__(self):
        return math.prod(self.sizes)

    def get(self, index):
        idx = []
        for n in reversed(self.sizes):
            idx.append(index % n)
            index //= n
        return self.from_indices(tuple(reversed(idx)))

    def knobs(self, cand) -> dict:
        idx = self._index_of[cand.fingerprint]
        return {n: self.values[n][i] for n, i in zip(self.names, idx)}

    def from_indices(self, idx) -> Candidate:
        k = {n: self.values[n][i] for n, i in zip(self.names, idx)}
        c = matmul_knob_trace(self.opdef, **k)
        self._index_of[c.fingerprint] = tuple(idx)
        return c

    def sample(self, rng):
        return self.from_indices(tuple(int(rng.integers(n)) for n in self.sizes))

    def mutate(self, cand, rng):
        idx = list(self._index_of[cand.fingerprint])
        movable = [d for d, n in enumerate(self.sizes) if n > 1]
        d = movable[int(rng.integers(len(movable)))]
        others = [v for v in range(self.sizes[d]) if v != idx[d]]
        idx[d] = others[int(rng.integers(len(others)))]
        return self.from_indices(tuple(idx))

    def crossover(self, a, b, rng):
        ia, ib = self._index_of[a.fingerprint], self._index_of[b.fingerprint]
        return self.from_indices(tuple(x if rng.random() < 0.5 else y for x, y in zip(ia, ib)))

    def schedule(self, opdef, cand):
        return instantiate(opdef, cand)


class SampledOnly(MatmulKnobSpace):
    """The same space seen as a sketch space: sample / mutate / crossover only."""

    @property
    def enumerable(self):
        return False

    def __len__(self):
        raise SpaceError("not enumerable")


def synthetic_cost(space, cand):
    """A known cost: tiles (8, 16, 4) best, vectorize / parallel / order / unroll each help; 1×1 tiles fail."""
    k = space.knobs(cand)
    if k["ti"] == 1 and k["tj"] == 1:
        return None
    lg = math.log2
    cost = 1 + 0.5 * (lg(k["ti"]) - 3) ** 2 + 0.4 * (lg(k["tj"]) - 4) ** 2 + 0.3 * (lg(k["tk"]) - 2) ** 2
    cost *= (0.3 if k["vec"] else 1) * (0.6 if k["par"] else 1) * (0.85 if k["order"] else 1) * \
        (0.9 if k["unroll"] else 1)
    return cost


OPTIMUM = 0.3 * 0.6 * 0.85 * 0.9


def measurer(space):
    def measure(batch):
        out = []
        for c in batch:
            v = synthetic_cost(space, c)
            out.append(MeasureResult(costs=[v]) if v is not None
                       else MeasureResult(error_code=ErrorCode.RUNTIME_ERROR, error_msg="synthetic"))
        return out
    return measure


@pytest.fixture(scope="module")
def op():
    return matmul(64, 64, 64)


def make(name, space, op, seed, visited=()):
    if name == "random":
        return RandomSearch(space, rng=seed, visited=visited)
    if name == "genetic":
        return GeneticSearch(space, rng=seed, visited=visited, pop_size=16, elite_num=4)
    if name == "model":
        return ModelBasedSearch(space, opdef=op, rng=seed, visited=visited, n_parallel=16, sa_iters=15)
    if name == "evolutionary":
        return EvolutionarySearch(space, opdef=op, rng=seed, visited=visited, population_size=32,
                                  num_generations=3)
    raise KeyError(name)



def run_search(strategy, measure, budget, batch_size=16, early_stopping=None):
    """The ask/tell loop over a synthetic `measure(candidates)`: strategies alone, without
    builds, runners or records (tuner.engine.TaskTuner is the real loop)."""
    budget.start()
    while strategy.has_next():
        n = budget.take(batch_size)
        batch = strategy.next_batch(n) if n > 0 else []
        if not batch:
            break
        results = measure(batch)
        strategy.update(batch, results)
        budget.consume(len(batch))
        if early_stopping is not None and early_stopping.update(results):
            break
    return strategy.best_candidate, strategy.best_cost, budget.used_trials

# ----------------------------------------------------------------------------- the seam

@pytest.mark.parametrize("name", ["random", "genetic", "model", "evolutionary"])
def test_no_duplicates_and_visited_respected(op, name):
    space = MatmulKnobSpace(op) if name != "evolutionary" else SampledOnly(op)
    rng = np.random.default_rng(123)
    already = {space.sample(rng).fingerprint for _ in range(40)}  # measured by an earlier run
    st = make(name, space, op, seed=7, visited=already)
    measure = measurer(space)
    seen = set()
    for _ in range(8):
        batch = st.next_batch(12)
        assert len(batch) == 12
        fps = [c.fingerprint for c in batch]
        assert len(set(fps)) == len(fps)
        assert not (set(fps) & seen), "proposed twice"
        assert not (set(fps) & already), "proposed a candidate measured before the resume"
        seen.update(fps)
        st.update(batch, measure(batch))
    assert st.best_candidate is not None and math.isfinite(st.best_cost)
    if name in ("model", "evolutionary"):
        assert st.model.trained
        assert st.predictions > 8 * 12  # ranks more candidates than it proposes


def test_grid_covers_space_exactly_once(op):
    space = MatmulKnobSpace(op, {"ti": [2, 4, 8], "tj": [4, 8], "tk": [1, 4], "vec": [0, 1],
                                 "par": [0], "order": [0, 1], "unroll": [0]})
    assert len(space) == 48
    skip = {space.get(5).fingerprint, space.get(17).fingerprint}
    st = GridSearch(space, visited=skip)
    got = []
    while st.has_next():
        batch = st.next_batch(7)
        if not batch:
            break
        got += batch
        st.update(batch, measurer(space)(batch))
    fps = [c.fingerprint for c in got]
    assert len(fps) == len(set(fps)) == 46
    assert set(fps) | skip == {space.get(i).fingerprint for i in range(len(space))}
    assert not st.has_next() and st.next_batch(4) == []


def test_grid_needs_enumerable_space(op):
    with pytest.raises(SpaceError):
        GridSearch(SampledOnly(op))


def test_random_exhausts_small_space(op):
    space = MatmulKnobSpace(op, {"ti": [2, 4], "tj": [4, 8], "tk": [4], "vec": [0, 1],
                                 "par": [0], "order": [0], "unroll": [0]})
    st = RandomSearch(space, rng=0)
    got = []
    for _ in range(5):
        got += st.next_batch(3)
    assert len({c.fingerprint for c in got}) == len(got) == len(space) == 8
    assert not st.has_next() and st.next_batch(3) == []


# ----------------------------------------------------------------------------- quality

@pytest.mark.parametrize("name", ["genetic", "model", "evolutionary"])
def test_beats_random_on_synthetic_objective(op, name):
    def best_of(strategy_name, seed):
        space = MatmulKnobSpace(op) if strategy_name != "evolutionary" else SampledOnly(op)
        st = make(strategy_name, space, op, seed)
        _, best, trials = run_search(st, measurer(space), Budget(max_trials=64), batch_size=16)
        assert trials == 64
        return best / OPTIMUM

    seeds = (10, 11, 12)
    rand = np.mean([best_of("random", s) for s in seeds])
    mine = np.mean([best_of(name, s) for s in seeds])
    print(f"\n{name}: best/optimum {mine:.2f} vs random {rand:.2f} (64 trials, mean of {len(seeds)} seeds)")
    assert mine < rand * 0.85


def test_model_based_epsilon_greedy(op):
    space = MatmulKnobSpace(op)
    st = ModelBasedSearch(space, opdef=op, rng=3, n_parallel=16, sa_iters=10)
    assert st.eps == 0.05
    measure = measurer(space)
    for _ in range(2):
        b = st.next_batch(16)
        st.update(b, measure(b))
    assert st.model.trained
    st.eps = 0.0   # pure exploitation: the best-predicted unvisited candidates
    greedy = st.next_batch(16)
    st.eps = 1.0   # pure exploration: random unvisited candidates
    explore = st.next_batch(16)
    assert len(greedy) == len(explore) == 16
    assert st.scores(greedy).mean() > st.scores(explore).mean()


def test_evolution_population_persists_with_a_fresh_share(op):
    """The next batch's evolution starts from the last one's unmeasured survivors, the best
    measured candidates and at least `fresh_share` of new samples; nothing measured comes back
    as a survivor."""
    space = SampledOnly(op)
    st = EvolutionarySearch(space, opdef=op, rng=5, population_size=32, num_generations=2, fresh_share=0.25)
    measure = measurer(space)
    for _ in range(2):
        b = st.next_batch(8)
        st.update(b, measure(b))
    survivors = {c.fingerprint for c in st._survivors}
    assert len(survivors) == 32
    sampled = []
    real_sample = space.sample
    space.sample = lambda rng: sampled.append(real_sample(rng)) or sampled[-1]
    try:
        pop = st._initial_population()
    finally:
        del space.sample
    fps = [c.fingerprint for c in pop]
    assert len(pop) == 32
    assert len(sampled) >= 8                                   # a quarter of the population is new
    measured = [fp for fp in fps if fp in st.visited]
    assert 0 < len(measured) <= st.n_best_measured              # measured ones come back as the best measured
    carried = (survivors - st.visited) & set(fps)
    assert len(carried) >= min(len(survivors - st.visited), 32 - 8 - len(measured))
    with pytest.raises(ValueError, match="fresh_share"):
        EvolutionarySearch(space, opdef=op, fresh_share=1.5)


# ----------------------------------------------------------------------------- stopping and budgets

def test_early_stopping_triggers():
    es = EarlyStopping(patience=10)
    ok = lambda c: MeasureResult(costs=[c])  # noqa: E731
    assert not es.update([ok(5.0), ok(4.0), ok(3.0)])
    assert not es.update([ok(3.5)] * 9)
    assert es.update([ok(3.0)])              # the 10th trial without a strict improvement
    es2 = EarlyStopping(patience=4)
    assert es2.update([MeasureResult(error_code=ErrorCode.COMPILE_ERROR)] * 4)  # nothing valid at all


def test_early_stopping_stops_a_search(op):
    space = MatmulKnobSpace(op)
    st = RandomSearch(space, rng=1)
    es = EarlyStopping(patience=8)
    _, _, trials = run_search(st, lambda b: [MeasureResult(costs=[1.0]) for _ in b], Budget(max_trials=1000),
                              batch_size=4, early_stopping=es)
    assert trials == 12  # the first batch sets the best, two more batches of 4 without improvement


def test_budget_trials_and_seconds():
    b = Budget(max_trials=10, used_trials=3)
    assert b.take(16) == 7
    b.consume(7)
    assert b.exhausted and b.take(4) == 0
    now = [0.0]
    t = Budget(max_seconds=5.0, clock=lambda: now[0]).start()
    assert t.take(8) == 8 and not t.exhausted
    now[0] = 5.5
    assert t.exhausted and t.take(8) == 0 and t.remaining_seconds == 0.0
    with pytest.raises(ValueError):
        Budget(max_trials=-1)


def test_search_respects_seconds_budget(op):
    space = MatmulKnobSpace(op)
    now = [0.0]

    def slow_measure(batch):
        now[0] += 1.0  # every batch "takes" a second
        return measurer(space)(batch)

    _, _, trials = run_search(RandomSearch(space, rng=2), slow_measure,
                              Budget(max_seconds=3.0, clock=lambda: now[0]), batch_size=5)
    assert trials == 15


def test_same_seed_same_batches(op):
    a = GeneticSearch(MatmulKnobSpace(op), rng=42)
    b = GeneticSearch(MatmulKnobSpace(op), rng=42)
    for _ in range(3):
        ba, bb = a.next_batch(8), b.next_batch(8)
        assert [c.fingerprint for c in ba] == [c.fingerprint for c in bb]
        a.update(ba, measurer(a.space)(ba))
        b.update(bb, measurer(b.space)(bb))
