"""Every inventory operator, compiled with its default schedule, against its numpy reference.

Shapes are small and deliberately awkward: sizes that no tile or vector width divides (7, 13,
17, 31, 33), padding (also asymmetric), stride 2, dilation 2, groups 2 and 3, depthwise
multipliers, batch > 1, broadcasting with size-1 dimensions, reductions over several axes with
and without keepdims, int8 inputs. Inputs are random and non-zero; the output buffer is
poisoned (NaN, or a sentinel for integers) so an element the kernel forgets to write fails.
A few operators are also built with the naive schedule, which checks the lowering on its own.
"""

from __future__ import annotations

import numpy as np
import pytest

from compiler import Target, create_schedule, lower
from compiler.ops import INVENTORY, build_op, default_schedule, get_op, random_inputs
from compiler.runtime import build

CASES = [
    # GEMM family (schedule_gemm)
    ("matmul", dict(M=13, N=17, K=31)),
    ("matmul", dict(M=33, N=7, K=5, transpose_b=True)),
    ("matmul", dict(M=7, N=40, K=13, dtype="float64")),
    ("matmul", dict(M=5, N=9, K=17, dtype="int8")),
    ("matmul_int8", dict(M=13, N=33, K=17)),
    ("matmul_int8", dict(M=7, N=16, K=31, transpose_b=True)),
    ("batch_matmul", dict(B=3, M=7, N=13, K=17)),
    ("batch_matmul", dict(B=2, M=9, N=17, K=5, transpose_b=True, dtype="int8")),
    ("dense", dict(batch=7, in_dim=31, out_dim=33)),
    ("dense", dict(batch=13, in_dim=17, out_dim=16, epilogue="relu")),
    ("dense", dict(batch=2, in_dim=9, out_dim=7, epilogue="gelu")),
    # conv2d_nchw
    ("conv2d_nchw", dict(N=2, C=3, H=13, W=17, F=5, KH=3, KW=3, padding=1)),
    ("conv2d_nchw", dict(N=1, C=4, H=17, W=17, F=8, KH=3, KW=3, stride=2, padding=(1, 0, 2, 1))),
    ("conv2d_nchw", dict(N=1, C=3, H=13, W=13, F=4, KH=3, KW=3, dilation=2, padding=2)),
    ("conv2d_nchw", dict(N=1, C=4, H=9, W=11, F=6, KH=3, KW=3, padding=1, groups=2)),
    ("conv2d_nchw", dict(N=2, C=6, H=7, W=7, F=9, KH=3, KW=2, stride=(2, 1), padding=1, groups=3)),
    ("conv2d_nchw", dict(N=1, C=5, H=7, W=9, F=7, KH=1, KW=1)),
    ("conv2d_nchw", dict(N=1, C=16, H=31, W=33, F=16, KH=3, KW=3, padding=1)),
    ("conv2d_nchw", dict(N=1, C=8, H=16, W=32, F=24, KH=3, KW=3, padding=1)),
    ("conv2d_nchw", dict(N=1, C=8, H=14, W=28, F=16, KH=5, KW=5, padding=2)),
    ("conv2d_nchw", dict(N=1, C=4, H=12, W=13, F=6, KH=3, KW=3, padding=1, dtype="int8")),
    ("conv2d_nchw", dict(N=1, C=3, H=11, W=13, F=4, KH=1, KW=1, stride=2)),
    ("conv2d_nchw", dict(N=1, C=2, H=15, W=16, F=3, KH=3, KW=3, stride=3, dilation=2, padding=1)),
    ("conv2d_nchw", dict(N=1, C=64, H=14, W=14, F=32, KH=3, KW=3, stride=2, padding=1, groups=2)),
    ("conv2d_nchw", dict(N=1, C=3, H=7, W=6, F=4, KH=3, KW=3, stride=2, dilation=2, padding=2, groups=1,
                         dtype="float64")),
    # conv2d_nhwc
    ("conv2d_nhwc", dict(N=2, C=3, H=13, W=17, F=5, KH=3, KW=3, padding=1)),
    ("conv2d_nhwc", dict(N=1, C=4, H=17, W=17, F=8, KH=3, KW=3, stride=2, padding=(1, 0, 2, 1))),
    ("conv2d_nhwc", dict(N=1, C=3, H=13, W=13, F=4, KH=3, KW=3, dilation=2, padding=2)),
    ("conv2d_nhwc", dict(N=1, C=4, H=9, W=11, F=16, KH=3, KW=3, padding=1, groups=2)),
    ("conv2d_nhwc", dict(N=2, C=6, H=7, W=7, F=9, KH=3, KW=2, stride=(2, 1), padding=1, groups=3)),
    ("conv2d_nhwc", dict(N=1, C=16, H=14, W=14, F=32, KH=3, KW=3, padding=1)),
    ("conv2d_nhwc", dict(N=1, C=8, H=9, W=31, F=33, KH=1, KW=1)),
    ("conv2d_nhwc", dict(N=1, C=4, H=12, W=13, F=16, KH=3, KW=3, padding=1, dtype="int8")),
    # conv2d_bias_relu (schedule_fused)
    ("conv2d_bias_relu", dict(N=2, C=3, H=13, W=17, F=5, KH=3, KW=3, padding=1)),
    ("conv2d_bias_relu", dict(N=1, C=4, H=17, W=17, F=8, KH=3, KW=3, stride=2, padding=(1, 0, 2, 1))),
    ("conv2d_bias_relu", dict(N=1, C=6, H=9, W=11, F=9, KH=3, KW=2, stride=(2, 1), padding=1, groups=3)),
    ("conv2d_bias_relu", dict(N=1, C=3, H=7, W=6, F=4, KH=3, KW=3, stride=2, dilation=2, padding=2,
                              dtype="float64")),
    ("conv2d_bias_relu", dict(N=1, C=16, H=14, W=14, F=32, KH=3, KW=3, padding=1)),
    ("conv2d_bias_relu", dict(N=1, C=5, H=7, W=9, F=7, KH=1, KW=1)),
    # dense_gelu (schedule_fused)
    ("dense_gelu", dict(batch=7, in_dim=31, out_dim=33)),
    ("dense_gelu", dict(batch=2, in_dim=9, out_dim=7, dtype="float64")),
    # depthwise_conv2d_nchw
    ("depthwise_conv2d_nchw", dict(N=2, C=3, H=13, W=17, KH=3, KW=3, padding=1)),
    ("depthwise_conv2d_nchw", dict(N=1, C=4, H=17, W=17, KH=3, KW=3, stride=2, padding=1, multiplier=2)),
    ("depthwise_conv2d_nchw", dict(N=1, C=2, H=13, W=11, KH=3, KW=3, dilation=2, padding=(2, 1), multiplier=3)),
    ("depthwise_conv2d_nchw", dict(N=1, C=8, H=32, W=32, KH=5, KW=5, padding=2)),
    ("depthwise_conv2d_nchw", dict(N=1, C=3, H=9, W=10, KH=3, KW=3, padding=1, dtype="int8")),
    ("depthwise_conv2d_nchw", dict(N=2, C=5, H=9, W=17, KH=3, KW=3, stride=(1, 2), padding=1, dtype="int8")),
    # pooling
    ("max_pool2d", dict(N=2, C=3, H=13, W=17, kernel=3, stride=2, padding=1)),
    ("max_pool2d", dict(N=1, C=2, H=17, W=31, kernel=3, stride=1, padding=1)),
    ("max_pool2d", dict(N=1, C=3, H=7, W=13, kernel=(2, 3), padding=(1, 0, 0, 2))),
    ("max_pool2d", dict(N=1, C=2, H=9, W=9, kernel=2, dtype="int8")),
    ("avg_pool2d", dict(N=2, C=3, H=13, W=17, kernel=3, stride=2, padding=1)),
    ("avg_pool2d", dict(N=1, C=2, H=16, W=33, kernel=3, stride=1, padding=1)),
    ("avg_pool2d", dict(N=1, C=3, H=7, W=13, kernel=(2, 3), stride=(2, 1))),
    ("avg_pool2d", dict(N=1, C=2, H=9, W=8, kernel=2, dtype="float64")),
    # normalization
    ("softmax", dict(shape=(7, 13))),
    ("softmax", dict(shape=(17, 64))),
    ("softmax", dict(shape=(3, 5, 33))),
    ("softmax", dict(shape=(2, 5, 17), axis=1)),
    ("softmax", dict(shape=(13, 6), axis=0)),
    ("softmax", dict(shape=(31,))),
    ("softmax", dict(shape=(4, 9), dtype="float64")),
    ("layer_norm", dict(shape=(13, 31))),
    ("layer_norm", dict(shape=(16, 40))),
    ("layer_norm", dict(shape=(2, 3, 17), axis=1, eps=1e-3)),
    ("layer_norm", dict(shape=(33,))),
    ("layer_norm", dict(shape=(5, 7), axis=0, dtype="float64")),
    # elementwise
    ("add", dict(shape_a=(7, 13))),
    ("add", dict(shape_a=(3, 1, 5), shape_b=(4, 1))),
    ("add", dict(shape_a=(2, 1, 17), shape_b=(1, 13, 1))),
    ("add", dict(shape_a=(33,), dtype="int32")),
    ("add", dict(shape_a=(4, 100), shape_b=(100,), dtype="float64")),
    ("mul", dict(shape_a=(13, 17), shape_b=(17,))),
    ("mul", dict(shape_a=(5, 1), shape_b=(1, 31), dtype="int32")),
    ("relu", dict(shape=(7, 13))),
    ("relu", dict(shape=(33,), dtype="int8")),
    ("relu", dict(shape=(2, 3, 130))),
    ("gelu", dict(shape=(7, 13))),
    ("gelu", dict(shape=(3, 100))),
    ("bias_add", dict(shape=(2, 5, 7, 9))),
    ("bias_add", dict(shape=(3, 13), axis=-1, dtype="int32")),
    # reductions
    ("reduce_sum", dict(shape=(7, 13))),
    ("reduce_sum", dict(shape=(3, 13, 5), axis=1)),
    ("reduce_sum", dict(shape=(3, 13, 5), axis=(0, 2), keepdims=True)),
    ("reduce_sum", dict(shape=(17, 33), axis=-1)),
    ("reduce_sum", dict(shape=(2, 3, 7, 9), axis=(1, 2, 3))),
    ("reduce_sum", dict(shape=(33, 40), axis=0, keepdims=True)),
    ("reduce_sum", dict(shape=(5, 7), axis=1, dtype="int32")),
    ("reduce_max", dict(shape=(13, 17), axis=-1)),
    ("reduce_max", dict(shape=(3, 4, 31), axis=(0, 1))),
    ("reduce_max", dict(shape=(6, 13), axis=0, dtype="int8")),
    ("reduce_min", dict(shape=(7, 13))),
    ("reduce_min", dict(shape=(3, 9, 5), axis=(0, 2), keepdims=True)),
    # data movement
    ("transpose", dict(shape=(13, 17))),
    ("transpose", dict(shape=(33, 70))),
    ("transpose", dict(shape=(2, 3, 4), axes=(2, 0, 1))),
    ("transpose", dict(shape=(2, 13, 17), axes=(0, 2, 1))),
    ("transpose", dict(shape=(3, 5, 7, 2), axes=(0, 2, 3, 1))),
    ("transpose", dict(shape=(4, 6, 5), axes=(1, 0, 2), dtype="int8")),
    ("pad", dict(shape=(3, 4), pad_before=(1, 0), pad_after=(2, 3), value=1.5)),
    ("pad", dict(shape=(2, 3, 13), pad_before=1, pad_after=(0, 2, 1), value=-2, dtype="int32")),
    ("pad", dict(shape=(1, 3, 7, 9), pad_before=(0, 0, 1, 2), pad_after=(0, 0, 2, 1))),
]


def _ids(cases):
    return [f"{n}-{i}" for i, (n, _) in enumerate(cases)]


def poisoned(op):
    dtype = np.dtype(op.output.dtype)
    if dtype.kind == "f":
        return np.full(op.output.shape, np.nan, dtype)
    return np.full(op.output.shape, np.iinfo(dtype).min + 3, dtype)


def check(op, kernel, seed=0):
    arrays = random_inputs(op, np.random.default_rng(seed))
    out = poisoned(op)
    kernel(*arrays, out)
    want = op.reference(*arrays)
    assert out.shape == want.shape and out.dtype == want.dtype
    if out.dtype.kind in "iu":
        np.testing.assert_array_equal(out, want)
    elif out.dtype == np.float64:
        np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-10)
    else:
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name,params", CASES, ids=_ids(CASES))
def test_default_schedule_matches_reference(name, params):
    op = get_op(name, **params)
    check(op, build_op(op))


def test_every_inventory_operator_is_tested():
    assert {n for n, _ in CASES} == set(INVENTORY)


NAIVE = [
    ("matmul", dict(M=7, N=13, K=5)),
    ("conv2d_nchw", dict(N=1, C=3, H=9, W=7, F=4, KH=3, KW=3, stride=2, padding=1, groups=1)),
    ("softmax", dict(shape=(5, 7))),
    ("avg_pool2d", dict(N=1, C=2, H=7, W=7, kernel=3, stride=2, padding=1)),
    ("reduce_sum", dict(shape=(3, 4, 5), axis=(0, 2), keepdims=True)),
    ("pad", dict(shape=(3, 4), pad_before=(1, 2), pad_after=(0, 1), value=-1.0)),
]


@pytest.mark.parametrize("name,params", NAIVE, ids=_ids(NAIVE))
def test_naive_schedule_matches_reference(name, params):
    op = get_op(name, **params)
    check(op, build(create_schedule(op.output), op.tensors))


@pytest.mark.parametrize("name,params,want", [
    ("conv2d_nchw", dict(N=1, C=16, H=28, W=28, F=32, KH=3, KW=3, padding=1), ("vectorized", "parallel")),
    ("conv2d_nhwc", dict(N=1, C=16, H=28, W=28, F=32, KH=3, KW=3, padding=1), ("vectorized", "parallel")),
    ("softmax", dict(shape=(256, 256)), ("vectorized", "parallel")),
    ("add", dict(shape_a=(256, 256)), ("vectorized", "parallel")),
    ("reduce_sum", dict(shape=(256, 256), axis=0), ("vectorized", "parallel")),
])
def test_default_schedules_vectorize_and_parallelize(name, params, want):
    op = get_op(name, **params)
    ir = str(lower(default_schedule(op, Target.host()), op.tensors))
    for kind in want:
        assert f"{kind} for" in ir, f"{name}: no {kind} loop in\n{ir}"


def test_conv_micro_kernel_has_no_guard_when_tiles_divide():
    """A register tile that divides the output needs no bounds test in the reduction loops."""
    op = get_op("conv2d_nchw", N=1, C=8, H=28, W=28, F=16, KH=3, KW=3, padding=1)
    ir = str(lower(default_schedule(op), op.tensors))
    assert "if (" not in ir.split("allocate conv2d_nchw_local")[1].split("conv2d_nchw[")[0]


def test_build_op_name_and_target():
    op = get_op("relu", shape=(9,))
    k = build_op(op, target=str(Target.host()), name="relu9")
    assert k.name == "relu9"
    check(op, k)


def test_single_core_target_has_no_parallel_loop_and_runs():
    host = Target.host()
    one = Target(host.triple, host.cpu, host.features, num_cores=1)
    for name, params in [("conv2d_nchw", dict(N=1, C=8, H=28, W=28, F=16, KH=3, KW=3, padding=1)),
                         ("softmax", dict(shape=(256, 256)))]:
        op = get_op(name, **params)
        s = default_schedule(op, one)
        assert "parallel for" not in str(lower(s, op.tensors))
        check(op, build(s, op.tensors, one))


def test_default_schedule_leaves_the_definition_reusable():
    """Schedules never mutate the compute definition: a second schedule of it builds and runs."""
    op = get_op("conv2d_nhwc", N=1, C=4, H=9, W=9, F=8, KH=3, KW=3, stride=2, padding=1)
    first = str(lower(default_schedule(op), op.tensors))
    check(op, build_op(op))
    assert str(lower(default_schedule(op), op.tensors)) == first


def test_default_schedules_replay_from_their_recorded_steps():
    """The tuner stores schedules as step lists: every default schedule must replay exactly."""
    from compiler.schedule_steps import apply_steps, steps_from_json, steps_to_json
    for name, params in CASES:
        op, fresh = get_op(name, **params), get_op(name, **params)
        s = default_schedule(op)
        replayed = apply_steps([fresh.output], steps_from_json(steps_to_json(s.steps)))
        assert str(lower(replayed, fresh.tensors)) == str(lower(s, op.tensors)), (name, params)
