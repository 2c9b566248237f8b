"""Resize (and the older Upsample): nearest and linear interpolation with constant scales or sizes.

Each resized axis maps an output index o to a source coordinate x by the node's
coordinate_transformation_mode, computed in float64 in the kernel exactly as ONNX's reference
writes it (so a nearest neighbour on a tie rounds the way the reference does):
  half_pixel (o + 0.5) / scale - 0.5, pytorch_half_pixel the same (-0.5 for a one-element
  output), align_corners o · (in - 1) / (out - 1), asymmetric o / scale, half_pixel_symmetric
  half_pixel about the centre, tf_crop_and_resize the region of interest.
- nearest: the source index is floor(x), or floor(x) + 1 by nearest_mode (round_prefer_floor,
  round_prefer_ceil, floor, ceil), clamped into the input. asymmetric with an integer scale
  (PyTorch's nearest upsampling) is integer arithmetic: o // scale.
- linear: the two neighbours floor(x) and floor(x) + 1 (clamped) weighted 1 - r and r,
  r = x - floor(x); over k resized axes, the 2^k corners.
- cubic: the four neighbours floor(x) - 1 .. floor(x) + 2 with Keys' weights (cubic_coeff_a),
  clamped, or with exclude_outside the ones outside dropped and the rest renormalized.
Every output element reads a fixed set of input elements, so Resize is injective: it fuses with
the injective and elementwise nodes around it (a Resize feeding a Concat is one kernel).

tf_crop_and_resize maps the output onto a constant region of interest and gives
extrapolation_value outside the input. Refused with a reason: antialiasing of a downsampled
axis, scales, sizes or a region of interest that are not constants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ... import expr as E
from ..errors import ShapeError
from .base import FLOATS, Kind, Lazy, const_input, register

COORDINATE_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric",
                    "tf_crop_and_resize")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
MAX_CUBIC_AXES = 2   # 16 taps per output element, each weight a cubic in the coordinate: code stays small


@dataclass(frozen=True)
class AxisMap:
    """How one axis is resized: input and output lengths, the scale the coordinate formula
    divides by, and the output length as a float (the reference's scale · in)."""

    size_in: int
    size_out: int
    scale: float
    out_float: float
    crop: tuple | None = None     # tf_crop_and_resize: the region (start, end) as float32 values

    @property
    def identity(self) -> bool:
        if self.crop is not None and not (math.isclose(self.crop[0], 0.0) and math.isclose(self.crop[1], 1.0)):
            return False
        return self.size_in == self.size_out and math.isclose(self.scale, 1.0)


@dataclass(frozen=True)
class ResizeSpec:
    mode: str                 # "nearest", "linear" or "cubic"
    coordinates: str          # one of COORDINATE_MODES
    nearest: str              # one of NEAREST_MODES
    axes: tuple               # AxisMap per axis of the input
    cubic_a: float = -0.75
    exclude_outside: bool = False
    extrapolation: float = 0.0    # tf_crop_and_resize: the value outside the input

    @property
    def shape(self) -> tuple:
        return tuple(a.size_out for a in self.axes)


def _attr(node, key, default):
    v = node.attrs.get(key, default)
    return v.decode() if isinstance(v, bytes) else v


def _check(node, opset):
    mode = _attr(node, "mode", "nearest")
    if mode not in ("nearest", "linear", "bilinear", "cubic", "bicubic"):
        return f"mode={mode!r} (nearest, linear and cubic only)"
    if node.op_type == "Upsample":
        return None
    coords = _attr(node, "coordinate_transformation_mode", "half_pixel")
    if coords not in COORDINATE_MODES:
        return f"coordinate_transformation_mode={coords!r}"
    nearest = _attr(node, "nearest_mode", "round_prefer_floor")
    if mode == "nearest" and nearest not in NEAREST_MODES:
        return f"nearest_mode={nearest!r}"
    policy = _attr(node, "keep_aspect_ratio_policy", "stretch")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        return f"keep_aspect_ratio_policy={policy!r}"
    return None


def resize_spec(node, ins, opset) -> ResizeSpec:
    """The node's interpolation per axis, from its attributes and constant scales or sizes."""
    shape = tuple(ins[0].shape)
    rank = len(shape)
    mode = _attr(node, "mode", "nearest")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    if node.op_type == "Upsample" or opset < 11:
        # Upsample and Resize-10: asymmetric coordinates; nearest floors when upsampling and, as
        # onnxruntime does, takes the ceiling when downsampling
        scales = _upsample_scales(node, ins, opset)
        maps = tuple(AxisMap(s, int(math.floor(s * float(f))), float(f), s * float(f)) for s, f in zip(shape, scales))
        down = any(f < 1 for f in scales)
        return ResizeSpec(mode, "asymmetric", "ceil" if down and mode == "nearest" else "floor", _checked(node, maps))
    axes = _axes(node, rank)
    scales = _optional_const(node, ins, 2, "scales")
    sizes = _optional_const(node, ins, 3, "sizes")
    if scales is not None and sizes is not None:
        raise ShapeError(f"Resize node {node.name!r}: both scales and sizes are given")
    if scales is None and sizes is None:
        raise ShapeError(f"Resize node {node.name!r}: neither scales nor sizes is given")
    full_scale = [1.0] * rank
    if scales is not None:
        if len(scales) != len(axes):
            raise ShapeError(f"Resize node {node.name!r}: {len(scales)} scales for {len(axes)} axes")
        for a, f in zip(axes, scales):
            full_scale[a] = float(f)
        if any(f <= 0 for f in full_scale):
            raise ShapeError(f"Resize node {node.name!r}: scales must be positive, got {list(scales)}")
        maps = tuple(AxisMap(s, int(np.float64(f) * s), f, f * s) for s, f in zip(shape, full_scale))
    else:
        assert sizes is not None
        if len(sizes) != len(axes):
            raise ShapeError(f"Resize node {node.name!r}: {len(sizes)} sizes for {len(axes)} axes")
        out = list(shape)
        for a, n in zip(axes, sizes):
            out[a] = int(n)
        if any(n < 1 for n in out):
            raise ShapeError(f"Resize node {node.name!r}: sizes must be positive, got {list(sizes)}")
        full_scale = [o / s for o, s in zip(out, shape)]
        policy = _attr(node, "keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            scale = pick(full_scale[a] for a in axes)
            full_scale = [scale if d in axes else 1.0 for d in range(rank)]
            out = [int(scale * s + 0.5) if d in axes else s for d, s in enumerate(shape)]
        maps = tuple(AxisMap(s, o, f, f * s) for s, o, f in zip(shape, out, full_scale))
    antialias = int(node.attrs.get("antialias", 0))
    if antialias and mode != "nearest" and any(m.scale < 1 for m in maps):
        raise ShapeError(f"Resize node {node.name!r}: antialias=1 on a downsampled axis is not supported")
    if mode == "cubic" and sum(not m.identity for m in maps) > MAX_CUBIC_AXES:
        raise ShapeError(f"Resize node {node.name!r}: cubic interpolation of more than {MAX_CUBIC_AXES} axes "
                         "(4^k taps per output element) is not supported")
    coords = _attr(node, "coordinate_transformation_mode", "half_pixel")
    if coords == "tf_crop_and_resize":
        maps = _with_crop(node, ins, axes, maps)
    return ResizeSpec(mode, coords, _attr(node, "nearest_mode", "round_prefer_floor"), _checked(node, maps),
                      float(node.attrs.get("cubic_coeff_a", -0.75)), bool(int(node.attrs.get("exclude_outside", 0))),
                      float(node.attrs.get("extrapolation_value", 0.0)))


def _with_crop(node, ins, axes, maps):
    """The maps with tf_crop_and_resize's region per axis: roi holds the starts of the resized
    axes, then their ends (fractions of the input), (0, 1) for the others."""
    roi = const_input(node, ins, 1, "roi") if len(ins) > 1 and ins[1] is not None else None
    if roi is None or roi.size != 2 * len(axes):
        raise ShapeError(f"Resize node {node.name!r}: tf_crop_and_resize needs a roi of {2 * len(axes)} values")
    roi = np.asarray(roi, np.float32).reshape(-1)
    crops = [(np.float32(0.0), np.float32(1.0))] * len(maps)
    for i, a in enumerate(axes):
        crops[a] = (roi[i], roi[len(axes) + i])
    return tuple(replace(m, crop=c) for m, c in zip(maps, crops))


def _checked(node, maps):
    if any(m.size_out < 1 for m in maps):
        raise ShapeError(f"{node.op_type} node {node.name!r}: the output would be empty "
                         f"({tuple(m.size_out for m in maps)})")
    return maps


def _axes(node, rank):
    axes = node.attrs.get("axes")
    if axes is None:
        return list(range(rank))
    out = [int(a) % rank if -rank <= int(a) < rank else None for a in axes]
    if None in out or len(set(out)) != len(out):
        raise ShapeError(f"Resize node {node.name!r}: axes {list(axes)} are not distinct axes of rank {rank}")
    return out


def _optional_const(node, ins, i, what):
    """Input i as a float array when the node gives a non-empty one, else None."""
    if len(ins) <= i or ins[i] is None or ins[i].size == 0:
        return None
    return [float(v) for v in np.asarray(const_input(node, ins, i, what)).reshape(-1)]


def _upsample_scales(node, ins, opset):
    if node.op_type == "Upsample" and opset < 9:
        scales = node.attrs.get("scales")
        if scales is None:
            raise ShapeError(f"Upsample node {node.name!r}: no scales attribute")
    else:
        scales = const_input(node, ins, 1, "scales")
        if scales is None:
            raise ShapeError(f"{node.op_type} node {node.name!r}: no scales input")
    scales = [float(s) for s in np.asarray(scales).reshape(-1)]
    if len(scales) != len(ins[0].shape) or any(s <= 0 for s in scales):
        raise ShapeError(f"{node.op_type} node {node.name!r}: scales {scales} do not fit an input of rank "
                         f"{len(ins[0].shape)}")
    return scales


def _infer(node, ins, opset):
    x = ins[0]
    spec = resize_spec(node, ins, opset)
    if spec.mode != "nearest" and x.dtype not in FLOATS:
        raise ShapeError(f"{node.op_type} node {node.name!r}: {spec.mode} interpolation of {x.dtype} data")
    return [(spec.shape, x.dtype)]


# ----------------------------------------------------------------------------- coordinates

def source_coordinate(spec: ResizeSpec, a: AxisMap, o):
    """x for output index o: an Expr of float64 (o an index Expr) or a float64 array (o an
    array), by the same operations in the same order as ONNX's reference."""
    def fl(v):
        return v.astype("float64") if isinstance(v, E.Expr) else np.asarray(v, np.float64)
    of = fl(o)
    mode = spec.coordinates
    if mode == "tf_crop_and_resize":
        assert a.crop is not None
        start, end = a.crop
        offset = float(start * (a.size_in - 1))           # float32 products, as the reference's roi
        if a.out_float == 1:
            return of * 0.0 + float((end - start) * (a.size_in - 1) / 2) + offset
        return of * float(end - start) * float(a.size_in - 1) / (a.out_float - 1) + offset
    if mode == "align_corners":
        if a.out_float == 1:
            return of * 0.0
        return of * float(a.size_in - 1) / (a.out_float - 1)
    if mode == "asymmetric":
        return of / a.scale
    if mode == "pytorch_half_pixel" and a.out_float == 1:
        return of * 0.0 - 0.5
    if mode == "half_pixel_symmetric":
        offset = a.size_in / 2 * (1 - a.size_out / a.out_float)
        return offset + (of + 0.5) / a.scale - 0.5
    return (of + 0.5) / a.scale - 0.5


def _nearest_index(spec: ResizeSpec, a: AxisMap, o):
    """The source index of output index `o` (an Expr), clamped into the axis."""
    if a.identity:
        return o
    k = a.scale
    if spec.coordinates == "asymmetric" and k >= 1 and k == int(k):   # integer arithmetic, exact
        k = int(k)
        rem = o % k
        bump = {"floor": None, "ceil": rem > 0, "round_prefer_floor": rem * 2 > k,
                "round_prefer_ceil": rem * 2 >= k}[spec.nearest]
        i = o // k
        if bump is not None:
            i = E.if_then_else(bump, i + 1, i)
    else:
        x = source_coordinate(spec, a, o)
        fx = E.floor(x)
        r = x - fx
        bump = {"floor": None, "ceil": r > 0.0, "round_prefer_floor": r > 0.5, "round_prefer_ceil": r >= 0.5}[spec.nearest]
        i = fx.astype("int64")
        if bump is not None:
            i = E.if_then_else(bump, i + 1, i)
    return E.minimum(E.maximum(i, 0), a.size_in - 1)


def _linear_taps(spec: ResizeSpec, a: AxisMap, o, dtype):
    """([(index, weight)], None) of output index `o` along a linearly resized axis."""
    x = source_coordinate(spec, a, o)
    fx = E.floor(x)
    r = x - fx
    i0 = fx.astype("int64")
    last = a.size_in - 1
    return [(E.minimum(E.maximum(i0, 0), last), (1.0 - r).astype(dtype)),
            (E.minimum(E.maximum(i0 + 1, 0), last), r.astype(dtype))], None


def cubic_coefficients(r, A: float):
    """The four weights of the taps floor(x) - 1 .. floor(x) + 2 at r = x - floor(x) (Keys'
    cubic convolution with parameter A; expressions or arrays alike), as ONNX writes them."""
    s = 1.0 - r
    return [((A * (r + 1) - 5 * A) * (r + 1) + 8 * A) * (r + 1) - 4 * A,
            ((A + 2) * r - (A + 3)) * r * r + 1,
            ((A + 2) * s - (A + 3)) * s * s + 1,
            ((A * (s + 1) - 5 * A) * (s + 1) + 8 * A) * (s + 1) - 4 * A]


def _cubic_taps(spec: ResizeSpec, a: AxisMap, o, dtype):
    """([(index, weight)], normalizer) of output index `o` along a cubically resized axis: four
    taps clamped into the axis (the edge repeated), normalizer None; or with exclude_outside the
    taps outside weighted 0 and the normalizer their weights' sum, which the caller divides the
    blend by once (dividing each weight by it would repeat the sum in every corner's weight)."""
    x = source_coordinate(spec, a, o)
    fx = E.floor(x)
    i0 = fx.astype("int64")
    weights = cubic_coefficients(x - fx, spec.cubic_a)
    idx = [i0 + (t - 1) for t in range(4)]
    last = a.size_in - 1
    total = None
    if spec.exclude_outside:
        weights = [E.if_then_else((i >= 0) & (i <= last), w, 0.0) for i, w in zip(idx, weights)]
        total = (weights[0] + weights[1] + weights[2] + weights[3]).astype(dtype)
    return [(E.minimum(E.maximum(i, 0), last), w.astype(dtype)) for i, w in zip(idx, weights)], total


def _inside(spec: ResizeSpec, idx):
    """tf_crop_and_resize: the condition that every cropped axis' coordinate lies in the input
    (None when there is no such axis)."""
    cond = None
    for a, o in zip(spec.axes, idx):
        if a.crop is None or a.identity:
            continue
        x = source_coordinate(spec, a, o)
        c = (x >= 0.0) & (x <= float(a.size_in - 1))
        cond = c if cond is None else cond & c
    return cond


def _lower(node, xs, ins, opset):
    x = xs[0]
    spec = resize_spec(node, ins, opset)
    lazy = _interpolated(spec, x)
    if spec.coordinates != "tf_crop_and_resize":
        return lazy
    fill = E.const(spec.extrapolation, x.dtype)

    def read(idx):
        cond = _inside(spec, idx)
        return lazy.read(idx) if cond is None else E.if_then_else(cond, lazy.read(idx), fill)
    return Lazy(spec.shape, x.dtype, read)


def _interpolated(spec: ResizeSpec, x: Lazy) -> Lazy:
    if spec.mode == "nearest":
        return Lazy(spec.shape, x.dtype,
                    lambda idx: x.read(tuple(_nearest_index(spec, a, o) for a, o in zip(spec.axes, idx))))
    taps_of = _linear_taps if spec.mode == "linear" else _cubic_taps

    def read(idx):
        corners: list = [((), None)]
        norm = None
        for a, o in zip(spec.axes, idx):
            taps, total = ([(o, None)], None) if a.identity else taps_of(spec, a, o, x.dtype)
            corners = [(pos + (i,), w if wc is None else (wc if w is None else wc * w))
                       for pos, wc in corners for i, w in taps]
            if total is not None:
                norm = total if norm is None else norm * total
        blend = None
        for pos, w in corners:
            v = x.read(pos) if w is None else x.read(pos) * w
            blend = v if blend is None else blend + v
        return blend if norm is None else blend / norm
    return Lazy(spec.shape, x.dtype, read)


# ----------------------------------------------------------------------------- compile time

def _fold(node, arrays, opset):
    from ..ir import Value
    values = [None if a is None else Value("c", tuple(a.shape), str(a.dtype), a) for a in arrays]
    spec = resize_spec(node, values, opset)
    y = arrays[0].astype(np.float64)
    for d, a in enumerate(spec.axes):
        if a.identity:
            continue
        o = np.arange(a.size_out)
        x = source_coordinate(spec, a, o)
        fx = np.floor(x)
        r = x - fx
        if spec.mode == "nearest":
            bump = {"floor": np.zeros_like(r, bool), "ceil": r > 0, "round_prefer_floor": r > 0.5,
                    "round_prefer_ceil": r >= 0.5}[spec.nearest]
            y = np.take(y, np.clip(fx.astype(np.int64) + bump, 0, a.size_in - 1), axis=d)
        else:
            offsets: tuple[int, ...] = (0, 1) if spec.mode == "linear" else (-1, 0, 1, 2)
            weights = [1 - r, r] if spec.mode == "linear" else cubic_coefficients(r, spec.cubic_a)
            taps = [fx.astype(np.int64) + k for k in offsets]
            if spec.exclude_outside:
                weights = [np.where((i >= 0) & (i < a.size_in), w, 0.0) for i, w in zip(taps, weights)]
                total = sum(weights)
                weights = [w / total for w in weights]
            shape = (-1,) + (1,) * (y.ndim - d - 1)
            y = sum(np.take(y, np.clip(i, 0, a.size_in - 1), axis=d) * w.reshape(shape) for i, w in zip(taps, weights))
        if a.crop is not None:
            outside = ((x < 0) | (x > a.size_in - 1)).reshape((-1,) + (1,) * (y.ndim - d - 1))
            y = np.where(outside, spec.extrapolation, y)
    return [y.astype(arrays[0].dtype)]


register("Resize", Kind.INJECTIVE, _infer, _lower, _fold, check=_check, min_opset=10)
register("Upsample", Kind.INJECTIVE, _infer, _lower, _fold, check=_check, min_opset=7)

__all__ = ["ResizeSpec", "AxisMap", "resize_spec", "source_coordinate", "cubic_coefficients"]
