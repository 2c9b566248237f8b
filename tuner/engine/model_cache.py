"""The cost model's training rows kept between runs: next to the records store, per target.

A tuning run's cost model starts from other workloads' records (`task_tuner.warm_cost_model`),
and to use a record it must lower the record's candidate and compute its features: 2-10 ms a
record, seconds for the 2000 the warm start reads, paid again by every run in every process. The
rows are the same every time. So each run leaves its workload's rows here when it ends (features,
the throughputs normalized per workload, and each row's structure: candidate kind and sketch or
template), and the next run of the same target reads them in milliseconds: its model is trained
across tasks before the first batch is picked, and only records of workloads this file does not
hold are lowered.

Where: a SQLite store `path/records.db` keeps its rows in `path/records.db.models/`; any other
store in `$TUNEFARM_MODEL_DIR` (default `~/.cache/tunefarm/models`), under a digest of its URL
without credentials; an in-memory store keeps none. One file per target and timing kind
(emulated timings never train a native model). A file of another FEATURE_VERSION is ignored (its
features mean something else) and rewritten by the next save. Saves merge under an flock and
replace the file atomically, so two runs ending together lose neither's rows and a reader never
sees half a file.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAX_ROWS_PER_WORKLOAD = 256   # a workload's best rows and a spread of the rest (XGBCostModel._subsample)
MAX_WORKLOADS = 64            # the newest saved workloads; older ones make way
_FORMAT = 1


@dataclass
class CachedRows:
    """Feature rows with their normalized labels, workload keys and structures ("kind:value")."""

    X: np.ndarray
    y: np.ndarray
    groups: np.ndarray
    structures: np.ndarray

    def __len__(self) -> int:
        return len(self.X)

    def select(self, mask) -> "CachedRows":
        return CachedRows(self.X[mask], self.y[mask], self.groups[mask], self.structures[mask])


def structure_of(cand) -> str:
    """A candidate's structure as a row keeps it: its kind and the payload field a space's
    `structure()` names (a sketch id, a template name); the kind alone for others."""
    payload = cand.payload if isinstance(cand.payload, dict) else {}
    value = payload.get("sketch") if cand.kind == "trace" else payload.get("template") if cand.kind == "config" else None
    return f"{cand.kind}:{value}" if value is not None else cand.kind


KEEP_ROWS_ENV = "TUNEFARM_KEEP_MODEL_ROWS"


def model_dir(store) -> Path | None:
    """Where `store`'s cost-model rows live (see the module docstring); None for none."""
    url = str(getattr(store, "url", "") or "")
    if not url:
        return None
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):].split("?", 1)[0]
        if not path or path == ":memory:":
            return None
        return Path(path).with_name(Path(path).name + ".models")
    if url.startswith("sqlite:"):
        return None   # in memory
    from ..records.engine import shown
    base = Path(os.environ.get("TUNEFARM_MODEL_DIR") or Path.home() / ".cache" / "tunefarm" / "models")
    return base / hashlib.sha256(str(shown(url)).encode()).hexdigest()[:16]


class ModelCache:
    """One target's rows in one file (`for_store`), read with `rows` and merged with `save`."""

    def __init__(self, path: Path):
        self.path = Path(path)

    @classmethod
    def for_store(cls, store, target: str, emulated: bool = False) -> "ModelCache | None":
        """The store's cache for `target`, when rows are kept (KEEP_ROWS_ENV=1) and the store has
        a place for them. Off by default: `bench/search_efficiency.py --seeds 5` read a sketch
        trial ratio of 0.71 with kept rows and 0.14 without (ResNet-50's conv, the evolutionary
        search warm-started from kept rows settled on the direct sketch in 3 of 5 runs)."""
        if os.environ.get(KEEP_ROWS_ENV) != "1":
            return None
        d = model_dir(store)
        if d is None:
            return None
        digest = hashlib.sha256(str(target).encode()).hexdigest()[:16]
        return cls(d / f"{digest}-{'emulated' if emulated else 'native'}.npz")

    # ------------------------------------------------------------------ reading
    def load(self) -> CachedRows | None:
        """Every row of the file; None when there is none or it cannot be used."""
        from ..features import FEATURE_VERSION
        try:
            with np.load(self.path, allow_pickle=False) as z:
                if int(z["format"]) != _FORMAT or int(z["feature_version"]) != FEATURE_VERSION:
                    return None
                return CachedRows(z["X"].astype(np.float32), z["y"].astype(np.float64),
                                  z["groups"].astype(object), z["structures"].astype(object))
        except (OSError, KeyError, ValueError):
            return None

    def rows(self, spaces, exclude_keys=()) -> CachedRows | None:
        """The rows of other workloads than `exclude_keys` whose structure is one of `spaces`'
        (a warm start uses only those: on a ResNet conv2d, matmul rows made the first batch worse)."""
        rows = self.load()
        if rows is None or not len(rows):
            return None
        allowed: set[str] = set()
        for sp in spaces:
            st = sp.structure()
            if st is not None:
                kind, _field, values = st
                allowed.update(f"{kind}:{v}" for v in values)
        keep = np.array([s in allowed and g not in exclude_keys for s, g in zip(rows.structures, rows.groups)], dtype=bool)
        return rows.select(keep) if keep.any() else None

    # ------------------------------------------------------------------ writing
    def save(self, workload_key: str, X, throughputs, structures) -> int:
        """Replace `workload_key`'s rows by these (features, raw throughputs, structures), keep
        the newest MAX_WORKLOADS workloads, and write the file atomically; the rows kept."""
        from ..cost_model import normalize_by_group
        from ..features import FEATURE_VERSION
        X = np.asarray(X, dtype=np.float32).reshape(len(throughputs), -1)
        t = np.asarray(throughputs, dtype=np.float64)
        s = np.asarray([str(v) for v in structures], dtype=object)
        ok = ~np.isnan(X).any(axis=1)
        X, t, s = X[ok], t[ok], s[ok]
        if not len(X) or not (t > 0).any():
            return 0
        keep = _spread(t, MAX_ROWS_PER_WORKLOAD)
        X, t, s = X[keep], t[keep], s[keep]
        g = np.array([workload_key] * len(X), dtype=object)
        new = CachedRows(X, normalize_by_group(t, g), g, s)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            old = self.load()
            if old is not None and len(old):
                old = old.select(old.groups != workload_key)
                order = list(dict.fromkeys(old.groups.tolist()))   # oldest saved first
                keep_keys = set(order[-(MAX_WORKLOADS - 1):]) if MAX_WORKLOADS > 1 else set()
                old = old.select(np.array([k in keep_keys for k in old.groups], dtype=bool))
                merged = CachedRows(np.concatenate([old.X, new.X]), np.concatenate([old.y, new.y]),
                                    np.concatenate([old.groups, new.groups]),
                                    np.concatenate([old.structures, new.structures]))
            else:
                merged = new
            tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
            with open(tmp, "wb") as f:
                np.savez(f, format=np.int64(_FORMAT), feature_version=np.int64(FEATURE_VERSION), X=merged.X,
                         y=merged.y, groups=merged.groups.astype(str), structures=merged.structures.astype(str))
            os.replace(tmp, self.path)
        return len(new)


def _spread(t: np.ndarray, limit: int) -> np.ndarray:
    """Indices of at most `limit` rows: the fastest half, then an even spread of the rest (the
    ranking needs slow examples too), in their original order."""
    if len(t) <= limit:
        return np.arange(len(t))
    order = np.argsort(-t, kind="stable")
    best, rest = order[: limit // 2], order[limit // 2:]
    spread = rest[np.linspace(0, len(rest) - 1, limit - len(best)).astype(int)]
    return np.sort(np.concatenate([best, spread]))


__all__ = ["CachedRows", "ModelCache", "model_dir", "structure_of", "MAX_ROWS_PER_WORKLOAD", "MAX_WORKLOADS"]
