"""Options stated once (compiler/option_fields.py) and their edges made from them
(tuner/option_forms.py): the command line's flags, the REST API's request fields and the
tracker's check of a measurement request agree with the dataclasses' defaults, help and bounds."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, fields

import pytest
from pydantic import ValidationError, create_model

from compiler.measure_options import MeasureOptions
from compiler.option_fields import check_options, option, options_of
from rpc_tracker.proto import farm_pb2 as pb
from tuner.engine.options import SCHEDULERS, STRATEGY_NAMES, TuningOptions
from tuner.option_forms import JOB_TUNING, MEASURE_FLAGS, TUNING_FLAGS, add_option_flags, request_fields, values_from_flags


@dataclass(frozen=True)
class Knobs:
    """A new option set, declared the way TuningOptions is: each edge gets every field at once."""

    width: int = option(4, "lanes per step", ge=1, le=64)
    rate: float | None = option(None, "steps a second", gt=0)
    mode: str = option("fast", "how to run", choices=("fast", "safe"))
    warm: bool = option(True, "warm up first")
    chunk_size: int = option(8, "items per chunk", ge=1, flag="--chunk")

    def __post_init__(self):
        check_options(self)


def parser_for(cls, names, **defaults):
    p = argparse.ArgumentParser(prog="t", exit_on_error=False)
    add_option_flags(p, cls, names, defaults)
    return p


def test_every_field_of_the_option_sets_is_an_option_with_help():
    for cls in (TuningOptions, MeasureOptions):
        declared = options_of(cls)
        assert list(declared) == [f.name for f in fields(cls)]
        assert all(info.help for info in declared.values())
    from tuner.search import STRATEGIES
    assert set(STRATEGY_NAMES) == set(STRATEGIES)
    assert options_of(TuningOptions)["scheduler"].choices == SCHEDULERS


def test_a_dataclass_checks_its_fields_against_their_bounds():
    assert Knobs() == Knobs(4, None, "fast", True, 8)
    for bad, needle in [(dict(width=0), "width must be >= 1, got 0"), (dict(width=65), "width must be <= 64"),
                        (dict(rate=0.0), "rate must be > 0"), (dict(rate=math.nan), "rate must be finite"),
                        (dict(mode="slow"), "mode must be one of fast, safe, got 'slow'")]:
        with pytest.raises(ValueError, match=needle):
            Knobs(**bad)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        TuningOptions(batch_size=0)
    with pytest.raises(ValueError, match="repeat must be >= 1"):
        MeasureOptions(repeat=0)
    with pytest.raises(ValueError, match="min_repeat_ms must be finite"):
        MeasureOptions(min_repeat_ms=math.inf)


def test_flags_are_made_from_the_fields():
    p = parser_for(Knobs, ["width", "rate", "mode", "warm", "chunk_size"])
    args = p.parse_args([])
    assert Knobs(**values_from_flags(args, ["width", "rate", "mode", "warm", "chunk_size"])) == Knobs()
    args = p.parse_args(["--width", "16", "--rate", "2.5", "--mode", "safe", "--no-warm", "--chunk", "3"])
    assert values_from_flags(args, ["width", "rate", "mode", "warm", "chunk_size"]) == \
        dict(width=16, rate=2.5, mode="safe", warm=False, chunk_size=3)
    assert "lanes per step (default: 4)" in p.format_help()
    for argv, needle in [(["--width", "0"], "argument --width: must be >= 1, got 0"),
                         (["--width", "x"], "argument --width: 'x' is not an integer"),
                         (["--rate", "nan"], "argument --rate: must be finite"),
                         (["--mode", "slow"], "invalid choice: 'slow'")]:
        with pytest.raises(argparse.ArgumentError, match=needle):
            p.parse_args(argv)
    assert parser_for(Knobs, ["width"], width=32).parse_args([]).width == 32   # an edge's own default


def test_request_fields_are_made_from_the_fields_within_the_edges_limits():
    model = create_model("KnobsRequest", **request_fields(Knobs, ["width", "rate", "mode", "warm"],
                                                          defaults={"width": 8}, limits={"width": {"ge": 2, "le": 16}}))
    assert model().model_dump() == dict(width=8, rate=None, mode="fast", warm=True)
    assert model(width=16, rate=1.5, mode="safe", warm=False).width == 16
    for bad in (dict(width=1), dict(width=17), dict(rate=0), dict(rate=math.inf), dict(mode="slow")):
        with pytest.raises(ValidationError):
            model(**bad)
    schema = model.model_json_schema()["properties"]
    assert schema["width"]["description"] == "lanes per step" and schema["width"]["maximum"] == 16
    assert schema["mode"]["enum"] == ["fast", "safe"]


def test_the_job_spec_takes_its_tuning_and_measurement_fields_from_the_options():
    from tuner.service.spec import JobSpec
    spec = JobSpec(workloads=[{"op": "relu"}])
    assert spec.tuning_options() == TuningOptions(**{n: getattr(TuningOptions(), n) for n in JOB_TUNING})
    assert spec.measure.measure_options() == MeasureOptions()
    spec = JobSpec(workloads=[{"op": "relu"}], scheduler="round-robin", strategy="random", measure={"repeat": 3})
    assert spec.tuning_options(job_id=7) == TuningOptions(scheduler="round-robin", strategy="random", job_id=7)
    assert spec.measure.measure_options().repeat == 3
    for bad in (dict(trials=0), dict(trials=None), dict(top_k=65), dict(strategy="annealing"), dict(measure={"number": 0}),
                dict(measure={"timeout": 601}), dict(measure={"rtol": 0.1})):   # rtol is no field of a job
        with pytest.raises(ValidationError):
            JobSpec(workloads=[{"op": "relu"}], **bad)
    props = JobSpec.model_json_schema()["properties"]
    assert props["top_k"]["description"] == options_of(TuningOptions)["top_k"].help


def test_tune_and_model_tune_flags_reach_the_run(monkeypatch, tmp_path):
    """`tunefarm tune` passes its tuning flags as one TuningOptions and its measurement flags to the
    runner it measures with; `model tune` the same, with the whole model's budget as the default."""
    from tuner import cli
    from tuner.cli.common import tuning_from_flags

    parser = cli.build_parser()
    args = parser.parse_args(["tune", "relu", "--trials", "5", "--scheduler", "round-robin", "--batch", "2",
                              "--repeat", "3", "--timeout", "4.5", "--early-stopping", "9"])
    options, measure = tuning_from_flags(args)
    assert options == TuningOptions(trials=5, scheduler="round-robin", batch_size=2, early_stopping=9)
    assert measure == MeasureOptions(repeat=3, timeout=4.5)
    options, measure = tuning_from_flags(parser.parse_args(["model", "tune", "m.onnx"]))
    assert options.trials == 2000 and measure == MeasureOptions()
    assert set(TUNING_FLAGS) >= set(JOB_TUNING) and set(MEASURE_FLAGS) <= set(options_of(MeasureOptions))

    import tuner.tune as tune_module

    class Reached(Exception):
        pass

    def fake_tune(task, store, options, **kw):
        raise Reached(options, kw["measure"])

    monkeypatch.setattr(tune_module, "tune", fake_tune)
    with pytest.raises(Reached) as reached:
        cli.main(["tune", "relu", "--trials", "3", "--repeat", "2", "--plain", "--db", f"sqlite:///{tmp_path / 'r.db'}"])
    options, measure = reached.value.args
    assert options.trials == 3 and measure.repeat == 2


def test_the_tracker_checks_a_requests_options_by_their_bounds():
    ok = MeasureOptions(repeat=3, timeout=2.0).to_proto(pb)
    assert MeasureOptions.from_proto(ok) == MeasureOptions(repeat=3, timeout=2.0)
    unset, d = MeasureOptions.from_proto(pb.MeasureOptions()), MeasureOptions()   # where 0 is no value: the default
    assert (unset.number, unset.repeat, unset.attempts, unset.timeout) == (d.number, d.repeat, d.attempts, d.timeout)
    for fields_, needle in [(dict(timeout_seconds=-1.0), "timeout_seconds must be > 0"),
                            (dict(rtol=math.nan), "rtol must be finite"),
                            (dict(cooldown_ms=-5.0), "cooldown_ms must be >= 0"),
                            (dict(seed=-1), "seed must be >= 0")]:
        with pytest.raises(ValueError, match=needle):
            MeasureOptions.from_proto(pb.MeasureOptions(**fields_))
