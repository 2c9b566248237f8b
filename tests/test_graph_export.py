"""export_model: a whole model as one shared library with a C API, run from a C program compiled
here with the system `cc`, against numpy and the module's own run; bad requests as typed errors."""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import subprocess
import tempfile

import numpy as np
import pytest
from graph_models import assert_close, model, np_conv, np_softmax, rand
from onnx import helper

from compiler.errors import ExportError
from compiler.graph import build_model, export_model, from_onnx

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a system C compiler")

RNG = np.random.default_rng(23)
C_IN, C_OUT, H, CLASSES = 3, 4, 6, 10


def conv_relu_gemm():
    """Conv (+bias, padded) → Relu → Flatten → Gemm (transB, as torch's Linear) → Softmax, with
    the logits a second output; the input's name is not a C identifier."""
    p = {"w": rand(RNG, (C_OUT, C_IN, 3, 3)), "b": rand(RNG, (C_OUT,)),
         "wg": rand(RNG, (CLASSES, C_OUT * H * H)), "bg": rand(RNG, (CLASSES,))}
    n = helper.make_node
    nodes = [n("Conv", ["x:0", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             n("Relu", ["c"], ["r"]), n("Flatten", ["r"], ["f"]),
             n("Gemm", ["f", "wg", "bg"], ["logits"], transB=1), n("Softmax", ["logits"], ["prob"], axis=-1)]
    m = model(nodes, {"x:0": ((1, C_IN, H, H), "float32")},
              {"prob": (None, "float32"), "logits": (None, "float32")}, p)
    return m, p


def np_conv_relu_gemm(x, p):
    r = np.maximum(np_conv(x, p["w"], p["b"], pads=(1, 1, 1, 1)), 0)
    logits = r.reshape(1, -1) @ p["wg"].astype(np.float64).T + p["bg"]
    return np_softmax(logits, -1), logits


C_PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "convnet.h"

/* argv: input file (RUNS inputs), output file; runs the model on each input with two model
 * objects alternating, outputs poisoned (NaN bytes) before each run */
int main(int argc, char** argv) {
    enum { RUNS = 3 };
    static float x[RUNS][CONVNET_INPUT0_SIZE], prob[CONVNET_OUTPUT0_SIZE], logits[CONVNET_OUTPUT1_SIZE];
    if (argc != 3) return 2;
    FILE* in = fopen(argv[1], "rb");
    if (!in || fread(x, sizeof x, 1, in) != 1) return 3;
    fclose(in);
    convnet_model* models[2] = {convnet_create(), convnet_create()};
    if (!models[0] || !models[1]) return 4;
    FILE* out = fopen(argv[2], "wb");
    if (!out) return 5;
    for (int i = 0; i < RUNS; i++) {
        memset(prob, 0xFF, sizeof prob);
        memset(logits, 0xFF, sizeof logits);
        int32_t status = convnet_run(models[i % 2], x[i], prob, logits);
        if (status != 0) { fprintf(stderr, "status %d\n", (int)status); return 6; }
        fwrite(prob, sizeof prob, 1, out);
        fwrite(logits, sizeof logits, 1, out);
    }
    fclose(out);
    convnet_destroy(models[0]);
    convnet_destroy(models[1]);
    convnet_destroy(NULL);
    printf("%d runs\n", RUNS);
    return 0;
}
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    m, p = conv_relu_gemm()
    module = build_model(from_onnx(m))
    d = tmp_path_factory.mktemp("model_export")
    done = export_model(module, d / "libconvnet.so")
    return d, done, module, p


def _compile_and_run(d, inputs) -> list:
    src = d / "prog.c"
    src.write_text(C_PROGRAM)
    exe = d / "prog"
    subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", str(src), f"-I{d}", f"-L{d}", "-lconvnet",
                    f"-Wl,-rpath,{d}", "-o", str(exe)], check=True, capture_output=True, text=True)
    (d / "inputs.bin").write_bytes(np.stack(inputs).tobytes())
    proc = subprocess.run([str(exe), str(d / "inputs.bin"), str(d / "outputs.bin")], capture_output=True,
                          text=True, timeout=60, env={"OMP_NUM_THREADS": "2"})
    assert proc.returncode == 0, proc.stderr
    flat = np.frombuffer((d / "outputs.bin").read_bytes(), np.float32).reshape(len(inputs), -1)
    return [(row[:CLASSES].reshape(1, CLASSES), row[CLASSES:].reshape(1, CLASSES)) for row in flat]


def test_a_c_program_runs_the_exported_model(exported):
    d, done, module, p = exported
    assert done.library == d / "libconvnet.so" and done.header == d / "convnet.h" and done.name == "convnet"
    header = done.header.read_text()
    assert "int32_t convnet_run(convnet_model* model, const float* x_0, float* prob, float* logits);" in header
    assert "#define CONVNET_INPUT0_SIZE 108" in header
    inputs = [rand(RNG, (1, C_IN, H, H)) for _ in range(3)]
    for x, (prob, logits) in zip(inputs, _compile_and_run(d, inputs)):
        want_prob, want_logits = np_conv_relu_gemm(x, p)
        assert_close(prob, want_prob)
        assert_close(logits, want_logits)
        # the same kernels on the same buffers: the Python module's answer to the bit
        ours = module.run(**{"x:0": x})
        np.testing.assert_array_equal(prob, ours[0])
        np.testing.assert_array_equal(logits, ours[1])


def test_the_library_exports_only_the_api_and_embeds_the_weights(exported):
    _, done, _, p = exported
    if shutil.which("nm") is None:
        pytest.skip("needs nm")
    out = subprocess.run(["nm", "-D", "--defined-only", str(done.library)], capture_output=True, text=True,
                         check=True).stdout
    symbols = {line.split()[-1] for line in out.splitlines() if line.split()[1:2] == ["T"]}
    assert symbols == {"convnet_create", "convnet_run", "convnet_error", "convnet_destroy"}
    assert done.weight_bytes >= sum(a.nbytes for a in p.values())
    assert done.library.stat().st_size > done.weight_bytes


def test_a_graph_is_built_first_and_the_name_is_a_c_identifier(tmp_path):
    m, p = conv_relu_gemm()
    done = export_model(from_onnx(m), tmp_path / "libmy-net.v2.so")
    assert done.name == "my_net" and done.header == tmp_path / "my_net.h" and done.library.is_file()
    assert "my_net_create(void);" in done.header.read_text()


def _unwritable_dir(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    for candidate in (d, "/sys"):   # root writes anywhere its mode bits forbid; /sys refuses it
        try:
            with tempfile.NamedTemporaryFile(dir=candidate):
                pass
        except OSError:
            return candidate
    pytest.skip("no directory this user cannot write")


def test_bad_requests_are_export_errors_and_leave_nothing(tmp_path, exported):
    _, _, module, _ = exported
    with pytest.raises(ExportError, match="does not exist"):
        export_model(module, tmp_path / "missing" / "libm.so")
    ro = _unwritable_dir(tmp_path)
    with pytest.raises(ExportError, match="cannot write"):
        export_model(module, f"{ro}/libm.so")
    with pytest.raises(ExportError, match="takes a GraphModule or a Graph"):
        export_model("model.onnx", tmp_path / "libm.so")
    with pytest.raises(ExportError, match="already built"):
        export_model(module, tmp_path / "libm.so", records=object())
    with pytest.raises(ExportError, match="not found"):
        export_model(module, tmp_path / "libm.so", cc="no-such-compiler-tf")
    assert not (tmp_path / "libm.so").exists() and not (tmp_path / "m.h").exists()


def test_cli_model_export(tmp_path, capsys):
    from tuner.cli import main
    m, p = conv_relu_gemm()
    path = tmp_path / "convnet.onnx"
    path.write_bytes(m.SerializeToString())
    out = tmp_path / "out"
    assert main(["model", "export", str(path), "--out", str(out), "--no-records"]) == 0
    assert "convnet_run" in capsys.readouterr().out
    assert (out / "libconvnet.so").is_file() and (out / "convnet.h").is_file()
    inputs = [rand(RNG, (1, C_IN, H, H)) for _ in range(3)]
    for x, (prob, logits) in zip(inputs, _compile_and_run(out, inputs)):
        want_prob, want_logits = np_conv_relu_gemm(x, p)
        assert_close(prob, want_prob)
        assert_close(logits, want_logits)
    # an unsupported operator: one error line, nothing written
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(model([helper.make_node("Hardmax", ["x"], ["y"])], {"x": ((1, 4), "float32")},
                          {"y": (None, "float32")}).SerializeToString())
    assert main(["model", "export", str(bad), "--out", str(tmp_path / "bad_out"), "--no-records"]) == 2
    assert "Hardmax" in capsys.readouterr().err
    assert not (tmp_path / "bad_out").exists()


@contextlib.contextmanager
def c_model(done):
    """An exported model's C API through ctypes: yields run(*arrays) -> status, the model object
    made by NAME_create and freed by NAME_destroy."""
    lib = ctypes.CDLL(str(done.library))
    create, run, destroy = (getattr(lib, f"{done.name}_{f}") for f in ("create", "run", "destroy"))
    create.restype = ctypes.c_void_p
    destroy.argtypes = [ctypes.c_void_p]
    handle = create()
    assert handle
    try:
        yield lambda *arrays: run(ctypes.c_void_p(handle), *(ctypes.c_void_p(a.ctypes.data) for a in arrays))
    finally:
        destroy(handle)


def test_constant_and_pass_through_outputs_through_ctypes(tmp_path):
    """Outputs that are a constant (Shape, folded: int64 from the weights) and the input itself
    (Identity: the input's buffer) come out of the C API too."""
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Identity", ["x"], ["same"])]
    m = model(nodes, {"x": ((3, 5), "float32")},
              {"y": (None, "float32"), "s": (None, "int64"), "same": (None, "float32")})
    done = export_model(from_onnx(m), tmp_path / "libpass.so")
    assert "const float* x, float* y, int64_t* s, float* same" in done.header.read_text()
    with c_model(done) as run:
        x = rand(RNG, (3, 5))
        y, same = np.full((3, 5), np.nan, np.float32), np.full((3, 5), np.nan, np.float32)
        s = np.full(2, -1, np.int64)
        assert run(x, y, s, same) == 0
        np.testing.assert_array_equal(y, np.maximum(x, 0))
        np.testing.assert_array_equal(s, [3, 5])
        np.testing.assert_array_equal(same, x)


def test_a_blocked_network_exports_and_answers_as_the_module_does(tmp_path):
    """A network compiled in the channel-blocked layout (ConvNCHWc, its packed weights and the
    border copies) goes through export like any other: the library's answer is the module's."""
    from test_graph_layout import inverted_residual
    m, _ = inverted_residual()
    module = build_model(from_onnx(m))
    assert any("convnchwc" in s.group.opdef.name for s in module.steps)
    done = export_model(module, tmp_path / "libblocked.so")
    with c_model(done) as run:
        x = rand(RNG, (1, 3, 17, 19))
        y = np.full((1, 5), np.nan, np.float32)
        assert run(x, y) == 0
        np.testing.assert_array_equal(y, module.run(x=x)[0])
