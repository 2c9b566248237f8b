"""Every inventory operator with its default schedule against numpy, in the same run.

Each operator runs at a realistic size (ResNet-50 / BERT-like shapes). Its kernel is checked
against the operator's float64 reference first, then it and a numpy version written the way a
user would write it (float32; an im2col + matmul for convolutions) are timed interleaved:
`--rounds` rounds of (ours, numpy), each the median of a few calls, and the median over rounds
is reported. Each measurement starts after a short sleep: the worker threads of OpenBLAS and
of libgomp busy-wait after a call, and would otherwise halve the other side's parallel speed.
Prints a table, and as its last line one JSON object:
{"speedup_vs_numpy": {op: numpy_time / our_time}, "gflops": {op: ... or null}, "build_ms": {op: build_op's
time}, ...}.

    .venv/bin/python bench/compiler_ops.py [--rounds 5] [--only conv2d_nchw,softmax]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import compiler  # noqa: E402
from compiler.ops import build_op, get_op, random_inputs  # noqa: E402

# ----------------------------------------------------------------------------- numpy versions

def np_conv_nchw(x, w, stride=1, pad=1):
    n, c, h, wd = x.shape
    f, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    cols = np.empty((c, kh, kw, n, oh, ow), x.dtype)
    for i in range(kh):
        for j in range(kw):
            cols[:, i, j] = xp[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride].transpose(1, 0, 2, 3)
    out = w.reshape(f, -1) @ cols.reshape(c * kh * kw, -1)
    return out.reshape(f, n, oh, ow).transpose(1, 0, 2, 3)


def np_conv_nhwc(x, w, stride=1, pad=1):
    n, h, wd, c = x.shape
    kh, kw, _, f = w.shape
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    cols = np.empty((n, oh, ow, kh, kw, c), x.dtype)
    for i in range(kh):
        for j in range(kw):
            cols[:, :, :, i, j] = xp[:, i:i + stride * oh:stride, j:j + stride * ow:stride]
    return (cols.reshape(-1, kh * kw * c) @ w.reshape(-1, f)).reshape(n, oh, ow, f)


def np_depthwise(x, w, pad=1):
    n, c, h, wd = x.shape
    _, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    out = np.zeros((n, c, oh, ow), x.dtype)
    for i in range(kh):
        for j in range(kw):
            out += xp[:, :, i:i + oh, j:j + ow] * w[None, :, 0, i, j, None, None]
    return out


def np_max_pool(x, k=3, s=2, p=1):
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)), constant_values=-np.inf)
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    out = np.full((n, c, oh, ow), -np.inf, x.dtype)
    for i in range(k):
        for j in range(k):
            np.maximum(out, xp[:, :, i:i + s * oh:s, j:j + s * ow:s], out=out)
    return out


def np_avg_pool_2x2(x):
    # four strided slices: several times faster than x.reshape(n, c, h/2, 2, w/2, 2).mean((3, 5))
    return (x[:, :, 0::2, 0::2] + x[:, :, 1::2, 0::2] + x[:, :, 0::2, 1::2] + x[:, :, 1::2, 1::2]) * np.float32(0.25)


def np_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def np_layer_norm(x, g, b, eps=1e-5):
    m = x.mean(axis=-1, keepdims=True)
    v = x.var(axis=-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * g + b


def np_gelu(x):
    # numpy has no erf: the tanh form is what a numpy user writes (the kernel computes the erf form)
    return 0.5 * x * (1.0 + np.tanh(np.float32(0.7978845608) * (x + np.float32(0.044715) * x * x * x)))


# op key, inventory name, params, numpy function of the input arrays
CASES = [
    ("matmul", "matmul", dict(M=1024, N=1024, K=1024), lambda a, b: a @ b),
    ("dense", "dense", dict(batch=128, in_dim=768, out_dim=3072), lambda x, w, b: x @ w.T + b),
    ("batch_matmul", "batch_matmul", dict(B=12, M=128, N=128, K=64), lambda a, b: np.matmul(a, b)),
    ("conv2d_nchw", "conv2d_nchw", dict(N=1, C=64, H=56, W=56, F=64, KH=3, KW=3, padding=1), np_conv_nchw),
    ("conv2d_nhwc", "conv2d_nhwc", dict(N=1, C=64, H=56, W=56, F=64, KH=3, KW=3, padding=1), np_conv_nhwc),
    ("depthwise_conv2d", "depthwise_conv2d_nchw", dict(N=1, C=144, H=56, W=56, KH=3, KW=3, padding=1),
     np_depthwise),
    ("max_pool2d", "max_pool2d", dict(N=1, C=64, H=112, W=112, kernel=3, stride=2, padding=1), np_max_pool),
    ("avg_pool2d", "avg_pool2d", dict(N=1, C=256, H=56, W=56, kernel=2, stride=2), np_avg_pool_2x2),
    ("softmax", "softmax", dict(shape=(1024, 1024)), np_softmax),
    ("layer_norm", "layer_norm", dict(shape=(2048, 1024)), np_layer_norm),
    ("add", "add", dict(shape_a=(1024, 1024)), lambda a, b: a + b),
    ("relu", "relu", dict(shape=(1024, 1024)), lambda x: np.maximum(x, 0)),
    ("gelu", "gelu", dict(shape=(512, 3072)), np_gelu),
    ("sum", "reduce_sum", dict(shape=(1024, 1024), axis=-1), lambda x: x.sum(axis=-1)),
    ("transpose", "transpose", dict(shape=(1024, 1024)), lambda x: x.T.copy()),
    ("pad", "pad", dict(shape=(1, 64, 56, 56), pad_before=(0, 0, 1, 1), pad_after=(0, 0, 1, 1)),
     lambda x: np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))),
]


def time_numpy(fn, args, number: int, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn(*args)
        times.append((time.perf_counter() - t0) / number)
    return statistics.median(times)


def run_case(key, name, params, np_fn, rounds: int, rng, cooldown: float):
    op = get_op(name, **params)
    t0 = time.perf_counter()
    kernel = build_op(op)
    build_s = time.perf_counter() - t0
    arrays = random_inputs(op, rng)
    out = np.full(op.output.shape, np.nan, op.output.dtype)
    kernel(*arrays, out)
    want = op.reference(*arrays)
    np.testing.assert_allclose(out, want, rtol=2e-4, atol=2e-4, err_msg=f"{key}: kernel differs from reference")
    got_np = np.asarray(np_fn(*arrays))
    np.testing.assert_allclose(got_np.reshape(want.shape), want, rtol=2e-3, atol=2e-3,
                               err_msg=f"{key}: numpy version differs from reference")
    # ~20 ms per measurement for either side
    t_np = time_numpy(np_fn, arrays, 1, 1)
    number = max(1, int(0.02 / max(t_np, 1e-6)))
    evaluator = kernel.time_evaluator(number=1, repeat=3, min_repeat_ms=20)
    ours, ref = [], []
    for _ in range(rounds):
        time.sleep(cooldown)
        ours.append(evaluator(*arrays, out).median)
        time.sleep(cooldown)
        ref.append(time_numpy(np_fn, arrays, number, 3))
    t_ours, t_ref = statistics.median(ours), statistics.median(ref)
    gflops = op.flops / t_ours / 1e9 if op.flops else None
    nbytes = sum(a.nbytes for a in arrays) + out.nbytes
    return dict(key=key, params=params, ours_ms=t_ours * 1e3, numpy_ms=t_ref * 1e3, speedup=t_ref / t_ours,
                gflops=gflops, gbps=nbytes / t_ours / 1e9, build_ms=build_s * 1e3)


def _fmt_params(p: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in p.items() if k not in ("dtype",))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of ours vs numpy")
    ap.add_argument("--only", default="", help="comma-separated op keys")
    ap.add_argument("--cooldown", type=float, default=0.15,
                    help="seconds of sleep before each measurement: OpenBLAS and libgomp worker threads "
                         "spin for a while after a call and would steal the other side's cores")
    args = ap.parse_args()
    only = {k for k in args.only.split(",") if k}
    rng = np.random.default_rng(0)
    rows = []
    t_start = time.perf_counter()
    for key, name, params, np_fn in CASES:
        if only and key not in only:
            continue
        rows.append(run_case(key, name, params, np_fn, args.rounds, rng, args.cooldown))
        r = rows[-1]
        print(f"  {key}: ours {r['ours_ms']:.3f} ms  numpy {r['numpy_ms']:.3f} ms", file=sys.stderr, flush=True)
    print(f"{'op':<18}{'params':<62}{'ours ms':>9}{'numpy ms':>10}{'speedup':>9}{'GFLOPS':>8}{'GB/s':>7}{'build ms':>10}")
    for r in rows:
        g = f"{r['gflops']:.1f}" if r["gflops"] is not None else "-"
        print(f"{r['key']:<18}{_fmt_params(r['params'])[:60]:<62}{r['ours_ms']:>9.3f}{r['numpy_ms']:>10.3f}"
              f"{r['speedup']:>8.2f}x{g:>8}{r['gbps']:>7.1f}{r['build_ms']:>10.0f}")
    speedups = [r["speedup"] for r in rows]
    geo = float(np.exp(np.mean(np.log(speedups)))) if speedups else None
    print(f"geomean speedup {geo:.2f}x over {len(rows)} ops, {time.perf_counter() - t_start:.0f} s, "
          f"{compiler.Target.host().cpu}, {compiler.Target.host().num_cores} cores")
    result = {
        "speedup_vs_numpy": {r["key"]: round(r["speedup"], 3) for r in rows},
        "gflops": {r["key"]: (round(r["gflops"], 2) if r["gflops"] is not None else None) for r in rows},
        "ms": {r["key"]: round(r["ours_ms"], 4) for r in rows},
        "numpy_ms": {r["key"]: round(r["numpy_ms"], 4) for r in rows},
        "geomean_speedup": round(geo, 3) if geo else None,
        "build_ms": {r["key"]: round(r["build_ms"], 1) for r in rows},   # schedule, lower, LLVM: build_op's time
        "build_ms_total": round(sum(r["build_ms"] for r in rows), 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
