"""Sketches (Ansor-style): schedules generated from the compute definition alone.

A *sketch* fixes the structure of a schedule: which stages are inlined, which are tiled and
where each stage is computed. It is derived by rules, per stage in reverse topological order:

- inline:     an elementwise stage that is not the output is substituted into its readers
              (a variant sketch instead materializes the producers of tiled stages at the root,
              e.g. a convolution's padding);
- tile:       a reduction with data reuse (an input read that does not depend on every spatial
              axis: matmul, convolutions) gets a multi-level tiling of the "SSRSRS" kind: each
              spatial axis split into 4 levels, each reduction axis into 2, ordered
              S0 S1 R0 S2 R1 S3 (the outer S0 S1 levels may take the last axis first);
- tile_fused: … and when its only reader is an elementwise stage reading it point for point
              (dense's epilogue, a user's `C * 2 + D[j]`), that reader is tiled S0 S1 S2 S3 and
              the reduction is computed at its last S1 loop (R0 S2 R1 S3 inside): the epilogue is
              fused into the register tile;
- tile_cache_write: a tiled output with no such reader accumulates into a local tile
              (cache_write) computed at the output's last S1 loop; the plain "tile" (accumulate
              in the output) is the variant sketch;
- reduce:     a reduction without reuse (row sums, pooling, softmax's max): spatial loops
              outside, reduction loops, the last spatial axis inside (vectorized or unrolled);
- rfactor:    (only if the schedule has the `rfactor` primitive) for a reduction with little
              spatial parallelism: the innermost reduction split, its inner part factored out
              as a vector of partial results;
- elementwise: an elementwise output (or a materialized producer): fused outer loops in
              parallel, the last axis split and vectorized.
Packing the reused operand of a tiled stage into a blocked layout (cache_read with block=,
the B panels of GEMM, a convolution's weight panels) is an option of the tiled stage; so is,
with a vector axis other than the last (channel vectors), `block_input`: what the tile reads
with its first reduction axis as an index (a convolution's padded input) copied in blocks of
that axis's inner tile, a padding stage inlined into the copy (the NCHWc input of the deep
layers' default schedule).

*Annotation* then samples the sketch's parameters at random: tile sizes (factors of the
extents, sometimes non-dividing sizes), how many outer spatial loops are fused and run in
parallel, the vector length of the innermost spatial loop (whole registers up to 64 lanes),
unrolling of the micro-kernel's inner loops and an auto_unroll step limit.

A candidate is `Candidate("trace", {"sketch": id, "params": {...}, "steps": [...],
"workload_key": key})`: `steps` are the recorded schedule steps of the sketch applied with the
params, so `instantiate` replays them with `apply_steps` and no knowledge of the sketch; params
let `mutate` (one parameter changed) and `crossover` (parameters of two parents of one sketch)
regenerate the steps. A trace replayed on another workload (another key) raises SpaceError.

The package, one part a module: `dag.py` (the DAG analysis the rules ask), `rules.py` (sketch
generation), `sampling.py` (tile factors, vector lengths, the tile mutation), `space.py`
(SketchSpace: annotation, mutation, switching sketch, crossover; the recipe sketch's own
operators are in ../sketch_recipe.py), `apply.py` (a sketch with its params as a recorded
schedule, and replaying traces).
"""

from .apply import replay_checked
from .rules import TILE_RULES, Sketch, generate_sketches
from .space import SketchSpace

__all__ = ["SketchSpace", "Sketch", "generate_sketches", "replay_checked", "TILE_RULES"]
