"""The search-space interface every strategy works against."""

from __future__ import annotations

from abc import ABC, abstractmethod

from ..candidate import Candidate


class SpaceError(ValueError):
    """A candidate that does not apply to a workload, or a space that cannot be built."""


class SearchSpace(ABC):
    """A set of candidates for one task.

    Strategies only use this interface: `sample`, `mutate`, `crossover` for every space;
    `__len__`/`get` (index ↔ candidate) where the space is enumerable (templates).
    """

    kind: str  # "config" | "trace"

    @abstractmethod
    def sample(self, rng) -> Candidate:
        """A random candidate (numpy Generator)."""

    @abstractmethod
    def mutate(self, cand: Candidate, rng) -> Candidate:
        """A neighbour of `cand`: one knob / one annotation / one tile size changed."""

    def crossover(self, a: Candidate, b: Candidate, rng) -> Candidate:
        """A child mixing two parents; spaces without a meaningful crossover mutate `a`."""
        return self.mutate(a, rng)

    @property
    def enumerable(self) -> bool:
        return False

    def __len__(self) -> int:
        raise SpaceError(f"{type(self).__name__} cannot be enumerated")

    def get(self, index: int) -> Candidate:
        raise SpaceError(f"{type(self).__name__} cannot be indexed")

    @abstractmethod
    def schedule(self, opdef, cand: Candidate):
        """(schedule, args) for `cand` on a fresh compute definition `opdef`."""

    def same_structure(self, cand: Candidate) -> bool:
        """Is `cand` (of any workload) a point of a space shaped like this one — the same
        template, or one of the same sketches? The cost model's warm start keeps only such
        records: on a ResNet conv2d, records of matmuls made the first batches worse than none."""
        return cand.kind == self.kind


_KINDS: dict = {}


def register_space_kind(kind: str, instantiator):
    """`instantiator(opdef, candidate) -> (schedule, args)` for candidates of `kind`."""
    _KINDS[kind] = instantiator


def _replay_trace(opdef, cand: Candidate):
    from compiler.errors import ScheduleError
    from compiler.schedule_steps import apply_steps
    try:
        s = apply_steps([opdef.output], cand.payload["steps"])
    except (ScheduleError, KeyError, TypeError) as e:
        raise SpaceError(f"trace does not apply to this workload: {e}") from None
    return s, opdef.tensors


register_space_kind("trace", _replay_trace)


def instantiate(opdef, cand: Candidate):
    """(schedule, args) for any candidate; raises SpaceError when it does not apply."""
    fn = _KINDS.get(cand.kind)
    if fn is None:
        if cand.kind == "config":
            from . import template  # noqa: F401 - registers the "config" kind on import
            fn = _KINDS.get(cand.kind)
        if fn is None:
            raise SpaceError(f"unknown candidate kind {cand.kind!r}")
    return fn(opdef, cand)
