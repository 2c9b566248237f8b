"""The code passes the linter and the type checker configured in pyproject.toml ([tool.ruff],
[tool.mypy]): part of every test run, so CI and `.ci/run` check it without a second command."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (it comes with the project's test extra)")
    proc = subprocess.run([ruff, "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_finds_nothing():
    """mypy over the files [tool.mypy] lists (the compiler and the tuner except its records store and CLI). It runs on this
    interpreter, not a `mypy` found on PATH, so it sees this environment's packages (numpy's types);
    its incremental cache (.mypy_cache, ignored by git) makes a rerun take about a second."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (it comes with the project's test extra)")
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
