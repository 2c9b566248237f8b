"""MeasureOptions: how one kernel is checked and timed, stated once.

A measurement request is a kernel (and its reference) plus these options. The local runner, the
farm runner, the tracker, the device agent and the measuring worker all take this one value; its
defaults, help and bounds (compiler.option_fields) are the ones every edge shows and checks: the
command line's flags, the REST API's job spec and the tracker's check of a request. The
protocol's MeasureOptions message is converted to and from it here only (`to_proto`,
`from_proto`), so a field added here is added to every path at once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from .option_fields import check_options, option


@dataclass(frozen=True)
class MeasureOptions:
    number: int = option(1, "calls per timing sample at least (more when a call is short)", ge=1)
    repeat: int = option(10, "clean samples a figure needs at least", ge=1)
    min_repeat_ms: float = option(50.0, "sampling time per attempt at least (ms)", ge=0)
    max_repeat_ms: float = option(1000.0, "sampling time per attempt at most (ms; sampling stops earlier once "
                                          "the median is stable)", ge=0)
    attempts: int = option(4, "tries, with back-off, when other processes keep the kernel waiting", ge=1)
    cooldown_ms: float = option(0.0, "pause between the correctness check and the timing (ms)", ge=0)
    timeout: float = option(10.0, "seconds a run may take before its worker is killed", gt=0)
    rtol: float = option(1e-4, "output tolerance, relative to the largest |reference| value of each output", ge=0)
    atol: float = option(0.0, "absolute output tolerance", ge=0)
    seed: int = option(0, "seed of the random inputs every candidate of a task runs on", ge=0)
    num_threads: int | None = option(None, "threads for parallel loops (default: the kernel target's cores)", ge=1)
    slow_cutoff_s: float = option(0.0, "per call: a kernel slower than this is timed briefly (0: never; a "
                                       "search sets it from its best so far)", ge=0)

    def __post_init__(self):
        check_options(self)

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
        num_threads) the default applies. ValueError naming the message's field (the tracker's
        answer to a request it refuses) when a value is out of its bounds."""
        d = MeasureOptions()
        values = dict(number=o.number or d.number, repeat=o.repeat or d.repeat,
                      min_repeat_ms=o.min_repeat_ms, max_repeat_ms=o.max_repeat_ms or d.max_repeat_ms,
                      attempts=o.attempts or d.attempts, cooldown_ms=o.cooldown_ms,
                      timeout=o.timeout_seconds if o.timeout_seconds != 0 else d.timeout,
                      rtol=o.rtol, atol=o.atol, seed=o.seed, num_threads=o.num_threads or None,
                      slow_cutoff_s=max(0.0, o.slow_cutoff_s))
        try:
            return MeasureOptions(**values)
        except ValueError as e:   # "name must be ...": named as the message names the field
            name, _, rest = str(e).partition(" ")
            raise ValueError(f"{_PROTO_NAMES.get(name, name)} {rest}") from None


_PROTO_NAMES = {"timeout": "timeout_seconds"}   # where the message's field is named otherwise


__all__ = ["MeasureOptions"]
