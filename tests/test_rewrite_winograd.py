"""The `winograd` algorithm rewrite (compiler/rewrite.py, Schedule.rewrite): an NCHW 3x3
convolution computed by F(m x m, 3 x 3) inside one kernel, its weights transformed on every
call, offered to the tuner as conv2d_nchw's `algorithm` knob and taken by its default where the
output has tiles enough; checked against float64 numpy on sizes no tile or block divides, dilated
or not, through replayed steps, and refused where it does not apply."""

from __future__ import annotations

import numpy as np
import pytest

import compiler
from compiler import compute, placeholder
from compiler.errors import ScheduleError
from compiler.ops import build_op, get_op
from compiler.ops.base import OpDef, random_inputs
from compiler.ops.default_schedules import default_schedule
from compiler.ops.functions import conv2d_nchw
from compiler.ops.schedule_anchor import anchor_recipe_choices, schedule_anchor_recipe, schedule_by_structure
from compiler.ops.schedule_conv_plane import WINOGRAD_DEFAULT_MIN_TILES, schedule_conv_nchw_default
from compiler.ops.schedule_winograd import schedule_conv_nchw_winograd, schedule_winograd_stages, winograd_rewrite_applies
from compiler.schedule import create_schedule
from compiler.schedule_steps import apply_steps, steps_to_json
from compiler.target import resolve_target
from compiler.tensor import max as te_max
from compiler.verify import poisoned
from tuner.space.sketch.recipe import starting_points

TARGET = resolve_target(None)
B = TARGET.vector_lanes("float32")


def run(kernel, opdef, seed=0):
    ins = random_inputs(opdef, np.random.default_rng(seed))
    out = poisoned(opdef.output.shape, opdef.output.dtype, 0)
    kernel(*ins, out)
    return out, opdef.reference(*[a.astype(np.float64) for a in ins])


def assert_close(got, ref):
    assert np.isfinite(got).all()
    err = np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max()
    assert err < 1e-5, err


# (N, C, H, W, F, padding[, dilation]): heights and widths no 2x2 or 4x4 tile divides, asymmetric
# padding, none, a batch of two, more output than input channels; dilations (dense convolutions of
# the input's phases) of 2, 3 and unequal ones, phases of unequal sizes
CASES = [(1, B, 15, 9, 3 * B, 1), (2, 2 * B, 7, 12, B, (1, 0)), (1, B, 6, 6, 2 * B, 0), (1, 3 * B, 11, 5, B, (0, 2, 1, 0))]
DILATED = [(1, B, 15, 9, 2 * B, 2, 2), (2, B, 13, 17, B, (2, 1), (2, 1)), (1, 2 * B, 20, 19, B, 3, 3), (1, B, 11, 12, B, 0, 2)]


@pytest.mark.parametrize("case", CASES + DILATED)
@pytest.mark.parametrize("tile", [2, 4])
def test_the_rewritten_convolution_matches_a_float64_convolution(case, tile):
    N, C, H, W, F, padding, *dilation = case
    op = get_op("conv2d_nchw", N=N, C=C, H=H, W=W, F=F, KH=3, KW=3, stride=1, padding=padding, dilation=dilation[0] if dilation else 1)
    s = create_schedule(op.output)
    added = s.rewrite(op.output, "winograd", tile=tile, block=B)
    assert {"winograd_weight", "winograd_gemm", "winograd_output"} <= {st.op.tag for st in added}
    assert all(st.op.name != "pad" or st.op.input_tensors()[0].op.tag == "winograd_data_blocked" for st in s.stages)
    got, ref = run(compiler.build(s, op.tensors, TARGET), op)
    assert_close(got, ref)


@pytest.mark.parametrize("case", CASES[:2])
def test_the_scheduled_rewrite_replays_from_its_recorded_steps(case):
    N, C, H, W, F, padding = case
    params = dict(N=N, C=C, H=H, W=W, F=F, KH=3, KW=3, stride=1, padding=padding)
    s = schedule_conv_nchw_winograd(get_op("conv2d_nchw", **params), TARGET)
    assert s.steps[0]["op"] == "rewrite" and s.steps[0]["params"] == {"tile": 2, "block": B}
    fresh = get_op("conv2d_nchw", **params)
    replayed = apply_steps([fresh.output], steps_to_json(s.steps))
    got, ref = run(compiler.build(replayed, fresh.tensors, TARGET), fresh, seed=3)
    assert_close(got, ref)


@pytest.mark.parametrize("per_block", [False, True])
def test_a_convolution_with_an_epilogue_rewritten_and_scheduled_gives_the_same_values(per_block):
    """The epilogue (bias, relu) reads the rewritten convolution; with `weights_per_block` each
    output channel block's weights are transformed inside the matrix products' block loop."""
    op = get_op("conv2d_bias_relu", N=1, C=2 * B, H=9, W=13, F=4 * B, KH=3, KW=3, stride=1, padding=1)
    conv = next(t for t in op.output.op.input_tensors() if t.op.tag == "conv2d_nchw")
    s = create_schedule(op.output)
    s.rewrite(conv, "winograd", tile=2, block=B)
    schedule_winograd_stages(s, s[conv], TARGET, gemm_tile=(1, 4), weights_per_block=per_block)
    weight = next(st for st in s.stages if st.op.tag == "winograd_weight")
    assert weight.attach[0] == ("at" if per_block else "root")
    got, ref = run(compiler.build(s, op.tensors, TARGET), op)
    assert (got >= 0).all()
    assert_close(got, ref)


def test_a_convolution_of_computed_data_keeps_the_stage_that_computes_it():
    """The rewrite's DAG reads the data the convolution read: a prologue stage (relu of the
    input) stays one stage, read by the blocked copy, not duplicated or dropped."""
    x = placeholder((1, B, 10, 11), "float32", "x")
    w = placeholder((B, B, 3, 3), "float32", "w")
    act = compute(x.shape, lambda *i: te_max(x[i], 0.0), name="act")
    conv = conv2d_nchw(act, w, 1, 1)
    s = create_schedule(conv)
    s.rewrite(conv, "winograd", tile=2, block=B)
    assert [st.name for st in s.stages].count("act") == 1
    kernel = compiler.build(s, [x, w, conv], TARGET)
    rng = np.random.default_rng(4)
    xs, ws = (rng.uniform(-1, 1, t.shape).astype(np.float32) for t in (x, w))
    got = poisoned(conv.shape, "float32", 0)
    kernel(xs, ws, got)
    xp = np.pad(np.maximum(xs.astype(np.float64), 0.0), ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros(conv.shape)
    for ky in range(3):
        for kx in range(3):
            ref += np.einsum("nchw,fc->nfhw", xp[:, :, ky:ky + 10, kx:kx + 11], ws[:, :, ky, kx].astype(np.float64))
    assert_close(got, ref)


@pytest.mark.parametrize("params, why", [
    (dict(stride=2, padding=1), "strided"),
    (dict(stride=1, padding=1, groups=2), "grouped"),
])
def test_a_convolution_the_rewrite_does_not_fit_is_refused_and_left_as_it_was(params, why):
    op = get_op("conv2d_nchw", N=1, C=2 * B, H=12, W=12, F=2 * B, KH=3, KW=3, **params)
    s = create_schedule(op.output)
    before = [(st.name, st.op) for st in s.stages]
    with pytest.raises(ScheduleError, match=why):
        s.rewrite(op.output, "winograd", tile=2, block=B)
    assert [(st.name, st.op) for st in s.stages] == before and s.steps == []


def test_rewrites_are_refused_for_other_computes_unknown_names_bad_params_and_scheduled_stages():
    mm = get_op("matmul", M=32, N=32, K=32)
    with pytest.raises(ScheduleError, match="not an NCHW convolution"):
        create_schedule(mm.output).rewrite(mm.output, "winograd", tile=2, block=B)
    op = get_op("conv2d_nchw", N=1, C=B, H=8, W=8, F=B, KH=3, KW=3, stride=1, padding=1)
    with pytest.raises(ScheduleError, match="unknown rewrite 'strassen'"):
        create_schedule(op.output).rewrite(op.output, "strassen")
    with pytest.raises(ScheduleError, match="tile 2 or 4"):
        create_schedule(op.output).rewrite(op.output, "winograd", tile=3, block=B)
    with pytest.raises(ScheduleError, match="whole blocks"):
        create_schedule(op.output).rewrite(op.output, "winograd", tile=2, block=B + 1)
    s = create_schedule(op.output)
    s[op.output].split(s[op.output].op.axis[1], factor=2)
    with pytest.raises(ScheduleError, match="before any other step"):
        s.rewrite(op.output, "winograd", tile=2, block=B)
    with pytest.raises(ScheduleError, match="unknown op"):
        apply_steps([op.output], [{"op": "rewrites", "tensor": 1, "name": "winograd"}])


def test_the_recipe_offers_the_winograd_form_first_where_it_applies():
    res4 = get_op("conv2d_nchw", N=1, C=256, H=14, W=14, F=256, KH=3, KW=3, stride=1, padding=1)
    choices = anchor_recipe_choices(res4, TARGET)
    assert list(choices)[0] == "algorithm" and choices["algorithm"] == ["direct", "winograd", "winograd_per_block"]
    for algorithm in ("winograd", "winograd_per_block"):
        s = schedule_anchor_recipe(res4, TARGET, {"algorithm": algorithm})
        assert s.steps[0]["op"] == "rewrite"
        got, ref = run(compiler.build(s, res4.tensors, TARGET), res4)
        assert_close(got, ref)
    starts = [p["recipe"] for p in starting_points(choices)]
    assert [p["algorithm"] for p in starts[:2]] == ["winograd", "winograd_per_block"]   # measured in the first batch
    default, _ = run(build_op(res4, TARGET), res4)
    assert_close(default, ref)
    for params in (dict(KH=1, KW=1, padding=0), dict(KH=3, KW=3, stride=2, padding=1)):
        other = get_op("conv2d_nchw", **{**dict(N=1, C=256, H=14, W=14, F=256, stride=1), **params})
        assert "algorithm" not in anchor_recipe_choices(other, TARGET)


def rewritten(s) -> bool:
    return bool(s.steps) and s.steps[0]["op"] == "rewrite"


# channels in whole vectors of AVX2 and AVX-512, with work enough for the rewrite to apply
@pytest.mark.parametrize("N, C, H, W, F, dilation", [(1, 32, 29, 27, 48, 1), (2, 64, 17, 19, 64, 1), (1, 128, 14, 14, 64, 1),
                                                     (1, 64, 25, 23, 64, 2), (1, 64, 25, 26, 32, 3)])
def test_the_default_takes_the_rewrite_where_the_output_has_tiles_enough(N, C, H, W, F, dilation):
    """WINOGRAD_DEFAULT_MIN_TILES 2x2 tiles of output (the batch counted) or more: build_op's kernel
    is the Winograd form, values as a float64 convolution's on sizes no tile divides."""
    op = get_op("conv2d_nchw", N=N, C=C, H=H, W=W, F=F, KH=3, KW=3, stride=1, padding=dilation, dilation=dilation)
    assert N * -(-H // 2) * -(-W // 2) >= WINOGRAD_DEFAULT_MIN_TILES
    assert rewritten(default_schedule(op, TARGET))
    got, ref = run(build_op(op, TARGET), op, seed=5)
    assert_close(got, ref)


def test_the_default_stays_direct_on_few_tiles_other_convolutions_and_an_unfused_epilogue():
    few = get_op("conv2d_nchw", N=1, C=256, H=7, W=7, F=256, KH=3, KW=3, stride=1, padding=1)   # as res5: 16 tiles
    assert winograd_rewrite_applies(few, TARGET)
    strided = get_op("conv2d_nchw", N=1, C=64, H=28, W=28, F=64, KH=3, KW=3, stride=2, padding=1)
    # a dilation of 12 on a 33x33 map: 3 rows per phase, in 2 tiles of 2: the tiles would cover
    # twice the output
    sparse = get_op("conv2d_nchw", N=1, C=64, H=33, W=33, F=64, KH=3, KW=3, stride=1, padding=12, dilation=12)
    assert not winograd_rewrite_applies(sparse, TARGET)
    for op in (few, strided, sparse):
        assert not rewritten(default_schedule(op, TARGET))
        got, ref = run(build_op(op, TARGET), op, seed=6)
        assert_close(got, ref)
    many = get_op("conv2d_nchw", N=1, C=64, H=18, W=18, F=64, KH=3, KW=3, stride=1, padding=1)
    relu = compute(many.output.shape, lambda *i: te_max(many.output[i], 0.0), name="relu")
    assert rewritten(schedule_conv_nchw_default(many, TARGET, epilogue=relu))
    assert not rewritten(schedule_conv_nchw_default(many, TARGET, epilogue=relu, fuse_epilogue=False))


def test_a_fused_group_with_a_convolution_anchor_takes_the_same_default():
    """A model's fused group (convolution, bias, relu as one compute DAG) is scheduled by its
    structure; its convolution gets the rule the inventory operator gets."""
    x = placeholder((1, 64, 16, 18), "float32", "x")
    w = placeholder((64, 64, 3, 3), "float32", "w")
    bias = placeholder((64,), "float32", "bias")
    conv = conv2d_nchw(x, w, 1, 1)
    out = compute(conv.shape, lambda n, f, y, xx: te_max(conv[n, f, y, xx] + bias[f], 0.0), name="bias_relu")
    op = OpDef("fused_conv_bias_relu", [x, w, bias], out, {}, 0.0, None)
    s = schedule_by_structure(op, TARGET)
    assert rewritten(s)
    kernel = compiler.build(s, [x, w, bias, out], TARGET)
    rng = np.random.default_rng(7)
    xs, ws, bs = (rng.uniform(-1, 1, t.shape).astype(np.float32) for t in (x, w, bias))
    got = poisoned(out.shape, "float32", 0)
    kernel(xs, ws, bs, got)
    xp = np.pad(xs.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros(out.shape)
    for ky in range(3):
        for kx in range(3):
            ref += np.einsum("nchw,fc->nfhw", xp[:, :, ky:ky + 16, kx:kx + 18], ws[:, :, ky, kx].astype(np.float64))
    ref = np.maximum(ref + bs.astype(np.float64)[None, :, None, None], 0.0)
    assert_close(got, ref)
