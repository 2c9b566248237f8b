"""Several tasks under one trial budget: which task gets the next batch.

- "round-robin": every live task in turn.
- "gradient": the rule of Ansor's task scheduler. The objective is f = Σ w_i·g_i, the weighted
  sum of the tasks' best latencies g_i. After a warm-up round (every task once), the next batch
  goes to the task whose estimated ∂f/∂t_i (t_i: batches given to task i) is the most negative:

      ∂f/∂t_i ≈ w_i · ( α · (g_i(t_i) − g_i(t_i − Δ)) / Δ
                        + (1 − α) · (min(g_i − g_i / t_i, β · C_i / max_{k∈N(i)} V_k) − g_i) )

  the first term is the recent improvement over a backward window of Δ batches, the second an
  optimistic forward guess: either the usual 1/t_i improvement, or reaching 1/β of the best
  throughput V_k (flops/s) of the similar tasks N(i) (same operator tag and flop class, C_i the
  task's flops). α = 0.2, β = 2, Δ = 3. With probability ε (0.05) a random live task is chosen.
  Ties (all gradients equal) are broken at random.

A task whose step measures nothing new (its space is exhausted, early stopping) is dropped.
Every task tuner shares one cost model (rows grouped by workload), built by the caller.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .callbacks import Callbacks
from .options import SCHEDULERS


@dataclass
class SchedulerResult:
    results: list                       # TuneResult per task, in the order given
    weights: list
    allocations: list = field(default_factory=list)  # task index of every search batch, in order
    trials: int = 0
    seconds: float = 0.0
    stopped: bool = False

    @property
    def weighted_latency(self) -> float:
        """Σ w_i · best cost_i in seconds (inf while a task has no valid measurement)."""
        return sum(w * r.best_cost for w, r in zip(self.weights, self.results))


class TaskScheduler:
    """Drive `tuners` (TaskTuners created with trials=None) until `trials` new measurements."""

    def __init__(self, tuners: list, weights=None, scheduler: str = "gradient", trials: int = 64,
                 seconds: float | None = None, seed: int = 0, alpha: float = 0.2, beta: float = 2.0,
                 backward_window: int = 3, eps: float = 0.05, callbacks: Callbacks | None = None,
                 used_trials: int = 0):
        """`used_trials`: measurements a resumed job already made; they count against `trials`."""
        weights = check_arguments(len(tuners), weights, scheduler, trials)
        self.tuners, self.weights, self.scheduler = list(tuners), weights, scheduler
        self.trials, self.seconds = max(int(trials) - int(used_trials), 0), seconds
        self.alpha, self.beta, self.window, self.eps = alpha, beta, int(backward_window), eps
        self.rng = np.random.default_rng(seed)
        self.callbacks = callbacks or Callbacks()
        self._stop = threading.Event()
        n = len(self.tuners)
        self.batches = [0] * n                    # t_i
        self.best_history: list[list[float]] = [[] for _ in range(n)]  # g_i after each of task i's batches
        self.dead: set = set()
        groups: dict = {}
        for i, t in enumerate(self.tuners):
            groups.setdefault(_similarity_key(t), []).append(i)
        self.similar = [groups[_similarity_key(t)] for t in self.tuners]

    def request_stop(self) -> None:
        """End after the current batch (any thread, or a callback); every tuner stops too."""
        self._stop.set()
        for t in self.tuners:
            t.request_stop()

    # ------------------------------------------------------------------ the loop
    def run(self) -> SchedulerResult:
        t0 = time.perf_counter()
        out = SchedulerResult([], self.weights)
        for t in self.tuners:  # baselines first: every g_i starts from the default schedule
            t.ensure_baseline()
        for i, t in enumerate(self.tuners):
            self.best_history[i].append(t.result.best_cost)
        while not self._stop.is_set() and out.trials < self.trials:
            if self.seconds is not None and time.perf_counter() - t0 >= self.seconds:
                break
            live = [i for i in range(len(self.tuners)) if i not in self.dead]
            if not live:
                break
            i = self._pick(live)
            report = self.tuners[i].step(max_trials=self.trials - out.trials)
            if report is None or not report.candidates:
                self.dead.add(i)
                continue
            self.batches[i] += 1
            self.best_history[i].append(self.tuners[i].result.best_cost)
            out.allocations.append(i)
            out.trials += len(report.candidates)
            self.callbacks.heartbeat(self)
        out.stopped = self._stop.is_set()
        out.results = [t.finish() for t in self.tuners]
        out.seconds = time.perf_counter() - t0
        return out

    def _pick(self, live: list) -> int:
        unvisited = [i for i in live if self.batches[i] == 0]
        if self.scheduler == "round-robin":
            pool = unvisited or live
            return min(pool, key=lambda i: (self.batches[i], i))
        if unvisited:
            # the first batches go where the time is: the heaviest tasks by weight x their default's
            # time first, so a budget smaller than a batch per task is not spent on the first tasks
            # in graph order (ResNet-18's 100 trials left its four deepest layers, a third of its
            # time, untouched)
            return max(unvisited, key=lambda i: (self.weights[i] * self.tuners[i].result.best_cost, -i))
        if self.rng.random() < self.eps:
            return int(self.rng.choice(live))
        grads = [self.gradient(i) for i in live]
        if max(grads) == min(grads):
            return int(self.rng.choice(live))
        return live[int(np.argmin(grads))]

    def gradient(self, i: int) -> float:
        """The estimated change of the objective per batch given to task i (negative = better)."""
        g = self.tuners[i].result.best_cost
        if not math.isfinite(g):
            return -math.inf  # nothing valid yet: this task needs a batch more than any other
        hist, t = self.best_history[i], self.batches[i]
        backward = 0.0
        if t >= self.window and len(hist) > self.window and math.isfinite(hist[-1 - self.window]):
            backward = (hist[-1] - hist[-1 - self.window]) / self.window
        forward_guess = g - g / max(t, 1)
        best_throughput = max((self.tuners[k].opdef.flops / self.tuners[k].result.best_cost
                               for k in self.similar[i] if math.isfinite(self.tuners[k].result.best_cost)),
                              default=0.0)
        if len(self.similar[i]) > 1 and best_throughput > 0:
            forward_guess = min(forward_guess, self.beta * self.tuners[i].opdef.flops / best_throughput)
        forward = forward_guess - g
        return self.weights[i] * (self.alpha * backward + (1 - self.alpha) * forward)


def check_arguments(n_tasks: int, weights, scheduler: str, trials: int) -> list:
    """The weights as floats, or ValueError naming what is wrong (before any work starts)."""
    if scheduler not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {scheduler!r}; known: {', '.join(SCHEDULERS)}")
    if n_tasks < 1:
        raise ValueError("a task scheduler needs at least one task")
    try:
        weights = [1.0] * n_tasks if weights is None else [float(w) for w in weights]
    except (TypeError, ValueError):
        raise ValueError(f"task weights must be positive numbers, got {weights!r}") from None
    if len(weights) != n_tasks:
        raise ValueError(f"{n_tasks} tasks but {len(weights)} weights")
    if any(not (w > 0 and math.isfinite(w)) for w in weights):
        raise ValueError(f"task weights must be positive numbers, got {weights}")
    if trials < 0:
        raise ValueError(f"trials must be >= 0, got {trials}")
    return weights


def _similarity_key(tuner) -> tuple:
    """Tasks are similar when they are the same operator in the same flop class (a factor of 2)."""
    flops = max(tuner.opdef.flops, 1)
    return (tuner.opdef.name, int(math.log2(flops)))
