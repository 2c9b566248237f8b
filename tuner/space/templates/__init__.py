"""Built-in templates: importing this package registers them with `tuner.space.template`, each
with the inventory operators it serves (`@template(name, ops=...)`); tuner/space/__init__.py
imports it, the template registry never does.

- "gemm": matmul, matmul_int8, dense, batch_matmul (gemm.py)
- "conv2d_nchw", "depthwise_conv2d_nchw", "conv2d_nhwc" (conv.py)
"""

from __future__ import annotations

from . import conv, gemm  # noqa: F401 - registration
