"""ONNX's own backend node tests against tunefarm, counted per operator type.

The installed `onnx` generates its node tests in memory (`onnx.backend.test.loader`): a one-node
model per case (or the node's function expanded into several, `*_expanded`), its inputs and the
reference outputs. `run_conformance` takes every case whose nodes are all op types tunefarm
supports (`compiler.graph.ops.ONNX_OP_TYPES`), runs it through `onnx.backend.test.BackendTest` with the
tunefarm backend (onnx_backend.py: from_onnx + build_model, default schedules) and ONNX's own
comparison (each case's rtol/atol), and sorts every outcome under the case's subject op type (a
one-node case's op; an expanded case counts for the op whose function it spells out, labelled
"Op (expanded)" when tunefarm lacks that op itself: exporters that expand it get these):

- passed: outputs agree;
- refused: tunefarm declined the model with a GraphError naming what it cannot take (an
  attribute, a dtype, a non-constant shape argument): a clear error, not a wrong answer;
- wrong: the outputs differ from ONNX's reference;
- errors: anything else (a compiler failure, a crash in the runtime).

Only `tunefarm model conformance` and the tests import this module; it needs `onnx`.
"""

from __future__ import annotations

import functools
import re
import unittest
import warnings
from dataclasses import dataclass, field

from .errors import GraphError
from .ops import ONNX_OP_TYPES

EXPANDED = re.compile(r"_expanded(_ver\d+)?$")


@dataclass
class OpConformance:
    """The outcomes of one op type's node tests (test names, with the reason where not passed)."""

    op_type: str
    passed: list = field(default_factory=list)
    refused: list = field(default_factory=list)     # (name, reason)
    wrong: list = field(default_factory=list)       # (name, reason)
    errors: list = field(default_factory=list)      # (name, reason)

    @property
    def total(self) -> int:
        return len(self.passed) + len(self.refused) + len(self.wrong) + len(self.errors)

    def to_json(self) -> dict:
        return {"op_type": self.op_type, "total": self.total, "passed": len(self.passed),
                "refused": [list(x) for x in self.refused], "wrong": [list(x) for x in self.wrong],
                "errors": [list(x) for x in self.errors]}


@functools.cache
def _node_cases() -> tuple:
    """(name, op types of its nodes in order) of every node test; generating them takes seconds,
    so once per process."""
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")        # the generators' own overflow warnings
        cases = load_model_tests(kind="node")
    return tuple((c.name, tuple(n.op_type for n in c.model.graph.node)) for c in cases if c.model is not None)


def node_tests(op_types=None) -> dict:
    """{test name: subject op type} of the node tests whose ops tunefarm supports (all of them,
    or those of `op_types`), in the loader's order."""
    cases = _node_cases()
    single = {name: ops[0] for name, ops in cases if len(ops) == 1}
    wanted = set(op_types) if op_types else None
    out = {}
    for name, node_ops in cases:
        ops = set(node_ops)
        if not ops or not ops <= set(ONNX_OP_TYPES):
            continue
        subject = single.get(name) or single.get(EXPANDED.sub("", name))
        if subject is None:                    # a multi-node case that expands no one-node case
            continue
        if subject not in ONNX_OP_TYPES:       # an op tunefarm lacks, spelled out in ops it has
            subject = f"{subject} (expanded)"
        if wanted is None or subject in wanted:
            out[name] = subject
    return out


class _Outcomes(unittest.TestResult):
    def __init__(self, subjects: dict, on_test=None):
        super().__init__()
        self.subjects, self.on_test = subjects, on_test
        self.by_op: dict = {}

    def _note(self, test, kind: str, reason: str | None = None):
        name = test._testMethodName.removesuffix("_cpu")
        op = self.subjects.get(name)
        if op is None:
            return
        entry = self.by_op.setdefault(op, OpConformance(op))
        getattr(entry, kind).append(name if reason is None else (name, reason))
        if self.on_test is not None:
            self.on_test(op, name, kind)

    def addSuccess(self, test):
        self._note(test, "passed")

    def addFailure(self, test, err):
        self._note(test, "wrong", _first_line(err[1]))

    def addError(self, test, err):
        self._note(test, "refused" if isinstance(err[1], GraphError) else "errors",
                   f"{type(err[1]).__name__}: {_first_line(err[1])}")


def _first_line(exc) -> str:
    problems = getattr(exc, "problems", None)     # UnsupportedModelError: the reasons, not its header
    if problems:
        return "; ".join(f"{op}: {why}" for op, _, why in problems)[:300]
    text = str(exc).strip()
    return (text.splitlines() or [""])[0][:300]


def run_conformance(op_types=None, on_test=None) -> dict:
    """{op type: OpConformance} over the supported node tests (of `op_types`, if given);
    `on_test(op, test name, outcome)` after each. Unknown names in `op_types`: ValueError."""
    import onnx.backend.test

    from .onnx_backend import TunefarmBackend

    if op_types:
        unknown = sorted(set(op_types) - set(ONNX_OP_TYPES))
        if unknown:
            raise ValueError(f"not op types tunefarm supports: {', '.join(unknown)}; supported: {', '.join(sorted(ONNX_OP_TYPES))}")
    subjects = node_tests(op_types)
    backend_test = onnx.backend.test.BackendTest(TunefarmBackend, "tunefarm_conformance")
    for name in subjects:
        backend_test.include(f"^{name}_cpu$")
    wanted = {f"{name}_cpu" for name in subjects}
    suite = unittest.TestSuite()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case in backend_test.test_cases.values():
            suite.addTests(case(m) for m in sorted(vars(case)) if m in wanted)
    result = _Outcomes(subjects, on_test)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")        # numpy's warnings on the tests' own special values
        suite.run(result)
    return {op: result.by_op.get(op, OpConformance(op)) for op in sorted({*subjects.values()})}


__all__ = ["OpConformance", "node_tests", "run_conformance"]
