"""Job specs: what a submission may say, checked before anything is stored (SpecError names the
field), and the same spec rebuilt by a worker."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

import compiler as te
from tuner.service.spec import JobSpec, SpecError, resolve
from tuner.workload import Workload

MM = {"op": "matmul", "params": {"M": 32, "N": 32, "K": 32}}


def spec(**kw) -> JobSpec:
    return JobSpec(**{"workloads": [MM], **kw})


def test_a_spec_resolves_to_tasks_with_weights_and_flops():
    job = resolve(spec(workloads=[MM, {"op": "relu", "params": {"shape": [64]}, "weight": 3}]))
    assert [t.workload.name for t in job.tasks] == ["matmul", "relu"]
    assert job.weights == [1.0, 3.0] and job.flops[0] == 2 * 32 ** 3 and job.strategy == "evolutionary"
    assert len({t.target for t in job.tasks}) == 1 and all(t.device_key == "local" for t in job.tasks)
    again = JobSpec.model_validate(spec().model_dump(mode="json"))       # as a worker reads it back
    assert resolve(again).tasks == resolve(spec()).tasks


def test_a_compute_dag_is_data():
    A = te.placeholder((8, 8), name="A")
    out = te.compute((8, 8), lambda i, j: A[i, j] * 2.0, name="twice")
    w = Workload.from_compute(out, name="twice_dag")
    job = resolve(spec(workloads=[{"compute": w.definition, "name": "twice_dag"}]))
    assert job.tasks[0].workload == w


@pytest.mark.parametrize("kw, field, words", [
    (dict(workloads=[{"op": "nope"}]), "workloads.0", "unknown operator"),
    (dict(workloads=[{"op": "matmul", "params": {"M": 4}}]), "workloads.0", "missing a required argument"),
    (dict(workloads=[MM, MM]), "workloads.1", "same workload as workloads.0"),
    (dict(target="llvm -mcpu=bogus"), "target", "-mtriple"),
    (dict(workloads=[{"op": "relu", "params": {"shape": [8]}}], space="template"), "space", "no built-in template"),
    (dict(workloads=[{"compute": {"version": 9}}]), "workloads.0", "compute definition"),
    (dict(device_key="rpi4"), "target", "farm's devices"),
])
def test_bad_specs_name_the_field(kw, field, words):
    with pytest.raises(SpecError) as e:
        resolve(spec(**kw))
    assert e.value.field == field and words in e.value.message


@pytest.mark.parametrize("kw", [
    dict(trials=0), dict(trials=10 ** 9), dict(workloads=[]), dict(space="trace"), dict(scheduler="fifo"),
    dict(workloads=[{"op": "matmul", "compute": {}}]), dict(workloads=[{"op": "relu", "weight": 0}]),
    dict(unknown_field=1), dict(device_key="has space"), dict(measure={"repeat": 0}),
])
def test_shapes_and_ranges_are_checked_by_the_model(kw):
    with pytest.raises(ValidationError):
        spec(**kw)
