"""A good schedule for every inventory operator without tuning, and `build_op` to compile it.

`default_schedule(opdef)` dispatches on the operator name to the family modules
(schedule_conv, schedule_pool, schedule_nn, schedule_elementwise, schedule_gemm, schedule_fused);
a compute DAG that is not an inventory operator (a model's fused group) is scheduled by its
structure (schedule_anchor: its convolution or matrix product with the epilogue fused).
They are the baseline a tuned schedule must beat, and what `build_op` uses when nothing better is
known.
"""

from __future__ import annotations

from .. import dispatch
from ..runtime import Kernel, build
from ..schedule import Schedule
from ..target import resolve_target
from . import schedule_conv, schedule_elementwise, schedule_fused, schedule_nn, schedule_pool
from .schedule_anchor import schedule_by_structure
from .schedule_conv_plane import schedule_conv_nchw_default
from .schedule_gemm import schedule_gemm

GEMM_OPS = ("matmul", "matmul_int8", "dense", "batch_matmul")

_FAMILY = {
    "conv2d_nchw": schedule_conv_nchw_default,
    "depthwise_conv2d_nchw": schedule_conv.schedule_conv_nchw,
    "conv2d_nhwc": schedule_conv.schedule_conv_nhwc,
    "conv2d_bias_relu": schedule_fused.schedule_conv_bias_relu,
    "dense_gelu": schedule_fused.schedule_dense_gelu,
    "max_pool2d": schedule_pool.schedule_pool,
    "avg_pool2d": schedule_pool.schedule_pool,
    "softmax": schedule_nn.schedule_norm,
    "layer_norm": schedule_nn.schedule_norm,
    "add": schedule_elementwise.schedule_injective,
    "mul": schedule_elementwise.schedule_injective,
    "relu": schedule_elementwise.schedule_injective,
    "gelu": schedule_elementwise.schedule_injective,
    "bias_add": schedule_elementwise.schedule_injective,
    "pad": schedule_elementwise.schedule_pad,
    "transpose": schedule_elementwise.schedule_transpose,
    "reduce_sum": schedule_elementwise.schedule_reduce,
    "reduce_max": schedule_elementwise.schedule_reduce,
    "reduce_min": schedule_elementwise.schedule_reduce,
}


def default_schedule(opdef, target=None) -> Schedule:
    """The default schedule of `opdef` for `target` (the host by default)."""
    target = resolve_target(target)
    if opdef.name in GEMM_OPS:
        return schedule_gemm(opdef, target)
    fn = _FAMILY.get(opdef.name)
    if fn is None:  # a compute DAG (a model's fused group, a user's compute): by its structure
        return schedule_by_structure(opdef, target)
    return fn(opdef, target)


def build_op(opdef, target=None, name=None, records=None) -> Kernel:
    """Compile `opdef`; the kernel takes opdef.tensors in order.

    The schedule comes from `records` (a schedule provider such as the tuner's
    ApplyHistoryBest) or else the innermost active provider (`with provider:`); when neither
    knows the workload on this target, the default schedule is used and a warning says so once.
    """
    target = resolve_target(target)
    provider = records if records is not None else dispatch.current()
    schedule = provider.lookup(opdef, target) if provider is not None else None
    if schedule is None:
        if provider is not None:
            dispatch.warn_default_once(opdef, target, "no tuned schedule in the records for this target")
        schedule = default_schedule(opdef, target)
    return build(schedule, opdef.tensors, target, name=name or "main")


__all__ = ["default_schedule", "build_op"]
