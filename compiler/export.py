"""Export built kernels as a shared library plus a C header, for use without Python.

    export_library([mm, relu], "build/libkernels.so")     # also writes build/libkernels.h

Each kernel's object file (already position independent) is linked with the system C compiler
(`cc -shared ... -lgomp -lm`). The header declares every kernel as

    int32_t mm(const float* A, const float* B, float* C, int64_t* error);

with one comment per argument giving its dtype and shape. Arrays are dense, C-contiguous
(row-major) and of exactly the shape the kernel was built for; `error` is the caller's error
record, two int64 words or NULL (compiler/index_checks.py). The kernel returns 0, or a bit set
of failures (nothing is leaked): 1 when its scratch memory could not be allocated, 2 when an
index read from data was out of range (error[0] = 1 + the check's number, error[1] = the index;
the outputs are then undefined). The header lists each kernel's checks. Parallel
loops use libgomp, so OMP_NUM_THREADS / omp_set_num_threads choose the thread count.

Kernels built for another target can be exported with a cross compiler (`cc="aarch64-linux-gnu-gcc"`).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .errors import ExportError
from .runtime import RESERVED_SYMBOLS
from .target import Target

C_TYPES = {
    "float32": "float",
    "float64": "double",
    "int8": "int8_t",
    "int32": "int32_t",
    "int64": "int64_t",
    "bool": "uint8_t",  # an i1 in memory is one byte holding 0 or 1
}

C_KEYWORDS = frozenset("""
auto break case char const continue default do double else enum extern float for goto if inline int
long register restrict return short signed sizeof static struct switch typedef union unsigned void
volatile while _Alignas _Alignof _Atomic _Bool _Complex _Generic _Imaginary _Noreturn _Static_assert
_Thread_local alignas alignof bool false nullptr static_assert thread_local true typeof typeof_unqual
asm class delete friend namespace new operator private protected public template this throw try
typename using virtual
""".split())

# names a parameter must not take: it would hide the type of the parameters after it
_TYPE_NAMES = frozenset(C_TYPES.values()) | {"int16_t", "uint16_t", "uint32_t", "uint64_t", "size_t", "NULL"}

@dataclass(frozen=True)
class ExportedLibrary:
    """What export_library wrote."""

    library: Path
    header: Path | None
    symbols: tuple


def export_library(kernels, lib_path, header_path=None, cc: str | list = "cc",
                   extra_flags=(), timeout: float = 120.0, sources=()) -> ExportedLibrary:
    """Link `kernels` into the shared library `lib_path` and write a C header declaring them.

    `header_path` defaults to `lib_path` with the suffix `.h`; pass False to write no header.
    `sources`: C (or assembly) files compiled into the same library, e.g. the code that calls the
    kernels (compiler.graph.export_model's model runtime); `extra_flags` apply to them too.
    `cc` is the C compiler (a command name, a path, or an argv list); it must target the
    kernels' architecture, so kernels for another machine need a cross compiler.
    Raises ExportError for duplicate or unusable kernel names, kernels for different targets,
    a missing compiler, or a failed link. Nothing is left at `lib_path` when linking fails.
    """
    from .runtime import Kernel

    if isinstance(kernels, Kernel):
        kernels = [kernels]
    kernels = list(kernels)
    if not kernels:
        raise ExportError("export_library needs at least one kernel")
    for k in kernels:
        if not isinstance(k, Kernel):
            raise ExportError(f"export_library takes compiler Kernels, got {type(k).__name__}")
    _check_names(kernels)
    triples = sorted({k.target.triple for k in kernels})
    if len(triples) > 1:
        raise ExportError(f"kernels are built for different targets ({', '.join(triples)}); "
                          "one library holds code for one architecture")
    cc_argv = _compiler_argv(cc)
    if cc == "cc" and kernels[0].target.arch != Target.host().arch:
        raise ExportError(f"kernels are built for {triples[0]} but the default compiler 'cc' targets this "
                          f"machine ({Target.host().triple}); pass a cross compiler, e.g. "
                          f"cc='{kernels[0].target.arch}-linux-gnu-gcc'")
    if shutil.which(cc_argv[0]) is None:
        raise ExportError(f"C compiler {cc_argv[0]!r} not found; install one (e.g. gcc) or pass cc=")

    lib_path = Path(lib_path)
    if header_path is None:
        header_path = lib_path.with_suffix(".h")
    elif header_path is not False:
        header_path = Path(header_path)
    for path in (lib_path, header_path):
        if path is not False:
            check_writable_dir(path.parent, "the library" if path is lib_path else "the header")

    with tempfile.TemporaryDirectory(prefix="tf_export_") as tmp:
        objects = []
        for k in kernels:
            obj = os.path.join(tmp, f"{k.name}.o")
            with open(obj, "wb") as f:
                f.write(k.object_code)
            objects.append(obj)
        out = os.path.join(tmp, "lib.so")
        cmd = cc_argv + ["-shared", "-o", out] + objects + [str(src) for src in sources] + list(extra_flags) + \
            ["-Wl,-z,noexecstack", "-lgomp", "-lm"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except OSError as e:
            raise ExportError(f"cannot run the C compiler {cc_argv[0]!r}: {e}") from None
        except subprocess.TimeoutExpired:
            raise ExportError(f"linking with {cc_argv[0]!r} took more than {timeout:.0f} s") from None
        if proc.returncode != 0 or not os.path.exists(out):
            raise ExportError(f"linking the kernels failed ({shlex.join(cmd)}):\n"
                              f"{(proc.stderr or proc.stdout).strip()}")
        shutil.copyfile(out, str(lib_path) + ".tmp")
        os.replace(str(lib_path) + ".tmp", lib_path)
    if header_path is not False:
        tmp_header = str(header_path) + ".tmp"
        with open(tmp_header, "w") as f:
            f.write(header_text(kernels, guard_name=header_path.name))
        os.replace(tmp_header, header_path)
    return ExportedLibrary(lib_path, header_path or None, tuple(k.name for k in kernels))


def check_writable_dir(directory, what: str) -> None:
    """ExportError unless files can be created in `directory` (tried, not guessed from mode bits:
    root ignores them, read-only file systems do not)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ExportError(f"directory {str(directory)!r} of {what} does not exist")
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".tf_probe_"):
            pass
    except OSError as e:
        raise ExportError(f"cannot write {what} into {str(directory)!r}: {e.strerror or e}") from None


def c_header(guard: str, comments: list, body: list) -> str:
    """A C header: `comments` (lines of comment), the include guard `guard`, <stdint.h>, and
    `body` (declarations) inside extern "C" for C++ readers."""
    lines = [*comments, f"#ifndef {guard}", f"#define {guard}", "", "#include <stdint.h>", "",
             "#ifdef __cplusplus", 'extern "C" {', "#endif", "", *body,
             "#ifdef __cplusplus", "}", "#endif", "", f"#endif /* {guard} */", ""]
    return "\n".join(lines)


def header_text(kernels, guard_name: str = "kernels.h") -> str:
    """The C header declaring `kernels` (see export_library)."""
    from .runtime import Kernel

    if isinstance(kernels, Kernel):
        kernels = [kernels]
    guard = "TUNEFARM_" + re.sub(r"\W", "_", guard_name).upper()
    if not guard.endswith("_H"):
        guard += "_H"
    comments = [
        "/* Generated by tunefarm's compiler (compiler.export). Do not edit. */",
        "/* Arrays are dense and C-contiguous (row-major), of exactly the shapes below.",
        " * `error` is NULL or two int64 words, the error record. Every kernel returns 0, or a bit set:",
        " * 1 when its scratch memory could not be allocated, 2 when an index read from data was out",
        " * of range (then error[0] = 1 + the check's number below, error[1] = the index, and the",
        " * outputs are undefined). Parallel loops run on libgomp (OMP_NUM_THREADS). */",
    ]
    lines = []
    for k in kernels:
        lines.append(f"/* {k.name}: built for {k.target.triple} ({k.target.cpu}) */")
        for n, check in enumerate(k.checks):
            lines.append(f"/*   index check {n}: {_comment_text(check.site)}, valid range [{check.lo}, {check.hi}) */")
        params = []
        taken = {k.name, "error"}
        for spec in k.args:
            ctype = C_TYPES.get(spec.dtype)
            if ctype is None:
                raise ExportError(f"kernel {k.name}: argument {spec.name} has dtype {spec.dtype} with no C type")
            pname = spec.name
            while pname in C_KEYWORDS or pname in _TYPE_NAMES or pname in taken or pname.startswith("__"):
                pname += "_"
            taken.add(pname)
            const = "" if spec.written else "const "
            role = " (output)" if spec.written else " (input)"
            shape = ", ".join(map(str, spec.shape))
            params.append((f"{const}{ctype}* {pname}", f"{spec.name}: {spec.dtype}[{shape}]{role}"))
        params.append(("int64_t* error", "the error record: NULL or int64[2]"))
        lines.append(f"int32_t {k.name}(")
        for i, (decl, comment) in enumerate(params):
            sep = "," if i < len(params) - 1 else ""
            lines.append(f"    {decl}{sep}  /* {comment} */")
        lines.append(");")
        lines.append("")
    return c_header(guard, comments, lines)


def _comment_text(text: str) -> str:
    """`text` safe inside a C comment on one line."""
    return "".join(ch if ch.isprintable() and ch.isascii() else "?" for ch in text).replace("*/", "* /")


def _check_names(kernels):
    seen = {}
    for k in kernels:
        n = k.name
        if not isinstance(n, str) or not re.fullmatch(r"[A-Za-z_]\w*", n) or not n.isascii():
            raise ExportError(f"kernel name {n!r} is not a C identifier")
        if n in C_KEYWORDS:
            raise ExportError(f"kernel name {n!r} is a C keyword; build it with another name=")
        if n == "main" or n in RESERVED_SYMBOLS or n.startswith(("GOMP_", "omp_", "__")):
            raise ExportError(f"kernel name {n!r} clashes with a C runtime symbol "
                              "(build's default name 'main' too); build it with another name=")
        if n in seen:
            raise ExportError(f"two kernels are named {n!r}; symbols of a library must be distinct, "
                              "build them with different name=")
        seen[n] = k


def _compiler_argv(cc) -> list:
    if isinstance(cc, (list, tuple)):
        argv = [str(c) for c in cc]
    elif isinstance(cc, (str, os.PathLike)):
        argv = shlex.split(str(cc))
    else:
        raise ExportError(f"cc must be a command string or an argv list, got {type(cc).__name__}")
    if not argv:
        raise ExportError("cc is empty")
    return argv


__all__ = ["export_library", "header_text", "check_writable_dir", "ExportedLibrary", "C_TYPES", "C_KEYWORDS", "c_header"]
