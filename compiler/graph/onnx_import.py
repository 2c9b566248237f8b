"""ONNX → graph IR: read the model, refuse what cannot be compiled (all of it in one error), infer
static shapes, and fold what is constant.

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
    224, 224)}). Every node is checked first and all the unsupported ones are reported in one
    UnsupportedModelError. With `simplify_graph` (the default) constants are folded and
    BatchNormalization is folded into its convolution (passes.simplify)."""
    onnx = _onnx()
    model = load_model(src)
    from onnx import numpy_helper

    opset = _opset(model)
    g = model.graph
    problems = _unsupported(g, opset)
    values: dict = {}
    for init in g.initializer:
        arr = numpy_helper.to_array(init)
        if str(arr.dtype) not in ONNX_DTYPES.values():
            problems.append(("initializer", init.name, f"dtype {arr.dtype} (tunefarm compiles "
                                                       f"{', '.join(ONNX_DTYPES.values())})"))
            continue
        values[init.name] = Value(init.name, tuple(arr.shape), str(arr.dtype), np.array(arr, order="C"))
    if problems:
        raise UnsupportedModelError(problems)

    inputs = [vi for vi in g.input if vi.name not in values]
    input_shapes = dict(input_shapes or {})
    unknown = sorted(set(input_shapes) - {vi.name for vi in inputs})
    if unknown:
        raise GraphError(f"input_shapes names {unknown}, which are not inputs of the model; its inputs are "
                         f"{[vi.name for vi in inputs]}")
    for vi in inputs:
        values[vi.name] = _input_value(onnx, vi, input_shapes.get(vi.name))

    nodes = []
    for i, n in enumerate(g.node):
        attrs = {a.name: _attr(onnx, numpy_helper, a) for a in n.attribute}
        nodes.append(Node(n.op_type, n.name or f"{n.op_type}_{i}", list(n.input), list(n.output), attrs))
    graph = Graph(values, nodes, [vi.name for vi in inputs], [o.name for o in g.output], opset,
                  g.name or "model")
    infer_shapes(graph)
    return simplify(graph) if simplify_graph else graph


def _opset(model) -> int:
    versions = [o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS]
    if not versions:
        raise UnsupportedModelError([("model", "opset_import", "no opset of the default ONNX domain")])
    opset = int(max(versions))
    if opset < MIN_OPSET:
        raise UnsupportedModelError([("model", "opset_import", f"opset {opset} (tunefarm reads {MIN_OPSET} and up)")])
    return opset


def _unsupported(g, opset) -> list:
    """(op_type, node name, reason) of every node that cannot be compiled."""
    onnx = _onnx()
    from onnx import numpy_helper
    problems = []
    for i, n in enumerate(g.node):
        name = n.name or f"{n.op_type}_{i}"
        if n.domain not in DEFAULT_DOMAINS:
            problems.append((n.op_type, name, f"operator of domain {n.domain!r} (only the default ONNX domain)"))
            continue
        spec = OPS.get(n.op_type) if n.op_type in ONNX_OP_TYPES else None
        if spec is None:
            problems.append((n.op_type, name, "operator not supported"))
            continue
        if opset < spec.min_opset:
            problems.append((n.op_type, name, f"needs opset {spec.min_opset}, the model has {opset}"))
            continue
        if spec.check is not None:
            node = Node(n.op_type, name, list(n.input), list(n.output),
                        {a.name: _attr(onnx, numpy_helper, a) for a in n.attribute})
            reason = spec.check(node, opset)
            if reason:
                problems.append((n.op_type, name, reason))
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


def infer_shapes(graph: Graph) -> Graph:
    """Give every node output a Value (shape, dtype) in place, nodes in topological order."""
    known = set(graph.values)
    pending, ordered = list(graph.nodes), []
    while pending:
        progress = False
        rest = []
        for n in pending:
            if all(not i or i in known for i in n.inputs):
                _infer_node(graph, n)
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
    graph.nodes = ordered
    for o in graph.outputs:
        if o not in graph.values:
            raise GraphError(f"graph output {o!r} is not computed by any node")
    return graph


def _infer_node(graph: Graph, n: Node):
    spec = OPS[n.op_type]
    ins = [graph.values[i] if i else None for i in n.inputs]
    try:
        outs = spec.infer(n, ins, graph.opset)
    except ShapeError:
        raise
    except (IndexError, TypeError, ValueError, KeyError, AttributeError) as e:
        raise ShapeError(f"{n.op_type} node {n.name!r}: {type(e).__name__}: {e}") from None
    for name, (shape, dtype) in zip(n.outputs, outs):
        if name:
            graph.values[name] = Value(name, tuple(int(s) for s in shape), dtype)
    fold_node(graph, n)   # now: a later node's shape may need this value (a Reshape's shape)


__all__ = ["from_onnx", "load_model", "infer_shapes"]
