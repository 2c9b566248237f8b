"""DepthToSpace and SpaceToDepth: blocks of channels to blocks of pixels and back.

Super-resolution networks (ESPCN's pixel shuffle) write DepthToSpace, detectors (YOLOv2's
reorg) SpaceToDepth, and a strided ConvTranspose runs as a convolution whose output phases are
interleaved by a DepthToSpace (canonical_ops.conv_transpose_to_conv). Each output element reads
one input element: injective index maps, so they fuse with the nodes around them.

DepthToSpace [N, C·b², H, W] -> [N, C, H·b, W·b]: output (c, y, x) reads channel
(y mod b · b + x mod b) · C + c (mode DCR, the default) or c · b² + y mod b · b + x mod b (CRD)
at (y // b, x // b). SpaceToDepth is its inverse, in either mode.
"""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from .base import Kind, Lazy, register


def _block(node) -> int:
    b = int(node.attrs.get("blocksize", 0))
    if b < 1:
        raise ShapeError(f"{node.op_type} node {node.name!r}: blocksize {b} < 1")
    return b


def _mode(node) -> str:
    mode = node.attrs.get("mode", "DCR")
    return mode.decode() if isinstance(mode, bytes) else str(mode)


def _check(node, opset):
    if _mode(node) not in ("DCR", "CRD"):
        return f"mode={_mode(node)!r}"
    return None


def _d2s_infer(node, ins, opset):
    b, shape = _block(node), ins[0].shape
    if len(shape) != 4 or shape[1] % (b * b):
        raise ShapeError(f"DepthToSpace node {node.name!r}: input {shape} is not N, C·{b}², H, W")
    N, C, H, W = shape
    return [((N, C // (b * b), H * b, W * b), ins[0].dtype)]


def _d2s_lower(node, xs, ins, opset):
    x, b = xs[0], _block(node)
    shape = _d2s_infer(node, ins, opset)[0][0]
    C = shape[1]
    crd = _mode(node) == "CRD"

    def read(o):
        n, c, y, w = o
        phase = (y % b) * b + w % b if b > 1 else 0
        ch = (c * (b * b) + phase if crd else phase * C + c) if b > 1 else c
        return x.read((n, ch, y // b if b > 1 else y, w // b if b > 1 else w))
    return Lazy(shape, x.dtype, read)


def _d2s_fold(node, arrays, opset):
    x, b = arrays[0], _block(node)
    N, C, H, W = x.shape
    if _mode(node) == "CRD":
        t = x.reshape(N, C // (b * b), b, b, H, W).transpose(0, 1, 4, 2, 5, 3)
    else:
        t = x.reshape(N, b, b, C // (b * b), H, W).transpose(0, 3, 4, 1, 5, 2)
    return [np.ascontiguousarray(t.reshape(N, C // (b * b), H * b, W * b))]


def _s2d_infer(node, ins, opset):
    b, shape = _block(node), ins[0].shape
    if len(shape) != 4 or shape[2] % b or shape[3] % b:
        raise ShapeError(f"SpaceToDepth node {node.name!r}: input {shape} is not N, C, H, W with H and W "
                         f"multiples of {b}")
    N, C, H, W = shape
    return [((N, C * b * b, H // b, W // b), ins[0].dtype)]


def _s2d_lower(node, xs, ins, opset):
    x, b = xs[0], _block(node)
    C = x.shape[1]
    shape = _s2d_infer(node, ins, opset)[0][0]

    crd = _mode(node) == "CRD"

    def read(o):
        n, ch, y, w = o
        phase, c = (ch % (b * b), ch // (b * b)) if crd else (ch // C, ch % C)
        return x.read((n, c, y * b + phase // b, w * b + phase % b))
    return Lazy(shape, x.dtype, read)


def _s2d_fold(node, arrays, opset):
    x, b = arrays[0], _block(node)
    N, C, H, W = x.shape
    t = x.reshape(N, C, H // b, b, W // b, b)
    t = t.transpose(0, 1, 3, 5, 2, 4) if _mode(node) == "CRD" else t.transpose(0, 3, 5, 1, 2, 4)
    return [np.ascontiguousarray(t.reshape(N, C * b * b, H // b, W // b))]


register("DepthToSpace", Kind.INJECTIVE, _d2s_infer, _d2s_lower, _d2s_fold, check=_check)
register("SpaceToDepth", Kind.INJECTIVE, _s2d_infer, _s2d_lower, _s2d_fold, check=_check)

__all__: list = []
