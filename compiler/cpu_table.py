"""What a `-mcpu` name tells about a machine that LLVM's own tables do not give us.

A target names a cpu (`-mcpu=neoverse-n1`) and maybe features (`-mattr=+avx2`); schedules need
numbers: which vector features the name implies (so its vector width is known without `-mattr`),
how many multiply-add pipes a core has and how wide they are, and its cache sizes. LLVM knows
the implied features but does not expose them through llvmlite, and knows nothing of pipes or
caches, so they are written down here for the CPUs tunefarm is meant to tune for. Numbers are of
a typical part (server parts of one name differ in L3 size); they size tiles, so being within a
factor of two is what matters. Unknown names fall back to the architecture's generic entry.

Only vector features are listed: they decide vector widths and register counts, and the
runtime refuses to load a kernel whose implied features the machine lacks. NEON is not listed
for aarch64 parts because every aarch64 application core has it. SVE parts list `sve`: LLVM may
use SVE instructions for them, though the code generator's fixed-width vectors are NEON-sized
(LLVM lowers them to SVE only when told the SVE length, a process-wide option).
Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024


@dataclass(frozen=True)
class CpuInfo:
    arch: str            # as target_string.arch_of names it
    features: tuple      # vector features the name implies (LLVM names)
    fma_units: int       # multiply-add pipes per core
    fma_bits: int        # width of one pipe: a wider vector op occupies it for several cycles
    l1d: int             # bytes, per core
    l2: int              # bytes (per core, or per cluster on small Arm parts)
    l3: int              # bytes, shared; 0 when there is none


_AVX2 = ("avx", "avx2", "fma")
_AVX512 = _AVX2 + ("avx512f",)

CPUS = {
    # x86-64, AVX2
    "haswell": CpuInfo("x86_64", _AVX2, 2, 256, 32 * KIB, 256 * KIB, 8192 * KIB),
    "skylake": CpuInfo("x86_64", _AVX2, 2, 256, 32 * KIB, 256 * KIB, 8192 * KIB),
    "znver2": CpuInfo("x86_64", _AVX2, 2, 256, 32 * KIB, 512 * KIB, 16384 * KIB),
    "znver3": CpuInfo("x86_64", _AVX2, 2, 256, 32 * KIB, 512 * KIB, 32768 * KIB),
    # x86-64, AVX-512 (Zen 4 runs 512-bit operations on its two 256-bit pipes)
    "skylake-avx512": CpuInfo("x86_64", _AVX512, 2, 512, 32 * KIB, 1024 * KIB, 39424 * KIB),
    "cascadelake": CpuInfo("x86_64", _AVX512, 2, 512, 32 * KIB, 1024 * KIB, 39424 * KIB),
    # Client Rocket Lake has one 512-bit FMA port, but LLVM names by CPUID model, and the VMs
    # here that read "rocketlake" (model 167) are Sapphire Rapids class (AMX, AVX512-FP16) with
    # two: 238 GFLOPS fp32 measured on one thread, out of reach of one 512-bit pipe
    "rocketlake": CpuInfo("x86_64", _AVX512, 2, 512, 48 * KIB, 2048 * KIB, 107520 * KIB),
    "icelake-client": CpuInfo("x86_64", _AVX512, 1, 512, 48 * KIB, 512 * KIB, 8192 * KIB),
    "tigerlake": CpuInfo("x86_64", _AVX512, 1, 512, 48 * KIB, 1280 * KIB, 12288 * KIB),
    "icelake-server": CpuInfo("x86_64", _AVX512, 2, 512, 48 * KIB, 1280 * KIB, 49152 * KIB),
    "sapphirerapids": CpuInfo("x86_64", _AVX512, 2, 512, 48 * KIB, 2048 * KIB, 107520 * KIB),
    "emeraldrapids": CpuInfo("x86_64", _AVX512, 2, 512, 48 * KIB, 2048 * KIB, 327680 * KIB),
    "graniterapids": CpuInfo("x86_64", _AVX512, 2, 512, 48 * KIB, 2048 * KIB, 516096 * KIB),
    "znver4": CpuInfo("x86_64", _AVX512, 2, 256, 32 * KIB, 1024 * KIB, 32768 * KIB),
    "znver5": CpuInfo("x86_64", _AVX512, 2, 512, 48 * KIB, 1024 * KIB, 32768 * KIB),
    # aarch64
    "neoverse-n1": CpuInfo("aarch64", (), 2, 128, 64 * KIB, 1024 * KIB, 32768 * KIB),
    "neoverse-n2": CpuInfo("aarch64", ("sve", "sve2"), 2, 128, 64 * KIB, 1024 * KIB, 32768 * KIB),
    "neoverse-v1": CpuInfo("aarch64", ("sve",), 4, 128, 64 * KIB, 1024 * KIB, 32768 * KIB),
    "cortex-a53": CpuInfo("aarch64", (), 1, 64, 32 * KIB, 512 * KIB, 0),
    "cortex-a72": CpuInfo("aarch64", (), 2, 128, 32 * KIB, 1024 * KIB, 0),
    "cortex-a76": CpuInfo("aarch64", (), 2, 128, 64 * KIB, 512 * KIB, 2048 * KIB),
    "apple-m1": CpuInfo("aarch64", (), 4, 128, 128 * KIB, 12288 * KIB, 0),
}

# `-mcpu=generic` or a name not in CPUS: the architecture's baseline (x86-64 is SSE2)
GENERIC = {
    "x86_64": CpuInfo("x86_64", (), 2, 128, 32 * KIB, 256 * KIB, 8192 * KIB),
    "i686": CpuInfo("i686", (), 1, 128, 32 * KIB, 256 * KIB, 0),
    "aarch64": CpuInfo("aarch64", (), 2, 128, 32 * KIB, 512 * KIB, 0),
}
_OTHER = CpuInfo("", (), 1, 128, 32 * KIB, 256 * KIB, 0)


def is_listed(arch: str, cpu: str) -> bool:
    info = CPUS.get(cpu)
    return info is not None and info.arch == arch


def cpu_info(arch: str, cpu: str) -> CpuInfo:
    """The entry of `cpu` on `arch`, or the architecture's generic one."""
    return CPUS[cpu] if is_listed(arch, cpu) else GENERIC.get(arch, _OTHER)


__all__ = ["CpuInfo", "CPUS", "GENERIC", "cpu_info", "is_listed"]
