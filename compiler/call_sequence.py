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
allocated once, with the module).
"""

from __future__ import annotations

import ctypes

from .codegen_llvm import KERNEL_OK
from .errors import KernelLoadError
from .openmp import before_parallel_call
from .runtime import ErrorRecord, Kernel
from .target import Target, llvm_binding

SEQUENCE_SYMBOL = "tunefarm_call_sequence"


def _sequence_ir(calls: list) -> str:
    """LLVM IR of `i32 tunefarm_call_sequence(i32* failed, i8* record)`: each call's address and
    arguments as constants, the error record passed on to every kernel; returns KERNEL_OK, or the
    failing call's status with its index in *failed."""
    lines = [f"define i32 @{SEQUENCE_SYMBOL}(i32* %failed, i8* %record) {{", "entry:"]
    for i, (address, ptrs) in enumerate(calls):
        fn_type = f"i32 ({', '.join(['i8*'] * (len(ptrs) + 1))})*"
        args = ", ".join([f"i8* inttoptr (i64 {int(p)} to i8*)" for p in ptrs] + ["i8* %record"])
        lines += [f"  %f{i} = inttoptr i64 {int(address)} to {fn_type}",
                  f"  %s{i} = call i32 %f{i}({args})",
                  f"  %ok{i} = icmp eq i32 %s{i}, {KERNEL_OK}",
                  f"  br i1 %ok{i}, label %next{i}, label %fail{i}",
                  f"fail{i}:",
                  f"  store i32 {i}, i32* %failed",
                  f"  ret i32 %s{i}",
                  f"next{i}:"]
    lines += [f"  ret i32 {KERNEL_OK}", "}"]
    return "\n".join(lines) + "\n"


class CallSequence:
    """`run()` calls `kernels[i](*pointers[i])` for every i, in order, in one native call;
    KernelRuntimeError names the kernel that failed (the later ones do not run)."""

    def __init__(self, kernels: list, pointers: list):
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
        self._engine, self._fn = self._compile(_sequence_ir(calls))
        self._failed = ctypes.c_int32(-1)
        self._record = ErrorRecord()

    @staticmethod
    def _compile(ir_text: str):
        llvm = llvm_binding()
        host = Target.host()
        try:
            module = llvm.parse_assembly(ir_text)
            module.triple = host.triple
            module.verify()
            engine = llvm.create_mcjit_compiler(module, host.new_target_machine())
            engine.finalize_object()
            address = engine.get_function_address(SEQUENCE_SYMBOL)
        except RuntimeError as e:
            raise KernelLoadError(f"cannot compile the call sequence: {e}") from None
        return engine, ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.POINTER(ctypes.c_int32), ctypes.c_void_p)(address)

    def __len__(self) -> int:
        return len(self.kernels)

    def run(self) -> None:
        """KernelRuntimeError for the first call that fails: its `call` is the call's index, and
        an index error carries the kernel's `check` and the `value` (Kernel.failure)."""
        if self._parallel:
            before_parallel_call()
        status = self._fn(ctypes.byref(self._failed), ctypes.addressof(self._record))
        if status != KERNEL_OK:
            call = self._failed.value
            kernel: Kernel = self.kernels[call]
            error = kernel.failure(status, self._record, f" (call {call} of {len(self)})")
            error.call = call
            raise error


__all__ = ["CallSequence", "SEQUENCE_SYMBOL"]
