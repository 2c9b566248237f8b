"""The bytes a kernel travels as, and the checks an object file passes before LLVM loads it.

Layout (version 3): MAGIC, a little-endian u32 header length, the JSON header (name, target,
arguments with shapes, dtypes and which ones the kernel writes, its run-time index checks, loop
IR), the object file, and a
SHA-256 of everything before it. The checksum covers the header too: an argument shape edited in
transit would otherwise make the kernel read or write outside the arrays it is given.

LLVM aborts or crashes the whole process on an object it cannot load (a corrupt ELF file, a
Mach-O or COFF object on Linux) instead of reporting an error, so those are refused here first.
"""

from __future__ import annotations

import hashlib
import json
import struct

from .dtypes import ALL_DTYPES
from .errors import KernelLoadError
from .target import Target
from .target_string import enabled_features

MAGIC = b"TFK1"
# 3: every kernel takes the caller's error record after its buffers (compiler/index_checks.py),
# and the header lists its index checks; a version-2 object called that way would never report
FORMAT_VERSION = 3
_DIGEST = 32


def encode(header: dict, object_code: bytes) -> bytes:
    head = json.dumps(dict(header, version=FORMAT_VERSION)).encode()
    body = MAGIC + struct.pack("<I", len(head)) + head + object_code
    return body + hashlib.sha256(body).digest()


def decode(data) -> tuple:
    """(header dict, object bytes) of a kernel blob; KernelLoadError on anything malformed."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise KernelLoadError(f"kernel bytes must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < 8 + _DIGEST or data[:4] != MAGIC:
        raise KernelLoadError("not a tunefarm kernel (bad magic bytes)")
    body, digest = data[:-_DIGEST], data[-_DIGEST:]
    (n,) = struct.unpack("<I", body[4:8])
    try:
        header = json.loads(body[8:8 + n].decode())
        version = header["version"] if isinstance(header, dict) else None
    except (ValueError, KeyError):
        version = header = None
    if isinstance(version, int) and version != FORMAT_VERSION:
        raise KernelLoadError(f"kernel format version {version} is not supported (this runtime reads "
                              f"version {FORMAT_VERSION}); rebuild the kernel with this tunefarm")
    if hashlib.sha256(body).digest() != digest:
        raise KernelLoadError("kernel bytes are corrupt (checksum mismatch: truncated or altered)")
    if header is None:
        raise KernelLoadError("malformed kernel header (not JSON)")
    obj = body[8 + n:]
    if not obj:
        raise KernelLoadError("kernel has no object code")
    return _checked_header(header), obj


def _checked_header(header: dict) -> dict:
    try:
        name, args = header["name"], header["args"]
        Target.from_string(header["target"])
        ok = isinstance(name, str) and name.isidentifier() and isinstance(args, list)
        for a in args:
            shape = a["shape"]
            ok = ok and isinstance(a["name"], str) and a["dtype"] in ALL_DTYPES and \
                isinstance(a.get("written", True), bool) and isinstance(shape, list) and \
                all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)
        for c in header.get("checks", []):
            ok = ok and isinstance(c["site"], str) and all(
                isinstance(c[k], int) and not isinstance(c[k], bool) for k in ("lo", "hi"))
    except Exception as e:  # noqa: BLE001 - any malformed header is the same user error
        raise KernelLoadError(f"malformed kernel header: {e!r}") from None
    if not ok:
        raise KernelLoadError("malformed kernel header (bad name or argument spec)")
    return header


# ----------------------------------------------------------------------------- object files

_ELF_MACHINE = {"x86_64": 62, "i386": 3, "i686": 3, "aarch64": 183, "arm64": 183, "arm": 40, "armv7": 40,
                "riscv64": 243, "ppc64le": 21, "ppc64": 21}


def object_format(triple: str) -> str:
    """'MachO', 'COFF' or 'ELF': what LLVM emits for a triple."""
    parts = triple.lower().split("-")
    if any(p.startswith(("darwin", "macos", "ios", "tvos", "watchos")) for p in parts[1:]) or "apple" in parts:
        return "MachO"
    if any(p.startswith(("windows", "win32", "mingw", "cygwin")) for p in parts[1:]):
        return "COFF"
    return "ELF"


def check_object(obj: bytes, target: Target):
    """Structural check of the object file, so LLVM never sees bytes it would crash on."""
    fmt = object_format(target.triple)
    if fmt == "ELF":
        _check_elf(obj, target)
    elif fmt == "MachO" and obj[:4] not in (b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe"):
        raise KernelLoadError("kernel object code is not a Mach-O object, as its target says")
    elif fmt == "COFF" and len(obj) < 20:
        raise KernelLoadError("kernel object code is too short for a COFF object")


def _check_elf(obj: bytes, target: Target):
    bad = "kernel object code is not a valid ELF relocatable object (corrupt or truncated bytes?)"
    if len(obj) < 52 or obj[:4] != b"\x7fELF" or obj[4] not in (1, 2) or obj[5] not in (1, 2):
        raise KernelLoadError(bad)
    end = "<" if obj[5] == 1 else ">"
    try:
        e_type, e_machine = struct.unpack_from(end + "HH", obj, 16)
        if obj[4] == 2:
            (e_shoff,) = struct.unpack_from(end + "Q", obj, 40)
            e_shentsize, e_shnum, e_shstrndx = struct.unpack_from(end + "3H", obj, 58)
            sh_fmt = end + "IIQQQQIIQQ"
        else:
            (e_shoff,) = struct.unpack_from(end + "I", obj, 32)
            e_shentsize, e_shnum, e_shstrndx = struct.unpack_from(end + "3H", obj, 46)
            sh_fmt = end + "10I"
        if e_type != 1 or e_shentsize != struct.calcsize(sh_fmt) or not 0 < e_shnum or \
                e_shstrndx >= e_shnum or e_shoff + e_shnum * e_shentsize > len(obj):
            raise KernelLoadError(bad)
        for i in range(e_shnum):
            sh = struct.unpack_from(sh_fmt, obj, e_shoff + i * e_shentsize)
            sh_type, offset, size = sh[1], sh[4], sh[5]
            if sh_type not in (0, 8) and offset + size > len(obj):  # NULL and NOBITS have no bytes
                raise KernelLoadError(bad)
    except struct.error:
        raise KernelLoadError(bad) from None
    expected = _ELF_MACHINE.get(target.arch)
    if expected is not None and e_machine != expected:
        raise KernelLoadError(f"kernel object code is for ELF machine {e_machine}, "
                              f"not {target.arch} as its target says")


def check_runnable(target: Target):
    """KernelLoadError unless kernels built for `target` can be loaded and run on this machine:
    same architecture, same object format, every CPU feature the target assumes."""
    host = Target.host()
    if target.arch != host.arch:
        raise KernelLoadError(f"kernel was compiled for {target.triple}, this machine is {host.triple}")
    fmt, host_fmt = object_format(target.triple), object_format(host.triple)
    if fmt != host_fmt:
        raise KernelLoadError(f"kernel was compiled for {target.triple} ({fmt} objects); this machine "
                              f"({host.triple}) loads {host_fmt} objects")
    missing = sorted(target.assumed_features() - enabled_features(host.features))
    if missing:
        raise KernelLoadError(f"kernel needs CPU features this machine lacks: {', '.join(missing)}")


__all__ = ["MAGIC", "FORMAT_VERSION", "encode", "decode", "object_format", "check_object", "check_runnable"]
