"""Compile a graph into a runnable model: fused groups → kernels, a memory plan, a step list.

`build_model(graph, target, records)` fuses the graph, lowers every group to its workload, builds
each unique workload once (the schedule from `records`, a schedule provider such as the tuner's
ApplyHistoryBest, when it holds one for the workload on this target, else the default schedule;
default-schedule kernels are also cached per process, so a repeated model or layer compiles
once), plans the buffers, and checks every kernel call's arguments once, at build time. A run
is then one native call that runs every step with its pointers fixed at build time
(compiler/call_sequence.py); every operator runs as generated code, numpy only allocates.

The inputs and outputs are the sequence's movable ranges: a run reads each contiguous input array
where the caller holds it and writes each output into a fresh array that it returns, so no
input is copied in and no output copied out (a decode step's KV cache is megabytes each way).
An input the kernels cannot read in place (not contiguous, or stored inside another value, as a
Concat computed in place) is copied into the module's own buffer, as `load_inputs` does for the
profile, which runs the sequence on those buffers.
"""

from __future__ import annotations

import ctypes
import re
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import dispatch
from ..buffers import aligned_empty
from ..call_sequence import CallSequence
from ..errors import KernelRuntimeError
from ..ops import OpDef, default_schedule
from ..runtime import Kernel, lower_kernel
from ..target import resolve_target
from .concat_in_place import place_concats
from .errors import InputError
from .fuse import fuse
from .index_errors import node_error
from .ir import Graph
from .layout import propagate_blocked_layout
from .native_run import BAD_ARGUMENTS, FAILED, RENEW, native_run
from .output_arenas import OutputArenas
from .passes import prepack_conv_weights, prepack_matmul_weights
from .plan import MemoryPlan, plan_memory
from .profile import ModelProfile, profile_model
from .workloads import GroupKernel, arg_array, lower_group

_cache_lock = threading.Lock()
_default_kernels: dict = {}   # (workload key, target string) -> Kernel of the default schedule


@dataclass
class Step:
    kernel: Kernel
    group: GroupKernel
    arrays: list      # the kernel's argument arrays (views of the plan's blocks, constants)
    ptrs: list


@dataclass
class ModelTask:
    """One unique fused workload of a model: its OpDef, how many groups use it, a description."""

    opdef: OpDef
    weight: int
    groups: list

    @property
    def key(self) -> str:
        return self.opdef.workload_key()


def for_target(graph: Graph, target) -> Graph:
    """The graph as it is compiled for `target`: convolutions and the elementwise nodes between
    them in the channel-blocked layout (layout.propagate_blocked_layout), the other constant
    convolution and MatMul weights pre-packed in the layouts of the target's default schedules
    (passes.prepack_conv_weights, passes.prepack_matmul_weights)."""
    target = resolve_target(target)
    graph = propagate_blocked_layout(graph, target)
    return prepack_matmul_weights(prepack_conv_weights(graph, target), target)


def extract_tasks(graph: Graph, target=None) -> list:
    """The model's unique workloads (by workload key) with their occurrence counts, in order of
    first occurrence: what a model's tuning tunes, for `target` (the host by default; weight
    layouts, and so some keys, depend on it)."""
    graph = for_target(graph, target)
    tasks: dict = {}
    for gk in place_concats(graph, [lower_group(graph, g) for g in fuse(graph)])[0]:
        key = gk.key
        if key in tasks:
            tasks[key].weight += 1
            tasks[key].groups.append(gk)
        else:
            tasks[key] = ModelTask(gk.opdef, 1, [gk])
    return list(tasks.values())


def kernel_name(opdef) -> str:
    """The symbol of a workload's kernel: its name and key, unique per workload, so a model's
    kernels can be linked into one library (compiler.graph.export_model) as they are."""
    return f"tf_{re.sub(r'[^0-9A-Za-z_]', '_', opdef.name)}_{opdef.workload_key()[:12]}"


def _schedule_for(opdef, target, records) -> tuple:
    """(schedule, 'records') when `records` (as in build_op: the provider given, else the
    innermost active one) holds one for the workload, else (None, 'default')."""
    provider = records if records is not None else dispatch.current()
    schedule = provider.lookup(opdef, target) if provider is not None else None
    if schedule is not None:
        return schedule, "records"
    if provider is not None:
        dispatch.warn_default_once(opdef, target, "no tuned schedule in the records for this target")
    return None, "default"


def _build_kernels(kernels: list, target, records) -> dict:
    """{workload key: (kernel, where its schedule came from: 'records' or 'default')} for the
    model's kernels. This thread lowers each workload to LLVM IR (Python) while one more thread
    compiles the ones already lowered (LLVM, which runs without the GIL): a model builds in
    about the time its Python half takes instead of the sum (Inception v1: 87 workloads)."""
    built: dict = {}
    compiling: dict = {}   # key -> (future kernel, source, default-cache key or None)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tunefarm-llvm") as llvm_thread:
        for gk in kernels:
            opdef = gk.opdef
            key = opdef.workload_key()
            if key in built or key in compiling:
                continue
            schedule, source = _schedule_for(opdef, target, records)
            cache_key = None
            if schedule is None:
                cache_key = (key, str(target))
                with _cache_lock:
                    kernel = _default_kernels.get(cache_key)
                if kernel is not None:
                    built[key] = (kernel, source)
                    continue
                schedule = default_schedule(opdef, target)
            lowered = lower_kernel(schedule, opdef.tensors, target, name=kernel_name(opdef))
            compiling[key] = (llvm_thread.submit(lowered.compile), source, cache_key)
        for key, (future, source, cache_key) in compiling.items():
            kernel = future.result()
            if cache_key is not None:
                with _cache_lock:
                    kernel = _default_kernels.setdefault(cache_key, kernel)
            built[key] = (kernel, source)
    return built


def build_model(graph: Graph, target=None, records=None) -> "GraphModule":
    """Compile `graph` for `target` (the host by default). `records`: a schedule provider
    (`lookup(opdef, target) -> Schedule | None`, e.g. tuner.apply_best.ApplyHistoryBest), else the
    innermost active one (`with provider:`), as build_op does; workloads it has no schedule for
    get the default schedule (with a warning once per workload)."""
    target = resolve_target(target)
    t0 = time.perf_counter()
    graph = for_target(graph, target)
    groups = [lower_group(graph, g) for g in fuse(graph)]
    kernels, placements = place_concats(graph, groups)
    built = _build_kernels(kernels, target, records)
    steps_io = [(gk.output, [a for a in gk.args if isinstance(a, str) and graph.values[a].const is None])
                for gk in kernels]
    plan = plan_memory(graph, steps_io, placements)
    module = GraphModule(graph, target, kernels, built, plan)
    kept = {id(gk) for gk in kernels}
    module.in_place_nodes = [n.name for gk in groups if id(gk) not in kept for n in gk.group.nodes]
    module.build_seconds = time.perf_counter() - t0
    return module


def check_input_arrays(names: list, inputs: dict) -> None:
    """InputError unless `inputs` names exactly the model's inputs `names`, each a numpy array."""
    missing = [n for n in names if n not in inputs]
    extra = sorted(set(inputs) - set(names))
    if missing or extra:
        raise InputError(f"the model takes inputs {names}; " + (f"missing {missing}" if missing else "")
                         + ("; " if missing and extra else "") + (f"unknown {extra}" if extra else ""))
    for name in names:
        if not isinstance(inputs[name], np.ndarray):
            raise InputError(f"input {name!r} must be a numpy array, got {type(inputs[name]).__name__}")


class GraphModule:
    """A compiled model: `run(**inputs)` returns the outputs as numpy arrays, in graph order.

    A module owns one set of buffers for its intermediate values, so it runs one call at a
    time: threads that run a model at once each build their own module (default-schedule
    kernels are built once per process and shared)."""

    def __init__(self, graph: Graph, target, kernels: list, built: dict, plan: MemoryPlan):
        self.graph = graph
        self.target = target
        self.plan = plan
        self.build_seconds = 0.0
        self.in_place_nodes: list = []   # nodes that run no kernel: Concats computed in place
        self.sources = {k: src for k, (_, src) in built.items()}
        self._blocks = [aligned_empty(max(n, 1), np.uint8) for n in plan.block_bytes]
        self._consts: dict = {}
        self.steps = []
        for gk in kernels:
            kernel = built[gk.key][0]
            arrays = [self._array(a, t.shape, t.dtype) for a, t in zip(gk.args, gk.opdef.inputs)]
            arrays.append(self._view(gk.output, gk.opdef.output.shape, gk.opdef.output.dtype))
            ptrs = kernel.check_args(arrays)   # shapes, dtypes and overlaps, once
            self.steps.append(Step(kernel, gk, arrays, ptrs))
        self._sequence: CallSequence | None = None
        self._native: Any = None   # the NativeRun once run() made it; False: none here
        self.input_names = list(graph.inputs)
        self.output_names = list(graph.outputs)
        self._inputs = {v: self._view(v, graph.values[v].shape, graph.values[v].dtype) for v in graph.inputs}
        # what run() checks and returns, fixed once: per call it is a few microseconds of Python
        # beside kernels that take tens (an MLP at batch 1 spent a third of run() finding views)
        self._expected = {v: (np.dtype(graph.values[v].dtype), tuple(graph.values[v].shape)) for v in graph.inputs}
        self._output_views = {v: self._view(v, graph.values[v].shape, graph.values[v].dtype)
                              for v in graph.outputs if graph.values[v].const is None}
        self._movable_blocks, self._input_slot = self._movable()
        self._output_blocks = [(j, b) for j, b in enumerate(self._movable_blocks)
                               if b not in self._input_slot.values()]
        self._default_bases = np.array([self._blocks[b].ctypes.data for b in self._movable_blocks], np.uint64)
        self._input_slot = {v: self._movable_blocks.index(b) for v, b in self._input_slot.items()}
        offsets, total = OutputArenas.layout([plan.block_bytes[b] for _, b in self._output_blocks])
        self._arena_offset = {b: offsets[i] for i, (_, b) in enumerate(self._output_blocks)}
        self._arenas = OutputArenas(total)
        self._output_slots = [(slot, self._arena_offset[b]) for slot, b in self._output_blocks]
        self._returns = self._output_plan()
        self._input_plan = [(v, self._input_slot.get(v), self._inputs[v]) for v in self.input_names]

    def _output_plan(self) -> list:
        """How run() returns each output, decided once: ('const', array), ('arena', byte offset in
        the arena, dtype, shape), ('arena copy', ...) for one that overlaps an output returned
        before it (two outputs of one storage), or ('copy', the module's view) for an output in a
        block that does not move."""
        plan = self.plan
        taken: list = []
        returns: list = []
        for v in self.output_names:
            view = self._output_views.get(v)
            if view is None:
                returns.append(("const", self.graph.values[v].const))
                continue
            b = plan.block_of[v]
            start = plan.offset_of.get(v, 0)
            end = start + view.nbytes
            if b not in self._arena_offset:
                returns.append(("copy", view))
                continue
            overlaps = any(tb == b and start < te and ts < end for tb, ts, te in taken)
            taken.append((b, start, end))
            returns.append(("arena copy" if overlaps else "arena", self._arena_offset[b] + start, view.dtype,
                            view.shape))
        return returns

    def _movable(self) -> tuple:
        """The blocks a run may place anew: ([block index], {input name: its block}). An input's
        block moves to the caller's array when it holds that input alone, at offset 0, and no
        kernel writes it; an output's block moves to a fresh array when it holds no input."""
        plan, graph = self.plan, self.graph
        written = {plan.block_of[s.group.output] for s in self.steps}
        out_blocks = {plan.block_of[v] for v in self._output_views}
        in_blocks = {plan.block_of[v] for v in self.input_names}
        inputs = {}
        for v in self.input_names:
            b = plan.block_of[v]
            if (plan.offset_of.get(v, 0) == 0 and b not in written and b not in out_blocks
                    and sum(plan.block_of[u] == b for u in self.input_names) == 1 and graph.values[v].nbytes > 0):
                inputs[v] = b
        outputs = sorted(b for b in out_blocks if b not in in_blocks)
        return [*inputs.values(), *outputs], inputs

    def _view(self, value, shape, dtype) -> np.ndarray:
        block = self._blocks[self.plan.block_of[value]]
        start = self.plan.offset_of.get(value, 0)
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return block[start:start + n].view(dtype).reshape(tuple(shape) or ())

    def _array(self, arg, shape, dtype) -> np.ndarray:
        const = arg_array(self.graph, arg)
        if const is None:
            return self._view(arg, shape, dtype)
        key = id(arg) if isinstance(arg, np.ndarray) else arg
        if key not in self._consts:
            a = aligned_empty(shape, dtype)
            np.copyto(a, np.asarray(const, dtype).reshape(shape))
            a.flags.writeable = False
            self._consts[key] = a
        return self._consts[key]

    @property
    def workloads(self) -> list:
        return [s.group for s in self.steps]

    def run(self, **inputs) -> list:
        """The model's outputs for `inputs` (one array per graph input, by name), each a new
        array that the caller owns.

        The first call compiles the call sequence and, where this Python allows, the model's
        native entry (native_run.py); from then on `run` and `run_timed` are this instance's
        own functions that call it, and an input it does not take as it is goes the checked
        way below (copied, or refused with a clear error)."""
        if self._native is None:
            self._install_native()
        if self._native:   # the instance's own run (a bound method kept from before lands here)
            return self.run(**inputs)
        return self._run(inputs, None)

    def run_timed(self, inputs: dict, stamps: np.ndarray) -> list:
        """run(), its call sequence reading the monotonic clock into `stamps` before each kernel
        and after the last (CallSequence.run_timed): what a run spends outside its kernels is
        its wall time less stamps[-1] - stamps[0], both of the same call (the profile's)."""
        if self._native is None:
            self._install_native()
        if self._native:
            return self.run_timed(inputs, stamps)
        return self._run(inputs, stamps)

    def _install_native(self) -> None:
        """Make run() and run_timed() the native entry's (kept in self._native: False where there
        is none). With small outputs they are the builtins themselves; otherwise Python that
        allocates the outputs and makes one call. What the entry declines, a kernel fails on, or
        the outputs the caller still holds go on in Python here.

        Everything made here reaches the module through a weak reference: the module holds
        these functions, and a reference back would make a cycle that keeps a dropped model's
        buffers until the cycle collector runs."""
        sequence = self.call_sequence()
        steps, names = self.steps, list(self.input_names)
        this = weakref.ref(self)

        def alive() -> "GraphModule":
            module = this()
            if module is None:
                raise ReferenceError("this run() belongs to a model that was freed: keep the model while "
                                     "you use its run")
            return module

        def failure(status):
            try:
                sequence.check(status.value)
            except KernelRuntimeError as e:
                raise node_error(e, steps) from None

        def fallback_run(args, kwargs, why):
            if args:
                raise TypeError(f"run() takes the model's inputs by name ({', '.join(names)}), "
                                f"got {len(args)} positional argument(s)")
            inputs = kwargs or {}
            module = alive()
            if why == RENEW:   # the caller holds the last outputs: fresh ones, and again
                module._native.outputs.renew()
                return module.run(**inputs)
            if why == FAILED:
                failure(module._native.status)
            return module._run(inputs, None)

        def fallback_timed(inputs, stamps, why):
            if why == BAD_ARGUMENTS:
                raise TypeError("run_timed() takes (inputs, stamps)")
            module = alive()
            if why == RENEW:
                module._native.outputs.renew()
                return module.run_timed(inputs, stamps)
            if why == FAILED:
                failure(module._native.timed_status)
            return module._run(inputs, stamps)

        native = native_run(self, sequence, self._table_address, fallback_run, fallback_timed)
        self._native = native or False
        if native is None:
            return
        if native.methods:
            self.run, self.run_timed = native.run, native.run_timed   # type: ignore[method-assign]
            return
        take, call, call_timed = native.outputs.take, native.entry, native.timed_entry
        status, timed_status = native.status, native.timed_status

        def run(**inputs):
            outs, raw = take()
            result = call(inputs, raw)
            if result is None:
                return outs
            if result is False:
                failure(status)
            return alive()._run(inputs, None)

        def run_timed(inputs, stamps):
            outs, raw = take()
            result = call_timed(inputs, raw, stamps)
            if result is None:
                return outs
            if result is False:
                failure(timed_status)
            return alive()._run(inputs, stamps)

        self.run, self.run_timed = run, run_timed   # type: ignore[method-assign]

    def _run(self, inputs: dict, stamps) -> list:
        """run()'s body, kept to a few microseconds of Python: beside a batch-1 MLP's 17 us of
        kernels, every step here shows (checks, views and copies decided at build time)."""
        self._check_inputs(inputs)
        sequence = self.call_sequence()
        if stamps is not None and (not isinstance(stamps, np.ndarray) or stamps.dtype != np.int64
                                   or stamps.shape != (len(sequence) + 1,) or not stamps.flags.c_contiguous):
            raise ValueError(f"stamps must be a contiguous int64 array of {len(sequence) + 1}, got "
                             f"{getattr(stamps, 'dtype', type(stamps).__name__)} {getattr(stamps, 'shape', '')}")
        table = self._table
        for name, slot, own in self._input_plan:
            arr = inputs[name]
            if slot is None:
                np.copyto(own, arr)
            elif arr.flags.c_contiguous and arr.flags.aligned:
                table[slot] = arr.ctypes.data   # read where the caller holds it
            else:
                np.copyto(own, arr)
                table[slot] = int(self._default_bases[slot])
        if self._output_slots:
            arena, start, address = self._arenas.take()
            for slot, at in self._output_slots:
                table[slot] = address + at
        else:
            arena = start = None
        try:
            if stamps is None:
                sequence.run_at(self._table_address)
            else:
                sequence.run_timed_at(stamps, self._table_address)
        except KernelRuntimeError as e:   # an index check: name the ONNX node
            raise node_error(e, self.steps) from None
        return [np.ndarray(r[3], r[2], arena, start + r[1]) if r[0] == "arena" else
                np.ndarray(r[3], r[2], arena, start + r[1]).copy() if r[0] == "arena copy" else r[1].copy()
                for r in self._returns]

    def load_inputs(self, inputs: dict) -> None:
        """Copy `inputs` into the module's own input buffers, where `call_sequence().run()`
        without bases reads them (the profile times the sequence on these)."""
        self._check_inputs(inputs)
        for name, arr in inputs.items():
            np.copyto(self._inputs[name], arr)

    def call_sequence(self) -> CallSequence:
        """The steps compiled into one native call (on first use: every kernel loaded); the
        module's input and output blocks are its movable ranges."""
        if self._sequence is None:
            movable = [(self._blocks[b].ctypes.data, self.plan.block_bytes[b]) for b in self._movable_blocks]
            self._sequence = CallSequence([s.kernel for s in self.steps], [s.ptrs for s in self.steps], movable)
            self._table = self._sequence.base_table()   # run() sets every entry of it on each call
            self._table_address = ctypes.addressof(self._table)
        return self._sequence

    def profile(self, inputs: dict, repeat: int = 10, options=None, lock: bool = True) -> ModelProfile:
        """Time each kernel of a run on `inputs` ({input name: array}) and the whole run: where the
        time goes, layer by layer (compiler.graph.profile)."""
        return profile_model(self, inputs, repeat=repeat, options=options, lock=lock)

    def _check_inputs(self, inputs):
        if len(inputs) == len(self._expected):   # the common case first, in a few hundred ns
            try:
                if all(type(a) is np.ndarray and a.dtype == self._expected[n][0] and a.shape == self._expected[n][1]
                       for n, a in inputs.items()):
                    return
            except KeyError:
                pass
        check_input_arrays(self.input_names, inputs)
        for name in self.input_names:
            arr, (dtype, shape) = inputs[name], self._expected[name]
            if arr.dtype != dtype:
                raise InputError(f"input {name!r}: expected dtype {dtype}, got {arr.dtype}")
            if arr.shape != shape:
                raise InputError(f"input {name!r}: expected shape {shape}, got {tuple(arr.shape)}")

    def summary(self) -> str:
        lines = [f"{len(self.steps)} kernels, {len(set(s.group.key for s in self.steps))} unique workloads, "
                 f"buffers {self.plan.total_bytes / 1e6:.2f} MB (unshared {self.plan.unshared_bytes / 1e6:.2f} MB), "
                 f"built in {self.build_seconds:.1f} s"]
        return "\n".join(lines)


__all__ = ["build_model", "GraphModule", "extract_tasks", "ModelTask", "kernel_name", "check_input_arrays"]
