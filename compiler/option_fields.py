"""Options stated once: each field of an options dataclass carries its help, bounds and choices.

`MeasureOptions` (how a kernel is timed) and the tuner's `TuningOptions` declare every field with
`option(default, help, ...)`. What an edge needs to show or check a field travels in its metadata,
so the command line's flags and the REST API's request models (tuner/option_forms.py), the
dataclass's own check and the farm tracker's check of a measurement request are all made from
the one definition: a new option is one line, and no edge restates a default or a bound.

It lives here, at the bottom of the imports, because the tracker, the device agent and the tuner
all read MeasureOptions, and the tracker imports nothing of the tuner or the agent.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

METADATA_KEY = "option"


@dataclass(frozen=True)
class OptionInfo:
    """What one option means to its users: `help` (one line, what it changes), numeric bounds
    (`ge`, `gt`, `le`; a float must also be finite), the values it may take (`choices`) and, when it
    is not `--name-with-dashes`, its command-line flag."""

    help: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    choices: tuple | None = None
    flag: str | None = None

    def problem(self, value) -> str | None:
        """Why `value` is not allowed, or None (None itself is always allowed: 'not set')."""
        if value is None:
            return None
        if self.choices is not None:
            return None if value in self.choices else f"must be one of {', '.join(map(str, self.choices))}, got {value!r}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be finite, got {value!r}"
        if self.ge is not None and not value >= self.ge:
            return f"must be >= {self.ge:g}, got {value!r}"
        if self.gt is not None and not value > self.gt:
            return f"must be > {self.gt:g}, got {value!r}"
        if self.le is not None and not value <= self.le:
            return f"must be <= {self.le:g}, got {value!r}"
        return None


def option(default, help: str, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
           choices=None, flag: str | None = None) -> Any:
    """A dataclass field with its default and what `OptionInfo` says about it."""
    info = OptionInfo(help, ge, gt, le, tuple(choices) if choices is not None else None, flag)
    return field(default=default, metadata={METADATA_KEY: info})


@functools.cache
def options_of(cls: type) -> Mapping[str, OptionInfo]:
    """{field name: OptionInfo} of a dataclass's option fields, in declaration order; made once
    per class (the tracker checks a request's options thousands of times a second)."""
    return MappingProxyType({f.name: f.metadata[METADATA_KEY] for f in fields(cls) if METADATA_KEY in f.metadata})


def check_options(obj) -> None:
    """ValueError naming the first field of `obj` whose value its OptionInfo does not allow."""
    cls: type = type(obj)
    for name, info in options_of(cls).items():
        bad = info.problem(getattr(obj, name))
        if bad is not None:
            raise ValueError(f"{name} {bad}")


__all__ = ["OptionInfo", "option", "options_of", "check_options"]
