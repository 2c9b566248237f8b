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

    def starting_points(self) -> list:
        """Candidates a guided search measures first: the operator's default schedule as this
        space says it, where it can (tuning starts from the best schedule we know)."""
        return []

    def take_lowered(self, cand: Candidate):
        """The loop program this space lowered while validating `cand`, handed over once (so the
        cost model's features need not lower it again), or None."""
        return None

    def structure(self) -> tuple[str, str, frozenset] | None:
        """(candidate kind, payload field, allowed values) that `same_structure` checks, so a
        store can select such records in SQL; None when the space cannot say."""
        return None

    def same_structure(self, cand: Candidate) -> bool:
        """Is `cand` (of any workload) a point of a space shaped like this one — the same
        template, or one of the same sketches? The cost model's warm start keeps only such
        records: on a ResNet conv2d, records of matmuls made the first batches worse than none."""
        return cand.kind == self.kind


# One vocabulary: a space is a "template" or a "sketch" space; its candidates are "config"s and
# "trace"s respectively. "default" is the operator's hand-written default schedule, measured in
# every task as its baseline. The registry is explicit: nothing depends on import order.
SPACE_CANDIDATE_KIND = {"template": "config", "sketch": "trace"}
DEFAULT_KIND = "default"


def resolve_task(task_or_opdef, target):
    """(opdef, target) of a space's subject: a Task (its target unless `target` is given) or an
    OpDef (the host unless `target` is given)."""
    from compiler.target import resolve_target
    if hasattr(task_or_opdef, "workload") and hasattr(task_or_opdef, "target"):
        return task_or_opdef.workload.opdef(), resolve_target(target or task_or_opdef.target)
    if hasattr(task_or_opdef, "output") and hasattr(task_or_opdef, "tensors"):
        return task_or_opdef, resolve_target(target)
    raise SpaceError(f"expected a Task or an OpDef, got {type(task_or_opdef).__name__}")


def default_candidate(workload_key: str) -> Candidate:
    """The baseline of a task: its workload's default schedule."""
    return Candidate(DEFAULT_KIND, {"workload_key": workload_key})


def _instantiate_default(opdef, cand: Candidate, target):
    from compiler.ops import default_schedule
    key = cand.payload.get("workload_key") if isinstance(cand.payload, dict) else None
    if key is not None and key != opdef.workload_key():
        raise SpaceError(f"default-schedule candidate of workload {key} does not apply to {opdef.workload_key()}")
    return default_schedule(opdef, target), opdef.tensors


# kind -> instantiator(opdef, cand, target) -> (schedule, args). The base knows only the default;
# the space modules add their own kinds ("config" in template.py, "trace" in sketch/apply.py) when the
# package imports them, so this module imports none of its children (tuner/space/__init__.py
# imports both, and every import of a tuner.space module runs it first).
_INSTANTIATORS = {DEFAULT_KIND: _instantiate_default}
BUILTIN_KINDS = ("config", "trace", DEFAULT_KIND)


def register_space_kind(kind: str, instantiator) -> None:
    """A space module's own candidate kind (one of BUILTIN_KINDS)."""
    if kind not in BUILTIN_KINDS:
        raise SpaceError(f"candidate kind {kind!r} is not a space's; use register_candidate_kind")
    _INSTANTIATORS[kind] = instantiator


def register_candidate_kind(kind: str, instantiator) -> None:
    """Add a candidate kind (an extension, or a test's): `instantiator(opdef, cand, target)`
    returns (schedule, args). Build processes need it too: register it in the BuilderPool's
    `initializer`."""
    if kind in BUILTIN_KINDS:
        raise SpaceError(f"candidate kind {kind!r} is built in")
    _INSTANTIATORS[kind] = instantiator


def replay_trace(opdef, cand: Candidate):
    """(schedule, args) of a trace's recorded steps replayed on `opdef` (no workload check)."""
    from compiler.errors import ScheduleError
    from compiler.schedule_steps import apply_steps
    try:
        s = apply_steps([opdef.output], cand.payload["steps"])
    except (ScheduleError, KeyError, TypeError) as e:
        raise SpaceError(f"trace does not apply to this workload: {e}") from None
    return s, opdef.tensors


def instantiate(opdef, cand: Candidate, target=None):
    """(schedule, args) of any candidate for `target` (the host by default); SpaceError when it
    does not apply. Needs nothing but the candidate's JSON: build processes call it."""
    from compiler.target import resolve_target
    fn = _INSTANTIATORS.get(cand.kind)
    if fn is None:
        raise SpaceError(f"unknown candidate kind {cand.kind!r}; known: {', '.join(sorted(_INSTANTIATORS))}")
    return fn(opdef, cand, resolve_target(target))
