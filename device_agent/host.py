"""What this machine is, and whether it can run a given kernel target.

The tracker routes work by device key only; the agent is the one that knows its CPU. It tells
the tracker what it is when it registers (`describe_host`), and before it hands a request to a
worker it checks the request's target against the host (`target_problem`), so a kernel built
for AVX-512 sent to an AVX2 board comes back as a clear error naming the missing features
instead of an illegal-instruction crash. The check is the compiler runtime's own (the one
`Kernel` runs before loading), so the agent and the loader never disagree.
"""

from __future__ import annotations

import os
import socket
from functools import lru_cache

from compiler.errors import CompilerError
from compiler.runtime import check_runnable
from compiler.target import Target
from compiler.target_string import enabled_features


def agent_version() -> str:
    """The installed tunefarm version (the compiler's own version in a checkout never installed)."""
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version("tunefarm")
    except (ImportError, PackageNotFoundError):
        import compiler
        return compiler.__version__


def memory_bytes() -> int:
    """Physical memory: MemTotal of /proc/meminfo on Linux, sysconf elsewhere, 0 if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024  # the kernel reports kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def host_features(target: Target) -> list:
    """LLVM feature names the host has (`+avx2` → `avx2`), sorted."""
    return sorted(enabled_features(target.features))


def describe_host() -> dict:
    """The fields of the protocol's DeviceInfo for this machine."""
    host = Target.host()
    return dict(triple=host.triple, cpu=host.cpu, features=host_features(host),
                cores=os.cpu_count() or 1, memory_bytes=memory_bytes(),
                agent_version=agent_version(), hostname=socket.gethostname())


@lru_cache(maxsize=256)
def target_problem(target_text: str) -> str:
    """Why this host cannot run kernels built for `target_text`, or '' when it can.

    Cached: every request of a task names the same target.
    """
    try:
        target = Target.from_string(target_text)
        check_runnable(target)
    except CompilerError as e:
        return str(e)
    return ""
