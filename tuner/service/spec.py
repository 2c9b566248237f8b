"""A tuning job as data: what a user submits, checked completely before anything is stored.

The same model is the REST API's request body (its OpenAPI schema), what the store keeps in
`jobs.spec`, and what a worker rebuilds the job from, so a job means the same thing in every
process. A compute DAG arrives as JSON (compiler.serialize) and is only ever parsed as data.

`resolve(spec)` does the checks that need the compiler (operator names, parameters that type-check,
the target string and, for a 'local' job, that this host can run it, the space kind for each
operator) and raises SpecError naming the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from compiler.measure_options import MeasureOptions

from ..engine.options import TuningOptions
from ..option_forms import JOB_TUNING, MEASURE_FLAGS, request_fields

MAX_TRIALS = 100_000
MAX_WORKLOADS = 256
MODEL_TRIALS = 2000   # a model job's default budget, for all of its workloads (as `tunefarm model tune`'s)

# what one request may ask for: the API's own limits, tighter than the options' bounds
TUNING_LIMITS = {"trials": {"ge": 1, "le": MAX_TRIALS}, "batch_size": {"le": 256}, "top_k": {"le": 64},
                 "seed": {"le": 2**31 - 1}}
MEASURE_LIMITS = {"number": {"le": 1000}, "repeat": {"le": 100}, "min_repeat_ms": {"le": 10_000},
                  "max_repeat_ms": {"ge": 1, "le": 60_000}, "attempts": {"le": 10}, "timeout": {"le": 600}}


class SpecError(ValueError):
    """A job spec that cannot run: `field` is the dotted path of what is wrong (as in a 422)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


class WorkloadSpec(BaseModel):
    """One workload: an inventory operator with parameters, or a compute DAG as JSON."""

    model_config = ConfigDict(extra="forbid")
    op: str | None = Field(None, min_length=1, max_length=128, description="inventory operator, e.g. matmul")
    params: dict[str, Any] = Field(default_factory=dict, description="the operator's parameters")
    compute: dict[str, Any] | None = Field(None, description="a compute DAG (compiler.serialize.dag_to_json)")
    name: str | None = Field(None, min_length=1, max_length=128, description="name of a compute workload")
    weight: float = Field(1.0, gt=0, le=1e6, description="how often the operator occurs (task scheduler)")

    @model_validator(mode="after")
    def _one_kind(self):
        if (self.op is None) == (self.compute is None):
            raise ValueError("give exactly one of 'op' (an inventory operator) or 'compute' (a compute DAG)")
        if self.compute is not None and self.params:
            raise ValueError("'params' belong to an inventory 'op'; a compute DAG has its shapes inside")
        return self

    @field_validator("weight")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("weight must be finite")
        return v


class _OptionFields(BaseModel):
    """A request model some of whose fields are made from an options dataclass
    (tuner/option_forms.py): to the type checker those fields are Any."""

    model_config = ConfigDict(extra="forbid")

    if TYPE_CHECKING:
        def __getattr__(self, name: str) -> Any: ...


class _MeasureSettings(_OptionFields):
    build_timeout: float = Field(20.0, gt=0, le=600, description="seconds before a build is a timeout")

    def measure_options(self) -> MeasureOptions:
        """The runners' options these settings make (the build timeout is the builder's)."""
        return MeasureOptions(**{name: getattr(self, name) for name in MEASURE_FLAGS})


def _made(name: str, base: type, doc: str, *parts: dict) -> Any:
    """`base` with the fields `parts` made from an options dataclass (option_forms.request_fields)."""
    fields = {k: v for part in parts for k, v in part.items()}
    return create_model(name, __base__=base, __module__=__name__, __doc__=doc, **fields)


if TYPE_CHECKING:
    MeasureSettings = _MeasureSettings
else:
    MeasureSettings = _made("MeasureSettings", _MeasureSettings, "How candidates are timed (the measurement protocol's "
                            "settings, compiler/timing.py): MeasureOptions' fields within the API's limits.",
                            request_fields(MeasureOptions, MEASURE_FLAGS, limits=MEASURE_LIMITS))


class ModelSource(BaseModel):
    """Where a model job's workloads came from: the uploaded ONNX file as it was read. Its
    workloads (the model's unique fused workloads, weights = occurrences) are in `workloads`, so
    a worker needs only the spec; this section says which model they are and makes the worker
    follow the estimated end-to-end latency (Σ weight × best) as job events."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=255, description="the ONNX graph's name")
    file_name: str | None = Field(None, max_length=255, description="the uploaded file's name, if the client gave one")
    bytes: int = Field(ge=0, description="size of the uploaded file")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the uploaded file")
    nodes: int = Field(ge=0, description="nodes after constant and BatchNormalization folding")
    kernels: int = Field(ge=0, description="kernels one run of the model calls (the weights' sum)")
    input_shapes: dict[str, list[int]] = Field(default_factory=dict, description="the inputs' static shapes")


class _JobSpec(_OptionFields):
    name: str | None = Field(None, max_length=200)
    workloads: list[WorkloadSpec] = Field(min_length=1, max_length=MAX_WORKLOADS)
    target: str | None = Field(None, max_length=1000, description="LLVM target string; default: the server's host")
    device_key: str = Field("local", min_length=1, max_length=255, pattern=r"^[A-Za-z0-9_.:-]+$",
                            description="'local': measured by the worker's own machine; else a farm device key")
    priority: int = Field(0, ge=-1000, le=1000, description="higher runs first")
    measure: MeasureSettings = Field(default_factory=lambda: MeasureSettings())
    model: ModelSource | None = Field(None, description="set for a model job (POST /jobs/model): the ONNX model "
                                                        "its workloads came from")

    def tuning_options(self, **engine) -> TuningOptions:
        """The engine's options of this job (`engine`: the fields a job does not set, e.g. job_id)."""
        return TuningOptions(**{name: getattr(self, name) for name in JOB_TUNING}, **engine)


if TYPE_CHECKING:
    JobSpec = _JobSpec
else:
    JobSpec = _made("JobSpec", _JobSpec, "A tuning job: workloads under one trial budget on one target and device key; "
                    "its tuning fields are TuningOptions' within the API's limits.",
                    request_fields(TuningOptions, JOB_TUNING, limits=TUNING_LIMITS))


class _ModelJobQuery(BaseModel):
    if TYPE_CHECKING:
        def __getattr__(self, name: str) -> Any: ...

    def job_fields(self) -> dict:
        """The JobSpec fields these query parameters set (the measurement ones as `measure`)."""
        return {**{name: getattr(self, name) for name in JOB_TUNING},
                "measure": {name: getattr(self, name) for name in MEASURE_FLAGS}}


if TYPE_CHECKING:
    ModelJobQuery = _ModelJobQuery
else:
    ModelJobQuery = _made("ModelJobQuery", _ModelJobQuery, "POST /jobs/model's tuning and measurement query "
                          "parameters: a job's fields, a whole model's budget.",
                          request_fields(TuningOptions, JOB_TUNING, defaults={"trials": MODEL_TRIALS},
                                         limits=TUNING_LIMITS),
                          request_fields(MeasureOptions, MEASURE_FLAGS, limits=MEASURE_LIMITS))


@dataclass(frozen=True)
class ResolvedJob:
    """A checked spec: its tasks (one target, one device key), weights and flops."""

    spec: JobSpec
    tasks: list           # [Task]
    weights: list[float]
    flops: list[float]
    strategy: str

    def store_rows(self) -> list[tuple]:
        return list(zip(self.tasks, self.weights, self.flops))


def resolve(spec: JobSpec, default_target: str | None = None) -> ResolvedJob:
    """Check everything that needs the compiler; SpecError(field, message) on the first problem.

    `default_target`: the target of a spec without one (the server's host when None)."""
    from compiler.errors import CompilerError
    from compiler.target import resolve_target

    from ..engine import DEFAULT_STRATEGY, make_space
    from ..search import STRATEGIES
    from ..workload import Task, Workload, WorkloadError

    if spec.target is None and default_target is None and spec.device_key != "local":
        raise SpecError("target", f"device key {spec.device_key!r} measures on the farm's devices: give their target "
                                  "string (e.g. 'llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1'); only 'local' jobs "
                                  "default to the server's host")
    try:
        target = resolve_target(spec.target if spec.target is not None else default_target)
    except (CompilerError, ValueError) as e:
        raise SpecError("target", str(e)) from None
    if spec.device_key == "local":
        _check_runs_here(target)
    strategy = spec.strategy or DEFAULT_STRATEGY[spec.space]
    if strategy not in STRATEGIES:
        raise SpecError("strategy", f"unknown strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
    tasks: list = []
    weights: list[float] = []
    flops: list[float] = []
    keys: dict[str, int] = {}
    for i, w in enumerate(spec.workloads):
        where = f"workloads.{i}"
        try:
            if w.op is not None:
                workload = Workload(w.op, w.params)
            else:
                workload = Workload(w.name or "custom", {}, w.compute)
            opdef = workload.opdef()
            key = opdef.workload_key()
        except (WorkloadError, CompilerError, ValueError, TypeError, KeyError) as e:
            raise SpecError(where, str(e)) from None
        if key in keys:
            raise SpecError(where, f"the same workload as workloads.{keys[key]}; give that one a larger weight")
        keys[key] = i
        try:
            make_space(spec.space, opdef, target)
        except (ValueError, CompilerError) as e:
            raise SpecError("space", f"{spec.space} space for workloads.{i} ({workload.name}): {e}") from None
        tasks.append(Task(workload, str(target), spec.device_key))
        weights.append(float(w.weight))
        flops.append(float(opdef.flops))
    return ResolvedJob(spec, tasks, weights, flops, strategy)


def _check_runs_here(target) -> None:
    """SpecError unless this host can run kernels built for `target`.

    A 'local' job is measured by a worker on the server's machine: a target of another architecture, object
    format or with CPU features this host lacks would be accepted, queued and then fail in the worker after
    every build. The compiler's own load check (the one the worker and the runtime apply) decides here."""
    from compiler.errors import CompilerError
    from compiler.kernel_format import check_runnable
    from compiler.target import Target

    try:
        check_runnable(target)
    except CompilerError as e:
        host = Target.host()
        raise SpecError("target", f"device key 'local' measures on this server's host ({host.triple}, cpu {host.cpu}), "
                                  f"which cannot run target '{target}': {e}. Leave 'target' out to tune for this host, "
                                  "or submit under a farm device key whose agents can run it") from None
