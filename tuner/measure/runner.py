"""Runners: measure built candidates and turn the answers into MeasureResults.

`Runner` is the seam between the tuner loop and wherever kernels run: `LocalRunner` measures on
this machine in one isolated worker process; the farm's runner (next) sends the same requests to
device agents through the tracker. Both run `device_agent.worker.measure_one`, so a candidate is
checked and timed the same way everywhere.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from compiler.measure_options import MeasureOptions
from device_agent.calibration import CalibratedWorker, SpeedHistory
from device_agent.host import is_emulated
from device_agent.worker import MeasureRequest, WorkerProcess

from ..candidate import ErrorCode, MeasureResult
from ..workload import Task
from .builder import BuildResult
from .calibration import HostSpeedHistory


class Runner(ABC):
    """Measures build results of one task; one MeasureResult per BuildResult, in order."""

    def timings_emulated(self) -> bool | None:
        """Whether this runner's timings come from an emulated machine (None: it cannot tell yet);
        the tuner keeps the cost model and its warm start to records of that kind."""
        return False

    options: MeasureOptions = MeasureOptions()

    @abstractmethod
    def run(self, task: Task, build_results: list, options: MeasureOptions | None = None) -> list:
        """Measure `build_results`; build errors pass through with the build's error code.
        `options`: this call's measurement options instead of the runner's own (a search's slow
        cutoff: MeasureOptions.slow_cutoff_s)."""

    def close(self) -> None:  # noqa: B027 - an optional hook, not abstract
        """Release processes or connections."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def passthrough(br: BuildResult, measured_by: str) -> MeasureResult | None:
    """The result of a build that has nothing to measure, or None when there is a kernel."""
    if br.error_code != ErrorCode.NO_ERROR:
        return MeasureResult(error_code=br.error_code, error_msg=br.error_msg,
                             build_seconds=br.build_seconds, measured_by=measured_by)
    if br.kernel_bytes is None:
        return MeasureResult(error_code=ErrorCode.RUNNER_ERROR, error_msg="build produced no kernel",
                             build_seconds=br.build_seconds, measured_by=measured_by)
    if br.reference_bytes is None:
        return MeasureResult(error_code=ErrorCode.RUNNER_ERROR,
                             error_msg="no reference kernel to check against"
                                       + (f" ({br.reference_error})" if br.reference_error else ""),
                             build_seconds=br.build_seconds, measured_by=measured_by)
    return None


def to_measure_result(answer: dict, br: BuildResult, measured_by: str, emulated: bool = False) -> MeasureResult:
    """A worker's answer dict (measure_one's format) → MeasureResult; `emulated`: whether the
    machine that measured it runs emulated."""
    try:
        code = ErrorCode(int(answer.get("error_code", ErrorCode.RUNNER_ERROR)))
    except ValueError:
        code = ErrorCode.RUNNER_ERROR
    costs = [float(c) for c in answer.get("costs", [])] if code == ErrorCode.NO_ERROR else []
    if code == ErrorCode.NO_ERROR and not costs:
        code = ErrorCode.RUNNER_ERROR
    res = MeasureResult(costs=costs, error_code=code, error_msg=str(answer.get("error_msg", "")),
                        build_seconds=br.build_seconds, run_seconds=float(answer.get("run_seconds", 0.0)),
                        measured_by=measured_by, emulated=bool(emulated),
                        slow_window=bool(answer.get("slow_window", False)), remeasured=bool(answer.get("remeasured", False)),
                        slow_index=float(answer["slow_index"]) if answer.get("slow_index") else None)
    timing = answer.get("timing") if code == ErrorCode.NO_ERROR else None
    if timing:   # the measurement protocol's summary (an older agent sends none)
        res.take_timing(timing)
    return res


class LocalRunner(Runner):
    """Measures on this machine, one kernel running at a time (so timings do not disturb each other),
    in one worker process that is replaced when a kernel crashes or hangs.

    The worker is calibrated (device_agent/calibration.py) when it starts and after every `run`
    (a window): a window its closing calibration finds slow is measured again in a fresh worker,
    and marked (`MeasureResult.slow_window`) when no healthy worker could be had. `history`: the
    device's calibrations to judge against (tuner.measure.calibration: StoreSpeedHistory keeps them
    in the records store; default: HostSpeedHistory, this host's file). `calibrate=False` turns it off.

    A `run`'s kernels are timed together, taking turns (`interleave`;
    device_agent.worker.measure_window): a batch's candidates, or a re-timing's default and
    candidates, all sample the same stretch of the host's time, so the host's drift from one
    timing to the next does not enter their ratios. `interleave=False`: one after the other."""

    def __init__(self, options: MeasureOptions | None = None, history: SpeedHistory | None = None,
                 calibrate: bool = True, interleave: bool = True):
        self.options = options if options is not None else MeasureOptions()
        self.interleave = interleave
        self.worker = WorkerProcess()
        self.emulated = is_emulated()
        if calibrate and history is None:
            history = HostSpeedHistory()
        self.calibrated = CalibratedWorker(self.worker, history, threads=self.options.num_threads or None,
                                           interleave=interleave) if calibrate else None

    def timings_emulated(self) -> bool | None:
        return self.emulated

    def request(self, br: BuildResult, options: MeasureOptions | None = None) -> MeasureRequest:
        if br.kernel_bytes is None:  # `passthrough` answers such a build without measuring it
            raise ValueError("request() needs a build result with a kernel; this build produced none")
        return MeasureRequest(br.kernel_bytes, br.reference_bytes, br.num_inputs, options or self.options)

    def run(self, task: Task, build_results: list, options: MeasureOptions | None = None) -> list:
        options = options or self.options
        out: list = [passthrough(br, "local") for br in build_results]
        todo = [i for i, res in enumerate(out) if res is None]
        items = [(self.request(build_results[i], options), options.timeout) for i in todo]
        if self.calibrated is not None:
            answers = self.calibrated.measure_window(items) if items else []
        else:
            answers = self.worker.run_window(items, self.interleave)
        for i, answer in zip(todo, answers):
            out[i] = to_measure_result(answer, build_results[i], "local", self.emulated)
        return out

    def close(self) -> None:
        self.worker.close()
