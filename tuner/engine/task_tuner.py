"""One task's tuning as an object: `step()` measures one batch, `finish()` re-measures the best.

Records are the source of truth. A tuner starting on a task that already has records reloads
them: nothing measured before is measured again, the strategy learns from them, and they are
reported as resumed. `trials` counts new measurements of this run; inside a job (`job_id`) it
counts the job's own records, so a job that was interrupted and resumed still measures
`trials` candidates in all.

Every task measures the operator's default schedule once (the baseline). At the end the top
candidates (at most `top_k`, in proportion to the task's trials, and only those first measured
near or below the baseline: `TaskTuner.retime_plan`) are re-timed alternately with the
baseline over `retime_rounds` rounds (see `TaskTuner._retime`): the maximum of many noisy
measurements is biased upward, so those medians are what the records rank by, the speed-up over the default comes from one set of same-run
timings, and a candidate that is not faster than the default beyond the noise is not called a
speed-up (the default stays the best).

Builds are handed to the builder on a thread (build_ahead): the first search batch is picked
while the default builds, and a batch can be picked and built while the model retrains
(`_retrain_beside_builds`); nothing is timed while a build runs. The cost model's rows of the
workload are left next to the records at the end (model_cache), for the next run of the target.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import threading
import time
from collections import OrderedDict

from ..candidate import MeasureResult
from ..search import STRATEGIES, Budget, EarlyStopping, Strategy
from ..space import SearchSpace, default_candidate
from ..workload import Task
from .build_ahead import PendingBuild, for_builder
from .callbacks import BatchReport, Callbacks
from .model_cache import ModelCache, structure_of
from .options import TuningOptions, tuning_options
from .result import TuneResult

DEFAULT_STRATEGY = {"template": "model", "sketch": "evolutionary"}
MODEL_GUIDED = ("model", "evolutionary")


def make_space(kind: str, opdef, target) -> SearchSpace:
    if kind == "template":
        from ..space.template import TemplateSpace
        return TemplateSpace(opdef, None, target)
    if kind == "sketch":
        from ..space.sketch import SketchSpace
        return SketchSpace(opdef, target)
    raise ValueError(f"unknown space {kind!r}; use 'template' or 'sketch'")


# a retrain this long runs beside the next batch's builds (that batch picked before it, by a model
# that does not know the last batch yet): only a model of thousands of rows takes a second, and
# on a loaded 2-core host a plain retrain passed 0.2 s and the stale picks cost search quality
AHEAD_RETRAIN_S = 1.0
SLOW_CUTOFF = 1.5         # a search's candidate this many times slower than the best so far is timed briefly
SEARCH_MAX_REPEAT_MS = 250.0   # a search's timing samples a contender this long at most (per attempt)
FULL_EFFORT_TRIALS = 32   # a task expecting this many trials or more gets the full search effort per batch


def search_effort(name: str, expected_trials: int | None) -> dict:
    """A guided strategy's search effort per batch, sized so ranking costs a fraction of measuring
    the batch (about a hundred new candidates lowered and featurized, 2-10 ms each): the full effort
    for a task expecting FULL_EFFORT_TRIALS trials or more (or an unknown number), less in
    proportion for fewer. A model's 100 trials over 19-135 tasks give each one or two batches,
    and its cost model has seen little of the task: ResNet-18's search took a third of its tuning
    time at full effort."""
    full = {"model": dict(n_parallel=16, sa_iters=6),
            "evolutionary": dict(population_size=64, num_generations=2)}[name]
    if expected_trials is None or expected_trials >= FULL_EFFORT_TRIALS:
        return full
    share = max(expected_trials, 1) / FULL_EFFORT_TRIALS
    if name == "evolutionary":
        return dict(population_size=max(16, round(64 * share)), num_generations=1)
    return dict(n_parallel=max(4, round(16 * share)), sa_iters=4)


def make_strategy(name: str, space, opdef, target, seed: int, visited, cost_model=None, group: str = "current",
                  starting_points: bool = True, expected_trials: int | None = None):
    """`expected_trials`: the trials the task is likely to get (search_effort); None: unknown."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}")
    cls = STRATEGIES[name]
    if name in MODEL_GUIDED:
        return cls(space, opdef=opdef, target=target, cost_model=cost_model, rng=seed, visited=visited,
                   group=group, seeds=space.starting_points() if starting_points else (),
                   **search_effort(name, expected_trials))
    return cls(space, rng=seed, visited=visited)


class TaskTuner:
    """Space, strategy, cost model, records and budget of one task.

    `options` (TuningOptions, or keyword overrides of its fields) says what the run does.
    `builder`/`runner` are shared and owned by the caller. `cost_model` may be shared with other
    tasks (a TaskScheduler does that); its rows of this task are grouped under the workload key.
    `trials=None` means no trial limit of its own (a scheduler holds the budget; `expected_trials`,
    the task's share of it, then sizes the search effort per batch, as `trials` does otherwise).
    """

    def __init__(self, task: Task, store, options: TuningOptions | None = None, *, builder, runner, cost_model=None,
                 callbacks: Callbacks | None = None, expected_trials: int | None = None, **overrides):
        from compiler.target import resolve_target
        opts = self.options = tuning_options(options, overrides)
        space, strategy, trials, seconds = opts.space, opts.strategy, opts.trials, opts.seconds
        batch_size, seed, early_stopping, job_id = opts.batch_size, opts.seed, opts.early_stopping, opts.job_id
        top_k, retime_rounds, baseline, starting_points = opts.top_k, opts.retime_rounds, opts.baseline, opts.starting_points
        t_start = time.perf_counter()
        self.task, self.store = task, store
        self.builder, self.runner = builder, runner
        self._builds = for_builder(builder)   # builds run on their own thread, in order (build_ahead)
        # a batch picked and handed to the builder before its step: (candidates, PendingBuild).
        # Only a tuner that holds its own trial budget picks ahead (a scheduler's share of one
        # is decided batch by batch, so a batch picked ahead might never be measured)
        self._ahead: tuple | None = None
        self._pick_ahead = trials is not None
        self.batch_size, self.job_id = int(batch_size), job_id
        self.top_k, self.retime_rounds, self.baseline = int(top_k), int(retime_rounds), bool(baseline)
        self.callbacks = callbacks or Callbacks()
        self.opdef = task.workload.opdef()
        self.workload_key = self.opdef.workload_key()
        self.target = resolve_target(task.target)
        self.space = make_space(space, self.opdef, self.target)
        self.strategy_name = strategy or DEFAULT_STRATEGY[space]
        self._stop = threading.Event()
        self._kept_builds: dict = {}   # fingerprint -> BuildResult of the fastest candidates (the re-timing's)
        self._finished: TuneResult | None = None
        self._best_key = (True, math.inf)   # (timed in a slow window, cost) of the best so far: _consider_best
        self._baseline_done = not self.baseline
        self._baseline_run_seconds = 0.0   # what one timing of the default took (sizes the re-timing)
        self._baseline_marked = False      # the default's only timing came from a slow window
        self.exhausted = False
        # what the task's records tell a resumed run, bounded however many it holds: every
        # fingerprint (never measured twice), and the newest and fastest records (store.task_sample)
        # for the strategy and its cost model
        prior = store.task_sample(task)
        visited = store.measured_fingerprints(task) if prior else set()
        relevant = [r for r in prior if r.candidate.kind == self.space.kind]
        self.emulated = timings_kind(runner, prior)
        # the strategy (and its cost model) hears only of timings of the kind this run takes
        told = [r for r in relevant if not r.result.ok or r.result.emulated == self.emulated]
        resumed = store.count(task, kind=self.space.kind) if prior else 0
        self.result = TuneResult(task, resumed_trials=resumed, flops=self.opdef.flops)
        t0 = time.perf_counter()
        guided = self.strategy_name in MODEL_GUIDED
        # the cost model's rows kept between runs of this target, next to the records
        self.model_cache = ModelCache.for_store(store, task.target, self.emulated) if guided else None
        if cost_model is None and guided:
            cost_model = warm_cost_model(store, task.target, {self.workload_key}, [self.space], emulated=self.emulated,
                                         cache=self.model_cache)
        self.cost_model = cost_model
        model_seconds = time.perf_counter() - t0
        self.strategy = make_strategy(self.strategy_name, self.space, self.opdef, self.target, seed,
                                      visited=visited, cost_model=cost_model,
                                      group=self.workload_key, starting_points=starting_points,
                                      expected_trials=trials if expected_trials is None else expected_trials)
        if told:
            t1 = time.perf_counter()
            self.strategy.update([r.candidate for r in told], [r.result for r in told])
            model_seconds += time.perf_counter() - t1
        self.result.tuner_seconds += time.perf_counter() - t0
        for r in prior:            # the sample holds the task's fastest records
            if r.result.ok:   # a re-timed record ranks by its re-timing, which only unmarked rounds feed
                self._consider_best(r.candidate, r.result, r.cost, slow=r.result.slow_window and r.retimed_cost is None)
        if default_candidate(self.workload_key).fingerprint in visited:   # measured before (even if it failed): not again
            self._baseline_done = True
            baseline_rec = store.baseline_record(self.workload_key, task.target, task.device_key)
            if baseline_rec is not None:
                self.result.baseline_cost = baseline_rec.cost
                self._baseline_run_seconds = baseline_rec.result.run_seconds
                self._baseline_marked = bool(baseline_rec.result.slow_window) and baseline_rec.retimed_cost is None
                default_key = self._default_program_key()
                if default_key is not None:   # (a resumed run does not time the default's twin either)
                    self.strategy.know_program(default_key, baseline_rec.result)
        used = store.count(task, job_id=job_id, search_only=True) if job_id is not None else 0
        self.budget = Budget(trials, seconds, used_trials=used).start()
        self.stopper = EarlyStopping(early_stopping) if early_stopping else None
        self._t_start = t_start
        self.result.add_time("model", model_seconds)
        self.result.add_time("setup", time.perf_counter() - t_start - model_seconds)

    # ------------------------------------------------------------------ control
    def request_stop(self) -> None:
        """End the run after the current batch (safe from any thread or a callback)."""
        self._stop.set()

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    @property
    def done(self) -> bool:
        return (self._finished is not None or self._stop.is_set() or self.exhausted
                or self.budget.exhausted or not self.strategy.has_next())

    # ------------------------------------------------------------------ one batch
    def step(self, max_trials: int | None = None) -> BatchReport | None:
        """Measure one batch (at most `max_trials` candidates); None when the run is over.
        The first step measures the baseline, unless the records already hold it."""
        baseline = self.ensure_baseline()
        if baseline is not None:
            return baseline
        if self.done:
            return None
        n = self.budget.take(self.batch_size if max_trials is None else min(self.batch_size, max_trials))
        if n <= 0:
            return None
        batch, pending = self._take_ahead(n)
        if batch is None:
            batch = self._next_batch(n)
            if not batch:
                return None
            pending = self._builds.submit(self.task, batch)
        results = self._measure(batch, options=self._search_options(), pending=pending)
        t0 = time.perf_counter()
        ids = self.store.add_records(self.task, list(zip(batch, results)), job_id=self.job_id)
        self.result.add_time("records", time.perf_counter() - t0)
        retrain_later = self._retrain_beside_builds(len(batch))
        t0 = time.perf_counter()
        self.strategy.defer_retrain = retrain_later
        try:
            self.strategy.update(batch, results)
        finally:
            self.strategy.defer_retrain = False
        self._modelled(time.perf_counter() - t0)
        self.budget.consume(len(batch))
        self._account(batch, results)
        if self.stopper is not None and self.stopper.update(results):
            self.exhausted = self.result.exhausted = True
        self._pick_next_ahead()   # its builds run beside the retrain, the callbacks and the driver
        if retrain_later:
            t0 = time.perf_counter()
            self.strategy.retrain()
            self._modelled(time.perf_counter() - t0)
        report = BatchReport(self.task, tuple(batch), tuple(results), tuple(ids), self.result)
        self.callbacks.batch(report)
        self.callbacks.heartbeat(self)
        return report

    # ------------------------------------------------------------------ batches picked ahead
    def _next_batch(self, n: int) -> list:
        """The strategy's next batch (its time is the search's); marks the run exhausted when
        the strategy has nothing left. Candidates whose loop program was measured already are
        adopted by the strategy, not returned (search.base): the run's count of them is kept."""
        t0 = time.perf_counter()
        batch = self.strategy.next_batch(n)
        self._searched(time.perf_counter() - t0)
        self.result.adopted = getattr(self.strategy, "adopted", 0)
        if not batch:
            self.exhausted = self.result.exhausted = True
        return batch

    def _retrain_beside_builds(self, measuring: int) -> bool:
        """Whether this step's retrain runs after the next batch is picked, beside its builds:
        only where the next batch will be picked now and the model's last retrain took
        AHEAD_RETRAIN_S or more (a model warm-started with thousands of rows). A short retrain
        goes first, so the next batch is ranked by a model that knows this one; the batch picked
        before a long one is ranked by the model of the batches before, its evolution's parents
        already this batch's (the strategy is told the results first)."""
        model = getattr(self.strategy, "model", None)
        if model is None or not hasattr(self.strategy, "retrain") or not model.trained:
            return False
        return self._may_pick_ahead(after=measuring) and model.last_retrain_seconds >= AHEAD_RETRAIN_S

    def _may_pick_ahead(self, after: int = 0) -> bool:
        if not self._pick_ahead or self._ahead is not None or self._stop.is_set() or self.exhausted:
            return False
        left = self.budget.remaining_trials
        return left is None or left - after > 0

    def _pick_next_ahead(self) -> None:
        """Pick the next batch now and hand it to the builder, when this tuner will measure it."""
        if not self._may_pick_ahead() or self.done:
            return
        left = self.budget.remaining_trials
        batch = self._next_batch(self.batch_size if left is None else min(self.batch_size, left))
        if batch:
            self._ahead = (batch, self._builds.submit(self.task, batch))

    def _take_ahead(self, n: int) -> tuple:
        """(candidates, PendingBuild) picked ahead, at most `n` of them (the rest stay ahead,
        built); (None, None) when there are none."""
        if self._ahead is None:
            return None, None
        batch, pending = self._ahead
        self._ahead = None
        if len(batch) <= n:
            return batch, pending
        t0 = time.perf_counter()
        builds = pending.result()
        self.result.add_time("build", time.perf_counter() - t0)
        self.result.build_overlapped += pending.overlapped
        self._ahead = (batch[n:], PendingBuild.resolved(builds[n:]))
        return batch[:n], PendingBuild.resolved(builds[:n])

    def _drop_ahead(self) -> None:
        """A batch picked ahead that will not be measured: its builds are waited for (the
        builder's thread is busy until then) and discarded."""
        if self._ahead is not None:
            _, pending = self._ahead
            self._ahead = None
            t0 = time.perf_counter()
            try:
                pending.result()
            except Exception:  # noqa: BLE001 - discarded either way; the builder said why already
                pass
            self.result.add_time("build", time.perf_counter() - t0)

    def release(self) -> None:
        """Wait for builds this tuner handed to the builder ahead, so the caller may close the
        builder (finish() does this too; a driver that ends a run without finish() calls it)."""
        self._drop_ahead()

    def _modelled(self, seconds: float) -> None:
        self.result.tuner_seconds += seconds
        self.result.add_time("model", seconds)

    def _searched(self, seconds: float) -> None:
        self.result.tuner_seconds += seconds
        self.result.add_time("search", seconds)

    def _search_options(self):
        """The runner's measurement options as a search needs them: once anything was measured,
        with a slow cutoff at SLOW_CUTOFF times the best cost so far (the baseline's or a
        candidate's), so a candidate far behind is timed in a few samples, not ten (most of a
        short run's time on a large compute went to timing such candidates), and sampling of a
        contender capped at SEARCH_MAX_REPEAT_MS: a search ranks candidates a few per cent apart,
        and the end-of-run re-timing is where the precision that picks the best is spent (a
        contender's full second of samples was half a 64-trial run's measuring). None before
        anything was measured or where the user set a cutoff (kept)."""
        options = self.runner.options
        best = min(self.result.best_cost, self.result.baseline_cost)
        if not math.isfinite(best) or best <= 0 or options.slow_cutoff_s:
            return None
        return dataclasses.replace(options, slow_cutoff_s=SLOW_CUTOFF * best,
                                   max_repeat_ms=min(options.max_repeat_ms, SEARCH_MAX_REPEAT_MS))

    def _measure(self, candidates, phase: str | None = None, options=None, pending: PendingBuild | None = None
                 ) -> list[MeasureResult]:
        """Build and time `candidates` (with `options` instead of the runner's own); their time
        counts as build and measure, or all as `phase`; `pending`: their builds, handed to the
        builder before (only the wait for them counts: the rest ran beside other work and is
        `build_overlapped`). Nothing is timed while a build this tuner handed over runs: the
        timing waits for the batch's builds and for those of a batch picked ahead (other
        processes' builds wait for it: compiler.host_lock). The builds of the fastest are kept
        for the re-timing (`_keep_builds`)."""
        t0 = time.perf_counter()
        if pending is None:
            pending = self._builds.submit(self.task, candidates)
        builds = pending.result()
        self.result.build_overlapped += pending.overlapped
        if self._ahead is not None:   # a batch picked ahead is built before anything is timed
            self._ahead[1].result()
        t1 = time.perf_counter()
        results = self._count(self.runner.run(self.task, builds, options))
        self._keep_builds(candidates, builds, results)
        t2 = time.perf_counter()
        if phase is None:
            self.result.add_time("build", t1 - t0)
            self.result.add_time("measure", t2 - t1)
        else:
            self.result.add_time(phase, t2 - t0)
        return results

    def _keep_builds(self, candidates, builds, results) -> None:
        """Keep the kernels of the fastest candidates measured so far (top_k of them, and the
        default's), so the re-timing at the end does not build them again."""
        if self.top_k <= 0:
            return
        for cand, br, res in zip(candidates, builds, results):
            if res.ok and br.kernel_bytes is not None:
                self._kept_builds[cand.fingerprint] = (res.cost, cand.kind == "default", br)
        if len(self._kept_builds) > self.top_k + 1:
            ranked = sorted(self._kept_builds.items(), key=lambda kv: (not kv[1][1], kv[1][0]))
            self._kept_builds = dict(ranked[:self.top_k + 1])

    def _builds_of(self, candidates) -> list:
        """BuildResults of `candidates`: kept ones as they are, the rest built now."""
        missing = [c for c in candidates if c.fingerprint not in self._kept_builds]
        built = dict(zip([c.fingerprint for c in missing], self._builds.build(self.task, missing) if missing else []))
        return [self._kept_builds[c.fingerprint][2] if c.fingerprint in self._kept_builds else built[c.fingerprint]
                for c in candidates]

    def _count(self, results: list) -> list:
        """Note how many valid timings the run took and how many of them were disturbed."""
        valid = [r for r in results if r.ok]
        self.result.timings += len(valid)
        self.result.disturbed_timings += sum(r.disturbed for r in valid)
        return results

    def ensure_baseline(self) -> BatchReport | None:
        """Measure the default schedule if this task has no record of it (None otherwise)."""
        if self._baseline_done or self._stop.is_set():
            return None
        self._baseline_done = True
        cand = default_candidate(self.workload_key)
        pending = self._builds.submit(self.task, [cand])
        default_key = self._default_program_key()
        if default_key is not None:   # a starting point that lowers to the default is not measured again
            self.strategy.visited_programs.setdefault(default_key, None)
        self._pick_next_ahead()   # the first batch is picked while the default builds
        (res,) = self._measure([cand], phase="baseline", pending=pending)
        if default_key is not None:
            self.strategy.know_program(default_key, res)
        t0 = time.perf_counter()
        ids = self.store.add_records(self.task, [(cand, res)], job_id=self.job_id)
        self.result.add_time("baseline", time.perf_counter() - t0)
        if res.ok:
            self.result.baseline_cost = res.cost
            self._baseline_run_seconds = res.run_seconds
            self._baseline_marked = bool(res.slow_window)
            self._consider_best(cand, res)
        self.strategy.visited.add(cand.fingerprint)
        report = BatchReport(self.task, (cand,), (res,), tuple(ids), self.result, kind="baseline")
        self.callbacks.batch(report)
        self.callbacks.heartbeat(self)
        return report

    def _default_program_key(self) -> str | None:
        """The default schedule's program key, where the strategy compares programs."""
        if type(self.strategy).program_key is Strategy.program_key:
            return None
        try:
            from compiler.lower import lower

            from ..program_key import program_key
            from ..space import instantiate
            sched, args = instantiate(self.opdef, default_candidate(self.workload_key), self.target)
            return program_key(lower(sched, args))
        except Exception:  # noqa: BLE001 - a default that does not lower is measured as it is
            return None

    def _account(self, batch, results):
        r = self.result
        for cand, res in zip(batch, results):
            r.trials += 1
            if not res.ok:
                r.errors += 1
            else:
                self._consider_best(cand, res)
            r.history.append((r.resumed_trials + r.trials, res.cost))

    def _consider_best(self, cand, res, cost: float | None = None, slow: bool | None = None) -> None:
        """Take (cand, res) as the best so far when the records store would rank it first: a result
        timed in a slow window (MeasureResult.slow_window) only ahead of other such results, an
        unmarked one by its cost (store._best_order), so the run's best is the record apply-best
        builds."""
        cost = res.cost if cost is None else cost
        key = (bool(res.slow_window if slow is None else slow), cost)
        if key < self._best_key:
            self._best_key = key
            self.result.best_cost, self.result.best_candidate = cost, cand

    # ------------------------------------------------------------------ the end
    def finish(self) -> TuneResult:
        """Re-measure the best candidates and the baseline (unless stopped), store those times,
        and return the result. Idempotent."""
        if self._finished is not None:
            return self._finished
        r = self.result
        r.stopped = self._stop.is_set()
        self._drop_ahead()
        self._save_model_rows()
        if not r.stopped and self.top_k > 0 and self.retime_rounds > 0:
            t0 = time.perf_counter()
            self._retime()
            if r.retimed:   # (asking which candidates came near the default is no re-timing)
                r.add_time("retime", time.perf_counter() - t0)
        r.tune_seconds = time.perf_counter() - self._t_start
        self._finished = r
        return r

    def _save_model_rows(self) -> None:
        """Leave this workload's rows in the target's model cache (model_cache), for the next
        run of the target to start from; the features are the strategy's own (no lowering)."""
        cache, strategy = self.model_cache, self.strategy
        if cache is None or not hasattr(strategy, "features"):
            return
        t0 = time.perf_counter()
        try:
            from ..cost_model import throughputs_from_results
            seen, cands, results = set(), [], []
            for c, res in strategy.history:   # adopted twins share their program's row: one row each
                key = strategy.program_key(c) or c.fingerprint
                if c.kind == self.space.kind and key not in seen:
                    seen.add(key)
                    cands.append(c)
                    results.append(res)
            if cands:
                cache.save(self.workload_key, strategy.features(cands), throughputs_from_results(results, 1.0),
                           [structure_of(c) for c in cands])
        except OSError as e:   # the rows are a convenience: a read-only or full disk ends no run
            import logging
            logging.getLogger(__name__).warning("cost model rows not saved to %s: %s", cache.path, e)
        self._modelled(time.perf_counter() - t0)

    def retime_plan(self) -> tuple[list, bool]:
        """(records to re-time, whether one timing of the default per round serves them all).

        What the end of the run re-times against the default, in proportion to what was found:
        the fastest records, at most `top_k` and one per RETIME_PER_TRIALS trials of this task,
        within RETIME_NEAR_BEST of the fastest, and with a baseline only those first measured
        within RETIME_WITHIN of it (one that measured slower than the default by more than the
        noise will not beat it in a re-timing; timing it again cost short runs several times what
        their trials cost). The default is timed before each candidate so a slow minute of a shared machine hits both
        sides of each comparison; when every candidate first measured RETIME_FAR_AHEAD times
        faster than it, no such minute turns the comparison, and one default timing per round
        serves all of them. The re-timing may take RETIME_SHARE of what this run's trials took to
        build and measure: it keeps the fastest candidates whose rounds of timings fit in that
        (the fastest always), each timing as long as `_retiming_seconds` expects."""
        trials = self.result.trials + self.result.resumed_trials
        k = min(self.top_k, max(1, trials // RETIME_PER_TRIALS))
        records = [rec for rec in self.store.best(self.workload_key, self.task.target, k=k + 1,
                                                  device_key=self.task.device_key)
                   if rec.candidate.kind != "default"][:k]
        base_cost = self.result.baseline_cost
        with_base = self.baseline and math.isfinite(base_cost)
        if with_base:
            records = [rec for rec in records if rec.cost <= base_cost * (1 + RETIME_WITHIN)]
        if records:   # one that measured well behind the fastest will not overtake it in a re-timing
            records = [rec for rec in records if rec.cost <= records[0].cost * (1 + RETIME_NEAR_BEST)]
        shared = with_base and all(rec.cost * RETIME_FAR_AHEAD <= base_cost for rec in records)
        spent = self.result.phase_seconds
        budget = RETIME_SHARE * (spent.get("build", 0.0) + spent.get("measure", 0.0))
        base_s = self._retiming_seconds(self._baseline_run_seconds) if with_base else 0.0
        kept, cand_s = records[:1], 0.0
        for n, rec in enumerate(records):
            cand_s += self._retiming_seconds(rec.result.run_seconds)
            defaults = (1 if shared else n + 1) * base_s
            if n and self.retime_rounds * (cand_s + defaults) > budget:
                break
            kept = records[:n + 1]
        return kept, shared

    def _retiming_seconds(self, first_run_seconds: float) -> float:
        """How long one re-timing of a kernel is expected to take, from its first timing's
        duration: as long, where that timing ended before the search's sampling cap (its samples
        had settled); else up to the runner's own cap, which a re-timing samples to."""
        if first_run_seconds < 0.8 * SEARCH_MAX_REPEAT_MS / 1000.0:
            return first_run_seconds
        return max(first_run_seconds, self.runner.options.max_repeat_ms / 1000.0)

    def _retime(self):
        """Re-time `retime_plan()`'s candidates against the default schedule, alternately.

        Each of `retime_rounds` rounds times D c1 D c2 ... D ck (D the default; the candidates'
        order reversed every other round), so every candidate is timed right after the default,
        and a slow minute of a shared machine hits both sides of a comparison; or D c1 c2 ... ck
        when the candidates are all far ahead of the default (retime_plan). The default's figure
        is the median of all its timings; a candidate's is that over the median of its paired
        ratios (the round's default timing before it / its own): its time in the default's
        regime, so its speed-up over the default is the paired figure, as the truth it is held
        to is (bench/measure_trust.py). Two separate medians can take one side from each of a
        host's speed regimes (a VM's two vCPUs run on one core for seconds at a time: 1.6-1.9x);
        a pair is timed back to back in one. A candidate with no paired timing keeps the median
        of its own rounds. A candidate *beats the default* only when the median of its paired ratios (the round's
        default timing before it / its own) exceeds 1 by more than the noise: MIN_GAIN, or half the
        range of those ratios when they disagree more. The best is the fastest candidate that
        beats the default, else the default itself (and the store ranks the others after it)."""
        records, shared = self.retime_plan()
        cands = [rec.candidate for rec in records]
        base = default_candidate(self.workload_key)
        if not cands and not (self.baseline and self._baseline_marked):
            return   # nothing came near the default: its one timing stands, and it stays the best
        # (a default timed only in a slow window is timed again alone: marked, it would rank after
        # every candidate, however much slower they are)
        builds = self._builds_of(cands + ([base] if self.baseline else []))
        cand_builds, base_build = builds[:len(cands)], (builds[-1] if self.baseline else None)
        timed: dict = {c.fingerprint: [] for c in cands}
        ratios: dict = {c.fingerprint: [] for c in cands}
        base_costs: list = []
        for rnd in range(self.retime_rounds):
            if self._stop.is_set():   # a stop during the re-measurement: keep what was measured
                break
            order = list(range(len(cands)))[:: -1 if rnd % 2 else 1]
            seq: list = [] if cands else [base_build]
            who: list = [] if cands else [None]
            for n, i in enumerate(order):
                if base_build is not None and (n == 0 or not shared):
                    seq.append(base_build)
                    who.append(None)
                seq.append(cand_builds[i])
                who.append(cands[i])
            results = self._count(self.runner.run(self.task, seq))
            last_base = math.nan
            for c, res in zip(who, results):
                # a round timed by a worker its calibration found slow (and no healthy one could
                # take again) is another speed regime: none of its timings is compared or kept
                cost = res.cost if res.ok and not res.slow_window else math.nan
                if c is None:
                    last_base = cost
                    if math.isfinite(cost):
                        base_costs.append(cost)
                elif math.isfinite(cost):
                    timed[c.fingerprint].append(cost)
                    if math.isfinite(last_base):
                        ratios[c.fingerprint].append(last_base / cost)
            self.callbacks.batch(BatchReport(self.task, tuple(base if c is None else c for c in who), tuple(results), (),
                                             self.result, kind="retime"))
            self.callbacks.heartbeat(self)
        costs = {fp: statistics.median(v) for fp, v in timed.items() if v}
        spreads = {fp: (max(v) - min(v)) / statistics.median(v) for fp, v in timed.items() if v}
        beats = {fp: beats_default(ratios[fp]) for fp in costs} if base_costs else {}
        if base_costs:
            base_cost = statistics.median(base_costs)
            for fp in costs:
                if ratios[fp]:
                    costs[fp] = base_cost / statistics.median(ratios[fp])
            costs[base.fingerprint] = base_cost
            spreads[base.fingerprint] = (max(base_costs) - min(base_costs)) / costs[base.fingerprint]
        if not costs:
            return
        self.store.set_retimed(self.task, costs, spreads, beats)
        r = self.result
        r.retimed = costs
        if base.fingerprint in costs:
            r.baseline_cost = costs[base.fingerprint]
        winners = [fp for fp in costs if fp != base.fingerprint and beats.get(fp, True)]   # no default timed: all
        if winners:
            best_fp = min(winners, key=costs.__getitem__)
            r.best_cost = costs[best_fp]
            r.best_candidate = next(c for c in cands if c.fingerprint == best_fp)
        elif base.fingerprint in costs:
            r.best_cost, r.best_candidate = costs[base.fingerprint], base


MIN_GAIN = 0.01   # a re-timed speed-up smaller than this is noise, however consistent
RETIME_WITHIN = 0.05   # candidates first measured more than this slower than the default are not re-timed
RETIME_PER_TRIALS = 4  # at most one re-timed candidate per this many trials of the task
RETIME_NEAR_BEST = 0.15  # nor those first measured more than this slower than the fastest candidate
RETIME_FAR_AHEAD = 1.5   # candidates all this many times faster than the default share its timing per round
RETIME_SHARE = 0.25      # the re-timing's estimated seconds at most this share of the trials' build + measure


def beats_default(ratios: list) -> bool:
    """Whether paired ratios (default / candidate, one per round) show the candidate faster than
    the default beyond the noise: their median exceeds 1 by more than MIN_GAIN and by more than
    half their range."""
    if not ratios:
        return False
    med = statistics.median(ratios)
    noise = max(MIN_GAIN, (max(ratios) - min(ratios)) / 2)
    return med - 1.0 > noise


def timings_kind(runner, prior: list) -> bool:
    """Whether this run's timings are emulated: as the runner says (a LocalRunner knows its host,
    an RPCRunner asks the tracker about the key's agents), else as the newest timed record of the
    task says, else native. The cost model itself also refuses to mix the two kinds."""
    ask = getattr(runner, "timings_emulated", None)
    said = ask() if callable(ask) else None
    if said is not None:
        return bool(said)
    timed = [r for r in prior if r.result.ok]
    return bool(timed[-1].result.emulated) if timed else False


# (target, workload key, candidate fingerprint) -> feature row of a record a warm start used.
# Every task's warm start featurizes the same history (each record lowered: 2-10 ms, seconds for
# the 2000-row limit); a process that tunes several tasks (a model, a job worker) pays it once.
MAX_WARM_ROWS = 8192
_WARM_ROWS: OrderedDict = OrderedDict()
_WARM_ROWS_LOCK = threading.Lock()


def _history_features(opdef, target: str, key: str, recs: list):
    """Feature rows of one workload's records, remembered across warm starts (NaN rows where a
    candidate does not instantiate, as features_for gives them); None when they cannot be made."""
    import numpy as np

    from ..features import NUM_FEATURES, features_for
    from ..space import SpaceError

    ids = [(target, key, r.candidate.fingerprint) for r in recs]
    X = np.empty((len(recs), NUM_FEATURES))
    missing = []
    with _WARM_ROWS_LOCK:
        for j, i in enumerate(ids):
            row = _WARM_ROWS.get(i)
            if row is None:
                missing.append(j)
            else:
                X[j] = row
    if missing:
        try:
            X[missing] = features_for(opdef, [recs[j].candidate for j in missing], target)
        except SpaceError:
            return None
        with _WARM_ROWS_LOCK:
            for j in missing:
                _WARM_ROWS[ids[j]] = X[j].copy()
            while len(_WARM_ROWS) > MAX_WARM_ROWS:
                _WARM_ROWS.popitem(last=False)
    return X


def warm_cost_model(store, target: str, exclude_keys: set, spaces: list, limit: int = 2000, model=None,
                    emulated: bool = False, cache: ModelCache | None = None):
    """A cost model (`model`, or a new one) pre-trained on other workloads' records for this
    target whose candidates have the structure of one of `spaces` (same template or sketches)
    and whose timings are of the kind `emulated` says; None if there are none. `cache`: the
    target's kept rows (model_cache): the workloads it holds come from it, not lowered again."""
    import numpy as np

    from ..cost_model import XGBCostModel, throughputs_from_results

    cached = cache.rows(spaces, exclude_keys) if cache is not None else None
    covered = set(cached.groups.tolist()) if cached is not None else set()
    structures = [st for st in (sp.structure() for sp in spaces) if st is not None]
    others = [r for r in store.history_of_structure(target, structures, exclude_keys, limit=limit)
              if r.workload_key not in covered and r.result.emulated == emulated
              and any(sp.same_structure(r.candidate) for sp in spaces)]
    if not others and cached is None:
        return None
    feats, thr, groups = [], [], []
    if cached is not None:
        feats.append(cached.X.astype(np.float64))
        thr.append(cached.y)
        groups.extend(cached.groups.tolist())
    by_key: dict = {}
    for r in others:
        by_key.setdefault(r.workload_key, []).append(r)
    for key, recs in by_key.items():
        try:
            opdef = recs[0].workload.opdef()
        except Exception:  # noqa: BLE001 - a custom workload not registered here: skip it
            continue
        X = _history_features(opdef, target, key, recs)
        if X is None:
            continue
        feats.append(X)
        thr.append(throughputs_from_results([r.result for r in recs], opdef.flops))
        groups.extend([key] * len(recs))
    if not feats:
        return None
    model = model if model is not None else XGBCostModel()
    model.warm_start(np.concatenate(feats), np.concatenate(thr), groups, emulated=emulated)
    return model
