"""Cache-line-aligned arrays: the buffers a kernel is timed on.

The same kernel runs measurably slower on a buffer that starts mid cache line: every full-width
vector load then touches two lines. With AVX-512 a vector is a whole 64-byte line, so this is
every load; a 3x3 convolution candidate on rocketlake read 2.48 ms on 64-byte-aligned buffers and
2.93 ms (+18 %) on buffers 16 bytes off, and numpy hands out either (a large array starts 16
bytes into its mmap'd pages, a small one wherever malloc puts it). Two processes timing the same
kernel on arrays of their own therefore disagreed by up to 20 % on a quiet machine. So every
timing runs on 64-byte-aligned buffers (TVM's NDArray aligns to 64 for the same reason), and
`aligned_empty` gives a caller such buffers to run on.
"""

from __future__ import annotations

import numpy as np

ALIGNMENT = 64   # bytes: a cache line, and an AVX-512 vector


def is_aligned(arr: np.ndarray, alignment: int = ALIGNMENT) -> bool:
    return arr.ctypes.data % alignment == 0


def aligned_empty(shape, dtype, alignment: int = ALIGNMENT) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on an `alignment`-byte boundary."""
    dt = np.dtype(dtype)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.empty(nbytes + alignment, np.uint8)
    start = (-raw.ctypes.data) % alignment
    return raw[start:start + nbytes].view(dt).reshape(shape)


def aligned_copy(arr: np.ndarray, alignment: int = ALIGNMENT) -> np.ndarray:
    """`arr` itself when it is C-contiguous and aligned, else an aligned copy of it."""
    if arr.flags.c_contiguous and is_aligned(arr, alignment):
        return arr
    out = aligned_empty(arr.shape, arr.dtype, alignment)
    np.copyto(out, arr)
    return out
