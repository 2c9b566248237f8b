"""A compiled model's kernels through the scaling model: which ones would not scale to many threads.

Each unique workload of a GraphModule is measured once on one thread (compiler/kernel_scaling.py:
the model's own kernel and a profiling build of the same schedule, on the model's own argument
buffers after a run has filled them), then predicted at N threads (compiler/scaling.py). The
schedule is the one the module was built with: the records' where its source says so, else the
default. A model's speed-up is its kernels' one-thread times summed over their predicted times
summed (each kernel weighs by its time; a kernel used twice counts twice).

Kernels are timed alone, not where they stand in a run: the scaling model needs each region's
per-iteration cost, which a run's clock reads between kernels cannot give.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import dispatch
from ..kernel_scaling import measure_kernel
from ..ops import default_schedule
from ..parallel_probe import ParallelCosts, measure_parallel_costs
from ..scaling import THREADS, KernelTiming, ManyCoreHost, Prediction, combined_speedup, predict


@dataclass
class KernelScaling:
    """One step's kernel: its one-thread timing and predictions by thread count."""

    index: int
    name: str
    key: str
    timing: KernelTiming                # shared by the steps of one workload
    predictions: dict = field(default_factory=dict)   # {threads: Prediction}

    def efficiency(self, threads: int) -> float:
        return self.predictions[threads].efficiency

    def chunks(self, threads: int) -> list:
        """Chunks per entry of each region on `threads` threads."""
        return [len(rt.region.chunks(threads)) for rt in self.timing.regions]

    def summary(self, threads: int = 16) -> dict:
        """What a profile shows of it: regions, chunks and efficiency at `threads`, the limit."""
        p: Prediction = self.predictions[threads]
        return {"regions": len(self.timing.regions), "chunks": self.chunks(threads),
                "team_caps": [rt.region.team_cap for rt in self.timing.regions],
                "t1_ms": self.timing.seconds * 1e3, "serial_ms": self.timing.serial_seconds * 1e3,
                "threads": threads, "predicted_speedup": p.speedup, "predicted_efficiency": p.efficiency,
                "limit": p.limit()}


@dataclass
class ModelScaling:
    kernels: list           # KernelScaling, in step order
    costs: ParallelCosts
    host: ManyCoreHost

    def speedup(self, threads: int) -> float:
        return combined_speedup([k.predictions[threads] for k in self.kernels])

    def efficiency(self, threads: int) -> float:
        return self.speedup(threads) / threads

    def worst(self, threads: int = 16, top: int = 3) -> list:
        """The kernels that lose most time against the ideal on `threads` threads."""
        def lost(k):
            p = k.predictions[threads]
            return p.seconds - p.t1 / threads
        return sorted(self.kernels, key=lost, reverse=True)[:top]


def _schedule(module, gk, records):
    target = module.target
    if module.sources.get(gk.key) == "records":
        provider = records if records is not None else dispatch.current()
        schedule = provider.lookup(gk.opdef, target) if provider is not None else None
        if schedule is not None:
            return schedule
    return default_schedule(gk.opdef, target)


def measure_model_scaling(module, inputs: dict, records=None, costs: ParallelCosts | None = None,
                          host: ManyCoreHost | None = None, threads=THREADS) -> ModelScaling:
    """Measure every unique workload of `module` on one thread and predict it at `threads`."""
    costs = costs or measure_parallel_costs(module.target)
    host = host or ManyCoreHost()
    module.run(**inputs)     # the buffers hold a run's data ...
    module.load_inputs(inputs)   # ... and the inputs, which a run reads where the caller keeps them
    timings: dict = {}
    kernels = []
    for i, step in enumerate(module.steps):
        gk = step.group
        kt = timings.get(gk.key)
        if kt is None:
            kt = timings[gk.key] = measure_kernel(_schedule(module, gk, records), gk.opdef.tensors, step.arrays,
                                                  costs, module.target, name=gk.opdef.name, plain=step.kernel)
        ks = KernelScaling(i, gk.opdef.name, gk.key, kt)
        ks.predictions = {n: predict(kt, n, costs.fork_join, host, costs.barrier) for n in threads}
        kernels.append(ks)
    return ModelScaling(kernels, costs, host)


def attach_to_profile(profile, scaling: ModelScaling, threads: int = 16) -> None:
    """Put each kernel's scaling summary on the profile's KernelProfile of the same step."""
    for kp, ks in zip(profile.kernels, scaling.kernels):
        kp.scaling = ks.summary(threads)


__all__ = ["KernelScaling", "ModelScaling", "measure_model_scaling", "attach_to_profile"]
