"""Compute DAGs as JSON (compiler.serialize): round trips keep the workload key and the numbers,
and a malformed definition is refused with a DagFormatError naming the field, never anything
else.

Round trips: every case of the inventory's definition tests (rebuilt DAG evaluated by the numpy
interpreter of test_ops_definitions against the operator's reference), one case per operator
compiled with its default schedule replayed on the rebuilt DAG, a hand-written compute using every
node type, and definitions rebuilt in another Python process.
"""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_ops_definitions import SMALL, assert_close, run_dag
from test_ops_kernels import check

import compiler as C
from compiler.canonical import canonical_text, workload_key
from compiler.errors import DagFormatError, ExprError
from compiler.ops import default_schedule, get_op, random_inputs
from compiler.ops.base import OpDef
from compiler.serialize import FORMAT, MAX_DEPTH, MAX_TENSORS, VERSION, dag_from_json, dag_to_json
from compiler.tensor import ComputeOp, topo_order

FUZZ = settings(deadline=None, derandomize=True, database=None, max_examples=400,
                suppress_health_check=[HealthCheck.too_slow])


def round_trip(outputs, inputs=None):
    """Definition → JSON text → new tensors."""
    text = json.dumps(dag_to_json(outputs, inputs))
    return dag_from_json(json.loads(text))


def structure(outputs):
    """What a schedule or a reader sees besides the canonical text: names, tags, attrs, axis names."""
    out = []
    for op in topo_order(outputs):
        if isinstance(op, ComputeOp):
            out.append((op.name, op.tag, op.attrs, [a.name for a in op.axis],
                        [(a.name, a.lo, a.extent) for a in op.reduce_axis]))
        else:
            out.append((op.name, op.shape, op.dtype))
    return out


# ----------------------------------------------------------------------------- inventory round trips

@pytest.mark.parametrize("name,params", SMALL, ids=[f"{n}-{i}" for i, (n, _) in enumerate(SMALL)])
def test_inventory_definitions_round_trip(name, params):
    op = get_op(name, **params)
    inputs, outputs = round_trip([op.output], op.inputs)
    assert canonical_text(outputs) == canonical_text([op.output])
    assert workload_key(outputs) == op.workload_key()
    assert structure(outputs) == structure([op.output])
    assert [(t.name, t.shape, t.dtype) for t in inputs] == [(t.name, t.shape, t.dtype) for t in op.inputs]
    assert dag_to_json(outputs, inputs) == dag_to_json([op.output], op.inputs)
    arrays = random_inputs(op, np.random.default_rng(0))
    assert_close(evaluate_rebuilt(inputs, outputs[0], arrays), op.reference(*arrays), op.output.dtype)


def evaluate_rebuilt(inputs, output, arrays):
    return run_dag(OpDef("rebuilt", inputs, output, {}, 0, None), arrays)


ONE_PER_OP = list({name: (name, params) for name, params in SMALL}.values())


@pytest.mark.parametrize("name,params", ONE_PER_OP, ids=[n for n, _ in ONE_PER_OP])
def test_default_schedule_replays_on_the_rebuilt_definition(name, params):
    """A record's steps, recorded on the inventory's DAG, build the rebuilt one into a kernel
    that computes the reference."""
    op = get_op(name, **params)
    inputs, (output,) = round_trip([op.output], op.inputs)
    rebuilt = OpDef(op.name, inputs, output, op.params, op.flops, op.reference)
    schedule = C.apply_steps([output], default_schedule(op).steps)
    check(rebuilt, C.build(schedule, rebuilt.tensors))


def test_definitions_rebuild_with_the_same_key_in_another_process():
    ops = [get_op(name, **params) for name, params in ONE_PER_OP]
    docs = [dag_to_json([op.output], op.inputs) for op in ops]
    script = ("import json, sys\n"
              "from compiler.canonical import workload_key\n"
              "from compiler.serialize import dag_from_json\n"
              "print(json.dumps([workload_key(dag_from_json(d)[1]) for d in json.load(sys.stdin)]))\n")
    run = subprocess.run([sys.executable, "-c", script], input=json.dumps(docs), capture_output=True, text=True,
                         timeout=120, check=True)
    assert json.loads(run.stdout) == [op.workload_key() for op in ops]


# ----------------------------------------------------------------------------- a compute with every node

def every_node():
    """Placeholders of every dtype family, every binary/compare/logical op, not, select, casts,
    every math function, constants of every dtype (inf, nan, -0.0 too), reads of an intermediate
    stage, a reduction over an axis with lo != 0 and a `where`, tags and nested attrs."""
    A = C.placeholder((6, 5), "float32", "A")
    I = C.placeholder((6,), "int32", "I")
    M = C.placeholder((5,), "bool", "M")
    B = C.placeholder((5,), "int8", "B")

    def floats(i, j):
        x = A[i, j]
        ax = C.abs(x)
        e = C.exp(x) + C.log(ax + 1.0) - C.sqrt(ax) * C.tanh(x)
        e = e / (C.sigmoid(x) + 2.0) + C.erf(x) + C.floor(x) * C.ceil(x)
        e = C.maximum(e, C.power(ax, C.const(1.5, "float32"))) - C.const(-0.0, "float32")
        return C.minimum(e, C.const(math.inf, "float32"))

    T = C.compute((6, 5), floats, name="floats", tag="custom", attrs={"alpha": 0.5, "pads": (1, 2),
                                                                      "nested": {"x": (1, "a", None, True)}})

    def mixed(i, j):
        n = I[i] // 3 + I[i] % 4 - I[i] * 2 + C.abs(I[i])
        m = (B[j] + C.const(3, "int8")).astype("int32")
        cond = (C.equal(n, 1) | C.not_equal(n, 2)) & ~(n < 0) & (n <= 5) | (n > 7) & (m >= 2) | M[j]
        keep = C.select(C.const(False), C.const(math.nan, "float32"), T[i, j])
        return C.select(cond & C.const(True), keep * n.astype("float32"), C.cast("float32", m) - keep)

    U = C.compute((6, 5), mixed, name="mixed")
    k = C.reduce_axis((1, 5), "k")
    out = C.compute((6,), lambda i: C.sum(U[i, k] * U[i, k - 1], axis=k, where=C.not_equal(k, 3)), name="out",
                    tag="reduce_where")
    return [A, I, M, B], out


def test_every_node_round_trips_with_the_same_key_and_numbers():
    inputs, out = every_node()
    new_inputs, (new_out,) = round_trip([out], inputs)
    assert workload_key([new_out]) == workload_key([out])
    assert structure([new_out]) == structure([out])
    assert topo_order([new_out])[-1].reduce_axis[0].lo == 1
    nodes = json.dumps(dag_to_json([out], inputs))
    for node in ("axis", "reduce_axis", "const", "binary", "compare", "logical", "not", "select", "cast", "call",
                 "read", "reduce"):
        assert f'"node": "{node}"' in nodes
    for value in ('"inf"', '"nan"', "-0.0", "true", "false"):
        assert value in nodes

    rng = np.random.default_rng(3)
    arrays = [rng.uniform(-2, 2, (6, 5)).astype("float32"), rng.integers(-9, 9, 6).astype("int32"),
              rng.integers(0, 2, 5).astype("bool"), rng.integers(-4, 4, 5).astype("int8")]
    results = []
    for ins, o in ((inputs, out), (new_inputs, new_out)):
        result = np.full(6, np.nan, "float32")
        C.build(C.create_schedule(o), [*ins, o])(*arrays, result)
        results.append(result)
    assert np.isfinite(results[0]).all()
    np.testing.assert_array_equal(results[0], results[1])


def test_several_outputs_and_the_order_of_inputs_round_trip():
    A = C.placeholder((4,), "float32", "A")
    B = C.placeholder((4,), "float32", "B")
    S = C.compute((4,), lambda i: A[i] + B[i], name="S")
    P = C.compute((4,), lambda i: S[i] * A[i], name="P")
    inputs, outputs = round_trip([P, S], [B, A])
    assert [t.name for t in inputs] == ["B", "A"] and [t.name for t in outputs] == ["P", "S"]
    assert workload_key(outputs) == workload_key([P, S])


def test_the_document_format():
    A = C.placeholder((3, 2), "float64", "A")
    k = C.reduce_axis(2, "k")
    out = C.compute((3,), lambda i: C.max(A[i, k], axis=k), name="rowmax", tag="r")
    assert dag_to_json(out) == {
        "format": FORMAT, "version": VERSION,
        "tensors": [{"kind": "placeholder", "name": "A", "shape": [3, 2], "dtype": "float64"},
                    {"kind": "compute", "name": "rowmax", "shape": [3], "dtype": "float64", "axes": ["i"],
                     "tag": "r", "attrs": {},
                     "body": {"node": "reduce", "op": "max", "axes": [{"name": "k", "lo": 0, "hi": 2}],
                              "source": {"node": "read", "tensor": 0,
                                         "indices": [{"node": "axis", "index": 0},
                                                     {"node": "reduce_axis", "index": 0}]}}}],
        "inputs": [0], "outputs": [1]}


def test_axes_tag_and_attrs_may_be_left_out():
    doc = dag_to_json(C.compute((2,), lambda i: C.placeholder((2,), "float32", "A")[i] * 2.0, name="x"))
    for field in ("axes", "tag", "attrs"):
        del doc["tensors"][1][field]
    _, (out,) = dag_from_json(doc)
    assert [a.name for a in out.op.axis] == ["i0"] and out.op.tag == "" and out.op.attrs == {}


# ----------------------------------------------------------------------------- what cannot be written

def test_writing_refuses_what_it_could_not_read_back():
    A = C.placeholder((4,), "float32", "A")
    B = C.placeholder((4,), "float32", "B")
    out = C.compute((4,), lambda i: A[i] + B[i], name="out")
    with pytest.raises(DagFormatError, match=r"inputs: placeholder\(s\) B are read but not listed"):
        dag_to_json(out, [A])
    with pytest.raises(DagFormatError, match="an output must be a compute"):
        dag_to_json(A)
    with pytest.raises(DagFormatError, match="expected a Tensor"):
        dag_to_json("out")
    weird = C.compute((4,), lambda i: A[i], name="weird", attrs={"f": object()})
    with pytest.raises(DagFormatError, match=r"tensors\[1\]\.attrs\.f: object .* is not a JSON value"):
        dag_to_json(weird)

    def deep(i):
        e = A[i]
        for _ in range(MAX_DEPTH + 1):
            e = e * 1.5
        return e
    with pytest.raises(DagFormatError, match=f"nested deeper than {MAX_DEPTH}"):
        dag_to_json(C.compute((4,), deep, name="deep"))
    with pytest.raises(DagFormatError, match="a name must be 1 to 128 printable"):
        dag_to_json(C.compute((4,), lambda i: A[i], name="two\nlines"))


# ----------------------------------------------------------------------------- malformed definitions

def valid_doc() -> dict:
    """pad + conv + bias/relu epilogue: placeholders, reads, a reduction, casts and selects."""
    op = get_op("conv2d_bias_relu", N=1, C=2, H=4, W=4, F=2, KH=3, KW=3, padding=1)
    return dag_to_json([op.output], op.inputs)


def _conv(d):
    return next(t for t in d["tensors"] if t.get("name") == "conv2d_nchw")


def _set(path, value):
    """A mutation: the value at `path` (keys, indices, or a function of the document giving the
    object to continue from) becomes `value`."""
    def mutate(d):
        node = d
        for key in path[:-1]:
            node = key(d) if callable(key) else node[key]
        node[path[-1]] = value
    return mutate


def _conv_body(d):
    return _conv(d)["body"]


def _weight_read(d):
    return _conv_body(d)["source"]["args"][1]


def _epilogue(d):
    return d["tensors"][-1]["body"]


def _wrap_in_cast(d):
    source = _conv_body(d)["source"]
    source["args"][1] = {"node": "cast", "dtype": "int32", "args": [source["args"][1]]}


MALFORMED = [
    ("wrong format", _set(["format"], []), r"format: list \[\] is not a tunefarm"),
    ("newer version", _set(["version"], 2), "written by a newer tunefarm .*version 2.*upgrade tunefarm"),
    ("bool version", _set(["version"], True), "version: expected an integer"),
    ("unknown top-level field", _set(["extra"], 1), "unknown field.* extra"),
    ("no tensors", _set(["tensors"], []), r"tensors: expected 1 to \d+ items, got 0"),
    ("unknown kind", _set(["tensors", 0, "kind"], "tensor"), r"tensors\[0\]\.kind: expected 'placeholder' or"),
    ("bad dtype", _set(["tensors", 0, "dtype"], "float16"), r"tensors\[0\]\.dtype: unknown dtype 'float16'"),
    ("zero size", _set(["tensors", 0, "shape", 1], 0), r"tensors\[0\]\.shape\[1\]: 0 is out of range"),
    ("bool size", _set(["tensors", 0, "shape", 1], True), r"shape\[1\]: expected an integer, got bool"),
    ("absurd size", _set(["tensors", 0, "shape"], [2 ** 31, 2 ** 31, 2 ** 31]), "more than 2\\*\\*60 elements"),
    ("too many dims", _set(["tensors", 0, "shape"], [1] * 17), r"expected 0 to 16 items, got 17"),
    ("empty name", _set(["tensors", 0, "name"], ""), "a name must be 1 to 128 printable characters"),
    ("unknown node", lambda d: _conv_body(d)["source"].update(node="gather"), "unknown node type 'gather'"),
    ("unknown binary op", lambda d: _conv_body(d)["source"].update(op="xor"), "unknown binary op 'xor'"),
    ("wrong arity", lambda d: _conv_body(d)["source"]["args"].append({"node": "axis", "index": 0}),
     "binary takes 2 argument.*got 3"),
    ("index count", lambda d: _weight_read(d)["indices"].pop(), "weight has 4 dimensions, indexed with 3"),
    ("dangling reference", lambda d: _weight_read(d).update(tensor=40), r"tensors\[40\] is not defined before"),
    ("cycle", lambda d: _weight_read(d).update(tensor=3), r"tensors\[3\] is not defined before this entry.*no cycles"),
    ("axis out of range", lambda d: _weight_read(d)["indices"][0].update(index=9),
     r"index: 9 is out of range \[0, 3\]"),
    ("reduce axis outside a reduction", _set([_epilogue, "args", 0], {"node": "reduce_axis", "index": 0}),
     "a reduce_axis outside a reduction"),
    ("nested reduction", lambda d: _conv_body(d)["source"]["args"][0].update(
        node="reduce", op="sum", axes=[{"name": "q", "lo": 0, "hi": 2}], source={"node": "axis", "index": 0}),
     "a reduction is allowed only as the whole body"),
    ("empty reduce axis", _set([_conv, "body", "axes", 0, "hi"], 0), r"axes\[0\]\.hi: 0 is out of range"),
    ("mixed dtypes", _wrap_in_cast, "cannot combine float32 and int32 in mul"),
    ("const of the wrong type", lambda d: _epilogue(d)["args"][1].update(value="1"), "str '1' is not a float32 value"),
    ("NaN as a number", lambda d: _epilogue(d)["args"][1].update(value=math.nan), r'written "inf", "-inf" or "nan"'),
    ("int const too large", lambda d: _epilogue(d)["args"][1].update(value=2 ** 40, dtype="int32"),
     "does not fit int32"),
    ("declared dtype", _set(["tensors", -1, "dtype"], "float64"), "the body computes float32, not float64"),
    ("unused tensor", lambda d: d["tensors"].append({"kind": "placeholder", "name": "z", "shape": [1],
                                                      "dtype": "float32"}), "z is not used by any output"),
    ("input not listed", lambda d: d["inputs"].pop(), "placeholder bias .* is read but not listed"),
    ("input listed twice", lambda d: d["inputs"].append(d["inputs"][0]), "is listed twice"),
    ("output is a placeholder", _set(["outputs"], [0]), r"outputs\[0\]: tensors\[0\] \(data\) is not a compute"),
    ("no output", _set(["outputs"], []), "a definition needs at least one output"),
    ("attrs not an object", _set([_conv, "attrs"], [1, 2]), r"attrs: expected an object"),
    ("attrs NaN", _set([_conv, "attrs", "x"], math.nan), "nan is not a finite number"),
    ("missing field", lambda d: _conv(d).pop("body"), "missing field.* body"),
]


@pytest.mark.parametrize("what,mutate,message", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_definitions_are_refused_naming_the_problem(what, mutate, message):
    d = valid_doc()
    mutate(d)
    with pytest.raises(DagFormatError, match=message) as e:
        dag_from_json(d)
    assert str(e.value).startswith("compute definition, ")
    assert isinstance(e.value, ExprError)


def test_a_deep_or_huge_definition_is_refused_before_it_exhausts_anything():
    def nest(n):
        e = {"node": "axis", "index": 0}
        for _ in range(n):
            e = {"node": "binary", "op": "add", "args": [e, {"node": "axis", "index": 0}]}
        return e
    doc = {"format": FORMAT, "version": VERSION, "inputs": [], "outputs": [0],
           "tensors": [{"kind": "compute", "name": "x", "shape": [2], "dtype": "int64", "body": nest(5000)}]}
    with pytest.raises(DagFormatError, match=f"nested deeper than {MAX_DEPTH} levels"):
        dag_from_json(doc)
    wide = {"node": "binary", "op": "add", "args": [{"node": "axis", "index": 0}] * 2}
    for _ in range(17):  # 2**17 leaves, each level shallow
        wide = {"node": "binary", "op": "add", "args": [wide, wide]}
    doc["tensors"][0]["body"] = wide
    with pytest.raises(DagFormatError, match="more than 100000 expression nodes"):
        dag_from_json(doc)
    doc["tensors"] = [{"kind": "placeholder", "name": f"p{i}", "shape": [1], "dtype": "int8"}
                      for i in range(MAX_TENSORS + 1)]
    with pytest.raises(DagFormatError, match=f"tensors: expected 1 to {MAX_TENSORS} items"):
        dag_from_json(doc)


# ----------------------------------------------------------------------------- fuzzing

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 5) | st.sampled_from([2 ** 63, -2 ** 70, 10 ** 400])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(["add", "axis", "read", "reduce", "const", "float32", "int8", "bool", "sum", "inf", "nan",
                       "placeholder", "compute", FORMAT]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["node", "op", "args", "index", "value", "dtype", "tensor", "indices", "axes", "source",
                         "where", "kind", "name", "shape", "body", "format", "version", "tensors", "inputs",
                         "outputs", "lo", "hi", "attrs", "tag", "x"]), inner, max_size=5),
    max_leaves=12)


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))


def _parse_or_refuse(doc):
    """Parsing gives a DAG that writes back and has a key, or raises DagFormatError; nothing else."""
    try:
        inputs, outputs = dag_from_json(doc)
    except DagFormatError:
        return
    assert dag_from_json(dag_to_json(outputs, inputs))
    workload_key(outputs)


@FUZZ
@given(JSON)
def test_any_json_value_parses_or_raises_dag_format_error(value):
    _parse_or_refuse(value)


BASE = valid_doc()
BASE_PATHS = list(_paths(BASE))[1:]


@FUZZ
@given(st.data())
def test_mutated_definitions_parse_or_raise_dag_format_error(data):
    doc = copy.deepcopy(BASE)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(BASE_PATHS))
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            action = data.draw(st.sampled_from(["replace", "delete", "insert", "duplicate"]))
            if action == "replace":
                parent[path[-1]] = data.draw(JSON)
            elif action == "delete":
                del parent[path[-1]]
            elif action == "insert" and isinstance(parent, list):
                parent.insert(path[-1], data.draw(JSON))
            elif action == "insert":
                parent[data.draw(st.sampled_from(["node", "op", "index", "where", "extra"]))] = data.draw(JSON)
            elif isinstance(parent, list):  # duplicate a list item (an index, an argument, a tensor)
                parent.insert(path[-1], copy.deepcopy(parent[path[-1]]))
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed this path
    _parse_or_refuse(doc)
