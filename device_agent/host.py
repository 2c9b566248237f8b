"""What this machine is, and whether it can run a given kernel target.

The tracker routes work by device key only; the agent is the one that knows its CPU. It tells
the tracker what it is when it registers (`describe_host`), and before it hands a request to a
worker it checks the request's target against the host (`target_problem`), so a kernel built
for AVX-512 sent to an AVX2 board comes back as a clear error naming the missing features
instead of an illegal-instruction crash. The check is the compiler runtime's own (the one
`Kernel` runs before loading), so the agent and the loader never disagree.

It also tells whether it runs emulated (`is_emulated`): an aarch64 board made of a Debian root
run through qemu-user on an x86 host measures qemu's translation of the kernel, not an Arm core,
and those timings must never be taken for (or mixed with) a real device's.
"""

from __future__ import annotations

import os
import platform
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


# Architectures a kernel runs natively besides its own (32-bit compat modes): an armv7l process on
# an aarch64 kernel is a real Arm core, not an emulator.
_NATIVE_ALSO = {"aarch64": {"arm"}, "x86_64": {"x86"}}
EMULATED_ENV = "TUNEFARM_EMULATED"


def _arch_family(machine: str) -> str:
    """uname-style machine names folded to one name per instruction set family."""
    m = machine.strip().lower()
    if m in ("x86_64", "amd64", "x64"):
        return "x86_64"
    if m in ("aarch64", "arm64", "aarch64_be"):
        return "aarch64"
    if m in ("i386", "i486", "i586", "i686", "x86"):
        return "x86"
    if m.startswith("arm"):
        return "arm"
    return m


def kernel_arch() -> str:
    """The architecture the running Linux kernel is built for, as the kernel itself says it ('' if
    it cannot be told): /proc/sys/kernel/arch, else what /proc/cpuinfo's layout gives away (x86
    kernels list `vendor_id` and `flags`, arm64 ones `CPU implementer`)."""
    try:
        with open("/proc/sys/kernel/arch") as f:
            arch = f.read().strip()
        if arch:
            return _arch_family(arch)
    except OSError:
        pass
    try:
        with open("/proc/cpuinfo") as f:
            keys = {line.split(":", 1)[0].strip() for line in f if ":" in line}
    except OSError:
        return ""
    if "vendor_id" in keys and "flags" in keys:
        return "x86_64"
    if "CPU implementer" in keys:
        return "aarch64"
    return ""


def is_emulated() -> bool:
    """True when this process runs under a user-mode instruction-set emulator (qemu-user through
    binfmt_misc, as the emulated board does), so its timings are the emulator's, not a device's.

    How: the process's own architecture is what uname() tells it (`platform.machine()`); under
    qemu-user that call is answered by qemu with the guest's (aarch64), and qemu also rewrites the
    /proc files that would betray it (/proc/self/exe, maps, auxv, and /proc/cpuinfo since qemu 8.2).
    It does not rewrite /proc/sys/kernel/arch, which the kernel fills in with the architecture it
    runs on (x86_64). A mismatch between the two — other than a 32-bit compat mode the kernel runs
    natively — means something translates every instruction. This needs no knowledge of qemu (any
    user-mode translator shows the same mismatch), no binfmt_misc mount inside the chroot, and
    only /proc, which an agent needs anyway. Full-system emulation (qemu-system) is not seen: its
    kernel is emulated too. $TUNEFARM_EMULATED=1 or 0 overrides the detection for what it cannot see.
    """
    forced = os.environ.get(EMULATED_ENV, "").strip().lower()
    if forced in ("1", "true", "yes"):
        return True
    if forced in ("0", "false", "no"):
        return False
    kernel, process = kernel_arch(), _arch_family(platform.machine())
    if not kernel or not process:
        return False
    return process != kernel and process not in _NATIVE_ALSO.get(kernel, set())


def llvmlite_version() -> str:
    """The llvmlite that loads kernels here (the tracker refuses one whose LLVM cannot load them)."""
    import llvmlite
    return llvmlite.__version__


def describe_host() -> dict:
    """The fields of the protocol's DeviceInfo for this machine."""
    host = Target.host()
    return dict(triple=host.triple, cpu=host.cpu, features=host_features(host),
                cores=os.cpu_count() or 1, memory_bytes=memory_bytes(),
                agent_version=agent_version(), hostname=socket.gethostname(),
                emulated=is_emulated(), llvmlite_version=llvmlite_version())


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
