"""The square matmul that bench/compiler_matmul.py and bench/tune_matmul.py time: its inputs (random,
non-zero, the output poisoned with NaN) and the check against a float64 numpy product that comes
before any timing, so neither benchmark reports the speed of a wrong kernel."""

from __future__ import annotations

import numpy as np

MAX_REL_ERROR = 1e-5


def checked_square_matmul(kernel, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(a, b, c, relative error) after one call `kernel(a, b, c)` on n x n inputs; exits naming the
    error when the result is wrong (beyond MAX_REL_ERROR in the Frobenius norm)."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.1, 1.0, (n, n)).astype(np.float32)
    b = rng.uniform(0.1, 1.0, (n, n)).astype(np.float32)
    c = np.full((n, n), np.nan, np.float32)
    kernel(a, b, c)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    rel_err = float(np.linalg.norm(c - ref) / np.linalg.norm(ref))
    if not rel_err < MAX_REL_ERROR:
        raise SystemExit(f"the kernel's {n}x{n} product is wrong: relative error {rel_err:.3g} "
                         f"(allowed {MAX_REL_ERROR:g})")
    return a, b, c, rel_err
