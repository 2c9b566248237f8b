"""The ONNX operators the graph compiler takes: one `OpSpec` per op type in `OPS` (see base.py).

Importing this package registers every operator (elementwise.py, logical.py, shape.py,
indexing.py, space_depth.py, nn.py, normalization.py, conv_transpose.py, resize.py, einsum.py),
and the channel-blocked layout's own (layout.py), which only compiler.graph.layout makes.
"""

from __future__ import annotations

from . import (  # noqa: F401 - registration
    conv_transpose,
    einsum,
    elementwise,
    indexing,
    layout,
    logical,
    nn,
    normalization,
    resize,
    shape,
    space_depth,
)
from .base import OPS, Kind, Lazy, OpSpec, materialize
from .layout import INTERNAL_OPS

# what a model may contain: every registered operator but the layout's own
ONNX_OP_TYPES = frozenset(OPS) - frozenset(INTERNAL_OPS)

__all__ = ["OPS", "ONNX_OP_TYPES", "Kind", "Lazy", "OpSpec", "materialize"]
