"""The ONNX operators the graph compiler takes: one `OpSpec` per op type in `OPS` (see base.py).

Importing this package registers every operator (elementwise.py, shape.py, nn.py).
"""

from __future__ import annotations

from . import elementwise, nn, shape  # noqa: F401 - registration
from .base import OPS, Kind, Lazy, OpSpec, materialize

__all__ = ["OPS", "Kind", "Lazy", "OpSpec", "materialize"]
