"""A profiling build of a kernel: its parallel regions read the CPU's cycle counter.

Why instrument instead of timing variants of the kernel (one with a region removed, ...): a
variant is different code (a missing packing region changes what the compute region reads), and
timing whole variants says nothing about how evenly a region's iterations cost, which decides
how its chunks balance. Here the real kernel runs, with two reads of the cycle counter
(`llvm.readcyclecounter`, rdtsc on x86: tens of cycles, invariant rate) added

- around each region's GOMP_parallel call: its span (fork, chunks, join) and how often it forks
  (a team of several loops, compiler/parallel_teams.py, counts its span on its first loop and
  an entry on each);
- around each iteration of its chunk loop: each iteration's cost, summed over the region's
  entries into one slot per iteration (so a region inside a serial loop still gives its
  per-iteration profile).

- around the kernel's whole body: the call's time, so the serial part (the call outside its
  regions) comes from the same calls as the regions' spans. Taken from a separate timing of the
  plain kernel instead, it took whatever the host's speed did between the two timings: on a
  drifting host a one-region 1x1 convolution showed a "serial" quarter of its time.

The counters live in a numpy int64 array whose address is compiled into the code (a profiling
kernel is never serialized or shared): [span, entries] per region, then one slot per iteration
of each region, then the call's. The reads add a fixed cost per iteration (measured by compiler.parallel_probe
and subtracted by compiler.scaling) and sit outside the iteration's own loops, so the body is
compiled as in the real kernel.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from .codegen_llvm import I64, PTR, ModuleBuilder
from .loop_ir import LoweredFunc
from .parallel_regions import parallel_regions
from .runtime import ArgSpec, Kernel, compile_module
from .target import resolve_target


class RegionClock:
    """Counter slots of one kernel's regions, and the code that fills them (called by codegen)."""

    def __init__(self, regions: list):
        self.regions = regions
        self.slot_of: dict = {}
        offset = 2 * len(regions)
        for r in regions:
            self.slot_of[id(r.loop)] = (r.index, offset)
            offset += r.extent
        self.call_slot = offset   # the whole call's ticks, in the same call as the regions'
        self.counters = np.zeros(offset + 1, np.int64)

    # ---------------------------------------------------------------- read back
    def reset(self) -> None:
        self.counters[:] = 0

    def span_ticks(self, region: int) -> int:
        return int(self.counters[2 * region])

    def entries(self, region: int) -> int:
        return int(self.counters[2 * region + 1])

    def call_ticks(self) -> int:
        return int(self.counters[self.call_slot])

    def iteration_ticks(self, region: int) -> np.ndarray:
        r = self.regions[region]
        offset = self.slot_of[id(r.loop)][1]
        return self.counters[offset:offset + r.extent].copy()

    # ---------------------------------------------------------------- code generation hooks
    def _slot(self, em, index):
        base = ir.Constant(I64, self.counters.ctypes.data)
        return em.builder.inttoptr(em.builder.add(base, em.builder.mul(index, ir.Constant(I64, 8))), PTR)

    def _add(self, em, index, amount) -> None:
        b = em.builder
        ptr = self._slot(em, index)
        b.store(b.add(b.load(ptr, typ=I64), amount), ptr)

    @staticmethod
    def start(em, loop):
        return em.builder.call(em.mb.declare("llvm.readcyclecounter", I64, []), [])

    def end_region(self, em, loop, started) -> None:
        region, _ = self.slot_of[id(loop)]
        now = self.start(em, loop)
        self._add(em, ir.Constant(I64, 2 * region), em.builder.sub(now, started))
        self._add(em, ir.Constant(I64, 2 * region + 1), ir.Constant(I64, 1))

    def end_call(self, em, started) -> None:
        """The kernel's body ran (from `started`): its ticks into the call's slot."""
        now = self.start(em, None)
        self._add(em, ir.Constant(I64, self.call_slot), em.builder.sub(now, started))

    def count_entry(self, em, loop) -> None:
        """An entry into a team's later loop (compiler/parallel_teams.py): the team's span is
        counted on its first loop, the entry on each."""
        region, _ = self.slot_of[id(loop)]
        self._add(em, ir.Constant(I64, 2 * region + 1), ir.Constant(I64, 1))

    def end_iteration(self, em, loop, started, iteration) -> None:
        _, offset = self.slot_of[id(loop)]
        now = self.start(em, loop)
        self._add(em, em.builder.add(ir.Constant(I64, offset), iteration), em.builder.sub(now, started))


class ClockedKernel:
    """A kernel built with a RegionClock: call it as the real one, then read `clock`."""

    def __init__(self, kernel: Kernel, clock: RegionClock, func: LoweredFunc):
        self.kernel, self.clock, self.func = kernel, clock, func

    @property
    def regions(self) -> list:
        return self.clock.regions


def build_clocked(schedule, args, target=None, name: str = "clocked") -> ClockedKernel:
    """The profiling build of `schedule` over tensors `args` (as runtime.build takes them)."""
    from .lower import lower

    target = resolve_target(target)
    func = lower(schedule, args, name)
    clock = RegionClock(parallel_regions(func))
    mb = ModuleBuilder(func, target, True, region_clock=clock)
    obj = compile_module(str(mb.build()), target)
    outputs = set(schedule.outputs)
    specs = [ArgSpec(b.name, b.shape, b.dtype, t in outputs) for b, t in zip(func.args, args)]
    return ClockedKernel(Kernel(name, obj, specs, target, str(func), mb.checks), clock, func)


__all__ = ["RegionClock", "ClockedKernel", "build_clocked"]
