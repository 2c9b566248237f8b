"""The cost model: gradient-boosted trees (XGBoost) ranking candidates by predicted speed.

Labels are *normalized throughputs*: flops / cost (or 1 / cost — the flops of a workload are a
constant factor), divided by the best of the same workload, so the best measured candidate of every
workload has label 1 and failed candidates 0. With a ranking objective (`rank:pairwise`, the
default) every workload is its own query group: the model only learns which of two candidates of
the same workload is faster, which is what the search needs and what transfers across workloads.
`reg:squarederror` is available too (it fits the normalized throughput directly).

The model keeps its training rows and retrains from scratch on all of them (`update` appends and
retrains; a few thousand rows take a fraction of a second with the defaults). `warm_start` adds
the records of other workloads of the same target, each in its own group.

Emulated and native timings are never mixed (`emulated`): an agent under qemu-user measures the
emulator's translation of a kernel, whose ranking of candidates differs from a real core's
(memory-bound and vectorised code do not slow down alike). A model holds rows of one kind only:
the kind of the first rows it is given; rows of the other kind are left out, except that a warm
start of the other kind gives way to the run's own first measurements (they decide the kind).
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from xgboost import Booster

RANK_OBJECTIVES = ("rank:pairwise", "rank:ndcg", "rank:map")
_MODEL_FORMAT = 1


def _xgb():
    import xgboost as xgb
    return xgb


def throughputs_from_results(results, flops: float = 1.0) -> np.ndarray:
    """flops / mean cost per MeasureResult; 0 for failed or non-positive costs."""
    out = np.zeros(len(results))
    for i, r in enumerate(results):
        if getattr(r, "ok", False):
            c = r.cost
            if c > 0 and math.isfinite(c):
                out[i] = flops / c
    return out


MIN_HISTORY_WEIGHT = 0.05  # below this, other workloads' rows are left out of training


def rank_correlation(a, b) -> float:
    """Spearman's rank correlation of two equally long vectors (ties share their mean rank);
    0 when either is constant or non-finite scores make it undefined."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    if len(a) < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return 0.0
    ra, rb = _mean_ranks(a), _mean_ranks(b)
    return float(np.corrcoef(ra, rb)[0, 1])


def _mean_ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x), dtype=np.float64)
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return (sums / counts)[inverse]


def normalize_by_group(throughputs, groups) -> np.ndarray:
    """Throughput / best throughput of its group; NaN, inf, negatives and all-failed groups → 0."""
    y = np.asarray(throughputs, dtype=np.float64).copy()
    y[~np.isfinite(y) | (y < 0)] = 0.0
    g = np.asarray(groups)
    out = np.zeros_like(y)
    for key in np.unique(g):
        m = g == key
        best = y[m].max() if m.any() else 0.0
        if best > 0:
            out[m] = y[m] / best
    return out


class XGBCostModel:
    """XGBoost ranker over candidate features; `predict` gives scores, higher = faster.

    Parameters: `objective` (rank:pairwise | rank:ndcg | reg:squarederror ...), `max_depth`,
    `eta`, `num_rounds` (boosting rounds of every retrain), `nthread`, `min_samples` (fewer
    valid rows than this: the model stays untrained and predicts zeros), `max_history_rows`
    (rows kept from warm-start data, the best and a spread of the rest per workload),
    `threads_min_rows` (below this many rows training uses one thread: see `_retrain`), `seed`.
    Extra keyword arguments go to XGBoost as booster parameters.
    """

    def __init__(self, objective: str = "rank:pairwise", max_depth: int = 6, eta: float = 0.2,
                 num_rounds: int = 30, nthread: int = 2, min_samples: int = 8,
                 max_history_rows: int = 4000, threads_min_rows: int = 20000, seed: int = 0, **params):
        self.objective = objective
        self.num_rounds = int(num_rounds)
        self.min_samples = int(min_samples)
        self.max_history_rows = int(max_history_rows)
        self.threads_min_rows = int(threads_min_rows)
        self.params = {
            "objective": objective, "max_depth": max_depth, "eta": eta, "nthread": nthread,
            "seed": seed, "min_child_weight": 1, "subsample": 1.0, "colsample_bytree": 1.0,
            "tree_method": "hist", "max_bin": 64, "verbosity": 0,
        }
        if objective in RANK_OBJECTIVES:
            # every pair within a query, sampled evenly ("topk" would only care about the top few)
            self.params.update({"lambdarank_pair_method": "mean", "lambdarank_num_pair_per_sample": 32})
        self.params.update(params)
        self.booster: Booster | None = None
        self.num_features: int | None = None
        # own rows (this workload) and warm-start rows (other workloads), kept for retraining:
        # features, throughputs and group ids (own), features, normalized labels, group ids (warm)
        self._X: np.ndarray | None = None
        self._t: np.ndarray | None = None
        self._g: np.ndarray | None = None
        self._hX: np.ndarray | None = None
        self._hy: np.ndarray | None = None
        self._hg: np.ndarray | None = None
        # per own group: the rank correlation of the warm-started model's predictions with that
        # group's first measured batch (see history_weight)
        self.transfer_correlation: dict = {}
        self.emulated: bool | None = None   # the kind of timings its rows are (None: no rows yet)
        self.rows_left_out = 0              # rows not trained on: timings of the other kind
        self._own_timings = False           # has `update` given it a timing yet?
        self.last_retrain_seconds = 0.0     # what the last retrain took (the engine plans around it)

    # ------------------------------------------------------------------ training
    @property
    def trained(self) -> bool:
        return self.booster is not None

    def fit(self, features, throughputs, groups=None):
        """Replace the own training rows by these and retrain.

        `throughputs`: higher = faster (flops / cost or 1 / cost); 0, NaN or inf for failures.
        `groups`: a workload id per row (any hashable; default: all one workload).
        """
        X, t, g = self._check(features, throughputs, groups)
        self._X, self._t, self._g = X, t, g
        self._retrain()
        return self

    def fit_costs(self, features, costs, groups=None):
        """`fit` from costs in seconds (lower = faster; inf / NaN for failures)."""
        c = np.asarray(costs, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(np.isfinite(c) & (c > 0), 1.0 / c, 0.0)
        return self.fit(features, t, groups)

    def update(self, features, results, group="current", flops: float = 1.0, retrain: bool = True):
        """Append measured rows (MeasureResult list, errors → 0) and retrain on everything
        (`retrain=False`: later, by `retrain()`; the engine retrains while a batch builds).

        Only timings of the model's kind (emulated or native) are kept; failures (no timing) are
        of no kind. The first timings of a model without own timings set the kind, dropping a warm
        start of the other kind."""
        results = list(results)
        timed = [bool(getattr(r, "ok", False)) for r in results]
        kinds = [bool(getattr(r, "emulated", False)) for r in results]
        first = next((k for k, t in zip(kinds, timed) if t), None)
        if first is not None and not self._own_timings and self.emulated is not first:
            if self._hX is not None:  # a warm start of the other kind gives way to the run's own timings
                self.rows_left_out += len(self._hX)
                self._hX = self._hy = self._hg = None
            self.emulated = first
        keep = np.array([not t or k == self.emulated for k, t in zip(kinds, timed)], dtype=bool)
        if not keep.all():
            self.rows_left_out += int((~keep).sum())
            features = np.asarray(features)[keep]
            results = [r for r, k in zip(results, keep) if k]
            if not results:
                return self
        self._own_timings = self._own_timings or any(getattr(r, "ok", False) for r in results)
        X, t, g = self._check(features, throughputs_from_results(results, flops), [group] * len(results))
        if (self._hX is not None and self.booster is not None and len(X) >= 3
                and str(group) not in self.transfer_correlation and (self._g is None or str(group) not in self._g)):
            self.transfer_correlation[str(group)] = rank_correlation(self.predict(X), t)
        if self._X is None:
            self._X, self._t, self._g = X, t, g
        else:
            self._X = np.concatenate([self._X, X])
            self._t = np.concatenate([self._t, t])
            self._g = np.concatenate([self._g, g])
        if retrain:
            self._retrain()
        return self

    def retrain(self):
        """Retrain on every row now (after `update(..., retrain=False)`)."""
        self._retrain()
        return self

    @property
    def history_weight(self) -> float:
        """How far the other workloads' records are trusted: 1 until a task's first batch is
        measured, then the rank correlation (Spearman) of the warm-started model's predictions
        with that batch's measured speeds (the mean over tasks when a model serves several),
        clipped to [0, 1]. A transferred model that ranks this task's candidates no better than
        chance stops steering the search; one that ranks them well keeps its history."""
        if not self.transfer_correlation:
            return 1.0
        return float(min(max(np.mean(list(self.transfer_correlation.values())), 0.0), 1.0))

    def warm_start(self, features, throughputs, groups, emulated: bool = False):
        """Add the records of other workloads (same target); each group ranks on its own.

        `emulated`: whether these are emulated timings; ignored (left out) when the model already
        holds rows of the other kind.
        At most `max_history_rows` rows are kept: per workload its best rows and an even spread
        of the rest, so the retrain time stays bounded however large the history is.
        """
        if self.emulated is not None and self.emulated != bool(emulated):
            self.rows_left_out += len(throughputs)
            return self
        self.emulated = bool(emulated)
        X, t, g = self._check(features, throughputs, groups)
        X, t, g = self._subsample(X, t, g, self.max_history_rows)
        if self._hX is None:
            self._hX, self._hy, self._hg = X, normalize_by_group(t, g), g
        else:
            self._hX = np.concatenate([self._hX, X])
            self._hy = np.concatenate([self._hy, normalize_by_group(t, g)])
            self._hg = np.concatenate([self._hg, g])
        self._retrain()
        return self

    def _check(self, features, throughputs, groups):
        X = np.asarray(features, dtype=np.float32)
        if X.ndim != 2:
            raise ValueError(f"features must be a 2-d array, got shape {X.shape}")
        t = np.asarray(throughputs, dtype=np.float64).reshape(-1)
        if len(t) != len(X):
            raise ValueError(f"{len(X)} feature rows but {len(t)} labels")
        if self.num_features is None:
            self.num_features = X.shape[1]
        elif X.shape[1] != self.num_features:
            raise ValueError(f"features have {X.shape[1]} columns, the model {self.num_features}")
        g = np.array(["current"] * len(X) if groups is None else [str(x) for x in groups], dtype=object)
        if len(g) != len(X):
            raise ValueError(f"{len(X)} feature rows but {len(g)} group ids")
        bad = np.isnan(X).any(axis=1)  # candidates whose features could not be extracted
        return X[~bad], t[~bad], g[~bad]

    @staticmethod
    def _subsample(X, t, g, limit):
        if len(X) <= limit:
            return X, t, g
        keys = np.unique(g)
        per = max(limit // len(keys), 2)
        picked: list[np.ndarray] = []  # row indices kept, per workload
        for key in keys:
            idx = np.flatnonzero(g == key)
            if len(idx) <= per:
                picked.append(idx)
                continue
            order = idx[np.argsort(-t[idx], kind="stable")]
            best = order[: per // 2]
            rest = order[per // 2:]
            picked.append(np.concatenate([best, rest[np.linspace(0, len(rest) - 1, per - len(best)).astype(int)]]))
        keep = np.sort(np.concatenate(picked))
        return X[keep], t[keep], g[keep]

    def _training_set(self):
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (features, labels, groups)
        if self._X is not None and len(self._X):
            if self._t is None or self._g is None:
                raise RuntimeError("the cost model has feature rows without their throughputs or groups")
            parts.append((self._X, normalize_by_group(self._t, self._g), self._g))
        if self._hX is not None and len(self._hX) and self.history_weight > MIN_HISTORY_WEIGHT:
            if self._hy is None or self._hg is None:
                raise RuntimeError("the cost model has warm-start rows without their labels or groups")
            parts.append((self._hX, self._hy, self._hg))
        if not parts:
            return None
        X = np.concatenate([p[0] for p in parts])
        y = np.concatenate([p[1] for p in parts])
        g = np.concatenate([p[2] for p in parts])
        return X, y, g

    def _retrain(self):
        import time
        t0 = time.perf_counter()
        try:
            self._train()
        finally:
            self.last_retrain_seconds = time.perf_counter() - t0

    def _train(self):
        data = self._training_set()
        if data is None:
            return
        X, y, g = data
        if len(X) < self.min_samples or (y > 0).sum() < 2 or np.ptp(y) == 0:
            return  # too little signal: keep the previous booster (or none)
        xgb = _xgb()
        _, qid = np.unique(g, return_inverse=True)
        order = np.argsort(qid, kind="stable")  # XGBoost wants the rows of a query together
        label = y[order]
        if self.objective == "rank:ndcg":
            label = np.rint(label * 15.0)  # integer relevance grades (exponential gain)
        elif self.objective == "rank:map":
            label = (label >= 0.8).astype(np.float64)  # relevant = within 20% of the best
        # One thread below `threads_min_rows`: 3000 real feature rows train in ~0.45 s on one
        # thread, but with two, on a 2-core machine where another process holds a core, every
        # OpenMP barrier waits for a descheduled worker: 6-8 s measured (48 rows: 0.03 s vs up
        # to 5 s). `nthread` threads are only used for larger sets.
        params = dict(self.params)
        if len(X) < self.threads_min_rows:
            params["nthread"] = 1
        dtrain = xgb.DMatrix(X[order], label=label, nthread=params["nthread"])
        if self.objective in RANK_OBJECTIVES:
            dtrain.set_info(qid=qid[order])
            w = self.history_weight
            if w < 1.0 and self._hg is not None:
                # ranking weights are per query group: the other workloads' groups count w
                history_groups = set(np.unique(self._hg).tolist()) - set(np.unique(self._g).tolist()
                                                                         if self._g is not None else [])
                keys = np.unique(g)
                dtrain.set_weight(np.array([w if k in history_groups else 1.0 for k in keys]))
        self.booster = xgb.train(params, dtrain, num_boost_round=self.num_rounds)
        self.booster.set_param({"nthread": 1})  # see predict

    # ------------------------------------------------------------------ prediction
    def predict(self, features) -> np.ndarray:
        """Scores (higher = predicted faster); NaN feature rows get -inf; zeros if untrained."""
        X = np.asarray(features, dtype=np.float32)
        if X.ndim == 1:
            X = X[None, :]
        out = np.zeros(len(X))
        bad = np.isnan(X).any(axis=1)
        out[bad] = -np.inf
        if self.booster is None or not (~bad).any():
            return out
        # One thread: the search predicts many small batches, and OpenMP workers that spin while
        # the other core is busy made a 16-row prediction take ~40 ms instead of ~0.3 ms.
        out[~bad] = self.booster.inplace_predict(X[~bad], predict_type="margin")
        return out

    # ------------------------------------------------------------------ persistence
    def save(self, path, include_data: bool = True):
        """One .npz file: parameters, the booster, and (by default) the training rows."""
        from .features import FEATURE_VERSION
        meta = {"format": _MODEL_FORMAT, "feature_version": FEATURE_VERSION, "objective": self.objective,
                "num_rounds": self.num_rounds,
                "min_samples": self.min_samples, "max_history_rows": self.max_history_rows,
                "threads_min_rows": self.threads_min_rows,
                "params": self.params, "num_features": self.num_features, "emulated": self.emulated,
                "transfer_correlation": self.transfer_correlation}
        arrays = {"meta": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)}
        if self.booster is not None:
            arrays["booster"] = np.frombuffer(bytes(self.booster.save_raw("ubj")), dtype=np.uint8)
        if include_data:
            for name in ("_X", "_t", "_g", "_hX", "_hy", "_hg"):
                v = getattr(self, name)
                if v is not None:
                    arrays[name] = v.astype(str) if v.dtype == object else v
        buf = io.BytesIO()
        # numpy's stub gives savez_compressed a keyword `allow_pickle: bool` besides **kwds, and mypy
        # checks every value of **arrays against it too; no key here is "allow_pickle".
        np.savez_compressed(buf, **arrays)  # type: ignore[arg-type]
        Path(path).write_bytes(buf.getvalue())

    @classmethod
    def load(cls, path) -> "XGBCostModel":
        with np.load(Path(path), allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            if meta.get("format") != _MODEL_FORMAT:
                raise ValueError(f"{path}: cost model format {meta.get('format')} is not {_MODEL_FORMAT}")
            from .features import FEATURE_VERSION
            if meta.get("feature_version") != FEATURE_VERSION:
                raise ValueError(f"{path}: the model was trained on features of version {meta.get('feature_version')}, "
                                 f"this tunefarm computes version {FEATURE_VERSION}: its rows and trees do not "
                                 "apply; train a new model")
            m = cls(objective=meta["objective"], num_rounds=meta["num_rounds"],
                    min_samples=meta["min_samples"], max_history_rows=meta["max_history_rows"],
                    threads_min_rows=meta.get("threads_min_rows", 20000))
            m.params = dict(meta["params"])
            m.num_features = meta["num_features"]
            m.transfer_correlation = dict(meta.get("transfer_correlation", {}))
            m.emulated = meta.get("emulated")
            if "booster" in z:
                xgb = _xgb()
                m.booster = xgb.Booster(params={"nthread": 1})
                m.booster.load_model(bytearray(z["booster"].tobytes()))
                m.booster.set_param({"nthread": 1})
            for name in ("_X", "_t", "_g", "_hX", "_hy", "_hg"):
                if name in z:
                    v = z[name]
                    setattr(m, name, v.astype(object) if v.dtype.kind == "U" else v)
        return m

    def __repr__(self):
        n = 0 if self._X is None else len(self._X)
        h = 0 if self._hX is None else len(self._hX)
        return f"XGBCostModel({self.objective}, rows={n}, history={h}, trained={self.trained})"


__all__ = ["XGBCostModel", "normalize_by_group", "rank_correlation", "throughputs_from_results"]
