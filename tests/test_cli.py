"""The `tunefarm` command line, in-process (`main([...])`) and as a program (`python -m tuner.cli`),
plus the numpy baselines it times kernels against.

The in-process runs show what a command prints and returns; the subprocess runs show the module
entry point and that user errors end with status 2 and a message, never a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import compiler.ops
from compiler.ops import INVENTORY, get_op, random_inputs
from tuner import cli
from tuner.numpy_baselines import BASELINE_OPS, numpy_baseline, time_callable

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


# ----------------------------------------------------------------------------- version

def test_version_in_process(capsys):
    assert cli.main(["version"]) == 0
    out = capsys.readouterr().out
    assert "tunefarm 0.1.0" in out
    assert "llvmlite" in out and "LLVM" in out
    assert "host target: llvm -mtriple=" in out


def test_version_subprocess():
    proc = run_cli("version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("tunefarm ")
    assert "host target: llvm" in proc.stdout


def test_no_command_is_a_usage_error(capsys):
    assert cli.main([]) == 2
    assert "usage: tunefarm" in capsys.readouterr().err


# ----------------------------------------------------------------------------- ops

@pytest.mark.parametrize("plain", [False, True])
def test_ops_only_relu_in_process(capsys, plain):
    args = ["ops", "--only", "relu", "--small", "--repeat", "2"] + (["--plain"] if plain else [])
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "relu" in out and "OK" in out and "GFLOPS" in out
    assert "FAIL" not in out


def test_ops_only_relu_subprocess():
    proc = run_cli("ops", "--only", "relu", "--small", "--repeat", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "relu" in proc.stdout and "OK" in proc.stdout


def test_ops_every_demo_operator_small(capsys):
    """The whole demo at tiny sizes: every operator builds, matches its reference and gets timed."""
    assert cli.main(["ops", "--small", "--repeat", "1", "--plain"]) == 0
    out = capsys.readouterr().out
    for name in cli.DEMO_OPS:
        assert any(line.startswith(name + " ") and line.rstrip().endswith("OK") for line in out.splitlines()), name
    assert "GB/s" in out  # transpose and pad move bytes, they have no flops


def test_ops_extra_inventory_operators(capsys):
    assert cli.main(["ops", "--small", "--repeat", "1", "--plain",
                     "--only", "matmul_int8", "mul", "bias_add", "reduce_max", "reduce_min"]) == 0
    assert capsys.readouterr().out.count(" OK") == 5


def test_ops_unknown_operator_in_process(capsys):
    assert cli.main(["ops", "--only", "relu", "no_such_op"]) == 2
    err = capsys.readouterr().err
    assert "unknown operator 'no_such_op'" in err
    assert "matmul" in err  # the message lists the known operators


def test_ops_unknown_operator_subprocess():
    proc = run_cli("ops", "--only", "no_such_op")
    assert proc.returncode == 2
    assert "unknown operator 'no_such_op'" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_ops_bad_target_and_repeat(capsys):
    assert cli.main(["ops", "--only", "relu", "--target", "cuda"]) == 2
    assert "bad --target" in capsys.readouterr().err
    assert cli.main(["ops", "--only", "relu", "--repeat", "0"]) == 2


def test_ops_reports_a_kernel_that_skips_its_output(monkeypatch, capsys):
    """A kernel that never writes its output leaves the NaN poison: FAIL and exit status 1."""
    real_build_op = compiler.ops.build_op

    class Lazy:
        def __init__(self, kernel):
            self.kernel = kernel

        def __call__(self, *arrays):
            pass

        def time_evaluator(self, **kw):
            return self.kernel.time_evaluator(**kw)

    monkeypatch.setattr(compiler.ops, "build_op",
                        lambda opdef, target=None, name=None: Lazy(real_build_op(opdef, target)))
    assert cli.main(["ops", "--only", "relu", "--small", "--repeat", "1", "--plain"]) == 1
    captured = capsys.readouterr()
    assert "FAIL" in captured.out
    assert "FAILED: relu" in captured.err


# ----------------------------------------------------------------------------- lower

def test_lower_in_process(capsys):
    assert cli.main(["lower", "matmul", "--param", "M=16", "--param", "N=16", "--param", "K=16"]) == 0
    out = capsys.readouterr().out
    assert "for (" in out
    assert "float32[16, 16]" in out


def test_lower_subprocess():
    proc = run_cli("lower", "matmul", "--param", "M=16", "--param", "N=16", "--param", "K=16")
    assert proc.returncode == 0, proc.stderr
    assert "for (" in proc.stdout


def test_lower_tuple_and_string_params(capsys):
    assert cli.main(["lower", "softmax", "--param", "shape=8,32", "--param", "dtype=float64"]) == 0
    out = capsys.readouterr().out
    assert "float64[8, 32]" in out


@pytest.mark.parametrize("args, message", [
    (["lower", "no_such_op"], "unknown operator 'no_such_op'"),
    (["lower", "matmul", "--param", "M"], "expected NAME=VALUE"),
    (["lower", "matmul", "--param", "M=-3"], "M must be an integer >= 1"),
    (["lower", "matmul", "--param", "Q=3"], "matmul"),
])
def test_lower_usage_errors(capsys, args, message):
    assert cli.main(args) == 2
    assert message in capsys.readouterr().err


# ----------------------------------------------------------------------------- tables and baselines

def test_size_tables_cover_the_inventory():
    assert set(cli.DEFAULT_PARAMS) == set(INVENTORY) == set(cli.SMALL_PARAMS) == set(BASELINE_OPS)
    assert set(cli.DEMO_OPS) <= set(INVENTORY) and len(cli.DEMO_OPS) == 16
    for name, params in cli.DEFAULT_PARAMS.items():
        get_op(name, **params)  # valid parameters


@pytest.mark.parametrize("name", sorted(INVENTORY))
def test_numpy_baseline_matches_reference(name):
    opdef = get_op(name, **cli.SMALL_PARAMS[name])
    inputs = random_inputs(opdef, np.random.default_rng(1))
    got = numpy_baseline(opdef)(*inputs)
    assert got.shape == tuple(opdef.output.shape)
    ok, err = cli.check_output(np.ascontiguousarray(got), opdef.reference(*inputs), opdef.output.dtype)
    assert ok, f"{name}: error {err}"


@pytest.mark.parametrize("name, params", [
    ("conv2d_nchw", dict(N=2, C=4, H=9, W=7, F=6, KH=3, KW=2, stride=2, padding=(1, 0), dilation=(1, 2), groups=2)),
    ("conv2d_nhwc", dict(N=2, C=4, H=9, W=7, F=6, KH=3, KW=2, stride=2, padding=(1, 0), dilation=(1, 2), groups=2)),
    ("depthwise_conv2d_nchw", dict(N=1, C=3, H=7, W=9, KH=3, KW=3, stride=2, padding=1, multiplier=2)),
    ("avg_pool2d", dict(N=1, C=2, H=7, W=7, kernel=3, stride=2, padding=1)),
    ("matmul", dict(M=5, N=7, K=3, transpose_b=True)),
    ("batch_matmul", dict(B=2, M=3, N=4, K=5, transpose_b=True)),
    ("dense", dict(batch=3, in_dim=5, out_dim=4, epilogue="gelu")),
    ("reduce_sum", dict(shape=(3, 4, 5), axis=(0, 2), keepdims=True)),
    ("add", dict(shape_a=(4, 1, 5), shape_b=(3, 1))),
])
def test_numpy_baseline_options(name, params):
    opdef = get_op(name, **params)
    inputs = random_inputs(opdef, np.random.default_rng(2))
    got = numpy_baseline(opdef)(*inputs)
    ok, err = cli.check_output(np.ascontiguousarray(got), opdef.reference(*inputs), opdef.output.dtype)
    assert ok, f"{name}: error {err}"


def test_check_output_catches_poison_and_errors():
    ref = np.ones((4, 4), np.float32)
    assert cli.check_output(ref.copy(), ref, "float32")[0]
    poisoned = ref.copy()
    poisoned[3, 3] = np.nan
    assert not cli.check_output(poisoned, ref, "float32")[0]
    off = ref.copy()
    off[0, 0] += 1e-2
    assert not cli.check_output(off, ref, "float32")[0]
    assert not cli.check_output(np.ones((4, 3), np.float32), ref, "float32")[0]
    assert not cli.check_output(np.array([1, 2], np.int32), np.array([1, 3]), "int32")[0]


def test_time_callable():
    t = time_callable(lambda a: a + 1, [np.ones(16)], repeat=3, min_repeat_ms=1.0)
    assert t.count >= 3 and 0 < t.minimum <= t.median and t.calls_per_sample >= 1
    with pytest.raises(ValueError):
        time_callable(lambda: None, [], repeat=0)
