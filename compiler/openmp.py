"""libgomp, the thread pool that runs the kernels' parallel loops, and what fork does to it.

libgomp's worker threads do not survive `fork()`: in a child of a process that already ran a
parallel region, the next parallel region waits forever for threads that do not exist. Python's
multiprocessing forks by default on Linux, so this is easy to hit. A forked child therefore runs
parallel loops on its calling thread only (one thread, correct results) and says so once with a
RuntimeWarning; processes started with spawn or forkserver, and the parent, are not affected.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import warnings
from functools import lru_cache

from .errors import KernelLoadError
from .target import llvm_binding

# pid of the process whose libgomp started its thread pool (None: no parallel kernel ran yet)
_pool_owner_pid = None
_warned_pids: set = set()
_state_lock = threading.Lock()
# 1 in a process forked from this one: native code that runs kernels without passing through
# before_parallel_call (a model's native entry, compiler/graph/native_run.py) reads it and
# leaves a forked child's call to the Python path, which applies the rule above
_forked = ctypes.c_int32(0)


def _after_fork_in_child() -> None:
    _forked.value = 1


os.register_at_fork(after_in_child=_after_fork_in_child)


def fork_flag_address() -> int:
    """Address of an int32 that is 0 in a process not forked from one that imported this module."""
    return ctypes.addressof(_forked)


@lru_cache(maxsize=None)
def runtime_libraries():
    """Make libgomp (parallel loops) visible to the JIT linker; return its ctypes handle."""
    llvm = llvm_binding()
    name = ctypes.util.find_library("gomp") or "libgomp.so.1"
    try:
        llvm.load_library_permanently(name)
        return ctypes.CDLL(name)
    except (RuntimeError, OSError) as e:
        raise KernelLoadError(f"cannot load the OpenMP runtime libgomp ({name}): {e}") from None


def set_num_threads(n: int) -> None:
    """Threads used by parallel loops of kernels called from this thread.

    In a process forked after parallel kernels ran, parallel loops use one thread whatever
    this says (see the module docstring)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"number of threads must be a positive integer, got {n!r}")
    runtime_libraries().omp_set_num_threads(n)


def get_max_threads() -> int:
    return runtime_libraries().omp_get_max_threads()


def before_parallel_call() -> None:
    """Call before a kernel with parallel loops runs on this thread."""
    global _pool_owner_pid
    pid = os.getpid()
    if _pool_owner_pid == pid:
        return
    with _state_lock:
        if _pool_owner_pid is None:
            _pool_owner_pid = pid
            return
        if _pool_owner_pid == pid:
            return
    # forked from a process whose libgomp pool was running: only this thread can work
    runtime_libraries().omp_set_num_threads(1)
    if pid not in _warned_pids:
        _warned_pids.add(pid)
        warnings.warn("this process was forked after parallel kernels ran in its parent; libgomp "
                      "cannot start threads in a forked child, so parallel loops run on one thread "
                      "here (start processes with multiprocessing's 'spawn' or 'forkserver' method "
                      "to use every core)", RuntimeWarning, stacklevel=3)


__all__ = ["runtime_libraries", "set_num_threads", "get_max_threads", "before_parallel_call", "fork_flag_address"]
