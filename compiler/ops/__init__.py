"""The operator inventory: compute definitions (no schedules) with numpy references.

`get_op("conv2d_nchw", N=1, C=3, ...)` builds an `OpDef`; `INVENTORY` maps each name to its
constructor so tools can list and build operators by name. The computes are composed from the
tensor functions of `compiler.ops.functions`, which a user's own compute can use as well.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from ..errors import ExprError
from .base import OpDef, UnknownOpError, random_inputs
from .conv import conv2d_bias_relu, conv2d_nchw, conv2d_nhwc, depthwise_conv2d_nchw
from .elementwise import add, bias_add, gelu, mul, relu
from .matmul import batch_matmul, dense, dense_gelu, matmul, matmul_int8
from .nn import layer_norm, softmax
from .pool import avg_pool2d, max_pool2d
from .reduction import reduce_max, reduce_min, reduce_sum
from .stride_phases import rewrite_stride_phases  # noqa: F401  (registers the `stride_phases` rewrite)
from .transform import pad, transpose
from .winograd import rewrite_conv2d_nchw  # noqa: F401  (registers the `winograd` rewrite)

INVENTORY: dict[str, Callable[..., OpDef]] = {
    "matmul": matmul,
    "matmul_int8": matmul_int8,
    "batch_matmul": batch_matmul,
    "dense": dense,
    "dense_gelu": dense_gelu,
    "conv2d_nchw": conv2d_nchw,
    "conv2d_nhwc": conv2d_nhwc,
    "depthwise_conv2d_nchw": depthwise_conv2d_nchw,
    "conv2d_bias_relu": conv2d_bias_relu,
    "max_pool2d": max_pool2d,
    "avg_pool2d": avg_pool2d,
    "softmax": softmax,
    "layer_norm": layer_norm,
    "add": add,
    "mul": mul,
    "relu": relu,
    "gelu": gelu,
    "bias_add": bias_add,
    "reduce_sum": reduce_sum,
    "reduce_max": reduce_max,
    "reduce_min": reduce_min,
    "transpose": transpose,
    "pad": pad,
}


def get_op(name: str, /, **params) -> OpDef:
    """Build operator `name`; unknown names raise UnknownOpError, bad parameters ExprError.

    `name` is positional-only so that an operator parameter called `name` is reported as an
    unknown parameter of that operator rather than clashing with this argument."""
    try:
        ctor = INVENTORY[name]
    except (KeyError, TypeError):
        raise UnknownOpError(f"unknown operator {name!r}; known operators: {', '.join(sorted(INVENTORY))}") from None
    sig = inspect.signature(ctor)
    try:
        sig.bind(**params)
    except TypeError as e:
        raise ExprError(f"{name}: {e}; parameters are {name}{sig}") from None
    return ctor(**params)


__all__ = ["INVENTORY", "OpDef", "UnknownOpError", "get_op", "random_inputs", *INVENTORY]

from .default_schedules import build_op, default_schedule  # noqa: E402

__all__ += ["build_op", "default_schedule"]
