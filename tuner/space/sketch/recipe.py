"""The recipe sketch: an anchor's default schedule with its choices as the parameters.

A convolution (compiler/ops/schedule_anchor.py: a conv2d_nchwc anchor with its epilogue, a
conv2d_nchw one, the inventory's conv2d_nchw) gets a default schedule no rule of the sketch space
writes: register tiles of channel blocks, the reduction row-accumulated in L1 where the weights
outrun L2; for NCHW, channel or column vectors, an input copied into channel blocks, weight
panels, the taps unrolled or not. The generic sketches rarely match it in the few trials a task
gets (ResNet-18's 100 trials: not one of 19 tasks beat its default; ResNet-50's NCHW layers at
32 trials: none), so the space carries the recipe itself as one more sketch, whose parameters
are the recipe's knobs (anchor_recipe_choices: the register tile and its vector axis, the walk
order, row accumulation, the input copy, the taps' order).
Sampling draws each knob; mutation redraws one; crossover takes each knob from either parent;
the starting points are the default's nearest alternatives, so a short search measures them
first. Its candidates are traces like every sketch's: the recorded steps replay without this
module.
"""

from __future__ import annotations

from compiler.errors import CompilerError
from compiler.ops.schedule_anchor import anchor_recipe_choices, schedule_anchor_recipe

from ...candidate import copy_json

RECIPE_SKETCH_ID = "recipe"
RECIPE_PARAMS = "recipe"        # the params' one entry: {knob: value}
STARTING_ALTERNATIVES = 3       # starting points: the default's next-ranked alternatives


def recipe_choices(opdef, target) -> dict | None:
    """{knob: values, the default first} of `opdef`'s recipe, or None when it has none."""
    try:
        choices = anchor_recipe_choices(opdef, target)
    except CompilerError:
        return None
    return choices if choices and any(len(v) > 1 for v in choices.values()) else None


def sample(choices: dict, rng) -> dict:
    return {RECIPE_PARAMS: {knob: copy_json(values[int(rng.integers(len(values)))])
                            for knob, values in choices.items()}}


def mutate(params: dict, choices: dict, rng) -> dict:
    """One knob of several values redrawn to another of its values."""
    new = copy_json(params)
    knobs = [k for k, v in choices.items() if len(v) > 1]
    knob = knobs[int(rng.integers(len(knobs)))]
    others = [v for v in choices[knob] if v != new[RECIPE_PARAMS].get(knob)]
    new[RECIPE_PARAMS][knob] = copy_json(others[int(rng.integers(len(others)))])
    return new


def crossover(a: dict, b: dict, rng) -> dict:
    pa, pb = a[RECIPE_PARAMS], b[RECIPE_PARAMS]
    return {RECIPE_PARAMS: {k: copy_json(pa[k] if rng.random() < 0.5 or k not in pb else pb[k]) for k in pa}}


def starting_points(choices: dict) -> list:
    """The default's nearest alternatives, one knob changed each: the next-ranked tiles and the
    other algorithms, then the other value of every other knob (the default itself is the tuning
    run's baseline)."""
    default = {k: v[0] for k, v in choices.items()}
    out = []
    for knob, values in choices.items():
        take = STARTING_ALTERNATIVES if knob in ("tile", "algorithm") else 1
        for v in values[1:1 + take]:
            out.append({RECIPE_PARAMS: {**copy_json(default), knob: copy_json(v)}})
    return out


def schedule(opdef, target, params: dict):
    return schedule_anchor_recipe(opdef, target, params[RECIPE_PARAMS])


__all__ = ["RECIPE_SKETCH_ID", "RECIPE_PARAMS", "recipe_choices", "sample", "mutate", "crossover", "starting_points",
           "schedule"]
