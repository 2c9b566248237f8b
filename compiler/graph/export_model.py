"""A whole compiled model as one shared library with a C header: the model without Python.

    export_model(module, "out/libresnet.so", "out/resnet.h")

writes a library whose C API runs the whole model:

    resnet_model* resnet_create(void);                      /* NULL when out of memory */
    int32_t resnet_run(resnet_model* m, const float* input, float* output);
    const char* resnet_error(const resnet_model* m, int64_t* index);
    void resnet_destroy(resnet_model* m);

`create` allocates the memory plan's arena (one 64-byte-aligned block holding every buffer of
plan.py's plan, at the offsets the module uses); `run` copies the inputs into their buffers,
calls the kernels in the module's order with pointers into the arena and into the weights, and
copies the outputs out; it returns 0, or the first failing kernel's status, a bit set: 1 when its
scratch memory could not be allocated, 2 when an index read from data (a Gather's indices) was out
of range; the outputs are then not written. After a 2, `error` says which node's input held the
bad index and its valid range, and gives the index (the Python runtime's KernelRuntimeError, in
C). The weights are embedded in the library (`.incbin` of the constants
exactly as the module hands them to its kernels: pre-packed, transposed), so the library is the
only file a C program needs beside the header. One model object runs one call at a time; several
objects may run at once. Parallel loops run on libgomp (OMP_NUM_THREADS).

The kernels are the module's own (each built under its workload's unique symbol,
runtime.kernel_name), linked by compiler.export.export_library together with the generated C
runtime; the library exports the four functions and nothing else (a version script).
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ExportError
from ..export import C_KEYWORDS, C_TYPES, c_header, check_writable_dir, export_library, header_text
from .index_errors import failing_node
from .ir import Graph
from .runtime import GraphModule, build_model

ALIGN = 64   # every buffer and weight starts on a cache line, as the module's aligned_empty gives them


@dataclass(frozen=True)
class ExportedModel:
    """What export_model wrote, and the C names it chose."""

    library: Path
    header: Path
    name: str               # the prefix of the C API: NAME_create, NAME_run, NAME_error, NAME_destroy
    arena_bytes: int
    weight_bytes: int
    kernels: int


@dataclass(frozen=True)
class _Buffer:
    """Where a kernel argument lives: in the arena (activations) or the weights, at an offset."""

    base: str      # "a" (the arena) or "w" (the weights)
    offset: int


def c_identifier(text: str, fallback: str = "model") -> str:
    """`text` made a C identifier (non-word characters become '_'; a leading digit gets a 'm')."""
    name = re.sub(r"\W", "_", str(text), flags=re.ASCII).strip("_") or fallback
    if name[0].isdigit():
        name = "m" + name
    if name in C_KEYWORDS:
        name += "_"
    return name


def model_name_of(lib_path) -> str:
    """NAME of libNAME.so (else the file's stem) as a C identifier."""
    stem = Path(lib_path).name.split(".")[0]
    return c_identifier(stem[3:] if stem.startswith("lib") and len(stem) > 3 else stem)


def export_model(module_or_graph, lib_path, header_path=None, *, name: str | None = None, target=None,
                 records=None, cc: str | list = "cc", timeout: float = 600.0) -> ExportedModel:
    """Write the model as the shared library `lib_path` and its C header (`header_path`, default
    `lib_path` with `.h`; for libNAME.so, NAME.h beside it). A Graph is built first
    (build_model with `target` and `records`); a GraphModule is exported as built. `name`: the
    prefix of the C API (default: NAME of libNAME.so). ExportError for anything that cannot be
    exported (not a model, a directory that does not exist or cannot be written, a dtype without a
    C type, no C compiler, a failed link); nothing is left at `lib_path` then."""
    module = _module(module_or_graph, target, records)
    lib_path = Path(lib_path)
    name = c_identifier(name) if name is not None else model_name_of(lib_path)
    header_path = Path(header_path) if header_path is not None else lib_path.parent / f"{name}.h"
    check_writable_dir(lib_path.parent, "the library")
    check_writable_dir(header_path.parent, "the header")
    layout = _Layout(module)
    kernels = list({id(s.kernel): s.kernel for s in module.steps}.values())
    if not kernels:
        raise ExportError("the model computes nothing (its outputs are inputs or constants): no kernel to export")
    with tempfile.TemporaryDirectory(prefix="tf_model_export_") as tmp:
        weights = os.path.join(tmp, "weights.bin")
        runtime = runtime_source(module, name, layout, weights, f"{name}.h")   # places the weights
        with open(weights, "wb") as f:
            f.write(layout.weights)
        api_header = os.path.join(tmp, f"{name}.h")
        with open(api_header, "w") as f:
            f.write(api_header_text(module, name))
        with open(os.path.join(tmp, "tf_kernels.h"), "w") as f:
            f.write(header_text(kernels, guard_name=f"{name}_kernels.h"))
        source = os.path.join(tmp, f"{name}_runtime.c")
        with open(source, "w") as f:
            f.write(runtime)
        script = os.path.join(tmp, "exports.map")
        with open(script, "w") as f:
            f.write("{\n  global: " + " ".join(f"{name}_{fn};" for fn in ("create", "run", "error", "destroy"))
                    + "\n  local: *;\n};\n")
        export_library(kernels, lib_path, header_path=False, cc=cc, timeout=timeout, sources=[source],
                       extra_flags=["-O2", "-fPIC", "-std=c11", f"-I{tmp}", f"-Wl,--version-script={script}"])
        tmp_header = str(header_path) + ".tmp"
        with open(api_header) as src, open(tmp_header, "w") as dst:
            dst.write(src.read())
        os.replace(tmp_header, header_path)
    return ExportedModel(lib_path, header_path, name, layout.arena_bytes, len(layout.weights), len(kernels))


def _module(obj, target, records) -> GraphModule:
    if isinstance(obj, GraphModule):
        if target is not None or records is not None:
            raise ExportError("target and records apply when a Graph is built; this GraphModule is already built")
        return obj
    if isinstance(obj, Graph):
        return build_model(obj, target, records)
    raise ExportError(f"export_model takes a GraphModule or a Graph (compiler.graph.from_onnx), got "
                      f"{type(obj).__name__}")


class _Layout:
    """The module's buffers as offsets: its memory-plan blocks packed into one arena, its constant
    arguments packed into one weights blob, both on ALIGN boundaries."""

    def __init__(self, module: GraphModule):
        self.module = module
        self.block_offset, offset = [], 0
        for block in module._blocks:
            self.block_offset.append(offset)
            offset += _aligned(block.nbytes)
        self.arena_bytes = max(offset, ALIGN)
        self._weight_offset: dict = {}   # address of a constant array -> offset in the blob
        self._chunks: list = []
        self._weight_bytes = 0

    @property
    def weights(self) -> bytes:
        return b"".join(self._chunks)

    def of_array(self, arr: np.ndarray) -> _Buffer:
        """Where `arr` (a kernel argument of the module) lives in the exported library."""
        addr = arr.ctypes.data
        for i, block in enumerate(self.module._blocks):
            start = block.ctypes.data
            if start <= addr < start + block.nbytes or (addr == start and arr.nbytes == 0):
                return _Buffer("a", self.block_offset[i] + addr - start)
        return self.constant(arr)

    def constant(self, arr: np.ndarray) -> _Buffer:
        key = (arr.ctypes.data, arr.nbytes, arr.dtype.str)
        if key not in self._weight_offset:
            data = np.ascontiguousarray(arr).tobytes()
            self._weight_offset[key] = self._weight_bytes
            padded = data + b"\0" * (_aligned(len(data)) - len(data))
            self._chunks.append(padded)
            self._weight_bytes += len(padded)
        return _Buffer("w", self._weight_offset[key])


def _aligned(n: int) -> int:
    return max(ALIGN, -(-n // ALIGN) * ALIGN)


def _io_names(module: GraphModule) -> tuple:
    """C parameter names of the inputs and outputs, unique, in graph order."""
    taken = {"model", "a", "w", "status"}
    out = []
    for value in module.input_names + module.output_names:
        c = c_identifier(value, "value")
        while c in taken or c in C_TYPES.values():
            c += "_"
        taken.add(c)
        out.append(c)
    return out[:len(module.input_names)], out[len(module.input_names):]


def _ctype(module: GraphModule, value: str) -> str:
    dtype = module.graph.values[value].dtype
    ctype = C_TYPES.get(dtype)
    if ctype is None:
        raise ExportError(f"value {value!r} has dtype {dtype}, which has no C type")
    return ctype


def _signature(module: GraphModule, name: str) -> str:
    ins, outs = _io_names(module)
    params = [f"const {_ctype(module, v)}* {c}" for v, c in zip(module.input_names, ins)]
    params += [f"{_ctype(module, v)}* {c}" for v, c in zip(module.output_names, outs)]
    return f"int32_t {name}_run({name}_model* model, {', '.join(params)})"


def api_header_text(module: GraphModule, name: str) -> str:
    """The header of an exported model's C API (see the module docstring)."""
    graph, target = module.graph, module.target
    guard = f"TUNEFARM_MODEL_{name.upper()}_H"
    ins, outs = _io_names(module)
    comments = [
        "/* Generated by tunefarm (compiler.graph.export_model). Do not edit. */",
        f"/* Model {graph.name!r}, built for {target.triple} ({target.cpu}): {len(module.steps)} kernels. */",
    ]
    lines = [
        "/* Arrays are dense and C-contiguous (row-major), of exactly these shapes; inputs and",
        " * outputs must not overlap. */",
    ]
    for kind, values, cnames in (("INPUT", module.input_names, ins), ("OUTPUT", module.output_names, outs)):
        for i, (v, c) in enumerate(zip(values, cnames)):
            val = graph.values[v]
            lines.append(f"/* {kind.lower()} {i} {v!r} ({c}): {val.dtype}[{', '.join(map(str, val.shape))}] */")
            lines.append(f"#define {name.upper()}_{kind}{i}_SIZE {val.size}   /* elements */")
    lines += [
        f"#define {name.upper()}_NUM_INPUTS {len(ins)}",
        f"#define {name.upper()}_NUM_OUTPUTS {len(outs)}",
        "",
        f"typedef struct {name}_model {name}_model;",
        "",
        f"/* A model with its buffers ({module.plan.total_bytes} bytes of activations); NULL when they",
        " * cannot be allocated. */",
        f"{name}_model* {name}_create(void);",
        "",
        "/* Run the model: inputs in, outputs out. 0 on success, else the failing kernel's status, a",
        " * bit set: 1 when its scratch memory could not be allocated, 2 when an index read from data",
        " * (a Gather's indices) was out of range; the outputs are not written then. One call at a",
        " * time per model object. */",
        _signature(module, name) + ";",
        "",
        "/* After a run that returned 2: which node's input held the bad index and its valid range, in",
        " * words (\"Gather node 'emb': indices, valid range [-5, 5)\"), the index in *index",
        " * (when not NULL). NULL when the model's last run did not fail that way. */",
        f"const char* {name}_error(const {name}_model* model, int64_t* index);",
        "",
        "/* Free the model (NULL is fine). */",
        f"void {name}_destroy({name}_model* model);",
        "",
    ]
    return c_header(guard, comments, lines)


def runtime_source(module: GraphModule, name: str, layout: _Layout, weights_file: str, header: str) -> str:
    """The C code of create/run/destroy: the module's steps as calls on arena and weight offsets."""
    blob = f"{name}_weights"
    ins, outs = _io_names(module)
    lines = [
        "/* Generated by tunefarm (compiler.graph.export_model): the runtime of one model. */",
        "#include <stdint.h>",
        "#include <stdlib.h>",
        "#include <string.h>",
        f'#include "{header}"',
        '#include "tf_kernels.h"',
        "",
        "/* the weights, embedded when the library is linked (hidden: the library exports only the API) */",
        "__asm__(\".section .rodata\\n.balign " + str(ALIGN) + "\\n.globl " + blob + "\\n.hidden " + blob
        + "\\n" + blob + ":\\n.incbin \\\"" + _asm_string(weights_file) + "\\\"\\n.byte 0\\n.previous\\n\");",
        f"extern const unsigned char {blob}[];",
        "",
        f"struct {name}_model {{ unsigned char* arena; int32_t failed_step; int64_t record[2]; }};",
        "",
        *_check_tables(module, name),
        "",
        f"{name}_model* {name}_create(void) {{",
        f"    {name}_model* model = calloc(1, sizeof *model);",
        "    if (!model) return NULL;",
        f"    model->arena = aligned_alloc({ALIGN}, {layout.arena_bytes});",
        "    if (!model->arena) { free(model); return NULL; }",
        "    model->failed_step = -1;",
        "    return model;",
        "}",
        "",
        f"const char* {name}_error(const {name}_model* model, int64_t* index) {{",
        "    int32_t s = model->failed_step;",
        f"    if (s < 0 || model->record[0] < 1 || model->record[0] > {name}_check_count[s]) return NULL;",
        "    if (index) *index = model->record[1];",
        f"    return {name}_checks[{name}_check_base[s] + model->record[0] - 1];",
        "}",
        "",
        f"void {name}_destroy({name}_model* model) {{",
        "    if (!model) return;",
        "    free(model->arena);",
        "    free(model);",
        "}",
        "",
        _signature(module, name) + " {",
        "    unsigned char* a = model->arena;",
        f"    const unsigned char* w = {blob};",
        "    int32_t status;",
        "    model->failed_step = -1;",
        "    model->record[0] = 0;",
    ]
    for v, c in zip(module.input_names, ins):
        view = module._inputs[v]
        lines.append(f"    memcpy(a + {layout.of_array(view).offset}, {c}, {view.nbytes});")
    for i, step in enumerate(module.steps):
        args = []
        for arr in step.arrays:
            buf = layout.of_array(arr)
            args.append(f"(void*)({buf.base} + {buf.offset})")
        args.append("model->record")
        lines.append(f"    /* {step.group.group.describe()} */")
        lines.append(f"    status = {step.kernel.name}({', '.join(args)});")
        lines.append(f"    if (status != 0) {{ model->failed_step = {i}; return status; }}")
    for v, c in zip(module.output_names, outs):
        out_view = module._output_views.get(v)
        if out_view is not None:
            buf, nbytes = layout.of_array(out_view), out_view.nbytes
        else:   # a constant output: copied out of the weights
            const = module.graph.values[v].const
            buf, nbytes = layout.constant(const), const.nbytes
        lines.append(f"    memcpy({c}, {buf.base} + {buf.offset}, {nbytes});")
    lines += ["    return 0;", "}", ""]
    return "\n".join(lines)


def _check_tables(module: GraphModule, name: str) -> list:
    """C tables of every step's index checks in words (NAME_error's answers): the checks of all
    steps in one array, with each step's first entry and count."""
    texts: list[str] = []
    base: list[int] = []
    count: list[int] = []
    for step in module.steps:
        base.append(len(texts))
        count.append(len(step.kernel.checks))
        for check in step.kernel.checks:
            node = failing_node(step.group.group.nodes, check.site)
            what = check.site.split(": ", 1)[1] if node is not None else check.site
            where = f"{node.op_type} node {node.name!r}: {what}" if node is not None else what
            texts.append(f"{where}, valid range [{check.lo}, {check.hi})")
    entries = ", ".join(_c_string(t) for t in texts) or "0"
    return [f"static const char* const {name}_checks[] = {{{entries}}};",
            f"static const int64_t {name}_check_base[] = {{{', '.join(map(str, base)) or '0'}}};",
            f"static const int64_t {name}_check_count[] = {{{', '.join(map(str, count)) or '0'}}};"]


def _c_string(text: str) -> str:
    """`text` as a C string literal: printable ASCII as is, everything else (quotes, backslashes,
    ?, UTF-8 bytes of a node's name) as octal escapes."""
    out = []
    for byte in text.encode():
        ch = chr(byte)
        out.append(ch if 32 <= byte < 127 and ch not in '"\\?' else f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def _asm_string(path: str) -> str:
    if any(ch in path for ch in '"\\\n'):
        raise ExportError(f"temporary path {path!r} cannot be named in an assembler string")
    return path


__all__ = ["export_model", "ExportedModel", "api_header_text", "runtime_source", "c_identifier", "model_name_of"]
