"""compiler.lift: an expensive value a reduction would recompute across an output axis becomes a
stage of its own, computed once, and the result is unchanged (float64 numpy, odd sizes, the
naive definition and every way the schedule may place the stage)."""

from __future__ import annotations

import numpy as np
import pytest

import compiler as C
from compiler.lift import LIFTED_TAG, lift_recomputed_math
from compiler.ops import build_op
from compiler.ops.custom import custom_op
from compiler.runtime import build
from compiler.schedule import create_schedule
from compiler.serialize import dag_from_json, dag_to_json
from compiler.tensor import ComputeOp, topo_order
from compiler.verify import poisoned

RNG = np.random.default_rng(11)


def stages(out):
    return [op for op in topo_order([out]) if isinstance(op, ComputeOp)]


def lifted(out):
    return [op for op in stages(out) if op.tag == LIFTED_TAG]


def exp_matmul(M=37, N=45, K=19):
    A, B = C.placeholder((M, K), "float32", "A"), C.placeholder((N, K), "float32", "B")
    k = C.reduce_axis(K, "k")
    P = C.compute((M, N), lambda i, j: C.sum(C.exp(A[i, k] * 0.5) * B[j, k], axis=k), name="exp_mm")
    return [A, B], P, lambda a, b: np.exp(a.astype(np.float64) * 0.5) @ b.T.astype(np.float64)


def test_the_recomputed_exponential_becomes_a_stage_over_the_axes_it_uses():
    inputs, out, _ = exp_matmul()
    new = lift_recomputed_math(out)
    (lift,) = lifted(new)
    assert lift.shape == (37, 19)   # i, then the reduction's k
    assert new.name == out.name and new.shape == out.shape
    # the reduction reads the stage and no longer calls exp
    from compiler.expr import Call, walk
    assert not any(isinstance(n, Call) for n in walk(new.op.body))


def test_the_largest_expensive_subexpression_is_lifted_whole():
    A, B = C.placeholder((8, 9), "float32", "A"), C.placeholder((10, 9), "float32", "B")
    k = C.reduce_axis(9, "k")
    out = C.compute((8, 10), lambda i, j: C.sum((C.exp(A[i, k]) * 2.0 + 1.0) * B[j, k], axis=k), name="m")
    (lift,) = lifted(lift_recomputed_math(out))
    from compiler.expr import Binary, walk
    assert any(isinstance(n, Binary) and n.op == "add" for n in walk(lift.body))


@pytest.mark.parametrize("case", ["cheap", "uses_every_axis", "little_reuse", "guarded", "where"])
def test_what_is_not_worth_lifting_or_not_safe_to_lift_stays(case):
    A, B = C.placeholder((8, 9), "float32", "A"), C.placeholder((10, 9), "float32", "B")
    k = C.reduce_axis(9, "k")
    if case == "cheap":        # a product is one instruction: recomputing it costs less than a reload
        body = lambda i, j: C.sum(A[i, k] * 2.0 * B[j, k], axis=k)  # noqa: E731
    elif case == "uses_every_axis":   # softmax's exp(x - max): nothing is recomputed
        body = lambda i, j: C.sum(C.exp(A[i, k] * B[j, k]), axis=k)  # noqa: E731
    elif case == "little_reuse":
        A2 = C.placeholder((8, 9), "float32", "A2")
        out = C.compute((8, 3), lambda i, j: C.sum(C.exp(A2[i, k]) * B[j, k], axis=k), name="m")
        assert lift_recomputed_math(out) is out
        return
    elif case == "guarded":    # the read happens only where the condition holds
        body = lambda i, j: C.sum(C.if_then_else(k < 8, C.exp(A[i, k + 1]), 0.0) * B[j, k], axis=k)  # noqa: E731
    else:                      # the condition keeps the read in bounds: k + 1 < 9 only where k < 8
        body = lambda i, j: C.sum(C.exp(A[i, k + 1]) * B[j, k], axis=k, where=k < 8)  # noqa: E731
    out = C.compute((8, 10), body, name="m")
    assert lift_recomputed_math(out) is out


def test_a_masked_reduction_lifts_what_it_reads_in_bounds_everywhere():
    """A cumulative product as the exp of a causal sum of logs: log(1 + x/4) is computed once
    per element, not once per (j, k) pair, and the values the mask leaves out are never read."""
    R, L = 13, 23
    X = C.placeholder((R, L), "float32", "X")
    k = C.reduce_axis(L, "k")
    s = C.compute((R, L), lambda i, j: C.sum(C.log(1.0 + X[i, k] * 0.25), axis=k, where=k <= j), name="logsum")
    out = C.compute((R, L), lambda i, j: C.exp(s[i, j]), name="cumprod")
    op = custom_op("cumprod_log", [X], out)
    (lift,) = lifted(op.output)
    assert lift.shape == (R, L)
    x = RNG.uniform(-1, 1, (R, L)).astype(np.float32)
    got = poisoned(out.shape, "float32")
    build_op(op)(x, got)
    np.testing.assert_allclose(got, np.cumprod(1.0 + x.astype(np.float64) * 0.25, axis=1), rtol=2e-5)
    # an index from data, guarded by the condition: not lifted
    T, idx = C.placeholder((50, 7), "float32", "T"), C.placeholder((R, L), "int32", "idx")
    g = C.compute((R, L), lambda i, j: C.sum(C.exp(T[idx[i, k], 0]), axis=k, where=k <= j), name="g")
    assert lift_recomputed_math(g) is g


def test_lifting_is_idempotent_and_survives_a_round_trip_through_json():
    inputs, out, _ = exp_matmul()
    once = lift_recomputed_math(out)
    assert lift_recomputed_math(once) is once
    ins, outs = dag_from_json(dag_to_json([out], inputs))
    again = custom_op("exp_mm", ins, outs[0])
    assert again.workload_key() == custom_op("exp_mm", inputs, out).workload_key()


def test_producers_and_consumers_of_the_rewritten_reduction_are_rebuilt_around_it():
    M, N, K = 21, 35, 13
    A, B, D = C.placeholder((M, K), "float32", "A"), C.placeholder((N, K), "float32", "B"), C.placeholder((M,), "float32", "D")
    scaled = C.compute((M, K), lambda i, k: A[i, k] * 0.25, name="scaled")
    k = C.reduce_axis(K, "k")
    P = C.compute((M, N), lambda i, j: C.sum(C.log(scaled[i, k] * scaled[i, k] + 1.0) / B[j, k], axis=k), name="p")
    out = C.compute((M, N), lambda i, j: C.tanh(P[i, j]) + D[i], name="out")
    op = custom_op("chain", [A, B, D], out)
    assert len(lifted(op.output)) == 1 and op.output is not out
    a = RNG.uniform(-1, 1, (M, K)).astype(np.float32)
    b = RNG.uniform(0.5, 2, (N, K)).astype(np.float32)
    d = RNG.standard_normal(M).astype(np.float32)
    s = a.astype(np.float64) * 0.25
    ref = np.tanh((np.log(s * s + 1.0)[:, None, :] / b.astype(np.float64)[None]).sum(-1)) + d[:, None]
    got = poisoned(out.shape, "float32")
    build_op(op)(a, b, d, got)
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("placement", ["default", "inlined", "root", "naive"])
def test_the_result_is_the_same_wherever_the_stage_is_computed(placement):
    inputs, out, ref = exp_matmul(M=23, N=41, K=30)
    op = custom_op("exp_mm", inputs, out)
    a = RNG.uniform(-2, 2, (23, 30)).astype(np.float32)
    b = RNG.standard_normal((41, 30)).astype(np.float32)
    got = poisoned(out.shape, "float32")
    if placement == "default":
        kernel = build_op(op)
    else:
        s = create_schedule(op.output)
        if placement == "inlined":
            s[lifted(op.output)[0].output].compute_inline()
        kernel = build(s, [*op.inputs, op.output])
    kernel(a, b, got)
    np.testing.assert_allclose(got, ref(a, b), rtol=2e-5, atol=2e-5)


def test_the_flop_count_is_the_work_done_after_lifting():
    inputs, out, _ = exp_matmul(M=16, N=32, K=8)
    op = custom_op("exp_mm", inputs, out)
    # 2·M·N·K for the product and the sum, plus exp(A·0.5) once per element of A
    assert op.flops == 2 * 16 * 32 * 8 + 2 * 16 * 8


def test_the_sketch_space_may_keep_the_lifted_stage_at_the_root_or_inline_it():
    from tuner.space.sketch import generate_sketches
    from tuner.space.sketch.dag import SketchDag
    inputs, out, _ = exp_matmul()
    op = custom_op("exp_mm", inputs, out)
    dag = SketchDag(op)
    (i,) = [n for n in range(dag.n) if dag.op(n).tag == LIFTED_TAG]
    assert {sk.rules[i].name for sk in generate_sketches(op)} == {"inline", "root"}
