"""`tunefarm model conformance` (compiler/graph/conformance.py): ONNX's backend node tests per
supported op type, and the README's conformance table agreeing with a run of it (for a few op
types here; the full run takes minutes and is how the table is written)."""

from __future__ import annotations

import re
from pathlib import Path

import onnx
import pytest

from compiler.graph.conformance import node_tests, run_conformance
from compiler.graph.ops import ONNX_OP_TYPES

README = Path(__file__).resolve().parents[1] / "README.md"
CHECKED = ["Relu", "Softmax", "Transpose", "Where"]   # cheap to compile, several tests each, expanded ones too


def readme_table() -> dict:
    """{op type: (tests, passed, refused, wrong, errors)} from the README's conformance table."""
    text = README.read_text()
    start = text.index("| op type | node tests | passed | refused | wrong | errors |")
    rows = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = tuple(int(c) for c in cells[1:6])
    return rows


def test_node_tests_are_those_of_supported_ops_under_their_subject():
    tests = node_tests()
    assert tests["test_relu"] == "Relu" and tests["test_softmax_axis_0_expanded"] == "Softmax"
    assert {op.removesuffix(" (expanded)") for op in tests.values() if op.endswith(" (expanded)")}.isdisjoint(ONNX_OP_TYPES)
    assert {op for op in tests.values() if not op.endswith(" (expanded)")} <= set(ONNX_OP_TYPES)
    assert tests["test_mvn_expanded"] == "MeanVarianceNormalization (expanded)"
    assert tests["test_group_normalization_example_expanded"] == "GroupNormalization"   # an op tunefarm has
    assert not any(name.startswith("test_lstm") for name in tests)       # an op tunefarm lacks: not run
    assert set(node_tests(["Relu"]).values()) == {"Relu"}


def test_readme_names_every_op_with_node_tests_and_the_onnx_version():
    table = readme_table()
    assert set(table) == set(node_tests().values())
    for op, (tests, passed, refused, wrong, errors) in table.items():
        assert tests == passed + refused + wrong + errors, op
    assert f"onnx {onnx.__version__}" in README.read_text()


def test_the_readme_table_agrees_with_a_run():
    results = run_conformance(CHECKED)
    table = readme_table()
    for op in CHECKED:
        r = results[op]
        got = (r.total, len(r.passed), len(r.refused), len(r.wrong), len(r.errors))
        assert got == table[op], (op, got, table[op], r.wrong, r.errors)
        assert r.total > 0 and not r.wrong and not r.errors


def test_cli_prints_per_op_counts(capsys):
    from tuner.cli import main
    assert main(["model", "conformance", "--op", "Relu", "--op", "Sigmoid"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^Relu\s+\d+\s+\d+\s+0\s+0\s+0$", out, re.M) and re.search(r"^all\s+\d+", out, re.M)
    assert main(["model", "conformance", "--op", "NoSuchOp"]) == 2
    assert "NoSuchOp" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [["--op"], ["--json", "--op", "Lstm"]])
def test_cli_refuses_bad_arguments(bad, capsys):
    from tuner.cli import main
    assert main(["model", "conformance", *bad]) == 2


def test_the_readme_operator_table_lists_exactly_the_supported_op_types():
    text = README.read_text()
    start = text.index("| ONNX operators | notes |")
    names = set()
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        names |= {n.strip() for n in line.strip("|").split("|")[0].split(",")}
    assert names == set(ONNX_OP_TYPES)
