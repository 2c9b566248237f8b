"""Targets: where a kernel runs, parsed from a string like TVM's.

`llvm -mtriple=x86_64-linux-gnu -mcpu=znver3 -mattr=+avx2,+fma -num-cores=2`. Without options the
host is described. A target string round-trips through `str()`, which is what records store.
The grammar is `target_string`'s (shared with the farm's tracker); this module adds what needs
LLVM: the host's description, checking that LLVM knows the triple, cpu and features, and the
target machine that compiles. What the target can do (vector lanes, registers, caches) is its
`capabilities`.
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
from functools import lru_cache

from . import capabilities as caps
from .cpu_table import cpu_info
from .errors import TargetError
from .target_string import EXAMPLE, TargetSpec, arch_of, feature_names, format_target


@lru_cache(maxsize=None)
def llvm_binding():
    """llvmlite's binding with every target and asm printer initialized, once per process."""
    import llvmlite.binding as llvm
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    return llvm


class Target:
    """A compilation target: triple, cpu, -mattr features and the cores kernels may use."""

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
            raise TargetError(f"a target must be a string like {EXAMPLE} or a Target, got {type(text).__name__}")
        return Target(*_parse_target(text))

    @staticmethod
    def _from_string_uncached(text: str) -> "Target":
        spec = TargetSpec.parse(text)
        if spec.triple:
            t = Target(spec.triple, spec.cpu or "generic", spec.mattr, 1)
        else:
            t = Target.host()
        if spec.num_cores is not None:
            t.num_cores = spec.num_cores
        t.target_machine()  # validates triple, cpu and features
        return t

    def _fields(self) -> tuple:
        return (self.triple, self.cpu, self.features, self.num_cores)

    def __str__(self):
        return format_target(self.triple, self.cpu, self.features, self.num_cores)

    def __repr__(self):
        return f"Target({str(self)!r})"

    def __eq__(self, other):
        return isinstance(other, Target) and str(self) == str(other)

    def __hash__(self):
        return hash(str(self))

    @property
    def arch(self) -> str:
        """The triple's architecture, aliases folded (arm64 → aarch64)."""
        return arch_of(self.triple)

    @property
    def kind(self) -> str:
        return self.capabilities.kind

    @property
    def capabilities(self) -> caps.Capabilities:
        """Vector lanes, registers, multiply-add pipes, cores and caches (see compiler.capabilities)."""
        return _capabilities(self.triple, self.cpu, self.features, self.num_cores)

    def vector_lanes(self, dtype: str = "float32") -> int:
        return self.capabilities.vector_lanes(dtype)

    def assumed_features(self) -> frozenset:
        """The features kernels for this target may use: -mattr's and the vector features its
        cpu name implies (with what they require), less what -mattr disables."""
        return caps.effective_features(cpu_info(self.arch, self.cpu).features, self.features)

    def has_feature(self, name: str) -> bool:
        return name in self.assumed_features()

    def is_host(self) -> bool:
        h = Target.host()
        return self.triple == h.triple and self.cpu == h.cpu

    def target_machine(self):
        """The (shared) LLVM target machine used to compile for this target."""
        return _shared_target_machine(self)

    def new_target_machine(self):
        """A fresh target machine; an MCJIT engine takes ownership of the one it is given."""
        llvm = llvm_binding()
        try:
            tgt = llvm.Target.from_triple(self.triple)
        except RuntimeError as e:
            raise TargetError(f"unknown target triple {self.triple!r}: {e}") from None
        _check_cpu_and_features(tgt.name, self.triple, self.cpu, self.features)
        return tgt.create_target_machine(cpu=self.cpu, features=self.features, opt=3,
                                         reloc="pic", codemodel="default")


def _check_cpu_and_features(llvm_target: str, triple: str, cpu: str, features: str):
    """Raise TargetError unless LLVM knows `cpu` and every `-mattr` feature for `triple`.

    LLVM only warns about an unknown cpu or feature and then builds for something else (a
    kernel meant for `+avx2` silently is not), and on some combinations it aborts the whole
    process ("64-bit code requested on a subtarget that doesn't support it"). So whatever the
    host's own description cannot vouch for is tried once in a throwaway subprocess.
    """
    names = feature_names(features)
    if _host_vouches(llvm_target, cpu, names):
        return
    problem = _probe(triple, cpu, features)
    if problem:
        raise TargetError(problem)


def _host_vouches(llvm_target: str, cpu: str, names: tuple) -> bool:
    """True when LLVM's description of this machine already proves `cpu` and `names` valid.

    The host's cpu name and feature names come from LLVM itself, so the host's target string
    (parsed back by every measuring worker for every kernel) never costs a process.
    """
    host_target, host_cpu, host_names = _host_names()
    same = llvm_target == host_target
    cpu_known = cpu in ("", "generic") or (same and cpu == host_cpu)
    return cpu_known and (not names or (same and set(names) <= host_names))


@lru_cache(maxsize=1)
def _host_names() -> tuple:
    """(LLVM target name, cpu name, every feature name LLVM reports) of this machine."""
    llvm = llvm_binding()
    triple = llvm.get_process_triple()
    features = frozenset(llvm.get_host_cpu_features().keys())
    return (llvm.Target.from_triple(triple).name, llvm.get_host_cpu_name(), features)


_PROBE = """
import sys, llvmlite.binding as llvm
llvm.initialize_all_targets(); llvm.initialize_all_asmprinters()
triple, cpu, features = sys.argv[1:4]
tm = llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features=features, opt=0)
m = llvm.parse_assembly("define void @f() { ret void }"); m.triple = triple
tm.emit_object(m)
"""
_UNRECOGNIZED = re.compile(r"'([^']*)' is not a recognized (processor|feature) for this target")


def _run_probe(triple: str, cpu: str, features: str) -> subprocess.CompletedProcess:
    """Build an empty function for (triple, cpu, features) in a process LLVM may abort."""
    return subprocess.run([sys.executable, "-c", _PROBE, triple, cpu, features],
                          capture_output=True, text=True, timeout=60)


@lru_cache(maxsize=None)
def _probe(triple: str, cpu: str, features: str) -> str:
    """What LLVM objects to when building for (triple, cpu, features): a message, or ''.

    One subprocess per distinct combination and process; its stderr holds LLVM's warnings.
    """
    proc = _run_probe(triple, cpu, features)
    unknown: dict[str, list[str]] = {"processor": [], "feature": []}
    for name, kind in _UNRECOGNIZED.findall(proc.stderr):
        if name not in unknown[kind]:
            unknown[kind].append(name)
    if unknown["processor"]:
        return f"unknown cpu {cpu!r} for triple {triple}{_did_you_mean(cpu, _llvm_names(triple)[0])}"
    if unknown["feature"]:
        return _unknown_features_message(triple, unknown["feature"])
    if proc.returncode != 0:
        said = proc.stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        asked = f"-mcpu={cpu}" + (f" -mattr={features}" if features else "")
        return f"LLVM cannot build for {triple} with {asked} ({said[0]}); pick a cpu and features this triple supports"
    return ""


def _unknown_features_message(triple: str, features: list) -> str:
    known = _llvm_names(triple)[1]
    named = ", ".join(f"{f!r}{_did_you_mean(f[1:], known, f[0])}" for f in features)
    plural = "s" if len(features) > 1 else ""
    return (f"unknown CPU feature{plural} {named} in -mattr for {triple}: LLVM would ignore "
            f"{'them' if plural else 'it'} and build for less than asked; use LLVM's feature names, "
            f"e.g. +avx2,+fma on x86 or +neon on Arm")


@lru_cache(maxsize=None)
def _llvm_names(triple: str) -> tuple:
    """(cpu names, feature names) LLVM knows for `triple`, from its `+help` tables.

    Only asked for when a name is wrong, to suggest close ones; empty if LLVM prints no tables.
    """
    text = _run_probe(triple, "generic", "+help").stderr
    tables: dict[str, list[str]] = {"CPUs": [], "features": []}
    table = None
    for line in text.splitlines():
        heading = re.match(r"Available (CPUs|features) for this target:", line)
        entry = re.match(r"\s+(\S+)\s+- ", line)
        if heading:
            table = tables[heading.group(1)]
        elif entry and table is not None:
            table.append(entry.group(1))
    return tuple(tables["CPUs"]), tuple(tables["features"])


def _did_you_mean(name: str, known: tuple, sign: str = "") -> str:
    """' (did you mean +avx2?)' for the known names closest to `name`, ignoring case; or ''."""
    by_lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.7)
    return f" (did you mean {' or '.join(sign + by_lower[c] for c in close)}?)" if close else ""


def resolve_target(target) -> Target:
    if target is None:
        return Target.host()
    if isinstance(target, Target):
        return target
    return Target.from_string(target)


@lru_cache(maxsize=1)
def _host_fields() -> tuple:
    llvm = llvm_binding()
    feats = llvm.get_host_cpu_features().flatten()
    # keep only enabled features: shorter strings, and the same target text on equal machines
    enabled = ",".join(f for f in feats.split(",") if f.startswith("+"))
    return (llvm.get_process_triple(), llvm.get_host_cpu_name(), enabled, os.cpu_count() or 1)


@lru_cache(maxsize=256)
def _capabilities(triple: str, cpu: str, features: str, num_cores: int) -> caps.Capabilities:
    """A target naming this machine's triple and cpu gets the cache sizes Linux reports here;
    any other target the cpu table's."""
    host_triple, host_cpu = _host_fields()[:2]
    measured = _host_caches() if (triple, cpu) == (host_triple, host_cpu) else None
    return caps.derive(triple, cpu, features, num_cores, measured)


@lru_cache(maxsize=1)
def _host_caches() -> dict:
    return caps.read_host_caches()


@lru_cache(maxsize=256)
def _parse_target(text: str) -> tuple:
    return Target._from_string_uncached(text)._fields()


@lru_cache(maxsize=64)
def _shared_target_machine(target: Target):
    """One target machine per target (targets compare and hash by their string)."""
    return target.new_target_machine()
