"""Targets: where a kernel runs, parsed from a string like TVM's.

`llvm -mtriple=x86_64-linux-gnu -mcpu=znver3 -mattr=+avx2,+fma -num-cores=2`. Without options the
host is described. A target string round-trips through `str()`, which is what records store.
"""

from __future__ import annotations

import os
import shlex
from functools import lru_cache

from .errors import TargetError

_KNOWN_OPTIONS = ("mtriple", "mcpu", "mattr", "num-cores")


@lru_cache(maxsize=None)
def _llvm():
    import llvmlite.binding as llvm
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    return llvm


class Target:
    def __init__(self, triple: str, cpu: str, features: str = "", num_cores: int = 1):
        self.triple, self.cpu, self.features, self.num_cores = triple, cpu, features, num_cores

    @staticmethod
    def host() -> "Target":
        return Target(*_host_fields())

    @staticmethod
    def from_string(text: str) -> "Target":
        """Parse a target string; raises TargetError naming what is wrong.

        Parsed strings are remembered (a measuring agent parses the same target for every
        kernel it loads); each call still returns a new Target."""
        if not isinstance(text, str):
            raise TargetError("empty target string; expected e.g. 'llvm -mtriple=x86_64-linux-gnu -mcpu=znver3'")
        return Target(*_parse_target(text))

    @staticmethod
    def _from_string_uncached(text: str) -> "Target":
        if not text.strip():
            raise TargetError("empty target string; expected e.g. 'llvm -mtriple=x86_64-linux-gnu -mcpu=znver3'")
        parts = shlex.split(text)
        if parts[0] != "llvm":
            raise TargetError(f"unknown target kind {parts[0]!r}: only 'llvm' (CPU) targets are supported")
        opts = {}
        for p in parts[1:]:
            if not p.startswith("-") or "=" not in p:
                raise TargetError(f"malformed target option {p!r}; expected -key=value")
            k, v = p[1:].split("=", 1)
            if k not in _KNOWN_OPTIONS:
                raise TargetError(f"unknown target option -{k}; known: {', '.join('-' + o for o in _KNOWN_OPTIONS)}")
            opts[k] = v
        host = Target.host()
        if "mtriple" not in opts:
            if "mcpu" in opts or "mattr" in opts:
                raise TargetError("-mcpu/-mattr without -mtriple: give the triple too")
            t = host
        else:
            t = Target(opts["mtriple"], opts.get("mcpu", "generic"), opts.get("mattr", ""), 1)
        if "num-cores" in opts:
            try:
                t.num_cores = int(opts["num-cores"])
            except ValueError:
                raise TargetError(f"-num-cores must be an integer, got {opts['num-cores']!r}") from None
            if t.num_cores < 1:
                raise TargetError("-num-cores must be at least 1")
        t.target_machine()  # validates triple and cpu
        return t

    def _fields(self) -> tuple:
        return (self.triple, self.cpu, self.features, self.num_cores)

    def __str__(self):
        s = f"llvm -mtriple={self.triple} -mcpu={self.cpu}"
        if self.features:
            s += f" -mattr={self.features}"
        return s + f" -num-cores={self.num_cores}"

    def __repr__(self):
        return f"Target({str(self)!r})"

    def __eq__(self, other):
        return isinstance(other, Target) and str(self) == str(other)

    def __hash__(self):
        return hash(str(self))

    @property
    def arch(self) -> str:
        return self.triple.split("-")[0]

    def has_feature(self, name: str) -> bool:
        if f"+{name}" in self.features.split(","):
            return True
        return name in _CPU_IMPLIED.get(self.cpu, ())

    def vector_bits(self) -> int:
        """Width of the widest fp vector registers the target has."""
        if self.arch in ("x86_64", "i686"):
            if self.has_feature("avx512f"):
                return 512
            if self.has_feature("avx2") or self.has_feature("avx"):
                return 256
            return 128
        if self.arch in ("aarch64", "arm64", "armv7", "arm"):
            return 128
        return 128

    def vector_lanes(self, dtype: str = "float32") -> int:
        from .dtypes import nbytes
        return self.vector_bits() // (8 * nbytes(dtype))

    def is_host(self) -> bool:
        h = Target.host()
        return self.triple == h.triple and self.cpu == h.cpu

    @lru_cache(maxsize=None)
    def target_machine(self):
        """The (shared) LLVM target machine used to compile for this target."""
        return self.new_target_machine()

    def new_target_machine(self):
        """A fresh target machine; an MCJIT engine takes ownership of the one it is given."""
        llvm = _llvm()
        try:
            tgt = llvm.Target.from_triple(self.triple)
        except RuntimeError as e:
            raise TargetError(f"unknown target triple {self.triple!r}: {e}") from None
        if self.cpu not in ("generic", "") and not _cpu_known(tgt, self.triple, self.cpu):
            raise TargetError(f"unknown cpu {self.cpu!r} for triple {self.triple}")
        return tgt.create_target_machine(cpu=self.cpu, features=self.features, opt=3,
                                         reloc="pic", codemodel="default")


# CPU names whose vector features matter for default schedules when no -mattr is given.
_CPU_IMPLIED = {
    "emeraldrapids": ("avx512f", "avx2", "fma"), "sapphirerapids": ("avx512f", "avx2", "fma"),
    "icelake-server": ("avx512f", "avx2", "fma"), "skylake-avx512": ("avx512f", "avx2", "fma"),
    "znver4": ("avx512f", "avx2", "fma"), "znver3": ("avx2", "fma"), "znver2": ("avx2", "fma"),
    "haswell": ("avx2", "fma"), "skylake": ("avx2", "fma"),
}


_PROBE = """
import sys, llvmlite.binding as llvm
llvm.initialize_all_targets(); llvm.initialize_all_asmprinters()
tm = llvm.Target.from_triple(sys.argv[1]).create_target_machine(cpu=sys.argv[2], features="", opt=0)
m = llvm.parse_assembly("define void @f() { ret void }"); m.triple = sys.argv[1]
tm.emit_object(m)
"""


@lru_cache(maxsize=None)
def _cpu_known(tgt, triple: str, cpu: str) -> bool:
    """Is `cpu` a processor LLVM knows for `triple`?

    LLVM only warns about an unknown cpu, and for some triples then aborts the whole process
    ("64-bit code requested on a subtarget that doesn't support it"), so the check runs in a
    throwaway subprocess. The host's own cpu name comes from LLVM and needs no check.
    """
    llvm = _llvm()
    if cpu == llvm.get_host_cpu_name():
        return True
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", _PROBE, triple, cpu], capture_output=True, text=True, timeout=60)
    return proc.returncode == 0 and "not a recognized processor" not in proc.stderr


def resolve_target(target) -> Target:
    if target is None:
        return Target.host()
    if isinstance(target, Target):
        return target
    return Target.from_string(target)


@lru_cache(maxsize=1)
def _host_fields() -> tuple:
    llvm = _llvm()
    feats = llvm.get_host_cpu_features().flatten()
    # keep only enabled features: shorter strings, and the same target text on equal machines
    enabled = ",".join(f for f in feats.split(",") if f.startswith("+"))
    return (llvm.get_process_triple(), llvm.get_host_cpu_name(), enabled, os.cpu_count() or 1)


@lru_cache(maxsize=256)
def _parse_target(text: str) -> tuple:
    return Target._from_string_uncached(text)._fields()
