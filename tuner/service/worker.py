"""A job worker: claims jobs from the records database and runs them with the tuning engine.

Workers are separate processes (`tunefarm worker`, or the one `tunefarm serve` starts): heavy
work never runs in the API process. A worker
- claims the next job with a lease (tuner.records.jobs: FOR UPDATE SKIP LOCKED on PostgreSQL),
- rebuilds it from its stored spec (no user code: workloads are inventory operators or DAG JSON),
- runs the engine (tune_tasks) with callbacks that, after every batch, write the task's progress
  and renew the lease in one transaction, and stop the run when the job was cancelled or the lease
  was lost (seen at the next batch),
- renews the lease from a heartbeat thread as well, so a long batch or the final re-measurement
  does not let the lease expire,
- ends the job as done or failed (with the error), unless it was cancelled or reclaimed meanwhile.

A model job (its spec has a `model` section, POST /jobs/model) is tuned the same way, and the
worker follows its estimated end-to-end latency (tuner.model_tuning.LatencyEstimate: Σ weight ×
best) as "estimate" events written with the batch's progress: the job's latency curve.

A worker that dies leaves its lease to expire; the next claim resumes the job from its records:
nothing is measured twice (records are unique per task and fingerprint, and the engine skips what
is stored) and the job's earlier search trials count against its budget.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import traceback
from collections.abc import Hashable
from contextlib import ExitStack

from ..records import JobState, StoreError
from ..records.jobs import LeaseLost
from .spec import JobSpec

log = logging.getLogger("tunefarm.worker")

DEFAULT_LEASE_S = 60.0
ESTIMATE_STEP = 0.01   # a model job's latency curve gets a point when the estimate moves by 1 % (and the final one)


def default_worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class JobWorker:
    """Claims and runs jobs from `store` until `stop` is set (or one job, with run_once)."""

    def __init__(self, store, name: str | None = None, lease_seconds: float = DEFAULT_LEASE_S,
                 poll_seconds: float = 2.0, device_keys: list[str] | None = None, tracker: str | None = None,
                 tracker_token: str | None = None, tls_ca: str | None = None, build_workers: int | None = None,
                 calibrate: bool = True):
        """`device_keys`: the device keys this worker serves; default "local" only without a
        tracker, any key with one (farm keys are measured through the tracker). `calibrate`:
        whether local measuring workers are calibrated around each window
        (device_agent/calibration.py; about 0.1 s a window, which on jobs of a few tiny
        windows is most of their time)."""
        if lease_seconds < 3:
            raise ValueError(f"lease must be at least 3 s, got {lease_seconds}")
        self.store, self.name = store, name or default_worker_name()
        self.lease_seconds, self.poll_seconds = float(lease_seconds), float(poll_seconds)
        self.tracker, self.tracker_token, self.tls_ca = tracker, tracker_token, tls_ca
        if device_keys is None and tracker is None:
            device_keys = ["local"]
        self.device_keys = device_keys
        self.build_workers = build_workers
        self.calibrate = calibrate
        self.current_job: int | None = None
        # builder pools and local runners by their settings, kept across jobs: starting build
        # processes and a measuring worker costs seconds, more than a small job's tuning
        self._machinery: dict = {}

    def close(self) -> None:
        """Stop the build processes and measuring workers this worker started."""
        for m in self._machinery.values():
            m.close()
        self._machinery.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def machinery(self, kind: str, settings: Hashable, make):
        """The builder pool or local runner with these settings, started once per worker."""
        key = (kind, settings)
        if key not in self._machinery:
            self._machinery[key] = make()
        return self._machinery[key]

    # ------------------------------------------------------------------ loop
    def serve(self, stop: threading.Event) -> None:
        """Claim and run jobs until `stop` is set; waits `poll_seconds` when the queue is empty."""
        log.info("worker %s serving device keys %s", self.name, self.device_keys or "all")
        while not stop.is_set():
            try:
                ran = self.run_once(stop)
            except StoreError as e:   # database away for a moment: keep trying, do not die
                log.warning("worker %s: %s", self.name, e)
                ran = None
            if ran is None:
                stop.wait(self.poll_seconds)

    def run_once(self, stop: threading.Event | None = None) -> int | None:
        """Claim one job and run it to its end; its id, or None when no job was waiting."""
        self.store.jobs.reclaim_dead_local_leases()  # a job whose worker on this host died is claimable now
        job = self.store.jobs.claim(self.name, self.lease_seconds, self.device_keys)
        if job is None:
            return None
        self.current_job = job.id
        try:
            self.run_job(job, stop)
        finally:
            self.current_job = None
        return job.id

    # ------------------------------------------------------------------ one job
    def run_job(self, job, stop: threading.Event | None = None) -> None:
        run = _JobRun(self, job, stop)
        try:
            final = run.execute()
        except LeaseLost as e:
            log.warning("worker %s: %s; leaving job %d to its new owner", self.name, e, job.id)
            return
        except Exception as e:  # noqa: BLE001 - any failure of one job ends that job, not the worker
            log.error("worker %s: job %d failed: %s", self.name, job.id, e)
            detail = "".join(traceback.format_exception_only(type(e), e)).strip()
            self.store.jobs.finish(job.id, self.name, "failed", error=detail[:4000])
            return
        if final is not None:
            self.store.jobs.finish(job.id, self.name, final.value)


class _JobRun:
    """One claimed job: the engine, its callbacks, the heartbeat thread."""

    def __init__(self, worker: JobWorker, job, stop: threading.Event | None):
        self.worker, self.job, self.outer_stop = worker, job, stop
        self.store = worker.store
        self.spec = JobSpec.model_validate(job.spec)
        self.tasks = [jt.task for jt in job.tasks]
        self.weights = [jt.weight for jt in job.tasks]
        self.position = {t: jt.position for t, jt in zip(self.tasks, job.tasks)}
        self.keys = {t: jt.workload_key for t, jt in zip(self.tasks, job.tasks)}
        self._stop = threading.Event()
        self._done = threading.Event()
        self.stopped_because: JobState | None = None
        self.lost: LeaseLost | None = None
        self._lock = threading.Lock()
        # progress as the store should show it: this job's search records per task so far
        self.trials = {t: self.store.count(t, job_id=job.id, search_only=True) for t in self.tasks}
        self.batches = {t: jt.batches for t, jt in zip(self.tasks, job.tasks)}
        self.errors = {t: jt.errors for t, jt in zip(self.tasks, job.tasks)}
        self.timings = {t: jt.timings for t, jt in zip(self.tasks, job.tasks)}
        self.disturbed = {t: jt.disturbed_timings for t, jt in zip(self.tasks, job.tasks)}
        self.best_ids: dict = {t: jt.best_record_id for t, jt in zip(self.tasks, job.tasks)}
        self.best_costs: dict = {t: jt.best_cost for t, jt in zip(self.tasks, job.tasks)}
        self.estimate = None          # a model job's LatencyEstimate
        self.estimate_written: float | None = None
        self.estimate_pending = False
        if self.spec.model is not None:
            from ..model_tuning import LatencyEstimate
            self.estimate = LatencyEstimate.of(list(zip(self.tasks, self.weights)))

    def execute(self) -> JobState | None:
        """Run the engine; the state to end the job in (None: it is not ours to end)."""
        from ..engine import Callbacks
        from ..tune import tune_tasks

        m = self.spec.measure
        with ExitStack() as owned:
            builder, runner = self._measuring(owned, m)
            heartbeat = threading.Thread(target=self._heartbeat_loop, name=f"lease-{self.job.id}", daemon=True)
            heartbeat.start()
            owned.callback(heartbeat.join)
            owned.callback(self._done.set)
            spec = self.spec
            out = tune_tasks(self.tasks, self.store, spec.tuning_options(job_id=self.job.id), weights=self.weights,
                             builder=builder, runner=runner,
                             callbacks=Callbacks(on_batch=self._on_batch, on_heartbeat=self._on_heartbeat))
            if self.lost is not None:
                raise self.lost
            if self.estimate is not None and not out.stopped:
                self.estimate_pending = self.estimate.finish(out.results)   # the re-measured bests
            for task, result in zip(self.tasks, out.results):
                self._note_final_best(task, result)
                last = task is self.tasks[-1]
                self._write_progress(task, result, kind=None, estimate="final" if last and self.estimate_pending else "none")
        if self.stopped_because is not None:
            return None  # cancelled by a user: the job already says so
        if self.outer_stop is not None and self.outer_stop.is_set() and out.stopped:
            # the worker is shutting down: end the lease now, so the next claim resumes the job at once
            self.store.jobs.release_lease(self.job.id, self.worker.name, f"worker {self.worker.name} stopped; "
                                          "the next worker resumes the job from its records")
            return None
        if all(r.best_candidate is None for r in out.results):
            raise RuntimeError("no valid candidate was measured for any task (see the records' error codes)")
        return JobState.DONE

    def _measuring(self, owned: ExitStack, m):
        from ..measure import BuilderPool, LocalRunner, RPCRunner
        from ..measure.calibration import StoreSpeedHistory
        w = self.worker
        builder = w.machinery("builder", (m.build_timeout,),
                              lambda: BuilderPool(n_workers=w.build_workers, timeout=m.build_timeout))
        if self.job.device_key == "local":
            from compiler.kernel_format import check_runnable
            from compiler.target import resolve_target
            check_runnable(resolve_target(self.job.target))   # KernelLoadError: this host cannot run it
            options = m.measure_options()
            # calibrations judged against this host's history in the service's store
            runner = w.machinery("runner", options,
                                 lambda: LocalRunner(options, history=StoreSpeedHistory(w.store), calibrate=w.calibrate))
        else:
            if w.tracker is None:
                raise RuntimeError(f"job {self.job.id} measures on device key {self.job.device_key!r}, and this "
                                   "worker has no tracker (tunefarm worker --tracker HOST:PORT)")
            runner = RPCRunner(w.tracker, self.job.device_key, token=w.tracker_token, tls_ca=w.tls_ca,
                               options=m.measure_options())
            owned.callback(runner.close)
        return builder, runner

    # ------------------------------------------------------------------ callbacks
    def _on_batch(self, report) -> None:
        task = report.task
        if self.estimate is not None:
            self.estimate_pending |= self.estimate.observe(report)
        if report.kind == "search":
            self.trials[task] += len(report.candidates)
            self.batches[task] += 1
        if report.kind != "retime":
            self.errors[task] += sum(not r.ok for r in report.results)
        valid = [r for r in report.results if r.ok]
        self.timings[task] += len(valid)
        self.disturbed[task] += sum(r.disturbed for r in valid)
        if len(report.record_ids) == len(report.candidates) and report.kind != "retime":
            ids = {c.fingerprint: i for c, i in zip(report.candidates, report.record_ids)}
            best = report.result.best_candidate
            if best is not None and best.fingerprint in ids:
                self.best_ids[task] = ids[best.fingerprint]
        self._write_progress(task, report.result, kind=report.kind)

    def _on_heartbeat(self, engine) -> None:
        """Called by the scheduler after every batch (and by a task tuner between re-measurement
        rounds) with itself: the place to stop the engine from outside its own thread's flow."""
        if self.estimate is not None:
            self.estimate_pending |= self.estimate.observe_engine(engine)   # tasks resumed from records
        if self.outer_stop is not None and self.outer_stop.is_set():
            self._stop.set()
        if self._stop.is_set():
            engine.request_stop()

    def _note_final_best(self, task, result) -> None:
        """After the re-measurement the best may be a record of an earlier attempt or batch: take
        its id from the store, which ranks by the same re-measured costs."""
        if result.best_candidate is None:
            return
        top = self.store.best(self.keys[task], task.target, k=1, device_key=task.device_key)
        if top and top[0].candidate.fingerprint == result.best_candidate.fingerprint:
            self.best_ids[task] = top[0].id

    def _estimate_event(self, when: str):
        """A model job's "estimate" event: `when` "moved" (if the estimate moved by ESTIMATE_STEP
        since the last one written), "final" (the re-measured one, always) or "none"."""
        final = when == "final"
        if self.estimate is None or when == "none" or not (self.estimate_pending or final):
            return None
        seconds = self.estimate.seconds
        if not math.isfinite(seconds):
            return None
        last = self.estimate_written
        if not final and last is not None and abs(seconds - last) < ESTIMATE_STEP * last:
            return None
        trials = sum(self.trials.values())
        what = "final estimate (re-measured)" if final else "estimated latency"
        shown = f"{seconds * 1e6:.4g} µs" if seconds < 1e-3 else f"{seconds * 1e3:.4g} ms"
        return ("estimate", f"{what}: {shown} after {trials} trials",
                {"trials": trials, "seconds": seconds, "final": final})

    def _write_progress(self, task, result, kind: str | None, estimate: str = "moved") -> None:
        """Write the task's progress (renewing the lease); `kind` is the batch's (BatchReport.kind,
        None for the final write): the default schedule's batch is a "baseline" event, a search
        batch that improved the best by 1 % a "best" event, a re-measurement no event at all, the
        final write a "time" event (where the task's time went); a model job's estimate goes with
        it (`estimate`: see _estimate_event)."""
        best = result.best_cost if math.isfinite(result.best_cost) else None
        base = result.baseline_cost if math.isfinite(result.baseline_cost) else None
        previous = self.best_costs.get(task)
        flops = result.flops or 0
        event = None
        if kind == "baseline" and base is not None:
            event = ("baseline", f"{task.workload.name}: default schedule {flops / base / 1e9:.3g} GFLOPS",
                     {"position": self.position[task], "cost": base})
        elif kind == "search" and best is not None and (previous is None or best < previous * 0.99):
            event = ("best", f"{task.workload.name}: best {flops / best / 1e9:.3g} GFLOPS after {self.trials[task]} trials",
                     {"position": self.position[task], "cost": best, "trials": self.trials[task]})
        elif kind is None and result.phase_seconds:   # the task's last write: where its time went
            event = ("time", f"{task.workload.name}: {result.tune_seconds:.1f} s; time went to {result.time_summary()}",
                     {"position": self.position[task], "tune_seconds": round(result.tune_seconds, 3),
                      "phase_seconds": {p: round(v, 3) for p, v in result.phase_seconds.items()}})
        estimate_event = self._estimate_event(estimate)
        try:
            with self._lock:
                state = self.store.jobs.record_progress(
                    self.job.id, self.worker.name, self.position[task], trials=self.trials[task],
                    batches=self.batches[task], errors=self.errors[task], timings=self.timings[task],
                    disturbed_timings=self.disturbed[task], best_cost=best,
                    best_record_id=self.best_ids.get(task),
                    baseline_cost=base, trials_done=sum(self.trials.values()),
                    lease_seconds=self.worker.lease_seconds, event=event,
                    more_events=(estimate_event,) if estimate_event is not None else ())
        except LeaseLost as e:
            self.lost = e
            self._stop_engine()
            return
        if state != JobState.RUNNING:       # cancelled while the batch ran: nothing was written
            self.stopped_because = state
            self._stop_engine()
            return
        if best is not None:
            self.best_costs[task] = best if previous is None else min(previous, best)
        if estimate_event is not None:
            self.estimate_written, self.estimate_pending = estimate_event[2]["seconds"], False

    def _heartbeat_loop(self) -> None:
        """Renew the lease every third of its length while the engine runs."""
        while not self._done.wait(self.worker.lease_seconds / 3):
            try:
                with self._lock:
                    state = self.store.jobs.renew_lease(self.job.id, self.worker.name, self.worker.lease_seconds)
            except LeaseLost as e:
                self.lost = e
                self._stop_engine()
                return
            except StoreError as e:  # the database is away for a moment: try again next time
                log.warning("job %d: lease renewal failed: %s", self.job.id, e)
                continue
            if state != JobState.RUNNING:
                self.stopped_because = state
                self._stop_engine()
                return

    def _stop_engine(self) -> None:
        """Ask the engine to stop; it does at its next heartbeat (after the current batch)."""
        self._stop.set()
