"""The edges of an options dataclass, made from its fields: command-line flags and REST request fields.

A field declared with `compiler.option_fields.option` (default, help, bounds, choices) becomes
`--name-with-dashes` on the command line and `name` in a request body or query string, with the
same default, help and bounds. An edge picks the fields it exposes and may give its own default
(a whole model's trial budget) or a cap of its own (the API's limit on what one request may ask
for); nothing else about an option is written twice. `tunefarm tune`, `model tune` and `submit`
take their tuning and measurement flags from here; the job spec and the model-job query take
their fields from here.
"""

from __future__ import annotations

import argparse
import types
import typing
from dataclasses import MISSING, fields
from typing import Any, Literal, Union

from compiler.option_fields import OptionInfo, options_of

# the fields each edge exposes (job_id, baseline, starting_points and retime_rounds are the
# engine's: the service sets job_id, the rest are for studies of the search)
TUNING_FLAGS = ("space", "strategy", "scheduler", "trials", "seconds", "batch_size", "early_stopping", "seed", "top_k")
JOB_TUNING = ("space", "strategy", "scheduler", "trials", "batch_size", "top_k", "seed")   # a service job's
MEASURE_FLAGS = ("number", "repeat", "min_repeat_ms", "max_repeat_ms", "attempts", "timeout")


def _declared(cls) -> dict[str, tuple[Any, Any, OptionInfo]]:
    """{name: (type, default, OptionInfo)} of the option fields of dataclass `cls`."""
    hints = typing.get_type_hints(cls)
    infos = options_of(cls)
    return {f.name: (hints[f.name], f.default, infos[f.name]) for f in fields(cls)
            if f.name in infos and f.default is not MISSING}


def _base_type(tp) -> tuple[Any, bool]:
    """(T, optional) of `T` or `T | None`."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def flag_name(name: str, info: OptionInfo) -> str:
    return info.flag or "--" + name.replace("_", "-")


def _parser_of(base, info: OptionInfo):
    """argparse's `type=`: the value converted, then checked against the option's bounds."""
    def parse(text: str):
        try:
            value = base(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if base is int else 'a number'}") from None
        bad = info.problem(value)
        if bad is not None:
            raise argparse.ArgumentTypeError(bad)
        return value
    parse.__name__ = base.__name__   # argparse names the type in its own messages
    return parse


def add_option_flags(parser: argparse.ArgumentParser, cls, names, defaults: dict | None = None) -> None:
    """One flag per field of `cls` named in `names`: its help, its default (or `defaults[name]`),
    bounds checked while parsing (argparse's usage error names the flag), `--x/--no-x` for a
    bool; the value lands in `args.<field name>`."""
    declared = _declared(cls)
    defaults = defaults or {}
    for name in names:
        tp, default, info = declared[name]
        default = defaults.get(name, default)
        base, _ = _base_type(tp)
        shown = "" if default is None or base is bool else f" (default: {default})"
        text = info.help.replace("%", "%%")   # argparse formats help with %
        if base is bool:
            parser.add_argument(flag_name(name, info), dest=name, action=argparse.BooleanOptionalAction,
                                default=default, help=text)
        elif info.choices is not None:
            parser.add_argument(flag_name(name, info), dest=name, choices=info.choices, default=default,
                                help=text + shown)
        else:
            parser.add_argument(flag_name(name, info), dest=name, type=_parser_of(base, info), default=default,
                                metavar=name.upper(), help=text + shown)


def values_from_flags(args: argparse.Namespace, names) -> dict:
    """{field name: parsed value} of the flags `add_option_flags` added for `names`."""
    return {name: getattr(args, name) for name in names}


def request_fields(cls, names, defaults: dict | None = None, limits: dict | None = None) -> dict[str, tuple[Any, Any]]:
    """pydantic field definitions ({name: (annotation, FieldInfo)}, as `create_model` takes them)
    of the fields of `cls` named in `names`: choices as a Literal, the bounds, finite floats, the
    help as the description; null only where it is the default. `defaults[name]` replaces a default; `limits[name]` ({"ge": .., "le":
    ..}) are the edge's own bounds, of which the tighter of each pair applies."""
    from pydantic import Field

    declared = _declared(cls)
    defaults, limits = defaults or {}, limits or {}
    out: dict[str, tuple[Any, Any]] = {}
    for name in names:
        tp, default, info = declared[name]
        base, optional = _base_type(tp)
        default = defaults.get(name, default)
        optional = optional and default is None   # null is a request's value only where it is the default
        own = limits.get(name, {})
        ge = max((v for v in (info.ge, own.get("ge")) if v is not None), default=None)
        le = min((v for v in (info.le, own.get("le")) if v is not None), default=None)
        extra = {"allow_inf_nan": False} if base is float else {}
        if info.choices is not None:
            base = Literal[info.choices]
        annotation = base | None if optional else base
        out[name] = (annotation, Field(default, description=info.help, ge=ge, gt=info.gt, le=le,
                                       **extra))
    return out


__all__ = ["TUNING_FLAGS", "JOB_TUNING", "MEASURE_FLAGS", "add_option_flags", "values_from_flags", "request_fields", "flag_name"]
