"""A fixed list of kernel calls compiled into one native function.

A compiled model runs the same kernels on the same buffers every time. Calling each one from
Python costs a few microseconds (the ctypes call with its argument conversion, the status check,
the loop itself): beside a ShuffleNet's 83 kernels of 10-50 µs each that is several percent of the
run, and more on a busy host, where every Python step also risks losing the core. So the steps,
with their argument pointers fixed at build time, become straight-line code: one native function
that calls every kernel in order and stops at the first one that fails, telling which. Every
kernel gets the sequence's error record (compiler/index_checks.py), so an index that a kernel
finds out of range comes back with its check and value, and a model's runtime can name the node.

The pointers are baked into the code: the owner must keep every argument buffer and every kernel
alive, at the same address, for as long as it uses the sequence (GraphModule's buffers are
allocated once, with the module). Except in the *movable ranges* the owner names: a pointer into
one of them is the range's base, read from a table at each call, plus its offset. A model's
inputs and outputs are such ranges, so a run reads the caller's arrays where they lie and writes
its outputs into arrays it hands back, with no copy in or out (a decode step's KV cache: 4 MB
copied at batch 1, 34 MB at batch 8, 4-10 % of the step).

A second function of the same calls reads the monotonic clock before each call and after the
last (`run_timed`): each kernel's time where it stands in a real run, its inputs just written by
the kernels before it and its weights wherever the run left them, not warm from calling it alone
again and again. A model's profile is made of these, so its kernels add up to its run.
"""

from __future__ import annotations

import ctypes

import numpy as np

from .codegen_llvm import KERNEL_OK
from .errors import KernelLoadError
from .openmp import before_parallel_call
from .runtime import ErrorRecord, Kernel
from .target import Target, llvm_binding

SEQUENCE_SYMBOL = "tunefarm_call_sequence"
TIMED_SEQUENCE_SYMBOL = "tunefarm_call_sequence_timed"
CLOCK_MONOTONIC = 1   # Linux's clock id


def _stamp(i: int) -> list:
    """IR storing the monotonic clock, in nanoseconds, at %stamps[i]."""
    return [f"  %cg{i} = call i32 @clock_gettime(i32 {CLOCK_MONOTONIC}, {{i64, i64}}* %ts)",
            f"  %sec{i} = load i64, i64* %ts_sec", f"  %nsec{i} = load i64, i64* %ts_nsec",
            f"  %secns{i} = mul i64 %sec{i}, 1000000000", f"  %now{i} = add i64 %secns{i}, %nsec{i}",
            f"  %slot{i} = getelementptr i64, i64* %stamps, i64 {i}", f"  store i64 %now{i}, i64* %slot{i}"]


def _range_of(p: int, movable: list):
    """(index, offset) of the movable range (start, nbytes) holding address p, else None."""
    for j, (start, nbytes) in enumerate(movable):
        if start <= p < start + max(nbytes, 1):
            return j, p - start
    return None


def _sequence_ir(calls: list, movable: list, timed: bool = False) -> str:
    """LLVM IR of `i32 tunefarm_call_sequence(i32* failed, i8* record, i8** bases)`: each call's
    address and arguments as constants, except pointers into movable range j, which are
    bases[j] + their offset; the error record passed on to every kernel; returns KERNEL_OK, or
    the failing call's status with its index in *failed. With `timed`,
    `i32 tunefarm_call_sequence_timed(i32* failed, i8* record, i8** bases, i64* stamps)`, which
    also stores the monotonic clock (ns) before call i in stamps[i] and after the last in
    stamps[len(calls)]."""
    if timed:
        lines = ["declare i32 @clock_gettime(i32, {i64, i64}*)",
                 f"define i32 @{TIMED_SEQUENCE_SYMBOL}(i32* %failed, i8* %record, i8** %bases, i64* %stamps) {{",
                 "entry:", "  %ts = alloca {i64, i64}",
                 "  %ts_sec = getelementptr {i64, i64}, {i64, i64}* %ts, i32 0, i32 0",
                 "  %ts_nsec = getelementptr {i64, i64}, {i64, i64}* %ts, i32 0, i32 1"]
    else:
        lines = [f"define i32 @{SEQUENCE_SYMBOL}(i32* %failed, i8* %record, i8** %bases) {{", "entry:"]
    for j in range(len(movable)):
        lines += [f"  %basep{j} = getelementptr i8*, i8** %bases, i64 {j}", f"  %base{j} = load i8*, i8** %basep{j}"]
    for i, (address, ptrs) in enumerate(calls):
        fn_type = f"i32 ({', '.join(['i8*'] * (len(ptrs) + 1))})*"
        operands = []
        for k, p in enumerate(ptrs):
            where = _range_of(int(p), movable)
            if where is None:
                operands.append(f"i8* inttoptr (i64 {int(p)} to i8*)")
            else:
                lines.append(f"  %arg{i}_{k} = getelementptr i8, i8* %base{where[0]}, i64 {where[1]}")
                operands.append(f"i8* %arg{i}_{k}")
        args = ", ".join(operands + ["i8* %record"])
        if timed:
            lines += _stamp(i)
        lines += [f"  %f{i} = inttoptr i64 {int(address)} to {fn_type}",
                  f"  %s{i} = call i32 %f{i}({args})",
                  f"  %ok{i} = icmp eq i32 %s{i}, {KERNEL_OK}",
                  f"  br i1 %ok{i}, label %next{i}, label %fail{i}",
                  f"fail{i}:",
                  f"  store i32 {i}, i32* %failed",
                  f"  ret i32 %s{i}",
                  f"next{i}:"]
    if timed:
        lines += _stamp(len(calls))
    lines += [f"  ret i32 {KERNEL_OK}", "}"]
    return "\n".join(lines) + "\n"


class CallSequence:
    """`run()` calls `kernels[i](*pointers[i])` for every i, in order, in one native call;
    KernelRuntimeError names the kernel that failed (the later ones do not run)."""

    def __init__(self, kernels: list, pointers: list, movable=()):
        """`movable`: address ranges (start, nbytes), disjoint, whose base a call may move
        (`run(bases)`); without bases a call uses the starts."""
        if len(kernels) != len(pointers):
            raise ValueError(f"{len(kernels)} kernels but {len(pointers)} argument lists")
        self.kernels = list(kernels)
        self._parallel = any(k.parallel for k in self.kernels)
        calls = []
        for kernel, ptrs in zip(self.kernels, pointers):
            if len(ptrs) != len(kernel.args):
                raise ValueError(f"kernel {kernel.name} takes {len(kernel.args)} pointers, got {len(ptrs)}")
            address = ctypes.cast(kernel._load(), ctypes.c_void_p).value
            calls.append((address, ptrs))
        self._calls = calls
        self.movable = [(int(a), int(n)) for a, n in movable]
        ends = sorted(self.movable)
        if any(a + n > b for (a, n), (b, _) in zip(ends, ends[1:])):
            raise ValueError("movable ranges overlap")
        self._default_bases = np.array([a for a, _ in self.movable] or [0], np.uint64)
        self._engine, self._fn = self._compile(_sequence_ir(calls, self.movable), SEQUENCE_SYMBOL, ctypes.c_void_p)
        self._timed: tuple | None = None   # (engine, function) of the timed sequence, made on first use
        self._failed = ctypes.c_int32(-1)
        self._record = ErrorRecord()
        self._failed_ref = ctypes.byref(self._failed)
        self._record_address = ctypes.addressof(self._record)

    @staticmethod
    def _compile(ir_text: str, symbol: str, *extra):
        llvm = llvm_binding()
        host = Target.host()
        try:
            module = llvm.parse_assembly(ir_text)
            module.triple = host.triple
            module.verify()
            engine = llvm.create_mcjit_compiler(module, host.new_target_machine())
            engine.finalize_object()
            address = engine.get_function_address(symbol)
        except RuntimeError as e:
            raise KernelLoadError(f"cannot compile the call sequence: {e}") from None
        return engine, ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.POINTER(ctypes.c_int32), ctypes.c_void_p, *extra)(address)

    def __len__(self) -> int:
        return len(self.kernels)

    def _bases(self, bases) -> int:
        """The address of the base table: `bases` (a C-contiguous uint64 array, one address per
        movable range; the caller keeps every array it points into alive through the call) or
        the ranges' own starts."""
        if bases is None:
            return self._default_bases.ctypes.data
        if bases.dtype != np.uint64 or bases.shape != (len(self.movable),) or not bases.flags.c_contiguous:
            raise ValueError(f"bases must be a contiguous uint64 array of {len(self.movable)}, got {bases.dtype} "
                             f"{bases.shape}")
        return bases.ctypes.data

    def run_timed(self, stamps, bases=None) -> None:
        """run(), reading the monotonic clock (ns) into `stamps` (a C-contiguous int64 numpy array
        of len(self) + 1) before each call and after the last: kernel i took
        stamps[i + 1] - stamps[i]. The timed function is compiled on first use."""
        if stamps.dtype != "int64" or stamps.shape != (len(self) + 1,) or not stamps.flags.c_contiguous:
            raise ValueError(f"stamps must be a contiguous int64 array of {len(self) + 1}, got {stamps.dtype} "
                             f"{stamps.shape}")
        self.run_timed_at(stamps, self._bases(bases))

    def _timed_function(self):
        if self._timed is None:
            self._timed = self._compile(_sequence_ir(self._calls, self.movable, timed=True), TIMED_SEQUENCE_SYMBOL,
                                        ctypes.c_void_p, ctypes.c_void_p)
        return self._timed[1]

    def native_function(self, timed: bool = False) -> int:
        """The address of the compiled sequence (`timed`: of the one that stamps the clock), for
        native code that calls it itself (compiler/graph/native_run.py): its arguments are
        `failed_address`, `record_address`, a base table's address (and the stamps'); the
        caller passes the status to `check`. Valid while this sequence lives."""
        return int(ctypes.cast(self._timed_function() if timed else self._fn, ctypes.c_void_p).value or 0)

    @property
    def failed_address(self) -> int:
        return ctypes.addressof(self._failed)

    @property
    def record_address(self) -> int:
        return self._record_address

    def run_timed_at(self, stamps, table_address: int) -> None:
        """run_timed() with the base table at `table_address`, as run_at."""
        timed = self._timed_function()
        if self._parallel:
            before_parallel_call()
        self.check(timed(self._failed_ref, self._record_address, table_address, stamps.ctypes.data))

    def run(self, bases=None) -> None:
        """Every call, in order; with `bases`, movable range j starts at bases[j] for this call.
        KernelRuntimeError for the first call that fails: its `call` is the call's index, and
        an index error carries the kernel's `check` and the `value` (Kernel.failure)."""
        self.run_at(self._bases(bases))

    def base_table(self):
        """A table of bases for `run_at`: a ctypes array of one uint64 per movable range, set to
        the ranges' starts."""
        table = (ctypes.c_uint64 * max(len(self.movable), 1))()
        for j, (start, _) in enumerate(self.movable):
            table[j] = start
        return table

    def run_at(self, table_address: int) -> None:
        """run() with the base table at `table_address` (a `base_table()`'s address, or a
        uint64 array's), unchecked: the owner of a sequence that runs it every few microseconds
        (GraphModule.run) keeps one table and its length right."""
        if self._parallel:
            before_parallel_call()
        self.check(self._fn(self._failed_ref, self._record_address, table_address))

    def check(self, status: int) -> None:
        """Nothing for KERNEL_OK; else the KernelRuntimeError of the call that returned `status`."""
        if status != KERNEL_OK:
            call = self._failed.value
            kernel: Kernel = self.kernels[call]
            error = kernel.failure(status, self._record, f" (call {call} of {len(self)})")
            error.call = call
            raise error


__all__ = ["CallSequence", "SEQUENCE_SYMBOL", "TIMED_SEQUENCE_SYMBOL"]
