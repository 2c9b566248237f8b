"""bench/measure_trust.py --slow-mode counts what reached the records: re-measured records, records
left marked, and the slow windows among them (a window's records share the speed index of the
calibration that found it slow). The full benchmark takes minutes; this is its counting."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

from tuner.candidate import MeasureResult

BENCH = Path(__file__).resolve().parents[1] / "bench" / "measure_trust.py"


def _bench():
    spec = importlib.util.spec_from_file_location("measure_trust", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rec(**marks):
    return SimpleNamespace(result=MeasureResult(costs=[1e-3], median=1e-3, minimum=1e-3, spread=0.0, samples=1, **marks))


def test_retaken_counts_records_and_their_windows():
    records = [_rec(), _rec(remeasured=True, slow_index=0.51), _rec(remeasured=True, slow_index=0.51),
               _rec(remeasured=True, slow_index=0.47), _rec(slow_window=True, slow_index=0.6), _rec()]
    assert _bench().retaken(records) == {"remeasured": 3, "marked": 1, "windows": 3}
    assert _bench().retaken([_rec(), _rec()]) == {"remeasured": 0, "marked": 0, "windows": 0}
