"""Workloads and tasks: what is tuned, and where.

A workload is an operator at concrete shapes, given in one of three ways:
- an inventory operator by name and parameters: `Workload("conv2d_nchw", {...})`;
- a user's constructor registered under a name (`register_workload`), with its parameters;
- a compute DAG as data: `Workload.from_compute(output)` keeps the DAG's JSON definition
  (compiler.serialize) in `definition`, so build processes, other machines and the records
  store rebuild it from the JSON alone, without the user's code.
Its key is the compiler's workload key of the compute DAG, so the same operator defined twice
has one key. A task is a workload plus the target it runs on and the device key its
measurements go to.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from dataclasses import dataclass, field

from compiler.errors import CompilerError
from compiler.ops import INVENTORY, OpDef, get_op
from compiler.ops.custom import custom_op
from compiler.serialize import dag_from_json, dag_to_json
from compiler.target import resolve_target
from compiler.tensor import Tensor

_CUSTOM: dict = {}


class WorkloadError(ValueError):
    """An unknown operator or parameters that do not make a valid workload."""


def register_workload(name: str):
    """Decorator: make a user's operator constructor (returning an OpDef) a named workload."""
    def deco(fn):
        if name in INVENTORY or name in _CUSTOM:
            raise WorkloadError(f"a workload named {name!r} already exists")
        _CUSTOM[name] = fn
        return fn
    return deco


def custom_constructor(name: str):
    """The constructor registered under `name` (register_workload), or None."""
    return _CUSTOM.get(name)


def adopt_custom_constructor(name: str, fn) -> None:
    """Register `fn` under `name` unless a constructor is registered there: a build process
    gets a user's constructor with the workload it builds (tuner.measure.builder)."""
    _CUSTOM.setdefault(name, fn)


def _plain(value):
    """`value` with numpy scalars and arrays as Python numbers and lists: parameters are stored
    and exported as JSON (`np.int64(8)` in a shape would make every export fail)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if hasattr(value, "tolist") and hasattr(value, "dtype"):  # numpy scalar or array
        if value.dtype.kind == "f" and value.ndim == 0:
            return float(str(value))  # np.float32(1e-5) is the 1e-05 its user wrote, as the operators take it
        return value.tolist()
    return value


@dataclass(frozen=True)
class Workload:
    name: str
    params: dict = field(default_factory=dict)
    # the compute DAG as JSON (compiler.serialize) for a workload defined as data, else None;
    # compared and hashed by its digest
    definition: dict | None = field(default=None, compare=False, repr=False)
    _digest: str | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "params", _plain(self.params))
        if self.definition is None:
            return
        if not isinstance(self.definition, dict):
            raise WorkloadError(f"workload {self.name}: definition must be a JSON object (a compute DAG from "
                                f"compiler.serialize.dag_to_json), got {type(self.definition).__name__}")
        try:
            text = json.dumps(self.definition, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise WorkloadError(f"workload {self.name}: definition is not JSON: {e}") from None
        object.__setattr__(self, "_digest", hashlib.sha256(text.encode()).hexdigest())

    @classmethod
    def from_compute(cls, output, inputs=None, name: str | None = None) -> "Workload":
        """The workload of a compute DAG: `output` is its output Tensor (then `inputs`, the
        placeholders in kernel-argument order, default to those it reads in topological order)
        or an OpDef. `name` defaults to the OpDef's or the output tensor's name.

        An inventory OpDef (`get_op(...)`) gives the inventory workload (name and parameters),
        which keeps the operator's default schedule and templates; anything else is stored as
        its DAG definition."""
        if isinstance(output, OpDef):
            inventory = _inventory_workload(output)
            if inventory is not None:
                return inventory
            inputs = output.inputs if inputs is None else inputs
            name = name or output.name
            output = output.output
        if not isinstance(output, Tensor):
            raise WorkloadError(f"from_compute takes the output Tensor or an OpDef, got {type(output).__name__}")
        name = name or output.name
        _check_dag_name(name)
        try:
            definition = dag_to_json([output], inputs)
        except CompilerError as e:
            raise WorkloadError(f"workload {name}: {e}") from None
        return cls(name, {}, definition)

    def opdef(self):
        """Build the compute definition afresh (a schedule never changes it, but replays need one)."""
        try:
            if self.definition is not None:
                return self._dag_opdef()
            if self.name in _CUSTOM:
                return _CUSTOM[self.name](**self.params)
            return get_op(self.name, **self.params)
        except WorkloadError:
            raise
        except Exception as e:  # noqa: BLE001 - any construction failure is the user's bad input
            raise WorkloadError(f"workload {self.name}({self.params_text()}): {e}") from None

    def _dag_opdef(self):
        _check_dag_name(self.name)
        inputs, outputs = dag_from_json(self.definition)
        if len(outputs) != 1:
            raise WorkloadError(f"workload {self.name}: a workload has one output tensor, its definition has "
                                f"{len(outputs)}")
        return custom_op(self.name, inputs, outputs[0], self.params)

    @property
    def key(self) -> str:
        return self.opdef().workload_key()

    def params_text(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in sorted(self.params.items()))

    def to_json(self) -> dict:
        out = {"name": self.name, "params": self.params}
        if self.definition is not None:
            out["definition"] = self.definition
        return out

    def __hash__(self):
        return hash((self.name, json.dumps(self.params, sort_keys=True, default=str), self._digest))


def _check_dag_name(name):
    """A DAG workload's name is its OpDef's: an inventory name would get that operator's default
    schedule and templates, which assume the operator's own stages."""
    if not isinstance(name, str) or not name:
        raise WorkloadError(f"a workload needs a non-empty name, got {name!r}")
    if name in INVENTORY:
        raise WorkloadError(f"a compute definition cannot be named {name!r}: that is an inventory operator, "
                            "whose default schedule would be applied to it; choose another name")


def _inventory_workload(opdef) -> "Workload | None":
    """Workload(name, params) when `opdef` is what the inventory builds for them, else None."""
    if opdef.name not in INVENTORY:
        return None
    accepted = inspect.signature(INVENTORY[opdef.name]).parameters  # matmul_int8's params hold its dtype too
    workload = Workload(opdef.name, {k: v for k, v in opdef.params.items() if k in accepted})
    try:
        same = workload.key == opdef.workload_key()
    except WorkloadError:
        same = False
    if not same:
        raise WorkloadError(f"an OpDef named {opdef.name!r} that is not the inventory's {opdef.name} with "
                            f"its parameters; give your own compute another name")
    return workload


@dataclass(frozen=True)
class Task:
    workload: Workload
    target: str
    device_key: str = "local"

    @staticmethod
    def create(workload: Workload, target=None, device_key: str = "local") -> "Task":
        return Task(workload, str(resolve_target(target)), device_key)

    @property
    def flops(self) -> int:
        return self.workload.opdef().flops
