"""Can this agent run that kernel? A minimal reading of compiler target strings, for the tracker.

The tracker may import only its own protocol and grpcio (it must not pull in the compiler and
llvmlite), so it reads the target strings of `compiler.target.Target` itself. They look like

    llvm -mtriple=x86_64-unknown-linux-gnu -mcpu=znver3 -mattr=+avx,+avx2,+fma -num-cores=2

and an agent describes itself in `DeviceInfo` (triple, cpu name, feature names without '+').

The check is deliberately conservative only where it can be exact:
- the architecture of the triples must match (aliases: arm64 = aarch64, amd64 = x86_64), and the
  operating system too when both triples name one (an ELF object does not load on macOS);
- every `+feature` of `-mattr` must be among the agent's features (`-feature`s are ignored);
- a specific `-mcpu` different from the agent's cpu is accepted only when `-mattr` is given: the
  target strings tunefarm writes for a host list every enabled feature, so the features decide.
  A cpu name with no `-mattr` implies features this module cannot enumerate (that table lives in
  LLVM), so it must then equal the agent's cpu.
A target without `-mtriple` means "the host of whoever compiled it", which the tracker cannot know:
it is accepted by every agent (the compiler itself always writes the triple).
"""

from __future__ import annotations

import functools
import shlex
from dataclasses import dataclass, field

_ARCH_ALIASES = {"arm64": "aarch64", "amd64": "x86_64", "x86-64": "x86_64", "i386": "i686",
                 "i486": "i686", "i586": "i686"}
_VENDORS = {"unknown", "pc", "apple", "nvidia", "ibm", "scei", "suse", "redhat", "w64", "none", ""}
_GENERIC_CPUS = {"", "generic", "native"}


class TargetParseError(ValueError):
    """A target string the tracker cannot read (the servicer answers INVALID_ARGUMENT)."""


def _arch(triple: str) -> str:
    a = triple.split("-")[0].lower()
    return _ARCH_ALIASES.get(a, a)


def _os(triple: str) -> str:
    """The operating system component of a triple ('' when it names none), without its version."""
    parts = triple.lower().split("-")[1:]
    if len(parts) >= 2 and parts[0] in _VENDORS:
        parts = parts[1:]
    elif len(parts) == 1 and parts[0] in _VENDORS:
        return ""
    if not parts:
        return ""
    return parts[0].rstrip("0123456789.")


@dataclass(frozen=True)
class TargetSpec:
    """What a target string requires of the machine that runs its kernels."""

    text: str
    triple: str = ""                       # "" = not given (host of the compiler)
    cpu: str = ""
    features: frozenset = field(default_factory=frozenset)   # required, without '+'
    has_mattr: bool = False

    @staticmethod
    @functools.lru_cache(maxsize=256)
    def parse(text: str) -> "TargetSpec":
        """Parsed once per distinct string: every request of a batch carries the same target and
        the parse runs under the tracker's state lock."""
        if not isinstance(text, str) or not text.strip():
            raise TargetParseError("empty target string; expected e.g. 'llvm -mtriple=x86_64-linux-gnu -mcpu=znver3'")
        try:
            parts = shlex.split(text)
        except ValueError as e:
            raise TargetParseError(f"unreadable target string {text!r}: {e}") from None
        if parts[0] != "llvm":
            raise TargetParseError(f"unknown target kind {parts[0]!r} in {text!r}: only 'llvm' (CPU) targets exist")
        opts = {}
        for p in parts[1:]:
            if not p.startswith("-") or "=" not in p:
                raise TargetParseError(f"malformed target option {p!r} in {text!r}; expected -key=value")
            k, v = p[1:].split("=", 1)
            opts[k] = v
        mattr = opts.get("mattr")
        feats = frozenset(f[1:] for f in (mattr or "").split(",") if f.startswith("+") and len(f) > 1)
        return TargetSpec(text, opts.get("mtriple", ""), opts.get("mcpu", ""), feats, mattr is not None)


@dataclass(frozen=True)
class DeviceSpec:
    """What an agent said it is in Hello.device (plain data: the state module knows no protobuf)."""

    triple: str
    cpu: str = ""
    features: frozenset = field(default_factory=frozenset)
    cores: int = 0
    memory_bytes: int = 0
    agent_version: str = ""
    hostname: str = ""

    @staticmethod
    def make(triple, cpu="", features=(), cores=0, memory_bytes=0, agent_version="", hostname="") -> "DeviceSpec":
        feats = frozenset(f.lstrip("+") for f in features if f and not f.startswith("-"))
        return DeviceSpec(triple, cpu, feats, int(cores), int(memory_bytes), agent_version, hostname)


def why_cannot_run(target: TargetSpec, device: DeviceSpec) -> str | None:
    """None when `device` can run kernels built for `target`, else the reason in a few words."""
    if not target.triple:
        return None
    if _arch(target.triple) != _arch(device.triple):
        return f"architecture {_arch(target.triple)} (target triple {target.triple}) but the agent is {device.triple}"
    t_os, d_os = _os(target.triple), _os(device.triple)
    if t_os and d_os and t_os != d_os:
        return f"operating system {t_os} (target triple {target.triple}) but the agent is {device.triple}"
    missing = sorted(target.features - device.features)
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        return f"cpu features the agent lacks: {shown}"
    if (target.cpu.lower() not in _GENERIC_CPUS and not target.has_mattr
            and target.cpu.lower() != device.cpu.lower()):
        return (f"cpu {target.cpu} with no -mattr (the features it implies are unknown to the tracker) "
                f"but the agent's cpu is {device.cpu or 'unknown'}")
    return None
