"""Small ONNX models built with onnx.helper, and numpy references, for the graph compiler's tests.

The suite needs neither torch nor onnxruntime: every model is written node by node here and
every expected output is computed in float64 numpy, independently of the compiler's operator
references.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from compiler.graph import build_model, from_onnx

NP_TO_ONNX = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE, "int64": TensorProto.INT64,
              "int32": TensorProto.INT32, "bool": TensorProto.BOOL, "int8": TensorProto.INT8}


def rand(rng, shape, dtype="float32", lo=0.1, hi=1.0):
    """Random non-zero values in ±[lo, hi] (zeros hide indexing bugs)."""
    a = rng.uniform(lo, hi, shape) * rng.choice(np.array([-1.0, 1.0]), shape)
    return np.asarray(a, dtype=dtype)


def model(nodes, inputs, outputs, inits=None, opset=13, dynamic=None):
    """A ModelProto. inputs/outputs: {name: (shape, dtype)} (outputs' shapes may be None);
    inits: {name: array}. `dynamic`: {input name: dim index} left symbolic."""
    dynamic = dynamic or {}

    def info(name, shape, dtype):
        if shape is None:
            return helper.make_tensor_value_info(name, NP_TO_ONNX[dtype], None)
        dims = ["batch" if dynamic.get(name) == d else s for d, s in enumerate(shape)]
        return helper.make_tensor_value_info(name, NP_TO_ONNX[dtype], dims)

    g = helper.make_graph(nodes, "test", [info(k, *v) for k, v in inputs.items()],
                          [info(k, *v) for k, v in outputs.items()],
                          [numpy_helper.from_array(np.asarray(a), k) for k, a in (inits or {}).items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def run(m, feeds, input_shapes=None):
    """Compile `m` with the default schedules and run it once on `feeds`."""
    module = build_model(from_onnx(m, input_shapes=input_shapes))
    return module.run(**feeds)


# ----------------------------------------------------------------------------- numpy references

def np_conv(x, w, b=None, stride=(1, 1), pads=(0, 0, 0, 0), dil=(1, 1), groups=1):
    x, w = x.astype(np.float64), w.astype(np.float64)
    N, C, H, W = x.shape
    F, cpg, KH, KW = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    OH = (H + pads[0] + pads[2] - (KH - 1) * dil[0] - 1) // stride[0] + 1
    OW = (W + pads[1] + pads[3] - (KW - 1) * dil[1] - 1) // stride[1] + 1
    out = np.zeros((N, F, OH, OW))
    fpg = F // groups
    for f in range(F):
        g = f // fpg
        for ky in range(KH):
            for kx in range(KW):
                win = xp[:, g * cpg:(g + 1) * cpg, ky * dil[0]:ky * dil[0] + (OH - 1) * stride[0] + 1:stride[0],
                         kx * dil[1]:kx * dil[1] + (OW - 1) * stride[1] + 1:stride[1]]
                out[:, f] += np.einsum("nchw,c->nhw", win, w[f, :, ky, kx])
    if b is not None:
        out += b.astype(np.float64).reshape(1, -1, 1, 1)
    return out


def np_pool(x, kernel, stride, pads, kind, count_include_pad=False):
    x = x.astype(np.float64)
    N, C, H, W = x.shape
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])), constant_values=fill)
    ones = np.pad(np.ones((H, W)), ((pads[0], pads[2]), (pads[1], pads[3])))
    OH = (H + pads[0] + pads[2] - kernel[0]) // stride[0] + 1
    OW = (W + pads[1] + pads[3] - kernel[1]) // stride[1] + 1
    out = np.zeros((N, C, OH, OW))
    for i in range(OH):
        for j in range(OW):
            win = xp[:, :, i * stride[0]:i * stride[0] + kernel[0], j * stride[1]:j * stride[1] + kernel[1]]
            if kind == "max":
                out[:, :, i, j] = win.max(axis=(2, 3))
            else:
                cnt = kernel[0] * kernel[1] if count_include_pad else \
                    ones[i * stride[0]:i * stride[0] + kernel[0], j * stride[1]:j * stride[1] + kernel[1]].sum()
                out[:, :, i, j] = win.sum(axis=(2, 3)) / cnt
    return out


def np_softmax(x, axis):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_erf(x):
    return np.vectorize(math.erf)(np.asarray(x, np.float64))


def np_bn(x, g, b, m, v, eps=1e-5):
    s = (1, -1, 1, 1)
    return (x.astype(np.float64) - m.reshape(s)) / np.sqrt(v.reshape(s) + eps) * g.reshape(s) + b.reshape(s)


def assert_close(got, want, rtol=1e-5):
    """Equal within rtol of the largest magnitude of `want` (float32 over long sums)."""
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = max(float(np.max(np.abs(want))), 1e-30) if want.size else 1.0
    err = float(np.max(np.abs(got.astype(np.float64) - want))) if want.size else 0.0
    assert err <= rtol * scale, f"max error {err:.3g} > {rtol} x {scale:.3g}"
