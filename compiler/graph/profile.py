"""Per-layer profile of a compiled model: where one run's time goes, kernel by kernel.

A model that runs slower than expected is slow in a few layers; finding them means timing each
fused kernel on its own, with the data it really gets. `profile_model(module, inputs)`:

- runs the model once (checks the inputs, loads every kernel, starts the thread team);
- times each kernel where it stands in a real run: the model is run repeatedly with its call
  sequence compiled a second time with a read of the monotonic clock before each call and after
  the last (GraphModule.run_timed, compiler/call_sequence.py), and each kernel's time is the
  median over those runs of the time between its two clock reads. A kernel is fed by the kernels before
  it and finds the caches as the run leaves them, exactly as in `run()`; timed alone, over and
  over, it would find its weights warm in the cache, and the kernels' sum would fall short of the
  run by whatever a real run pays for reading them (a 4-layer ViT-B's: 8 %);
- times the whole `run()` (the Python around the native call, any input copy, the outputs'
  storage included) in the same samples, under the project's measurement protocol
  (compiler/timing.py: each sample checked for time lost to other processes, the profile marked
  disturbed when too many were), each figure the median over the runs, holding the
  host's exclusive timing lock (compiler/host_lock.py) so no other tunefarm build or timing
  shares the cores. Plain and stamped runs alternate; the time outside kernels is the median over
  the stamped calls of each call's own time less its own span (first kernel's stamp to the
  last's): one call against itself, so a moment of load during its kernels lands inside the span
  and not in the overhead (a plain run against the next stamped one read a batch-8 BERT-base
  5 % outside on a shared host, itself 0 % when quiet), less the cost of reading the clock
  around it (two reads back to back).

Throughput figures are only what a kernel provably does: GFLOPS counts the multiply-adds of the
anchor (a convolution or a matrix product: 2 · output points · reduction extent, the count the
compiler's OpDefs use; zero-padded channels, where a layout has them, count: the kernel computes
them), not estimated epilogue arithmetic; a kernel without an anchor gets GB/s of
the bytes of its arguments (each input read once, the output written once: a lower bound on its
memory traffic, never more than it moves).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .. import host_lock
from ..openmp import get_max_threads
from ..ops.schedule_anchor import CONV_TAGS, GEMM_TAGS
from ..tensor import ComputeOp, topo_order
from ..timing import Timing, TimingOptions, time_samples


class ProfiledModule(Protocol):
    """What a profile reads of a built model (runtime.GraphModule, which imports this module for
    its `profile` method, so this one names the shape instead of importing it back)."""

    graph: Any
    steps: list
    sources: dict
    in_place_nodes: list   # nodes that run no kernel (concat_in_place)

    def run(self, **inputs) -> list: ...

    def run_timed(self, inputs: dict, stamps) -> list: ...   # run(), the clock read around each kernel

# reductions whose multiply-adds are counted as FLOPs: the anchors fusion builds kernels around,
# and a Winograd convolution's matrix products (the multiply-adds it really does, not the
# direct form's it replaces)
ANCHOR_TAGS = frozenset(CONV_TAGS + GEMM_TAGS + ("conv2d_nhwc", "depthwise_conv2d_nchw", "winograd_gemm"))


@dataclass
class KernelProfile:
    """One step of the model: what it computes, which graph nodes it covers, what it costs.

    `nodes` are the graph's node names as compiled: the blocked-layout pass keeps a convolution's
    or pool's ONNX name on its ConvNCHWc / MaxPoolNCHWc node and adds layout copies named after
    the value they convert (`x/to_nchw16c`, `r2/from_nchwc`)."""

    index: int             # position in the step list
    name: str              # the workload's name (fused_conv_add_relu, max_pool2d, ...)
    ops: str               # the fused group's op types, FusedGroup.describe() (Conv+Add+Relu)
    nodes: list            # graph node names, producers first
    key: str               # workload key (what the records are looked up by)
    source: str            # where the schedule came from: 'records' or 'default'
    seconds: float         # median seconds per call
    flops: int | None      # the anchor's FLOPs per call; None for a kernel without one
    bytes: int             # bytes of the kernel's arguments (inputs and output)
    output_shape: tuple = ()
    share: float = 0.0     # of the sum of all kernels' times
    disturbed: bool = False
    timing: Timing | None = field(default=None, repr=False)
    scaling: dict | None = None   # predicted scaling, when asked for (graph.model_scaling.attach_to_profile)

    @property
    def gflops(self) -> float | None:
        return self.flops / self.seconds / 1e9 if self.flops and self.seconds > 0 else None

    @property
    def gb_per_s(self) -> float | None:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else None

    def to_dict(self) -> dict:
        return {"index": self.index, "name": self.name, "ops": self.ops, "nodes": list(self.nodes), "key": self.key,
                "source": self.source, "ms": self.seconds * 1e3, "share": self.share, "flops": self.flops,
                "bytes": self.bytes, "gflops": self.gflops, "gb_per_s": self.gb_per_s,
                "output_shape": list(self.output_shape), "disturbed": self.disturbed,
                **({"scaling": self.scaling} if self.scaling is not None else {})}


@dataclass
class ModelProfile:
    """Every kernel of one run (in run order) and the whole run's time; seconds are medians."""

    model: str
    kernels: list          # KernelProfile, in step order
    run_seconds: float     # median of whole run() calls
    threads: int
    run_timing: Timing | None = field(default=None, repr=False)
    in_place: list = field(default_factory=list)   # nodes computed where their output lives: no kernel
    sequence_seconds: float = 0.0   # median of the native call's span, first kernel to last
    outside_seconds: float | None = None   # median over stamped calls of (the call's time - its span)

    @property
    def kernel_seconds(self) -> float:
        """The kernels' medians, summed: the table's total. Below the sequence's median span on a
        host that disturbs some calls (each kernel's median leaves out its slow calls, the
        span's median takes the typical run's share of them)."""
        return sum(k.seconds for k in self.kernels)

    @property
    def overhead_seconds(self) -> float:
        """Time of a run outside the kernels: the Python around the native call, inputs that must
        be copied, the outputs' storage: the median over the stamped calls of each one's time less
        its own span (two loops one after the other, on a shared host, differed by more than the
        overhead itself). Without them, the run's median less the kernels'."""
        if self.outside_seconds is not None:
            return self.outside_seconds
        return self.run_seconds - (self.sequence_seconds or self.kernel_seconds)

    @property
    def disturbed(self) -> bool:
        return any(k.disturbed for k in self.kernels) or bool(self.run_timing and self.run_timing.disturbed)

    def ranked(self, top: int | None = None) -> list:
        """The kernels slowest first, the first `top` of them (all when None)."""
        ordered = sorted(self.kernels, key=lambda k: k.seconds, reverse=True)
        return ordered if top is None else ordered[:top]

    def to_dict(self) -> dict:
        return {"model": self.model, "threads": self.threads, "run_ms": self.run_seconds * 1e3,
                "kernels_ms": self.kernel_seconds * 1e3, "sequence_ms": self.sequence_seconds * 1e3,
                "overhead_ms": self.overhead_seconds * 1e3,
                "disturbed": self.disturbed, "kernels": [k.to_dict() for k in self.kernels], "in_place": self.in_place}


def anchor_flops(opdef) -> int | None:
    """FLOPs of the convolutions and matrix products in `opdef`'s DAG (2 per multiply-add), or
    None when it has none (a memory-bound kernel: pools, elementwise, layout copies, reductions)."""
    total = 0
    for op in topo_order([opdef.output]):
        if isinstance(op, ComputeOp) and op.reduce_axis and op.tag in ANCHOR_TAGS:
            total += 2 * math.prod(op.shape) * math.prod(ax.extent for ax in op.reduce_axis)
    return total or None


def argument_bytes(opdef) -> int:
    """Bytes of the kernel's arguments: every input once and the output."""
    return sum(math.prod(t.shape) * np.dtype(t.dtype).itemsize for t in opdef.tensors)


def clock_floor_ns(reads: int = 201) -> float:
    """The median time between two perf_counter_ns() calls back to back: what timing a call
    adds to it (tens of ns; a batch-1 MLP's run is 15 us)."""
    clock = time.perf_counter_ns
    gaps = []
    for _ in range(reads):
        t0 = clock()
        gaps.append(clock() - t0)
    return float(np.median(gaps))


def default_options(repeat: int) -> TimingOptions:
    """The protocol's options with at least `repeat` clean samples; shorter sampling than a
    tuning measurement, since a model has tens of kernels to time one after another."""
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    return TimingOptions(min_samples=repeat, max_samples=max(repeat, 200), min_seconds=0.02, max_seconds=0.5)


def profile_model(module: ProfiledModule, inputs: dict, repeat: int = 10, options: TimingOptions | None = None,
                  lock: bool = True) -> ModelProfile:
    """Time each kernel of `module` on `inputs` ({input name: array}) and the whole run (see the
    module docstring). `repeat`: clean samples per timing at least (ignored when `options` is
    given); `lock`: hold the host's exclusive timing lock while timing."""
    opts = options or default_options(repeat)
    module.run(**inputs)   # checks the inputs; every kernel loaded, the thread team started
    held = host_lock.exclusive if lock else contextlib.nullcontext
    stamps = np.zeros(len(module.steps) + 1, np.int64)
    spans: list = []
    walls: list = []   # ns of each plain run
    stamped: list = []   # ns of each stamped call, its span included

    def run_pairs(n):   # a plain run, then a stamped one: both medians of the same moments
        for _ in range(n):
            t0 = time.perf_counter_ns()
            module.run(**inputs)
            t1 = time.perf_counter_ns()
            module.run_timed(inputs, stamps)
            stamped.append(time.perf_counter_ns() - t1)
            walls.append(t1 - t0)
            spans.append(np.diff(stamps))

    with held():
        t0 = time.perf_counter()
        module.run_timed(inputs, stamps)   # compiles the timed sequence; warm-up
        warm = time.perf_counter() - t0
        in_run = time_samples(run_pairs, opts, calls=1 if warm >= opts.min_sample_s else None)
    seconds = np.median(np.array(spans), axis=0) / 1e9
    span_ns = np.array(spans).sum(axis=1)
    sequence_seconds = float(np.median(span_ns)) / 1e9
    # each stamped call against its own span: a moment of load inside the kernels moves both;
    # less what reading the clock twice costs with nothing between (the measurement, not the run)
    outside_seconds = max(0.0, float(np.median(np.array(stamped) - span_ns) - clock_floor_ns()) / 1e9)
    kernels = []
    for i, step in enumerate(module.steps):
        gk = step.group
        kernels.append(KernelProfile(index=i, name=gk.opdef.name, ops=gk.group.describe(),
                                     nodes=[n.name for n in gk.group.nodes], key=gk.key,
                                     source=module.sources.get(gk.key, "default"), seconds=float(seconds[i]),
                                     flops=anchor_flops(gk.opdef), bytes=argument_bytes(gk.opdef),
                                     output_shape=tuple(gk.opdef.output.shape), disturbed=in_run.disturbed,
                                     timing=in_run))
    total = sum(k.seconds for k in kernels)
    for k in kernels:
        k.share = k.seconds / total if total > 0 else 0.0

    return ModelProfile(model=module.graph.name, kernels=kernels, run_seconds=float(np.median(walls)) / 1e9,
                        threads=get_max_threads(), run_timing=in_run, in_place=list(module.in_place_nodes),
                        sequence_seconds=sequence_seconds, outside_seconds=outside_seconds)


__all__ = ["profile_model", "ModelProfile", "KernelProfile", "anchor_flops", "argument_bytes", "default_options",
           "ANCHOR_TAGS"]
