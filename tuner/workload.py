"""Workloads and tasks: what is tuned, and where.

A workload is an operator at concrete shapes: an inventory operator by name and parameters, or a
user's own compute definition (a function returning an OpDef-like object, registered under a
name). Its key is the compiler's workload key of the compute DAG, so the same operator defined
twice has one key. A task is a workload plus the target it runs on and the device key its
measurements go to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from compiler.ops import INVENTORY, get_op
from compiler.target import resolve_target

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


@dataclass(frozen=True)
class Workload:
    name: str
    params: dict = field(default_factory=dict)

    def opdef(self):
        """Build the compute definition afresh (a schedule never changes it, but replays need one)."""
        try:
            if self.name in _CUSTOM:
                return _CUSTOM[self.name](**self.params)
            return get_op(self.name, **self.params)
        except WorkloadError:
            raise
        except Exception as e:  # noqa: BLE001 - any construction failure is the user's bad input
            raise WorkloadError(f"workload {self.name}({self.params_text()}): {e}") from None

    @property
    def key(self) -> str:
        return self.opdef().workload_key()

    def params_text(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in sorted(self.params.items()))

    def to_json(self) -> dict:
        return {"name": self.name, "params": self.params}

    def __hash__(self):
        return hash((self.name, json.dumps(self.params, sort_keys=True, default=str)))


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
