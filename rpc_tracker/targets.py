"""Can this agent run that kernel? The tracker's reading of target strings.

Target strings are parsed by `compiler.target_string`, the grammar the compiler itself uses
(standard library only: the tracker may import its own protocol and grpcio, never llvmlite or
numpy), so a string the compiler would refuse is refused here too. They look like

    llvm -mtriple=x86_64-unknown-linux-gnu -mcpu=znver3 -mattr=+avx,+avx2,+fma -num-cores=2

and an agent describes itself in `DeviceInfo` (triple, cpu name, feature names without '+').

The check is deliberately conservative only where it can be exact:
- the architecture of the triples must match (aliases: arm64 = aarch64, amd64 = x86_64), and the
  operating system too when both triples name one (an ELF object does not load on macOS);
- every `+feature` of `-mattr` must be among the agent's features (`-feature`s are ignored);
- a specific `-mcpu` different from the agent's cpu is accepted only when `-mattr` is given: the
  target strings tunefarm writes for a host list every enabled feature, so the features decide.
  A cpu name with no `-mattr` implies features LLVM knows and the tracker does not (the
  compiler's cpu table lists only vector features), so it must then equal the agent's cpu.
A target without `-mtriple` means "the host of whoever compiled it", which the tracker cannot know:
it is accepted by every agent (the compiler itself always writes the triple).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from compiler.target_string import TargetSpec, arch_of, os_of

_GENERIC_CPUS = {"", "generic", "native"}


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
    emulated: bool = False          # runs under an instruction-set emulator (device_agent.host.is_emulated)
    llvmlite_version: str = ""

    @staticmethod
    def make(triple, cpu="", features=(), cores=0, memory_bytes=0, agent_version="", hostname="",
             emulated=False, llvmlite_version="") -> "DeviceSpec":
        feats = frozenset(f.lstrip("+") for f in features if f and not f.startswith("-"))
        return DeviceSpec(triple, cpu, feats, int(cores), int(memory_bytes), agent_version, hostname,
                          bool(emulated), llvmlite_version)


def why_cannot_run(target: TargetSpec, device: DeviceSpec) -> str | None:
    """None when `device` can run kernels built for `target`, else the reason in a few words."""
    if not target.triple:
        return None
    if arch_of(target.triple) != arch_of(device.triple):
        return f"architecture {arch_of(target.triple)} (target triple {target.triple}) but the agent is {device.triple}"
    t_os, d_os = os_of(target.triple), os_of(device.triple)
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


__all__ = ["TargetSpec", "DeviceSpec", "why_cannot_run"]
