"""A target's capabilities: the numbers schedules and search spaces are sized by.

Default schedules, sketch rules, templates and features never assume an instruction set; they
ask the target for its vector lanes per dtype, vector registers, multiply-add pipes, cores and
cache sizes. `derive` computes them from what a target string says: the triple's architecture
and the vector features (implied by `-mcpu`, see `cpu_table`, then changed by `-mattr`) give the
vector unit; the cpu table gives the pipes and caches; `-num-cores` the cores. For the host,
`compiler.target` passes the cache sizes Linux reports (`read_host_caches`) instead of the
table's, and the host's target string already lists every feature LLVM detected.

Standard library only, like `target_string`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .cpu_table import cpu_info, is_listed
from .dtypes import is_float, nbytes
from .target_string import arch_of, disabled_features, enabled_features

# Vector registers a micro-kernel step needs besides its accumulators (operand vectors, a
# broadcast, a temporary): the default schedules were tuned with 12 accumulators of AVX2's 16.
OPERAND_REGISTERS = 4

# features that need others: LLVM enables these along with the feature and disables the feature
# with any of them
_REQUIRES = {"avx512f": ("avx2", "fma"), "avx2": ("avx",), "fma": ("avx",), "sve2": ("sve",)}

SYSFS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")


@dataclass(frozen=True)
class Capabilities:
    kind: str              # "cpu" (gpu targets come later)
    vector_bits: int       # widest floating-point vector register
    int_vector_bits: int   # widest integer vector register (AVX without AVX2: 128)
    vector_registers: int
    fma_units: int         # multiply-add pipes per core
    fma_bits: int          # width of one pipe
    cores: int
    l1d: int               # bytes; per core
    l2: int                # bytes
    l3: int                # bytes; 0 when there is none

    def vector_lanes(self, dtype: str = "float32") -> int:
        """Lanes of one vector register of `dtype`."""
        bits = self.vector_bits if is_float(dtype) else self.int_vector_bits
        return max(1, bits // (8 * nbytes(dtype)))

    @property
    def fmas_per_cycle(self) -> float:
        """Full-width vector multiply-adds a core starts per cycle (Zen 4: one 512-bit FMA on
        two 256-bit pipes; Cortex-A53: half a 128-bit one on its 64-bit pipe)."""
        return self.fma_units * min(self.fma_bits, self.vector_bits) / self.vector_bits

    @property
    def accumulator_registers(self) -> int:
        """Vector registers a register tile may keep accumulators in (12 of 16, 28 of 32)."""
        return self.vector_registers - OPERAND_REGISTERS


def derive(triple: str, cpu: str, features: str, cores: int, caches: dict | None = None) -> Capabilities:
    """The capabilities of `llvm -mtriple=triple -mcpu=cpu -mattr=features -num-cores=cores`.

    `caches` ({level: bytes}, e.g. from `read_host_caches`) overrides the cpu table's sizes."""
    arch = arch_of(triple)
    info = cpu_info(arch, cpu)
    bits, int_bits, regs = _vector_unit(arch, effective_features(info.features, features))
    caches = caches or {}
    # a cpu the table does not list, with vector features from -mattr (or a host LLVM names
    # after a part it resembles): pipes as wide as its vectors, as on every recent core, rather
    # than the baseline's 128 bits, which made a 512-bit FMA look 4x as costly as it is
    fma_bits = info.fma_bits if is_listed(arch, cpu) else max(info.fma_bits, bits)
    return Capabilities("cpu", bits, int_bits, regs, info.fma_units, fma_bits, cores,
                        caches.get(1, info.l1d), caches.get(2, info.l2), caches.get(3, info.l3))


def effective_features(implied, features: str) -> frozenset:
    """The features a target has among `implied` (by its cpu) and those `-mattr` enables, with
    what they require, less what `-mattr` disables and whatever requires that."""
    on = set(implied) | enabled_features(features)
    todo = list(on)
    while todo:
        for req in _REQUIRES.get(todo.pop(), ()):
            if req not in on:
                on.add(req)
                todo.append(req)
    off = set(disabled_features(features))
    grew = True
    while grew:
        grew = False
        for feat, reqs in _REQUIRES.items():
            if feat not in off and off.intersection(reqs):
                off.add(feat)
                grew = True
    return frozenset(on - off)


def _vector_unit(arch: str, feats: frozenset) -> tuple:
    """(float vector bits, integer vector bits, vector registers) of an architecture's vector
    unit with these features. aarch64 is NEON: SVE lengths are not used by fixed-width code."""
    if arch in ("x86_64", "i686"):
        regs = 8 if arch == "i686" else 32 if "avx512f" in feats else 16
        if "avx512f" in feats:
            return 512, 512, regs
        if "avx2" in feats:
            return 256, 256, regs
        if "avx" in feats:
            return 256, 128, regs
        return 128, 128, regs
    if arch == "aarch64":
        return 128, 128, 32
    return 128, 128, 16


def read_host_caches(root: Path = SYSFS_CACHE) -> dict:
    """{level: bytes} of the data (or unified) caches Linux reports for cpu 0; {} elsewhere."""
    out = {}
    for index in sorted(Path(root).glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = _size((index / "size").read_text().strip())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified") and size > 0:
            out[level] = size
    return out


def _size(text: str) -> int:
    """'32K' → 32768 (sysfs writes K, sometimes M or G)."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(text[:-1] if scale > 1 else text) * scale


__all__ = ["Capabilities", "derive", "effective_features", "read_host_caches", "OPERAND_REGISTERS"]
