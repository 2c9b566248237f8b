"""ONNX → graph IR: read the model, refuse what cannot be compiled (all of it in one error), infer
static shapes, and fold what is constant.

Folding comes before refusal: a node whose inputs are all known at import is computed then (by
its OpSpec's numpy fold where it has one, else by onnx's reference evaluator, onnx_fold.py), so
only nodes that must run as kernels need an operator tunefarm compiles, and only values kernels
read need a dtype it compiles.

The `onnx` package is imported here only, on first use: the compiler and the device agent never
need it, and a missing package is one clear error naming the extra that brings it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .errors import DynamicShapeError, GraphError, NotOnnxError, ShapeError, UnsupportedModelError
from .ir import Graph, Node, Value
from .ops import ONNX_OP_TYPES, OPS
from .ops.elementwise import ONNX_DTYPES
from .passes import fold_node, simplify

MIN_OPSET = 7  # exporters of the last years write 9 and up; 7-8 read the same for what tunefarm supports
DEFAULT_DOMAINS = ("", "ai.onnx")


def _onnx():
    try:
        import onnx
    except ImportError:  # pragma: no cover - the `models` extra is part of `all`
        raise GraphError("reading ONNX models needs the onnx package: pip install 'tunefarm[models]'") from None
    return onnx


def load_model(src):
    """An onnx.ModelProto from a path, bytes or a ModelProto; NotOnnxError for anything else."""
    onnx = _onnx()
    if isinstance(src, onnx.ModelProto):
        model = src
        what = "the model"
    elif isinstance(src, (bytes, bytearray)):
        what = "the bytes"
        model = _parse(onnx, bytes(src), what)
    elif isinstance(src, (str, os.PathLike)):
        path = Path(src)
        what = str(path)
        if not path.is_file():
            raise NotOnnxError(f"{path}: no such file")
        try:
            model = onnx.load(str(path))
        except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
            raise NotOnnxError(f"{path} is not an ONNX model: {type(e).__name__}: {e}") from None
    else:
        raise NotOnnxError(f"from_onnx takes a path, bytes or an onnx.ModelProto, got {type(src).__name__}")
    if not model.ir_version or not model.HasField("graph") or not model.opset_import:
        raise NotOnnxError(f"{what} is not an ONNX model (no IR version, graph or opset)")
    return model


def _parse(onnx, data, what):
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as e:  # noqa: BLE001
        raise NotOnnxError(f"{what} is not an ONNX model: {type(e).__name__}: {e}") from None
    return model


def from_onnx(src, input_shapes: dict | None = None, simplify_graph: bool = True) -> Graph:
    """The model at `src` (path, bytes or ModelProto) as a Graph with static shapes.

    `input_shapes` pins inputs whose dimensions the model leaves symbolic ({"input": (1, 3,
    224, 224)}). A node whose inputs are all known at import is computed then, whatever its
    operator (onnx_fold.py); every node left to run as a kernel is checked first and all the
    unsupported ones are reported in one UnsupportedModelError. With `simplify_graph` (the
    default) the folded nodes are dropped and BatchNormalization is folded into its convolution
    (passes.simplify); nodes tunefarm has no kernel for are dropped once folded either way."""
    onnx = _onnx()
    model = load_model(src)
    from onnx import numpy_helper

    from .onnx_fold import ReferenceFolder, constant_nodes

    opset = _opset(model)
    g = model.graph
    values: dict = {}
    for init in g.initializer:   # any dtype: one tunefarm does not compile may only feed folded nodes
        arr = numpy_helper.to_array(init)
        values[init.name] = Value(init.name, tuple(arr.shape), str(arr.dtype), np.array(arr, order="C"))
    input_infos = [vi for vi in g.input if vi.name not in values]
    nodes, protos = [], {}
    for i, n in enumerate(g.node):
        attrs = {a.name: _attr(onnx, numpy_helper, a) for a in n.attribute}
        node = Node(n.op_type, n.name or f"{n.op_type}_{i}", list(n.input), list(n.output), attrs)
        nodes.append(node)
        protos[id(node)] = n
    folded = constant_nodes(nodes, protos, set(values), set(values) | {vi.name for vi in input_infos})
    problems = _unsupported(nodes, protos, opset, folded)
    problems += _kernel_dtypes(nodes, folded, values)
    if problems:
        raise UnsupportedModelError(problems)
    foreign = {id(n) for n in nodes if id(n) in folded and _refusal(n, protos[id(n)], opset) is not None}

    input_shapes = dict(input_shapes or {})
    unknown = sorted(set(input_shapes) - {vi.name for vi in input_infos})
    if unknown:
        raise GraphError(f"input_shapes names {unknown}, which are not inputs of the model; its inputs are "
                         f"{[vi.name for vi in input_infos]}")
    for vi in input_infos:
        values[vi.name] = _input_value(onnx, vi, input_shapes.get(vi.name))

    opsets = {o.domain: int(o.version) for o in model.opset_import}
    graph = Graph(values, nodes, [vi.name for vi in input_infos], [o.name for o in g.output], opset,
                  g.name or "model")
    infer_shapes(graph, ReferenceFolder(protos, opsets), foreign)
    return simplify(graph) if simplify_graph else graph


def _opset(model) -> int:
    versions = [o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS]
    if not versions:
        raise UnsupportedModelError([("model", "opset_import", "no opset of the default ONNX domain")])
    opset = int(max(versions))
    if opset < MIN_OPSET:
        raise UnsupportedModelError([("model", "opset_import", f"opset {opset} (tunefarm reads {MIN_OPSET} and up)")])
    return opset


def _unsupported(nodes: list, protos: dict, opset: int, folded: set) -> list:
    """(op_type, node name, reason) of every node that must run as a kernel (`folded`: those
    computed at import instead) and cannot be compiled."""
    return [(n.op_type, n.name, reason) for n in nodes if id(n) not in folded
            for reason in [_refusal(n, protos[id(n)], opset)] if reason]


def _refusal(node: Node, proto, opset: int) -> str | None:
    """Why `node` cannot be compiled as a kernel, or None when it can."""
    if proto.domain not in DEFAULT_DOMAINS:
        return f"operator of domain {proto.domain!r} (only the default ONNX domain)"
    spec = OPS.get(node.op_type) if node.op_type in ONNX_OP_TYPES else None
    if spec is None:
        return "operator not supported"
    if opset < spec.min_opset:
        return f"needs opset {spec.min_opset}, the model has {opset}"
    return spec.check(node, opset) if spec.check is not None else None


def _kernel_dtypes(nodes: list, folded: set, values: dict) -> list:
    """Problems of initializers whose dtype tunefarm does not compile, read by a kernel."""
    problems, seen = [], set()
    for n in nodes:
        if id(n) in folded:
            continue
        for i in n.inputs:
            v = values.get(i)
            if v is not None and v.dtype not in ONNX_DTYPES.values() and i not in seen:
                seen.add(i)
                problems.append(("initializer", i, f"dtype {v.dtype} read by {n.op_type} node {n.name!r} "
                                                   f"(tunefarm compiles {', '.join(ONNX_DTYPES.values())})"))
    return problems


def _attr(onnx, numpy_helper, a):
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [x.decode() for x in v]
    return v


def _input_value(onnx, vi, pinned) -> Value:
    t = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        raise GraphError(f"input {vi.name!r} is not a tensor (sequences and maps are not supported)")
    dtype = ONNX_DTYPES.get(t.elem_type)
    if dtype is None:
        raise GraphError(f"input {vi.name!r} has ONNX data type {t.elem_type}, which tunefarm does not compile "
                         f"({', '.join(ONNX_DTYPES.values())})")
    if pinned is not None:
        shape = tuple(int(s) for s in pinned)
        if t.HasField("shape") and len(t.shape.dim) != len(shape):
            raise ShapeError(f"input {vi.name!r}: input_shapes gives rank {len(shape)}, the model rank {len(t.shape.dim)}")
        for d, (dim, s) in enumerate(zip(t.shape.dim, shape)):
            if s < 1 or (dim.HasField("dim_value") and dim.dim_value > 0 and dim.dim_value != s):
                raise ShapeError(f"input {vi.name!r}: input_shapes gives {shape}, but dimension {d} is "
                                 f"{dim.dim_value} in the model")
        return Value(vi.name, shape, dtype)
    if not t.HasField("shape"):
        raise DynamicShapeError(f"input {vi.name!r} has no shape in the model; pin it with input_shapes "
                                f"(--input-shape {vi.name}=1,3,224,224)")
    dims: list = []
    for d, dim in enumerate(t.shape.dim):
        if dim.HasField("dim_value") and dim.dim_value > 0:
            dims.append(int(dim.dim_value))
        else:
            label = dim.dim_param or "?"
            raise DynamicShapeError(f"input {vi.name!r} has a dynamic dimension {d} ({label!r}); pin its shape with "
                                    f"input_shapes={{'{vi.name}': (...)}} (--input-shape {vi.name}=...)")
    return Value(vi.name, tuple(dims), dtype)


def infer_shapes(graph: Graph, evaluate=None, foreign: frozenset | set = frozenset()) -> Graph:
    """Give every node output a Value (shape, dtype) in place, nodes in topological order, and
    fold what is constant as it goes (a later node's shape may need the value).

    `evaluate(node, arrays) -> arrays` (onnx_fold.ReferenceFolder) computes a constant node
    that has no numpy fold; `foreign`: id() of the nodes tunefarm has no kernel for, which
    must fold (they are dropped once folded). A node that cannot be evaluated, or a kernel
    reading a value of a dtype tunefarm does not compile, is refused; all of them are listed in
    one UnsupportedModelError."""
    known = set(graph.values)
    refused: set = set()   # outputs of refused nodes: nothing after them is inferred
    problems: list = []
    pending, ordered = list(graph.nodes), []
    while pending:
        progress = False
        rest = []
        for n in pending:
            if all(not i or i in known for i in n.inputs):
                if any(i in refused for i in n.inputs if i):
                    refused.update(o for o in n.outputs if o)
                else:
                    problem = _infer_node(graph, n, evaluate, id(n) in foreign)
                    if problem is not None:
                        problems.append(problem)
                        refused.update(o for o in n.outputs if o)
                known.update(o for o in n.outputs if o)
                ordered.append(n)
                progress = True
            else:
                rest.append(n)
        if not progress:
            missing = sorted({i for n in rest for i in n.inputs if i and i not in known
                              and not any(i in m.outputs for m in rest)})
            raise GraphError(f"nodes {[n.name for n in rest][:5]} read values nothing defines: {missing[:5]} "
                             "(or the graph has a cycle)")
        pending = rest
    for o in graph.outputs:
        v = graph.values.get(o)
        if v is not None and v.dtype not in ONNX_DTYPES.values():
            problems.append(("output", o, f"dtype {v.dtype} (tunefarm compiles {', '.join(ONNX_DTYPES.values())})"))
    if problems:
        raise UnsupportedModelError(problems)
    graph.nodes = [n for n in ordered if id(n) not in foreign]
    for o in graph.outputs:
        if o not in graph.values:
            raise GraphError(f"graph output {o!r} is not computed by any node")
    return graph


def _infer_node(graph: Graph, n: Node, evaluate, foreign: bool):
    """Infer (and fold) one node; None, or the (op_type, name, reason) that refuses it."""
    ins = [graph.values[i] if i else None for i in n.inputs]
    constant = all(v is None or v.const is not None for v in ins)
    if foreign or (constant and evaluate is not None and OPS[n.op_type].fold is None):
        if not constant or evaluate is None:
            return (n.op_type, n.name, "operator not supported")
        try:
            _set_folded(graph, n, evaluate(n, [None if v is None else v.const for v in ins]))
            return None
        except GraphError as e:
            if foreign:
                return (n.op_type, n.name, getattr(e, "reason", str(e)))
            # an operator tunefarm compiles but the evaluator does not take: it runs as a kernel
    try:
        _infer_known(graph, n, ins)
    except GraphError as e:
        if not (constant and evaluate is not None):
            raise
        try:   # the numpy path refused constants (a dtype it does not take): the evaluator decides
            _set_folded(graph, n, evaluate(n, [None if v is None else v.const for v in ins]))
            return None
        except GraphError:
            raise e from None
    if not all(graph.values[o].const is not None for o in n.outputs if o):
        for v in ins:
            if v is not None and v.dtype not in ONNX_DTYPES.values():
                return (n.op_type, n.name, f"reads {v.name!r} of dtype {v.dtype}, which tunefarm does not compile "
                                           f"({', '.join(ONNX_DTYPES.values())})")
    return None


def _infer_known(graph: Graph, n: Node, ins: list):
    """Shape inference by the node's OpSpec, then its numpy fold when the inputs are constant."""
    spec = OPS[n.op_type]
    try:
        outs = spec.infer(n, ins, graph.opset)
    except ShapeError:
        raise
    except (IndexError, TypeError, ValueError, KeyError, AttributeError) as e:
        raise ShapeError(f"{n.op_type} node {n.name!r}: {type(e).__name__}: {e}") from None
    for name, (shape, dtype) in zip(n.outputs, outs):
        if name:
            graph.values[name] = Value(name, tuple(int(s) for s in shape), dtype)
    try:
        fold_node(graph, n)   # now: a later node's shape may need this value (a Reshape's shape)
    except GraphError:
        raise
    except (IndexError, TypeError, ValueError, KeyError, AttributeError, FloatingPointError) as e:
        raise ShapeError(f"{n.op_type} node {n.name!r}: folding its constant inputs: {type(e).__name__}: {e}") from None


def _set_folded(graph: Graph, n: Node, arrays: list):
    for name, arr in zip(n.outputs, arrays):
        if name and arr is not None:
            arr = np.array(arr, order="C")
            graph.values[name] = Value(name, tuple(int(s) for s in arr.shape), str(arr.dtype), arr)
    missing = [o for o in n.outputs if o and (o not in graph.values or graph.values[o].const is None)]
    if missing:
        raise ShapeError(f"{n.op_type} node {n.name!r}: folding gave no value for {missing}")


__all__ = ["from_onnx", "load_model", "infer_shapes"]
