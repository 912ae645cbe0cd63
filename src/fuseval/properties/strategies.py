"""Hypothesis strategies over each operator's axis space and input space.

What is drawn, and why it shrinks well
--------------------------------------
An :class:`Example` is four small, readable values: an axis :class:`Binding` (a
scaled-down const configuration plus the var axes), an input ``mode``, an input ``seed``
and, for adversarial inputs, a :class:`Recipe`. The tensors themselves are a pure
function of those values (:meth:`Example.tensors`), so

* a failing example prints as a few integers and names, never as a tensor dump;
* shrinking works on those values: the var axes towards 1, the configuration towards the
  first (simplest) entry of each list, the seed towards 0 and every recipe field towards
  its plain default, so a counterexample keeps only the features that matter
  (e.g. ``Recipe(magnitude='tiny')`` alone);
* the same example is reproduced anywhere from one command line (see
  :meth:`Example.command`).

What an operator contributes (head axes, per-space const values, which input is the
activation, its RoPE tables, its own adversarial features...) comes from its
:class:`~fuseval.properties.hooks.PropertyHooks`; an operator without hooks gets the
generic space of its definition.

Modes
-----
``benchmark``  SOL-ExecBench's own distribution (``fuseval.inputs``).
``realistic``  cos/sin from real position ids, norm weights near 1, NVFP4 weights
               quantized with the standard recipe (``fuseval.inputs``).
``adversarial`` the benchmark draw, then reshaped by a :class:`Recipe`. Generic features:
               huge, tiny or per-row mixed magnitudes of the activations and all-zero
               activation rows (RMSNorm then returns 0 * rsqrt(eps)), a drawn eps (1e-2 or
               0.5 instead of 1e-6, so where eps sits in the formula changes the result),
               arbitrary rotary tables (independent cos and sin, not on the unit circle,
               with exact zeros and +-1), norm weights away from 1 (N(1, 0.5), so a norm
               weight that is ignored or mixed up shows) and non-contiguous input views;
               then the operator's own features (its ``recipe_features``, applied by its
               ``adversarial`` hook).
"""
from __future__ import annotations

import functools
import json
import math
import shlex
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence, Union

import torch
from hypothesis import assume
from hypothesis import strategies as st

from ..definitions import Definition
from ..operators import OperatorRecord
from ..inputs import MODES, DrawnInputs, generate_inputs, input_generator
from ..memory import DRAW_COPIES, draw_bytes
from .hooks import GENERIC_RECIPE_FIELDS, PropertyHooks, hooks_of, record_of
from .profiles import SPACES, Space
from ..definitions import evaluate_expression

__all__ = ["Binding", "Recipe", "Example", "axis_bindings", "draw_bytes", "DRAW_COPIES", "recipes", "inputs", "examples",
           "make_inputs", "make_recipe", "adversarial_inputs", "explicit_examples", "feature_generator",
           "INPUT_MODES", "GENERIC_FEATURES", "named_config", "recipe_features", "input_modes"]

INPUT_MODES = ("benchmark", "realistic", "adversarial")


# Every public function below takes the operator as its record, a Definition of it (what
# the layers below pass) or its name (a caller of the Python API's); ``record_of`` resolves a
# name once. What they build (bindings, examples) carries the record.
Operator = Union[str, Definition, OperatorRecord]


def input_modes(op: Operator, modes: Sequence[str] = INPUT_MODES) -> list[str]:
    """The modes of ``modes`` that ``op`` has (its hooks' ``input_modes``; all by default)."""
    have = hooks_of(record_of(op)).input_modes
    return [m for m in modes if have is None or m in have]


def _space(space: Space | str) -> Space:
    return SPACES[space] if isinstance(space, str) else space


# --------------------------------------------------------------------------- bindings
@dataclass(frozen=True)
class Binding:
    """A full axis binding of an operator (its record): the const configuration and the var
    axes. Two bindings are equal when they name the same operator and axes."""
    op: str
    consts: tuple[tuple[str, int], ...]
    var: tuple[tuple[str, int], ...]
    operator: OperatorRecord = field(compare=False, repr=False)

    @classmethod
    def make(cls, op: Operator, consts: Mapping[str, int], var: Mapping[str, int]) -> "Binding":
        record = record_of(op)
        return cls(record.name, tuple(sorted(consts.items())), tuple(var.items()), record)

    @property
    def config(self) -> dict[str, int]:
        return dict(self.consts)

    @property
    def axes(self) -> dict[str, int]:
        return dict(self.var)

    def definition(self) -> Definition:
        """The operator's definition at this configuration, under the variant in force."""
        return self.operator.load(named_config(self.operator, self.config) or self.config)

    def planned_bytes(self) -> int:
        """What one example of this binding plans for (:func:`~fuseval.memory.draw_bytes`)."""
        defn = self.definition()
        return draw_bytes(defn, defn.resolve_axes(self.axes))

    @property
    def config_arg(self) -> str:
        """A configuration name when the consts equal one, else a JSON mapping."""
        return named_config(self.operator, self.config) or json.dumps(self.config, separators=(",", ":"))

    def __repr__(self) -> str:
        c = ", ".join(f"{k}={v}" for k, v in self.consts)
        v = ", ".join(f"{k}={v}" for k, v in self.var)
        return f"Binding({self.op}: {c}; {v})"

    def _repr_pretty_(self, printer, cycle) -> None:
        # Hypothesis prints falsifying examples with this (IPython's protocol)
        printer.text(repr(self))


def named_config(op: Operator, consts: Mapping[str, int]) -> str | None:
    """The name of the definition's configuration whose const axes equal ``consts``."""
    base = record_of(op).load()
    for name in base.configs:
        if base.with_config(name).const_axes == dict(consts):
            return name
    return None


def _start_consts(base: Definition, sp: Space) -> dict[str, int]:
    """The const axes a space starts from: the seed configuration for the full space, else
    the space's configuration where the definition has it."""
    if not sp.full and sp.config in base.configs:
        return base.with_config(sp.config).const_axes
    return dict(base.const_axes)


def _var(defn: Definition, hooks: PropertyHooks, values: Mapping[str, int],
         offsets: Mapping[str, int] | None = None) -> dict[str, int]:
    """The var axes in definition order: ``values`` for the drawn ones, base + offset for
    the axes of ``hooks.var_offsets`` (offset 0 where ``offsets`` has none)."""
    out = {}
    for axis in defn.var_axes:
        if axis in hooks.var_offsets:
            base_axis, _ = hooks.var_offsets[axis]
            out[axis] = values[base_axis] + (offsets or {}).get(axis, 0)
        else:
            out[axis] = values[axis]
    return out


def _input_elements(defn: Definition, axes: Mapping[str, int]) -> int:
    """Elements of all tensor inputs for a full axis binding."""
    return sum(math.prod(defn.shape_of(spec, axes)) for spec in defn.inputs if not spec.is_scalar)


def _fits(binding: Binding, limit: int | None, max_bytes: int | None = None,
          relations: Sequence[str] = ()) -> bool:
    """Within the definition's constraints, the space's relations and, with ``limit``,
    that many input elements, and with ``max_bytes``, that much memory (:func:`draw_bytes`)."""
    try:
        defn = binding.definition()
        axes = defn.resolve_axes(binding.axes)
    except ValueError:
        return False
    if not all(evaluate_expression(r, axes) for r in relations):
        return False
    if max_bytes is not None and draw_bytes(defn, axes) > max_bytes:
        return False
    return limit is None or _input_elements(defn, axes) <= limit


def _valid(binding: Binding) -> bool:
    """Within the definition's constraints."""
    return _fits(binding, None)


def _draw_axis(draw, lo: int, hi: int, step: int) -> int:
    """A value in [lo, hi], a multiple of ``step`` where one is there."""
    if step <= 1:
        return draw(st.integers(lo, hi))
    first, last = -(-lo // step), hi // step
    return step * draw(st.integers(first, last)) if first <= last else draw(st.integers(lo, hi))


@st.composite
def axis_bindings(draw, op: Operator, space: Space | str = "small", max_bytes: int | None = None) -> Binding:
    """Strategy: an axis binding of ``op``.

    Scaled-down spaces draw the const configuration too (from the operator's hooks): kv
    heads x GQA ratio over its head axes, then each axis of ``axis_values[space]``; the
    ``full`` space keeps the seed configuration. The batch axis takes the space's batch
    range, every other var axis its sequence range (from 1), the offset axes a base axis
    plus a drawn offset; where the hooks give a ``var_space`` for the space (an imported
    problem's workloads), the var axes are one of its exact bindings or each drawn from its
    range (a multiple of its step, a tied axis computed from its base). Bindings that break
    the definition's constraints or the space's relations, or exceed the space's element
    limit or ``max_bytes`` (:func:`draw_bytes`), are rejected."""
    sp = _space(space)
    op = record_of(op)
    base = op.load()
    hooks = hooks_of(base)
    consts = _start_consts(base, sp)
    if not sp.full:
        if hooks.gqa_axes is not None:
            hq_name, hkv_name = hooks.gqa_axes
            kv = draw(st.sampled_from(sp.kv_heads))
            ratio = draw(st.sampled_from(sp.gqa_ratios))
            consts[hkv_name] = kv
            consts[hq_name] = kv * ratio
        for axis, values in hooks.axis_values.get(sp.name, {}).items():
            consts[axis] = draw(st.sampled_from(values))
    vs = hooks.var_space.get(sp.name)
    if vs is not None and vs.bindings and draw(st.booleans()):
        binding = Binding.make(op, consts, dict(draw(st.sampled_from(list(vs.bindings)))))
    else:
        drawn = {}
        ties = vs.ties if vs is not None else {}
        for axis in base.var_axes:
            if axis in hooks.var_offsets or axis in ties:
                continue
            if vs is not None and axis in vs.ranges:
                drawn[axis] = _draw_axis(draw, *vs.ranges[axis], vs.steps.get(axis, 1))
            else:
                drawn[axis] = draw(st.integers(*(sp.batch if axis == hooks.batch_axis else sp.seq_len)))
        for axis, (tied_to, factor, offset) in ties.items():
            drawn[axis] = factor * drawn[tied_to] + offset
        offsets = {axis: draw(st.sampled_from(values)) for axis, (_, values) in hooks.var_offsets.items()}
        binding = Binding.make(op, consts, _var(base, hooks, drawn, offsets))
    assume(_fits(binding, vs.max_elements if vs is not None else None, max_bytes,
                 vs.relations if vs is not None else ()))
    return binding


# --------------------------------------------------------------------------- recipes
@dataclass(frozen=True)
class Recipe:
    """How an adversarial draw departs from the benchmark draw. Every field's default is
    "no change", so shrinking a recipe strips the features a failure does not need.
    ``features`` holds the operator's own features (its hooks' ``recipe_features``) that
    differ from their defaults, in the hooks' order; build recipes with
    :func:`make_recipe` to get them checked and ordered."""
    magnitude: str = "unit"      # unit | tiny | huge | mixed (per activation row)
    zero_rows: int = 0           # number of all-zero activation rows
    eps: float | None = None     # the eps input; None keeps the definition's value
    rotary: str = "benchmark"    # benchmark | arbitrary (independent cos, sin in [-1, 1], 0, +-1)
    noncontiguous: bool = False  # pass strided / column-major views instead of contiguous tensors
    norm_weights: str = "benchmark"  # benchmark (ones) | random (N(1, 0.5): some near 0 or negative)
    features: tuple[tuple[str, Any], ...] = ()

    def get(self, name: str, default: Any = None) -> Any:
        """The value of an operator feature (``default`` when the recipe leaves it alone)."""
        return dict(self.features).get(name, default)

    def to_json(self) -> str:
        changed = {f.name: getattr(self, f.name) for f in fields(self)
                   if f.name != "features" and getattr(self, f.name) != f.default}
        changed.update(self.features)
        return json.dumps(changed, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | Mapping[str, Any] | None, op: "Operator | None" = None) -> "Recipe":
        """The recipe of :meth:`to_json`; ``op`` admits that operator's own features."""
        if not text:
            return cls()
        data = json.loads(text) if isinstance(text, str) else dict(text)
        return make_recipe(op, **data)

    def __repr__(self) -> str:
        return f"Recipe({self.to_json()})"

    def _repr_pretty_(self, printer, cycle) -> None:
        # Hypothesis prints falsifying examples with this (IPython's protocol)
        printer.text(repr(self))


_GENERIC_FIELDS = tuple(f.name for f in fields(Recipe) if f.name != "features")
if tuple(f.name for f in fields(Recipe)) != GENERIC_RECIPE_FIELDS:
    raise ImportError(f"Recipe's fields {[f.name for f in fields(Recipe)]} differ from "
                      f"fuseval.properties.hooks.GENERIC_RECIPE_FIELDS {list(GENERIC_RECIPE_FIELDS)}")

# the generic features' strategies, plain value first (they shrink to "no change")
GENERIC_FEATURES: dict[str, st.SearchStrategy] = {
    "magnitude": st.sampled_from(["unit", "tiny", "huge", "mixed"]),
    "zero_rows": st.integers(0, 2),
    "eps": st.sampled_from([None, 1e-2, 0.5]),
    "rotary": st.sampled_from(["benchmark", "arbitrary"]),
    "noncontiguous": st.booleans(),
    "norm_weights": st.sampled_from(["benchmark", "random"]),
}


def _activation(defn: Definition, hooks: PropertyHooks) -> str | None:
    """The input the magnitude and zero-row features act on."""
    if hooks.activation_input is not None:
        return hooks.activation_input
    for spec in defn.inputs:
        if not spec.is_scalar and spec.dtype in ("float32", "bfloat16", "float16", "float64") \
                and spec.shape and spec.shape[0] == hooks.batch_axis:
            return spec.name
    return None


def _norm_weights(defn: Definition, hooks: PropertyHooks) -> list[str]:
    if hooks.norm_weight_inputs is not None:
        return list(hooks.norm_weight_inputs)
    return [spec.name for spec in defn.inputs if spec.name.endswith("norm_weight")]


def recipe_features(op: Operator) -> list[str]:
    """The recipe fields that apply to ``op``: the generic ones its inputs allow, then its own."""
    defn = record_of(op).load()
    hooks = hooks_of(defn)
    applies = {"magnitude": _activation(defn, hooks) is not None,
               "zero_rows": _activation(defn, hooks) is not None,
               "eps": hooks.eps_input is not None,
               "rotary": bool(hooks.rotary_inputs),
               "noncontiguous": hooks.noncontiguous,
               "norm_weights": bool(_norm_weights(defn, hooks))}
    return [name for name in _GENERIC_FIELDS if applies[name]] + list(hooks.recipe_features)


def make_recipe(op: Operator | None, **values: Any) -> Recipe:
    """A :class:`Recipe` from field values: the generic fields, plus (with ``op``) that
    operator's own features, kept in its hooks' order and only where they differ from their
    defaults. An unknown field is a ValueError that names the known ones."""
    record = record_of(op) if op is not None else None
    own = hooks_of(record).recipe_features if record is not None else {}
    unknown = set(values) - set(_GENERIC_FIELDS) - set(own)
    if unknown:
        known = sorted([*_GENERIC_FIELDS, *own])
        where = f" of {record.name}" if record is not None else " (name the operator to use its own features)"
        raise ValueError(f"recipe: unknown fields {sorted(unknown)}{where}; known: {known}")
    features = tuple((name, values[name]) for name, feature in own.items()
                     if name in values and values[name] != feature.default)
    return Recipe(**{k: v for k, v in values.items() if k in _GENERIC_FIELDS}, features=features)


def recipes(op: Operator) -> st.SearchStrategy[Recipe]:
    """Strategy: an adversarial :class:`Recipe` for ``op`` (plain fields first, so they
    shrink to "no change"); only the features that apply to ``op`` are drawn."""
    op = record_of(op)
    own = hooks_of(op).recipe_features
    strategies = {name: GENERIC_FEATURES[name] if name in GENERIC_FEATURES else own[name].values
                  for name in recipe_features(op)}
    return st.builds(functools.partial(make_recipe, op), **strategies)


# --------------------------------------------------------------------------- examples
@dataclass(frozen=True)
class Example:
    """One drawn point of an operator's input space (tensors built on demand)."""
    binding: Binding
    mode: str
    seed: int
    recipe: Recipe | None = None

    @property
    def op(self) -> str:
        return self.binding.op

    @property
    def well_conditioned(self) -> bool:
        """Benchmark and realistic draws (the tighter bound applies to these)."""
        return self.mode != "adversarial"

    def definition(self) -> Definition:
        return self.binding.definition()

    def tensors(self, device: str | torch.device = "cpu") -> list[Any]:
        return make_inputs(self.binding, self.mode, self.seed, self.recipe, device=device)

    def describe(self) -> str:
        lines = [f"operator: {self.op}",
                 f"axis binding: {json.dumps(self.binding.config)} {json.dumps(self.binding.axes)}"
                 f" (config {self.binding.config_arg})",
                 f"input mode: {self.mode}" + (f", recipe {self.recipe.to_json()}" if self.recipe else ""),
                 f"seed: {self.seed}"]
        return "\n".join(lines)

    def command(self, impl: str, device: str = "cpu") -> str:
        """One shell command that reruns exactly this example."""
        parts = ["fuseval", "property", *_problem_args(self.definition()), "--op", self.op, "--impl", impl,
                 "--config", self.binding.config_arg, "--axes",
                 json.dumps(self.binding.axes, separators=(",", ":")),
                 "--mode", self.mode, "--seed", str(self.seed)]
        if self.recipe is not None and self.recipe != Recipe():
            parts += ["--recipe", self.recipe.to_json()]
        if device != "cpu":
            parts += ["--device", device]
        return " ".join(shlex.quote(p) for p in parts)

    def check_command(self, impl: str, device: str = "cpu") -> str:
        """The closest ``fuseval check`` command (same configuration, mode and seed, but on
        the configuration's benchmark cases rather than this example's var axes)."""
        mode = self.mode if self.mode in MODES else "benchmark"
        parts = ["fuseval", "check", *_problem_args(self.definition()), "--op", self.op, "--impl", impl, "--config",
                 self.binding.config_arg, "--seed", str(self.seed), "--mode", mode]
        if device != "cpu":
            parts += ["--device", device]
        return " ".join(shlex.quote(p) for p in parts)

    def __repr__(self) -> str:
        r = f", recipe={self.recipe!r}" if self.recipe is not None else ""
        return f"Example({self.binding!r}, mode={self.mode!r}, seed={self.seed}{r})"

    def _repr_pretty_(self, printer, cycle) -> None:
        # Hypothesis prints falsifying examples with this (IPython's protocol)
        printer.text(repr(self))


def _problem_args(defn: Definition) -> list[str]:
    """``--problem DIR`` where ``defn`` is a problem folder's operator (a command registers it first)."""
    directory = defn.operator.directory
    return ["--problem", directory] if directory else []


def inputs(op: Operator, binding: Binding | None = None, mode: str | None = None, *,
           space: Space | str = "small") -> st.SearchStrategy[Example]:
    """Strategy: an :class:`Example` of ``op`` (call ``.tensors(device)`` for the inputs).

    ``binding`` / ``mode`` fix those parts; left out, they are drawn too."""
    op = record_of(op)
    b = st.just(binding) if binding is not None else axis_bindings(op, space)
    modes = [mode] if mode is not None else list(INPUT_MODES)
    for m in modes:
        if m not in INPUT_MODES:
            raise ValueError(f"input mode must be one of {INPUT_MODES}, got {m!r}")
    return examples(op, space=space, modes=modes, binding=b)


@st.composite
def examples(draw, op: Operator, space: Space | str = "small", modes: Sequence[str] = INPUT_MODES,
             binding: st.SearchStrategy[Binding] | None = None, max_bytes: int | None = None) -> Example:
    """Strategy: binding, mode, seed and (adversarial mode) recipe (``max_bytes``: see
    :func:`axis_bindings`)."""
    op = record_of(op)
    b = draw(binding if binding is not None else axis_bindings(op, space, max_bytes))
    mode = draw(st.sampled_from(list(modes)))
    recipe = draw(recipes(op)) if mode == "adversarial" else None
    seed = draw(st.integers(0, 2**31 - 1))
    return Example(b, mode, seed, recipe)


def _explicit_bindings(op: OperatorRecord, base: Definition, hooks: PropertyHooks, sp: Space) -> list[Binding]:
    vs = hooks.var_space.get(sp.name)
    if vs is not None and vs.bindings:
        # the space's first two exact bindings (the same one twice when it has one)
        consts = _start_consts(base, sp)
        chosen = list(vs.bindings[:2]) * (2 if len(vs.bindings) == 1 else 1)
        return [Binding.make(op, consts, dict(b)) for b in chosen[:2]]
    if sp.full:
        var = [(2, 131), (1, 64)]
        consts = base.const_axes
    elif hooks.explicit_bindings:
        start = _start_consts(base, sp)
        return [Binding.make(op, {**start, **c}, v) for c, v in hooks.explicit_bindings]
    else:
        var = [(2, 5), (1, 3)]
        consts = _start_consts(base, sp)
    out = []
    for batch, seq in var:
        values = {axis: batch if axis == hooks.batch_axis else seq for axis in base.var_axes}
        out.append(Binding.make(op, consts, _var(base, hooks, values)))
    return out


def explicit_examples(op: Operator, space: Space | str = "small") -> list[Example]:
    """Examples every property run starts with, whatever the seed: one per input mode and
    one per family of adversarial features (those that apply to ``op``) on the operator's
    two explicit bindings (its hooks' ``explicit_bindings``, chosen where the corners are:
    GQA ratio 2 over 2 kv heads, where i // group and i % kv_heads differ, ratio 7, a
    hidden size off the tile sizes), then its hooks' ``extra_examples``. They make the
    suite's verdict on a broken implementation independent of the random draws."""
    sp = _space(space)
    op = record_of(op)
    base = op.load()
    hooks = hooks_of(base)
    b1, b2 = _explicit_bindings(op, base, hooks, sp)
    applies = set(recipe_features(op))
    recipe = lambda **kw: make_recipe(op, **{k: v for k, v in kw.items() if k in applies})
    out = [Example(b1, "benchmark", 1), Example(b1, "realistic", 2), Example(b2, "benchmark", 3),
           Example(b1, "adversarial", 4, recipe(magnitude="tiny", zero_rows=1)),
           Example(b1, "adversarial", 5, recipe(magnitude="mixed", eps=0.5, rotary="arbitrary",
                                                noncontiguous=True, norm_weights="random"))]
    for extra in hooks.extra_examples:
        r = make_recipe(op, **extra.recipe) if extra.mode == "adversarial" else None
        out.append(Example((b1, b2)[extra.binding], extra.mode, extra.seed, r))
    return out


# --------------------------------------------------------------------------- tensors
def make_inputs(binding: Binding, mode: str, seed: int, recipe: Recipe | None = None, *,
                device: str | torch.device = "cpu") -> list[Any]:
    """The inputs (definition order) of one example; deterministic in its arguments."""
    defn = binding.definition()
    if mode in MODES:
        return generate_inputs(defn, binding.axes, seed=seed, mode=mode, device=device)
    if mode != "adversarial":
        raise ValueError(f"input mode must be one of {INPUT_MODES}, got {mode!r}")
    return adversarial_inputs(defn, binding.axes, seed=seed, recipe=recipe or Recipe(), device=device)


def feature_generator(seed: int, feature: str) -> torch.Generator:
    """The random stream of one adversarial feature of one example: switching a feature on
    or off (as shrinking does) leaves the values of the others unchanged."""
    return input_generator(seed, "adversarial/" + feature)


def _row_factors(magnitudes, magnitude: str, rows: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Per-row scale factors [*rows, 1]: powers of two, exact in every float format."""
    if magnitude == "unit":
        return torch.ones(*rows, 1)
    if magnitude == "tiny":
        return torch.full((*rows, 1), 2.0 ** magnitudes.tiny)
    if magnitude == "huge":
        return torch.full((*rows, 1), 2.0 ** magnitudes.huge)
    if magnitude == "mixed":
        exps = torch.tensor(magnitudes.mixed, dtype=torch.float64)
        pick = torch.randint(0, len(exps), rows, generator=g)
        return torch.pow(2.0, exps[pick]).unsqueeze(-1).float()
    raise ValueError(f"recipe magnitude must be unit, tiny, huge or mixed, got {magnitude!r}")


def _zero_rows(x: torch.Tensor, n: int, g: torch.Generator) -> torch.Tensor:
    if n <= 0 or x.numel() == 0:      # an empty activation has no row to zero
        return x
    n_rows = x.numel() // max(x.shape[-1], 1)
    rows = torch.randperm(n_rows, generator=g)[:n]
    x = x.clone()
    x.view(n_rows, -1)[rows] = 0
    return x


def _arbitrary_table(shape, g: torch.Generator) -> torch.Tensor:
    """Independent values in [-1, 1], a fifth of them exactly 0, +1 or -1."""
    t = torch.rand(shape, generator=g, dtype=torch.float32) * 2 - 1
    special = torch.tensor([0.0, 1.0, -1.0])
    pick = torch.rand(shape, generator=g) < 0.2
    which = torch.randint(0, 3, shape, generator=g)
    return torch.where(pick, special[which], t)


def _noncontiguous(t: Any) -> Any:
    """The same values as a non-contiguous view: 2-D weights column-major, everything
    else strided (every other element of a twice-as-wide buffer along the last axis)."""
    if not isinstance(t, torch.Tensor) or t.dim() == 0:
        return t
    if t.dim() == 2 and t.shape[0] > 1 and t.shape[1] > 1:
        view = t.t().contiguous().t()
    else:
        buf = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device) \
            if t.dtype != torch.float8_e4m3fn else \
            torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=torch.uint8, device=t.device).view(t.dtype)
        view = buf[..., ::2]
        view.copy_(t)
    assert not view.is_contiguous() or t.numel() <= 1
    return view


def _check_recipe(defn: Definition, recipe: Recipe) -> None:
    """A recipe asks only for features ``defn``'s operator has."""
    applies = set(recipe_features(defn))
    asked = [f.name for f in fields(Recipe) if f.name != "features" and getattr(recipe, f.name) != f.default]
    asked += [name for name, _ in recipe.features]
    bad = [name for name in asked if name not in applies]
    if bad:
        raise ValueError(f"recipe fields {bad} do not apply to {defn.name} (its features: {sorted(applies)}), "
                         f"got {recipe!r}")


def adversarial_inputs(defn: Definition, var_axes: Mapping[str, int], *, seed: int,
                       recipe: Recipe, device: str | torch.device = "cpu") -> list[Any]:
    """Benchmark inputs reshaped by ``recipe`` (see the module docstring). The benchmark
    draw is made on ``device`` (as ``generate_inputs`` draws: a full-size draw on the CPU
    takes seconds), the recipe's features on the CPU from their own generators."""
    hooks = hooks_of(defn)
    _check_recipe(defn, recipe)
    drawn = generate_inputs(defn, var_axes, seed=seed, mode="benchmark", device=device)
    values = {n: (v.cpu() if isinstance(v, torch.Tensor) else v) for n, v in zip(defn.input_names, drawn)}
    del drawn
    # one generator per feature: switching one feature on or off (as shrinking does) leaves
    # the values of the others unchanged
    activation = _activation(defn, hooks)
    if activation is not None:
        x = values[activation]
        dtype = x.dtype
        factors = _row_factors(hooks.magnitudes, recipe.magnitude, tuple(x.shape[:-1]),
                               feature_generator(seed, "magnitude"))
        x = (x.float() * factors).to(dtype)
        values[activation] = _zero_rows(x, recipe.zero_rows, feature_generator(seed, "zero_rows"))
    if recipe.eps is not None:
        values[hooks.eps_input] = float(recipe.eps)
    if recipe.rotary == "arbitrary":
        g = feature_generator(seed, "rotary")
        for n in hooks.rotary_inputs:
            values[n] = _arbitrary_table(values[n].shape, g).to(values[n].dtype)
    elif recipe.rotary != "benchmark":
        raise ValueError(f"recipe rotary must be benchmark or arbitrary, got {recipe.rotary!r}")
    if recipe.norm_weights == "random":
        g = feature_generator(seed, "norm_weights")
        for name in _norm_weights(defn, hooks):
            w = values[name]
            values[name] = (1 + 0.5 * torch.randn(w.shape, generator=g)).to(w.dtype)
    elif recipe.norm_weights != "benchmark":
        raise ValueError(f"recipe norm_weights must be benchmark or random, got {recipe.norm_weights!r}")
    if hooks.adversarial is not None:
        hooks.adversarial(values, recipe, seed, defn)

    out = []
    for spec in defn.inputs:
        v = values[spec.name]
        if isinstance(v, torch.Tensor):
            v = v.to(device)
            if recipe.noncontiguous:
                v = _noncontiguous(v)
        out.append(v)
    return DrawnInputs(out, var_axes)
