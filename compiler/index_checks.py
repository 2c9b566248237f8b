"""Run-time index checks: what a kernel reports when a data-dependent index leaves its range.

An index read from data (a gather's row, an embedding id) is an `expr.CheckedIndex`. Code
generation turns each into a compare and a branch to the kernel's error exit, which records the
check and the offending value in the caller's *error record* and returns
KERNEL_INDEX_OUT_OF_RANGE. The record is the kernel's last argument, two int64 words:

    record[0]   0, or 1 + the number of the check that fired (its position in `Kernel.checks`)
    record[1]   the offending index value

A kernel with checks clears record[0] on entry; the first check to fire writes both words (an
atomic compare-and-swap on record[0], so of several threads that fail at once exactly one
reports, and none is lost: the status word is or-ed too). A NULL record is allowed (the C API's
callers may not want the details); the status code still says what happened. The record is a
per-call argument, not a global, so concurrent calls of one kernel each get their own answer.

`collect_checks` numbers the checks of a lowered function in the order code generation meets
them; the kernel carries the list (its site text and range) in its header, so the runtime can
say which read failed, with which value, against which range.
"""

from __future__ import annotations

from dataclasses import dataclass

from .expr import CheckedIndex, walk
from .loop_ir import IfThenElse, LetStmt, LoweredFunc, Store, walk_stmts

RECORD_WORDS = 2


@dataclass(frozen=True)
class IndexCheck:
    """One run-time index check of a kernel: where (`site`) and the valid range [lo, hi)."""

    site: str
    lo: int
    hi: int

    def to_json(self) -> dict:
        return {"site": self.site, "lo": self.lo, "hi": self.hi}

    @staticmethod
    def from_json(d: dict) -> "IndexCheck":
        return IndexCheck(str(d["site"]), int(d["lo"]), int(d["hi"]))

    @staticmethod
    def of(e: CheckedIndex) -> "IndexCheck":
        return IndexCheck(e.site, e.lo, e.hi)

    def message(self, value: int) -> str:
        """The failure in words: the site, the value and the valid range."""
        return f"{self.site}: index {value} is out of range [{self.lo}, {self.hi})"


def collect_checks(func: LoweredFunc) -> list:
    """The distinct IndexChecks of `func`, in statement order (the numbering its kernel reports)."""
    seen: dict = {}
    for st in walk_stmts(func.body):
        for e in _exprs(st):
            for n in walk(e):
                if isinstance(n, CheckedIndex):
                    seen.setdefault(IndexCheck.of(n), None)
    return list(seen)


def _exprs(st) -> list:
    if isinstance(st, Store):
        return [st.index, st.value]
    if isinstance(st, IfThenElse):
        return [st.cond]
    if isinstance(st, LetStmt):
        return [st.value]
    return []


def failed_check(checks: list, record) -> tuple:
    """(the IndexCheck that fired, the offending value) read from an error record (a sequence of
    RECORD_WORDS ints); (None, None) when the record names no check of `checks`."""
    number = int(record[0]) - 1
    if not 0 <= number < len(checks):
        return None, None
    return checks[number], int(record[1])


__all__ = ["IndexCheck", "RECORD_WORDS", "collect_checks", "failed_check"]
