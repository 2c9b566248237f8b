"""A compiled model's run() entered from Python as a native builtin, not through ctypes.

A run of a compiled model is one native call (compiler/call_sequence.py), but getting there
from Python cost 3-5 us: the ctypes call and its argument conversion, each input's
`ndarray.ctypes.data` (0.9 us), the checks of the inputs in Python, the base table written
entry by entry. Beside a batch-1 MLP's 15 us of kernels that was a quarter of the run.

Here the model gets a second entry point: a function compiled with the call sequence whose
signature is CPython's (METH_VARARGS | METH_KEYWORDS for `run(**inputs)`, METH_FASTCALL for
`run_timed(inputs, stamps)`), made into a builtin function (`PyCFunction_NewEx`). It finds each
input in the keywords dict, checks it where numpy keeps it (exact ndarray type, dtype, rank,
every dimension, C-contiguous and aligned), writes the data pointers into the sequence's base
table, runs the sequence (releasing the GIL for a long one) and returns the outputs. Where the
outputs are small, the builtin is the module's `run` itself: its self holds the output arrays,
reused while nobody else refers to them, and it returns them in a new list; anything else (a
view or a subclass for an input, a wrong name, outputs the caller still holds, a failed kernel)
goes to a Python fallback that renews the outputs, names the failed node, or takes the checked
way, which copies an input or refuses it with a clear error. Larger outputs go through one
Python wrapper that takes an output arena (output_arenas.py) and makes one call. An empty
model's `run()` takes about 0.1 us.

It reads numpy's array struct directly (data, nd, dimensions, descr, flags: numpy's public ABI)
and CPython's object header, so it is built only where a probe of this process's CPython and
numpy reads back exactly what numpy reports (`abi()`), never on a free-threaded build; anywhere
else a model runs through ctypes, as before.
"""

from __future__ import annotations

import ctypes
import sys
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from ..codegen_llvm import KERNEL_OK
from ..openmp import before_parallel_call, fork_flag_address

ENTRY_SYMBOL = "tunefarm_model_entry"
METH_FASTCALL = 0x0080
NPY_C_CONTIGUOUS_ALIGNED = 0x0001 | 0x0100   # NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED
NATIVE_BYTE_ORDERS = (ord("="), ord("|"), ord("<" if sys.byteorder == "little" else ">"))


@dataclass(frozen=True)
class Abi:
    """Where CPython and numpy keep what the entry reads (byte offsets), and the addresses of
    the objects it compares with and the C API functions it calls."""

    refcnt: int
    ob_type: int
    var_size: int      # PyVarObject.ob_size: a tuple's length
    list_items: int    # PyListObject.ob_item
    data: int          # PyArrayObject_fields
    nd: int
    dimensions: int
    descr: int
    flags: int
    type_num: int      # in the dtype (PyArray_Descr), an int
    byteorder: int     # in the dtype
    ndarray_type: int
    dict_type: int
    none: int
    false: int
    ellipsis: int
    not_implemented: int
    incref: int        # Py_IncRef: immortal objects included
    dict_size: int     # PyDict_Size
    dict_get: int      # PyDict_GetItem: a borrowed reference or NULL, no exception
    list_slice: int    # PyList_GetSlice
    call_objects: int  # PyObject_CallFunctionObjArgs
    save_thread: int   # PyEval_SaveThread
    restore_thread: int
    memcpy: int


def _address(fn) -> int:
    return int(ctypes.cast(fn, ctypes.c_void_p).value or 0)


@lru_cache(maxsize=None)
def abi() -> Abi | None:
    """This process's layout, checked by reading back objects whose fields Python and numpy
    report; None where anything differs, the interpreter is not CPython, or it runs without a GIL."""
    if sys.implementation.name != "cpython" or sysconfig.get_config_var("Py_GIL_DISABLED"):
        return None
    api = ctypes.pythonapi
    try:
        layout = Abi(refcnt=0, ob_type=8, var_size=16, list_items=24, data=16, nd=24, dimensions=32, descr=56, flags=64,
                     type_num=28, byteorder=26, ndarray_type=id(np.ndarray), dict_type=id(dict), none=id(None),
                     false=id(False), ellipsis=id(Ellipsis), not_implemented=id(NotImplemented),
                     incref=_address(api.Py_IncRef), dict_size=_address(api.PyDict_Size),
                     dict_get=_address(api.PyDict_GetItem), list_slice=_address(api.PyList_GetSlice),
                     call_objects=_address(api.PyObject_CallFunctionObjArgs),
                     save_thread=_address(api.PyEval_SaveThread), restore_thread=_address(api.PyEval_RestoreThread),
                     memcpy=_address(ctypes.CDLL(None).memcpy))
        return layout if _reads_back(layout) else None
    except (AttributeError, OSError, ValueError):
        return None


def _reads_back(layout: Abi) -> bool:
    def word(obj, offset):
        return ctypes.c_void_p.from_address(id(obj) + offset).value or 0

    def int32(obj, offset):
        return ctypes.c_int32.from_address(id(obj) + offset).value

    def byte(obj, offset):
        return ctypes.c_uint8.from_address(id(obj) + offset).value

    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    strided = base[:, ::2]
    for a in (base, strided, np.zeros((), np.int64), np.ones((3, 1, 5), np.int32)):
        dims = (ctypes.c_int64 * max(a.ndim, 1)).from_address(word(a, layout.dimensions)) if a.ndim else ()
        if (word(a, layout.ob_type) != layout.ndarray_type or word(a, layout.data) != a.ctypes.data
                or int32(a, layout.nd) != a.ndim or tuple(dims[:a.ndim]) != a.shape
                or word(a, layout.descr) != id(a.dtype)
                or bool(int32(a, layout.flags) & NPY_C_CONTIGUOUS_ALIGNED == NPY_C_CONTIGUOUS_ALIGNED)
                != (a.flags.c_contiguous and a.flags.aligned)):
            return False
    for dt in (np.dtype(np.float32), np.dtype(np.int64), np.dtype(">f4"), np.dtype(np.bool_)):
        if int32(dt, layout.type_num) != dt.num or chr(byte(dt, layout.byteorder)) != dt.byteorder:
            return False
    # an array held by a list alone has one reference, where the list's items are
    held = [np.empty(3), np.empty(2)]
    items = word(held, layout.list_items)
    first = id(held[0])   # read by address: passing the array on would add a reference
    if (word(held, layout.ob_type) != id(list) or ctypes.c_ssize_t.from_address(first + layout.refcnt).value != 1
            or [ctypes.c_void_p.from_address(items + 8 * i).value for i in range(2)] != [id(a) for a in held]):
        return False
    return (word({}, layout.ob_type) == layout.dict_type
            and [word(t, layout.var_size) for t in ((), (1,), (1, 2, 3))] == [0, 1, 3])


class _MethodDef(ctypes.Structure):
    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p), ("ml_flags", ctypes.c_int),
                ("ml_doc", ctypes.c_char_p)]


_new_cfunction = ctypes.pythonapi.PyCFunction_NewEx
_new_cfunction.restype = ctypes.py_object
_new_cfunction.argtypes = [ctypes.POINTER(_MethodDef), ctypes.py_object, ctypes.py_object]


@dataclass(frozen=True)
class ArrayArg:
    """An input the entry checks, found in the inputs dict under `name`: its dtype and shape,
    and what becomes of its data pointer: written to base-table slot `slot`, or copied to
    `copy_to` (an address), `nbytes` of it."""

    name: str
    dtype: np.dtype
    shape: tuple
    slot: int | None = None
    copy_to: int | None = None
    nbytes: int = 0


@dataclass(frozen=True)
class StorageArg:
    """An argument that holds output storage, made by the caller.

    `held` (a list of arrays, one per output, `slots[i]` the table slot of item i): an item
    with another reference than the list's (the caller kept it) makes the entry return
    Ellipsis, for fresh ones; on success the entry returns a new list of the items. Otherwise
    an array whose data pointer, aligned up to `align` bytes, plus offset, goes to table slot s
    for each (s, offset) of `slots`."""

    slots: tuple
    align: int = 1
    held: bool = False


def _ptr(address: int, typ: str = "i8*") -> str:
    return f"inttoptr (i64 {int(address)} to {typ})"


# why an entry hands a call to its Python fallback (method entries, see entry_ir)
DECLINED, RENEW, FAILED, BAD_ARGUMENTS = 0, 1, 2, 3


def entry_ir(layout: Abi, inputs: list, storage: list, sequence: int, failed: int, record: int, table: int,
             status: int, fork_flag: int, release_gil: bool = True, stamps: int | None = None,
             fallback: int | None = None) -> str:
    """LLVM IR of an entry (see the module docstring), in one of two forms.

    Without `fallback`, METH_FASTCALL: the inputs dict (each ArrayArg by its name), then
    `storage` (StorageArg), then, when `stamps` (the stamp count) is given, an int64 array of
    that length for the timed sequence at `sequence`; it returns a held StorageArg's new list or
    None, else Ellipsis (renew), False (failed: the status is at `status`) or NotImplemented.

    With `fallback` (the address of a Python callable), a method whose `self` is the one held
    storage (a list: the outputs, then anything it keeps alive): `run(**inputs)` as
    METH_VARARGS | METH_KEYWORDS, or with `stamps`, `run_timed(inputs, stamps)` as
    METH_FASTCALL. It returns the outputs' new list, or whatever `fallback(a, b, why)` returns:
    (the positional arguments, the keywords dict or None) or (inputs, stamps), with `why` one of
    DECLINED, RENEW, FAILED, BAD_ARGUMENTS (then a and b are None)."""
    method = fallback is not None
    fallback_object = int(fallback or 0)
    if method and (len(storage) != 1 or not storage[0].held):
        raise ValueError("a method entry's storage is its self: one held StorageArg")
    nargs = (2 if stamps is not None else 0) if method else 1 + len(storage) + (stamps is not None)
    if method and stamps is None:
        L = [f"define i8* @{ENTRY_SYMBOL}(i8* %self, i8* %tuple, i8* %kw) {{", "entry:",
             f"  %tuple.n.p = getelementptr i8, i8* %tuple, i64 {layout.var_size}",
             "  %tuple.n.q = bitcast i8* %tuple.n.p to i64*", "  %tuple.n = load i64, i64* %tuple.n.q",
             "  %tuple.empty = icmp eq i64 %tuple.n, 0", "  %kw.given = icmp ne i8* %kw, null",
             "  %by.name = and i1 %tuple.empty, %kw.given",
             f"  %kw.or.none = select i1 %kw.given, i8* %kw, i8* {_ptr(layout.none)}",
             "  br i1 %by.name, label %dict, label %decline", "dict:", "  %d = bitcast i8* %kw to i8*"]
    else:
        L = [f"define i8* @{ENTRY_SYMBOL}(i8* %self, i8** %args, i64 %nargs) {{", "entry:",
             f"  %nargs.ok = icmp eq i64 %nargs, {nargs}",
             f"  br i1 %nargs.ok, label %dict, label %{'bad' if method else 'decline'}",
             "dict:", "  %d = load i8*, i8** %args"]
        if stamps is not None:   # here, where it dominates every way out
            L.extend([f"  %st.p = getelementptr i8*, i8** %args, i64 {nargs - 1}", "  %st = load i8*, i8** %st.p"])
    L.extend([f"  %d.type.p = getelementptr i8, i8* %d, i64 {layout.ob_type}",
              "  %d.type.q = bitcast i8* %d.type.p to i8**", "  %d.type = load i8*, i8** %d.type.q",
              f"  %d.is = icmp eq i8* %d.type, {_ptr(layout.dict_type)}",
              "  br i1 %d.is, label %dict.size, label %decline", "dict.size:",
              f"  %d.n = call i64 {_ptr(layout.dict_size, 'i64 (i8*)*')}(i8* %d)",
              f"  %d.n.ok = icmp eq i64 %d.n, {len(inputs)}",
              "  br i1 %d.n.ok, label %in0, label %decline"])
    names = [a.name for a in inputs]   # the caller keeps them alive as long as the code (NativeRun._keep)

    def field(v, offset, typ, name):
        L.extend([f"  %{name}.p = getelementptr i8, i8* {v}, i64 {offset}",
                  f"  %{name}.q = bitcast i8* %{name}.p to {typ}*",
                  f"  %{name} = load {typ}, {typ}* %{name}.q"])

    def check_array(k, a, v, label, nxt):
        """Branches to `nxt` with %data.{k} set, or to %decline."""
        field(v, layout.ob_type, "i8*", f"type.{k}")   # exact ndarray: only then are the fields numpy's
        L.extend([f"  %type.{k}.ok = icmp eq i8* %type.{k}, {_ptr(layout.ndarray_type)}",
                  f"  br i1 %type.{k}.ok, label %{label}.fields, label %decline", f"{label}.fields:"])
        field(v, layout.descr, "i8*", f"descr.{k}")
        field(v, layout.nd, "i32", f"nd.{k}")
        field(v, layout.flags, "i32", f"flags.{k}")
        L.extend([f"  %nd.{k}.ok = icmp eq i32 %nd.{k}, {len(a.shape)}",
                  f"  %flags.{k}.m = and i32 %flags.{k}, {NPY_C_CONTIGUOUS_ALIGNED}",
                  f"  %flags.{k}.ok = icmp eq i32 %flags.{k}.m, {NPY_C_CONTIGUOUS_ALIGNED}",
                  f"  %head.{k}.ok = and i1 %nd.{k}.ok, %flags.{k}.ok",
                  f"  br i1 %head.{k}.ok, label %{label}.dtype, label %decline",
                  f"{label}.dtype:",
                  f"  %descr.{k}.same = icmp eq i8* %descr.{k}, {_ptr(id(a.dtype))}",
                  f"  br i1 %descr.{k}.same, label %{label}.dims, label %{label}.dtype2",
                  # an equal dtype in another object (an unpickled array's): same number, native order
                  f"{label}.dtype2:",
                  f"  %num.{k}.p = getelementptr i8, i8* %descr.{k}, i64 {layout.type_num}",
                  f"  %num.{k}.q = bitcast i8* %num.{k}.p to i32*",
                  f"  %num.{k} = load i32, i32* %num.{k}.q",
                  f"  %bo.{k}.p = getelementptr i8, i8* %descr.{k}, i64 {layout.byteorder}",
                  f"  %bo.{k} = load i8, i8* %bo.{k}.p",
                  f"  %num.{k}.ok = icmp eq i32 %num.{k}, {a.dtype.num}"]
                 + [f"  %bo.{k}.ok{i} = icmp eq i8 %bo.{k}, {c}" for i, c in enumerate(NATIVE_BYTE_ORDERS)]
                 + [f"  %bo.{k}.any0 = or i1 %bo.{k}.ok0, %bo.{k}.ok1",
                    f"  %bo.{k}.any = or i1 %bo.{k}.any0, %bo.{k}.ok2",
                    f"  %dtype.{k}.ok = and i1 %num.{k}.ok, %bo.{k}.any",
                    f"  br i1 %dtype.{k}.ok, label %{label}.dims, label %decline",
                    f"{label}.dims:"])
        acc = "true"
        if a.shape:
            field(v, layout.dimensions, "i64*", f"dims.{k}")
            for i, dim in enumerate(a.shape):
                L.extend([f"  %dim.{k}.{i}.p = getelementptr i64, i64* %dims.{k}, i64 {i}",
                          f"  %dim.{k}.{i} = load i64, i64* %dim.{k}.{i}.p",
                          f"  %dim.{k}.{i}.ok = icmp eq i64 %dim.{k}.{i}, {int(dim)}",
                          f"  %dims.{k}.all{i} = and i1 {acc}, %dim.{k}.{i}.ok"])
                acc = f"%dims.{k}.all{i}"
        L.append(f"  br i1 {acc}, label %{label}.data, label %decline")
        L.append(f"{label}.data:")
        field(v, layout.data, "i8*", f"data.{k}")
        L.append(f"  br label %{nxt}")

    for k, a in enumerate(inputs):
        L.extend([f"in{k}:", f"  %a{k} = call i8* {_ptr(layout.dict_get, 'i8* (i8*, i8*)*')}(i8* %d, "
                  f"i8* {_ptr(id(names[k]))})", f"  %a{k}.found = icmp ne i8* %a{k}, null",
                  f"  br i1 %a{k}.found, label %in{k}.check, label %decline", f"in{k}.check:"])
        check_array(k, a, f"%a{k}", f"in{k}", f"in{k + 1}")
    L.append(f"in{len(inputs)}:")
    L.append("  br label %store0")
    held = None
    for j, s in enumerate(storage):
        k = 1 + j
        L.append(f"store{j}:")
        if method:
            L.append(f"  %s{j} = bitcast i8* %self to i8*")
        else:
            L.extend([f"  %s{j}.p = getelementptr i8*, i8** %args, i64 {k}", f"  %s{j} = load i8*, i8** %s{j}.p"])
        if s.held:
            held = (f"%s{j}", len(s.slots))
            field(f"%s{j}", layout.list_items, "i8**", f"items.{j}")
            for i in range(len(s.slots)):
                L.extend([f"  %item.{j}.{i}.p = getelementptr i8*, i8** %items.{j}, i64 {i}",
                          f"  %item.{j}.{i} = load i8*, i8** %item.{j}.{i}.p"])
                field(f"%item.{j}.{i}", layout.refcnt, "i64", f"refs.{j}.{i}")
                field(f"%item.{j}.{i}", layout.data, "i8*", f"out.{j}.{i}")
                L.extend([f"  %free.{j}.{i} = icmp eq i64 %refs.{j}.{i}, 1",
                          f"  br i1 %free.{j}.{i}, label %store{j}.{i + 1}, label %renew",
                          f"store{j}.{i + 1}:"])
        else:
            field(f"%s{j}", layout.data, "i8*", f"raw.{j}")
        L.append(f"  br label %store{j + 1}")
    L.append(f"store{len(storage)}:")
    if stamps is not None:
        check_array("st", ArrayArg("", np.dtype(np.int64), (stamps,)), "%st", "stamps", "go")
    else:
        L.append("  br label %go")
    # a forked child runs the Python path, which limits libgomp to this thread (compiler/openmp.py)
    L.extend(["go:", f"  %forked = load volatile i32, i32* {_ptr(fork_flag, 'i32*')}",
              "  %unforked = icmp eq i32 %forked, 0", "  br i1 %unforked, label %run, label %decline", "run:"])
    memcpy_t = "i8* (i8*, i8*, i64)*"
    for k, a in enumerate(inputs):
        if a.slot is not None:
            L.append(f"  store i8* %data.{k}, i8** {_ptr(table + 8 * a.slot, 'i8**')}")
        elif a.nbytes:
            L.append(f"  call i8* {_ptr(layout.memcpy, memcpy_t)}(i8* {_ptr(a.copy_to)}, i8* %data.{k}, i64 {a.nbytes})")
    for j, s in enumerate(storage):
        if s.held:
            for i, (slot, offset) in enumerate(s.slots):
                L.extend([f"  %o.{j}.{i} = getelementptr i8, i8* %out.{j}.{i}, i64 {-int(offset)}",
                          f"  store i8* %o.{j}.{i}, i8** {_ptr(table + 8 * slot, 'i8**')}"])
            continue
        base = f"%raw.{j}"
        if s.align > 1:
            L.extend([f"  %base.{j}.i = ptrtoint i8* %raw.{j} to i64", f"  %base.{j}.n = sub i64 0, %base.{j}.i",
                      f"  %base.{j}.pad = and i64 %base.{j}.n, {s.align - 1}",
                      f"  %base.{j} = getelementptr i8, i8* %raw.{j}, i64 %base.{j}.pad"])
            base = f"%base.{j}"
        for i, (slot, offset) in enumerate(s.slots):
            L.extend([f"  %o.{j}.{i} = getelementptr i8, i8* {base}, i64 {int(offset)}",
                      f"  store i8* %o.{j}.{i}, i8** {_ptr(table + 8 * slot, 'i8**')}"])
    seq_args = [f"i32* {_ptr(failed, 'i32*')}", f"i8* {_ptr(record)}", f"i8** {_ptr(table, 'i8**')}"]
    seq_t = "i32 (i32*, i8*, i8**)*"
    if stamps is not None:
        seq_args.append("i64* %stamps.ptr")
        seq_t = "i32 (i32*, i8*, i8**, i64*)*"
        L.append("  %stamps.ptr = bitcast i8* %data.st to i64*")
    if release_gil:
        L.append(f"  %gil = call i8* {_ptr(layout.save_thread, 'i8* ()*')}()")
    L.append(f"  %status = call i32 {_ptr(sequence, seq_t)}({', '.join(seq_args)})")
    if release_gil:
        L.append(f"  call void {_ptr(layout.restore_thread, 'void (i8*)*')}(i8* %gil)")
    incref = _ptr(layout.incref, "void (i8*)*")
    L.extend([f"  store i32 %status, i32* {_ptr(status, 'i32*')}",
              f"  %ok = icmp eq i32 %status, {KERNEL_OK}",
              "  br i1 %ok, label %done, label %failed", "done:"])
    if held is not None:   # the outputs, in a new list
        L.extend([f"  %result = call i8* {_ptr(layout.list_slice, 'i8* (i8*, i64, i64)*')}(i8* {held[0]}, i64 0, "
                  f"i64 {held[1]})", "  ret i8* %result"])
    else:
        L.extend([f"  call void {incref}(i8* {_ptr(layout.none)})", f"  ret i8* {_ptr(layout.none)}"])
    if method:
        call = _ptr(layout.call_objects, "i8* (i8*, ...)*")
        if stamps is None:
            a, b = "%tuple", "%kw.or.none"
            L.append("leave:")
        else:
            a, b = "%d", "%st"
            L.append("leave:")
        L.extend([f"  %why = phi i8* [{_ptr(id(DECLINED))}, %decline], [{_ptr(id(RENEW))}, %renew], "
                  f"[{_ptr(id(FAILED))}, %failed]",
                  f"  %handed = call i8* (i8*, ...) {call}(i8* {_ptr(fallback_object)}, i8* {a}, i8* {b}, i8* %why, i8* null)",
                  "  ret i8* %handed",
                  "renew:", "  br label %leave", "failed:", "  br label %leave", "decline:", "  br label %leave"])
        if stamps is not None:
            L.extend(["bad:", f"  %bad.handed = call i8* (i8*, ...) {call}(i8* {_ptr(fallback_object)}, i8* {_ptr(layout.none)}, "
                      f"i8* {_ptr(layout.none)}, i8* {_ptr(id(BAD_ARGUMENTS))}, i8* null)", "  ret i8* %bad.handed"])
        L.append("}")
    else:
        L.extend(["failed:", f"  call void {incref}(i8* {_ptr(layout.false)})", f"  ret i8* {_ptr(layout.false)}",
                  "renew:", f"  call void {incref}(i8* {_ptr(layout.ellipsis)})", f"  ret i8* {_ptr(layout.ellipsis)}",
                  "decline:", f"  call void {incref}(i8* {_ptr(layout.not_implemented)})",
                  f"  ret i8* {_ptr(layout.not_implemented)}", "}"])
    return "\n".join(L) + "\n"


METH_VARARGS_KEYWORDS = 0x0001 | 0x0002


class NativeEntry:
    """One compiled entry: its code (the engine that holds it, the method definition naming it,
    the status cell it stores into: `code`, which whatever calls it must keep alive) and, once
    bound to a self object, the Python builtin (`function`)."""

    def __init__(self, make_ir, name: str, flags: int = METH_FASTCALL):
        """`make_ir(status_address)`: the entry's IR, storing its status at that address."""
        from ..call_sequence import CallSequence  # its compile step, shared
        self.status = ctypes.c_int32(KERNEL_OK)
        engine, _ = CallSequence._compile(make_ir(ctypes.addressof(self.status)), ENTRY_SYMBOL)
        name_bytes = name.encode()
        method = _MethodDef(name_bytes, engine.get_function_address(ENTRY_SYMBOL), flags, None)
        self.code = (engine, method, name_bytes, self.status)
        self.function: Any = None

    def bind(self, self_object) -> None:
        """The builtin, its self `self_object`, which must keep `code` alive (the builtin refers
        to its self only)."""
        self.function = _new_cfunction(ctypes.byref(self.code[1]), self_object, None)


class RunState(list):
    """A method entry's self: the outputs the next run writes, then what its code needs alive
    (a list, for the entry reads its items where CPython keeps a list's)."""


class NativeRun:
    """A model's native entries, in one of two forms (by its outputs, OutputStorage):

    - `methods`: `run` and `run_timed` are builtins to install as the module's own: they take
      what GraphModule.run and run_timed take and return the outputs, handing anything else to
      `fallback_run(args, kwargs, why)` / `fallback_timed(inputs, stamps, why)` (Python:
      renew the outputs, name a failed kernel, or take the checked way; they must not hold the
      module or this object, but reach them through a weak reference).
    - otherwise `entry(inputs, raw)` and `timed_entry(inputs, raw, stamps)` return None when
      done, else False (failed: `status`/`timed_status`) or NotImplemented; `outputs.take()` gives
      the output views and the raw arena for them."""

    def __init__(self, module, sequence, table_address: int, layout: Abi, fallback_run, fallback_timed):
        if sequence._parallel:
            before_parallel_call()   # this process owns libgomp's pool from here (the fork rule)
        inputs = []
        for name, slot, own in module._input_plan:
            dtype, shape = module._expected[name]
            inputs.append(ArrayArg(name, dtype, shape, slot=slot) if slot is not None else
                          ArrayArg(name, dtype, shape, copy_to=own.ctypes.data, nbytes=own.nbytes))
        self.outputs = OutputStorage(module)
        self.methods = self.outputs.held is not None
        # what the code names by address, kept alive here; never the module itself, which holds
        # the entries (module -> run -> NativeRun -> module would free a model's buffers only
        # when the cycle collector next ran, not when its last user drops it)
        # (the names and dtypes too: the code compares with their addresses)
        self._keep = (sequence, module._blocks, module._consts, module._table,
                      tuple((a.name, a.dtype) for a in inputs))
        self._fallbacks = (fallback_run, fallback_timed)   # their addresses are in the code
        common = dict(layout=layout, inputs=inputs, storage=[self.outputs.arg], failed=sequence.failed_address,
                      record=sequence.record_address, table=table_address, fork_flag=fork_flag_address(),
                      release_gil=releases_gil(module))
        built = []
        for timed, fallback in ((False, fallback_run), (True, fallback_timed)):
            def make_ir(status, timed=timed, fallback=fallback):
                return entry_ir(sequence=sequence.native_function(timed), status=status,
                                stamps=len(sequence) + 1 if timed else None,
                                fallback=id(fallback) if self.methods else None, **common)
            flags = METH_VARARGS_KEYWORDS if self.methods and not timed else METH_FASTCALL
            built.append(NativeEntry(make_ir, "run_timed" if timed else "run", flags))
        # what the builtins' code needs alive, held by the builtins' self; none of it refers to
        # a builtin or to this object, so a dropped model is freed at once, without a cycle
        anchor = (self._keep, self._fallbacks, tuple(e.code for e in built))
        if self.outputs.held is not None:
            self.outputs.held.append(anchor)   # the self of both: the outputs, then the anchor
        for e in built:
            e.bind(self.outputs.held if self.methods else anchor)
        self._entries = built
        self.status, self.timed_status = built[0].status, built[1].status
        if self.methods:
            self.run, self.run_timed = built[0].function, built[1].function
        else:
            self.entry, self.timed_entry = built[0].function, built[1].function


def native_run(module, sequence, table_address: int, fallback_run, fallback_timed) -> NativeRun | None:
    """The NativeRun of `module` (a GraphModule whose `sequence` runs on the base table at
    `table_address`), or None where this process has no usable ABI or the model returns an
    output the entry cannot place (a constant, an output in a block that does not move, two
    outputs sharing storage)."""
    layout = abi()
    if layout is None or any(r[0] != "arena" for r in module._returns):
        return None
    return NativeRun(module, sequence, table_address, layout, fallback_run, fallback_timed)


# A run whose work would take longer than this at the speeds below releases the GIL for its
# kernels; a shorter one keeps it: CPython itself lets a thread hold the GIL for its 5 ms switch
# interval, and releasing and taking it back cost a batch-1 MLP 0.5 % of its run.
HOLD_GIL_SECONDS = 1e-3


def releases_gil(module) -> bool:
    """Whether a run of `module` releases the GIL: its anchors' FLOPs at 100 GFLOPS plus its
    kernels' argument bytes at 50 GB/s above HOLD_GIL_SECONDS (bytes counted as if read from
    memory each time, an estimate above the run's time on any host here)."""
    from .profile import anchor_flops, argument_bytes
    flops = sum(anchor_flops(s.group.opdef) or 0 for s in module.steps)
    nbytes = sum(argument_bytes(s.group.opdef) for s in module.steps)
    return flops / 100e9 + nbytes / 50e9 > HOLD_GIL_SECONDS


SMALL_OUTPUT_BYTES = 1 << 16


class OutputStorage:
    """Where a run's outputs go, and the entry's storage argument for them.

    Each output alone in its block, the block no larger than the output, and all of them
    small: `held`, a list of one array per output that the entry fills and returns in a new
    list; an array the caller still holds is replaced (`renew()`) before the next run. Else views
    of an arena of the module's (output_arenas.py): `take()` returns (the outputs, the arena's
    raw buffer, the storage argument)."""

    def __init__(self, module):
        plan = module.plan
        slot_of = {b: j for j, b in enumerate(module._movable_blocks)}
        blocks = [plan.block_of[v] for v in module.output_names]
        self.held = None
        if (len(set(blocks)) == len(blocks)
                and all(plan.offset_of.get(v, 0) == 0 and plan.block_bytes[b] <= module._output_views[v].nbytes
                        for v, b in zip(module.output_names, blocks))
                and sum(plan.block_bytes[b] for b in blocks) <= SMALL_OUTPUT_BYTES):
            self._specs = [(tuple(r[3]), np.dtype(r[2])) for r in module._returns]
            self.held = RunState(np.empty(s, d) for s, d in self._specs)
            self.arg = StorageArg(tuple((slot_of[b], 0) for b in blocks), held=True)
            return
        from ..buffers import ALIGNMENT
        self._arenas = module._arenas
        self._views = [(tuple(r[3]), np.dtype(r[2]), r[1]) for r in module._returns]
        self.arg = StorageArg(tuple(module._output_slots), align=ALIGNMENT)

    def renew(self) -> None:
        """Fresh arrays at the head of `held`: the caller keeps the ones it was given."""
        assert self.held is not None
        self.held[:len(self._specs)] = [np.empty(s, d) for s, d in self._specs]

    def take(self) -> tuple:
        raw, start, _ = self._arenas.take()
        return [np.ndarray(s, d, raw, start + at) for s, d, at in self._views], raw


__all__ = ["abi", "entry_ir", "native_run", "releases_gil", "NativeRun", "NativeEntry", "OutputStorage", "ArrayArg",
           "StorageArg", "DECLINED", "RENEW", "FAILED", "BAD_ARGUMENTS"]
