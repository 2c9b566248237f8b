"""Concats computed in place (compiler/graph/concat_in_place.py): the producers write into the
output's buffer, no Concat kernel runs, and the values are what numpy computes; where the rule
does not hold the Concat stays a kernel and is just as right."""

from __future__ import annotations

import numpy as np
import pytest
from graph_models import assert_close, model, np_conv, rand
from onnx import helper

from compiler.graph import build_model, extract_tasks, from_onnx

RNG = np.random.default_rng(23)


def conv(x, w, y, k=1):
    return helper.make_node("Conv", [x, w], [y], name=f"conv_{y}", kernel_shape=[k, k], pads=[k // 2] * 4)


def relu(x, y):
    return helper.make_node("Relu", [x], [y], name=f"relu_{y}")


def concat(ins, y, axis=1):
    return helper.make_node("Concat", ins, [y], name=f"cat_{y}", axis=axis)


def kernels_of(module) -> list:
    return [s.group.group.describe() for s in module.steps]


def poisoned_run(module, **inputs):
    for block in module._blocks:   # nothing a run reads may be left over from before
        block.view(np.uint8)[:] = 0xFF
    return module.run(**inputs)


def fire_module(N=1, C=16, S=16, E=32, H=7):
    """SqueezeNet's fire module: squeeze 1x1, expand 1x1 and 3x3 side by side, concatenated."""
    nodes = [conv("x", "ws", "s"), relu("s", "sr"), conv("sr", "w1", "e1"), relu("e1", "e1r"),
             conv("sr", "w3", "e3", k=3), relu("e3", "e3r"), concat(["e1r", "e3r"], "cat"), conv("cat", "wo", "y")]
    inits = {"ws": rand(RNG, (S, C, 1, 1), lo=-1), "w1": rand(RNG, (E, S, 1, 1), lo=-1),
             "w3": rand(RNG, (E, S, 3, 3), lo=-1), "wo": rand(RNG, (16, 2 * E, 1, 1), lo=-1)}
    m = model(nodes, {"x": ((N, C, H, H), "float32")}, {"y": (None, "float32")}, inits)

    def reference(x):
        s = np.maximum(np_conv(x, inits["ws"]), 0)
        cat = np.concatenate([np.maximum(np_conv(s, inits["w1"]), 0),
                              np.maximum(np_conv(s, inits["w3"], pads=(1, 1, 1, 1)), 0)], axis=1)
        return np_conv(cat, inits["wo"])
    return m, reference, (N, C, H, H)


def test_a_fire_module_concat_runs_no_kernel():
    m, reference, shape = fire_module()
    module = build_model(from_onnx(m))
    assert not any("Concat" in k for k in kernels_of(module)), kernels_of(module)
    assert module.in_place_nodes == ["cat_cat"]
    assert not any("Concat" in t.opdef.name or "concat" in t.opdef.name for t in extract_tasks(from_onnx(m)))
    x = rand(RNG, shape, lo=-1)
    for _ in range(2):   # the buffers are reused across runs
        (y,) = poisoned_run(module, x=x)
        assert_close(y, reference(x))


def test_a_batch_concat_stays_a_kernel_and_is_right():
    """Batch 2: each input is two ranges of the output, not one; the copy stays."""
    m, reference, shape = fire_module(N=2)
    module = build_model(from_onnx(m))
    assert any("Concat" in k for k in kernels_of(module))
    x = rand(RNG, shape, lo=-1)
    (y,) = poisoned_run(module, x=x)
    assert_close(y, reference(x))


def test_nested_concats_grow_one_buffer():
    """DenseNet's growth: each layer reads the concatenation so far and is appended to it; both
    concats are placed, the second holding the first, which layer two reads while it writes
    beside it."""
    C, G, H = 16, 16, 5
    nodes = [relu("x", "x0"),
             conv("x0", "w1", "n1", k=3), concat(["x0", "n1"], "c1"),
             conv("c1", "w2", "n2", k=3), concat(["c1", "n2"], "c2"),
             conv("c2", "wo", "y")]
    inits = {"w1": rand(RNG, (G, C, 3, 3), lo=-1), "w2": rand(RNG, (G, C + G, 3, 3), lo=-1),
             "wo": rand(RNG, (16, C + 2 * G, 1, 1), lo=-1)}
    m = model(nodes, {"x": ((1, C, H, H), "float32")}, {"y": (None, "float32")}, inits)
    module = build_model(from_onnx(m))
    assert not any("Concat" in k for k in kernels_of(module)), kernels_of(module)
    x = rand(RNG, (1, C, H, H), lo=-1)
    x0 = np.maximum(x, 0)
    c1 = np.concatenate([x0, np_conv(x0, inits["w1"], pads=(1, 1, 1, 1))], axis=1)
    c2 = np.concatenate([c1, np_conv(c1, inits["w2"], pads=(1, 1, 1, 1))], axis=1)
    (y,) = poisoned_run(module, x=x)
    assert_close(y, np_conv(c2, inits["wo"]))


@pytest.mark.parametrize("case", ["same input twice", "graph input", "input is an output", "unaligned"])
def test_concats_the_rule_leaves_alone_are_still_right(case):
    """A value concatenated twice, a graph input, a value the caller also gets back, and inputs
    that would start off a 64-byte boundary keep their Concat kernel; every output is right."""
    H = 3
    nodes = [relu("x", "a"), helper.make_node("Sigmoid", ["x"], ["b"], name="sig")]
    outputs = {"y": (None, "float32")}
    if case == "same input twice":
        nodes.append(concat(["a", "a", "b"], "cat"))
    elif case == "graph input":
        nodes.append(concat(["x", "b"], "cat"))
    elif case == "input is an output":
        nodes.append(concat(["a", "b"], "cat"))
        outputs["a"] = (None, "float32")
    else:
        H = 1   # 3 channels x 1 x 1 x 4 bytes: the second input would start at byte 12
    if case == "unaligned":
        nodes.append(concat(["a", "b"], "cat"))
    nodes.append(helper.make_node("Mul", ["cat", "two"], ["y"], name="double"))
    m = model(nodes, {"x": ((1, 3, H, H), "float32")}, outputs, {"two": np.array(2.0, np.float32)})
    module = build_model(from_onnx(m))
    x = rand(RNG, (1, 3, H, H), lo=-1)
    a, b = np.maximum(x, 0), 1 / (1 + np.exp(-x.astype(np.float64)))
    parts = {"same input twice": [a, a, b], "graph input": [x, b]}.get(case, [a, b])
    got = poisoned_run(module, x=x)
    assert_close(got[0], 2 * np.concatenate(parts, axis=1))
    if case == "input is an output":
        assert_close(got[1], a)
    assert module.plan.offset_of == {}
