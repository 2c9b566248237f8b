"""Every spelling of a matrix product gets the fast default schedule (issue 54): what the node
computes decides, not how the exporter wrote it.

Each model is one or a few nodes at odd sizes (no multiple of a register tile), random non-zero
inputs, checked against numpy in float64 within 1e-4 relative (‖ours − ref‖ / ‖ref‖), and the
schedule the default picked for the product's kernel is asserted by its kind
(schedule_anchor.product_schedule_kind), not by timings. bench/matmul_spellings.py times the
same spellings against onnxruntime.
"""

from __future__ import annotations

import numpy as np
import pytest
from graph_models import model, rand
from onnx import helper

from compiler import Target
from compiler.graph import build_model, from_onnx
from compiler.ops.schedule_anchor import product_schedule_kind
from compiler.ops.schedule_gemm import gemm_tile

RNG = np.random.default_rng(54)
n = helper.make_node


def _linear(x_shape, K, N, extra=None):
    """MatMul(x, W) + b (+ an epilogue operand `extra` of its shape): nn.Linear on n-d x."""
    w, b = rand(RNG, (K, N)), rand(RNG, (N,))
    nodes = [n("MatMul", ["x", "w"], ["p"]), n("Add", ["p", "b"], ["y" if extra is None else "q"])]
    inits, ins = {"w": w, "b": b}, {"x": rand(RNG, x_shape)}
    if extra is not None:
        nodes.append(n("Add", ["q", "r"], ["y"]))
        ins["r"] = rand(RNG, extra)
    ref = lambda x, r=0.0: x @ w.astype(np.float64) + b + r  # noqa: E731
    return nodes, ins, inits, ref


def _case(name):
    """(nodes, inputs {name: array}, constants, float64 reference of the inputs, expected kind)."""
    if name == "inproj_seq_first":   # nn.MultiheadAttention's in-projection over [S, 1, d]
        return (*_linear((13, 1, 40), 40, 72), "gemm-prepacked")
    if name == "batch2_bias_residual":   # a batch of A sharing B, with a residual of its shape
        return (*_linear((2, 13, 40), 40, 72, extra=(2, 13, 72)), "gemm-prepacked")
    if name == "batched_refused_view":   # an epilogue operand neither per row nor for all rows:
        # the product stays batched (over B in the panels made for all its rows)
        return (*_linear((2, 3, 5, 40), 40, 72, extra=(3, 1, 72)), "batched-gemm-prepacked")
    if name == "matmul_transpose_const":   # MatMul(x, Transpose(W)) of a constant [N, K]
        w = rand(RNG, (50, 40))
        return ([n("Transpose", ["w"], ["wt"], perm=[1, 0]), n("MatMul", ["x", "wt"], ["y"])],
                {"x": rand(RNG, (19, 40))}, {"w": w}, lambda x: x @ w.T.astype(np.float64), "gemm-prepacked")
    if name == "gemm_transB":
        w, c = rand(RNG, (50, 40)), rand(RNG, (50,))
        return ([n("Gemm", ["x", "w", "c"], ["y"], transB=1)], {"x": rand(RNG, (19, 40))}, {"w": w, "c": c},
                lambda x: x @ w.T.astype(np.float64) + c, "gemm-prepacked")
    if name == "gemm_transB_one_row":   # a batch-1 classifier
        w, c = rand(RNG, (48, 40)), rand(RNG, (48,))
        return ([n("Gemm", ["x", "w", "c"], ["y"], transB=1)], {"x": rand(RNG, (1, 40))}, {"w": w, "c": c},
                lambda x: x @ w.T.astype(np.float64) + c, "gemv")
    if name == "decode_step":   # one token through a projection, [1, 1, K] x [K, N]
        w = rand(RNG, (64, 96))
        return ([n("MatMul", ["x", "w"], ["y"])], {"x": rand(RNG, (1, 1, 64))}, {"w": w},
                lambda x: x @ w.astype(np.float64), "gemv")
    if name == "attn_qkT_transpose":   # scores over [B, H, S, D], Kᵀ a Transpose node
        return ([n("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), n("MatMul", ["q", "kt"], ["y"])],
                {"q": rand(RNG, (1, 3, 13, 8)), "k": rand(RNG, (1, 3, 13, 8))}, {},
                lambda q, k: q @ np.swapaxes(k, -1, -2), "batched-gemm")
    if name == "attn_pv":
        return ([n("MatMul", ["p", "v"], ["y"])], {"p": rand(RNG, (1, 3, 13, 13)), "v": rand(RNG, (1, 3, 13, 8))},
                {}, lambda p, v: p @ v, "batched-gemm")
    if name == "gqa_broadcast":   # 2 K heads, each serving 3 query heads, broadcast by MatMul
        return ([n("MatMul", ["q", "kt"], ["y"])], {"q": rand(RNG, (1, 2, 3, 13, 8)), "kt": rand(RNG, (1, 2, 1, 8, 13))},
                {}, lambda q, kt: q @ kt, "batched-gemm")
    if name == "gqa_expand":   # the same heads expanded first (Llama's repeat_kv)
        consts = {"ax": np.array([2], np.int64), "shape": np.array([1, 2, 3, 13, 8], np.int64),
                  "shape2": np.array([1, 6, 13, 8], np.int64)}
        return ([n("Unsqueeze", ["v", "ax"], ["v5"]), n("Expand", ["v5", "shape"], ["ve"]),
                 n("Reshape", ["ve", "shape2"], ["v6"]), n("MatMul", ["p", "v6"], ["y"])],
                {"p": rand(RNG, (1, 6, 13, 13)), "v": rand(RNG, (1, 2, 13, 8))}, consts,
                lambda p, v: p @ np.repeat(v, 3, axis=1), "batched-gemm")
    raise KeyError(name)


SPELLINGS = ("inproj_seq_first", "batch2_bias_residual", "batched_refused_view", "matmul_transpose_const",
             "gemm_transB", "gemm_transB_one_row", "decode_step", "attn_qkT_transpose", "attn_pv", "gqa_broadcast",
             "gqa_expand")


@pytest.mark.parametrize("name", SPELLINGS)
def test_spelling_matches_numpy_and_takes_the_fast_path(name):
    nodes, ins, inits, reference, kind = _case(name)
    want = reference(**{k: v.astype(np.float64) for k, v in ins.items()})
    m = model(nodes, {k: (v.shape, "float32") for k, v in ins.items()}, {"y": (None, "float32")}, inits, opset=17)
    module = build_model(from_onnx(m))
    (got,) = module.run(**ins)
    assert got.shape == want.shape
    err = np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want)
    assert err < 1e-4, err
    kinds = [k for k in (product_schedule_kind(s.group.opdef, module.target) for s in module.steps) if k]
    assert kinds == [kind]


def test_shared_weight_product_is_one_matrix_of_all_rows():
    """The sequence-first in-projection's kernel computes [rows, N] (no batch of one-row
    products), and its bias is read as one row for all."""
    nodes, ins, inits, _, _ = _case("inproj_seq_first")
    m = model(nodes, {"x": ((13, 1, 40), "float32")}, {"y": (None, "float32")}, inits, opset=17)
    module = build_model(from_onnx(m))
    (step,) = module.steps
    assert tuple(step.group.opdef.output.shape) == (13, 72)
    assert [tuple(t.shape) for t in step.group.opdef.inputs][0] == (13, 40)


def test_gemm_tile_streams_the_weight_of_a_few_rows_in_as_few_passes_as_the_rate_allows():
    """A product of at most MAX_MR rows reads B once per row tile: one tile of all rows where
    that keeps the FMA rate (AVX-512's 32 registers hold 8 x 2 vectors), two where one would be
    load-bound (8 x 1 vector on AVX2), never more to save a wasted row."""
    assert gemm_tile(8, 5632, 16, 32, fmas_per_cycle=2) == (8, 32)
    assert gemm_tile(8, 5632, 16, 32, fmas_per_cycle=1) == (8, 32)
    assert gemm_tile(7, 2816, 16, 32, fmas_per_cycle=2) == (7, 32)
    assert gemm_tile(8, 5632, 8, 16, fmas_per_cycle=2) == (4, 16)
    assert gemm_tile(3, 512, 8, 16, fmas_per_cycle=2) == (3, 16)   # not 2 x 32 twice, a row wasted
    assert gemm_tile(1, 1000, 8, 16, fmas_per_cycle=2) == (1, 32)


def test_gemm_tile_keeps_two_pipes_busy():
    """A one-vector tile of 8 chains does not win over 6 x 2 vectors for its few wasted lanes
    (1000 columns on AVX2); the narrow tile still wins where the wide one wastes a quarter."""
    assert gemm_tile(1000, 1000, 8, 16, fmas_per_cycle=2) == (6, 16)
    assert gemm_tile(197, 197, 8, 16, fmas_per_cycle=2) == (6, 16)
    assert gemm_tile(1024, 1024, 16, 32, fmas_per_cycle=2) == (6, 64)
    assert gemm_tile(3136, 96, 16, 32, fmas_per_cycle=2) == (8, 32)   # ConvNeXt's 384 -> 96
    assert gemm_tile(197, 2304, 8, 16, columns=32) == (2, 32)   # B prepacked in 32-wide panels
    # prepacked panels and few rows: the most rows that waste none (8 rows in tiles of 6 ran 12)
    assert gemm_tile(8, 512, 16, 32, columns=64, fmas_per_cycle=1) == (4, 64)
    assert gemm_tile(8, 512, 16, 32, columns=64, fmas_per_cycle=2) == (4, 64)
    assert gemm_tile(16, 512, 16, 32, columns=64) == (4, 64)
    assert gemm_tile(128, 512, 16, 32, columns=64) == (6, 64)   # 4 % of waste is worth 6 rows' reuse
    assert gemm_tile(1, 512, 16, 32, columns=64) == (1, 64)
    assert gemm_tile(3, 512, 16, 32, columns=64) == (3, 64)
    caps = Target.host().capabilities
    assert caps.fmas_per_cycle > 0


@pytest.mark.parametrize("rows", [1, 3, 6])
def test_a_weight_streamed_once_is_prefetched_ahead_and_the_result_holds(rows):
    """A decode step's projection reads its weight once per call, one row or one row tile: its
    default prefetches the weight's stream (Stage.prefetch), and the lines asked for past the
    weight's end (the last panel's) change nothing. N = 200 fills no whole panel. (Six rows are
    one row tile on every instruction set; eight are two of AVX2's 4-row tiles (16 vector
    registers), and read the weight twice.)"""
    from compiler.loop_ir import Prefetch, walk_stmts
    from compiler.lower import lower
    from compiler.ops.default_schedules import default_schedule
    w, x = rand(RNG, (96, 200)), rand(RNG, (rows, 1, 96))
    m = model([n("MatMul", ["x", "w"], ["y"])], {"x": (x.shape, "float32")}, {"y": (None, "float32")}, {"w": w},
              opset=17)
    module = build_model(from_onnx(m))
    (got,) = module.run(x=x)
    want = x.astype(np.float64) @ w.astype(np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-4
    (step,) = module.steps
    opdef = step.group.opdef
    f = lower(default_schedule(opdef, module.target), [*opdef.inputs, opdef.output])
    fetched = {p.buffer.name for p in walk_stmts(f.body) if isinstance(p, Prefetch)}
    assert fetched == {f.args[1].name}


def test_a_one_row_product_keeps_some_parallelism_on_more_cores_than_chunks():
    """A 512-column row on 16 cores: 16 chunks of whole vectors would be too short, and it fell
    back to one chunk on one core; it takes as many chunks as keep MIN_GEMV_CHUNK vectors."""
    from compiler.ops.schedule_gemm import MIN_GEMV_CHUNK, gemv_chunk
    assert gemv_chunk(512, 16, 16) == (128, 4)          # 4 chunks of 8 vectors
    assert gemv_chunk(512, 16, 2) == (256, 4)           # as before: one chunk a core
    assert gemv_chunk(512, 16, 1) == (512, 4)
    assert gemv_chunk(32000, 16, 16)[0] == 2000         # 16 chunks of 125 vectors
    chunk, _ = gemv_chunk(4096, 8, 128)
    assert chunk // 8 >= MIN_GEMV_CHUNK and 4096 % chunk == 0
    w, x = rand(RNG, (64, 512)), rand(RNG, (1, 64))
    target = Target.host()
    target.num_cores = 16
    m = model([n("MatMul", ["x", "w"], ["y"])], {"x": (x.shape, "float32")}, {"y": (None, "float32")}, {"w": w},
              opset=17)
    (got,) = build_model(from_onnx(m), target=target).run(x=x)
    want = x.astype(np.float64) @ w.astype(np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


def test_a_prepacked_one_row_product_cuts_more_chunks_on_many_cores():
    """B laid out in the chunks' own panels is contiguous at any chunk width, so a one-row
    product over prepacked weights takes chunks of MIN_PACKED_GEMV_CHUNK vectors where cores ask
    for them: a 1000-class classifier on 16 cores runs 25 chunks of 40 columns (it ran 5 of 200,
    on 5 of the 16 cores); on 2 cores the chunks are as before, and strided B keeps its long ones."""
    from compiler.loop_ir import For, walk_stmts
    from compiler.lower import lower
    from compiler.ops.default_schedules import default_schedule
    from compiler.ops.schedule_gemm import gemv_chunk, gemv_lanes, gemv_panel_columns
    assert gemv_chunk(1000, 8, 16, packed=True) == (40, 1)
    assert gemv_chunk(1000, 8, 16) == (200, 1)                       # strided B: 8 vectors at least
    assert gemv_chunk(1000, 8, 2, packed=True) == gemv_chunk(1000, 8, 2) == (200, 1)
    assert gemv_panel_columns(1280, 1000, 8, 16) == 40
    w, x = rand(RNG, (1280, 1000)), rand(RNG, (1, 1280))
    target = Target.host()
    target.num_cores = 16
    m = model([n("MatMul", ["x", "w"], ["y"])], {"x": (x.shape, "float32")}, {"y": (None, "float32")}, {"w": w},
              opset=17)
    module = build_model(from_onnx(m), target=target)
    (step,) = module.steps
    opdef = step.group.opdef
    f = lower(default_schedule(opdef, module.target), [*opdef.inputs, opdef.output])
    (loop,) = [s for s in walk_stmts(f.body) if isinstance(s, For) and s.kind == "parallel"]
    chunk, _ = gemv_chunk(1000, gemv_lanes(1000, target.vector_lanes("float32")), 16, packed=True)
    assert loop.extent == 1000 // chunk >= 16
    for _ in range(3):
        (got,) = module.run(x=x)
        want = x.astype(np.float64) @ w.astype(np.float64)
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5
