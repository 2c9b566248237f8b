"""What a model's run() costs beside its kernels: the native entry against the ctypes path.

    .venv/bin/python bench/run_overhead.py [--rounds 7] [--threads 2]

Two models are built twice in one process, once with the native entry
(compiler/graph/native_run.py) and once with it turned off (the ctypes call, the reference):
`relu` (one 10-element Relu: a run that is nearly all call) and `mlp` (model_e2e's batch-1 MLP,
784-512-512-10: 15-20 us of kernels). Rounds alternate the two builds; each round times many
calls of each. Prints a table, then one JSON object: `run_us` ({model: {entry: us}}, the best
round's mean), `speedup` (ctypes / native, per model), `outside_kernels_fraction` ({model:
{entry: share}}, each build's profile: time outside the native call of the kernels over the
run).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import model_e2e  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from compiler.graph import from_onnx, native_run  # noqa: E402
from compiler.graph.profile import default_options  # noqa: E402
from compiler.openmp import set_num_threads  # noqa: E402


def relu_model():
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 10])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def built(model, native: bool):
    """The model built, run once (the entry installed, or not); the ctypes build is made with
    the entry's ABI probe answering None, exactly as on a Python the entry does not support."""
    probe = native_run.abi
    if not native:
        native_run.abi = lambda: None
    try:
        module = model_e2e.build_quiet(from_onnx(model), None)
        name = module.input_names[0]
        shape = module.graph.values[name].shape
        feeds = {name: np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)}
        module.run(**feeds)
    finally:
        native_run.abi = probe
    assert bool(module._native) == native
    return module, feeds


def mean_us(module, feeds, calls: int) -> float:
    run = module.run
    t0 = time.perf_counter()
    for _ in range(calls):
        run(**feeds)
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        models = {"relu": relu_model(), "mlp": onnx.load(model_e2e.export("mlp", tmp))}
    report: dict = {"run_us": {}, "speedup": {}, "outside_kernels_fraction": {}, "threads": args.threads}
    print(f"{'model':<6} {'entry':<7} {'run us':>9} {'outside':>8}")
    for label, model in models.items():
        builds = {"native": built(model, True), "ctypes": built(model, False)}
        calls = 20000 if label == "relu" else 2000
        best = {k: float("inf") for k in builds}
        for _ in range(args.rounds):
            for k, (module, feeds) in builds.items():
                best[k] = min(best[k], mean_us(module, feeds, calls))
        opts = default_options(20)
        outside = {}
        for k, (module, feeds) in builds.items():
            prof = module.profile(feeds, options=opts)
            outside[k] = round(max(0.0, prof.overhead_seconds / prof.run_seconds), 4)
            print(f"{label:<6} {k:<7} {best[k]:9.3f} {outside[k]:8.1%}")
        report["run_us"][label] = {k: round(v, 3) for k, v in best.items()}
        report["speedup"][label] = round(best["ctypes"] / best["native"], 3)
        report["outside_kernels_fraction"][label] = outside
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
