"""Is a kernel's output right? One checker for everything that runs kernels.

The measuring worker (locally and on every device agent), `tunefarm ops` and `tunefarm tune`
all judge outputs with these functions, so a kernel passes or fails the same way everywhere.
Outputs are first filled with a poison value a correct kernel overwrites (two variants, so an
element a kernel never writes cannot match the reference by chance); floats are compared with
atol + rtol × max|reference| (kernels reorder sums, and an element near zero has no meaningful
relative error), NaN and ±inf exactly; integers and bools exactly.
"""

from __future__ import annotations

import numpy as np

DEFAULT_RTOL = {"float32": 1e-4, "float64": 1e-10}


def poisoned(shape, dtype, variant: int = 0) -> np.ndarray:
    """An output buffer filled with a value a correct kernel overwrites: NaN or a sentinel.

    Two variants, so an element a kernel never writes cannot match the reference by chance
    (the reference cannot equal both sentinels at one position).
    """
    dt = np.dtype(dtype)
    shape = tuple(shape)
    if dt.kind == "f":
        return np.full(shape, np.nan if variant == 0 else -1.2345678e-7, dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return np.full(shape, info.min + 3 if variant == 0 else info.max - 5, dt)
    arr = np.empty(shape, dt)  # bool: bytes that are neither 0 nor 1 (compared as raw bytes)
    arr.view(np.uint8).fill(0xAB if variant == 0 else 0x5C)
    return arr


def as_comparable(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint8) if a.dtype.kind == "b" else a


def same_as_poison(ref: np.ndarray, dtype, variant: int) -> bool:
    """Does the reference hold the poison value somewhere (so an unwritten element could pass)?"""
    p = as_comparable(poisoned((1,), dtype, variant)).reshape(-1)
    r = as_comparable(ref)
    if r.dtype.kind == "f" and np.isnan(p[0]):
        return bool(np.isnan(r).any())
    return bool((r == p[0]).any())


def compare_output(name: str, got: np.ndarray, ref: np.ndarray, rtol: float, atol: float) -> str:
    """'' when `got` matches `ref`, otherwise a message saying where and by how much it differs.

    Integers and bools must match exactly. Floats may differ by atol + rtol * max|ref| (the
    largest finite reference magnitude of this output: kernels reorder sums, and an element near
    zero has no meaningful relative error); NaN and ±inf must match exactly.
    """
    g, r = as_comparable(got), as_comparable(ref)
    if g.dtype.kind != "f":
        bad = g != r
        if not bad.any():
            return ""
        idx = np.unravel_index(int(np.argmax(bad)), bad.shape)
        return (f"output {name}: {int(bad.sum())} of {bad.size} elements differ (exact match required "
                f"for {ref.dtype}); first at {tuple(int(i) for i in idx)}: expected {r[idx].item()!r}, "
                f"got {g[idx].item()!r}")
    g64, r64 = g.astype(np.float64), r.astype(np.float64)
    same = (g64 == r64) | (np.isnan(g64) & np.isnan(r64))
    finite = np.isfinite(r64)
    scale = float(np.max(np.abs(r64[finite]))) if finite.any() else 0.0
    tol = atol + rtol * scale
    with np.errstate(invalid="ignore"):
        diff = np.abs(g64 - r64)
    diff[same] = 0.0
    bad = ~same & ~(diff <= tol)  # NaN / inf differences are never within tolerance
    if not bad.any():
        return ""
    worst = np.where(bad, np.nan_to_num(diff, nan=np.inf), -1.0)
    idx = np.unravel_index(int(np.argmax(worst)), bad.shape)
    return (f"output {name}: {int(bad.sum())} of {bad.size} elements differ beyond tolerance "
            f"{tol:.3g} (atol {atol:g} + rtol {rtol:g} × max|ref| {scale:.3g}); worst at "
            f"{tuple(int(i) for i in idx)}: expected {float(r64[idx]):.7g}, got {float(g64[idx]):.7g}")


def check_output(got: np.ndarray, ref: np.ndarray, dtype: str, rtol: float | None = None,
                 atol: float | None = None, name: str = "output") -> str:
    """`compare_output` with the dtype's default tolerance (atol = rtol by default: outputs much
    smaller than 1 are held to an absolute error); also refuses a shape mismatch."""
    ref = np.asarray(ref)
    rtol = DEFAULT_RTOL.get(dtype, 1e-4) if rtol is None else rtol
    atol = rtol if atol is None else atol
    if got.shape != ref.shape:
        return f"{name}: shape {got.shape}, expected {ref.shape}"
    if got.dtype.kind in "iub":  # a reference computed wider compares in the kernel's own dtype
        ref = ref.astype(got.dtype, copy=False)
    return compare_output(name, got, ref, rtol, atol)


__all__ = ["poisoned", "same_as_poison", "compare_output", "check_output", "as_comparable", "DEFAULT_RTOL"]
