"""Targets as data: one target-string grammar for the compiler and the tracker, capabilities
(vector lanes, registers, FMA pipes, cores, caches) from a cpu table or the host, and candidates
of every kind sized by the capabilities of the task's target — not the host's, not AVX2's.

Cross targets are built (aarch64 objects are ELF machine 183); kernels are run and checked
against numpy only where the host can run them (asked of `Target.host()`, never assumed).
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import compiler as C
from compiler import capabilities as caps_mod
from compiler.cpu_table import CPUS, GENERIC
from compiler.errors import TargetError
from compiler.lower import lower
from compiler.ops import default_schedule, get_op, random_inputs
from compiler.target_string import TargetSpec, arch_of, os_of
from rpc_tracker import state as st
from rpc_tracker import targets as tracker_targets
from tuner.features import extract_features, feature_names
from tuner.space import SketchSpace, TemplateSpace, instantiate

ROOT = Path(__file__).resolve().parents[1]
NEON = "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1 -num-cores=4"
AVX512 = "llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512 -num-cores=2"
AVX2 = "llvm -mtriple=x86_64-linux-gnu -mcpu=haswell -num-cores=2"
EM_AARCH64 = 183


def caps(text):
    return C.Target.from_string(text).capabilities


def host_runs(target) -> bool:
    """Can this machine run kernels built for `target`? (The runtime's own check.)"""
    from compiler.kernel_format import check_runnable
    try:
        check_runnable(target)
    except C.KernelLoadError:
        return False
    return True


def vector_loops(text: str) -> list:
    return [int(n) for n in re.findall(r"vectorized for \(\S+, 0, (\d+)\)", text)]


def unrolled_loops(text: str) -> list:
    return [int(n) for n in re.findall(r"unrolled for \(\S+, 0, (\d+)\)", text)]


def build_and_check(schedule, opdef, target):
    """Build for `target`; an aarch64 object must be ELF for aarch64; where the host can run the
    kernel, its result must match the numpy reference."""
    kernel = C.build(schedule, opdef.tensors, target)
    obj = kernel.object_code
    if target.arch == "aarch64":
        assert obj[:4] == b"\x7fELF" and struct.unpack_from("<H", obj, 18)[0] == EM_AARCH64
    if host_runs(target):
        arrays = random_inputs(opdef, np.random.default_rng(0))
        out = np.full(opdef.output.shape, np.nan, opdef.output.dtype)
        kernel(*arrays, out)
        np.testing.assert_allclose(out, opdef.reference(*arrays), rtol=2e-4, atol=2e-4)
    return kernel


# ----------------------------------------------------------------------------- the capability table

@pytest.mark.parametrize("text, bits, regs, f32, f64, i8, fmas, l1d", [
    (NEON, 128, 32, 4, 2, 16, 2.0, 64 << 10),
    (AVX512, 512, 32, 16, 8, 64, 2.0, 32 << 10),
    (AVX2, 256, 16, 8, 4, 32, 2.0, 32 << 10),
    ("llvm -mtriple=x86_64-linux-gnu -mcpu=znver4", 512, 32, 16, 8, 64, 1.0, 32 << 10),  # 2 x 256-bit pipes
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a53", 128, 32, 4, 2, 16, 0.5, 32 << 10),  # 64-bit pipe
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=apple-m1", 128, 32, 4, 2, 16, 4.0, 128 << 10),
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-v1", 128, 32, 4, 2, 16, 4.0, 64 << 10),  # SVE: NEON-width code
    ("llvm -mtriple=x86_64-linux-gnu -mcpu=generic", 128, 16, 4, 2, 16, 2.0, 32 << 10),   # SSE2
])
def test_capabilities_of_named_cpus(text, bits, regs, f32, f64, i8, fmas, l1d):
    c = caps(text)
    assert c.kind == "cpu" and c.vector_bits == bits and c.vector_registers == regs
    assert (c.vector_lanes("float32"), c.vector_lanes("float64"), c.vector_lanes("int8")) == (f32, f64, i8)
    assert c.vector_lanes("bool") == c.vector_lanes("int8")
    assert c.fmas_per_cycle == fmas and c.l1d == l1d
    assert c.accumulator_registers == regs - caps_mod.OPERAND_REGISTERS
    assert C.Target.from_string(text).vector_lanes("float32") == f32


def test_cores_come_from_the_target_string():
    assert caps(NEON).cores == 4 and caps(AVX512).cores == 2


@pytest.mark.parametrize("mattr, bits, int_bits, regs", [
    ("-avx512f", 256, 256, 16),           # AVX2 left
    ("-avx2", 256, 128, 16),              # AVX only (no 256-bit integers); avx512f needs avx2
    ("-avx", 128, 128, 16),               # takes avx2, fma and avx512f with it
])
def test_mattr_changes_what_the_cpu_implies(mattr, bits, int_bits, regs):
    c = caps(f"llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512 -mattr={mattr}")
    assert (c.vector_bits, c.int_vector_bits, c.vector_registers) == (bits, int_bits, regs)


def test_mattr_adds_to_a_generic_cpu():
    c = caps("llvm -mtriple=x86_64-linux-gnu -mattr=+avx512f")
    assert (c.vector_bits, c.vector_registers) == (512, 32)
    t = C.Target.from_string("llvm -mtriple=x86_64-linux-gnu -mattr=+avx512f")
    assert t.has_feature("avx2") and t.has_feature("fma")   # what avx512f requires


def test_unknown_or_foreign_cpu_names_use_the_architecture_defaults():
    assert caps_mod.derive("aarch64-linux-gnu", "cortex-x9000", "", 1).l1d == GENERIC["aarch64"].l1d
    foreign = caps_mod.derive("aarch64-linux-gnu", "haswell", "", 1)   # an x86 name on aarch64
    assert (foreign.vector_bits, foreign.vector_registers) == (128, 32)
    riscv = caps_mod.derive("riscv64-linux-gnu", "generic", "", 1)
    assert riscv.vector_bits == 128 and riscv.vector_lanes("float32") == 4


def test_every_table_cpu_is_known_to_llvm_and_consistent():
    """A typo in the table would silently give a cpu the generic numbers."""
    triples = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}
    for name, info in CPUS.items():
        t = C.Target.from_string(f"llvm -mtriple={triples[info.arch]} -mcpu={name}")
        assert t.capabilities.fma_units == info.fma_units and t.capabilities.l2 == info.l2
        if info.arch == "x86_64":
            assert t.has_feature("avx2") and t.capabilities.vector_bits >= 256
        assert info.l1d <= info.l2 and (info.l3 == 0 or info.l2 <= info.l3)


# ----------------------------------------------------------------------------- host detection

def _fake_cache(root: Path, entries):
    for i, (level, kind, size) in enumerate(entries):
        d = root / f"index{i}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")


def test_host_caches_are_read_from_sysfs(tmp_path):
    _fake_cache(tmp_path, [(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2048K"),
                           (3, "Unified", "105M")])
    assert caps_mod.read_host_caches(tmp_path) == {1: 48 << 10, 2: 2 << 20, 3: 105 << 20}
    (tmp_path / "index2" / "size").write_text("garbage\n")       # an unreadable level is skipped
    assert caps_mod.read_host_caches(tmp_path) == {1: 48 << 10, 3: 105 << 20}
    assert caps_mod.read_host_caches(tmp_path / "missing") == {}
    derived = caps_mod.derive("x86_64-linux-gnu", "haswell", "", 2, {1: 48 << 10})
    assert derived.l1d == 48 << 10 and derived.l2 == CPUS["haswell"].l2   # measured levels win


def test_host_capabilities_come_from_llvm_sysfs_and_cpu_count():
    host = C.Target.host()
    c = host.capabilities
    assert c.cores == host.num_cores == (os.cpu_count() or 1)
    measured = caps_mod.read_host_caches()
    if 1 in measured:
        assert c.l1d == measured[1]
    if host.arch == "x86_64":
        expected = 512 if host.has_feature("avx512f") else 256 if host.has_feature("avx") else 128
        assert c.vector_bits == expected
        assert c.vector_registers == (32 if host.has_feature("avx512f") else 16)
    # the host's cpu named in a target string is the same machine model: measured caches too
    named = C.Target.from_string(f"llvm -mtriple={host.triple} -mcpu={host.cpu}")
    assert named.capabilities.l1d == c.l1d


# ----------------------------------------------------------------------------- one grammar

@pytest.mark.parametrize("text, message", [
    ("cuda -arch=sm_80", "unknown target kind 'cuda'"),
    ("llvm -bogus=1", "unknown target option -bogus"),
    ("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell -mcpu=znver3", "-mcpu is given twice"),
    ("llvm -mtriple='x86_64-linux-gnu", "unreadable target string"),
    ("llvm -mcpu=znver3", "without -mtriple"),
    ("llvm -num-cores=two", "-num-cores must be an integer"),
    ("llvm -mtriple=x86_64-linux-gnu -mattr=avx2", "needs a sign"),
    ("llvm mtriple=x86_64-linux-gnu", "expected -key=value"),
])
def test_compiler_and_tracker_refuse_the_same_strings_the_same_way(text, message):
    with pytest.raises(TargetError, match=message):
        C.Target.from_string(text)
    with pytest.raises(TargetError, match=message):
        TargetSpec.parse(text)
    state = st.TrackerState(unknown_key_grace=30.0)
    with pytest.raises(st.InvalidRequest, match=message):
        state.submit("k", 0, [st.Submission("r1", text, 1.0, payload=b"")])


def test_the_tracker_reads_targets_with_the_compilers_module():
    assert tracker_targets.TargetSpec is TargetSpec
    spec = TargetSpec.parse(str(C.Target.from_string(NEON)))
    assert (spec.triple, spec.cpu, spec.num_cores, spec.device_kind) == ("aarch64-linux-gnu", "neoverse-n1", 4, "cpu")
    arm = tracker_targets.DeviceSpec.make("arm64-unknown-linux-gnu", "neoverse-n1", ["neon"])
    assert tracker_targets.why_cannot_run(spec, arm) is None
    assert (arch_of("arm64-apple-darwin23"), os_of("arm64-apple-darwin23")) == ("aarch64", "darwin")
    assert C.Target.from_string(NEON).arch == arch_of("aarch64-linux-gnu")
    with pytest.raises(TargetError, match="must be a string like .*, got NoneType"):
        TargetSpec.parse(None)


def test_the_tracker_and_target_strings_import_no_llvmlite_or_numpy():
    code = ("import sys\n"
            "import compiler.target_string, rpc_tracker.targets, rpc_tracker.state, rpc_tracker.server\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('llvmlite', 'numpy'))\n"
            "assert not heavy, heavy\n"
            "import compiler as C\n"
            "assert callable(C.lower) and C.build.__module__ == 'compiler.runtime'\n"
            "assert 'llvmlite' in sys.modules and 'build' in dir(C)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_lazy_names_still_import_like_before():
    import compiler.lower  # noqa: F401 - the submodule shares the function's name
    from compiler import Kernel, TimingResult, build, export_library, load_kernel, set_num_threads  # noqa: F401
    assert callable(C.lower) and C.Kernel is Kernel
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        C.nonsense  # noqa: B018


# ----------------------------------------------------------------------------- candidates per target

@pytest.fixture(scope="module")
def mm():
    return get_op("matmul", M=64, N=64, K=64)


@pytest.fixture(scope="module")
def conv():
    return get_op("conv2d_nchw", N=1, C=16, H=16, W=32, F=32, KH=3, KW=3, padding=1)


@pytest.mark.parametrize("text, nr", [(NEON, 16), (AVX512, 64), (AVX2, 16)])
def test_default_gemm_register_tile_follows_the_register_file(mm, text, nr):
    """6 rows x 4 vectors with 32 registers (NEON: 4 lanes, AVX-512: 16), 6 x 2 with AVX2's 16."""
    target = C.Target.from_string(text)
    ir = str(lower(default_schedule(mm, target), mm.tensors))
    assert set(vector_loops(ir)) == {nr} and 6 in unrolled_loops(ir)
    build_and_check(default_schedule(mm, target), mm, target)


@pytest.mark.parametrize("text", [NEON, AVX512, AVX2])
def test_default_conv_tile_fills_the_targets_registers(conv, text):
    target = C.Target.from_string(text)
    c = target.capabilities
    ir = str(lower(default_schedule(conv, target), conv.tensors))
    lanes = max(4, c.vector_lanes("float32"))
    vec = vector_loops(ir)
    assert 2 * lanes in vec or lanes in vec              # one or two whole registers of this target
    # the accumulator tile: unrolled channels x rows x vector registers
    acc = re.search(r"allocate conv2d_nchw_local\[float32 \* (\d+)x(\d+)x(\d+)x(\d+)\]", ir)
    n_acc = int(acc.group(2)) * int(acc.group(3)) * -(-int(acc.group(4)) // lanes)
    assert n_acc <= c.accumulator_registers
    assert (n_acc > 12) == (c.vector_registers == 32)    # 32 registers allow more than AVX2's 12
    build_and_check(default_schedule(conv, target), conv, target)


def test_default_elementwise_vectors_follow_the_lanes():
    relu = get_op("relu", shape=(64, 256))
    for text, lanes in [(NEON, 4), (AVX512, 16), (AVX2, 8)]:
        target = C.Target.from_string(text)
        assert vector_loops(str(lower(default_schedule(relu, target), relu.tensors))) == [2 * lanes]


@pytest.mark.parametrize("text, nr", [(NEON, 16), (AVX512, 64)])
def test_gemm_template_default_is_the_targets_default_schedule(mm, text, nr):
    target = C.Target.from_string(text)
    space = TemplateSpace(mm, None, target)
    cand = space.default()
    assert cand.payload["knobs"]["tile_j"][-1] == nr and cand.payload["knobs"]["tile_i"][-1] == 6
    sched, _ = instantiate(mm, cand, target)
    assert sched.steps == default_schedule(mm, target).steps
    # the knob set does not depend on the target: a config of one target instantiates on another
    other = TemplateSpace(mm, None, C.Target.from_string(AVX2 if text == NEON else NEON))
    assert {len(k) for k in space.config_space.knobs.values()} == {len(k) for k in other.config_space.knobs.values()}
    rng = np.random.default_rng(1)
    for _ in range(3):
        c = space.sample(rng)
        build_and_check(instantiate(mm, c, target)[0], mm, target)


@pytest.mark.parametrize("text", [NEON, AVX512])
def test_conv_template_is_instantiated_for_the_tasks_target(text):
    # 4 input channels: too few for channel vectors on any target, so config 0 vectorizes columns
    conv = get_op("conv2d_nchw", N=1, C=4, H=16, W=32, F=32, KH=3, KW=3, padding=1)
    target = C.Target.from_string(text)
    space = TemplateSpace(conv, None, target)
    cand = space.default()
    lanes = target.vector_lanes("float32")
    assert cand.payload["knobs"]["tile_x"][-1] == 2 * lanes      # OW = 32: two whole registers
    sched, args = instantiate(conv, cand, target)
    assert 2 * lanes in vector_loops(str(lower(sched, args)))
    build_and_check(sched, conv, target)


@pytest.mark.parametrize("text", [NEON, AVX512])
def test_sketch_candidates_use_the_targets_lanes_and_registers(mm, text):
    target = C.Target.from_string(text)
    c = target.capabilities
    lanes = c.vector_lanes("float32")
    space = SketchSpace(mm, target)
    rng = np.random.default_rng(0)
    cands = [space.sample(rng) for _ in range(24)]
    lengths = set()
    for cand in cands:
        if "@" not in cand.payload["sketch"]:   # vectorized along the last axis, loads and stores alike
            lengths |= set(vector_loops(str(lower(*instantiate(mm, cand, target)))))
        else:   # vectorized along another axis: its micro-kernel tile, stored along rows of any width
            (vec,) = space.sketch(cand.payload["sketch"]).vec.values()
            (p,) = [p for p in cand.payload["params"].values() if "tile" in p]
            lengths |= {p["tile"][f"s{vec}"][2]} - {1}      # 1: not vectorized
    # the sampled vector lengths are whole registers of this target (or a whole 64-wide row)
    assert lengths and all(n % lanes == 0 or n == 64 for n in lengths)
    if lanes == 4:
        assert any(n % 16 for n in lengths)                      # lengths AVX-512 would not pick
    accs = [space._acc_regs(space.dag.names.index(name), p["tile"],
                            space.sketch(cand.payload["sketch"]).vec.get(space.dag.names.index(name)))
            for cand in cands for name, p in cand.payload["params"].items() if "tile" in p]
    # most register tiles are held to this target's accumulator registers (not AVX2's 12)
    assert sum(a <= c.accumulator_registers for a in accs) >= 0.6 * len(accs)
    assert any(12 < a <= c.accumulator_registers for a in accs)
    for cand in cands[:2]:
        build_and_check(instantiate(mm, cand, target)[0], mm, target)


def test_features_are_measured_against_the_targets_lanes(mm):
    func = lower(default_schedule(mm, C.Target.from_string(AVX2)), mm.tensors)
    names = feature_names()
    lanes = {text: extract_features(func, C.Target.from_string(text))[names.index("g_target_lanes")]
             for text in (NEON, AVX512)}
    assert lanes[NEON] == 4 and lanes[AVX512] == 16
    host = extract_features(func)      # no target: the host's, like everywhere in the compiler
    assert host[names.index("g_target_lanes")] == C.Target.host().vector_lanes("float32")


# ------------------------------------------------- byte-wide values: 64 lanes a register on AVX-512

@pytest.mark.parametrize("width", [128, 192, 200, 257])
@pytest.mark.parametrize("dtype", ["bool", "int8"])
def test_byte_values_get_whole_vectors_of_at_most_64_lanes(width, dtype):
    """One AVX-512 register holds 64 bytes: a default that vectorizes two registers of a byte
    value must split them (a bool attention mask of 128 columns refused to build at all)."""
    from compiler.ops.custom import custom_op
    a = C.placeholder((3, width), "int64", "a")
    b = C.placeholder((width,), "int64", "b")
    if dtype == "bool":
        out = C.compute((3, width), lambda i, j: a[i, j] > b[j], name="mask")
        def reference(x, y):
            return x > y
    else:
        out = C.compute((3, width), lambda i, j: (a[i, j] - b[j]).astype(dtype), name="narrow")
        def reference(x, y):
            return (x - y).astype(dtype)
    opdef = custom_op("byte_values", [a, b], out)
    for text in (AVX512, "llvm -mtriple=x86_64-linux-gnu -mcpu=znver4 -num-cores=2", AVX2):
        target = C.Target.from_string(text)
        kernel = C.build(default_schedule(opdef, target), opdef.tensors, target)
        if host_runs(target):
            rng = np.random.default_rng(width)
            x = rng.integers(-50, 50, (3, width)).astype(np.int64)
            y = rng.integers(-50, 50, width).astype(np.int64)
            res = np.empty((3, width), dtype)
            res.fill(1)
            kernel(x, y, res)
            np.testing.assert_array_equal(res, reference(x, y))
