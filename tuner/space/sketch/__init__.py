"""Sketches (Ansor-style): schedules generated from the compute definition alone.

A *sketch* fixes the structure of a schedule: which stages are inlined, which are tiled and
where each stage is computed. It is a rule per stage, each rule a class of the `rules` package
(inline, root, fused_consumer, tile_fused, tile_cache_write, tile, reduce, rfactor,
elementwise: see its docstring), which knows the stages it applies to, the parameters it
samples and how it schedules its stage. The generator (generate.py) combines the choices the
rules offer each stage. Packing the reused operand of a tiled stage into a blocked layout
(cache_read with block=, the B panels of GEMM, a convolution's weight panels) is an option of the
tiled stage; so is, with a vector axis other than the last (channel vectors), `block_input`: what
the tile reads with its first reduction axis as an index (a convolution's padded input) copied in
blocks of that axis's inner tile, a padding stage inlined into the copy (the NCHWc input of the
deep layers' default schedule).

*Annotation* then samples the sketch's parameters at random (each stage's rule samples its own):
tile sizes (factors of the extents, sometimes non-dividing sizes), how many outer spatial loops
are fused and run in parallel, the vector length of the innermost spatial loop (whole registers
up to 64 lanes), unrolling of the micro-kernel's inner loops and an auto_unroll step limit.

A candidate is `Candidate("trace", {"sketch": id, "params": {...}, "steps": [...],
"workload_key": key})`: `steps` are the recorded schedule steps of the sketch applied with the
params, so `instantiate` replays them with `apply_steps` and no knowledge of the sketch; params
let `mutate` (one parameter changed) and `crossover` (parameters of two parents of one sketch)
regenerate the steps. A trace replayed on another workload (another key) raises SpaceError.

The package, one part a module: `dag.py` (the DAG analysis the rules ask), `rules/` (the rules),
`generate.py` (sketches from the rules' choices), `sampling.py` (tile factors, vector lengths,
the tile mutation), `space.py` (SketchSpace: annotation, mutation, switching sketch, crossover),
`apply.py` (a sketch with its params as a recorded schedule, and replaying traces), `recipe.py`
(the recipe sketch: an anchor's default schedule with its knobs as parameters) and
`defaults.py` (the inventory's default schedules found among the sketches, the search's start).
"""

from .apply import replay_checked
from .generate import Sketch, generate_sketches
from .space import SketchSpace

__all__ = ["SketchSpace", "Sketch", "generate_sketches", "replay_checked"]
