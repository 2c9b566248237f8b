"""Search spaces: where candidates come from and how a candidate becomes a schedule.

Two kinds, one interface (`SearchSpace`):
- templates (AutoTVM-style): a schedule function declares knobs on a config; a candidate is a
  `Candidate("config", {"template": name, "knobs": {...}})`;
- sketches (Ansor-style): generated from the compute definition alone; a candidate is a
  `Candidate("trace", {"sketch": name, "params": {...}, "steps": [...], "workload_key": key})`
  whose steps replay with `compiler.apply_steps` (params let the space mutate and cross it).
`instantiate(opdef, candidate, target)` turns any candidate (and "default", the operator's default
schedule, every task's baseline) back into (schedule, args); it is what builder processes call,
so it must only need the candidate's JSON.
"""

from __future__ import annotations

from . import templates  # noqa: F401 - registers the built-in templates with the registry in template.py
from .base import SPACE_CANDIDATE_KIND, SearchSpace, SpaceError, default_candidate, instantiate, register_candidate_kind
from .sketch import Sketch, SketchSpace, generate_sketches
from .template import (
    Config,
    ConfigSpace,
    TemplateSpace,
    default_template_for,
    get_template,
    list_templates,
    template,
    template_for_op,
)

__all__ = ["SearchSpace", "SpaceError", "instantiate", "default_candidate", "SPACE_CANDIDATE_KIND",
           "register_candidate_kind",
           "template", "get_template", "list_templates", "default_template_for", "template_for_op", "ConfigSpace", "Config",
           "TemplateSpace", "SketchSpace", "Sketch", "generate_sketches"]
