"""Search strategies behind one ask/tell seam: `next_batch(n)` then `update(candidates, results)`.

- `RandomSearch`, `GridSearch` (enumerable spaces), `GeneticSearch`: model-free;
- `ModelBasedSearch` (cost model + simulated annealing, for templates) and `EvolutionarySearch`
  (cost model + evolution, Ansor-like, for sketches): rank many candidates, measure few, with
  ε-greedy exploration, retraining the model after every batch;
- `EarlyStopping`, `Budget` (trials and seconds); the loop itself is tuner.engine's TaskTuner.
"""

from .base import Budget, EarlyStopping, Strategy, as_generator, throughput
from .basic import GeneticSearch, GridSearch, RandomSearch
from .model_guided import EvolutionarySearch, ModelBasedSearch

STRATEGIES = {
    "random": RandomSearch,
    "grid": GridSearch,
    "genetic": GeneticSearch,
    "model": ModelBasedSearch,
    "evolutionary": EvolutionarySearch,
}

__all__ = ["Strategy", "RandomSearch", "GridSearch", "GeneticSearch", "ModelBasedSearch",
           "EvolutionarySearch", "EarlyStopping", "Budget", "as_generator", "throughput",
           "STRATEGIES"]
