"""export_library: kernels linked into a shared library with a C header, called from a C program."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

import numpy as np
import pytest

import compiler as C
from compiler.errors import ExportError
from compiler.export import C_TYPES, header_text

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a system C compiler")

M, K, N = 37, 29, 45          # nothing divides the split factors: tails everywhere
R, S = 5, 19


def _matmul_kernel():
    A = C.placeholder((M, K), "float32", "A")
    B = C.placeholder((K, N), "float32", "B")
    k = C.reduce_axis(K, "k")
    out = C.compute((M, N), lambda i, j: C.sum(A[i, k] * B[k, j], axis=k), name="Cmat")
    s = C.create_schedule(out)
    st = s[out]
    i, j, kk = st.root_iter_vars
    io, ii = st.split(i, factor=8)
    jo, ji = st.split(j, factor=8)
    st.reorder(io, jo, kk, ii, ji)
    st.parallel(io)
    st.vectorize(ji)
    return C.build(s, [A, B, out], name="tf_matmul")


def _elementwise_kernel():
    X = C.placeholder((R, S), "float32", "X")
    Nn = C.placeholder((R, S), "int32", "double")   # a tensor named like a C keyword
    out = C.compute((R, S), lambda i, j: C.exp(X[i, j]).astype("float64") * 0.5 + Nn[i, j].astype("float64"),
                    name="D")
    s = C.create_schedule(out)
    jo, ji = s[out].split(s[out].root_iter_vars[1], factor=8)
    s[out].vectorize(ji)
    return C.build(s, [X, Nn, out], name="tf_expadd")


@pytest.fixture(scope="module")
def kernels():
    return _matmul_kernel(), _elementwise_kernel()


@pytest.fixture(scope="module")
def exported(kernels, tmp_path_factory):
    d = tmp_path_factory.mktemp("export")
    res = C.export_library(list(kernels), d / "libtfk.so")
    return d, res


def _inputs():
    """The same deterministic, exactly representable inputs the C program makes."""
    a = ((np.arange(M * K) * 37) % 101 - 50).astype(np.float32).reshape(M, K) / np.float32(64)
    b = ((np.arange(K * N) * 53) % 97 - 48).astype(np.float32).reshape(K, N) / np.float32(32)
    x = ((np.arange(R * S) * 13) % 41 - 20).astype(np.float32).reshape(R, S) / np.float32(8)
    n = ((np.arange(R * S) * 7) % 23 - 11).astype(np.int32).reshape(R, S)
    return a, b, x, n


C_PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include "libtfk.h"

int main(void) {
    static float A[%(M)d * %(K)d], B[%(K)d * %(N)d], Cm[%(M)d * %(N)d];
    static float X[%(R)d * %(S)d];
    static int32_t Nn[%(R)d * %(S)d];
    static double D[%(R)d * %(S)d];
    int64_t err[2] = {0, 0};   /* the error record; NULL is fine too */
    for (int i = 0; i < %(M)d * %(K)d; i++) A[i] = (float)((i * 37) %% 101 - 50) / 64.0f;
    for (int i = 0; i < %(K)d * %(N)d; i++) B[i] = (float)((i * 53) %% 97 - 48) / 32.0f;
    for (int i = 0; i < %(R)d * %(S)d; i++) X[i] = (float)((i * 13) %% 41 - 20) / 8.0f;
    for (int i = 0; i < %(R)d * %(S)d; i++) Nn[i] = (i * 7) %% 23 - 11;
    for (int i = 0; i < %(M)d * %(N)d; i++) Cm[i] = 1e30f;   /* poison */
    for (int i = 0; i < %(R)d * %(S)d; i++) D[i] = 1e300;
    if (tf_matmul(A, B, Cm, NULL) != 0) return 3;
    if (tf_expadd(X, Nn, D, err) != 0) return 4;
    for (int i = 0; i < %(M)d * %(N)d; i++) printf("%%.9g\n", Cm[i]);
    for (int i = 0; i < %(R)d * %(S)d; i++) printf("%%.17g\n", D[i]);
    return 0;
}
""" % dict(M=M, K=K, N=N, R=R, S=S)


def test_c_program_calls_exported_kernels(exported):
    d, res = exported
    assert res.library.exists() and res.header == d / "libtfk.h"
    assert res.symbols == ("tf_matmul", "tf_expadd")
    (d / "prog.c").write_text(C_PROGRAM)
    exe = d / "prog"
    subprocess.run(["cc", "-std=c99", "-Wall", "-Werror", "-o", str(exe), str(d / "prog.c"),
                    f"-I{d}", f"-L{d}", "-ltfk", f"-Wl,-rpath,{d}"], check=True, capture_output=True, text=True)
    for threads in ("1", "2"):
        env = dict(os.environ, OMP_NUM_THREADS=threads)
        proc = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr
        vals = np.array([float(v) for v in proc.stdout.split()])
        assert vals.size == M * N + R * S
        a, b, x, n = _inputs()
        ref_c = a.astype(np.float64) @ b.astype(np.float64)
        np.testing.assert_allclose(vals[:M * N].reshape(M, N), ref_c, rtol=1e-5, atol=1e-4)
        ref_d = np.exp(x.astype(np.float64)) * 0.5 + n
        np.testing.assert_allclose(vals[M * N:].reshape(R, S), ref_d, rtol=1e-5)


def test_header_declarations(exported, kernels):
    d, res = exported
    text = res.header.read_text()
    assert "#include <stdint.h>" in text
    # inputs are const, outputs are not; a comment gives every argument's dtype and shape
    assert "const float* A," in text and "const float* B," in text and "float* Cmat" in text
    assert "const float* Cmat" not in text
    assert f"A: float32[{M}, {K}] (input)" in text
    assert f"Cmat: float32[{M}, {N}] (output)" in text
    assert "const int32_t* double_" in text and "double* D" in text
    assert f"double: int32[{R}, {S}]" in text
    assert text.count("int32_t tf_matmul(") == 1 and text.count("int32_t tf_expadd(") == 1
    assert header_text(list(kernels), "libtfk.h") == text


@pytest.mark.parametrize("std", ["c99", "c11"])
def test_header_compiles_cleanly(exported, std):
    d, res = exported
    src = d / f"only_header_{std}.c"
    src.write_text('#include "libtfk.h"\n#include "libtfk.h"\nint use(void) { return (int)sizeof(&tf_matmul); }\n')
    proc = subprocess.run(["cc", f"-std={std}", "-Wall", "-Wextra", "-Werror", "-pedantic", "-c",
                           "-o", str(d / f"h_{std}.o"), str(src), f"-I{d}"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_header_compiles_as_cpp(exported):
    d, res = exported
    src = d / "use.cpp"
    src.write_text('#include "libtfk.h"\nint use() { return tf_expadd(nullptr, nullptr, nullptr, nullptr); }\n')
    proc = subprocess.run(["c++", "-Wall", "-Werror", "-c", "-o", str(d / "use.o"), str(src), f"-I{d}"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_library_loads_with_ctypes(exported):
    import ctypes
    d, res = exported
    lib = ctypes.CDLL(str(res.library))
    x = np.linspace(-3, 3, R * S, dtype=np.float32).reshape(R, S)
    n = np.arange(R * S, dtype=np.int32).reshape(R, S)
    out = np.full((R, S), np.nan)
    f = lib.tf_expadd
    f.restype = ctypes.c_int32
    assert f(x.ctypes.data_as(ctypes.c_void_p), n.ctypes.data_as(ctypes.c_void_p),
             out.ctypes.data_as(ctypes.c_void_p)) == 0
    np.testing.assert_allclose(out, np.exp(x.astype(np.float64)) * 0.5 + n, rtol=1e-5)


def test_argument_names_that_are_c_type_names(tmp_path):
    X = C.placeholder((4,), "int32", "int32_t")
    Y = C.placeholder((4,), "float32", "float")
    Z = C.compute((4,), lambda i: X[i].astype("float32") + Y[i], name="uint8_t")
    k = C.build(C.create_schedule(Z), [X, Y, Z], name="tf_names")
    res = C.export_library(k, tmp_path / "libnames.so")
    text = res.header.read_text()
    assert "const int32_t* int32_t_," in text and "const float* float_," in text and "float* uint8_t_" in text
    (tmp_path / "u.c").write_text('#include "libnames.h"\nint f(void) { return tf_names(0, 0, 0, 0); }\n')
    proc = subprocess.run(["cc", "-Wall", "-Werror", "-c", "-o", str(tmp_path / "u.o"), str(tmp_path / "u.c"),
                           f"-I{tmp_path}"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_c_types_cover_every_dtype():
    from compiler.dtypes import ALL_DTYPES
    assert set(C_TYPES) == set(ALL_DTYPES)
    assert C_TYPES["bool"] == "uint8_t" and C_TYPES["int8"] == "int8_t" and C_TYPES["float64"] == "double"


# ----------------------------------------------------------------------------- errors

def _tiny(name):
    X = C.placeholder((8,), "float32", "X")
    Y = C.compute((8,), lambda i: X[i] + 1.0, name="Y")
    return C.build(C.create_schedule(Y), [X, Y], name=name)


@pytest.fixture(scope="module")
def tiny():
    return _tiny("tf_tiny")


def test_duplicate_names_rejected(tiny, tmp_path):
    with pytest.raises(ExportError, match="two kernels are named 'tf_tiny'"):
        C.export_library([tiny, tiny], tmp_path / "lib.so")
    assert not (tmp_path / "lib.so").exists()


def test_reserved_names_rejected(tmp_path):
    k = _tiny("main")   # build's default name would clash with the C program's main
    with pytest.raises(ExportError, match="main"):
        C.export_library([k], tmp_path / "lib.so")
    k.name = "int"
    with pytest.raises(ExportError, match="keyword"):
        C.export_library([k], tmp_path / "lib.so")


def test_missing_compiler(tiny, tmp_path):
    with pytest.raises(ExportError, match="not found"):
        C.export_library([tiny], tmp_path / "lib.so", cc="no-such-cc-tf")


def test_link_failure_is_typed_and_leaves_nothing(tiny, tmp_path):
    from compiler.runtime import Kernel
    bad = Kernel("tf_bad", b"\x7fELF garbage", tiny.args, tiny.target, tiny.source)
    with pytest.raises(ExportError, match="linking the kernels failed"):
        C.export_library([bad], tmp_path / "lib.so")
    assert list(tmp_path.iterdir()) == []


def test_missing_output_directory(tiny, tmp_path):
    with pytest.raises(ExportError, match="does not exist"):
        C.export_library([tiny], tmp_path / "nope" / "lib.so")


def test_no_header(tiny, tmp_path):
    res = C.export_library(tiny, tmp_path / "libone.so", header_path=False)
    assert res.header is None and [p.name for p in tmp_path.iterdir()] == ["libone.so"]


@pytest.fixture(scope="module")
def arm_kernel():
    X = C.placeholder((16,), "float32", "X")
    Y = C.compute((16,), lambda i: X[i] * 2.0, name="Y")
    s = C.create_schedule(Y)
    s[Y].vectorize(s[Y].split(s[Y].root_iter_vars[0], factor=4)[1])
    return C.build(s, [X, Y], target=C.Target.from_string("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"),
                   name="tf_arm")


def test_cross_target_needs_cross_compiler(arm_kernel, tiny, tmp_path):
    if C.Target.host().arch == "aarch64":
        pytest.skip("the host is aarch64")
    with pytest.raises(ExportError, match="cross compiler"):
        C.export_library([arm_kernel], tmp_path / "lib.so")
    with pytest.raises(ExportError, match="different targets"):
        C.export_library([arm_kernel, tiny], tmp_path / "lib.so", cc="aarch64-linux-gnu-gcc")


def test_cross_compiler_is_used(arm_kernel, tmp_path):
    """A stand-in cross compiler records its command line and writes the -o file."""
    log = tmp_path / "argv.txt"
    fake = tmp_path / "fake-aarch64-gcc"
    fake.write_text(f"""#!{sys.executable}
import sys
open({str(log)!r}, "w").write("\\n".join(sys.argv[1:]))
out = sys.argv[sys.argv.index("-o") + 1]
objs = [a for a in sys.argv[1:] if a.endswith(".o")]
open(out, "wb").write(b"".join(open(o, "rb").read() for o in objs))
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    res = C.export_library([arm_kernel], out_dir / "libarm.so", cc=str(fake))
    argv = log.read_text().split("\n")
    assert "-shared" in argv and "-lgomp" in argv and "-lm" in argv
    data = res.library.read_bytes()
    assert data[:4] == b"\x7fELF" and int.from_bytes(data[18:20], "little") == 183  # EM_AARCH64
    assert "tf_arm(" in res.header.read_text() and "aarch64" in res.header.read_text()
