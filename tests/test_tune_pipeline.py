"""The search loop's engineering: one build and one timing per loop program, builds that run
beside the tuner's one-core work but never beside a timing, and the cost model's rows kept next
to the records between runs of a target.

The builder and the runner are fakes that log when they run (no LLVM, no measuring worker), so
the order of events is what is tested; the spaces, strategies, cost model and store are real.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from compiler.lower import lower
from tuner.candidate import Candidate, MeasureResult
from tuner.engine import TaskTuner, task_tuner
from tuner.engine.model_cache import KEEP_ROWS_ENV, ModelCache, structure_of
from tuner.measure.builder import BuildResult
from tuner.measure.runner import Runner
from tuner.program_key import program_key
from tuner.records import open_store
from tuner.search import RandomSearch
from tuner.space import default_candidate, instantiate
from tuner.space.base import SearchSpace
from tuner.workload import Task, Workload


def _cost(fp: str) -> float:
    return 1e-4 * (1 + int(fp[:6], 16) % 997 / 100)


class LoggingBuilder:
    """Builds nothing; logs ('build', start, end, fingerprints)."""

    def __init__(self, log):
        self.log = log

    def build(self, task, candidates):
        t0 = time.perf_counter()
        time.sleep(0.01)
        out = [BuildResult(kernel_bytes=b"kernel", reference_bytes=b"ref", candidate=c) for c in candidates]
        self.log.append(("build", t0, time.perf_counter(), [c.fingerprint for c in candidates]))
        return out


class LoggingRunner(Runner):
    """Times nothing: a cost from each fingerprint; logs ('run', start, end, fingerprints)."""

    def __init__(self, log):
        self.log = log

    def run(self, task, build_results, options=None):
        t0 = time.perf_counter()
        time.sleep(0.005)
        out = [MeasureResult(costs=[_cost(b.candidate.fingerprint)], median=_cost(b.candidate.fingerprint))
               for b in build_results]
        self.log.append(("run", t0, time.perf_counter(), [b.candidate.fingerprint for b in build_results]))
        return out


def _task(m=24, n=20, k=16):
    return Task.create(Workload("matmul", dict(M=m, N=n, K=k)))


def _tuner(tmp_path, log, task=None, db="r.db", **options):
    store = open_store(f"sqlite:///{tmp_path / db}")
    opts = dict(space="sketch", strategy="evolutionary", trials=16, batch_size=4, top_k=0, seed=3)
    opts.update(options)
    return TaskTuner(task or _task(), store, builder=LoggingBuilder(log), runner=LoggingRunner(log), **opts)


def _log_retrains(tuner, log, pause=0.0):
    model = tuner.strategy.model
    real = model._retrain

    def logged():
        t0 = time.perf_counter()
        time.sleep(pause)
        real()
        log.append(("retrain", t0, time.perf_counter(), []))
    model._retrain = logged


def _run(tuner):
    while tuner.step() is not None:
        pass
    return tuner.finish()


# ----------------------------------------------------------------------------- builds beside the tuner

def test_no_kernel_is_timed_while_a_build_runs_and_a_long_retrain_runs_beside_the_next_builds(tmp_path, monkeypatch):
    monkeypatch.setattr(task_tuner, "AHEAD_RETRAIN_S", 0.0)   # every retrain counts as long
    log: list = []
    tuner = _tuner(tmp_path, log)
    _log_retrains(tuner, log, pause=0.05)
    res = _run(tuner)
    builds = [e for e in log if e[0] == "build"]
    runs = [e for e in log if e[0] == "run"]
    assert len(runs) == 1 + 16 // 4 and res.trials == 16
    for _, r0, r1, fps in runs:
        # every kernel of a batch was built before its timing began, and no build ran during it
        assert all(any(fp in b[3] and b[2] <= r0 for b in builds) for fp in fps)
        assert not [b for b in builds if b[1] < r1 and b[2] > r0]
    # the next batch built while the model retrained on the last one
    retrains = [e for e in log if e[0] == "retrain"]
    assert any(b[1] < r[2] and b[2] > r[1] for b in builds for r in retrains)
    assert res.build_overlapped > 0 and res.phase_seconds.get("model", 0) > 0


def test_a_short_retrain_goes_before_the_next_batch_is_picked(tmp_path):
    log: list = []
    tuner = _tuner(tmp_path, log)
    _log_retrains(tuner, log)
    _run(tuner)
    events = [e for e in log if e[0] in ("run", "retrain", "build")]
    search_runs = [i for i, e in enumerate(events) if e[0] == "run"][1:-1]   # not the baseline, not the last
    for i in search_runs:
        after = events[i + 1:]
        first_build = next(j for j, e in enumerate(after) if e[0] == "build")
        assert any(e[0] == "retrain" for e in after[:first_build])   # the model knew this batch


def test_the_first_batch_is_picked_and_built_while_the_default_is_built(tmp_path):
    log: list = []
    tuner = _tuner(tmp_path, log)
    tuner.step()                               # the baseline
    builds = [e for e in log if e[0] == "build"]
    (run,) = [e for e in log if e[0] == "run"]
    assert len(builds) == 2 and builds[1][2] <= run[1]   # batch 1 was built before the default's timing
    assert tuner._ahead is not None and len(tuner._ahead[0]) == 4
    tuner.step()
    assert [e for e in log if e[0] == "run"][1][3] == builds[1][3]   # and it is what step 2 timed
    tuner.finish()


def test_a_stopped_run_waits_for_its_builds_ahead(tmp_path):
    log: list = []
    tuner = _tuner(tmp_path, log)
    tuner.step()
    tuner.step()
    assert tuner._ahead is not None
    tuner.request_stop()
    assert tuner.step() is None
    tuner.finish()
    assert tuner._ahead is None and len([e for e in log if e[0] == "run"]) == 2


# ----------------------------------------------------------------------------- one program, one timing

class TwinSpace(SearchSpace):
    """20 candidates, lowered in pairs to one program: candidate i is program i // 2."""

    kind = "trace"

    @property
    def enumerable(self):
        return True

    def __len__(self):
        return 20

    def get(self, index):
        return Candidate("trace", {"i": int(index)})

    def sample(self, rng):
        return self.get(int(rng.integers(20)))

    def mutate(self, cand, rng):
        return self.sample(rng)

    def schedule(self, opdef, cand):
        raise NotImplementedError


class KeyedRandom(RandomSearch):
    def program_key(self, cand):
        return f"p{cand.payload['i'] // 2}"


def test_a_twin_is_never_proposed_and_takes_its_programs_result():
    st = KeyedRandom(TwinSpace(), rng=0)
    proposed = []
    while True:
        batch = st.next_batch(3)
        if not batch:
            break
        proposed += batch
        st.update(batch, [MeasureResult(costs=[1.0 + c.payload["i"]], median=1.0 + c.payload["i"]) for c in batch])
    programs = [c.payload["i"] // 2 for c in proposed]
    assert sorted(programs) == list(range(10))                    # one candidate per program
    assert st.adopted == 10 and len(st.history) == 20             # the twins joined the history...
    result_of = {c.payload["i"] // 2: r for c, r in st.history if c in proposed}
    for c, r in st.history:
        assert r is result_of[c.payload["i"] // 2]                # ...with their program's result


def test_a_run_times_each_loop_program_once_and_not_the_defaults_again(tmp_path):
    log: list = []
    tuner = _tuner(tmp_path, log, trials=24)
    res = _run(tuner)
    timed = [fp for e in log if e[0] == "run" for fp in e[3]]
    assert len(timed) == len(set(timed)) == 1 + res.trials
    by_fp = {c.fingerprint: c for c, _ in tuner.strategy.history}
    opdef, target = tuner.opdef, tuner.target
    keys = [program_key(lower(*instantiate(opdef, by_fp[fp], target))) for fp in timed[1:]]
    default = program_key(lower(*instantiate(opdef, default_candidate(tuner.workload_key), target)))
    assert len(set(keys)) == len(keys) and default not in keys
    assert res.adopted == tuner.strategy.adopted
    # a resumed run knows the programs of the records and of the default, and times neither again
    log.clear()
    again = _tuner(tmp_path, log, trials=8, seed=4)
    _run(again)
    later = [fp for e in log if e[0] == "run" for fp in e[3]]
    by_fp.update({c.fingerprint: c for c, _ in again.strategy.history})
    more = [program_key(lower(*instantiate(opdef, by_fp[fp], target))) for fp in later]
    assert len(more) == 8 and not set(more) & (set(keys) | {default}) and len(set(more)) == 8


def test_program_key_ignores_names_and_sees_what_the_kernel_does():
    import compiler as C
    from compiler.schedule import create_schedule

    def func(split, name="A"):
        A = C.placeholder((64, 32), "float32", name)
        k = C.reduce_axis(32, "k")
        out = C.compute((64,), lambda i: C.sum(A[i, k] * 2.0, axis=k), name="rowsum")
        s = create_schedule(out)
        if split:
            s[out].split(s[out].op.axis[0], factor=split)
        return lower(s, [A, out])
    assert program_key(func(8)) == program_key(func(8, name="B"))
    assert len({program_key(func(None)), program_key(func(8)), program_key(func(16))}) == 3


# ----------------------------------------------------------------------------- the model kept between runs

def test_the_next_run_of_a_target_starts_from_the_kept_rows_without_lowering_them(tmp_path, monkeypatch):
    monkeypatch.setenv(KEEP_ROWS_ENV, "1")
    log: list = []
    first = _tuner(tmp_path, log, trials=12)
    _run(first)
    cache = ModelCache.for_store(first.store, first.task.target)
    assert cache.path.parent == tmp_path / "r.db.models" and cache.path.exists()
    rows = cache.load()
    assert set(rows.groups) == {first.workload_key} and len(rows) == 12

    def no_lowering(*a, **k):
        raise AssertionError("the kept workload's records were lowered again")
    monkeypatch.setattr(task_tuner, "_history_features", no_lowering)
    second = _tuner(tmp_path, log, task=_task(32, 24, 16), trials=8)
    assert second.strategy.model.trained                         # model-guided from the first batch
    assert first.workload_key in set(second.strategy.model._hg)
    _run(second)
    assert set(cache.load().groups) == {first.workload_key, second.workload_key}
    assert second.result.phase_seconds.get("model", 0) > 0


def test_kept_rows_are_chosen_by_structure_and_replaced_per_workload(tmp_path):
    cache = ModelCache(tmp_path / "m.npz")
    X = np.arange(12, dtype=np.float32).reshape(4, 3)
    cache.save("w1", X, [1.0, 2.0, 4.0, 0.0], ["trace:a", "trace:a", "trace:b", "trace:a"])
    cache.save("w2", X[:2], [1.0, 3.0], ["config:t", "config:t"])
    cache.save("w1", X[:2], [5.0, 10.0], ["trace:a", "trace:a"])      # w1 again: its rows replaced

    class Sp:
        def __init__(self, st):
            self.st = st

        def structure(self):
            return self.st
    rows = cache.load()
    assert sorted(rows.groups.tolist()) == ["w1", "w1", "w2", "w2"]
    picked = cache.rows([Sp(("trace", "sketch", frozenset({"a"})))])
    assert picked.groups.tolist() == ["w1", "w1"] and picked.y.tolist() == [0.5, 1.0]
    assert cache.rows([Sp(("trace", "sketch", frozenset({"a"})))], exclude_keys={"w1"}) is None
    assert structure_of(Candidate("trace", {"sketch": "a", "steps": []})) == "trace:a"


def test_rows_of_other_features_are_not_used(tmp_path, monkeypatch):
    import tuner.features as features
    cache = ModelCache(tmp_path / "m.npz")
    cache.save("w1", np.ones((2, 3), dtype=np.float32), [1.0, 2.0], ["trace:a", "trace:a"])
    monkeypatch.setattr(features, "FEATURE_VERSION", features.FEATURE_VERSION + 1)
    assert cache.load() is None


def test_build_ahead_keeps_one_order_per_builder():
    from tuner.engine.build_ahead import for_builder
    order, lock = [], threading.Lock()

    class Slow:
        def build(self, task, cands):
            with lock:
                order.append(("start", cands[0]))
            time.sleep(0.02)
            with lock:
                order.append(("end", cands[0]))
            return list(cands)
    b = Slow()
    ahead = for_builder(b)
    assert for_builder(b) is ahead
    first, second = ahead.submit(None, ["a"]), ahead.submit(None, ["b"])
    assert ahead.build(None, ["c"]) == ["c"] and first.result() == ["a"] and second.result() == ["b"]
    assert order == [("start", "a"), ("end", "a"), ("start", "b"), ("end", "b"), ("start", "c"), ("end", "c")]
    assert first.seconds > 0.015


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
