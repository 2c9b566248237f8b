"""Compute DAGs as JSON data: how a workload that is not an inventory operator is stored and sent.

A user's compute definition must reach build processes, other machines and the records database
without the user's code, and come back with the same workload key (compiler.canonical). Reading
a definition never runs code: every field is checked and the DAG is rebuilt through the tensor
language's own constructors, so a document the language would refuse (mixed dtypes, a tensor
read with the wrong number of indices, a reduce axis used outside its reduction) is refused like
a malformed one: a DagFormatError naming the field, e.g. `tensors[2].body.args[0]: ...`.

Format version 1:

    {"format": "tunefarm-dag", "version": 1,
     "tensors": [ENTRY, ...],   producers first; an entry reads only entries before it
     "inputs": [index, ...],    every placeholder, in kernel-argument order
     "outputs": [index, ...]}   computes

    {"kind": "placeholder", "name": "A", "shape": [64, 32], "dtype": "float32"}
    {"kind": "compute", "name": "C", "shape": [64, 64], "dtype": "float32",
     "axes": ["i", "j"], "tag": "matmul", "attrs": {...}, "body": EXPR}
                                (axes, tag and attrs may be left out: i0.., "" and {})

EXPR is an object whose "node" says what it is:

    {"node": "axis", "index": d}                        axis d of the compute
    {"node": "reduce_axis", "index": d}                 axis d of the reduction
    {"node": "const", "value": v, "dtype": dt}          floats that are not finite: "inf", "-inf", "nan"
    {"node": "binary" | "compare" | "logical", "op": name, "args": [a, b]}
    {"node": "not", "args": [a]}
    {"node": "select", "args": [condition, then, else]}
    {"node": "cast", "dtype": dt, "args": [a]}
    {"node": "call", "op": "exp", "args": [a]}
    {"node": "read", "tensor": index, "indices": [EXPR, ...]}
    {"node": "checked_index", "lo": int, "hi": int, "site": text, "args": [a]}
                                                        a data-dependent index checked at run time;
                                                        "wrap": true (optional, lo = -hi): negative
                                                        values count from the end
    {"node": "reduce", "op": "sum" | "max" | "min", "axes": [{"name": "k", "lo": 0, "hi": 16}],
     "source": EXPR, "where": EXPR}                     only as a whole body; "where" optional

A reduction is stored as the compiler holds it: its variables run over [0, hi - lo) and `lo` is
already added where the source reads them. attrs hold JSON values (lists come back as tuples).
Sizes are bounded (the MAX_* constants) so a corrupt or hostile document cannot exhaust memory
or the interpreter's stack: the compiler's passes recurse over expressions.
"""

from __future__ import annotations

import math
from collections import abc
from typing import NoReturn

from . import expr as E
from . import tensor as T
from .dtypes import ALL_DTYPES, is_float
from .errors import CompilerError, DagFormatError
from .ops.base import MAX_ELEMENTS
from .tensor import REDUCE_COMBINERS, ComputeOp, IterVar, PlaceholderOp, Reduce, ReduceAxis, TensorRead

FORMAT = "tunefarm-dag"
VERSION = 1

MAX_TENSORS = 256      # entries of one definition (topological sorts recurse over chains)
MAX_NDIM = 16          # dimensions of a tensor
MAX_NODES = 100_000    # expression nodes and attribute values of one definition
MAX_DEPTH = 200        # nesting of one expression (canonical text and lowering recurse over it)
MAX_ATTR_DEPTH = 8     # nesting of an attribute value
MAX_NAME = 128         # characters of a name or tag

# node -> (required fields, optional fields)
_FIELDS = {
    "axis": ({"node", "index"}, set()),
    "reduce_axis": ({"node", "index"}, set()),
    "const": ({"node", "value", "dtype"}, set()),
    "binary": ({"node", "op", "args"}, set()),
    "compare": ({"node", "op", "args"}, set()),
    "logical": ({"node", "op", "args"}, set()),
    "not": ({"node", "args"}, set()),
    "select": ({"node", "args"}, set()),
    "cast": ({"node", "dtype", "args"}, set()),
    "call": ({"node", "op", "args"}, set()),
    "read": ({"node", "tensor", "indices"}, set()),
    "checked_index": ({"node", "lo", "hi", "site", "args"}, {"wrap"}),
    "reduce": ({"node", "op", "axes", "source"}, {"where"}),
}
_ARITY = {"binary": 2, "compare": 2, "logical": 2, "not": 1, "select": 3, "cast": 1, "call": 1, "checked_index": 1}
_OPS = {"binary": E.BINARY_OPS, "compare": E.COMPARE_OPS, "logical": E.LOGICAL_OPS, "call": E.MATH_FUNCS,
        "reduce": REDUCE_COMBINERS}
_ENTRY_FIELDS = {
    "placeholder": ({"kind", "name", "shape", "dtype"}, set()),
    "compute": ({"kind", "name", "shape", "dtype", "body"}, {"axes", "tag", "attrs"}),
}
_DOC_FIELDS = {"format", "version", "tensors", "inputs", "outputs"}
_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _fail(path: str, message: str) -> NoReturn:
    if len(path) > 120:  # deep in an expression: where it starts and where it ends
        path = f"{path[:60]}...{path[-40:]}"
    raise DagFormatError(f"compute definition, {path}: {message}")


# ----------------------------------------------------------------------------- writing

def dag_to_json(outputs, inputs=None) -> dict:
    """The definition of the DAG computing `outputs` (a Tensor or a list of them) as a JSON-able
    dict. `inputs` (placeholders, in kernel-argument order) defaults to the placeholders in
    topological order; when given it must list each placeholder the outputs read, once."""
    outputs = _tensors(outputs, "outputs")
    for k, t in enumerate(outputs):
        if isinstance(t.op, PlaceholderOp):
            _fail(f"outputs[{k}]", f"{t.name} is a placeholder; an output must be a compute")
    ops = T.topo_order(outputs)
    if len(ops) > MAX_TENSORS:
        _fail("tensors", f"{len(ops)} operations; a definition holds at most {MAX_TENSORS}")
    index = {id(op): i for i, op in enumerate(ops)}
    placeholders = [op.output for op in ops if isinstance(op, PlaceholderOp)]
    inputs = placeholders if inputs is None else _tensors(inputs, "inputs")
    for k, t in enumerate(inputs):
        if id(t.op) not in index or not isinstance(t.op, PlaceholderOp):
            _fail(f"inputs[{k}]", f"{t.name} is not a placeholder that the outputs read")
    missing = [t.name for t in placeholders if all(t is not i for i in inputs)]
    if missing:
        _fail("inputs", f"placeholder(s) {', '.join(missing)} are read but not listed as inputs")
    writer = _Writer(index)
    return {"format": FORMAT, "version": VERSION, "tensors": [writer.entry(op, i) for i, op in enumerate(ops)],
            "inputs": [index[id(t.op)] for t in inputs], "outputs": [index[id(t.op)] for t in outputs]}


def _tensors(value, what: str) -> list:
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items or not all(isinstance(t, T.Tensor) for t in items):
        _fail(what, f"expected a Tensor or a non-empty list of Tensors, got {value!r}")
    if len({id(t) for t in items}) != len(items):
        _fail(what, "a tensor is listed twice")
    return items


class _Writer:
    """Expressions to JSON, with the limits the reader enforces: never write what cannot be read."""

    def __init__(self, index: dict):
        self.index = index
        self.nodes = 0

    def entry(self, op, i: int) -> dict:
        path = f"tensors[{i}]"
        _check_name(op.name, f"{path}.name")
        _shape(list(op.shape), f"{path}.shape")
        if isinstance(op, PlaceholderOp):
            return {"kind": "placeholder", "name": op.name, "shape": list(op.shape), "dtype": op.dtype}
        _check_tag(op.tag, f"{path}.tag")
        env = {ax.var: {"node": "axis", "index": d} for d, ax in enumerate(op.axis)}
        for d, ax in enumerate(op.axis):
            _check_name(ax.name, f"{path}.axes[{d}]")
        return {"kind": "compute", "name": op.name, "shape": list(op.shape), "dtype": op.dtype,
                "axes": [ax.name for ax in op.axis], "tag": op.tag,
                "attrs": self.attrs(op.attrs, f"{path}.attrs"), "body": self.body(op.body, env, f"{path}.body")}

    def body(self, body, env: dict, path: str) -> dict:
        if not isinstance(body, Reduce):
            return self.expr(body, env, path, 0)
        env = dict(env)
        axes = []
        for d, ax in enumerate(body.axes):
            _check_name(ax.name, f"{path}.axes[{d}].name")
            _int(ax.lo, f"{path}.axes[{d}].lo", -MAX_ELEMENTS, MAX_ELEMENTS)
            _int(ax.extent, f"{path}.axes[{d}] extent", 1, MAX_ELEMENTS)
            env[ax.var] = {"node": "reduce_axis", "index": d}
            axes.append({"name": ax.name, "lo": ax.lo, "hi": ax.lo + ax.extent})
        out = {"node": "reduce", "op": body.combiner, "axes": axes,
               "source": self.expr(body.source, env, f"{path}.source", 1)}
        if body.where is not None:
            out["where"] = self.expr(body.where, env, f"{path}.where", 1)
        return out

    def expr(self, e, env: dict, path: str, depth: int) -> dict:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            _fail(path, f"more than {MAX_NODES} expression nodes")
        if depth > MAX_DEPTH:
            _fail(path, f"expression nested deeper than {MAX_DEPTH} levels")

        def kids(items):
            return [self.expr(k, env, f"{path}.args[{n}]", depth + 1) for n, k in enumerate(items)]

        if isinstance(e, E.Var):
            if e not in env:
                _fail(path, f"variable {e.name} is not an axis of this compute")
            return dict(env[e])
        if isinstance(e, E.Const):
            return {"node": "const", "value": _const_value(e.value), "dtype": e.dtype}
        for cls, node in ((E.Binary, "binary"), (E.Compare, "compare"), (E.Logical, "logical")):
            if isinstance(e, cls):
                return {"node": node, "op": e.op, "args": kids((e.a, e.b))}
        if isinstance(e, E.Not):
            return {"node": "not", "args": kids((e.a,))}
        if isinstance(e, E.Select):
            return {"node": "select", "args": kids((e.cond, e.t, e.f))}
        if isinstance(e, E.Cast):
            return {"node": "cast", "dtype": e.dtype, "args": kids((e.value,))}
        if isinstance(e, E.Call):
            return {"node": "call", "op": e.func, "args": kids(e.args)}
        if isinstance(e, E.CheckedIndex):
            out = {"node": "checked_index", "lo": e.lo, "hi": e.hi, "site": e.site, "args": kids((e.value,))}
            return {**out, "wrap": True} if e.wrap else out
        if isinstance(e, TensorRead):
            return {"node": "read", "tensor": self.index[id(e.tensor.op)],
                    "indices": [self.expr(x, env, f"{path}.indices[{n}]", depth + 1) for n, x in enumerate(e.indices)]}
        if isinstance(e, Reduce):
            _fail(path, "a reduction nested inside an expression (only a whole body may reduce)")
        _fail(path, f"{type(e).__name__} is not a node of the tensor language")

    def attrs(self, value, path: str, depth: int = 0):
        """attrs to JSON: tuples become lists, numpy scalars Python ones."""
        self.nodes += 1
        if self.nodes > MAX_NODES or depth > MAX_ATTR_DEPTH:
            _fail(path, "attribute value too large or too deeply nested")
        if hasattr(value, "item") and hasattr(value, "dtype") and getattr(value, "ndim", 1) == 0:
            value = value.item()  # a numpy scalar
        if value is None or isinstance(value, (bool, int, str)):
            return value
        if isinstance(value, float):
            if not math.isfinite(value):
                _fail(path, f"{value!r} is not a finite number (JSON has no such value)")
            return value
        if isinstance(value, (list, tuple)):
            return [self.attrs(v, f"{path}[{n}]", depth + 1) for n, v in enumerate(value)]
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            return {k: self.attrs(v, f"{path}.{k}", depth + 1) for k, v in value.items()}
        _fail(path, f"{type(value).__name__} {value!r} is not a JSON value (use numbers, strings, "
                    "booleans, None, lists and dicts with string keys)")


def _const_value(value):
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _check_name(name, path: str):
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME or not name.isprintable():
        _fail(path, f"a name must be 1 to {MAX_NAME} printable characters, got {name!r}")
    return name


def _check_tag(tag, path: str):
    if not isinstance(tag, str) or len(tag) > MAX_NAME or not tag.isprintable():
        _fail(path, f"a tag must be at most {MAX_NAME} printable characters, got {tag!r}")
    return tag


# ----------------------------------------------------------------------------- reading

def dag_from_json(d) -> tuple[list, list]:
    """(inputs, outputs) of the DAG a definition describes, as new Tensors; DagFormatError when
    the definition is malformed in any way."""
    return _Reader().document(d)


def _obj(d, path: str, required: abc.Set[str], optional: abc.Set[str] = frozenset()) -> dict:
    if not isinstance(d, dict):
        _fail(path, f"expected an object, got {_what(d)}")
    missing = sorted(required - set(d))
    if missing:
        _fail(path, f"missing field(s) {', '.join(missing)}")
    unknown = sorted(str(k) for k in set(d) - required - optional)
    if unknown:
        _fail(path, f"unknown field(s) {', '.join(unknown)}; expected {', '.join(sorted(required | optional))}")
    return d


def _list(v, path: str, max_len: int, min_len: int = 0) -> list:
    if not isinstance(v, (list, tuple)):
        _fail(path, f"expected a list, got {_what(v)}")
    if not min_len <= len(v) <= max_len:
        want = f"{max_len}" if min_len == max_len else f"{min_len} to {max_len}"
        _fail(path, f"expected {want} items, got {len(v)}")
    return list(v)


def _int(v, path: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        _fail(path, f"expected an integer, got {_what(v)}")
    if not lo <= v <= hi:
        _fail(path, f"{v} is out of range [{lo}, {hi}]")
    return v


def _dtype(v, path: str) -> str:
    if not isinstance(v, str) or v not in ALL_DTYPES:
        _fail(path, f"unknown dtype {v!r}; dtypes are {', '.join(ALL_DTYPES)}")
    return v


def _finite_float(v):
    """An int or float as a finite float, else None (ints beyond the float range included)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _what(v) -> str:
    text = repr(v)
    return f"{type(v).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _shape(v, path: str) -> tuple:
    dims = tuple(_int(s, f"{path}[{d}]", 1, MAX_ELEMENTS) for d, s in enumerate(_list(v, path, MAX_NDIM)))
    if math.prod(dims) > MAX_ELEMENTS:
        _fail(path, f"{list(dims)} has more than 2**60 elements; kernels cannot address it")
    return dims


def _build(path: str, fn, *args):
    """Call a language constructor; its own complaint (dtype rules, ...) names this field."""
    try:
        return fn(*args)
    except DagFormatError:
        raise
    except CompilerError as e:
        _fail(path, str(e))


class _Reader:
    def __init__(self):
        self.nodes = 0
        self.tensors: list = []

    def document(self, d) -> tuple[list, list]:
        doc = _obj(d, "the document", _DOC_FIELDS)
        if doc["format"] != FORMAT:
            _fail("format", f"{_what(doc['format'])} is not a tunefarm compute definition ({FORMAT!r})")
        version = doc["version"]
        if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
            _fail("version", f"written by a newer tunefarm (format version {version}); this one reads "
                             f"version {VERSION}: upgrade tunefarm")
        _int(version, "version", VERSION, VERSION)
        for i, e in enumerate(_list(doc["tensors"], "tensors", MAX_TENSORS, 1)):
            self.tensors.append(self.entry(e, f"tensors[{i}]"))
        inputs = self.refs(doc["inputs"], "inputs", PlaceholderOp, "a placeholder")
        outputs = self.refs(doc["outputs"], "outputs", ComputeOp, "a compute")
        if not outputs:
            _fail("outputs", "a definition needs at least one output")
        used = {id(op) for op in T.topo_order(outputs)}
        for i, t in enumerate(self.tensors):
            if id(t.op) not in used:
                _fail(f"tensors[{i}]", f"{t.name} is not used by any output")
            if isinstance(t.op, PlaceholderOp) and all(t is not x for x in inputs):
                _fail("inputs", f"placeholder {t.name} (tensors[{i}]) is read but not listed")
        return inputs, outputs

    def refs(self, v, path: str, kind, what: str) -> list:
        out: list[T.Tensor] = []
        for k, ref in enumerate(_list(v, path, MAX_TENSORS)):
            t = self.tensors[_int(ref, f"{path}[{k}]", 0, len(self.tensors) - 1)]
            if not isinstance(t.op, kind):
                _fail(f"{path}[{k}]", f"tensors[{ref}] ({t.name}) is not {what}")
            if any(t is x for x in out):
                _fail(f"{path}[{k}]", f"tensors[{ref}] is listed twice")
            out.append(t)
        return out

    def entry(self, e, path: str):
        if not isinstance(e, dict):
            _fail(path, f"expected an object, got {_what(e)}")
        kind = e.get("kind")
        if not isinstance(kind, str) or kind not in _ENTRY_FIELDS:
            _fail(f"{path}.kind", f"expected 'placeholder' or 'compute', got {kind!r}")
        _obj(e, path, *_ENTRY_FIELDS[kind])
        name = _check_name(e["name"], f"{path}.name")
        shape = _shape(e["shape"], f"{path}.shape")
        dtype = _dtype(e["dtype"], f"{path}.dtype")
        if kind == "placeholder":
            return _build(path, T.placeholder, shape, dtype, name)
        names = e.get("axes", [f"i{d}" for d in range(len(shape))])
        names = _list(names, f"{path}.axes", len(shape), len(shape))
        axis = [IterVar(_check_name(n, f"{path}.axes[{d}]"), ext) for d, (n, ext) in enumerate(zip(names, shape))]
        tag = _check_tag(e.get("tag", ""), f"{path}.tag")
        attrs = self.attrs(e.get("attrs", {}), f"{path}.attrs")
        if not isinstance(attrs, dict):
            _fail(f"{path}.attrs", f"expected an object, got {_what(e.get('attrs'))}")
        body = self.body(e["body"], f"{path}.body", [a.var for a in axis])
        t = _build(path, T.compute_from_axes, name, axis, body, tag, attrs)
        if t.dtype != dtype:
            _fail(f"{path}.dtype", f"the body computes {t.dtype}, not {dtype}")
        return t

    def body(self, d, path: str, axes: list):
        if not (isinstance(d, dict) and d.get("node") == "reduce"):
            return self.expr(d, path, axes, None, 0)
        _obj(d, path, *_FIELDS["reduce"])
        op = d["op"]
        if op not in REDUCE_COMBINERS:
            _fail(f"{path}.op", f"unknown reduction {op!r}; reductions are {', '.join(REDUCE_COMBINERS)}")
        raxes = []
        for k, a in enumerate(_list(d["axes"], f"{path}.axes", MAX_NDIM, 1)):
            p = f"{path}.axes[{k}]"
            _obj(a, p, {"name", "lo", "hi"})
            lo = _int(a["lo"], f"{p}.lo", -MAX_ELEMENTS, MAX_ELEMENTS)
            hi = _int(a["hi"], f"{p}.hi", lo + 1, lo + MAX_ELEMENTS)
            raxes.append(ReduceAxis(_check_name(a["name"], f"{p}.name"), lo, hi))
        rvars = [a.var for a in raxes]
        source = self.expr(d["source"], f"{path}.source", axes, rvars, 1)
        where = self.expr(d["where"], f"{path}.where", axes, rvars, 1) if "where" in d else None
        combiners: dict[str, abc.Callable[..., E.Expr]] = {"sum": T.sum, "max": T.max, "min": T.min}
        combiner = combiners[op]
        return _build(path, lambda: combiner(source, axis=raxes, where=where))

    def expr(self, d, path: str, axes: list, rvars: list | None, depth: int):
        self.nodes += 1
        if self.nodes > MAX_NODES:
            _fail(path, f"more than {MAX_NODES} expression nodes")
        if depth > MAX_DEPTH:
            _fail(path, f"expression nested deeper than {MAX_DEPTH} levels")
        if not isinstance(d, dict):
            _fail(path, f"expected an expression object, got {_what(d)}")
        node = d.get("node")
        if node == "reduce":
            _fail(path, "a reduction is allowed only as the whole body of a compute")
        if not isinstance(node, str) or node not in _FIELDS:
            _fail(f"{path}.node", f"unknown node type {node!r}; node types are {', '.join(_FIELDS)}")
        _obj(d, path, *_FIELDS[node])
        if node in ("axis", "reduce_axis"):
            found = axes if node == "axis" else rvars
            if not found:
                _fail(path, "a reduce_axis outside a reduction" if node == "reduce_axis" else
                      "this compute has no axes")
            return found[_int(d["index"], f"{path}.index", 0, len(found) - 1)]
        if node == "const":
            return self.const(d, path)
        if node == "read":
            return self.read(d, path, axes, rvars, depth)
        if node in _OPS and d["op"] not in _OPS[node]:
            _fail(f"{path}.op", f"unknown {node} op {d['op']!r}; {node} ops are {', '.join(_OPS[node])}")
        args = _list(d["args"], f"{path}.args", 3)
        if len(args) != _ARITY[node]:
            _fail(f"{path}.args", f"{node} takes {_ARITY[node]} argument(s), got {len(args)}")
        a = [self.expr(x, f"{path}.args[{n}]", axes, rvars, depth + 1) for n, x in enumerate(args)]
        if node == "binary":
            return _build(path, E.binary, d["op"], *a)
        if node == "compare":
            return _build(path, E.compare, d["op"], *a)
        if node == "logical":
            return _build(path, E.logical, d["op"], *a)
        if node == "not":
            return _build(path, E.Not, *a)
        if node == "select":
            return _build(path, E.if_then_else, *a)
        if node == "cast":
            return _build(path, E.cast, _dtype(d["dtype"], f"{path}.dtype"), *a)
        if node == "checked_index":
            lo, hi = (_int(d[k], f"{path}.{k}", -(1 << 62), 1 << 62) for k in ("lo", "hi"))
            if not isinstance(d["site"], str):
                _fail(f"{path}.site", f"expected a string, got {_what(d['site'])}")
            wrap = d.get("wrap", False)
            if not isinstance(wrap, bool):
                _fail(f"{path}.wrap", f"expected true or false, got {_what(wrap)}")
            return _build(path, E.checked_index, a[0], lo, hi, d["site"], wrap)
        return _build(path, getattr(E, d["op"]), *a)  # call: one of MATH_FUNCS, checked above

    def const(self, d, path: str):
        dtype = _dtype(d["dtype"], f"{path}.dtype")
        v = d["value"]
        if dtype == "bool":
            ok = isinstance(v, bool)
        elif is_float(dtype):
            v = _NON_FINITE.get(v, v) if isinstance(v, str) else _finite_float(v)
            ok = isinstance(v, float)
        else:
            ok = isinstance(v, int) and not isinstance(v, bool)
        if not ok:
            hint = ' (a float that is not finite is written "inf", "-inf" or "nan")' if is_float(dtype) else ""
            _fail(f"{path}.value", f"{_what(d['value'])} is not a {dtype} value{hint}")
        return _build(path, E.Const, v, dtype)

    def read(self, d, path: str, axes: list, rvars, depth: int):
        ref = d["tensor"]
        if isinstance(ref, int) and not isinstance(ref, bool) and ref >= len(self.tensors):
            _fail(f"{path}.tensor", f"tensors[{ref}] is not defined before this entry; an entry reads only "
                                    "entries before it (so a definition has no cycles)")
        t = self.tensors[_int(ref, f"{path}.tensor", 0, len(self.tensors) - 1)]
        indices = [self.expr(x, f"{path}.indices[{n}]", axes, rvars, depth + 1)
                   for n, x in enumerate(_list(d["indices"], f"{path}.indices", MAX_NDIM))]
        return _build(path, t.__getitem__, tuple(indices))

    def attrs(self, v, path: str, depth: int = 0):
        """JSON values; lists become tuples (the inventory's attrs hold tuples)."""
        self.nodes += 1
        if self.nodes > MAX_NODES or depth > MAX_ATTR_DEPTH:
            _fail(path, "attribute value too large or too deeply nested")
        if v is None or isinstance(v, (bool, int, str)):
            return v
        if isinstance(v, float):
            if not math.isfinite(v):
                _fail(path, f"{v!r} is not a finite number")
            return v
        if isinstance(v, (list, tuple)):
            return tuple(self.attrs(x, f"{path}[{n}]", depth + 1) for n, x in enumerate(v))
        if isinstance(v, dict) and all(isinstance(k, str) for k in v):
            return {k: self.attrs(x, f"{path}.{k}", depth + 1) for k, x in v.items()}
        _fail(path, f"{_what(v)} is not a JSON value")


__all__ = ["FORMAT", "VERSION", "dag_to_json", "dag_from_json"]
