"""The target-string grammar, shared by the compiler and the farm's tracker.

    llvm -mtriple=x86_64-linux-gnu -mcpu=znver3 -mattr=+avx2,+fma -num-cores=2

A target string is what records, tasks and measurement requests carry, so the compiler (which
builds for it) and the tracker (which routes a request to an agent that can run it) must read it
the same way: this module is that one reading. It uses the standard library only, because the
tracker may not import llvmlite or numpy (`compiler/__init__.py` loads the names that need them
lazily, so importing this module does not pull them in).

It checks the grammar only: kind, `-key=value` options (each known, given once, non-empty), the
shape of `-mattr` entries and `-num-cores`. Whether LLVM knows the triple, cpu and features is
`compiler.target`'s business.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from functools import lru_cache

from .errors import TargetError

# the kind word of a target string -> the kind of device it describes (gpu targets come later)
KINDS = {"llvm": "cpu"}
OPTIONS = ("mtriple", "mcpu", "mattr", "num-cores")
EXAMPLE = "'llvm -mtriple=x86_64-linux-gnu -mcpu=znver3'"

_ARCH_ALIASES = {"arm64": "aarch64", "amd64": "x86_64", "x86-64": "x86_64", "i386": "i686",
                 "i486": "i686", "i586": "i686"}
_VENDORS = {"unknown", "pc", "apple", "nvidia", "ibm", "scei", "suse", "redhat", "w64", "none", ""}


@dataclass(frozen=True)
class TargetSpec:
    """What a target string says, option by option; nothing is filled in from the host.

    `triple` "" means no `-mtriple` (the host of whoever compiles), `cpu` "" no `-mcpu`,
    `mattr` "" no `-mattr`, `num_cores` None no `-num-cores`."""

    text: str
    kind: str = "llvm"
    triple: str = ""
    cpu: str = ""
    mattr: str = ""
    num_cores: int | None = None

    @staticmethod
    def parse(text: str) -> "TargetSpec":
        """Parse `text`; TargetError names what is wrong. Cached: a measuring agent and the
        tracker see the same string for every request of a task."""
        if not isinstance(text, str):
            raise TargetError(f"a target must be a string like {EXAMPLE}, got {type(text).__name__}")
        return _parse(text)

    @property
    def device_kind(self) -> str:
        return KINDS[self.kind]

    @property
    def has_mattr(self) -> bool:
        return bool(self.mattr)

    @property
    def features(self) -> frozenset:
        """The features `-mattr` enables (`+avx2` → `avx2`); disabled ones are not listed."""
        return enabled_features(self.mattr)


@lru_cache(maxsize=256)
def _parse(text: str) -> TargetSpec:
    if not text.strip():
        raise TargetError(f"empty target string; expected e.g. {EXAMPLE}")
    try:
        parts = shlex.split(text)
    except ValueError as e:
        raise TargetError(f"unreadable target string {text!r}: {e}") from None
    kind = parts[0]
    if kind not in KINDS:
        raise TargetError(f"unknown target kind {kind!r}: only {', '.join(map(repr, KINDS))} (CPU) targets "
                          f"are supported")
    opts: dict[str, str] = {}
    for p in parts[1:]:
        if not p.startswith("-") or "=" not in p:
            raise TargetError(f"malformed target option {p!r}; expected -key=value")
        k, v = p[1:].split("=", 1)
        if k not in OPTIONS:
            raise TargetError(f"unknown target option -{k}; known: {', '.join('-' + o for o in OPTIONS)}")
        if k in opts:
            raise TargetError(f"target option -{k} is given twice ({opts[k]!r} and {v!r}); give it once")
        if not v:
            raise TargetError(f"target option -{k}= has no value: give one or leave the option out")
        opts[k] = v
    if "mtriple" not in opts and ("mcpu" in opts or "mattr" in opts):
        raise TargetError("-mcpu/-mattr without -mtriple: give the triple too")
    feature_names(opts.get("mattr", ""))
    return TargetSpec(text, kind, opts.get("mtriple", ""), opts.get("mcpu", ""), opts.get("mattr", ""),
                      _num_cores(opts["num-cores"]) if "num-cores" in opts else None)


def _num_cores(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise TargetError(f"-num-cores must be an integer, got {value!r}") from None
    if n < 1:
        raise TargetError("-num-cores must be at least 1")
    return n


def format_target(triple: str, cpu: str, features: str, num_cores: int) -> str:
    """The canonical text of a fully specified target (what records store)."""
    s = f"llvm -mtriple={triple} -mcpu={cpu}"
    if features:
        s += f" -mattr={features}"
    return s + f" -num-cores={num_cores}"


def feature_names(features: str) -> tuple:
    """The names in an -mattr list ('+avx2,-fma' → ('avx2', 'fma')), checked for shape.

    Checked before LLVM sees them: it reads a name without a sign as enabled while the runnable
    check and the tracker only read `+name`, and LLVM builds with assertions abort the process on
    such an entry. `+help` makes LLVM print its tables instead of naming a feature.
    """
    if not features:
        return ()
    names = []
    for item in features.split(","):
        if not item:
            raise TargetError(f"-mattr={features} has an empty entry; separate features by single commas, "
                              f"e.g. -mattr=+avx2,+fma")
        if item[0] not in "+-":
            raise TargetError(f"-mattr entry {item!r} needs a sign: +{item} to enable it or -{item} to disable it")
        if len(item) == 1:
            raise TargetError(f"-mattr entry {item!r} names no feature; e.g. -mattr=+avx2,+fma")
        if item[1:] in ("help", "cpuhelp"):
            raise TargetError(f"-mattr entry {item!r} asks LLVM for its help text, it is not a feature")
        names.append(item[1:])
    return tuple(names)


def enabled_features(features: str) -> frozenset:
    """Names an -mattr list enables ('+avx2,-fma' → {'avx2'})."""
    return frozenset(f[1:] for f in features.split(",") if f.startswith("+") and len(f) > 1)


def disabled_features(features: str) -> frozenset:
    """Names an -mattr list disables ('+avx2,-fma' → {'fma'})."""
    return frozenset(f[1:] for f in features.split(",") if f.startswith("-") and len(f) > 1)


def arch_of(triple: str) -> str:
    """The architecture of a triple, aliases folded ('arm64-apple-darwin' → 'aarch64')."""
    a = triple.split("-")[0].lower()
    return _ARCH_ALIASES.get(a, a)


def os_of(triple: str) -> str:
    """The operating system component of a triple ('' when it names none), without its version."""
    parts = triple.lower().split("-")[1:]
    if len(parts) >= 2 and parts[0] in _VENDORS:
        parts = parts[1:]
    elif len(parts) == 1 and parts[0] in _VENDORS:
        return ""
    if not parts:
        return ""
    return parts[0].rstrip("0123456789.")


__all__ = ["TargetSpec", "KINDS", "OPTIONS", "EXAMPLE", "format_target", "feature_names", "enabled_features",
           "disabled_features", "arch_of", "os_of"]
