"""The emulated Arm board for tests: build or reuse it (scripts/make_board.sh), run commands in it
(scripts/board_run.sh), and say exactly how to make it when this machine cannot.

The board is an aarch64 Debian root run through qemu-user (see the scripts' headers); the tests
that use it are marked `board`. Building it takes minutes once; it is cached outside the checkout
($TUNEFARM_BOARD_ROOT, default /var/cache/tunefarm/board-aarch64-bookworm) and reused after.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKE_BOARD = ROOT / "scripts" / "make_board.sh"
BOARD_RUN = ROOT / "scripts" / "board_run.sh"
BUILD_TIMEOUT_S = 3600
BUILD_LOCK = Path("/tmp/tunefarm-board-build.lock")
EXIT_CANNOT = 3   # make_board.sh: this machine cannot make a board (not root, no binfmt_misc, no packages)

HOW = ("build the emulated board as root with `scripts/make_board.sh` (Debian's mmdebstrap, qemu-user-static and "
       "binfmt_misc; it installs them with apt-get when missing)")


def ensure_board() -> Path:
    """The board's root directory, built on first use; pytest.skip when this machine cannot make one,
    a test failure when the build itself breaks."""
    if os.geteuid() != 0:
        pytest.skip(f"the emulated board needs root (chroot, mounts, binfmt_misc): {HOW}")
    env = dict(os.environ, PYTHON=sys.executable)   # the board's wheels follow this interpreter's versions
    # one build at a time: the suite's two processes (-n 2) may both want the board; the second
    # waits, then finds the cache current
    with open(BUILD_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            proc = subprocess.run(["bash", str(MAKE_BOARD)], env=env, capture_output=True, text=True,
                                  timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"scripts/make_board.sh did not finish within {BUILD_TIMEOUT_S} s")
    if proc.returncode == EXIT_CANNOT:
        pytest.skip(f"this machine cannot make the emulated board ({proc.stderr.strip()}): {HOW}")
    if proc.returncode != 0:
        pytest.fail(f"scripts/make_board.sh failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def board_command(*args: str) -> list:
    """argv running `args` inside the board, with this checkout mounted at /opt/tunefarm."""
    return ["bash", str(BOARD_RUN), *args]


def run_in_board(*args: str, input: bytes | None = None, timeout: float = 300,
                 env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a command in the board to completion (its output captured as text)."""
    proc = subprocess.run(board_command(*args), input=input, capture_output=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(errors="replace"),
                                       proc.stderr.decode(errors="replace"))


def spawn_in_board(args: list, log: Path, env: dict | None = None) -> subprocess.Popen:
    """A long-running command in the board (its own process group, output to `log`)."""
    with open(log, "wb") as out:
        return subprocess.Popen(board_command(*args), env=dict(os.environ, **(env or {})), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
