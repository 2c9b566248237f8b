"""A model job's spec from an uploaded ONNX file: read it, extract its tasks, write them as workloads.

The file is read and every task extracted here, at submission (the API's thread pool), so a file
that is not ONNX, an operator tunefarm cannot compile or a dynamic shape not pinned is refused
with a 422 naming the node, op or input before anything is stored. What is stored is an ordinary
JobSpec: the model's unique fused workloads (inventory operators, or compute DAGs as JSON) with
their occurrence counts as weights, plus a `model` section saying which file they came from. A
worker therefore needs neither the file nor `onnx`, and tunes it like `tunefarm model tune`.
"""

from __future__ import annotations

import hashlib

from pydantic import ValidationError

from .spec import MAX_WORKLOADS, JobSpec, ModelSource, SpecError, WorkloadSpec


def parse_input_shapes(items: list[str]) -> dict:
    """["input=1,3,224,224", ...] → {"input": (1, 3, 224, 224)}; SpecError("input_shape") otherwise."""
    shapes = {}
    for text in items:
        name, sep, dims = text.rpartition("=")
        try:
            shape = tuple(int(d) for d in dims.replace("x", ",").split(",") if d.strip())
        except ValueError:
            shape = ()
        if not sep or not name or not shape or any(d < 1 for d in shape):
            raise SpecError("input_shape", f"{text!r}: expected NAME=D0,D1,... with positive dimensions "
                                           "(e.g. input=1,3,224,224)")
        shapes[name] = shape
    return shapes


def model_job_spec(data: bytes, *, input_shapes: dict | None = None, file_name: str | None = None,
                   target: str | None = None, device_key: str = "local", **job) -> JobSpec:
    """The JobSpec of tuning the ONNX model `data`; `job`: the other JobSpec fields (name, trials,
    scheduler, batch_size, top_k, priority, seed, space, strategy). SpecError(field, message) for
    anything that cannot run, `field` being "model", "input_shape", "target" or a JobSpec field."""
    from compiler.errors import CompilerError
    from compiler.graph import DynamicShapeError, GraphError, from_onnx
    from compiler.target import resolve_target

    from ..model_tuning import ModelTuningError, model_tasks

    if not data:
        raise SpecError("model", "the request body is empty: send the ONNX file as the body "
                                 "(Content-Type: application/octet-stream)")
    if target is None and device_key != "local":
        raise SpecError("target", f"device key {device_key!r} measures on the farm's devices: give their target string")
    try:
        resolved_target = resolve_target(target)
    except (CompilerError, ValueError) as e:
        raise SpecError("target", str(e)) from None
    try:
        graph = from_onnx(bytes(data), input_shapes=input_shapes or {})
    except DynamicShapeError as e:
        raise SpecError("input_shape", str(e)) from None
    except GraphError as e:
        field = "input_shape" if input_shapes and "input_shapes" in str(e) else "model"
        raise SpecError(field, str(e)) from None
    try:
        tasks = model_tasks(graph, resolved_target, device_key)
    except (GraphError, ModelTuningError) as e:
        raise SpecError("model", str(e)) from None
    if not tasks:
        raise SpecError("model", "the model computes nothing to tune (its outputs are inputs or constants)")
    if len(tasks) > MAX_WORKLOADS:
        raise SpecError("model", f"the model has {len(tasks)} unique workloads; a job takes at most {MAX_WORKLOADS}")
    workloads = []
    for t in tasks:
        w = t.task.workload
        if w.definition is None:
            workloads.append(WorkloadSpec(op=w.name, params=w.params, weight=t.weight))
        else:
            workloads.append(WorkloadSpec(compute=w.definition, name=w.name, weight=t.weight))
    source = ModelSource(name=(graph.name or "model")[:255], file_name=file_name, bytes=len(data),
                         sha256=hashlib.sha256(data).hexdigest(), nodes=len(graph.nodes),
                         kernels=sum(t.weight for t in tasks),
                         input_shapes={n: list(graph.values[n].shape) for n in graph.inputs})
    job.setdefault("name", f"model {source.name}")
    try:
        return JobSpec(workloads=workloads, target=target, device_key=device_key, model=source, **job)
    except ValidationError as e:
        issue = e.errors()[0]
        raise SpecError(".".join(map(str, issue["loc"])) or "spec", issue["msg"]) from None


__all__ = ["model_job_spec", "parse_input_shapes"]
