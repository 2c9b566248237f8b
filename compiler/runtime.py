"""Build, load, call and time native kernels; serialize them to cross processes and machines.

A built kernel is an object file plus its argument spec and target string. In the process that
built it, or any process that receives its bytes (`Kernel.to_bytes` / `load_kernel`), the object
is loaded with LLVM's MCJIT and called through ctypes after every argument is checked, so a
shape or dtype mismatch raises ArgumentError instead of corrupting memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import struct
import time
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .codegen_llvm import generate
from .errors import ArgumentError, KernelLoadError
from .lower import lower
from .schedule import Schedule
from .target import Target, _CPU_IMPLIED, _llvm, resolve_target

MAGIC = b"TFK1"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class ArgSpec:
    name: str
    shape: tuple
    dtype: str

    def to_json(self):
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


@lru_cache(maxsize=None)
def _runtime_libraries():
    """Make libgomp (parallel loops) visible to the JIT linker; return its ctypes handle."""
    llvm = _llvm()
    name = ctypes.util.find_library("gomp") or "libgomp.so.1"
    try:
        llvm.load_library_permanently(name)
        return ctypes.CDLL(name)
    except (RuntimeError, OSError) as e:
        raise KernelLoadError(f"cannot load the OpenMP runtime libgomp ({name}): {e}") from None


def set_num_threads(n: int) -> None:
    """Threads used by parallel loops of kernels called from this thread."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"number of threads must be a positive integer, got {n!r}")
    _runtime_libraries().omp_set_num_threads(n)


def get_max_threads() -> int:
    return _runtime_libraries().omp_get_max_threads()


def compile_module(module, target: Target, opt_level: int = 3) -> bytes:
    """LLVM IR module → optimized native object file bytes for `target`."""
    llvm = _llvm()
    mod = llvm.parse_assembly(str(module))
    mod.triple = target.triple
    tm = target.target_machine()
    mod.data_layout = str(tm.target_data)
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=opt_level)
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return tm.emit_object(mod)


class Kernel:
    """A compiled kernel: call it with numpy arrays in the order of `args`."""

    def __init__(self, name: str, object_code: bytes, args: list, target: Target, source: str = ""):
        self.name = name
        self.object_code = object_code
        self.args = [a if isinstance(a, ArgSpec) else ArgSpec(a["name"], tuple(a["shape"]), a["dtype"]) for a in args]
        self.target = target
        self.source = source  # the lowered loop IR, for people
        self._fn = None
        self._engine = None

    # ------------------------------------------------------------------ loading
    def _load(self):
        if self._fn is not None:
            return self._fn
        _check_runnable(self.target)
        _check_object(self.object_code, self.target)
        _runtime_libraries()
        llvm = _llvm()
        try:
            empty = llvm.parse_assembly("")
            empty.triple = self.target.triple
            engine = llvm.create_mcjit_compiler(empty, Target.host().new_target_machine())
            engine.add_object_file(llvm.ObjectFileRef.from_data(self.object_code))
            engine.finalize_object()
            addr = engine.get_function_address(self.name)
        except RuntimeError as e:
            raise KernelLoadError(f"cannot load kernel {self.name}: {e}") from None
        if not addr:
            raise KernelLoadError(f"kernel object has no function named {self.name!r}")
        self._engine = engine
        self._fn = ctypes.CFUNCTYPE(ctypes.c_int32, *([ctypes.c_void_p] * len(self.args)))(addr)
        return self._fn

    # ------------------------------------------------------------------ calling
    def check_args(self, arrays) -> list:
        if len(arrays) != len(self.args):
            raise ArgumentError(f"kernel {self.name} takes {len(self.args)} arrays "
                                f"({', '.join(a.name for a in self.args)}), got {len(arrays)}")
        ptrs = []
        for spec, arr in zip(self.args, arrays):
            if not isinstance(arr, np.ndarray):
                raise ArgumentError(f"argument {spec.name} must be a numpy array, got {type(arr).__name__}")
            if arr.dtype != np.dtype(spec.dtype):
                raise ArgumentError(f"argument {spec.name}: expected dtype {spec.dtype}, got {arr.dtype}")
            if tuple(arr.shape) != tuple(spec.shape):
                raise ArgumentError(f"argument {spec.name}: expected shape {tuple(spec.shape)}, got {tuple(arr.shape)}")
            if not arr.flags.c_contiguous:
                raise ArgumentError(f"argument {spec.name} must be C-contiguous (use np.ascontiguousarray)")
            if not arr.flags.writeable:
                raise ArgumentError(f"argument {spec.name} is read-only")
            ptrs.append(arr.ctypes.data)
        return ptrs

    def __call__(self, *arrays):
        ptrs = self.check_args(arrays)
        self._load()(*ptrs)

    def time_evaluator(self, number: int = 1, repeat: int = 3, min_repeat_ms: float = 0.0,
                       cooldown_ms: float = 0.0):
        """A function timing the kernel: `repeat` measurements, each the mean of `number` calls.

        `number` grows until one measurement takes at least `min_repeat_ms`. One warm-up call
        runs first. Returns TimingResult with per-repeat seconds.
        """
        if number < 1 or repeat < 1:
            raise ValueError("number and repeat must be at least 1")

        def evaluator(*arrays):
            ptrs = self.check_args(arrays)
            fn = self._load()
            fn(*ptrs)
            n = number
            results = []
            for _ in range(repeat):
                while True:
                    t0 = time.perf_counter()
                    for _ in range(n):
                        fn(*ptrs)
                    dt = time.perf_counter() - t0
                    if dt * 1000.0 >= min_repeat_ms or min_repeat_ms <= 0:
                        break
                    n = max(n * 2, int(n * min_repeat_ms / max(dt * 1000.0, 1e-3) * 1.2))
                results.append(dt / n)
                if cooldown_ms > 0:
                    time.sleep(cooldown_ms / 1000.0)
            return TimingResult(results)
        return evaluator

    # ------------------------------------------------------------------ serialization
    def to_bytes(self) -> bytes:
        header = json.dumps({"version": FORMAT_VERSION, "name": self.name, "target": str(self.target),
                             "args": [a.to_json() for a in self.args], "source": self.source,
                             "sha256": hashlib.sha256(self.object_code).hexdigest()}).encode()
        return MAGIC + struct.pack("<I", len(header)) + header + self.object_code

    def __repr__(self):
        sig = ", ".join(f"{a.name}: {a.dtype}{list(a.shape)}" for a in self.args)
        return f"Kernel({self.name}({sig}) for {self.target.cpu})"


@dataclass
class TimingResult:
    results: list

    @property
    def mean(self) -> float:
        return float(np.mean(self.results))

    @property
    def median(self) -> float:
        return float(np.median(self.results))

    @property
    def min(self) -> float:
        return float(np.min(self.results))


def load_kernel(data: bytes) -> Kernel:
    """Inverse of Kernel.to_bytes; raises KernelLoadError on anything malformed."""
    if not isinstance(data, (bytes, bytearray)) or len(data) < 8 or data[:4] != MAGIC:
        raise KernelLoadError("not a tunefarm kernel (bad magic bytes)")
    (n,) = struct.unpack("<I", data[4:8])
    try:
        header = json.loads(data[8:8 + n].decode())
        if header["version"] != FORMAT_VERSION:
            raise KernelLoadError(f"kernel format version {header['version']} is not supported "
                                  f"(this runtime reads version {FORMAT_VERSION})")
        target = Target.from_string(header["target"])
        args = [ArgSpec(a["name"], tuple(a["shape"]), a["dtype"]) for a in header["args"]]
        name = header["name"]
    except KernelLoadError:
        raise
    except Exception as e:  # noqa: BLE001 - any malformed header is the same user error
        raise KernelLoadError(f"malformed kernel header: {e}") from None
    obj = bytes(data[8 + n:])
    if not obj:
        raise KernelLoadError("kernel has no object code")
    digest = header.get("sha256")
    if digest is not None and hashlib.sha256(obj).hexdigest() != digest:
        raise KernelLoadError("kernel object code is corrupt (checksum mismatch; truncated or altered bytes)")
    _check_object(obj, target)
    return Kernel(name, obj, args, target, header.get("source", ""))


_ELF_MACHINE = {"x86_64": 62, "i386": 3, "i686": 3, "aarch64": 183, "arm64": 183, "arm": 40, "armv7": 40,
                "riscv64": 243, "ppc64le": 21, "ppc64": 21}


def _check_object(obj: bytes, target: Target):
    """Structural check of an ELF object before MCJIT sees it: LLVM aborts or crashes the whole
    process on a corrupt or truncated object instead of reporting an error."""
    if any(os_name in target.triple for os_name in ("darwin", "apple", "macos", "ios", "windows", "win32")):
        return  # only ELF objects are checked
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


def _check_runnable(target: Target):
    host = Target.host()
    if target.arch != host.arch:
        raise KernelLoadError(f"kernel was compiled for {target.triple}, this machine is {host.triple}")
    host_feats = {f[1:] for f in host.features.split(",") if f.startswith("+")}
    need = {f[1:] for f in target.features.split(",") if f.startswith("+")}
    need |= set(_CPU_IMPLIED.get(target.cpu, ()))
    missing = sorted(need - host_feats)
    if missing:
        raise KernelLoadError(f"kernel needs CPU features this machine lacks: {', '.join(missing)}")


def build(schedule: Schedule, args, target=None, name: str = "main") -> Kernel:
    """Lower, generate LLVM IR, compile to an object for `target` (host by default) and wrap it."""
    target = resolve_target(target)
    if not name.isidentifier():
        raise ArgumentError(f"kernel name must be a C identifier, got {name!r}")
    func = lower(schedule, args, name)
    obj = compile_module(generate(func, target), target)
    specs = [ArgSpec(b.name, b.shape, b.dtype) for b in func.args]
    return Kernel(name, obj, specs, target, str(func))
