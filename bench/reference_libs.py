"""The reference libraries benchmarks time tunefarm against, imported once in one way."""

from __future__ import annotations

import sys


def import_torch():
    """PyTorch's CPU build (the `bench` extra), or None after saying how to install it."""
    try:
        import torch
    except ImportError:
        print("needs PyTorch's CPU build: pip install -e '.[bench]'", file=sys.stderr)
        return None
    return torch
