"""Every spelling of a matrix product, untuned, against onnxruntime in the same process (issue 54).

Exporters write one product many ways: MatMul + Add of a [K, N] weight, Gemm with transB=1,
MatMul of a Transpose of a constant, a batch of A over one weight (nn.MultiheadAttention's
in-projection runs over [S, 1, d], sequence first), attention's batched Q·Kᵀ and P·V over
[B, H, S, D] (Kᵀ as a Transpose node, or as an operand already transposed), grouped-query
attention whose K heads are broadcast or expanded, sizes that are no multiple of the register
tile (197, 77, 1000), the matrix-vector products of a decode step and the 4- and 8-row products
of batch-4 and batch-8 ones. Each spelling is a tiny
ONNX model of one or a few nodes (random non-zero weights and inputs, seeded), imported with
`compiler.graph.from_onnx`, built with `build_model` (default schedules: no records), checked
against numpy in float64 (relative error ‖ours − ref‖ / ‖ref‖) and against onnxruntime, then
both runtimes are timed alternately for `--rounds` rounds (bench/model_e2e.py's protocol:
time_interleaved, the ratio the median of the rounds' ratios) at `--threads` threads each. The
`kernels` column times our kernels alone in the same rounds (the module's call sequence,
without run()'s copies of the inputs in and the outputs out), the schedules' share of the
ratio: onnxruntime's time / theirs.

The decode-step spellings are bound by memory, not FMAs: beside the ratio they report GB/s
(the weight's bytes over our time) and this machine's copy bandwidth, numpy copying a 256 MB
array in the same process (read + write bytes per second), interleaved with the same rounds.
The BLAS numpy runs is printed (bench/blas_info.py).

Prints a table, then one JSON line: {"ratio_vs_onnxruntime": {spelling: onnxruntime's time /
ours}, "kernels_ratio_vs_onnxruntime": {...}, "gbps": {spelling: GB/s}, "copy_gbps": ..., "rel_error": {...}, "schedule": {spelling:
the default schedule's kind of the product's kernel}, "threads": ...}.
`--only NAME ...` runs some spellings; `--list` names them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from blas_info import blas_line  # noqa: E402
from model_e2e import build_quiet, ort_session, round_ratio, time_interleaved  # noqa: E402

COPY_BYTES = 256 << 20   # the copy that measures the machine's bandwidth: far past any cache


# ----------------------------------------------------------------------------- the spellings

class Spelling:
    """A tiny ONNX model: `nodes` over graph inputs `inputs` {name: array} and constant
    `weights` {name: array}, output "y"; `reference(**inputs)` in float64; `bytes_` > 0 marks a
    matrix-vector product (memory bound: GB/s of its weight)."""

    def __init__(self, name, nodes, inputs, weights, reference, opset=17, bytes_=0):
        self.name, self.nodes, self.inputs, self.weights = name, nodes, inputs, weights
        self.reference, self.opset, self.bytes = reference, opset, bytes_

    def model(self):
        from onnx import TensorProto, helper, numpy_helper
        ins = [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in self.inputs.items()]
        inits = [numpy_helper.from_array(v if v.dtype == np.int64 else v.astype(np.float32), k)
                 for k, v in self.weights.items()]
        ref = self.reference(**{k: v.astype(np.float64) for k, v in self.inputs.items()})
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT, ref.shape)
        graph = helper.make_graph(self.nodes, self.name, ins, [out], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = 8
        return model, ref


def _rng(seed):
    return np.random.default_rng(seed)


def _arr(rng, *shape, scale=1.0):
    # non-zero everywhere: uniform magnitudes in [0.5, 1.5) with random signs
    return (rng.uniform(0.5, 1.5, shape) * rng.choice((-1.0, 1.0), shape) * scale).astype(np.float32)


def spellings() -> list:
    from onnx import helper
    n = helper.make_node
    out: list = []
    f64 = np.float64

    def linear(name, x_shape, K, N, seed, bias=True):
        """MatMul(x, W[K, N]) (+ b): the form the TorchScript exporter gives nn.Linear on 3-d x."""
        r = _rng(seed)
        x, w, b = _arr(r, *x_shape), _arr(r, K, N, scale=K ** -0.5), _arr(r, N)
        nodes = [n("MatMul", ["x", "w"], ["p" if bias else "y"])] + ([n("Add", ["p", "b"], ["y"])] if bias else [])
        wts = {"w": w, "b": b} if bias else {"w": w}
        out.append(Spelling(name, nodes, {"x": x}, wts,
                            lambda x, w=w, b=b: x @ w.astype(f64) + (b.astype(f64) if bias else 0)))

    # nn.MultiheadAttention's packed in-projection as exported (batch_first: x.transpose(0, 1) first)
    linear("inproj_seq_first_197x1x768_2304", (197, 1, 768), 768, 2304, 1)
    linear("matmul_add_197x768_2304", (197, 768), 768, 2304, 2)
    linear("matmul_add_batch2_197x768_768", (2, 197, 768), 768, 768, 3)
    linear("matmul_77x768_768", (1, 77, 768), 768, 768, 4, bias=False)
    linear("matmul_1000x1000_1000", (1000, 1000), 1000, 1000, 5, bias=False)

    r = _rng(6)   # MatMul(x, Transpose(W)) of a constant [N, K] weight (dynamo's spelling of nn.Linear)
    x, w = _arr(r, 197, 768), _arr(r, 2304, 768, scale=768 ** -0.5)
    out.append(Spelling("matmul_transpose_const_197x768_2304", [n("Transpose", ["w"], ["wt"], perm=[1, 0]),
                                                                n("MatMul", ["x", "wt"], ["y"])],
                        {"x": x}, {"w": w}, lambda x, w=w: x @ w.T.astype(f64), opset=18))
    r = _rng(7)   # Gemm transB=1 with a bias: a classifier / out-projection
    x, w, b = _arr(r, 197, 768), _arr(r, 1000, 768, scale=768 ** -0.5), _arr(r, 1000)
    out.append(Spelling("gemm_transB_197x768_1000", [n("Gemm", ["x", "w", "b"], ["y"], transB=1)],
                        {"x": x}, {"w": w, "b": b}, lambda x, w=w, b=b: x @ w.T.astype(f64) + b))
    r = _rng(8)
    x, w, b = _arr(r, 197, 768), _arr(r, 768, 768, scale=768 ** -0.5), _arr(r, 768)
    out.append(Spelling("gemm_197x768_768", [n("Gemm", ["x", "w", "b"], ["y"])],
                        {"x": x}, {"w": w, "b": b}, lambda x, w=w, b=b: x @ w.astype(f64) + b))
    r = _rng(9)   # a batch-1 classifier
    x, w, b = _arr(r, 1, 768), _arr(r, 1000, 768, scale=768 ** -0.5), _arr(r, 1000)
    out.append(Spelling("gemm_transB_1x768_1000", [n("Gemm", ["x", "w", "b"], ["y"], transB=1)],
                        {"x": x}, {"w": w, "b": b}, lambda x, w=w, b=b: x @ w.T.astype(f64) + b))

    # attention: scores Q·Kᵀ (Kᵀ a Transpose node, or K handed over transposed), context P·V
    r = _rng(10)
    q, k = _arr(r, 1, 12, 197, 64), _arr(r, 1, 12, 197, 64)
    out.append(Spelling("attn_qkT_transpose_1x12x197x64", [n("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
                                                           n("MatMul", ["q", "kt"], ["y"])],
                        {"q": q, "k": k}, {}, lambda q, k: q @ np.swapaxes(k, -1, -2)))
    r = _rng(11)
    q, kt = _arr(r, 1, 12, 197, 64), _arr(r, 1, 12, 64, 197)
    out.append(Spelling("attn_qkT_1x12x197x64", [n("MatMul", ["q", "kt"], ["y"])],
                        {"q": q, "kt": kt}, {}, lambda q, kt: q @ kt))
    r = _rng(12)
    p, v = _arr(r, 1, 12, 197, 197, scale=1 / 197), _arr(r, 1, 12, 197, 64)
    out.append(Spelling("attn_pv_1x12x197x197", [n("MatMul", ["p", "v"], ["y"])],
                        {"p": p, "v": v}, {}, lambda p, v: p @ v))
    # grouped-query attention: 32 query heads over 8 K/V heads, broadcast by MatMul itself or
    # expanded first (Expand + Reshape, as Llama's repeat_kv exports)
    r = _rng(13)
    q, kt = _arr(r, 1, 8, 4, 77, 64), _arr(r, 1, 8, 1, 64, 77)
    out.append(Spelling("gqa_qkT_broadcast_8x4x77x64", [n("MatMul", ["q", "kt"], ["y"])],
                        {"q": q, "kt": kt}, {}, lambda q, kt: q @ kt))
    r = _rng(14)
    p, v = _arr(r, 1, 32, 77, 77, scale=1 / 77), _arr(r, 1, 8, 77, 64)
    shape = np.array([1, 8, 4, 77, 64], np.int64)
    shape2 = np.array([1, 32, 77, 64], np.int64)
    out.append(Spelling("gqa_pv_expand_32x77x77", [n("Unsqueeze", ["v", "ax"], ["v5"]),
                                                   n("Expand", ["v5", "shape"], ["ve"]),
                                                   n("Reshape", ["ve", "shape2"], ["v32"]),
                                                   n("MatMul", ["p", "v32"], ["y"])],
                        {"p": p, "v": v}, {"ax": np.array([2], np.int64), "shape": shape, "shape2": shape2},
                        lambda p, v: p @ np.repeat(v, 4, axis=1)))

    # a decode step: one token through a projection (memory bound)
    for name, K, N, seed in (("gemv_1x1x4096_4096", 4096, 4096, 15), ("gemv_1x1x2048_5632", 2048, 5632, 16)):
        r = _rng(seed)
        x, w = _arr(r, 1, 1, K), _arr(r, K, N, scale=K ** -0.5)
        out.append(Spelling(name, [n("MatMul", ["x", "w"], ["y"])], {"x": x}, {"w": w},
                            lambda x, w=w: x @ w.astype(f64), bytes_=w.nbytes))
    # decode steps of batch 4 and 8: a few tokens through a projection (a few FMAs per weight: memory bound)
    # and a language model's head: a vocabulary of 32000 columns, 131 MB of weight
    for rows, K, N, seed in ((4, 2048, 5632, 18), (8, 2048, 5632, 17), (1, 1024, 32000, 19), (8, 1024, 32000, 20)):
        r = _rng(seed)
        x, w = _arr(r, rows, 1, K), _arr(r, K, N, scale=K ** -0.5)
        out.append(Spelling(f"{'gemv' if rows == 1 else 'gemm'}_{rows}x1x{K}_{N}", [n("MatMul", ["x", "w"], ["y"])],
                            {"x": x}, {"w": w}, lambda x, w=w: x @ w.astype(f64), bytes_=w.nbytes))
    return out


# ----------------------------------------------------------------------------- measuring

def product_schedule(module) -> str:
    """What the default schedule made of the module's matrix product: the kind
    schedule_anchor.product_schedule_kind names (gemm, gemm-prepacked, gemv, batched, ...)."""
    from compiler.ops.schedule_anchor import product_schedule_kind
    kinds = [product_schedule_kind(s.group.opdef, module.target) for s in module.steps]
    return ",".join(k for k in kinds if k) or "-"


def copy_callable():
    src = np.ones(COPY_BYTES // 4, np.float32)
    dst = np.empty_like(src)
    return lambda: np.copyto(dst, src)


def rel_error(ours, ref) -> float:
    return float(np.linalg.norm(ours.astype(np.float64) - ref) / np.linalg.norm(ref))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="alternating timing rounds per spelling")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", nargs="+", default=None, metavar="NAME")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    cases = spellings()
    if args.list:
        print("\n".join(c.name for c in cases))
        return 0
    if args.only:
        unknown = set(args.only) - {c.name for c in cases}
        if unknown:
            ap.error(f"unknown spellings {sorted(unknown)}; --list names them")
        cases = [c for c in cases if c.name in args.only]
    import onnxruntime as ort

    import compiler
    from compiler.graph import from_onnx

    compiler.set_num_threads(args.threads)
    print(f"host target {compiler.Target.host()}; {args.threads} threads; onnxruntime {ort.__version__}")
    print(blas_line() + "\n", flush=True)
    report: dict = {k: {} for k in ("ratio_vs_onnxruntime", "kernels_ratio_vs_onnxruntime", "gbps", "rel_error",
                                    "ort_rel_error", "schedule",
                                    "tunefarm_ms", "onnxruntime_ms")}
    copy = copy_callable()
    copy_ratio: list = []   # each memory-bound round's copy time, for GB/s
    print(f"{'spelling':<38} {'ours ms':>9} {'ort ms':>9} {'ratio':>6} {'kernels':>7} {'rel.err':>8}  "
          "schedule / GB/s")
    for case in cases:
        model, ref = case.model()
        module = build_quiet(from_onnx(model))   # untuned: the default schedules
        session = ort_session(model.SerializeToString(), args.threads)
        feeds = {k: v.copy() for k, v in case.inputs.items()}
        (ours,) = module.run(**feeds)
        (theirs,) = session.run(None, feeds)
        err = rel_error(ours, ref)
        report["rel_error"][case.name] = float(f"{err:.2e}")
        report["ort_rel_error"][case.name] = float(f"{rel_error(theirs, ref):.2e}")
        report["schedule"][case.name] = product_schedule(module)
        module.load_inputs(feeds)
        sequence = module.call_sequence()   # the kernels alone, on the inputs just loaded
        runs = {"ours": lambda m=module, f=feeds: m.run(**f),
                "onnxruntime": lambda s=session, f=feeds: s.run(None, f),
                "kernels": sequence.run}
        if case.bytes:
            runs["copy"] = copy
        timed = time_interleaved(runs, args.rounds)
        ratio = round(round_ratio(timed, "onnxruntime", "ours"), 3)
        report["ratio_vs_onnxruntime"][case.name] = ratio
        report["kernels_ratio_vs_onnxruntime"][case.name] = round(round_ratio(timed, "onnxruntime", "kernels"), 3)
        report["tunefarm_ms"][case.name], report["onnxruntime_ms"][case.name] = timed["ours"][0], timed["onnxruntime"][0]
        extra = report["schedule"][case.name]
        if case.bytes:
            gbps = case.bytes / (timed["ours"][0] * 1e-3) / 1e9
            ort_gbps = case.bytes / (timed["onnxruntime"][0] * 1e-3) / 1e9
            copy_ratio.extend(timed["copy"][3])
            report["gbps"][case.name] = round(gbps, 1)
            report["gbps"]["onnxruntime:" + case.name] = round(ort_gbps, 1)
            extra += f"  {gbps:.1f} GB/s (onnxruntime {ort_gbps:.1f})"
        print(f"{case.name:<38} {timed['ours'][0]:9.3f} {timed['onnxruntime'][0]:9.3f} {ratio:6.2f} "
              f"{report['kernels_ratio_vs_onnxruntime'][case.name]:7.2f} {err:8.1e}  "
              f"{extra}{'  DISTURBED' if any(t[1] for t in timed.values()) else ''}", flush=True)
    if copy_ratio:
        # read + write of COPY_BYTES each, the median round
        report["copy_gbps"] = round(2 * COPY_BYTES / (float(np.median(copy_ratio)) * 1e-3) / 1e9, 1)
        print(f"\nnumpy copy of {COPY_BYTES >> 20} MB (read + write): {report['copy_gbps']} GB/s")
    ratios = list(report["ratio_vs_onnxruntime"].values())
    report["min_ratio"] = min(ratios)
    report["geomean"] = round(math.exp(sum(math.log(r) for r in ratios) / len(ratios)), 3)
    bad = {k: v for k, v in report["rel_error"].items() if v > 1e-4}
    if bad:
        print(f"WRONG beyond 1e-4 relative: {bad}", file=sys.stderr)
    report["threads"] = args.threads
    print(f"min ratio {report['min_ratio']:.2f}x, geomean {report['geomean']:.2f}x")
    print(json.dumps(report))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
