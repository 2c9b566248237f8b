"""Operators as tensor functions (compiler.ops.functions) and the fused inventory operators built
from them: conv2d_bias_relu and dense_gelu, one workload each.

Their default-schedule kernels are checked with the rest of the inventory in test_ops_kernels
(random non-zero inputs, poisoned output, float64 reference, odd shapes, stride 2, padding,
groups); here: what they are made of, and that the tuner's sketch space schedules them.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from test_spaces import check_builds_and_computes

import compiler as C
from compiler.errors import ExprError
from compiler.ops import default_schedule, get_op
from compiler.ops import functions as fn
from compiler.ops.base import OpDef, np_gelu
from tuner.space import SketchSpace, generate_sketches

CONV = dict(N=1, C=4, H=9, W=11, F=6, KH=3, KW=3, stride=2, padding=1, groups=2)


def test_conv2d_bias_relu_is_the_composition_of_its_functions():
    op = get_op("conv2d_bias_relu", **CONV)
    data, weight, bias = (C.placeholder(t.shape, t.dtype, t.name) for t in op.inputs)
    out = fn.bias_add(fn.conv2d_nchw(data, weight, stride=2, padding=1, groups=2), bias, activation="relu",
                      name="conv2d_bias_relu", tag="elemwise")
    assert C.workload_key([out]) == op.workload_key()
    assert [st.name for st in C.create_schedule(op.output).stages] == ["pad", "conv2d_nchw", "conv2d_bias_relu"]


def test_dense_gelu_is_dense_with_its_gelu_epilogue():
    """One compute, one key: records tuned for either apply to both, and so does the schedule."""
    params = dict(batch=16, in_dim=40, out_dim=24)
    fused, dense = get_op("dense_gelu", **params), get_op("dense", epilogue="gelu", **params)
    assert fused.workload_key() == dense.workload_key()
    assert fused.params == dict(params, dtype="float32") and fused.name == "dense_gelu"
    assert default_schedule(fused).steps == default_schedule(dense).steps


def test_sketch_rules_fuse_the_epilogue_into_the_tile():
    ids = {sk.id for sk in generate_sketches(get_op("conv2d_bias_relu", **CONV))}
    assert ids == {"pad:inline|conv2d_nchw:tile_fused|conv2d_bias_relu:fused_consumer",
                   "pad:root|conv2d_nchw:tile_fused|conv2d_bias_relu:fused_consumer"}
    assert {sk.id for sk in generate_sketches(get_op("dense_gelu", batch=4, in_dim=8, out_dim=8))} == \
        {"dense_matmul:tile_fused|dense_epilogue:fused_consumer"}


@pytest.mark.parametrize("name,params,samples", [
    ("conv2d_bias_relu", CONV, 8),
    ("conv2d_bias_relu", dict(N=1, C=3, H=7, W=13, F=5, KH=3, KW=3, padding=(1, 0, 2, 1), dilation=2), 4),
    ("dense_gelu", dict(batch=10, in_dim=33, out_dim=50), 8),
])
def test_sketch_candidates_of_fused_operators_build_and_compute(name, params, samples):
    space = SketchSpace(get_op(name, **params))
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    cands = [space.sample(rng, sketch=sk.id) for sk in space.sketches]
    cands += [space.sample(rng) for _ in range(samples - len(cands))]
    cands.append(space.mutate(cands[-1], rng))
    for cand in cands:
        check_builds_and_computes(get_op(name, **params), cand, rng)


def test_functions_compose_into_a_user_operator():
    """relu(bias_add(conv)) as two stages, then a residual add: the sketch space inlines the
    elementwise chain into the convolution's consumer."""
    x = C.placeholder((1, 3, 8, 8), "float32", "x")
    w = C.placeholder((4, 3, 3, 3), "float32", "w")
    b = C.placeholder((4,), "float32", "b")
    r = C.placeholder((1, 4, 8, 8), "float32", "r")
    y = fn.add(fn.relu(fn.bias_add(fn.conv2d_nchw(x, w, padding=1), b)), r, name="residual")

    def reference(xa, wa, ba, ra):
        conv = get_op("conv2d_nchw", N=1, C=3, H=8, W=8, F=4, KH=3, KW=3, padding=1, dtype="float64")
        return np.maximum(conv.reference(xa, wa) + ba.reshape(1, -1, 1, 1), 0) + ra

    op = OpDef("residual_block", [x, w, b, r], y, {}, 0, reference)
    space = SketchSpace(op)
    rng = np.random.default_rng(5)
    for cand in [space.sample(rng, sketch=sk.id) for sk in space.sketches][:4]:
        check_builds_and_computes(op, cand, rng)


def test_gelu_and_dense_functions_match_numpy():
    x = C.placeholder((3, 5), "float64", "x")
    w = C.placeholder((4, 5), "float64", "w")
    y = fn.gelu(fn.dense(x, w))
    xa, wa = np.random.default_rng(0).normal(size=(3, 5)), np.random.default_rng(1).normal(size=(4, 5))
    out = np.empty((3, 4))
    C.build(C.create_schedule(y), [x, w, y])(xa, wa, out)
    np.testing.assert_allclose(out, np_gelu(xa @ wa.T), rtol=1e-12)


@pytest.mark.parametrize("call,message", [
    (lambda t: fn.conv2d_nchw(t["x"], t["w3"]), r"conv2d_nchw: weight.shape\[1\] \(input channels per group\) is 3, "
                                                r"expected 4 \(C=4 / groups=1\)"),
    (lambda t: fn.conv2d_nchw(t["x"], t["w4"], groups=3), "conv2d_nchw: groups=3 must divide"),
    (lambda t: fn.conv2d_nchw(t["x"], t["w4"], padding=(1, 2, 3)), "conv2d_nchw: padding must be"),
    (lambda t: fn.conv2d_nchw(t["x"], t["w4i"]), "conv2d_nchw: x and w4i have different dtypes"),
    (lambda t: fn.conv2d_nchw(t["m"], t["w4"]), r"conv2d_nchw: data must be 4-d, got shape \(4, 5\)"),
    (lambda t: fn.conv2d_nchw(np.ones((1, 4, 5, 5)), t["w4"]), "conv2d_nchw: data must be a Tensor, got ndarray"),
    (lambda t: fn.depthwise_conv2d_nchw(t["x"], t["w3"]),
     r"weight.shape\[0\] is 2, expected 4 \(the data's channels\)"),
    (lambda t: fn.matmul(t["m"], t["m"]), r"matmul: the reduction length of b is 4, expected 5 \(as a's\)"),
    (lambda t: fn.dense(t["mi"], t["mi"]), "dense: dtype 'int8' not supported"),
    (lambda t: fn.bias_add(t["x"], t["b3"]), r"bias_add: bias.shape\[0\] is 3, expected 4 \(data.shape\[1\]\)"),
    (lambda t: fn.bias_add(t["x"], t["b4"], activation="tanh"), "bias_add: activation must be one of none, relu, gelu"),
    (lambda t: fn.add(t["m"], t["x"]), r"add: shapes \(4, 5\) and \(1, 4, 5, 5\) cannot be broadcast"),
])
def test_functions_refuse_tensors_that_do_not_fit(call, message):
    t = dict(x=C.placeholder((1, 4, 5, 5), "float32", "x"), w3=C.placeholder((2, 3, 3, 3), "float32", "w3"),
             w4=C.placeholder((2, 4, 3, 3), "float32", "w4"), w4i=C.placeholder((2, 4, 3, 3), "int8", "w4i"),
             m=C.placeholder((4, 5), "float32", "m"), mi=C.placeholder((4, 5), "int8", "mi"),
             b3=C.placeholder((3,), "float32", "b3"), b4=C.placeholder((4,), "float32", "b4"))
    with pytest.raises(ExprError, match=message):
        call(t)
