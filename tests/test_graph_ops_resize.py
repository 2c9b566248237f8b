"""Resize (and Upsample) against a float64 numpy reference written here from the ONNX spec (one
output position at a time: its source coordinate, then the nearest pixel, or the blend of the
two (linear) or four (cubic) around it), on random non-zero NCHW inputs of odd sizes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from graph_models import assert_close, model, rand, run
from onnx import helper

from compiler.graph import from_onnx
from compiler.graph.errors import ShapeError, UnsupportedModelError
from compiler.graph.fuse import fuse

RNG = np.random.default_rng(9)


def coordinate(o, size_in, size_out, scale, mode, roi=(0.0, 1.0)):
    if mode == "tf_crop_and_resize":
        start, end = roi
        if size_out == 1:
            return (end - start) * (size_in - 1) / 2 + start * (size_in - 1)
        return o * (end - start) * (size_in - 1) / (size_out - 1) + start * (size_in - 1)
    if mode == "asymmetric":
        return o / scale
    if mode == "align_corners":
        return 0.0 if size_out == 1 else o * (size_in - 1) / (size_out - 1)
    if mode == "pytorch_half_pixel" and size_out == 1:
        return -0.5
    return (o + 0.5) / scale - 0.5


def nearest_index(x, size_in, nearest_mode):
    f = math.floor(x)
    r = x - f
    up = {"floor": False, "ceil": r > 0, "round_prefer_floor": r > 0.5, "round_prefer_ceil": r >= 0.5}[nearest_mode]
    return min(max(f + int(up), 0), size_in - 1)


def keys_cubic(t, A):
    """Keys' cubic convolution kernel at distance t."""
    t = abs(t)
    if t <= 1:
        return (A + 2) * t ** 3 - (A + 3) * t ** 2 + 1
    return A * t ** 3 - 5 * A * t ** 2 + 8 * A * t - 4 * A if t < 2 else 0.0


def taps(c, size, mode, A, exclude_outside):
    """[(index, weight)] of source coordinate c along an axis of `size` (indices clamped)."""
    f = math.floor(c)
    if mode == "linear":
        pairs = [(f, 1 - (c - f)), (f + 1, c - f)]
    else:
        pairs = [(f + k, keys_cubic(c - (f + k), A)) for k in (-1, 0, 1, 2)]
        if exclude_outside:
            pairs = [(i, w if 0 <= i < size else 0.0) for i, w in pairs]
            total = sum(w for _, w in pairs)
            pairs = [(i, w / total) for i, w in pairs]
    return [(min(max(i, 0), size - 1), w) for i, w in pairs]


def np_resize(x, out_hw, scales_hw, mode, coords, nearest_mode="round_prefer_floor", A=-0.75,
              exclude_outside=False, roi=((0.0, 1.0), (0.0, 1.0)), extrapolation=0.0):
    """x [N, C, H, W] resized along H and W, one output element at a time."""
    a = x.astype(np.float64)
    N, C, H, W = a.shape
    OH, OW = out_hw
    y = np.zeros((N, C, OH, OW))
    for i in range(OH):
        for j in range(OW):
            cy = coordinate(i, H, OH, scales_hw[0], coords, roi[0])
            cx = coordinate(j, W, OW, scales_hw[1], coords, roi[1])
            if coords == "tf_crop_and_resize" and not (0 <= cy <= H - 1 and 0 <= cx <= W - 1):
                y[:, :, i, j] = extrapolation
            elif mode == "nearest":
                y[:, :, i, j] = a[:, :, nearest_index(cy, H, nearest_mode), nearest_index(cx, W, nearest_mode)]
            else:
                for yy, wy in taps(cy, H, mode, A, exclude_outside):
                    for xx, wx in taps(cx, W, mode, A, exclude_outside):
                        y[:, :, i, j] += wy * wx * a[:, :, yy, xx]
    return y


def resize_model(x_shape, out_shape, attrs, scales=None, sizes=None, opset=13):
    inits = {"roi": np.zeros(0, np.float32)}
    inputs = ["x", "roi"]
    if scales is not None:
        inits["scales"] = np.array(scales, np.float32)
        inputs.append("scales")
    else:
        inits["sizes"] = np.array(sizes, np.int64)
        inputs += ["", "sizes"]
    node = helper.make_node("Resize", inputs, ["y"], **attrs)
    return model([node], {"x": (x_shape, "float32")}, {"y": (out_shape, "float32")}, inits, opset)


CASES = [
    # mode, coordinate_transformation_mode, nearest_mode, input H x W, scales or sizes
    ("nearest", "asymmetric", "floor", (5, 7), dict(scales=[1, 1, 2, 2])),             # PyTorch's upsample
    ("nearest", "asymmetric", "floor", (5, 7), dict(scales=[1, 1, 3, 1.5])),
    ("nearest", "asymmetric", "round_prefer_ceil", (4, 5), dict(scales=[1, 1, 3, 2])),
    ("nearest", "half_pixel", "round_prefer_floor", (7, 9), dict(sizes=[2, 3, 4, 5])),  # downsample
    ("nearest", "half_pixel", "round_prefer_floor", (3, 5), dict(scales=[1, 1, 2.5, 1.4])),
    ("nearest", "pytorch_half_pixel", "round_prefer_floor", (5, 4), dict(sizes=[2, 3, 9, 1])),
    ("nearest", "align_corners", "round_prefer_floor", (5, 6), dict(sizes=[2, 3, 8, 11])),
    ("nearest", "half_pixel", "ceil", (6, 5), dict(scales=[1, 1, 0.5, 1.7])),
    ("linear", "half_pixel", None, (5, 7), dict(scales=[1, 1, 2, 2])),                 # bilinear upsample
    ("linear", "half_pixel", None, (9, 8), dict(sizes=[2, 3, 4, 5])),
    ("linear", "align_corners", None, (5, 6), dict(sizes=[2, 3, 9, 13])),
    ("linear", "asymmetric", None, (4, 5), dict(scales=[1, 1, 1.5, 2.5])),
    ("linear", "pytorch_half_pixel", None, (6, 5), dict(sizes=[2, 3, 1, 11])),
    ("cubic", "half_pixel", None, (5, 7), dict(scales=[1, 1, 2, 2])),                  # bicubic upsample
    ("cubic", "align_corners", None, (7, 6), dict(sizes=[2, 3, 4, 9])),
    ("cubic", "asymmetric", None, (4, 6), dict(scales=[1, 1, 1.75, 0.5])),
]


@pytest.mark.parametrize("mode,coords,nearest_mode,hw,given", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_resize(mode, coords, nearest_mode, hw, given):
    x = rand(RNG, (2, 3, *hw))
    if "scales" in given:
        sc = given["scales"]
        out_hw = tuple(int(np.float64(np.float32(s)) * n) for s, n in zip(sc[2:], hw))
        scales_hw = tuple(float(np.float32(s)) for s in sc[2:])
    else:
        out_hw = tuple(given["sizes"][2:])
        scales_hw = tuple(o / n for o, n in zip(out_hw, hw))
    attrs = {"mode": mode, "coordinate_transformation_mode": coords}
    if nearest_mode:
        attrs["nearest_mode"] = nearest_mode
    m = resize_model(x.shape, (2, 3, *out_hw), attrs, **given)
    (y,) = run(m, {"x": x})
    assert_close(y, np_resize(x, out_hw, scales_hw, mode, coords, nearest_mode or "round_prefer_floor"))


def test_resize_of_chosen_axes_and_keeping_the_aspect_ratio():
    x = rand(RNG, (1, 2, 4, 6))
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear", axes=[3, 2])
    m = model([node], {"x": (x.shape, "float32")}, {"y": ((1, 2, 6, 9), "float32")},
              {"scales": np.array([1.5, 1.5], np.float32)}, opset=18)
    (y,) = run(m, {"x": x})
    assert_close(y, np_resize(x, (6, 9), (1.5, 1.5), "linear", "half_pixel"))
    # sizes 8 x 8 of a 4 x 6 image, not larger: the smaller scale 8/6 for both axes, 5 x 8
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest", axes=[2, 3],
                            keep_aspect_ratio_policy="not_larger")
    m = model([node], {"x": (x.shape, "float32")}, {"y": ((1, 2, 5, 8), "float32")},
              {"sizes": np.array([8, 8], np.int64)}, opset=18)
    (y,) = run(m, {"x": x})
    assert_close(y, np_resize(x, (5, 8), (8 / 6, 8 / 6), "nearest", "half_pixel"))


def test_opset_10_resize_and_upsample_use_asymmetric_coordinates():
    x = rand(RNG, (1, 3, 3, 5))
    node = helper.make_node("Resize", ["x", "scales"], ["y"], mode="nearest")
    m = model([node], {"x": (x.shape, "float32")}, {"y": ((1, 3, 6, 10), "float32")},
              {"scales": np.array([1, 1, 2, 2], np.float32)}, opset=10)
    (y,) = run(m, {"x": x})
    assert_close(y, x.repeat(2, axis=2).repeat(2, axis=3))
    node = helper.make_node("Upsample", ["x", "scales"], ["y"], mode="linear")
    m = model([node], {"x": (x.shape, "float32")}, {"y": ((1, 3, 6, 10), "float32")},
              {"scales": np.array([1, 1, 2, 2], np.float32)}, opset=9)
    (y,) = run(m, {"x": x})
    assert_close(y, np_resize(x, (6, 10), (2.0, 2.0), "linear", "asymmetric"))
    node = helper.make_node("Upsample", ["x"], ["y"], mode="nearest", scales=[1.0, 1.0, 3.0, 2.0])   # opset 7: an attribute
    m = model([node], {"x": (x.shape, "float32")}, {"y": ((1, 3, 9, 10), "float32")}, opset=7)
    (y,) = run(m, {"x": x})
    assert_close(y, x.repeat(3, axis=2).repeat(2, axis=3))


def test_nearest_upsampling_fuses_with_the_concat_after_it():
    a, b = rand(RNG, (1, 4, 3, 5)), rand(RNG, (1, 2, 6, 10))
    nodes = [helper.make_node("Resize", ["a", "", "scales"], ["up"], mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
             helper.make_node("Concat", ["up", "b"], ["y"], axis=1)]
    m = model(nodes, {"a": (a.shape, "float32"), "b": (b.shape, "float32")}, {"y": ((1, 6, 6, 10), "float32")},
              {"scales": np.array([1, 1, 2, 2], np.float32)})
    assert [g.describe() for g in fuse(from_onnx(m))] == ["Resize+Concat"]
    (y,) = run(m, {"a": a, "b": b})
    assert_close(y, np.concatenate([a.repeat(2, axis=2).repeat(2, axis=3), b], axis=1))


def test_cubic_without_the_taps_outside_and_its_own_coefficient():
    x = rand(RNG, (1, 2, 5, 6))
    attrs = {"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1}
    (y,) = run(resize_model(x.shape, (1, 2, 8, 9), attrs, scales=[1, 1, 1.6, 1.5]), {"x": x})
    want = np_resize(x, (8, 9), (float(np.float32(1.6)), 1.5), "cubic", "half_pixel", A=-0.5, exclude_outside=True)
    assert_close(y, want)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_tf_crop_and_resize_samples_the_region_and_fills_outside_it(mode):
    x = rand(RNG, (1, 2, 6, 7))
    roi = np.array([0, 0, 0.2, -0.3, 1, 1, 0.9, 1.4], np.float32)    # columns reach outside the image
    node = helper.make_node("Resize", ["x", "roi", "", "sizes"], ["y"], mode=mode,
                            coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=7.5)
    m = model([node], {"x": (x.shape, "float32")}, {"y": ((1, 2, 4, 9), "float32")},
              {"roi": roi, "sizes": np.array([1, 2, 4, 9], np.int64)}, opset=13)
    (y,) = run(m, {"x": x})
    r32 = [(float(roi[2]), float(roi[6])), (float(roi[3]), float(roi[7]))]
    want = np_resize(x, (4, 9), (4 / 6, 9 / 7), mode, "tf_crop_and_resize", roi=r32, extrapolation=7.5)
    assert (want == 7.5).any() and (want != 7.5).any()
    assert_close(y, want)


def test_what_resize_does_not_take_is_refused_with_a_reason():
    x_shape = (1, 1, 4, 4)
    with pytest.raises(UnsupportedModelError, match="mode='area'"):
        from_onnx(resize_model(x_shape, (1, 1, 8, 8), {"mode": "area"}, scales=[1, 1, 2, 2]))
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"])
    m = model([node], {"x": (x_shape, "float32"), "scales": ((4,), "float32")}, {"y": (None, "float32")})
    with pytest.raises(ShapeError, match="scales .* must be a constant") as e:
        from_onnx(m)
    assert e.value.needs_constant == "scales"
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="cubic")
    m = model([node], {"x": ((1, 1, 4, 4, 4), "float32")}, {"y": (None, "float32")},
              {"scales": np.array([1, 1, 2, 2, 2], np.float32)})
    with pytest.raises(ShapeError, match="cubic interpolation of more than 2 axes"):
        from_onnx(m)
    with pytest.raises(ShapeError, match="antialias"):
        from_onnx(resize_model(x_shape, (1, 1, 2, 2), {"mode": "linear", "antialias": 1}, scales=[1, 1, 0.5, 0.5],
                               opset=18))
