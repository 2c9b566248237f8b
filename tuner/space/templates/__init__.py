"""Built-in templates: importing this package registers them with `tuner.space.template`.

- "gemm": matmul, matmul_int8, dense, batch_matmul (gemm.py)
- "conv2d_nchw", "depthwise_conv2d_nchw", "conv2d_nhwc" (conv.py)
"""

from __future__ import annotations

from . import conv, gemm  # noqa: F401 - registration

# inventory operator -> its template
TEMPLATE_FOR_OP = {
    "matmul": "gemm",
    "matmul_int8": "gemm",
    "dense": "gemm",
    "batch_matmul": "gemm",
    "conv2d_nchw": "conv2d_nchw",
    "depthwise_conv2d_nchw": "depthwise_conv2d_nchw",
    "conv2d_nhwc": "conv2d_nhwc",
}

__all__ = ["TEMPLATE_FOR_OP"]
