"""Budget files: a declarative allowance per stage and end to end, per operator.

Format (docs/budget.md has the full description and the derivation of the defaults)::

    {
      "schema_version": 1,
      "op": "qwen2vl_decoder_layer",
      "description": "...",
      "defaults": {"dtype": "float32", "operand_dtype": "float32",
                   "allowance": [{"kind": "relative_to_naive", "factor": 2, "floor_ulp": 2}]},
      "stages": {
        "qkv_proj": {"operand_dtype": "tf32", "allowance": [...], "note": "..."},
        "mlp":      {...}          # a parent: applies to gate_up, act, down unless they have their own
      },
      "end_to_end": {"tolerance": true, "allowance": [...]}
    }

An allowance is ``{"kind": "abs", "max": X}``, ``{"kind": "ulp", "max": X}`` or
``{"kind": "relative_to_naive", "factor": F, "floor_ulp": N}``, with optional
``"metric"`` (which error metric it bounds, see :mod:`fuseval.budget.metrics`) and
``"applies_to"`` ("local", the default, or "propagated"). The metric ``tolerance_used``
(end to end only) is the share of each case's own tolerance the final outputs spend
(:func:`fuseval.budget.metrics.tolerance_use`): ``{"kind": "abs", "metric":
"tolerance_used", "max": 1}`` is "within each workload's tolerance". Numbers may be written as
expressions over the operator's axes (``"2 + log2(hidden_size)"``), evaluated per case.
A stage may list several allowances; all must hold.

Every problem in a file is a ``ValueError`` that names the file and the key path.
"""
from __future__ import annotations

import ast
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..definitions import Definition
from ..operators import load
from ..precision import PRECISIONS, canonical, check_precision, ulp, unit_roundoff
from .metrics import ABS_METRICS, METRICS, REL_METRICS, TOLERANCE_METRICS, ULP_METRICS
from .. import operators

__all__ = ["Allowance", "StageBudget", "EndToEndBudget", "Budget", "load_budget", "default_budget_path",
           "SCHEMA_VERSION", "KINDS"]

SCHEMA_VERSION = 1
KINDS = ("abs", "ulp", "relative_to_naive")
_DEFAULT_METRIC = {"abs": "max_abs", "ulp": "ulp_p99", "relative_to_naive": "max_abs"}
_FUNCTIONS = {"sqrt": math.sqrt, "log2": math.log2, "log": math.log, "ceil": math.ceil,
              "floor": math.floor, "min": min, "max": max, "abs": abs}
_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Name, ast.Load, ast.Call,
          ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd)


# --------------------------------------------------------------------------- numbers
@dataclass(frozen=True)
class Number:
    """A budget number: a constant, or an expression over axes evaluated per case."""
    text: str
    constant: float | None

    def words(self) -> str:
        if self.constant is not None:
            return f"{self.constant:g}"
        return f"({self.text})"

    def value(self, axes: Mapping[str, int]) -> float:
        if self.constant is not None:
            return self.constant
        tree = ast.parse(self.text, mode="eval")
        env = {**_FUNCTIONS, **{k: v for k, v in axes.items()}}
        return float(eval(compile(tree, "<budget>", "eval"), {"__builtins__": {}}, env))


def _number(raw: Any, where: str, axis_names: set[str], *, minimum: float = 0.0) -> Number:
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise ValueError(f"{where}: expected a number or an expression string, got {raw!r}")
    if not isinstance(raw, str):
        if not math.isfinite(raw) or raw < minimum:
            raise ValueError(f"{where}: expected a finite number >= {minimum}, got {raw!r}")
        return Number(repr(raw), float(raw))
    try:
        tree = ast.parse(raw, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"{where}: cannot parse expression {raw!r}: {exc.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _NODES):
            raise ValueError(f"{where}: expression {raw!r} uses {type(node).__name__}, which is not allowed "
                             f"(numbers, + - * / // % **, axis names and {', '.join(_FUNCTIONS)})")
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS or node.keywords:
                raise ValueError(f"{where}: expression {raw!r} calls something other than "
                                 f"{', '.join(_FUNCTIONS)}")
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float)):
            raise ValueError(f"{where}: expression {raw!r} holds a non-numeric constant {node.value!r}")
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call)}
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - called
    unknown = names - axis_names
    if unknown:
        raise ValueError(f"{where}: expression {raw!r} names {sorted(unknown)}, which are not axes of the "
                         f"operator (axes: {', '.join(sorted(axis_names))})")
    return Number(raw, None)


# --------------------------------------------------------------------------- allowances
@dataclass(frozen=True)
class Allowance:
    kind: str                     # abs | ulp | relative_to_naive
    metric: str
    applies_to: str = "local"     # local | propagated (stages only)
    max: Number | None = None     # abs, ulp
    factor: Number | None = None  # relative_to_naive
    floor_ulp: Number | None = None
    note: str = ""

    def describe(self) -> str:
        """The allowance in words, e.g. "max_abs <= 2 x naive + (2 + log2(hidden_size) / 2) ulp"."""
        if self.kind == "relative_to_naive":
            floor = f" + {self.floor_ulp.words()} ulp" if self.floor_ulp and self.floor_ulp.constant != 0 else ""
            return f"{self.metric} <= {self.factor.words()} x naive{floor}"
        unit = " ulp" if self.kind == "ulp" else ""
        return f"{self.metric} <= {self.max.words()}{unit}"

    def limit(self, axes: Mapping[str, int], naive: Mapping[str, Any] | None, scale: float,
              precision: str) -> float:
        """The bound on ``self.metric`` for one case. ``naive``: the naive's metrics of the
        same comparison; ``scale``: max |oracle| of the stage; ``precision``: the stage's
        nominal precision (whose ulps the floor counts)."""
        if self.kind in ("abs", "ulp"):
            return self.max.value(axes)
        naive_value = float("nan") if not naive or naive.get(self.metric) is None else float(naive[self.metric])
        floor_ulp = self.floor_ulp.value(axes) if self.floor_ulp else 0.0
        if self.metric in ABS_METRICS:
            floor = floor_ulp * ulp(scale, precision)            # ulps of the largest value
        elif self.metric in REL_METRICS:
            floor = floor_ulp * 2 * unit_roundoff(precision)      # one ulp, relatively
        else:
            floor = floor_ulp
        return self.factor.value(axes) * naive_value + floor


_ALLOWANCE_KEYS = {"kind", "metric", "applies_to", "max", "factor", "floor_ulp", "note"}


def _allowance(raw: Any, where: str, axis_names: set[str], *, stage: bool) -> Allowance:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected an object like {{\"kind\": \"ulp\", \"max\": 4}}, got {raw!r}")
    unknown = set(raw) - _ALLOWANCE_KEYS
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_ALLOWANCE_KEYS)}")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise ValueError(f"{where}.kind: expected one of {list(KINDS)}, got {kind!r}")
    metric = raw.get("metric", _DEFAULT_METRIC[kind])
    allowed_metrics = ULP_METRICS if kind == "ulp" else METRICS
    if metric not in allowed_metrics:
        raise ValueError(f"{where}.metric: expected one of {list(allowed_metrics)} for kind {kind!r}, "
                         f"got {metric!r}")
    if stage and metric in TOLERANCE_METRICS:
        raise ValueError(f"{where}.metric: {metric!r} is the share of the case's tolerance the final outputs "
                         "spend: an end_to_end allowance, not a stage's")
    applies_to = raw.get("applies_to", "local")
    if applies_to not in ("local", "propagated"):
        raise ValueError(f"{where}.applies_to: expected 'local' or 'propagated', got {applies_to!r}")
    if not stage and "applies_to" in raw:
        raise ValueError(f"{where}.applies_to: end-to-end allowances bound the final outputs; "
                         "'applies_to' is for stages only")
    note = raw.get("note", "")
    if not isinstance(note, str):
        raise ValueError(f"{where}.note: expected a string, got {note!r}")
    if kind in ("abs", "ulp"):
        for bad in ("factor", "floor_ulp"):
            if bad in raw:
                raise ValueError(f"{where}.{bad}: not used by kind {kind!r} (it takes 'max')")
        if "max" not in raw:
            raise ValueError(f"{where}.max: kind {kind!r} needs a 'max'")
        return Allowance(kind, metric, applies_to, max=_number(raw["max"], f"{where}.max", axis_names),
                         note=note)
    if "max" in raw:
        raise ValueError(f"{where}.max: not used by kind 'relative_to_naive' (it takes 'factor' and 'floor_ulp')")
    if "factor" not in raw:
        raise ValueError(f"{where}.factor: kind 'relative_to_naive' needs a 'factor'")
    return Allowance(kind, metric, applies_to,
                     factor=_number(raw["factor"], f"{where}.factor", axis_names),
                     floor_ulp=_number(raw.get("floor_ulp", 0), f"{where}.floor_ulp", axis_names), note=note)


def _allowances(raw: Any, where: str, axis_names: set[str], *, stage: bool) -> tuple[Allowance, ...]:
    items = raw if isinstance(raw, list) else [raw]
    return tuple(_allowance(a, f"{where}[{i}]" if isinstance(raw, list) else where, axis_names, stage=stage)
                 for i, a in enumerate(items))


# --------------------------------------------------------------------------- the budget
@dataclass(frozen=True)
class StageBudget:
    stage: str
    dtype: str                    # nominal output precision: ulp unit, naive output rounding
    operand_dtype: str            # naive matmul operand precision
    allowances: tuple[Allowance, ...]
    note: str = ""


@dataclass(frozen=True)
class EndToEndBudget:
    tolerance: bool               # the benchmark tolerance verdict must pass
    dtype: str
    allowances: tuple[Allowance, ...]
    note: str = ""


@dataclass(frozen=True)
class Budget:
    op: str
    source: str
    description: str
    stages: Mapping[str, StageBudget]
    end_to_end: EndToEndBudget
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, **json.loads(json.dumps(self.raw))}


_TOP_KEYS = {"schema_version", "op", "description", "defaults", "stages", "end_to_end"}
_STAGE_KEYS = {"dtype", "operand_dtype", "allowance", "note"}
_E2E_KEYS = {"tolerance", "dtype", "allowance", "note"}


def default_budget_path(defn: Definition) -> str | None:
    """The budget file the operator of ``defn`` ships (None: it has none)."""
    return defn.operator.budget_path


def _check_keys(raw: Any, allowed: set[str], where: str) -> None:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected an object, got {type(raw).__name__}")
    unknown = set(raw) - allowed
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")


def parse_budget(raw: Any, source: str = "<dict>", defn: Definition | None = None) -> Budget:
    """Validate a budget (already parsed JSON) and resolve it into per-stage budgets."""
    where = f"budget {source}"
    _check_keys(raw, _TOP_KEYS, where)
    version = raw.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValueError(f"{where}: schema_version: expected {SCHEMA_VERSION}, got {version!r}")
    op = raw.get("op")
    if not isinstance(op, str) or op not in operators.names():
        raise ValueError(f"{where}: op: expected one of {operators.names()}, got {op!r}")
    if defn is None:
        defn = load(op)
    elif defn.name != op:
        raise ValueError(f"{where}: op: the budget is for {op!r}, but the run is for {defn.name!r}")
    axis_names = set(defn.axes)
    leaves = defn.stage_names
    parents = {s.parent for s in defn.stages if s.parent}

    defaults = raw.get("defaults", {})
    _check_keys(defaults, _STAGE_KEYS, f"{where}: defaults")
    stages_raw = raw.get("stages", {})
    if not isinstance(stages_raw, Mapping):
        raise ValueError(f"{where}: stages: expected an object keyed by stage name")
    for name, entry in stages_raw.items():
        if name not in leaves and name not in parents:
            raise ValueError(f"{where}: stages.{name}: {defn.name} has no stage {name!r} "
                             f"(stages: {', '.join(leaves)}; groups: {', '.join(sorted(parents)) or 'none'})")
        _check_keys(entry, _STAGE_KEYS, f"{where}: stages.{name}")

    stages: dict[str, StageBudget] = {}
    for spec in defn.stages:
        merged: dict[str, Any] = {}
        origin: dict[str, str] = {}
        for key, layer in (("defaults", defaults), (f"stages.{spec.parent}", stages_raw.get(spec.parent or "", {})),
                           (f"stages.{spec.name}", stages_raw.get(spec.name, {}))):
            for k, v in layer.items():
                merged[k] = v
                origin[k] = key
        for k in ("dtype", "allowance"):
            if k not in merged:
                raise ValueError(f"{where}: stages.{spec.name}: no {k!r} (give it in the stage, its group "
                                 "or 'defaults')")
        dtype = check_precision(merged["dtype"], f"{where}: {origin['dtype']}.dtype")
        operand = check_precision(merged.get("operand_dtype", "float32"),
                                  f"{where}: {origin.get('operand_dtype', 'defaults')}.operand_dtype")
        allowances = _allowances(merged["allowance"], f"{where}: {origin['allowance']}.allowance", axis_names,
                                 stage=True)
        note = merged.get("note", "")
        if not isinstance(note, str):
            raise ValueError(f"{where}: {origin['note']}.note: expected a string")
        stages[spec.name] = StageBudget(spec.name, dtype, operand, allowances, note)

    e2e = raw.get("end_to_end", {"tolerance": True, "allowance": []})
    _check_keys(e2e, _E2E_KEYS, f"{where}: end_to_end")
    tol = e2e.get("tolerance", True)
    if not isinstance(tol, bool):
        raise ValueError(f"{where}: end_to_end.tolerance: expected true or false, got {tol!r}")
    out_dtype = canonical(defn.outputs[0].dtype)
    e2e_dtype = check_precision(e2e.get("dtype", out_dtype if out_dtype in PRECISIONS else "float32"),
                                f"{where}: end_to_end.dtype")
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise ValueError(f"{where}: description: expected a string")
    end_to_end = EndToEndBudget(tol, e2e_dtype,
                                _allowances(e2e.get("allowance", []), f"{where}: end_to_end.allowance",
                                            axis_names, stage=False),
                                e2e.get("note", ""))
    return Budget(op, source, description, stages, end_to_end, raw)


def load_budget(budget: str | os.PathLike | Mapping[str, Any] | Budget | None,
                defn: Definition | None = None) -> Budget:
    """A validated :class:`Budget` from None (the packaged default of ``defn``'s operator),
    an operator name (its packaged default), a path to a JSON file, a dict, or a Budget
    (returned as is after checking the operator)."""
    if budget is None:
        if defn is None:
            raise ValueError("load_budget: give a budget, or the definition whose packaged budget to load")
        budget = defn.name
    if isinstance(budget, Budget):
        if defn is not None and defn.name != budget.op:
            raise ValueError(f"budget {budget.source}: op: the budget is for {budget.op!r}, "
                             f"but the run is for {defn.name!r}")
        return budget
    if isinstance(budget, Mapping):
        return parse_budget(budget, "<dict>", defn)
    text_path = os.fspath(budget)
    if text_path in operators.names():
        # the packaged default of the operator named: the run's own when it is that one
        path = default_budget_path(defn if defn is not None and defn.name == text_path else load(text_path))
        if path is None:
            raise ValueError(f"operator {text_path!r} ships no budget file; give a path to one")
    else:
        path = text_path
    if not os.path.exists(path):
        raise ValueError(f"budget {text_path!r}: no such file and not an operator name "
                         f"(operators: {', '.join(operators.names())})")
    try:
        with open(path) as f:
            raw = json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"budget {path}: not valid JSON: {exc}") from None
    return parse_budget(raw, path, defn)
