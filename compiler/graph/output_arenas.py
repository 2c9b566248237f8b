"""Storage for a model's outputs, recycled once the caller has dropped them.

A run hands its outputs to the caller (compiler/graph/runtime.py), so each run needs storage
that no earlier output still uses. Fresh storage per run costs the allocator's mmap and munmap
and a page fault on every page the kernels first write: a decode step's 17 outputs of 128 KB
each took 0.1-0.4 ms a step that way, 2-3 % of the step. Here the outputs of a run live in one
arena, and an arena is taken again as soon as no array refers to it: every output is a numpy
view whose base is the arena's raw buffer, so the buffer's reference count says whether any
output (or any view the caller made of one) is still alive. A caller that keeps the last step's
outputs while it runs the next (a KV cache fed back) gets the second arena; at most `keep`
arenas are held, beyond them a new one is allocated and left to the caller.
"""

from __future__ import annotations

import sys

import numpy as np

from ..buffers import ALIGNMENT


class OutputArenas:
    """Arenas of `nbytes` bytes (from an ALIGNMENT boundary) for a run's outputs."""

    def __init__(self, nbytes: int, keep: int = 2):
        self.nbytes = max(int(nbytes), 1)
        self.keep = keep
        self._arenas: list = []   # (raw buffer, offset of its aligned start, that start's address)

    @staticmethod
    def layout(sizes: list) -> tuple:
        """({index: byte offset}, total bytes) of blocks of `sizes` packed on ALIGNMENT boundaries."""
        offsets, at = {}, 0
        for i, n in enumerate(sizes):
            offsets[i] = at
            at += -(-max(int(n), 1) // ALIGNMENT) * ALIGNMENT
        return offsets, at

    def take(self) -> tuple:
        """(raw uint8 buffer, offset of the arena's aligned start in it, that start's address) of an
        arena no array still refers to. Outputs are made on the raw buffer itself
        (np.ndarray(shape, dtype, raw, offset)), so each output, and every view of one, holds a
        reference to it: with none left, only the list's entry refers to it."""
        for entry in self._arenas:
            if sys.getrefcount(entry[0]) == 2:   # the entry's reference and getrefcount's argument
                return entry
        raw = np.empty(self.nbytes + ALIGNMENT, np.uint8)
        address = raw.ctypes.data
        start = (-address) % ALIGNMENT
        entry = (raw, start, address + start)
        if len(self._arenas) < self.keep:
            self._arenas.append(entry)
        return entry
