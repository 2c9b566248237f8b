"""A differential fuzzer at the model level: random small ONNX graphs, tunefarm against onnxruntime.

tests/kernel_fuzz.py (bench/fuzz.py) draws single operators and compute definitions; this draws
whole graphs as exporters write them, so it reaches what only a model reaches: fusion of
epilogues into anchors, constant weights pre-packed for the host, the default schedules of
fused groups at shapes no test names. Two generators:

- `conv`: 1-3 layers of Conv (plain, grouped, depthwise; kernels 1-7, strides, dilations,
  asymmetric pads, odd channel counts, batch 1 or 2), MaxPool or AveragePool, each conv with
  or without a bias and followed by Relu, Clip, Sigmoid or a broadcast Add;
- `transformer`: [B, S, D] inputs through MatMul (+ bias), multi-head attention (Reshape,
  Transpose, MatMul, Softmax), LayerNormalization or its ReduceMean/Sub/Pow/Sqrt/Div spelling,
  activations (Relu, Tanh, Sigmoid, Erf-GELU) and residual Adds.

Each graph runs in onnxruntime (one thread) and through `build_model(from_onnx(...)).run`, on the
same random input; a finding is an error or an output off by more than 1e-4 of the reference's
largest magnitude. Graphs onnxruntime itself refuses are skipped. The seeds are reproducible:
`--seed N --verbose` prints one graph's nodes and the result.

    .venv/bin/python bench/model_fuzz.py --seeds 300 [--start 0] [--kind conv transformer]
    .venv/bin/python bench/model_fuzz.py --seed 339 --kind conv --verbose

Prints a table (graphs drawn, run, findings per generator), every finding on a line, and as its
LAST line one JSON object: {"seeds", "start", "ran": {kind: n}, "findings": [{"kind", "seed",
"message"}], "seconds"}. Exit status 0 even with findings: this is a measurement. Needs the
`bench` extra (onnxruntime).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOLERANCE = 1e-4


class GraphBuilder:
    """Nodes and initializers of one random graph, with fresh names."""

    def __init__(self):
        from onnx import numpy_helper
        self.numpy_helper = numpy_helper
        self.nodes, self.inits, self._n = [], [], 0

    def fresh(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def const(self, array) -> str:
        name = self.fresh("k")
        self.inits.append(self.numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, op: str, inputs: list, **attrs) -> str:
        from onnx import helper
        out = self.fresh(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def model(self, x_shape: list, output: str):
        from onnx import TensorProto, helper
        graph = helper.make_graph(self.nodes, "fuzz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                                  [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)], self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def conv_graph(rng):
    """Conv / pool layers on an NCHW input; (model, input shape) or None if nothing was drawn."""
    g = GraphBuilder()
    C = int(rng.choice([1, 3, 4, 8, 12, 16, 24, 32, 40, 64]))
    shape = [1 if rng.random() < 0.8 else 2, C, int(rng.integers(3, 40)), int(rng.integers(3, 40))]
    x_shape, cur = list(shape), "x"
    for _ in range(int(rng.integers(1, 4))):
        cin, h, w = shape[1], shape[2], shape[3]
        kind = rng.choice(["conv", "depthwise", "pool", "grouped"])
        if kind == "pool" and h >= 2 and w >= 2:
            k = int(rng.integers(1, min(4, h, w) + 1))
            s, p = int(rng.integers(1, 3)), (int(rng.integers(0, k)) if k > 1 else 0)
            cur = g.node(str(rng.choice(["MaxPool", "AveragePool"])), [cur], kernel_shape=[k, k], strides=[s, s],
                         pads=[p] * 4)
            shape = [shape[0], cin, (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1]
            continue
        if kind == "depthwise":
            groups, F = cin, cin * int(rng.choice([1, 1, 2]))
        elif kind == "grouped" and cin % 2 == 0 and cin >= 4:
            groups = int(rng.choice([d for d in (2, 4) if cin % d == 0]))
            F = groups * int(rng.integers(1, 5)) * 2
        else:
            groups, F = 1, int(rng.choice([4, 8, 16, 17, 24, 32, 48, 64]))
        k = int(rng.choice([1, 3, 5, 7])) if h >= 7 and w >= 7 else 1
        s, d = int(rng.choice([1, 1, 2])), (int(rng.choice([1, 1, 2])) if k > 1 else 1)
        span = (k - 1) * d + 1
        pads = [int(rng.integers(0, span)) for _ in range(4)]
        oh, ow = (h + pads[0] + pads[2] - span) // s + 1, (w + pads[1] + pads[3] - span) // s + 1
        if oh < 1 or ow < 1:
            continue
        ins = [cur, g.const((rng.standard_normal((F, cin // groups, k, k)) * 0.3).astype(np.float32))]
        if rng.random() < 0.6:
            ins.append(g.const(rng.standard_normal(F).astype(np.float32)))
        cur = g.node("Conv", ins, kernel_shape=[k, k], strides=[s, s], pads=pads, dilations=[d, d], group=groups)
        shape = [shape[0], F, oh, ow]
        act = rng.choice(["none", "Relu", "Clip", "Sigmoid", "add"])
        if act in ("Relu", "Sigmoid"):
            cur = g.node(str(act), [cur])
        elif act == "Clip":
            cur = g.node("Clip", [cur, g.const(np.array(0, np.float32)), g.const(np.array(6, np.float32))])
        elif act == "add":
            cur = g.node("Add", [cur, g.const(rng.standard_normal((1, F, 1, 1)).astype(np.float32))])
    return (g.model(x_shape, cur), x_shape) if g.nodes else None


def transformer_graph(rng):
    """MatMul / attention / normalization / activation blocks on a [B, S, D] input."""
    g = GraphBuilder()
    B, S, H = int(rng.choice([1, 1, 2])), int(rng.integers(1, 20)), int(rng.choice([1, 2, 3, 4]))
    D = H * int(rng.choice([1, 4, 8, 12, 16]))
    cur, width = "x", D
    f32 = lambda v: g.const(np.array(v, np.float32))  # noqa: E731
    for _ in range(int(rng.integers(1, 4))):
        kind = rng.choice(["linear", "attention", "norm", "activation", "residual"])
        if kind == "linear":
            F = int(rng.choice([1, 5, 8, 16, 24, 40, 64, 100]))
            cur = g.node("MatMul", [cur, g.const((rng.standard_normal((width, F)) / np.sqrt(width)).astype(np.float32))])
            if rng.random() < 0.7:
                cur = g.node("Add", [cur, g.const(rng.standard_normal(F).astype(np.float32))])
            width = F
        elif kind == "attention" and width % H == 0:
            dh = width // H
            q, k, v = (_heads(g, rng, cur, [B, S, H, dh], perm) for perm in ([0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3]))
            p = g.node("Softmax", [g.node("Div", [g.node("MatMul", [q, k]), f32(np.sqrt(dh))])], axis=-1)
            o = g.node("Transpose", [g.node("MatMul", [p, v])], perm=[0, 2, 1, 3])
            cur = g.node("Reshape", [o, g.const(np.array([B, S, width], np.int64))])
        elif kind == "norm":
            if rng.random() < 0.5:
                cur = g.node("LayerNormalization", [cur, g.const(rng.standard_normal(width).astype(np.float32)),
                                                    g.const(rng.standard_normal(width).astype(np.float32))],
                             axis=-1, epsilon=1e-5)
            else:
                centered = g.node("Sub", [cur, g.node("ReduceMean", [cur], axes=[-1], keepdims=1)])   # opset 17: axes an attribute
                var = g.node("ReduceMean", [g.node("Pow", [centered, f32(2.0)])], axes=[-1], keepdims=1)
                cur = g.node("Div", [centered, g.node("Sqrt", [g.node("Add", [var, f32(1e-5)])])])
        elif kind == "activation":
            act = rng.choice(["Relu", "Tanh", "Sigmoid", "gelu"])
            if act == "gelu":
                erf = g.node("Erf", [g.node("Div", [cur, f32(np.sqrt(2))])])
                cur = g.node("Mul", [g.node("Mul", [cur, g.node("Add", [erf, f32(1.0)])]), f32(0.5)])
            else:
                cur = g.node(str(act), [cur])
        elif kind == "residual" and width == D:
            cur = g.node("Add", [cur, "x"])
    return (g.model([B, S, D], cur), [B, S, D]) if g.nodes else None


def _heads(g, rng, x, split: list, perm: list) -> str:
    """A projection of `x` [B, S, H*dh] split into heads ([B, S, H, dh], `split`) and transposed."""
    width = split[2] * split[3]
    w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    t = g.node("Reshape", [g.node("MatMul", [x, g.const(w)]), g.const(np.array(split, np.int64))])
    return g.node("Transpose", [t], perm=perm)


GENERATORS = {"conv": conv_graph, "transformer": transformer_graph}


def reference(model, x):
    """onnxruntime's output, or None when it refuses the graph."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return session.run(None, {"x": x})[0]
    except Exception:  # noqa: BLE001 - a graph the reference cannot run is no test
        return None


def check(model, x, ref) -> str | None:
    """None if tunefarm's output matches `ref`, else what went wrong."""
    from compiler.graph import from_onnx
    from compiler.graph.runtime import build_model
    try:
        got = build_model(from_onnx(model)).run(x=x)[0]
    except Exception as e:  # noqa: BLE001 - every failure is a finding
        return f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    if got.shape != ref.shape:
        return f"shape {got.shape}, onnxruntime {ref.shape}"
    err = float(np.abs(got.astype(np.float64) - ref).max() / (np.abs(ref).max() + 1e-6))
    if not np.isfinite(err) or err > TOLERANCE:
        return f"wrong: max error {err:.3g} of the reference's largest magnitude"
    return None


def describe(model) -> str:
    from onnx import helper
    return "; ".join(f"{n.op_type}{ {a.name: helper.get_attribute_value(a) for a in n.attribute} or ''}"
                     for n in model.graph.node)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=200, help="seeds per generator")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--seed", type=int, default=None, help="one seed (with --verbose: its graph)")
    ap.add_argument("--kind", nargs="+", choices=sorted(GENERATORS), default=sorted(GENERATORS))
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else list(range(args.start, args.start + args.seeds))
    t0 = time.perf_counter()
    ran = {k: 0 for k in args.kind}
    drawn = {k: 0 for k in args.kind}
    findings = []
    for kind in args.kind:
        for seed in seeds:
            rng = np.random.default_rng(seed)
            made = GENERATORS[kind](rng)
            if made is None:
                continue
            model, x_shape = made
            drawn[kind] += 1
            x = rng.standard_normal(x_shape).astype(np.float32)
            ref = reference(model, x)
            if ref is None:
                continue
            ran[kind] += 1
            problem = check(model, x, ref)
            if args.verbose:
                print(f"{kind} seed {seed}: input {x_shape}: {describe(model)}\n  -> {problem or 'ok'}")
            if problem:
                findings.append({"kind": kind, "seed": seed, "message": problem})
                print(f"FINDING {kind} seed {seed}: {problem}  [{describe(model)}] input {x_shape}", flush=True)
    print(f"{'generator':<14}{'graphs':>8}{'run':>8}{'findings':>10}")
    for kind in args.kind:
        print(f"{kind:<14}{drawn[kind]:>8}{ran[kind]:>8}{sum(f['kind'] == kind for f in findings):>10}")
    print(json.dumps({"seeds": len(seeds), "start": seeds[0], "ran": ran, "findings": findings,
                      "seconds": round(time.perf_counter() - t0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
