"""Fusion groups, the workloads they become (stable keys the tuner finds again), schedules from a
provider, and the memory plan."""

from __future__ import annotations

import numpy as np
import pytest
from graph_models import assert_close, model, np_conv, rand
from onnx import helper

from compiler.dispatch import DispatchContext
from compiler.graph import build_model, extract_tasks, from_onnx, fuse, lower_group
from compiler.ops import default_schedule
from compiler.ops.schedule_anchor import anchor_view, product_schedule_kind

RNG = np.random.default_rng(11)


def conv(x, w, y, name, **kw):
    return helper.make_node("Conv", [x, w], [y], name=name, kernel_shape=[3, 3], pads=[1, 1, 1, 1], **kw)


def residual_block(C=4, H=6):
    """conv → BN → relu → conv (+bias) → add x → relu → transpose → add 1 → relu (an injective tail)."""
    nodes = [conv("x", "w1", "c1", "conv1"),
             helper.make_node("BatchNormalization", ["c1", "g", "b", "m", "v"], ["bn"], name="bn"),
             helper.make_node("Relu", ["bn"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "x"], ["s"], name="residual"),
             helper.make_node("Relu", ["s"], ["r2"], name="relu2"),
             helper.make_node("Transpose", ["r2"], ["t"], perm=[0, 2, 3, 1], name="to_nhwc"),
             helper.make_node("Add", ["t", "one"], ["t1"], name="plus_one"),
             helper.make_node("Sigmoid", ["t1"], ["y"], name="sig")]
    inits = dict(w1=rand(RNG, (C, C, 3, 3)), w2=rand(RNG, (C, C, 3, 3)), b2=rand(RNG, (C,)),
                 g=rand(RNG, (C,)), b=rand(RNG, (C,)), m=rand(RNG, (C,)),
                 v=RNG.uniform(0.5, 1.5, C).astype(np.float32), one=np.array(1.0, np.float32))
    return model(nodes, {"x": ((1, C, H, H), "float32")}, {"y": (None, "float32")}, inits), inits


def test_groups_follow_the_fusion_rules():
    m, _ = residual_block()
    groups = fuse(from_onnx(m))
    assert [g.describe() for g in groups] == ["Conv+Relu", "Conv+Add+Relu", "Transpose+Add+Sigmoid"]
    # the residual add reads the block's input from outside its group
    assert groups[1].inputs[-1] == "x"


def _two_readers_of_relu(second_reader: str):
    """conv → relu → (sigmoid, `second_reader`) → add; the conv's output is also a graph output."""
    nodes = [conv("x", "w", "c", "conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),          # c is also an output
             helper.make_node("Sigmoid", ["r"], ["s1"], name="s1"),        # r has two readers
             helper.make_node(second_reader, ["r"], ["s2"], name="s2"),
             helper.make_node("Add", ["s1", "s2"], ["y"], name="add")]
    return model(nodes, {"x": ((1, 2, 5, 5), "float32")}, {"c": (None, "float32"), "y": (None, "float32")},
                 {"w": rand(RNG, (2, 2, 3, 3))})


def _run_two_readers(m, second):
    x = rand(RNG, (1, 2, 5, 5))
    module = build_model(from_onnx(m))
    for block in module._blocks:   # poisoned: a value nothing wrote shows up as NaN
        block.view(np.uint8)[:] = 0xFF
    c, y = module.run(x=x)
    want_c = np_conv(x, from_onnx(m).values["w"].const, pads=(1, 1, 1, 1))
    assert_close(c, want_c)
    r = np.maximum(want_c, 0)
    assert_close(y, 1 / (1 + np.exp(-r)) + second(r))


def test_a_graph_output_ends_a_group_and_readers_meeting_again_join_it():
    m = _two_readers_of_relu("Tanh")
    groups = fuse(from_onnx(m))
    # c is a graph output: the conv stands alone; relu's two readers meet again in the Add, a
    # closed diamond nothing outside reads, so relu takes all of it
    assert [g.describe() for g in groups] == ["Conv", "Relu+Sigmoid+Tanh+Add"]
    assert groups[1].inputs == ["c"]
    _run_two_readers(m, np.tanh)


def test_a_diamond_with_an_opaque_reader_ends_the_group():
    m = _two_readers_of_relu("Softmax")
    groups = fuse(from_onnx(m))
    # the Add joins the first of its producers' chains; that group runs after Softmax, which it reads
    assert [g.describe() for g in groups] == ["Conv", "Relu", "Softmax", "Sigmoid+Add"]

    def softmax(r):
        e = np.exp(r - r.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    _run_two_readers(m, softmax)


def test_fused_block_matches_numpy():
    m, p = residual_block()
    x = rand(RNG, (1, 4, 6, 6))
    module = build_model(from_onnx(m))
    (y,) = module.run(x=x)
    s = (1, -1, 1, 1)
    bn = (np_conv(x, p["w1"], pads=(1, 1, 1, 1)) - p["m"].reshape(s)) / np.sqrt(p["v"].reshape(s) + 1e-5) \
        * p["g"].reshape(s) + p["b"].reshape(s)
    r2 = np.maximum(np_conv(np.maximum(bn, 0), p["w2"], p["b2"], pads=(1, 1, 1, 1)) + x, 0)
    assert_close(y, 1 / (1 + np.exp(-(r2.transpose(0, 2, 3, 1) + 1))))


def test_repeated_layers_are_one_workload_with_a_weight():
    C = 4
    nodes = [conv("x", "w1", "a", "c1"), helper.make_node("Relu", ["a"], ["ra"]),
             conv("ra", "w2", "b", "c2"), helper.make_node("Relu", ["b"], ["rb"]),
             conv("rb", "w3", "c", "c3"), helper.make_node("Relu", ["c"], ["y"])]
    inits = {f"w{i}": rand(RNG, (C, C, 3, 3)) for i in (1, 2, 3)}
    m = model(nodes, {"x": ((1, C, 5, 5), "float32")}, {"y": (None, "float32")}, inits)
    tasks = extract_tasks(from_onnx(m))
    assert len(tasks) == 1 and tasks[0].weight == 3
    assert tasks[0].opdef.name == "fused_conv_relu"
    assert tasks[0].opdef.flops == 2 * C * 25 * C * 9 + C * 25
    # the same model read again gives the same key: keys depend on structure and shapes only
    again = extract_tasks(from_onnx(m))
    assert again[0].key == tasks[0].key


def test_fused_workload_round_trips_through_the_tuner():
    """The tuner stores a fused group as its DAG definition; rebuilt from JSON it has the same
    key and the same default schedule, so records tuned for it are found at build time."""
    from tuner.workload import Workload
    m, _ = residual_block()
    graph = from_onnx(m)
    for group in fuse(graph):
        gk = lower_group(graph, group)
        wl = Workload.from_compute(gk.opdef)
        rebuilt = wl.opdef()
        assert wl.key == gk.key == rebuilt.workload_key()
        assert default_schedule(rebuilt).steps == default_schedule(gk.opdef).steps


def test_anchor_schedules_are_the_operators():
    m, _ = residual_block()
    graph = from_onnx(m)
    views = [anchor_view(lower_group(graph, g).opdef) for g in fuse(graph)]
    assert [v.name if v else None for v in views] == ["conv2d_nchw", "conv2d_nchw", None]
    assert views[0].params["padding"] == (1, 1, 1, 1) and views[0].params["groups"] == 1


class OneSchedule(DispatchContext):
    """A schedule provider that knows one workload (what apply-best is to the compiler)."""

    def __init__(self, key):
        self.key, self.asked = key, []

    def lookup(self, opdef, target):
        self.asked.append(opdef.workload_key())
        if opdef.workload_key() != self.key:
            return None
        s = default_schedule(opdef, target)
        return s


def test_build_takes_schedules_from_the_records_provider():
    m, _ = residual_block()
    graph = from_onnx(m)
    tasks = extract_tasks(graph)
    provider = OneSchedule(tasks[1].key)
    module = build_model(graph, records=provider)
    assert sorted(provider.asked) == sorted(t.key for t in tasks)
    assert module.sources[tasks[1].key] == "records"
    assert [module.sources[t.key] for t in tasks].count("default") == len(tasks) - 1
    x = rand(RNG, (1, 4, 6, 6))
    (a,) = module.run(x=x)
    (b,) = build_model(graph).run(x=x)
    assert_close(a, b, rtol=1e-6)


def test_memory_plan_reuses_buffers_by_liveness():
    """Six convolutions in a chain: two intermediate buffers take turns (an output never shares
    a buffer with its own input), plus the input's and the output's."""
    C, n = 4, 6
    nodes, inits, prev = [], {}, "x"
    for i in range(n):
        out = "y" if i == n - 1 else f"a{i}"
        nodes.append(conv(prev, f"w{i}", out, f"conv{i}"))
        inits[f"w{i}"] = rand(RNG, (C, C, 3, 3))
        prev = out
    m = model(nodes, {"x": ((1, C, 8, 8), "float32")}, {"y": (None, "float32")}, inits)
    module = build_model(from_onnx(m))
    plan = module.plan
    assert len(plan.block_bytes) == 4
    assert plan.total_bytes == 4 * C * 64 * 4 and plan.unshared_bytes == (n + 1) * C * 64 * 4
    blocks = [plan.block_of[f"a{i}"] for i in range(n - 1)]
    assert all(a != b for a, b in zip(blocks, blocks[1:])) and len(set(blocks)) == 2
    x = rand(RNG, (1, C, 8, 8))
    want = x
    for i in range(n):
        want = np_conv(want, inits[f"w{i}"], pads=(1, 1, 1, 1))
    (y,) = module.run(x=x)
    assert_close(y, want)
    (y2,) = module.run(x=x)   # buffers are reused across runs too
    assert_close(y2, want)


def test_reshape_outputs_share_their_inputs_buffer():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("Gemm", ["f", "w"], ["y"], transB=1)]
    m = model(nodes, {"x": ((2, 3, 2, 2), "float32")}, {"y": (None, "float32")}, {"w": rand(RNG, (5, 12))})
    module = build_model(from_onnx(m))
    assert module.plan.block_of["f"] == module.plan.block_of["r"]
    assert len(module.steps) == 2
    w = from_onnx(m).values["w"].const
    x = rand(RNG, (2, 3, 2, 2))
    (y,) = module.run(x=x)
    assert_close(y, np.maximum(x, 0).reshape(2, 12) @ w.T.astype(np.float64))


@pytest.mark.parametrize("C, G, H, W", [(8, 2, 3, 5), (12, 3, 1, 4), (10, 5, 2, 1)])
def test_a_channel_shuffle_between_injective_nodes_is_one_kernel(C, G, H, W):
    """ShuffleNet's channel shuffle, Reshape → Transpose → Reshape, after a Transpose and before
    an Add: the group reads through both reshapes as index maps, one kernel for all of it,
    while a reshape nothing injective reads on either side stays an alias (no copy)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Reshape", ["r", "split"], ["s"]),
             helper.make_node("Transpose", ["s"], ["t"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["t", "merge"], ["m"]),
             helper.make_node("Add", ["m", "bias"], ["a"]),
             helper.make_node("Flatten", ["a"], ["f"]),
             helper.make_node("Gemm", ["f", "w"], ["y"], transB=1)]
    inits = {"split": np.array([1, G, C // G, H, W], np.int64), "merge": np.array([1, C, H, W], np.int64),
             "bias": rand(RNG, (C, 1, 1)), "w": rand(RNG, (3, C * H * W))}
    m = model(nodes, {"x": ((1, C, H, W), "float32")}, {"y": (None, "float32")}, inits)
    module = build_model(from_onnx(m))
    assert [s.group.group.describe() for s in module.steps] == ["Relu+Reshape+Transpose+Reshape+Add", "Gemm"]
    assert module.plan.block_of["f"] == module.plan.block_of["a"]
    x = rand(RNG, (1, C, H, W))
    (y,) = module.run(x=x)
    shuffled = np.maximum(x, 0).reshape(1, G, C // G, H, W).transpose(0, 2, 1, 3, 4).reshape(1, C, H, W)
    assert_close(y, (shuffled + inits["bias"]).reshape(1, -1) @ inits["w"].T.astype(np.float64))


@pytest.mark.parametrize("field", ["name", "shape", "dtype", "type"])
def test_run_refuses_mismatched_inputs(field):
    from compiler.graph import InputError
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    module = build_model(from_onnx(model(nodes, {"x": ((2, 3), "float32")}, {"y": (None, "float32")})))
    good = rand(RNG, (2, 3))
    bad = {"name": dict(input=good), "shape": dict(x=rand(RNG, (3, 2))), "dtype": dict(x=good.astype(np.float64)),
           "type": dict(x=good.tolist())}[field]
    match = {"name": "missing \\['x'\\]; unknown \\['input'\\]", "shape": "expected shape \\(2, 3\\)",
             "dtype": "expected dtype float32", "type": "numpy array"}[field]
    with pytest.raises(InputError, match=match):
        module.run(**bad)


@pytest.mark.parametrize("batch,packed", [(1, False), (64, True)])
def test_linear_layers_read_a_transposed_weight_packed_only_when_rows_reuse_it(batch, packed):
    """Gemm(transB=1)'s constant [out, in] weight is laid out [in, out] at compile time; a batch-1
    layer (one row tile) reads it in place, a batch-64 one reads it in the panels it is packed
    into at build time (prepack_matmul_weights), never packing it per call."""
    w = rand(RNG, (24, 40))
    nodes = [helper.make_node("Gemm", ["x", "w"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["y"])]
    m = model(nodes, {"x": ((batch, 40), "float32")}, {"y": (None, "float32")}, {"w": w})
    graph = from_onnx(m)
    gemm = graph.nodes[0]
    assert gemm.attrs["transB"] == 0 and graph.values[gemm.inputs[1]].shape == (40, 24)
    (task,) = extract_tasks(graph)
    steps = [s["op"] for s in default_schedule(task.opdef).steps]
    assert "cache_read" not in steps
    assert (product_schedule_kind(task.opdef) == "gemm-prepacked") == packed
    x = rand(RNG, (batch, 40))
    (y,) = build_model(graph).run(x=x)
    assert_close(y, np.maximum(x.astype(np.float64) @ w.T, 0))


@pytest.mark.parametrize("rows", [2, 3, 5])
def test_a_few_rows_read_a_constant_weight_in_panels(rows):
    """A product of a few rows (a decode step of a small batch: one register tile of rows) reads
    its constant weight in the column panels laid out at build time, zero-padded past N, not in
    place (a row N floats long per k step)."""
    K, N = 50, 37
    w = rand(RNG, (K, N))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    m = model(nodes, {"x": ((rows, 1, K), "float32")}, {"y": (None, "float32")}, {"w": w})
    graph = from_onnx(m)
    (task,) = extract_tasks(graph)
    assert product_schedule_kind(task.opdef) == "gemm-prepacked"
    x = rand(RNG, (rows, 1, K))
    (y,) = build_model(graph).run(x=x)
    assert_close(y, x.astype(np.float64) @ w)


def test_compile_time_constants_are_not_kernel_arguments():
    """A Slice's starts/ends/axes/steps are read at compile time only: two slices of the same
    shape with differently spelled arguments are one workload with one argument."""
    x = rand(RNG, (4, 6))
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax"], ["a"]),
             helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["b"]),
             helper.make_node("Relu", ["a"], ["ra"]), helper.make_node("Relu", ["b"], ["rb"])]
    inits = dict(st=np.array([1, 0], np.int64), en=np.array([3, 6], np.int64), ax=np.array([0, 1], np.int64),
                 sp=np.array([1, 1], np.int64))
    m = model(nodes, {"x": ((4, 6), "float32")}, {"ra": (None, "float32"), "rb": (None, "float32")}, inits)
    tasks = extract_tasks(from_onnx(m))
    assert len(tasks) == 1 and tasks[0].weight == 2 and len(tasks[0].opdef.inputs) == 1
    ra, rb = build_model(from_onnx(m)).run(x=x)
    assert_close(ra, np.maximum(x[1:3], 0))
    assert_close(rb, np.maximum(x[1:3], 0))


def test_constant_conv_weights_are_prepacked_for_the_channel_vector_schedule():
    """Where the target's default conv schedule vectorizes over output channels, the model's
    constant weights come pre-packed in its channel blocks (no packing on every call); the
    result is the same convolution."""
    from compiler.ops import get_op
    from compiler.ops.schedule_conv import channel_tile, channel_vectors_pay
    from compiler.target import Target
    C, F = 16, 32
    w, b = rand(RNG, (F, C, 3, 3)), rand(RNG, (F,))
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    m = model(nodes, {"x": ((1, C, 6, 6), "float32")}, {"y": (None, "float32")}, {"w": w, "b": b})
    (task,) = extract_tasks(from_onnx(m))
    view = get_op("conv2d_nchw", N=1, C=C, H=6, W=6, F=F, KH=3, KW=3, padding=1)
    host = Target.host()
    if channel_vectors_pay(view, host):
        fb = channel_tile(view, host)[0]
        assert task.opdef.inputs[1].shape == (F // fb, C, 3, 3, fb)
        steps = default_schedule(task.opdef).steps   # the input may be copied, never the weights
        assert not [s for s in steps if s["op"] == "cache_read" and s["tensor"] == "input1"]
    else:
        assert task.opdef.inputs[1].shape == (F, C, 3, 3)
    x = rand(RNG, (1, C, 6, 6))
    (y,) = build_model(from_onnx(m)).run(x=x)
    assert_close(y, np.maximum(np_conv(x, w, b, pads=(1, 1, 1, 1)), 0))
    # an AVX2 target (8 lanes) blocks the same weights by its own tile
    avx2 = "llvm -mtriple=x86_64-linux-gnu -mcpu=haswell"
    (t2,) = extract_tasks(from_onnx(m), target=avx2)
    assert t2.opdef.inputs[1].ndim == 5 and t2.opdef.inputs[1].shape[-1] % 8 == 0


@pytest.mark.parametrize("K, vectors, act", [(37, 5, "Relu"), (64, 13, None), (5, 16, "Relu"), (300, 125, None)])
def test_batch1_dense_layers_stream_their_rows(K, vectors, act):
    """A batch-1 dense layer (MatMul + bias, B [K, N] in whole vectors of columns) is scheduled
    as a streamed row (schedule_gemv: chunks of columns per thread, no packing), whatever the
    chunking of N's vectors, and computes the layer."""
    from compiler.ops.schedule_common import lanes
    from compiler.target import Target
    N = vectors * lanes(Target.host(), "float32")
    w, b = rand(RNG, (K, N)), rand(RNG, (N,))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a" if act else "y"])]
    if act:
        nodes.append(helper.make_node(act, ["a"], ["y"]))
    m = model(nodes, {"x": ((1, K), "float32")}, {"y": (None, "float32")}, {"w": w, "b": b})
    (task,) = extract_tasks(from_onnx(m))
    from compiler.ops.schedule_gemm import schedule_gemv
    steps = default_schedule(task.opdef).steps
    assert steps == schedule_gemv(anchor_view(task.opdef)).steps
    assert not [s for s in steps if s["op"] == "cache_read"]            # B read in place
    x = rand(RNG, (1, K))
    (y,) = build_model(from_onnx(m)).run(x=x)
    want = x.astype(np.float64) @ w + b
    assert_close(y, np.maximum(want, 0) if act else want)


def test_batch1_dense_layers_stream_in_narrower_vectors_when_the_target_s_do_not_divide_n():
    """A 1000-class classifier on AVX-512 (N = 125 half-vectors): schedule_gemv on half-width
    vectors instead of the GEMM tile walking B by column panels (19x slower there)."""
    from compiler.ops.schedule_common import lanes
    from compiler.ops.schedule_gemm import MIN_GEMV_LANES, schedule_gemv
    from compiler.target import Target
    width = lanes(Target.host(), "float32")
    if width // 2 < MIN_GEMV_LANES:
        pytest.skip("the target's vectors are already the narrowest schedule_gemv takes")
    K, N = 40, 125 * (width // 2)
    w, b = rand(RNG, (K, N)), rand(RNG, (N,))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    m = model(nodes, {"x": ((1, K), "float32")}, {"y": (None, "float32")}, {"w": w, "b": b})
    (task,) = extract_tasks(from_onnx(m))
    steps = default_schedule(task.opdef).steps
    assert steps == schedule_gemv(anchor_view(task.opdef), lanes=width // 2).steps
    assert not [s for s in steps if s["op"] == "cache_read"]
    module = build_model(from_onnx(m))
    for seed in range(2):
        x = rand(np.random.default_rng(seed), (1, K))
        (y,) = module.run(x=x)
        assert_close(y, x.astype(np.float64) @ w + b)


@pytest.mark.parametrize("first", [5, 16])
def test_a_concat_of_partial_blocks_between_blocked_convs_is_one_guarded_kernel(first):
    """A Concat of 5 + 16 channels splits channel blocks, so it runs in NCHW between blocked convs;
    FromNCHWc -> Concat -> ToNCHWc fuse into one kernel whose channel index is ToNCHWc's clamp
    min(c, C - 1) under the Concat's branch test on it (LoweringError 'can leave the tensor' before
    the bounds check used guards on a min; model_fuzz cnn seeds 10, 17, 28)."""
    other = 21 - first
    p = {"wa": rand(RNG, (first, 8, 1, 1)), "wb": rand(RNG, (other, 8, 3, 3)), "wc": rand(RNG, (16, 21, 1, 1))}
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], kernel_shape=[1, 1]),
             helper.make_node("Conv", ["x", "wb"], ["b"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["a", "b"], ["c"], axis=1),
             helper.make_node("Conv", ["c", "wc"], ["y"], kernel_shape=[1, 1])]
    m = model(nodes, {"x": ((1, 8, 5, 6), "float32")}, {"y": (None, "float32")}, p)
    x = rand(RNG, (1, 8, 5, 6))
    (y,) = build_model(from_onnx(m)).run(x=x)
    c = np.concatenate([np_conv(x, p["wa"]), np_conv(x, p["wb"], pads=(1, 1, 1, 1))], axis=1)
    assert_close(y, np_conv(c, p["wc"]))
