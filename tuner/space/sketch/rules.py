"""Sketch generation: the structure (a rule per stage) of each schedule the space samples from;
the rules are listed in the package docstring.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from compiler.target import resolve_target

from .dag import SketchDag

MAX_SKETCHES = 16


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


__all__ = ["Sketch", "TILE_RULES", "MAX_SKETCHES", "generate_sketches"]
