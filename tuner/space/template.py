"""Templates (AutoTVM-style): a schedule function declares knobs on a config object.

A template is a function `fn(cfg, opdef, target) -> (schedule, args)` registered with
`@template("name")`. It is called twice over its life:

- once on a *define* pass, where `cfg` is a `ConfigSpace`: each `cfg.define_*` call declares a
  knob (its name and the list of values it may take) and `cfg[name]` gives the knob's first
  value, so the function runs to the end and returns a (default) schedule;
- then once per candidate on an *apply* pass, where `cfg` is a `Config`: the same `define_*`
  calls only check that the knob exists, and `cfg[name]` gives the chosen value.

So for a given workload a template declares the same knobs on every pass, each name once (a
knob declared twice raises SpaceError); which knobs exist may depend on the workload.

Knob values, as stored in a config's JSON (`{"template": name, "knobs": {name: value}}`):
- split: `[outer, f1, ..., fn]`, the extents of the loops a split gives, outermost first
  (outer = ceil(extent / (f1·…·fn)));
- knob: one of the declared values;
- reorder: a permutation of `range(axes_count)`;
- annotate: one of "none" | "unroll" | "vec" per axis.

`cfg[name]` gives an entity wrapping the value: `SplitEntity.size` / `.apply(stage, axis)`,
`OtherOptionEntity.val`, `ReorderEntity.perm` / `.apply(stage, axes)`,
`AnnotateEntity.anns` / `.apply(stage, axes)`.

The space is the product of the knobs: it can be enumerated (`len`, `get(index)` by a
mixed-radix index, first knob fastest), sampled, mutated and crossed over knob-wise
(`TemplateSpace`). A config whose knob values are not in the space raises SpaceError.

`instantiate(opdef, config_candidate, target)` needs only the JSON and the task's target: it runs
the define pass for the workload on that target, checks the knob values against that space and
applies them. Templates read the target's capabilities (vector lanes, registers) for their
defaults and code-size bounds, so a config is always instantiated for the target it is measured
on, never the host that happens to build it. The built-in templates keep their knob *sets*
independent of the target (only the order of values, the target's default first, differs), so a
config chosen for one machine still instantiates on another.
"""

from __future__ import annotations

import itertools
import json
import math
import weakref
from typing import Callable

from compiler.errors import CompilerError
from compiler.target import resolve_target

from ..candidate import Candidate
from .base import SearchSpace, SpaceError, register_space_kind, resolve_task

_TEMPLATES: dict = {}          # name -> schedule function
_TEMPLATE_FOR_OP: dict = {}    # inventory operator -> the name of its built-in template
MAX_REORDER_AXES = 7  # 5040 permutations; more must be given as candidates


# ----------------------------------------------------------------------------- registry

def template(name: str, ops=()):
    """Decorator: register `fn(cfg, opdef, target) -> (schedule, args)` as template `name`, the
    built-in template of the inventory operators named in `ops` (default_template_for)."""
    if not isinstance(name, str) or not name:
        raise SpaceError(f"a template needs a non-empty name, got {name!r}")

    def deco(fn: Callable):
        if name in _TEMPLATES and _TEMPLATES[name] is not fn:
            raise SpaceError(f"a template named {name!r} is already registered")
        for op in ops:
            if _TEMPLATE_FOR_OP.get(op, name) != name:
                raise SpaceError(f"operator {op!r} already has the template {_TEMPLATE_FOR_OP[op]!r}")
        _TEMPLATES[name] = fn
        _TEMPLATE_FOR_OP.update({op: name for op in ops})
        return fn
    return deco


def get_template(name: str) -> Callable:
    fn = _TEMPLATES.get(name)
    if fn is None:
        raise SpaceError(f"unknown template {name!r}; known templates: {', '.join(sorted(_TEMPLATES)) or 'none'}")
    return fn


def list_templates() -> list:
    return sorted(_TEMPLATES)


def template_for_op() -> dict:
    """{inventory operator: its built-in template's name}, as the templates declared it."""
    return dict(_TEMPLATE_FOR_OP)


def default_template_for(opdef):
    """The built-in template for an inventory operator, or None (use a SketchSpace then)."""
    name = getattr(opdef, "name", None)
    return None if name is None else _TEMPLATE_FOR_OP.get(name)


# ----------------------------------------------------------------------------- entities

class SplitEntity:
    """Loop extents of a split, outermost first; `apply` splits a loop accordingly."""

    def __init__(self, size):
        self.size = list(size)

    def apply(self, stage, axis) -> list:
        """Split `axis` of `stage` into len(size) loops, outermost first."""
        loops, cur = [], axis
        for d in range(1, len(self.size)):
            outer, cur = stage.split(cur, factor=math.prod(self.size[d:]))
            loops.append(outer)
        loops.append(cur)
        return loops

    def __repr__(self):
        return f"SplitEntity({self.size})"


class OtherOptionEntity:
    def __init__(self, val):
        self.val = val

    def __repr__(self):
        return f"OtherOptionEntity({self.val!r})"


class ReorderEntity:
    def __init__(self, perm):
        self.perm = list(perm)

    def apply(self, stage, axes) -> list:
        """Reorder `axes` (a list of loops, None entries skipped) by the permutation."""
        axes = list(axes)
        if len(axes) != len(self.perm):
            raise SpaceError(f"reorder entity of {len(self.perm)} axes applied to {len(axes)}")
        ordered = [axes[p] for p in self.perm]
        real = [a for a in ordered if a is not None]
        if len(real) > 1:
            stage.reorder(*real)
        return ordered

    def __repr__(self):
        return f"ReorderEntity({self.perm})"


class AnnotateEntity:
    def __init__(self, anns):
        self.anns = list(anns)

    def apply(self, stage, axes):
        for ax, ann in zip(axes, self.anns):
            if ax is None or ann == "none":
                continue
            if ann == "unroll":
                stage.unroll(ax)
            elif ann == "vec":
                stage.vectorize(ax)
            elif ann == "parallel":
                stage.parallel(ax)

    def __repr__(self):
        return f"AnnotateEntity({self.anns})"


# ----------------------------------------------------------------------------- knobs

def _key(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _jsonable(value, what):
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        raise SpaceError(f"{what}: value {value!r} is not JSON-able") from None


class Knob:
    kind = "knob"

    def __init__(self, name: str, entities: list, definition: dict):
        if not entities:
            raise SpaceError(f"knob {name!r} has no values")
        self.name = name
        self.entities = [_jsonable(e, f"knob {name!r}") for e in entities]
        self.definition = definition
        self._index: dict[str, int] = {}
        for i, e in enumerate(self.entities):
            k = _key(e)
            if k in self._index:
                raise SpaceError(f"knob {name!r}: value {e!r} is listed twice")
            self._index[k] = i

    def __len__(self):
        return len(self.entities)

    def index(self, value) -> int:
        try:
            i = self._index.get(_key(value))
        except (TypeError, ValueError):
            i = None
        if i is None:
            shown = self.entities if len(self.entities) <= 12 else self.entities[:12] + ["..."]
            raise SpaceError(f"knob {self.name!r}: value {value!r} is not in the space; values: {shown}")
        return i

    def wrap(self, value):
        return OtherOptionEntity(value)

    def __repr__(self):
        return f"{type(self).__name__}({self.name}, {len(self)} values)"


class SplitKnob(Knob):
    kind = "split"

    def wrap(self, value):
        return SplitEntity(value)


class ReorderKnob(Knob):
    kind = "reorder"

    def wrap(self, value):
        return ReorderEntity(value)


class AnnotateKnob(Knob):
    kind = "annotate"

    def wrap(self, value):
        return AnnotateEntity(value)


def _check_pos_int(what, v, minimum=1):
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise SpaceError(f"{what} must be an integer >= {minimum}, got {v!r}")
    return v


def _divisors(n: int) -> list:
    return [d for d in range(1, n + 1) if n % d == 0]


def _split_entities(name, extent, num_outputs, policy, candidate, max_factor) -> list:
    _check_pos_int(f"define_split({name!r}): extent", extent)
    _check_pos_int(f"define_split({name!r}): num_outputs", num_outputs, 2)
    if max_factor is not None:
        _check_pos_int(f"define_split({name!r}): max_factor", max_factor)
    cap = max_factor or extent
    n_inner = num_outputs - 1

    def full(inner):
        return [-(-extent // math.prod(inner))] + list(inner)

    if policy == "factors":
        out = []

        def rec(rest, acc):
            if len(acc) == n_inner:
                out.append(full(acc))
                return
            for d in _divisors(rest):
                if d <= cap:
                    rec(rest // d, acc + [d])
        rec(extent, [])
        return out
    if policy == "power2":
        pows = [1 << p for p in range(0, 31) if (1 << p) <= min(extent, cap)]
        return [full(c) for c in itertools.product(pows, repeat=n_inner) if math.prod(c) <= extent]
    if policy == "candidate":
        if not candidate or not isinstance(candidate, (list, tuple)):
            raise SpaceError(f"define_split({name!r}): policy 'candidate' needs a non-empty candidate list")
        out = []
        for c in candidate:
            if not isinstance(c, (list, tuple)) or len(c) not in (n_inner, num_outputs):
                raise SpaceError(f"define_split({name!r}): candidate {c!r} must list {n_inner} inner factors "
                                 f"or {num_outputs} sizes (outer first, -1 for 'the rest')")
            inner = list(c[1:]) if len(c) == num_outputs else list(c)
            for f in inner:
                _check_pos_int(f"define_split({name!r}): candidate factor", f)
            e = full(inner)
            if len(c) == num_outputs and c[0] not in (-1, e[0]):
                raise SpaceError(f"define_split({name!r}): candidate {c!r}: outer size must be -1 or {e[0]}")
            if e not in out:
                out.append(e)
        return out
    raise SpaceError(f"define_split({name!r}): unknown policy {policy!r}; use 'factors', 'power2' or 'candidate'")


_ANNOTATE_CHOICES = {
    "none": lambda n: [["none"] * n],
    "try_unroll": lambda n: [list(c) for c in itertools.product(["none", "unroll"], repeat=n)],
    "try_vec": lambda n: [["none"] * n] + ([["none"] * (n - 1) + ["vec"]] if n else []),
    "try_unroll_vec": lambda n: [list(c) + [last] for c in itertools.product(["none", "unroll"], repeat=n - 1)
                                 for last in ("none", "unroll", "vec")] if n else [[]],
}


# ----------------------------------------------------------------------------- the knob declarer

class _Declarer:
    """The define_* methods shared by ConfigSpace (declares) and Config (checks)."""

    def define_split(self, name, extent, num_outputs=2, policy="factors", candidate=None, max_factor=None):
        """Split a loop of `extent` into `num_outputs` loops; policy "factors" (exact
        factorizations), "power2" (power-of-two inner factors, the outer loop takes the rest)
        or "candidate" (explicit lists of inner factors, or of sizes with -1 for the outer)."""
        return self._declare(name, lambda: SplitKnob(
            name, _split_entities(name, extent, num_outputs, policy, candidate, max_factor),
            dict(kind="split", extent=extent, num_outputs=num_outputs, policy=policy)))

    def define_knob(self, name, values):
        """A knob taking one of `values` (JSON-able, distinct)."""
        def make():
            if not isinstance(values, (list, tuple)) or not values:
                raise SpaceError(f"define_knob({name!r}): values must be a non-empty list")
            return Knob(name, list(values), dict(kind="knob"))
        return self._declare(name, make)

    def define_reorder(self, name, axes_count, policy="all", candidate=None):
        """An order of `axes_count` loops: every permutation ("all") or the given ones ("candidate")."""
        def make():
            _check_pos_int(f"define_reorder({name!r}): axes_count", axes_count)
            if policy == "all":
                if axes_count > MAX_REORDER_AXES:
                    raise SpaceError(f"define_reorder({name!r}): {axes_count} axes have too many orders; "
                                     "give policy='candidate' with the orders to try")
                ents = [list(p) for p in itertools.permutations(range(axes_count))]
            elif policy == "candidate":
                if not candidate:
                    raise SpaceError(f"define_reorder({name!r}): policy 'candidate' needs a candidate list")
                ents = []
                for p in candidate:
                    if sorted(p) != list(range(axes_count)):
                        raise SpaceError(f"define_reorder({name!r}): {p!r} is not a permutation of "
                                         f"range({axes_count})")
                    ents.append(list(p))
            else:
                raise SpaceError(f"define_reorder({name!r}): unknown policy {policy!r}; use 'all' or 'candidate'")
            return ReorderKnob(name, ents, dict(kind="reorder", axes_count=axes_count))
        return self._declare(name, make)

    def define_annotate(self, name, n, policy="try_unroll", candidate=None):
        """Annotations of `n` loops: policy "try_unroll" (each unrolled or not), "try_vec" (the
        last vectorized or not), "try_unroll_vec" (both), "none", or "candidate" lists."""
        def make():
            _check_pos_int(f"define_annotate({name!r}): n", n, 0)
            if policy == "candidate":
                if not candidate:
                    raise SpaceError(f"define_annotate({name!r}): policy 'candidate' needs a candidate list")
                for c in candidate:
                    if len(c) != n or any(a not in ("none", "unroll", "vec", "parallel") for a in c):
                        raise SpaceError(f"define_annotate({name!r}): bad candidate {c!r}")
                ents = [list(c) for c in candidate]
            elif policy in _ANNOTATE_CHOICES:
                ents = _ANNOTATE_CHOICES[policy](n)
            else:
                raise SpaceError(f"define_annotate({name!r}): unknown policy {policy!r}; use one of "
                                 f"{', '.join(list(_ANNOTATE_CHOICES) + ['candidate'])}")
            return AnnotateKnob(name, ents, dict(kind="annotate", n=n, policy=policy))
        return self._declare(name, make)

    def _declare(self, name, make):  # pragma: no cover - overridden
        """Declare knob `name`; `make()` builds it (its values, checked): the define pass calls
        it, an apply pass only checks the name (the define pass of the same workload built it)."""
        raise NotImplementedError


class ConfigSpace(_Declarer):
    """The knobs a template declared; enumerable by a mixed-radix index (first knob fastest)."""

    def __init__(self, template_name: str = ""):
        self.template_name = template_name
        self.knobs: dict = {}

    # -- define pass
    def _declare(self, name, make):
        if not isinstance(name, str) or not name:
            raise SpaceError(f"a knob needs a non-empty string name, got {name!r}")
        if name in self.knobs:
            raise SpaceError(f"template {self.template_name!r} declares knob {name!r} twice")
        knob = self.knobs[name] = make()
        return knob.wrap(knob.entities[0])

    def __getitem__(self, name):
        """On the define pass a template reads the first value of each knob."""
        knob = self.knobs.get(name)
        if knob is None:
            raise SpaceError(f"template {self.template_name!r} reads knob {name!r} before declaring it")
        return knob.wrap(knob.entities[0])

    # -- the space
    def __len__(self):
        return math.prod(len(k) for k in self.knobs.values())

    def __iter__(self):
        for i in range(len(self)):
            yield self.get(i)

    def get(self, index: int) -> "Config":
        if isinstance(index, bool) or not isinstance(index, int):
            raise SpaceError(f"config index must be an integer, got {index!r}")
        n = len(self)
        if not 0 <= index < n:
            raise SpaceError(f"config index {index} out of range; the space has {n} configs")
        values = {}
        for name, knob in self.knobs.items():
            index, r = divmod(index, len(knob))
            values[name] = knob.entities[r]
        return Config(self, values)

    def index_of(self, config) -> int:
        values = config.knobs if isinstance(config, Config) else config
        cfg = self.config(values)
        index, radix = 0, 1
        for name, knob in self.knobs.items():
            index += knob.index(cfg.knobs[name]) * radix
            radix *= len(knob)
        return index

    def config(self, values: dict) -> "Config":
        """A Config from knob name → value; SpaceError when a knob is missing, unknown or its
        value is not in the space."""
        if not isinstance(values, dict):
            raise SpaceError(f"config knobs must be a dict of knob name -> value, got {type(values).__name__}")
        unknown = sorted(set(values) - set(self.knobs))
        if unknown:
            raise SpaceError(f"template {self.template_name!r} has no knob(s) {', '.join(unknown)}; "
                             f"knobs: {', '.join(self.knobs)}")
        missing = [k for k in self.knobs if k not in values]
        if missing:
            raise SpaceError(f"config for template {self.template_name!r} misses knob(s) {', '.join(missing)}")
        for name, knob in self.knobs.items():
            knob.index(values[name])
        return Config(self, {k: _jsonable(values[k], k) for k in self.knobs})

    def sample(self, rng) -> "Config":
        return Config(self, {name: knob.entities[int(rng.integers(len(knob)))]
                             for name, knob in self.knobs.items()})

    def default(self) -> "Config":
        return self.get(0)

    def __repr__(self):
        knobs = ", ".join(f"{k}:{len(v)}" for k, v in self.knobs.items())
        return f"ConfigSpace({self.template_name}, {len(self)} configs: {knobs})"


class Config(_Declarer):
    """One point of a ConfigSpace: knob name → value. Passed to the template on an apply pass."""

    def __init__(self, space: ConfigSpace, values: dict):
        self.space = space
        self.knobs = dict(values)
        self._declared: set = set()

    @property
    def template_name(self) -> str:
        return self.space.template_name

    def _declare(self, name, make):
        if name in self._declared:
            raise SpaceError(f"template {self.template_name!r} declares knob {name!r} twice")
        self._declared.add(name)
        if name not in self.space.knobs:
            raise SpaceError(f"template {self.template_name!r} declares knob {name!r} only on some "
                             "calls; knobs must be declared unconditionally")
        return self[name]

    def __getitem__(self, name):
        knob = self.space.knobs.get(name)
        if knob is None or name not in self.knobs:
            raise SpaceError(f"template {self.template_name!r} has no knob {name!r}")
        return knob.wrap(self.knobs[name])

    def __iter__(self):
        return iter(self.knobs)

    def __eq__(self, other):
        return isinstance(other, Config) and other.template_name == self.template_name and \
            _key(other.knobs) == _key(self.knobs)

    def __hash__(self):
        return hash((self.template_name, _key(self.knobs)))

    @property
    def index(self) -> int:
        return self.space.index_of(self)

    def to_json(self) -> dict:
        return {"template": self.template_name, "knobs": json.loads(_key(self.knobs))}

    def to_json_text(self) -> str:
        return _key(self.to_json())

    def candidate(self) -> Candidate:
        return Candidate("config", self.to_json())

    def __repr__(self):
        return f"Config({self.template_name}, {self.knobs})"


# ----------------------------------------------------------------------------- running templates

def _run(fn, cfg, opdef, target):
    try:
        out = fn(cfg, opdef, target)
    except SpaceError:
        raise
    except CompilerError as e:
        raise SpaceError(f"template {cfg.template_name!r} does not apply to {opdef.name}: {e}") from None
    if not (isinstance(out, tuple) and len(out) == 2):
        raise SpaceError(f"template {cfg.template_name!r} must return (schedule, args), got {type(out).__name__}")
    return out


# id(opdef) -> {(template name, target): ConfigSpace}, dropped with the opdef. A model-guided
# search instantiates every candidate it ranks (a thousand per 64-trial run), and re-running the
# define pass for each was a fifth of the search's time. (OpDefs compare by value and do not hash.)
_DEFINED: dict = {}


def define_space(template_name: str, opdef, target=None) -> ConfigSpace:
    """Run the template's define pass: the ConfigSpace of its knobs for `opdef` on `target`.
    The space is remembered per opdef, template and target (callers only read it)."""
    fn = get_template(template_name)
    target = resolve_target(target)
    per_op = _DEFINED.get(id(opdef))
    if per_op is None:
        per_op = _DEFINED[id(opdef)] = {}
        weakref.finalize(opdef, _DEFINED.pop, id(opdef), None)
    key = (template_name, fn, target)   # the function too: a name registered again is a new template
    space = per_op.get(key)
    if space is None:
        space = ConfigSpace(template_name)
        _run(fn, space, opdef, target)
        if not space.knobs:
            raise SpaceError(f"template {template_name!r} declares no knobs")
        per_op[key] = space
    return space


def apply_config(config: Config, opdef, target=None):
    """(schedule, args) of the template with the config's knob values."""
    fn = get_template(config.template_name)
    cfg = Config(config.space, config.knobs)
    return _run(fn, cfg, opdef, resolve_target(target))


def _payload(cand: Candidate):
    if cand.kind != "config":
        raise SpaceError(f"expected a 'config' candidate, got kind {cand.kind!r}")
    p = cand.payload
    if not isinstance(p, dict) or not isinstance(p.get("template"), str) or not isinstance(p.get("knobs"), dict):
        raise SpaceError("a config candidate's payload must be {'template': name, 'knobs': {...}}")
    return p


def instantiate_config(opdef, cand: Candidate, target=None):
    """`instantiate` for configs: the template's space on this workload and target."""
    p = _payload(cand)
    target = resolve_target(target)
    space = define_space(p["template"], opdef, target)
    return apply_config(space.config(p["knobs"]), opdef, target)


# ----------------------------------------------------------------------------- the search space

class TemplateSpace(SearchSpace):
    """The configs of one template for one workload and target."""

    kind = "config"

    def __init__(self, task_or_opdef, template_name: str | None = None, target=None):
        self.opdef, self.target = resolve_task(task_or_opdef, target)
        if template_name is None:
            template_name = default_template_for(self.opdef)
            if template_name is None:
                raise SpaceError(f"no built-in template for operator {self.opdef.name!r}; name one "
                                 f"({', '.join(list_templates())}) or use a SketchSpace")
        self.template_name = template_name
        self.config_space = define_space(template_name, self.opdef, self.target)

    # -- config <-> candidate

    def structure(self):
        return ("config", "template", frozenset({self.template_name}))

    def same_structure(self, cand: Candidate) -> bool:
        return (cand.kind == "config" and isinstance(cand.payload, dict)
                and cand.payload.get("template") == self.template_name)

    def config_of(self, cand: Candidate) -> Config:
        p = _payload(cand)
        if p["template"] != self.template_name:
            raise SpaceError(f"candidate is a config of template {p['template']!r}, this space is "
                             f"{self.template_name!r}")
        return self.config_space.config(p["knobs"])

    def _cand(self, cfg: Config) -> Candidate:
        return cfg.candidate()

    # -- SearchSpace
    def sample(self, rng) -> Candidate:
        return self._cand(self.config_space.sample(rng))

    def mutate(self, cand: Candidate, rng) -> Candidate:
        cfg = self.config_of(cand)
        names = [n for n, k in self.config_space.knobs.items() if len(k) > 1]
        if not names:
            return cand
        name = names[int(rng.integers(len(names)))]
        knob = self.config_space.knobs[name]
        cur = knob.index(cfg.knobs[name])
        new = int(rng.integers(len(knob) - 1))
        new += new >= cur
        values = dict(cfg.knobs)
        values[name] = knob.entities[new]
        return self._cand(Config(self.config_space, values))

    def crossover(self, a: Candidate, b: Candidate, rng) -> Candidate:
        ca, cb = self.config_of(a), self.config_of(b)
        values = {n: (ca.knobs[n] if rng.random() < 0.5 else cb.knobs[n]) for n in self.config_space.knobs}
        return self._cand(Config(self.config_space, values))

    @property
    def enumerable(self) -> bool:
        return True

    def __len__(self) -> int:
        return len(self.config_space)

    def get(self, index: int) -> Candidate:
        return self._cand(self.config_space.get(index))

    def index_of(self, cand: Candidate) -> int:
        return self.config_space.index_of(self.config_of(cand))

    def default(self) -> Candidate:
        return self.get(0)

    def starting_points(self) -> list:
        return [self.default()]   # config 0 is the default schedule

    def schedule(self, opdef, cand: Candidate):
        return apply_config(self.config_of(cand), opdef, self.target)

    def __repr__(self):
        return f"TemplateSpace({self.template_name} on {self.opdef.name}, {len(self)} configs)"


register_space_kind("config", instantiate_config)

__all__ = ["template", "get_template", "list_templates", "default_template_for", "ConfigSpace", "Config",
           "TemplateSpace", "SplitEntity", "OtherOptionEntity", "ReorderEntity", "AnnotateEntity",
           "define_space", "apply_config"]
