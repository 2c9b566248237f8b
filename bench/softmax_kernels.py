"""Attention's softmax, untuned, against onnxruntime in the same process (issue 54).

Each case is a one- or two-node ONNX model (Softmax over the last axis, or Add of a key mask then
Softmax, as BERT spells it) of random inputs, built with the default schedules and checked
against onnxruntime; then our kernels (the module's call sequence, no run() copies) and
onnxruntime's run are timed alternately for `--rounds` rounds (compiler.graph.run_timing: the
ratio is the median of the rounds' ratios, onnxruntime's time / ours). Prints one line per
case and a JSON line {"ratio_vs_onnxruntime": {case: ratio}, ...}.

    .venv/bin/python bench/softmax_kernels.py [--rounds 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from model_e2e import build_quiet, ort_session, round_ratio, time_interleaved  # noqa: E402

CASES = [((12, 197, 197), False), ((12, 128, 128), True), ((32, 128, 128), False), ((8, 512, 512), False)]


def softmax_model(shape, mask: bool):
    from onnx import TensorProto, helper
    ins, nodes, src = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)], [], "x"
    if mask:
        ins.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, [1, 1, shape[-1]]))
        nodes.append(helper.make_node("Add", ["x", "m"], ["xm"]))
        src = "xm"
    nodes.append(helper.make_node("Softmax", [src], ["y"], axis=-1))
    g = helper.make_graph(nodes, "softmax", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import compiler
    from compiler.graph import from_onnx
    compiler.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    report: dict = {"ratio_vs_onnxruntime": {}, "tunefarm_ms": {}, "onnxruntime_ms": {}, "max_abs_diff": {}}
    for shape, mask in CASES:
        name = "x".join(map(str, shape)) + ("+mask" if mask else "")
        m = softmax_model(shape, mask)
        module, session = build_quiet(from_onnx(m)), ort_session(m.SerializeToString(), args.threads)
        feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
        if mask:
            feeds["m"] = np.where(np.arange(shape[-1]) >= shape[-1] - 20, -1e9, 0).astype(np.float32)[None, None]
        diff = float(np.abs(module.run(**feeds)[0] - session.run(None, feeds)[0]).max())
        module.load_inputs(feeds)   # the sequence alone reads the module's own input buffers
        timed = time_interleaved({"ours": module.call_sequence().run,
                                  "onnxruntime": lambda s=session, f=feeds: s.run(None, f)}, args.rounds)
        ratio = round(round_ratio(timed, "onnxruntime", "ours"), 3)
        report["ratio_vs_onnxruntime"][name], report["max_abs_diff"][name] = ratio, diff
        report["tunefarm_ms"][name], report["onnxruntime_ms"][name] = timed["ours"][0], timed["onnxruntime"][0]
        print(f"{name:<20} ours {timed['ours'][0]:7.3f} ms  onnxruntime {timed['onnxruntime'][0]:7.3f} ms  "
              f"ratio {ratio:5.2f}x  max |diff| {diff:.1e}", flush=True)
    report["threads"] = args.threads
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
