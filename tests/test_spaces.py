"""Search spaces: templates (configs) and sketches (traces).

Every candidate a space generates must build and compute the operator's result (random non-zero
inputs, NaN-poisoned output, float64 reference); candidates round-trip through JSON and
`instantiate` rebuilds them from the JSON alone; bad input (a knob declared twice, a config
outside its space, a trace of another workload) raises SpaceError.
"""

from __future__ import annotations

import copy
import itertools
import json
import zlib

import numpy as np
import pytest

import compiler as C
from compiler.ops import default_schedule, get_op, random_inputs
from compiler.ops.base import OpDef
from compiler.runtime import get_max_threads
from compiler.schedule import Schedule
from tuner.candidate import Candidate
from tuner.space import (
    Config,
    ConfigSpace,
    SketchSpace,
    SpaceError,
    TemplateSpace,
    default_template_for,
    generate_sketches,
    instantiate,
    template,
)
from tuner.workload import Task, Workload, register_workload

SAMPLES = 20
CONV_SAMPLES = 16  # a convolution's unrolled register tiles take 0.2-0.5 s to build


def samples(name):
    return CONV_SAMPLES if "conv" in name or name == "depthwise" else SAMPLES
_names = itertools.count()


# ----------------------------------------------------------------------------- operators

def custom_matmul_epilogue(M=29, N=37, K=19):
    """A user's own definition: C = (A @ B) * 2 + D[j], as a reduction and an elementwise stage."""
    A = C.placeholder((M, K), "float32", "A")
    B = C.placeholder((K, N), "float32", "B")
    D = C.placeholder((N,), "float32", "D")
    k = C.reduce_axis(K, "k")
    T = C.compute((M, N), lambda i, j: C.sum(A[i, k] * B[k, j], axis=k), name="T")
    out = C.compute((M, N), lambda i, j: T[i, j] * 2.0 + D[j], name="out")

    def ref(a, b, d):
        return (a.astype(np.float64) @ b.astype(np.float64) * 2.0 + d).astype("float32")
    return OpDef("custom_matmul_epilogue", [A, B, D], out, dict(M=M, N=N, K=K), 2 * M * N * K, ref)


def custom_elementwise(M=13, N=70):
    """Pure elementwise, with an intermediate stage: relu(A * 3 + B[j])."""
    A = C.placeholder((M, N), "float32", "A")
    B = C.placeholder((N,), "float32", "B")
    U = C.compute((M, N), lambda i, j: A[i, j] * 3.0, name="U")
    out = C.compute((M, N), lambda i, j: C.maximum(U[i, j] + B[j], 0.0), name="out")

    def ref(a, b):
        return np.maximum(a.astype(np.float64) * 3.0 + b, 0.0).astype("float32")
    return OpDef("custom_elementwise", [A, B], out, dict(M=M, N=N), M * N, ref)


def custom_row_sums(M=5, N=300):
    """Reduction only, little spatial parallelism: sum of squares of each row."""
    A = C.placeholder((M, N), "float32", "A")
    k = C.reduce_axis(N, "k")
    out = C.compute((M,), lambda i: C.sum(A[i, k] * A[i, k], axis=k), name="row_sums")

    def ref(a):
        return (a.astype(np.float64) ** 2).sum(axis=1).astype("float32")
    return OpDef("custom_row_sums", [A], out, dict(M=M, N=N), 2 * M * N, ref)


def fused_conv_nchwc(blocks_in=2, blocks_out=3, H=5, W=19):
    """A model's fused convolution: channel-blocked data, a 3x3 conv2d_nchwc, bias and relu; its
    default is a recipe (the register tile, row accumulation) the space carries as a sketch."""
    from compiler.ops import functions as fn
    b = C.Target.host().vector_lanes("float32")
    X = C.placeholder((1, blocks_in, H, W, b), "float32", "X")
    Wt = C.placeholder((blocks_out, blocks_in, 3, 3, b, b), "float32", "W")
    bias = C.placeholder((blocks_out, b), "float32", "bias")
    conv = fn.conv2d_nchwc(X, Wt, (1, 1), (1, 1, 1, 1))
    out = C.compute(conv.shape, lambda n, f, y, x, fi: C.maximum(conv[n, f, y, x, fi] + bias[f, fi], 0.0),
                    name="epilogue", tag="elemwise")

    def ref(x, w, bb):
        xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1), (0, 0)))
        acc = sum(np.einsum("nchwi,fcio->nfhwo", xp[:, :, i:i + H, j:j + W], w[:, :, i, j].astype(np.float64))
                  for i in range(3) for j in range(3))
        return np.maximum(acc + bb[None, :, None, None, :], 0.0).astype("float32")
    flops = 2 * H * W * blocks_out * b * blocks_in * b * 9
    return OpDef("fused_convnchwc_relu", [X, Wt, bias], out, dict(H=H, W=W), flops, ref)


OPS = {
    "matmul": lambda: get_op("matmul", M=67, N=45, K=33),
    "fused_conv_nchwc": fused_conv_nchwc,
    "dense_gelu": lambda: get_op("dense", batch=10, in_dim=33, out_dim=50, epilogue="gelu"),
    # small spatial sizes keep the unrolled register tiles (and the build time) of the test small
    "conv2d_nchw": lambda: get_op("conv2d_nchw", N=1, C=4, H=7, W=13, F=6, KH=3, KW=3, stride=2, padding=1),
    "conv2d_nhwc": lambda: get_op("conv2d_nhwc", N=1, C=4, H=5, W=7, F=12, KH=3, KW=3, padding=1),
    "depthwise": lambda: get_op("depthwise_conv2d_nchw", N=1, C=4, H=6, W=12, KH=3, KW=3, padding=1),
    "custom_matmul_epilogue": custom_matmul_epilogue,
    "custom_elementwise": custom_elementwise,
    "custom_row_sums": custom_row_sums,
}
TEMPLATE_OPS = ["matmul", "dense_gelu", "conv2d_nchw", "conv2d_nhwc", "depthwise"]


def poison(shape, dtype):
    return np.full(shape, np.nan if np.dtype(dtype).kind == "f" else -99, dtype)


def check_builds_and_computes(opdef, cand, rng):
    """Instantiate from the candidate's JSON alone (fresh definition), build, compare."""
    cand = Candidate.from_json(json.loads(json.dumps(cand.to_json())))
    s, args = instantiate(opdef, cand)
    kernel = C.build(s, args, name=f"k{next(_names)}")
    inputs = random_inputs(opdef, rng)
    out = poison(opdef.output.shape, opdef.output.dtype)
    kernel(*inputs, out)
    ref = np.asarray(opdef.reference(*inputs), np.float64)
    assert np.isfinite(out).all(), f"unwritten outputs for {cand.payload}"
    err = np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref)
    assert err < 1e-4, f"relative error {err} for {cand.payload}"


# ----------------------------------------------------------------------------- every candidate is right

@pytest.mark.parametrize("name", TEMPLATE_OPS)
def test_template_candidates_build_and_compute(name):
    opdef = OPS[name]()
    space = TemplateSpace(opdef)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    cands = [space.get(0)] + [space.sample(rng) for _ in range(samples(name) - 3)]
    cands += [space.mutate(cands[1], rng), space.crossover(cands[2], cands[3], rng)]
    for cand in cands:
        assert cand.kind == "config" and cand.payload["template"] == space.template_name
        check_builds_and_computes(OPS[name](), cand, rng)


@pytest.mark.parametrize("name", list(OPS))
def test_sketch_candidates_build_and_compute(name):
    opdef = OPS[name]()
    space = SketchSpace(opdef)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    cands = [space.sample(rng, sketch=sk.id) for sk in space.sketches]  # every sketch at least once
    while len(cands) < samples(name):
        c = space.sample(rng)
        cands.append(c)
        if len(cands) % 4 == 1:
            cands.append(space.mutate(c, rng))
        if len(cands) % 4 == 2 and len(cands) > 2:
            cands.append(space.crossover(cands[-1], cands[-3], rng))
    for cand in cands:
        assert cand.kind == "trace" and {"sketch", "params", "steps"} <= set(cand.payload)
        check_builds_and_computes(OPS[name](), cand, rng)


# ----------------------------------------------------------------------------- sketch rules

def test_each_rule_is_a_class_and_its_name_is_said_only_there():
    """A sketch maps each stage to a rule object, which knows when it applies, what it samples
    and how it schedules; no module of the space names a rule by its text but the rule's own."""
    import ast
    from pathlib import Path

    from tuner.space.sketch import rules
    names = {r.name for r in rules.STAGE_RULES}
    assert len(names) == len(rules.STAGE_RULES) == 9
    for sk in generate_sketches(OPS["conv2d_nchw"]()):
        assert all(isinstance(r, rules.StageRule) for r in sk.rules.values())
        assert sk.id == "|".join(f"{st}:{sk.rules[i].label(sk.vec.get(i))}"
                                 for i, st in enumerate(SketchSpace(OPS["conv2d_nchw"]()).dag.names))
    root = Path(rules.__file__).parents[1]   # the sketch package (templates have knobs of their own)
    texts = names - {"tile"}   # (also the key of a tiled stage's tile in its parameters)
    for path in root.rglob("*.py"):
        said = {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)} & texts
        if said:
            owner = {r.name for r in rules.STAGE_RULES if path.name == f"{r.name}.py"}
            assert said <= owner, (path, said - owner)


def test_sketch_rules_follow_the_compute_definition():
    ids = lambda op: {sk.id for sk in generate_sketches(op)}  # noqa: E731
    # the epilogue is fused into the reduction's tile; no cache_write is needed
    assert ids(custom_matmul_epilogue()) == {"T:tile_fused|out:fused_consumer"}
    assert ids(OPS["dense_gelu"]()) == {"dense_matmul:tile_fused|dense_epilogue:fused_consumer"}
    # an output reduction: a local accumulator tile, or accumulating in place; and a local tile
    # vectorized along the rows, which index A but not B's columns (A packed along them)
    assert ids(OPS["matmul"]()) == {"matmul:tile_cache_write", "matmul:tile", "matmul:tile_cache_write@0"}
    # elementwise producers are inlined; a tiled stage's producer (padding) may be materialized
    assert ids(custom_elementwise()) == {"U:inline|out:elementwise"}
    conv = ids(OPS["conv2d_nchw"]())
    assert "pad:inline|conv2d_nchw:tile_cache_write" in conv and "pad:root|conv2d_nchw:tile" in conv
    # a reduction without reuse: plain reduction, and rfactor when the compiler has it
    expected = {"row_sums:reduce", "row_sums:rfactor"}
    assert ids(custom_row_sums()) == expected
    # the reused operand read along the vector axis can be packed: B of matmul, the weights of NHWC
    (mm,) = [sk for sk in generate_sketches(OPS["matmul"]()) if sk.id == "matmul:tile_cache_write"]
    assert mm.pack == {0: (1, 1)}
    nhwc = generate_sketches(OPS["conv2d_nhwc"]())
    assert all(sk.pack == {1: (1, 3)} for sk in nhwc)
    # NCHW: the output channels may be the vector axis (they index the weights, which do not
    # depend on the columns): the weights are then packed along their first axis
    by_vec = {sk.id: (sk.vec, sk.pack) for sk in generate_sketches(OPS["conv2d_nchw"]())}
    assert by_vec["pad:root|conv2d_nchw:tile_cache_write@1"] == ({1: 1}, {1: (1, 0)})
    assert by_vec["pad:root|conv2d_nchw:tile_cache_write"] == ({}, {})
    assert not any("@" in sid for sid in ids(OPS["conv2d_nhwc"]()))   # its channels are already last


def test_sketch_parameters_met_again_are_not_applied_and_lowered_again(monkeypatch):
    """make_candidate remembers what parameters made: the same parameters (a copy) give the same
    candidate, and parameters that did not fit the same SpaceError, each made once."""
    space = SketchSpace(get_op("matmul", M=24, N=32, K=16))
    made = []
    real = space._make_candidate
    monkeypatch.setattr(space, "_make_candidate", lambda sid, p: made.append(sid) or real(sid, p))
    cand = space.sample(np.random.default_rng(5))
    made.clear()
    sid, params = cand.payload["sketch"], cand.payload["params"]
    assert space.make_candidate(sid, copy.deepcopy(params)) is cand and made == []
    bad = copy.deepcopy(params)
    bad[next(n for n in bad if bad[n])]["tile"] = "not a tile"
    for _ in range(2):
        with pytest.raises(SpaceError):
            space.make_candidate(sid, bad)
    assert made == [sid]


def test_sketch_of_nchw_conv_expresses_channel_vectors():
    """The default schedule's recipe for deep NCHW layers (schedule_conv_nchw_channels): a local
    tile cached [n][y][x][f] with f vectorized, the weights packed along f, stored along x."""
    opdef = get_op("conv2d_nchw", N=1, C=32, H=9, W=11, F=32, KH=3, KW=3, padding=1)
    space = SketchSpace(opdef)
    params = {"pad": {"inner": "vec", "split": 11, "parallel": 1},
              "conv2d_nchw": {"tile": {"s0": [1, 1, 1], "s1": [1, 1, 16], "s2": [1, 1, 2], "s3": [1, 1, 7],
                                       "r0": [4], "r1": [1], "r2": [1]},
                              "parallel": 2, "unroll_inner": True, "auto_unroll": 0, "pack": True}}
    cand = space.make_candidate("pad:root|conv2d_nchw:tile_cache_write@1", params)
    steps = cand.payload["steps"]
    # the tile's local copy, then the weight panel's transposing register tile (schedule_transposed_panels)
    assert [st["order"] for st in steps if st["op"] == "cache_write"] == [[0, 2, 3, 1], [0, 2, 1]]
    (cr,) = [st for st in steps if st["op"] == "cache_read"]
    assert cr["block"] == {"0": 16} and cr["merge"] == [1, 3]   # panels [F/16][C·KH·KW][16]
    check_builds_and_computes(opdef, cand, np.random.default_rng(0))


def test_conv_template_expresses_channel_vectors():
    """A deep NCHW layer's template space holds the channel-vector default (config 0 is
    schedule_conv_nchw_channels, step for step) and both vector axes, strided, grouped and with
    tiles that overhang the output, all computing the convolution."""
    rng = np.random.default_rng(23)
    for params in (dict(N=1, C=16, H=9, W=11, F=32, KH=3, KW=3, padding=1),
                   dict(N=1, C=32, H=9, W=10, F=32, KH=3, KW=3, padding=1, stride=2, groups=2),
                   dict(N=1, C=24, H=5, W=5, F=64, KH=3, KW=3, padding=1),   # weights dominate
                   dict(N=1, C=32, H=7, W=7, F=64, KH=1, KW=1)):
        opdef = get_op("conv2d_nchw", **params)
        space = TemplateSpace(opdef)
        knobs = space.config_space.knobs
        assert set(knobs["vector_axis"].entities) == {"f", "x"} and "pack_w" in knobs
        if params.get("groups", 1) == 1:
            assert set(knobs["block_input"].entities) == {0, 8}
        s, _ = instantiate(opdef, space.get(0))
        assert s.steps == default_schedule(opdef).steps
        for axis in ("f", "x"):
            built = 0
            for _ in range(8):  # a few configs unroll past the compiler's code bound: a clear error
                values = dict(space.sample(rng).payload["knobs"], vector_axis=axis)
                cand = Candidate("config", {"template": space.template_name, "knobs": values})
                try:
                    C.lower(*instantiate(opdef, cand))
                except C.ScheduleError as e:
                    assert "unroll" in str(e)
                    continue
                check_builds_and_computes(opdef, cand, rng)
                built += 1
                if built == 3:
                    break
            assert built == 3, f"too few {axis}-vector configs lower"


def test_sketch_switch_carries_parameters_over():
    """Evolution can leave a sketch: switch_sketch gives a candidate of another sketch that keeps
    the parent's choices where they mean the same (the reduction tile, parallel and unroll
    flags; the tile of an axis whose role is unchanged), and it computes the operator."""
    opdef = get_op("matmul", M=48, N=64, K=40)
    space = SketchSpace(opdef)
    rng = np.random.default_rng(2)
    parent = space.sample(rng, sketch="matmul:tile_cache_write")
    seen = set()
    for _ in range(12):
        child = space.switch_sketch(parent, rng)
        sid = child.payload["sketch"]
        assert sid != parent.payload["sketch"]
        seen.add(sid)
        old, new = parent.payload["params"]["matmul"], child.payload["params"]["matmul"]
        assert new["tile"]["r0"] == old["tile"]["r0"]
        assert {k: new[k] for k in ("parallel", "unroll_inner", "auto_unroll", "last_outer")} == \
               {k: old[k] for k in ("parallel", "unroll_inner", "auto_unroll", "last_outer")}
        if sid == "matmul:tile":   # same vector axis (the columns): the whole tile carries over
            assert new["tile"] == old["tile"]
    assert len(seen) == 2
    check_builds_and_computes(opdef, child, rng)


def test_a_sketch_switch_with_no_valid_child_mutates_within_the_sketch(monkeypatch):
    """When no other sketch takes a candidate's parameters (switch_sketch runs out of tries, as
    it did on a blocked convolution's sketches), mutate changes one parameter in the candidate's
    own sketch instead of failing the search; the guided search's evolution likewise keeps a
    parent where the space gives no valid child."""
    from tuner.search.model_guided import EvolutionarySearch
    from tuner.space.base import SpaceError
    opdef = get_op("matmul", M=48, N=64, K=40)
    space = SketchSpace(opdef)
    rng = np.random.default_rng(4)
    parent = space.sample(rng, sketch="matmul:tile_cache_write")

    def no_switch(cand, rng):
        raise SpaceError("switch_sketch: no valid candidate in 24 tries")
    monkeypatch.setattr(space, "switch_sketch", no_switch)
    monkeypatch.setattr("tuner.space.sketch.space.SWITCH_SKETCH_P", 1.0)
    for _ in range(5):
        child = space.mutate(parent, rng)
        assert child.payload["sketch"] == parent.payload["sketch"]
    check_builds_and_computes(opdef, child, rng)

    def no_child(*args):
        raise SpaceError("no valid candidate")
    monkeypatch.setattr(space, "mutate", no_child)
    monkeypatch.setattr(space, "crossover", no_child)
    calls = []
    search = EvolutionarySearch(space, opdef, rng=np.random.default_rng(0), population_size=8, num_generations=2)
    monkeypatch.setattr("tuner.search.model_guided._selection_probs", lambda sc: calls.append(1) or np.full(len(sc), 1 / len(sc)))
    assert search._ranked(4) and calls   # generations ran, every slot kept its parent

def _default_blocks_input(opdef) -> bool:
    """Whether the host's default schedule copies this conv's input in channel blocks."""
    from compiler.ops.schedule_common import lanes
    from compiler.ops.schedule_conv import channel_tile, input_channel_block, taps_unrolled
    host = C.Target.host()
    FB, XB, YB = channel_tile(opdef, host)
    shared = taps_unrolled(opdef, FB // lanes(host, "float32"), XB, YB, host.capabilities)
    return input_channel_block(opdef, host, shared) > 0


def test_sketch_space_starts_from_the_default_schedule():
    """The GEMM and channel-vector conv defaults are annotations of sketches (starting_points),
    which compute the operator; a guided search measures them first. A convolution's recipe
    sketch adds the default's nearest alternatives after it. Where the default's loop order is
    not a sketch rule (a grouped conv), only the recipe's alternatives start."""
    from tuner.search import EvolutionarySearch
    from tuner.space.sketch.recipe import RECIPE_SKETCH_ID
    rng = np.random.default_rng(3)
    cases = [(get_op("matmul", M=50, N=64, K=36), "matmul:tile_cache_write"),
             (get_op("conv2d_nchw", N=1, C=32, H=9, W=10, F=32, KH=3, KW=3, padding=1),
              "pad:root|conv2d_nchw:tile_cache_write@1"),
             (get_op("conv2d_nchw", N=1, C=32, H=8, W=8, F=32, KH=1, KW=1, stride=2),
              "conv2d_nchw:tile_cache_write@1"),
             # weights dominating: the input copied in channel blocks (block_input)
             (get_op("conv2d_nchw", N=1, C=24, H=5, W=5, F=64, KH=3, KW=3, padding=1),
              "pad:root|conv2d_nchw:tile_cache_write@1"),
             (get_op("conv2d_nchw", N=1, C=32, H=7, W=7, F=64, KH=1, KW=1), "conv2d_nchw:tile_cache_write@1")]
    for opdef, sketch_id in cases:
        space = SketchSpace(opdef)
        start, *alternatives = space.starting_points()
        assert start.payload["sketch"] == sketch_id
        assert all(c.payload["sketch"] == RECIPE_SKETCH_ID for c in alternatives)
        assert bool(alternatives) == (opdef.name == "conv2d_nchw")
        blocked = opdef.name == "conv2d_nchw" and _default_blocks_input(opdef)
        assert start.payload["params"]["conv2d_nchw" if opdef.name == "conv2d_nchw" else "matmul"].get(
            "block_input", False) == blocked
        check_builds_and_computes(opdef, start, rng)
        search = EvolutionarySearch(space, opdef=opdef, rng=0, seeds=space.starting_points())
        assert search.next_batch(4)[0] == start
    grouped = get_op("conv2d_nchw", N=1, C=32, H=8, W=8, F=32, KH=3, KW=3, padding=1, groups=2)
    assert all(c.payload["sketch"] == RECIPE_SKETCH_ID for c in SketchSpace(grouped).starting_points())
    assert TemplateSpace(OPS["matmul"]()).starting_points() == [TemplateSpace(OPS["matmul"]()).get(0)]


def test_sketch_block_input_computes_the_convolution():
    """block_input (the padded input copied in channel blocks of the reduction's inner tile, the
    padding inlined into the copy or read through it) computes the convolution for sampled
    tiles, dividing the channels or not, on both padding sketches."""
    rng = np.random.default_rng(11)
    opdef = get_op("conv2d_nchw", N=1, C=20, H=6, W=5, F=32, KH=3, KW=3, padding=(1, 0, 1, 1), stride=(1, 2))
    space = SketchSpace(opdef)
    built = set()
    for sketch_id in ("pad:root|conv2d_nchw:tile_cache_write@1", "pad:inline|conv2d_nchw:tile_cache_write@1"):
        for _ in range(3):
            cand = space.sample(rng, sketch=sketch_id)
            params = copy.deepcopy(cand.payload["params"])
            params["conv2d_nchw"]["block_input"] = True
            params["conv2d_nchw"]["tile"]["r0"] = [int(rng.choice([4, 8, 6]))]
            cand = space.make_candidate(sketch_id, params)
            assert any(st["op"] == "cache_read" and st.get("block") and "1" in st["block"]
                       for st in cand.payload["steps"])
            check_builds_and_computes(opdef, cand, rng)
            built.add(sketch_id)
    assert len(built) == 2


def test_sketch_of_matmul_expresses_the_default_recipe():
    """Cache write at the tile loop, k outside rows and vector columns, packed B, parallel."""
    opdef = get_op("matmul", M=64, N=64, K=64)
    space = SketchSpace(opdef)
    params = {"matmul": {"tile": {"s0": [1, 1, 4], "s1": [1, 1, 16], "r0": [4]}, "parallel": 1,
                         "unroll_inner": True, "auto_unroll": 0, "pack": True}}
    cand = space.make_candidate("matmul:tile_cache_write", params)
    ops = [st["op"] for st in cand.payload["steps"]]
    assert ops[0] == "cache_write" and "compute_at" in ops and "cache_read" in ops
    assert {"vectorize", "unroll", "parallel"} <= set(ops)
    check_builds_and_computes(opdef, cand, np.random.default_rng(0))


def test_sketch_of_matmul_can_walk_column_panels_outermost():
    """last_outer: the GEMM default's loop order (a packed B panel kept in cache while every row
    tile uses it), the outer tile loops fused and parallel with the columns first."""
    opdef = get_op("matmul", M=64, N=64, K=64)
    space = SketchSpace(opdef)
    params = {"matmul": {"tile": {"s0": [1, 1, 4], "s1": [1, 1, 16], "r0": [4]}, "parallel": 2, "last_outer": True,
                         "unroll_inner": True, "auto_unroll": 0, "pack": True}}
    cand = space.make_candidate("matmul:tile_cache_write", params)
    ir = str(C.lower(*instantiate(opdef, cand)))
    assert "parallel for (j_o_i_o_f" in ir        # the columns fused outside the rows, in parallel
    check_builds_and_computes(opdef, cand, np.random.default_rng(1))
    rows_first = space.make_candidate("matmul:tile_cache_write", {"matmul": {**params["matmul"], "last_outer": False}})
    assert rows_first.payload["steps"] != cand.payload["steps"]


def test_a_fused_convolution_carries_its_default_recipe_as_a_sketch():
    """The recipe sketch's knobs are the default's choices; its starting points are the
    default's nearest alternatives (one knob changed), and mutation and crossover stay in it."""
    from tuner.space.sketch.recipe import RECIPE_PARAMS, RECIPE_SKETCH_ID
    space = SketchSpace(fused_conv_nchwc())
    recipe = space.sketch(RECIPE_SKETCH_ID)
    assert len(recipe.choices["tile"]) > 1
    default = {k: v[0] for k, v in recipe.choices.items()}
    starts = [c for c in space.starting_points() if c.payload["sketch"] == RECIPE_SKETCH_ID]
    assert starts and all(sum(c.payload["params"][RECIPE_PARAMS][k] != default[k] for k in default) == 1 for c in starts)
    rng = np.random.default_rng(7)
    a, b = space.sample(rng, sketch=RECIPE_SKETCH_ID), space.sample(rng, sketch=RECIPE_SKETCH_ID)
    m = space.mutate(a, rng)
    child = space.crossover(a, b, rng)
    pa, pb = a.payload["params"][RECIPE_PARAMS], b.payload["params"][RECIPE_PARAMS]
    assert m.payload["sketch"] == child.payload["sketch"] == RECIPE_SKETCH_ID
    assert sum(m.payload["params"][RECIPE_PARAMS][k] != pa[k] for k in default) == 1
    assert all(child.payload["params"][RECIPE_PARAMS][k] in (pa[k], pb[k]) for k in default)
    for c in (starts[0], m, child):
        check_builds_and_computes(fused_conv_nchwc(), c, rng)
    assert all(sk.id != RECIPE_SKETCH_ID for sk in SketchSpace(OPS["matmul"]()).sketches)


def test_sketch_mutation_changes_one_parameter():
    space = SketchSpace(OPS["matmul"]())
    rng = np.random.default_rng(5)
    switched = 0
    for _ in range(20):
        a = space.sample(rng)
        b = space.mutate(a, rng)
        if b.payload["sketch"] != a.payload["sketch"]:   # now and then: see switch_sketch
            switched += 1
            continue
        pa, pb = a.payload["params"]["matmul"], b.payload["params"]["matmul"]
        changed = [k for k in pa if k != "tile" and pa[k] != pb[k]]
        changed += [ax for ax in pa["tile"] if pa["tile"][ax] != pb["tile"][ax]]
        assert len(changed) <= 2  # one parameter (a tile change may shrink another axis's S2 level)
        assert b.payload["steps"] == space.apply(b.payload["sketch"], b.payload["params"]).steps
    assert switched <= 8


def test_sketch_crossover_mixes_parents_of_one_sketch():
    space = SketchSpace(OPS["matmul"]())
    rng = np.random.default_rng(7)
    a = space.make_candidate("matmul:tile", space.sample_params(space.sketch("matmul:tile"), rng))
    b = space.make_candidate("matmul:tile", space.sample_params(space.sketch("matmul:tile"), rng))
    c = space.crossover(a, b, rng)
    pa, pb, pc = (x.payload["params"]["matmul"] for x in (a, b, c))
    for k in pc:
        if k != "tile":
            assert pc[k] in (pa[k], pb[k])


# ----------------------------------------------------------------------------- JSON and replay

def test_config_json_round_trip_and_instantiate_from_json_alone():
    space = TemplateSpace(OPS["matmul"]())
    cand = space.sample(np.random.default_rng(1))
    text = json.dumps(cand.to_json())
    again = Candidate.from_json(json.loads(text))
    assert again == cand and again.fingerprint == cand.fingerprint
    cfg = space.config_of(again)
    assert isinstance(cfg, Config) and cfg.to_json() == cand.payload
    assert json.loads(cfg.to_json_text()) == cand.payload
    s1, _ = instantiate(OPS["matmul"](), again)
    s2, _ = space.schedule(OPS["matmul"](), cand)
    assert s1.steps == s2.steps


def test_trace_json_round_trip_replays_the_recorded_steps():
    space = SketchSpace(OPS["dense_gelu"]())
    cand = space.sample(np.random.default_rng(3))
    again = Candidate.from_json(json.loads(json.dumps(cand.to_json())))
    assert again == cand
    s, args = instantiate(OPS["dense_gelu"](), again)
    assert isinstance(s, Schedule) and s.steps == cand.payload["steps"]
    assert [t.name for t in args] == [t.name for t in OPS["dense_gelu"]().tensors]


def test_template_default_config_is_the_default_schedule():
    for name in ["matmul", "dense_gelu", "conv2d_nchw", "conv2d_nhwc", "depthwise"]:
        opdef = OPS[name]()
        s, _ = instantiate(opdef, TemplateSpace(opdef).get(0))
        assert s.steps == default_schedule(opdef).steps, name


# ----------------------------------------------------------------------------- enumeration

def test_template_enumeration_by_index():
    space = TemplateSpace(OPS["dense_gelu"]())
    n = len(space)
    assert space.enumerable and n == np.prod([len(k) for k in space.config_space.knobs.values()])
    idx = sorted(set(np.random.default_rng(0).integers(0, n, 150).tolist()) | {0, 1, n - 1})
    cands = [space.get(i) for i in idx]
    assert len({c.fingerprint for c in cands}) == len(idx)
    assert [space.index_of(c) for c in cands] == idx
    for bad in (n, -1, "3"):
        with pytest.raises(SpaceError):
            space.get(bad)


def test_config_space_policies():
    cs = ConfigSpace("policies")
    cs.define_split("f", 12, num_outputs=3, policy="factors")
    assert all(np.prod(e) == 12 for e in cs.knobs["f"].entities) and [12, 1, 1] in cs.knobs["f"].entities
    cs.define_split("p", 20, policy="power2", max_factor=8)
    assert {e[1] for e in cs.knobs["p"].entities} == {1, 2, 4, 8} and [3, 8] in cs.knobs["p"].entities
    cs.define_split("c", 10, policy="candidate", candidate=[[-1, 4], [3]])
    assert cs.knobs["c"].entities == [[3, 4], [4, 3]]
    cs.define_knob("k", [1, "a", True])
    cs.define_reorder("r", 3)
    cs.define_annotate("a", 2, policy="try_unroll_vec")
    assert len(cs.knobs["r"]) == 6 and ["unroll", "vec"] in cs.knobs["a"].entities
    assert len(cs) == np.prod([len(k) for k in cs.knobs.values()])
    assert len({json.dumps(c.knobs, sort_keys=True) for c in cs}) == len(cs)
    with pytest.raises(SpaceError, match="twice"):
        cs.define_knob("k", [0, 1])
    with pytest.raises(SpaceError):
        cs.define_split("bad", 10, policy="nope")


def test_template_mutate_and_crossover_are_knob_wise():
    space = TemplateSpace(OPS["matmul"]())
    rng = np.random.default_rng(11)
    for _ in range(20):
        a, b = space.sample(rng), space.sample(rng)
        m = space.mutate(a, rng)
        diff = [k for k in a.payload["knobs"] if a.payload["knobs"][k] != m.payload["knobs"][k]]
        assert len(diff) == 1
        c = space.crossover(a, b, rng)
        assert all(c.payload["knobs"][k] in (a.payload["knobs"][k], b.payload["knobs"][k])
                   for k in c.payload["knobs"])


def test_spaces_from_tasks_and_custom_workloads():
    name = f"test_spaces_row_sums_{next(_names)}"
    register_workload(name)(custom_row_sums)
    task = Task.create(Workload(name, {"M": 3, "N": 100}))
    space = SketchSpace(task)
    cand = space.sample(np.random.default_rng(0))
    check_builds_and_computes(task.workload.opdef(), cand, np.random.default_rng(1))
    mm = TemplateSpace(Task.create(Workload("matmul", {"M": 8, "N": 8, "K": 8})))
    assert mm.template_name == "gemm" and default_template_for(get_op("relu", shape=(4,))) is None


# ----------------------------------------------------------------------------- bad input

def test_a_knob_declared_twice_is_an_error():
    name = f"test_twice_{next(_names)}"

    @template(name)
    def twice(cfg, opdef, target):
        cfg.define_knob("x", [1, 2])
        cfg.define_knob("x", [3, 4])
        return C.create_schedule(opdef.output), opdef.tensors

    with pytest.raises(SpaceError, match="knob 'x' twice"):
        TemplateSpace(OPS["matmul"](), name)
    with pytest.raises(SpaceError, match="knob 'x' twice"):
        instantiate(OPS["matmul"](), Candidate("config", {"template": name, "knobs": {"x": 1}}))


def test_a_config_outside_its_space_is_an_error():
    opdef = OPS["matmul"]()
    space = TemplateSpace(opdef)
    good = dict(space.get(0).payload["knobs"])
    for knobs, match in [({**good, "tile_i": [1, 67]}, "not in the space"),
                         ({**good, "nope": 1}, "no knob"),
                         ({k: v for k, v in good.items() if k != "pack_b"}, "misses"),
                         ({**good, "parallel": "sometimes"}, "not in the space")]:
        cand = Candidate("config", {"template": "gemm", "knobs": knobs})
        with pytest.raises(SpaceError, match=match):
            instantiate(opdef, cand)
        with pytest.raises(SpaceError):
            space.mutate(cand, np.random.default_rng(0))
    with pytest.raises(SpaceError, match="unknown template"):
        instantiate(opdef, Candidate("config", {"template": "no_such_template", "knobs": {}}))
    with pytest.raises(SpaceError, match="is for"):  # the gemm template on a convolution
        TemplateSpace(OPS["conv2d_nchw"](), "gemm")


def test_a_trace_of_another_workload_is_an_error():
    mm = get_op("matmul", M=64, N=64, K=64)
    trace = SketchSpace(mm).sample(np.random.default_rng(0))
    conv = OPS["conv2d_nchw"]()
    with pytest.raises(SpaceError, match="does not apply"):
        instantiate(conv, trace)
    # without the workload key, the replay itself fails on the other definition
    stripped = Candidate("trace", {"steps": trace.payload["steps"] +
                                   [{"op": "split", "stage": 0, "axis": 99, "factor": 2}]})
    with pytest.raises(SpaceError, match="does not apply"):
        instantiate(conv, stripped)
    with pytest.raises(SpaceError):
        instantiate(conv, Candidate("trace", {"sketch": "x"}))


# ----------------------------------------------------------------------------- the space has fast points

def test_gemm_template_contains_configs_as_fast_as_the_default():
    """Best of a handful of configs vs the default schedule on matmul 256³, one thread,
    interleaved, min over repeats (the machine is shared: a generous margin, not a benchmark)."""
    opdef = get_op("matmul", M=256, N=256, K=256)
    space = TemplateSpace(opdef)
    base = space.config_space.default().knobs
    tweaks = [{}, {"tile_order": [1, 0]}, {"tile_i": [64, 4]}, {"tile_k": [32, 8]}, {"parallel": "fused"}]
    rng = np.random.default_rng(0)
    inputs, out = random_inputs(opdef, rng), np.zeros((256, 256), "float32")
    kernels = [C.build(default_schedule(opdef), opdef.tensors, name=f"k{next(_names)}")]
    for tw in tweaks:
        s, args = instantiate(opdef, space.config_space.config({**base, **tw}).candidate())
        kernels.append(C.build(s, args, name=f"k{next(_names)}"))
    threads = get_max_threads()
    C.set_num_threads(1)
    try:
        times = [[] for _ in kernels]
        for _ in range(5):
            for t, k in zip(times, kernels):
                t.append(k.time_evaluator(number=2, repeat=2)(*inputs, out).min)
    finally:
        C.set_num_threads(threads)
    ratio = min(times[0]) / min(min(t) for t in times[1:])
    assert ratio >= 0.5, f"best template config runs at {ratio:.2f}x the default schedule"


def test_space_modules_import_no_sibling_but_the_base():
    """base.py imports none of its children and the two spaces not each other: each space
    registers its own candidate kind with the base (tuner/space/__init__.py imports both)."""
    import ast
    from pathlib import Path

    import tuner.space as pkg
    root = Path(pkg.__file__).parent
    allowed = {"base.py": set(), "template.py": {"base"}}
    # the sketch package's modules import each other, and of their siblings outside it only the base
    allowed.update({str(p.relative_to(root)): {"base"} for p in (root / "sketch").rglob("*.py")})
    for name, ok in allowed.items():
        tree = ast.parse((root / name).read_text())
        level = name.count("/") + 1
        siblings = {(n.module or "").split(".")[0] or n.names[0].name for n in ast.walk(tree)
                    if isinstance(n, ast.ImportFrom) and n.level == level}
        assert siblings <= ok, (name, siblings - ok)
    assert {"config", "trace", "default"} <= set(__import__("tuner.space.base", fromlist=["_"])._INSTANTIATORS)
