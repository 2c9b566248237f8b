"""Sketch generation: the structure (a rule per stage) of each schedule the space samples from.
The rules are the classes of the `rules` package; each says which stages it applies to.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from compiler.target import resolve_target

from .dag import SketchDag
from .rules import SketchContext, stage_choices

MAX_SKETCHES = 16


@dataclass
class Sketch:
    """The structure of a schedule: a rule per stage (by the stage's index in a fresh schedule)."""

    id: str
    rules: dict                                   # stage index -> rule (a rules.StageRule)
    consumer: dict = field(default_factory=dict)  # tiled stage -> fused consumer stage
    pack: dict = field(default_factory=dict)      # tiled stage -> (input index, axis)
    vec: dict = field(default_factory=dict)       # tiled stage -> its vector axis, when not the last
    block_in: dict = field(default_factory=dict)  # tiled stage -> ("stage"/"input", index, axis) it may block
    choices: dict = field(default_factory=dict)   # the recipe sketch's knobs (sketch.recipe), else empty


def sketch_context(opdef, target) -> SketchContext:
    """What the rules ask of `opdef`'s DAG: the stages that may be inlined, the reductions with
    reuse (tiled), each one's fusible consumer, and the producers of tiled stages."""
    dag = SketchDag(opdef)
    inlinable = {i for i in range(dag.n) if not dag.is_reduce(i) and not dag.is_output(i)}
    tiled = [i for i in range(dag.n) if dag.is_reduce(i) and dag.has_reuse(i, inlinable)]
    consumer: dict[int, int] = {}
    for i in reversed(tiled):
        j = dag.fusible_consumer(i, inlinable)
        if j is not None and j not in consumer.values() and j not in tiled:
            consumer[i] = j
    # producers of tiled stages may stay materialized (one choice for all of them)
    feeding = sorted(i for i in inlinable if any(r in tiled for r in dag.effective_readers(i, inlinable - {i})))
    return SketchContext(dag, target, inlinable, tiled, consumer, feeding)


def generate_sketches(opdef, target=None) -> list:
    """Sketches of `opdef`: every combination of its stages' rule choices (stage_choices), the
    producers of tiled stages taking one choice together, at most MAX_SKETCHES."""
    ctx = sketch_context(opdef, resolve_target(target))
    dag = ctx.dag
    choices = [([i], stage_choices(ctx, i)) for i in reversed(range(dag.n)) if i not in ctx.feeding]
    if ctx.feeding:
        choices.append((ctx.feeding, stage_choices(ctx, ctx.feeding[0])))
    sketches = []
    for combo in itertools.product(*[opts for _, opts in choices]):
        chosen = {i: pick for (stages, _), pick in zip(choices, combo) for i in stages}
        sid = "|".join(f"{dag.names[i]}:{chosen[i][0].label(chosen[i][1])}" for i in range(dag.n))
        sk = Sketch(sid, {i: chosen[i][0] for i in sorted(chosen)})
        for i, (rule, vec) in sorted(chosen.items()):
            if vec is not None:
                sk.vec[i] = vec
            if rule.tiled:
                if i in ctx.consumer:
                    sk.consumer[i] = ctx.consumer[i]
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


__all__ = ["Sketch", "MAX_SKETCHES", "generate_sketches", "sketch_context"]
