"""MeasureOptions: how one kernel is checked and timed, stated once.

A measurement request is a kernel (and its reference) plus these options. The local runner, the
farm runner, the device agent and the measuring worker all take this one value; its defaults
are the defaults everywhere, and the protocol's MeasureOptions message is converted to and from
it here only (`to_proto`, `from_proto`), so a field added here is added to every path at once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True)
class MeasureOptions:
    number: int = 1                    # calls per timing sample at least
    repeat: int = 10                   # clean samples the figure needs at least
    min_repeat_ms: float = 50.0        # sampling time per attempt at least
    max_repeat_ms: float = 1000.0      # sampling time per attempt at most (compiler.timing)
    attempts: int = 4                  # tries when the host keeps the kernel waiting
    cooldown_ms: float = 0.0           # pause between the check and the timing
    timeout: float = 10.0              # seconds a run may take before its worker is killed
    rtol: float = 1e-4                 # relative to the largest |reference| value of each output
    atol: float = 0.0
    seed: int = 0                      # of the random inputs every candidate of a task runs on
    num_threads: int | None = None     # threads for parallel loops; None: the kernel target's cores
    slow_cutoff_s: float = 0.0         # per call: a kernel slower than this is timed briefly (0: never;
                                       # compiler.timing); a search sets it from its best so far

    def __post_init__(self):
        if self.number < 1 or self.repeat < 1:
            raise ValueError(f"number and repeat must be at least 1, got number={self.number}, repeat={self.repeat}")
        if self.timeout <= 0:
            raise ValueError(f"run timeout must be positive, got {self.timeout!r}")
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {self.attempts}")
        if self.min_repeat_ms < 0 or self.max_repeat_ms < 0 or self.cooldown_ms < 0:
            raise ValueError("min_repeat_ms, max_repeat_ms and cooldown_ms must not be negative")
        if not self.slow_cutoff_s >= 0:
            raise ValueError(f"slow_cutoff_s must be 0 (no cutoff) or positive, got {self.slow_cutoff_s!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be at least 1 (or None: the target's cores), got {self.num_threads}")

    def timing_options(self):
        """The measurement protocol's options: `repeat` clean samples at least, of `number` calls
        at least, over `min_repeat_ms` .. `max_repeat_ms` per attempt, briefer past `slow_cutoff_s`."""
        import math

        from compiler.timing import TimingOptions
        return TimingOptions(min_samples=self.repeat, min_calls=self.number, min_seconds=self.min_repeat_ms / 1000.0,
                             max_seconds=max(self.max_repeat_ms, self.min_repeat_ms, 1.0) / 1000.0,
                             attempts=self.attempts, slow_cutoff_s=self.slow_cutoff_s or math.inf)

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> MeasureOptions:
        names = {f.name for f in fields(MeasureOptions)}
        return MeasureOptions(**{k: v for k, v in d.items() if k in names})

    def to_proto(self, pb):
        """The protocol's MeasureOptions (`pb`: rpc_tracker.proto.farm_pb2); None is sent as 0."""
        return pb.MeasureOptions(number=self.number, repeat=self.repeat, min_repeat_ms=self.min_repeat_ms,
                                 cooldown_ms=self.cooldown_ms, rtol=self.rtol, atol=self.atol, seed=self.seed,
                                 num_threads=self.num_threads or 0, timeout_seconds=self.timeout,
                                 max_repeat_ms=self.max_repeat_ms, attempts=self.attempts,
                                 slow_cutoff_s=self.slow_cutoff_s)

    @staticmethod
    def from_proto(o) -> MeasureOptions:
        """From the protocol's message: proto3 has no presence, so a field a sender left unset is 0,
        and where 0 is no usable value (number, repeat, max_repeat_ms, attempts, timeout,
        num_threads) the default applies."""
        d = MeasureOptions()
        return MeasureOptions(number=o.number or d.number, repeat=o.repeat or d.repeat,
                              min_repeat_ms=o.min_repeat_ms, max_repeat_ms=o.max_repeat_ms or d.max_repeat_ms,
                              attempts=o.attempts or d.attempts, cooldown_ms=o.cooldown_ms,
                              timeout=o.timeout_seconds if o.timeout_seconds > 0 else d.timeout,
                              rtol=o.rtol, atol=o.atol, seed=o.seed, num_threads=o.num_threads or None,
                              slow_cutoff_s=max(0.0, o.slow_cutoff_s))


__all__ = ["MeasureOptions"]
