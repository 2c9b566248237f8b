"""What the run-time index checks cost (issue 54): the same gathers built checked and clamped.

Every index read from data is checked at run time (compiler/index_checks.py): a compare and an
unlikely branch per index (per vector of indices where they vary across the lanes). Here each
case is built twice in one process, by the same default schedule, once as the product builds it
and once with `build(..., index_checks=False)`, which clamps the index instead (the old
behaviour, and what a kernel with no checks would cost), and the two are timed in alternating
rounds on the same inputs:

- `embed_<n>`: a BERT-base word-embedding lookup, table 30522 x 768 float32, n = 128..512 int64
  ids, written with the tensor-expression API (out[i, j] = T[ids[i], j]);
- `bert_embeddings_<n>`: BERT's embedding sum as an ONNX graph, its largest fused group through
  the model path (graph/ops data_index: ONNX's [-n, n), negatives wrapped): the word Gather, a
  Gather of a data-dependent permutation of the 768 features (an index per vector lane), and the
  two Adds of the position and token-type embeddings (their Gathers are kernels of their own).

Each round times each kernel for about `--sample-ms` through its native entry (no Python checks
in the loop); a case's times are the medians over `--rounds` rounds and its `ratio` the median of
the rounds' checked / clamped (paired rounds move less than either time on a shared host).
Prints a table; the last line is JSON: per case the checked and clamped microseconds and
`ratio`, and `ratio_geomean` over the cases.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import compiler as C
from compiler.graph import from_onnx
from compiler.graph.fuse import fuse
from compiler.graph.runtime import for_target
from compiler.graph.workloads import lower_group
from compiler.ops import default_schedule
from compiler.ops.custom import custom_op

VOCAB, HIDDEN, POSITIONS, TYPES = 30522, 768, 512, 2


def embed_case(n: int, rng) -> tuple:
    """(opdef, input arrays, numpy reference) of an n-id word-embedding lookup."""
    table = C.placeholder((VOCAB, HIDDEN), "float32", "table")
    ids = C.placeholder((n,), "int64", "ids")
    out = C.compute((n, HIDDEN), lambda i, j: table[ids[i], j], name="embed")
    arrays = [rng.standard_normal((VOCAB, HIDDEN), dtype=np.float32), rng.integers(0, VOCAB, n)]
    return custom_op(f"embed_{n}", [table, ids], out), arrays, arrays[0][arrays[1]]


def bert_embeddings_case(n: int, rng) -> tuple:
    """(opdef, input arrays, numpy reference) of BERT's three embedding lookups summed, one fused
    group of the model path."""
    words = rng.standard_normal((VOCAB, HIDDEN), dtype=np.float32)
    pos = rng.standard_normal((POSITIONS, HIDDEN), dtype=np.float32)
    types = rng.standard_normal((TYPES, HIDDEN), dtype=np.float32)
    nodes = [helper.make_node("Gather", ["words", "ids"], ["w0"], name="word_embeddings"),
             helper.make_node("Gather", ["w0", "perm"], ["w"], name="feature_permutation", axis=2),
             helper.make_node("Gather", ["pos", "pos_ids"], ["p"], name="position_embeddings"),
             helper.make_node("Gather", ["types", "type_ids"], ["t"], name="token_type_embeddings"),
             helper.make_node("Add", ["w", "p"], ["wp"]), helper.make_node("Add", ["wp", "t"], ["y"])]
    inputs = [helper.make_tensor_value_info(name, TensorProto.INT64, [1, n]) for name in ("ids", "pos_ids", "type_ids")]
    inputs.append(helper.make_tensor_value_info("perm", TensorProto.INT64, [HIDDEN]))
    graph = helper.make_graph(nodes, "bert_embeddings", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n, HIDDEN])],
                              [numpy_helper.from_array(a, k) for k, a in (("words", words), ("pos", pos), ("types", types))])
    g = for_target(from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])), None)
    group = max(fuse(g), key=lambda grp: len(grp.nodes))   # Gather, Gather, Add, Add
    gk = lower_group(g, group)
    feeds = {"ids": rng.integers(-VOCAB, VOCAB, (1, n)), "perm": rng.permutation(HIDDEN)}
    p, t = pos[np.arange(n)][None], types[rng.integers(0, TYPES, (1, n))]   # the other Gathers' kernels' outputs
    values = {"words": words, "p": p, "t": t, **feeds}
    arrays = [values[a] for a in gk.args]
    ref = words[feeds["ids"]][..., feeds["perm"]] + p + t
    return gk.opdef, arrays, ref


def build_pair(opdef) -> tuple:
    """(checked kernel, clamped kernel) of one schedule."""
    schedule = default_schedule(opdef)
    return (C.build(schedule, opdef.tensors, name="checked"),
            C.build(default_schedule(opdef), opdef.tensors, name="clamped", index_checks=False))


def time_pair(kernels, arrays, out_shape, sample_s: float, rounds: int) -> tuple:
    """(median seconds per call of each kernel, median over rounds of the first's time over the
    second's in the same round, the outputs), timed in alternating rounds of about `sample_s`
    each: on a shared host the paired ratio moves less than either time."""
    outs = [np.full(out_shape, np.nan, np.float32) for _ in kernels]
    calls_of = []
    for k, out in zip(kernels, outs):
        ptrs = [*k.check_args([*arrays, out]), k.error_record()]
        calls_of.append((k._load(), ptrs))
    t0 = time.perf_counter()
    for fn, ptrs in calls_of:          # warm-up, and the calls a sample takes
        for _ in range(3):
            assert fn(*ptrs) == 0
    calls = max(1, int(sample_s / ((time.perf_counter() - t0) / (3 * len(kernels)))))
    samples: list = [[] for _ in kernels]
    for r in range(rounds):
        order = range(len(kernels)) if r % 2 == 0 else reversed(range(len(kernels)))
        for i in order:
            fn, ptrs = calls_of[i]
            t0 = time.perf_counter()
            for _ in range(calls):
                fn(*ptrs)
            samples[i].append((time.perf_counter() - t0) / calls)
    paired = statistics.median(a / b for a, b in zip(samples[0], samples[1]))
    return [statistics.median(s) for s in samples], paired, outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[128, 256, 512])
    ap.add_argument("--sample-ms", type=float, default=20.0, help="length of one timed sample")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    C.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    report: dict = {"threads": args.threads, "cases": {}}
    rows = [("case", "checked us", "clamped us", "ratio")]
    for make in (embed_case, bert_embeddings_case):
        for n in args.sizes:
            opdef, arrays, ref = make(n, rng)
            kernels = build_pair(opdef)
            (t_checked, t_clamped), ratio, outs = time_pair(kernels, arrays, ref.shape, args.sample_ms / 1e3,
                                                            args.rounds)
            for out in outs:
                np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-6)
            name = f"{make.__name__[:-5]}_{n}"
            report["cases"][name] = {"checked_us": round(t_checked * 1e6, 2), "clamped_us": round(t_clamped * 1e6, 2),
                                     "ratio": round(ratio, 3)}
            rows.append((name, f"{t_checked * 1e6:.2f}", f"{t_clamped * 1e6:.2f}", f"{ratio:.3f}"))
            print(f"  {name}: checked {t_checked * 1e6:.2f} us, clamped {t_clamped * 1e6:.2f} us", flush=True)
    ratios = [c["ratio"] for c in report["cases"].values()]
    report["ratio_geomean"] = round(math.exp(sum(math.log(r) for r in ratios) / len(ratios)), 3)
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths))))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
