"""Models whose inputs have symbolic dimensions: compiled for each concrete shape on first use.

Exporters write a batch axis, a sequence length or an image size as a named symbol
(`batch`, `sequence_length`, `s0`). The compiler builds kernels for static shapes only, so a
`ShapeSpecializedModel` keeps the ONNX model and compiles it once per concrete input signature
the first time a call brings it: the model is imported with those shapes pinned
(onnx_import.from_onnx, where the Shape → Gather → Concat → Reshape chains fold to that
signature's constants) and built with the same records and target (runtime.build_model). The
built modules are kept in a bounded least-recently-used cache: a server that sees sequence
lengths 1..512 keeps the shapes it is using, not every shape it ever saw.

Records need nothing shape-specific here: a record is looked up by its workload's key, so a
schedule tuned at one shape serves every signature whose fused workloads are the same (a
sequence length changes the attention's workloads; the projections of a decoder's decode step
are the same at every cache length). `--input-shape` (input_shapes) stays the way to build one
signature ahead of time: for tuning, export, and `model tasks`.

A symbol names one size wherever it appears: two inputs whose dimension both say `batch` must
agree in a call (InputError otherwise), as onnxruntime requires.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

import numpy as np

from .errors import DynamicShapeError, GraphError, InputError, ShapeError
from .onnx_import import from_onnx, load_model
from .ops.elementwise import ONNX_DTYPES
from .runtime import GraphModule, build_model, check_input_arrays

DEFAULT_MAX_SHAPES = 8


class ShapeSpecializedModel:
    """An ONNX model compiled per concrete input signature, `run(**inputs)` like a GraphModule.

    `src`: a path, bytes or onnx.ModelProto. `input_shapes` pins some inputs for every call (a
    partial signature; the rest stay symbolic). `max_shapes`: how many compiled signatures are
    kept (least recently used goes first). `records`, `target`: as build_model takes them.
    Like a GraphModule, it runs one call of a shape at a time."""

    def __init__(self, src, target=None, records=None, input_shapes: dict | None = None,
                 max_shapes: int = DEFAULT_MAX_SHAPES):
        if max_shapes < 1:
            raise ValueError(f"max_shapes must be at least 1, got {max_shapes}")
        self._model = load_model(src)
        self.signature = input_signature(self._model, input_shapes)   # {name: (dtype, dims)}
        self.target = target
        self.records = records
        self.max_shapes = max_shapes
        self.input_names = list(self.signature)
        self.output_names = [o.name for o in self._model.graph.output]
        self._modules: OrderedDict = OrderedDict()   # shapes key -> GraphModule
        self._lock = threading.Lock()
        self.builds = 0             # signatures compiled so far (an evicted one compiled again counts again)
        self.build_seconds = 0.0    # spent compiling them

    @property
    def symbolic(self) -> dict:
        """{input name: [dimension index, ...]} of the dimensions a call decides."""
        return {n: [d for d, s in enumerate(dims) if not isinstance(s, int)]
                for n, (_, dims) in self.signature.items() if any(not isinstance(s, int) for s in dims)}

    @property
    def shapes(self) -> list:
        """The signatures compiled and kept, least recently used first ({input: shape})."""
        with self._lock:
            return [dict(k) for k in self._modules]

    def shapes_of(self, inputs: dict) -> dict:
        """{input name: shape} of a call's arrays, checked against the model's signature:
        names, dtypes, ranks, fixed dimensions, and one size per symbol."""
        check_input_arrays(self.input_names, inputs)
        sizes: dict = {}
        shapes = {}
        for name, (dtype, dims) in self.signature.items():
            arr = inputs[name]
            if arr.dtype != np.dtype(dtype):
                raise InputError(f"input {name!r}: expected dtype {dtype}, got {arr.dtype}")
            if arr.ndim != len(dims):
                raise InputError(f"input {name!r}: expected rank {len(dims)} ({_show(dims)}), got shape {arr.shape}")
            for d, (want, got) in enumerate(zip(dims, arr.shape)):
                if isinstance(want, int):
                    if want != got:
                        raise InputError(f"input {name!r}: dimension {d} must be {want} ({_show(dims)}), "
                                         f"got shape {arr.shape}")
                    continue
                if got < 1:
                    raise InputError(f"input {name!r}: dimension {d} ({want!r}) is {got}; tunefarm compiles "
                                     "non-empty tensors")
                if want is not None:   # a named symbol: one size everywhere it appears
                    seen = sizes.setdefault(want, (got, name, d))
                    if seen[0] != got:
                        raise InputError(f"input {name!r}: dimension {d} ({want!r}) is {got}, but input "
                                         f"{seen[1]!r} dimension {seen[2]} gives {want!r} = {seen[0]}")
            shapes[name] = tuple(int(s) for s in arr.shape)
        return shapes

    def module_for(self, shapes: dict) -> GraphModule:
        """The model compiled for `shapes` ({input name: shape}, every input): from the cache,
        else imported with them pinned and built now."""
        key = tuple((n, tuple(shapes[n])) for n in self.input_names)
        with self._lock:
            module = self._modules.get(key)
            if module is not None:
                self._modules.move_to_end(key)
                return module
            # built under the lock: two threads that bring one new shape build it once, and a
            # build already uses every core
            t0 = time.perf_counter()
            graph = from_onnx(self._model, input_shapes=dict(key))
            module = build_model(graph, self.target, self.records)
            self.build_seconds += time.perf_counter() - t0
            self.builds += 1
            self._modules[key] = module
            while len(self._modules) > self.max_shapes:
                self._modules.popitem(last=False)
            return module

    def run(self, **inputs) -> list:
        """The model's outputs for `inputs`, compiled for their shapes on first use.

        A signature compiled before is found by its arrays' shapes alone, without validating it
        again (checked and consistent when it was first seen); the module checks dtypes and
        shapes as any GraphModule does. Validated each call, it cost a batch-1 MLP a fifth of
        its run (9-20 us on a 30 us run)."""
        if len(inputs) == len(self.input_names):
            try:
                key = tuple((n, inputs[n].shape) for n in self.input_names)
            except (KeyError, AttributeError):   # a missing input, not an array: the full check says
                key = None
            module = self._modules.get(key) if key is not None else None
            if module is not None:
                try:
                    self._modules.move_to_end(key)   # still the least recently used order
                except KeyError:   # evicted by another thread's build meanwhile: ours still runs
                    pass
                return module.run(**inputs)
        return self.module_for(self.shapes_of(inputs)).run(**inputs)


def input_signature(model, input_shapes: dict | None = None) -> dict:
    """{input name: (dtype, dims)} of the model's graph inputs (initializers are not inputs),
    each dimension an int where the model or `input_shapes` fixes it, else its symbol (the
    exporter's dim_param, or None for an unnamed one). An input of no known rank is an error: it
    must be pinned."""
    given = dict(input_shapes or {})
    inits = {i.name for i in model.graph.initializer}
    inputs = [vi for vi in model.graph.input if vi.name not in inits]
    unknown = sorted(set(given) - {vi.name for vi in inputs})
    if unknown:
        raise GraphError(f"input_shapes names {unknown}, which are not inputs of the model; its inputs are "
                         f"{[vi.name for vi in inputs]}")
    out = {}
    for vi in inputs:
        if not vi.type.HasField("tensor_type"):
            raise GraphError(f"input {vi.name!r} is not a tensor (sequences and maps are not supported)")
        t = vi.type.tensor_type
        dtype = ONNX_DTYPES.get(t.elem_type)
        if dtype is None:
            raise GraphError(f"input {vi.name!r} has ONNX data type {t.elem_type}, which tunefarm does not compile "
                             f"({', '.join(ONNX_DTYPES.values())})")
        pinned = given.get(vi.name)
        if not t.HasField("shape"):
            if pinned is None:
                raise DynamicShapeError(f"input {vi.name!r} has no shape (not even a rank) in the model; pin it "
                                        f"with input_shapes (--input-shape {vi.name}=1,3,224,224)")
            out[vi.name] = (dtype, [int(s) for s in pinned])
            continue
        dims: list = [int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or None)
                      for d in t.shape.dim]
        if pinned is not None:
            pinned = [int(s) for s in pinned]
            if len(pinned) != len(dims) or any(isinstance(m, int) and m != p for m, p in zip(dims, pinned)) \
                    or any(p < 1 for p in pinned):
                raise ShapeError(f"input {vi.name!r}: input_shapes gives {tuple(pinned)}, the model {_show(dims)}")
            dims = pinned
        out[vi.name] = (dtype, dims)
    return out


def _show(dims) -> str:
    return "(" + ", ".join(str(s) if isinstance(s, int) else repr(s or "?") for s in dims) + ")"


def compile_onnx(src, target=None, records=None, input_shapes: dict | None = None,
                 max_shapes: int = DEFAULT_MAX_SHAPES):
    """The ONNX model at `src` ready to run: a GraphModule when `input_shapes` and the model fix
    every dimension (built now), else a ShapeSpecializedModel that builds each new signature on
    first use. Both run with `run(**inputs)`."""
    model = load_model(src)
    signature = input_signature(model, input_shapes)
    if all(isinstance(s, int) for _, dims in signature.values() for s in dims):
        return build_model(from_onnx(model, input_shapes={n: dims for n, (_, dims) in signature.items()}),
                           target, records)
    return ShapeSpecializedModel(model, target, records, input_shapes, max_shapes)


__all__ = ["ShapeSpecializedModel", "compile_onnx", "input_signature", "DEFAULT_MAX_SHAPES"]
