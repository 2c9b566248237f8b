"""Target strings: what is refused (and how it is explained), what is accepted, what it costs.

LLVM only warns about names it does not know and then builds for something else, so every
check here is about turning that silence into a TargetError that names the culprit.
"""

from __future__ import annotations

import pytest

import compiler as C
from compiler import target as target_mod
from compiler.errors import TargetError

X86 = "llvm -mtriple=x86_64-linux-gnu"
ARM = "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"


def _tiny_schedule():
    X = C.placeholder((4,), "float32", "X")
    Y = C.compute((4,), lambda i: X[i] * 2.0, name="Y")
    return C.create_schedule(Y), [X, Y]


@pytest.fixture
def probes(monkeypatch):
    """The list of (triple, cpu, features) probe processes started while the test runs."""
    started, real = [], target_mod._run_probe

    def counting(triple, cpu, features):
        started.append((triple, cpu, features))
        return real(triple, cpu, features)

    monkeypatch.setattr(target_mod, "_run_probe", counting)
    return started


# ----------------------------------------------------------------------------- not a string

@pytest.mark.parametrize("value, kind", [(123, "int"), (1.5, "float"), (b"llvm", "bytes"), (["llvm"], "list")])
def test_non_string_targets_say_what_a_target_is(value, kind):
    expected = rf"a target must be a string like 'llvm -mtriple=\S+ -mcpu=\S+' or a Target, got {kind}$"
    with pytest.raises(TargetError, match=expected):
        C.Target.from_string(value)
    with pytest.raises(TargetError, match=expected):
        target_mod.resolve_target(value)


def test_build_with_a_non_string_target():
    s, args = _tiny_schedule()
    with pytest.raises(TargetError, match="got int"):
        C.build(s, args, target=123)


@pytest.mark.parametrize("text, message", [
    ("cuda", "unknown target kind 'cuda'"),
    ("opencl -device=mali", "unknown target kind 'opencl'"),
    ("", "empty target string"),
    (f"{X86} -mcpu=", "-mcpu= has no value"),
])
def test_bad_kinds_and_empty_values(text, message):
    with pytest.raises(TargetError, match=message):
        C.Target.from_string(text)


# ----------------------------------------------------------------------------- -mattr

@pytest.mark.parametrize("text, message", [
    (f"{X86} -mattr=+nonsense", r"unknown CPU feature '\+nonsense' in -mattr for x86_64-linux-gnu"),
    (f"{X86} -mcpu=haswell -mattr=+avx2,+avx3,+fma", r"'\+avx3' \(did you mean \+avx or \+avx2"),
    (f"{X86} -mattr=+AVX2", r"'\+AVX2' \(did you mean \+avx2"),
    (f"{X86} -mattr=-sse5,+fmaa", r"features '-sse5'.*'\+fmaa' \(did you mean \+fma"),
    (f"{ARM} -mattr=+neonn", r"'\+neonn' \(did you mean \+neon\?\) in -mattr for aarch64-linux-gnu"),
])
def test_unknown_features_are_named(text, message):
    with pytest.raises(TargetError, match=message):
        C.Target.from_string(text)


@pytest.mark.parametrize("mattr, message", [
    ("avx2", r"'avx2' needs a sign: \+avx2 to enable it or -avx2 to disable it"),
    ("+avx2,fma", r"'fma' needs a sign"),
    ("+avx2,,+fma", "has an empty entry"),
    ("+avx2,", "has an empty entry"),
    ("+", "names no feature"),
    ("", "-mattr= has no value"),
    ("+help", "help text, it is not a feature"),
])
def test_malformed_mattr(mattr, message):
    with pytest.raises(TargetError, match=message):
        C.Target.from_string(f"{X86} -mattr={mattr}")


def test_malformed_features_of_a_constructed_target_fail_before_llvm_sees_them():
    """LLVM builds with assertions abort the process on an unsigned feature."""
    host = C.Target.host()
    with pytest.raises(TargetError, match="needs a sign"):
        C.Target(host.triple, host.cpu, "avx2").target_machine()


@pytest.mark.parametrize("text", [
    f"{X86} -mattr=+avx2,+fma",
    f"{X86} -mcpu=haswell -mattr=+avx2,+fma",
    f"{X86} -mcpu=haswell -mattr=+avx2,-avx512f",
    f"{ARM} -mattr=+neon,+crc",
])
def test_valid_features_are_accepted_and_kept(text):
    t = C.Target.from_string(text)
    assert t.features == text.split("-mattr=")[1]
    assert C.Target.from_string(str(t)) == t


# ----------------------------------------------------------------------------- cpus

def test_unknown_cpu_suggests_close_names():
    with pytest.raises(TargetError, match=r"unknown cpu 'znver' for triple x86_64-linux-gnu \(did you mean znver"):
        C.Target.from_string(f"{X86} -mcpu=znver")


def test_host_cpu_name_on_another_architecture_is_checked():
    if C.Target.host().cpu == "generic":
        pytest.skip("LLVM does not name this host's cpu")
    with pytest.raises(TargetError, match="unknown cpu"):
        C.Target.from_string(f"llvm -mtriple={_other_arch_triple()} -mcpu={C.Target.host().cpu}")


def test_a_cpu_llvm_would_abort_on_is_an_error():
    """x86_64 code for a 32-bit cpu is a fatal error inside LLVM; the probe turns it into a message."""
    with pytest.raises(TargetError, match="LLVM cannot build for x86_64-linux-gnu with -mcpu=i386 .*64-bit"):
        C.Target.from_string(f"{X86} -mcpu=i386")


def _other_arch_triple() -> str:
    return "x86_64-linux-gnu" if C.Target.host().arch == "aarch64" else "aarch64-linux-gnu"


# ----------------------------------------------------------------------------- what it costs

def test_host_string_round_trips_without_a_probe(probes):
    host = C.Target.host()
    some = ",".join(host.features.split(",")[:2])
    texts = [str(host), "llvm", f"llvm -mtriple={host.triple} -mcpu={host.cpu} -mattr={some}"]
    texts += [f"llvm -mtriple={host.triple} -mcpu={host.cpu} -mattr={host.features} -num-cores={n}"
              for n in range(1, 50)]
    for text in texts:
        assert C.Target.from_string(str(C.Target.from_string(text))) == C.Target.from_string(text)
    assert C.Target.from_string(str(host)) == host
    assert probes == []


def test_probe_runs_once_per_cpu_and_features(probes):
    target_mod._probe.cache_clear()
    base = "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a53 -mattr=+neon,+crc"
    for n in range(1, 20):                       # distinct strings: the parse cache does not help
        C.Target.from_string(f"{base} -num-cores={n}").new_target_machine()
    assert probes == [("aarch64-linux-gnu", "cortex-a53", "+neon,+crc")]


def test_rejections_are_cached_too(probes):
    target_mod._probe.cache_clear()
    text = f"{X86} -mcpu=haswell -mattr=+avx2,+notafeature"
    for _ in range(3):
        with pytest.raises(TargetError, match="notafeature"):
            C.Target.from_string(text)
    assert [p for p in probes if p[2] != "+help"] == [("x86_64-linux-gnu", "haswell", "+avx2,+notafeature")]
