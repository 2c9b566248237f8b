"""Features of lowered loop programs and the XGBoost cost model.

The cost model is checked against real measurements: small matmuls built with the compiler and
timed with `time_evaluator` (serial schedules only: on a shared 2-core machine the timings of
parallel kernels swing by 100× with the load, single-threaded ones re-measure with rank
correlation > 0.95).
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from matmul_trace import matmul_knob_trace

from compiler import build, create_schedule, lower
from compiler.ops.matmul import matmul
from compiler.ops.schedule_gemm import schedule_gemm
from compiler.target import Target
from tuner.candidate import Candidate, ErrorCode, MeasureResult
from tuner.cost_model import XGBCostModel, normalize_by_group, rank_correlation, throughputs_from_results
from tuner.features import NUM_FEATURES, extract_features, feature_names, features_for
from tuner.space.base import SearchSpace, instantiate


class MatmulTiles(SearchSpace):
    """Split factors, loop order, vectorize, unroll and (optionally) parallel of a matmul."""

    kind = "trace"

    def __init__(self, opdef, parallel=True):
        self.opdef = opdef
        self.values = {"ti": [1, 2, 4, 8, 16], "tj": [1, 2, 4, 8, 16, 32], "tk": [1, 2, 4, 8],
                       "vec": [0, 1], "order": [0, 1], "unroll": [0, 1], "par": [0, 1] if parallel else [0]}

    def make(self, **k) -> Candidate:
        return matmul_knob_trace(self.opdef, **k)

    def sample(self, rng):
        return self.make(**{n: v[int(rng.integers(len(v)))] for n, v in self.values.items()})

    def mutate(self, cand, rng):  # not needed here
        return self.sample(rng)

    def schedule(self, opdef, cand):
        return instantiate(opdef, cand)


def distinct_samples(space, n, seed):
    rng = np.random.default_rng(seed)
    out, seen = [], set()
    while len(out) < n:
        c = space.sample(rng)
        if c.fingerprint not in seen:
            seen.add(c.fingerprint)
            out.append(c)
    return out


def col(name):
    return feature_names().index(name)


@pytest.fixture(scope="module")
def target():
    return Target.host()


@pytest.fixture(scope="module")
def mm512():
    return matmul(512, 512, 512)


def measure(opdef, cands, target):
    """Real costs (seconds, min of 5 repeats of >= 2 ms) of each candidate, built for the host."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(t.shape).astype(t.dtype) for t in opdef.inputs]
    arrays.append(np.zeros(opdef.output.shape, opdef.output.dtype))
    costs = []
    for c in cands:
        s, args = instantiate(opdef, c)
        k = build(s, args, target)
        costs.append(k.time_evaluator(number=1, repeat=5, min_repeat_ms=2)(*arrays).min)
    return np.array(costs)


@pytest.fixture(scope="module")
def measured(target):
    """Features and measured costs of 56 random serial schedules of a 128³ matmul."""
    op = matmul(128, 128, 128)
    cands = distinct_samples(MatmulTiles(op, parallel=False), 56, seed=1)
    return features_for(op, cands, target), measure(op, cands, target)


def rank_corr(a, b):
    """(Spearman, Kendall) rank correlations, no scipy needed."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    spearman = np.corrcoef(ra, rb)[0, 1]
    s = np.sign(a[:, None] - a[None, :]) * np.sign(b[:, None] - b[None, :])
    n = len(a)
    kendall = s[np.triu_indices(n, 1)].sum() / (n * (n - 1) / 2)
    return spearman, kendall


# ----------------------------------------------------------------------------- features

def test_features_fixed_length_and_finite(mm512, target):
    names = feature_names()
    assert len(names) == len(set(names)) == NUM_FEATURES
    naive = extract_features(lower(create_schedule(mm512.output), mm512.tensors), target)
    gemm = extract_features(lower(schedule_gemm(mm512, target), mm512.tensors), target)
    tiny = matmul(3, 5, 7)
    small = extract_features(lower(create_schedule(tiny.output), tiny.tensors))
    for x in (naive, gemm, small):
        assert x.shape == (NUM_FEATURES,) and x.dtype == np.float64
        assert np.isfinite(x).all()
    assert not np.array_equal(naive, gemm)


def test_features_follow_the_schedule(mm512, target):
    space = MatmulTiles(mm512)
    naive = features_for(mm512, [space.make(ti=1, tj=1, tk=1, vec=0, order=0, unroll=0, par=0)], target)[0]
    fast = features_for(mm512, [space.make(ti=8, tj=8, tk=4, vec=1, order=1, unroll=1, par=1)], target)[0]
    # the dominant store (the reduction update) is s0 in both
    assert naive[col("s0_vec_lanes")] == 1 and fast[col("s0_vec_lanes")] == 8
    assert naive[col("s0_parallel_extent")] == 0 and fast[col("s0_parallel_extent")] == math.log2(1 + 64)
    assert naive[col("s0_parallel_outermost")] == 0 and fast[col("s0_parallel_outermost")] == 1
    assert naive[col("s0_unroll_product")] == 1 and fast[col("s0_unroll_product")] == math.log2(1 + 4)
    assert fast[col("s0_depth")] == 6 and naive[col("s0_depth")] == 6
    assert fast[col("g_frac_vectorized")] > 0.99 and naive[col("g_frac_vectorized")] == 0
    # same arithmetic whatever the schedule: 512³ multiply-adds
    for x in (naive, fast):
        assert x[col("s0_ops_f_mul")] == pytest.approx(math.log2(1 + 512 ** 3))
        assert x[col("s0_reduction_update")] == 1
    # the output is read and written with unit stride along the vectorized j loop, A is broadcast
    strides = {(fast[col(f"s0_buf{b}_is_write")], fast[col(f"s0_buf{b}_stride_vec_0")],
                fast[col(f"s0_buf{b}_stride_vec_1")]) for b in range(3)}
    assert (1, 0, 1) in strides   # C: written, unit stride along the vector lanes
    assert (0, 1, 0) in strides   # A[i, k]: the same element for every lane
    assert (0, 0, 1) in strides   # B[k, j]: unit stride
    # reuse: A is reused across the j tile, so its footprint is far smaller than its traffic
    a_slot = next(b for b in range(3) if fast[col(f"s0_buf{b}_stride_vec_0")] == 1)
    assert fast[col(f"s0_buf{a_slot}_reuse_ct")] > 0
    assert fast[col(f"s0_buf{a_slot}_unique_bytes")] < fast[col(f"s0_buf{a_slot}_bytes")]


def test_broken_candidates_give_nan_rows(mm512, target):
    space = MatmulTiles(mm512)
    good = space.make(ti=4, tj=8, tk=2, vec=1, order=0, unroll=0, par=1)
    bad = Candidate("trace", {"steps": [{"op": "split", "stage": 7, "axis": 0, "factor": 4}]})
    too_wide = space.make(ti=4, tj=8, tk=2, vec=0, order=0, unroll=0, par=0)
    too_wide.payload["steps"].append({"op": "vectorize", "stage": 0, "axis": 3})  # i_o: 128 lanes, fails in lower()
    X = features_for(mm512, [good, bad, too_wide, good], target)
    assert X.shape == (4, NUM_FEATURES)
    assert np.isfinite(X[0]).all() and np.array_equal(X[0], X[3])
    assert np.isnan(X[1]).all() and np.isnan(X[2]).all()


def test_feature_extraction_throughput(mm512, target):
    """instantiate + lower + extract, per candidate, for a 512³ matmul on one core."""
    cands = distinct_samples(MatmulTiles(mm512), 150, seed=5)
    gemm = Candidate("trace", {"steps": schedule_gemm(mm512, target).steps})
    features_for(mm512, cands[:5], target)  # warm-up (imports, target caches)
    t0 = time.perf_counter()
    X = features_for(mm512, cands, target)
    simple = len(cands) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    features_for(mm512, [gemm] * 60, target)
    packed = 60 / (time.perf_counter() - t0)
    func = lower(schedule_gemm(mm512, target), mm512.tensors)
    t0 = time.perf_counter()
    for _ in range(100):
        extract_features(func, target)
    extract_only = 100 / (time.perf_counter() - t0)
    print(f"\nfeatures_for, matmul 512³: {simple:.0f} candidates/s (tiled + vectorized schedules), "
          f"{packed:.0f}/s (packed GEMM recipe, 4 stores); extract_features alone {extract_only:.0f}/s")
    assert not np.isnan(X).any()
    assert simple > 30 and packed > 30


# ----------------------------------------------------------------------------- cost model

def test_cost_model_learns_measured_ranking(measured):
    X, costs = measured
    assert np.isfinite(costs).all() and costs.max() / costs.min() > 5
    train, test = slice(0, 40), slice(40, None)
    model = XGBCostModel()
    model.fit_costs(X[train], costs[train])
    assert model.trained
    pred = model.predict(X[test])
    spearman, kendall = rank_corr(pred, -costs[test])
    print(f"\ncost model on held-out measured schedules: Spearman {spearman:.2f}, Kendall {kendall:.2f}")
    assert spearman > 0.5 and kendall > 0.35


def test_update_retrains_incrementally_and_is_fast(measured):
    X, costs = measured
    model = XGBCostModel(min_samples=8)
    results = [MeasureResult(costs=[c]) for c in costs]
    results[3] = MeasureResult(error_code=ErrorCode.RUNTIME_ERROR)
    model.update(X[:4], results[:4])
    assert not model.trained            # too few rows to learn from
    model.update(X[4:24], results[4:24])
    assert model.trained
    first = model.predict(X[40:])
    model.update(X[24:40], results[24:40])
    assert model._X.shape[0] == 40
    assert not np.array_equal(first, model.predict(X[40:]))
    # a few thousand rows retrain in about a second at worst: the measured rows repeated, with
    # every varying column jittered (more distinct values than real features have)
    rng = np.random.default_rng(0)
    big = np.repeat(X, 60, axis=0)
    varying = X.std(axis=0) > 0
    big[:, varying] *= rng.uniform(0.9, 1.1, (len(big), varying.sum()))
    t = np.repeat(1 / costs, 60) * rng.uniform(0.8, 1.2, len(big))
    groups = np.arange(len(big)) % 4
    t0 = time.perf_counter()
    XGBCostModel().fit(big, t, groups)
    dt = time.perf_counter() - t0
    print(f"\nretrain on {len(big)} rows x {X.shape[1]} features: {dt:.2f} s")
    assert dt < 2.0


def test_save_load_identical_predictions(measured, tmp_path):
    X, costs = measured
    model = XGBCostModel(objective="rank:pairwise", num_rounds=20)
    model.fit_costs(X[:40], costs[:40])
    path = tmp_path / "model.npz"
    model.save(path)
    loaded = XGBCostModel.load(path)
    assert np.array_equal(model.predict(X), loaded.predict(X))
    assert loaded.params == model.params and loaded.num_rounds == 20
    # the training rows came along: updating the loaded model equals updating the original
    more = [MeasureResult(costs=[c]) for c in costs[40:48]]
    model.update(X[40:48], more)
    loaded.update(X[40:48], more)
    assert np.array_equal(model.predict(X), loaded.predict(X))
    XGBCostModel.load(path)  # and a model saved without data loads too
    model.save(tmp_path / "light.npz", include_data=False)
    light = XGBCostModel.load(tmp_path / "light.npz")
    assert np.array_equal(light.predict(X), model.predict(X))


def test_labels_normalized_per_workload():
    t = [10.0, 5.0, 0.0, 1.0, 0.5, float("nan"), 3.0]
    g = ["a", "a", "a", "b", "b", "b", "c"]
    assert np.allclose(normalize_by_group(t, g), [1.0, 0.5, 0.0, 1.0, 0.5, 0.0, 1.0])
    res = [MeasureResult(costs=[2.0, 2.0]), MeasureResult(error_code=ErrorCode.WRONG_ANSWER),
           MeasureResult(costs=[0.5])]
    assert np.allclose(throughputs_from_results(res, flops=8.0), [4.0, 0.0, 16.0])


def test_warm_start_from_other_workloads(measured, target):
    """A model trained only on other workloads' records ranks a new workload's candidates."""
    X, costs = measured
    op = matmul(96, 160, 64)
    cands = distinct_samples(MatmulTiles(op, parallel=False), 16, seed=9)
    Xn, cn = features_for(op, cands, target), measure(op, cands, target)
    model = XGBCostModel()
    # two "other workloads" with very different absolute speeds: only the ranking within each counts
    model.warm_start(X, np.concatenate([1 / costs[:28], 1000 / costs[28:]]),
                     groups=["mm128_a"] * 28 + ["mm128_b"] * 28)
    assert model.trained and model._hX.shape[0] == 56
    spearman, _ = rank_corr(model.predict(Xn), -cn)
    print(f"\nwarm-started model on an unseen workload: Spearman {spearman:.2f}")
    assert spearman > 0.5
    # own measurements add to the history instead of replacing it
    model.update(Xn[:8], [MeasureResult(costs=[c]) for c in cn[:8]], group="mm96")
    assert model._X.shape[0] == 8 and model._hX.shape[0] == 56
    # the history is bounded
    capped = XGBCostModel(max_history_rows=20).warm_start(X, 1 / costs, groups=["a", "b"] * 28)
    assert capped._hX.shape[0] <= 20



def test_transferred_model_is_trusted_as_far_as_it_ranks_the_first_batch(tmp_path):
    """Other workloads' records steer the search only as far as the warm-started model ranks the
    task's own first batch: history whose speeds run against this task's is set aside."""
    rng = np.random.default_rng(4)
    X_hist = rng.random((120, 6))
    X_own = rng.random((24, 6))
    speed_hist = 1.0 + X_hist[:, 0]
    for own_speed, trusted in ((1.0 + X_own[:, 0], True), (2.0 - X_own[:, 0], False)):
        model = XGBCostModel(num_rounds=20)
        model.warm_start(X_hist, speed_hist, groups=["other_a"] * 60 + ["other_b"] * 60)
        assert model.history_weight == 1.0
        model.update(X_own[:8], [MeasureResult(costs=[1 / v]) for v in own_speed[:8]], group="mine")
        corr = model.transfer_correlation["mine"]
        assert (corr > 0.5) if trusted else (corr < -0.5)
        assert model.history_weight == pytest.approx(max(corr, 0.0))
        # later batches do not re-judge the history
        model.update(X_own[8:16], [MeasureResult(costs=[1 / v]) for v in own_speed[8:16]], group="mine")
        assert list(model.transfer_correlation) == ["mine"]
        held_out, _ = rank_corr(model.predict(X_own[16:]), own_speed[16:])
        assert held_out > 0.5, f"the model ranks this task's candidates at Spearman {held_out:.2f}"
        model.save(tmp_path / "m.npz")
        assert XGBCostModel.load(tmp_path / "m.npz").history_weight == model.history_weight
    assert rank_correlation([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert rank_correlation([1, 1, 1], [1, 2, 3]) == 0.0


def test_a_model_saved_with_other_features_is_refused(measured, tmp_path, monkeypatch):
    """Cached feature rows and trees of another FEATURE_VERSION mean something else: not reused."""
    import tuner.features
    X, costs = measured
    model = XGBCostModel(num_rounds=5)
    model.fit_costs(X[:20], costs[:20])
    model.save(tmp_path / "m.npz")
    monkeypatch.setattr(tuner.features, "FEATURE_VERSION", tuner.features.FEATURE_VERSION + 1)
    with pytest.raises(ValueError, match="features of version"):
        XGBCostModel.load(tmp_path / "m.npz")
