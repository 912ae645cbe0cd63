"""Operators described as data.

Each operator package's ``definition.json`` (see :mod:`fuseval.operators`) describes one fused operator the way
SOL-ExecBench's ``definition.json`` does (axes, constraints, inputs and outputs in
order with shapes written in axis names), plus what fuseval needs on top: the named
stages that reports tap, the tolerance rule, the 16 benchmark cases, and named
configurations that override the ``const`` axes to build scaled-down versions of the
same operator for CPU tests.

``fuseval.operators.load(name, config="small")`` returns a typed :class:`Definition`; implementation
paths of the file (``".reference:reference"``) are made absolute against the operator's package.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import math
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

__all__ = [
    "AxisSpec", "TensorSpec", "StageSpec", "Tolerance", "Case", "Definition",
    "evaluate_expression", "qualify", "axes_label", "DEFAULT_VARIANT",
    "tolerance_json", "variant_scope", "nearest_binding",
]


# the name of an operator's default semantics: the benchmark's, as its reference computes them
DEFAULT_VARIANT = "sol"


# --------------------------------------------------------------------------- typed pieces
@dataclass(frozen=True)
class AxisSpec:
    name: str
    kind: str                      # "const" | "var" | "expr"
    value: int | None = None       # for const
    expression: str | None = None  # for expr


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[str, ...] | None  # None for a Python scalar; () for a 0-d tensor
    dtype: str                     # a name of fuseval.inputs.TORCH_DTYPES (float32, int64, bool...)
    value: float | None = None     # fixed value of a scalar input (e.g. rms_norm_eps)
    init: Mapping[str, Any] | None = None  # how benchmark mode draws it, when not the default rule

    @property
    def is_scalar(self) -> bool:
        return self.shape is None


@dataclass(frozen=True)
class StageSpec:
    name: str
    what: str
    shape: tuple[str, ...]
    parent: str | None = None


@dataclass(frozen=True)
class Tolerance:
    """The benchmark's rule: element ok when |out-ref| <= atol + rtol*|ref|;
    case ok when the matched ratio >= min_matched_ratio, nothing is NaN/Inf, and
    (when set) max |out-ref| <= max_abs_error.

    fuseval's own rule adds two bounds the benchmark does not have, both relative to the
    element's allowance ``atol + rtol*|ref|`` (so they scale with the tolerance):
    ``max_error_ratio``, how many allowances the worst element may use, and
    ``max_rms_ratio``, the error's RMS over the allowance's RMS. A few elements set to
    garbage pass the matched ratio; they fail these. None: not bounded."""
    atol: float
    rtol: float
    min_matched_ratio: float
    max_abs_error: float | None = None
    max_error_ratio: float | None = None
    max_rms_ratio: float | None = None


# fuseval's own bounds where a definition does not give its own ("own_bounds")
DEFAULT_OWN_BOUNDS = {"max_error_ratio": 64.0, "max_rms_ratio": 2.0}


def axes_label(axes: Mapping[str, int]) -> str:
    """An axis binding as reports print it: "batch_size=1 seq_len=128"."""
    return " ".join(f"{k}={v}" for k, v in axes.items())


@dataclass(frozen=True)
class Case:
    index: int
    axes: Mapping[str, int]        # var axes only
    tolerance: Tolerance | None = None   # the case's own rule (None: the definition's)

    @property
    def label(self) -> str:
        return axes_label(self.axes)


_ALLOWED_NODES = (ast.Expression, ast.BinOp, ast.Compare, ast.Name, ast.Constant, ast.Load,
                  ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.Eq, ast.NotEq,
                  ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.List, ast.UnaryOp, ast.USub)


def evaluate_expression(expression: str, names: Mapping[str, int]) -> Any:
    """Evaluate an axis expression (integer arithmetic, comparisons) over bound axes."""
    tree = ast.parse(expression, mode="eval")
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED_NODES):
            raise ValueError(f"axis expression {expression!r}: {type(node).__name__} is not allowed")
    missing = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - set(names)
    if missing:
        raise KeyError(f"axis expression {expression!r} needs unbound axes {sorted(missing)}")
    return eval(compile(tree, "<axis>", "eval"), {"__builtins__": {}}, dict(names))


# --------------------------------------------------------------------------- definition
@dataclass(frozen=True)
class Definition:
    name: str
    op_type: str
    description: str
    source: str
    package: str                     # the operator's package (fuseval.operators.<name>)
    implementations: Mapping[str, str]
    axes: Mapping[str, AxisSpec]
    constraints: tuple[tuple[str, str], ...]
    derived: Mapping[str, str]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    stages: tuple[StageSpec, ...]
    tolerance: Tolerance
    case_axes: tuple[str, ...]
    seed_cases: tuple[tuple[int, ...], ...]
    configs: Mapping[str, Mapping[str, Any]]
    realistic: Mapping[str, Any]
    config: str = "seed"
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # per seed case: its tolerance overrides ({"atol": ...}), empty where it has none
    case_tolerances: tuple[Mapping[str, Any], ...] = ()
    # named semantic variants: {name: {"what", "implementations", "drop_stages"}}; the
    # benchmark's semantics are the default and have no entry
    variants: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    variant: str = DEFAULT_VARIANT
    # the named configuration whose case scaling the cases follow ("seed": full-size)
    case_config: str = "seed"
    # the operator record (``fuseval.operators.OperatorRecord``: oracle, hooks, cost model,
    # mutants, budget file) the registry attached when it loaded this definition; every
    # configuration and variant of it carries the same one. This layer only holds it (it
    # knows nothing of the registry); None for a definition parsed outside the registry.
    operator: Any = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        # a definition travels to a worker process (or back in a pickled report) as data:
        # without its record, whose resolved code stays in the process that resolved it
        return {k: v for k, v in self.__dict__.items() if k != "operator"}

    # ---- axes
    @property
    def const_axes(self) -> dict[str, int]:
        return {a.name: a.value for a in self.axes.values() if a.kind == "const"}

    @property
    def var_axes(self) -> list[str]:
        return [a.name for a in self.axes.values() if a.kind == "var"]

    def resolve_axes(self, var_binding: Mapping[str, int]) -> dict[str, int]:
        """All axes (const, var, expr) for a binding of the var axes; checks constraints."""
        unknown = set(var_binding) - set(self.var_axes)
        if unknown:
            raise ValueError(f"{self.name}: {sorted(unknown)} are not var axes (var axes: {self.var_axes})")
        missing = set(self.var_axes) - set(var_binding)
        if missing:
            raise ValueError(f"{self.name}: var axes {sorted(missing)} are not bound")
        bound: dict[str, int] = dict(self.const_axes)
        bound.update({k: int(v) for k, v in var_binding.items()})
        for a in self.axes.values():
            if a.kind == "expr":
                bound[a.name] = int(evaluate_expression(a.expression, bound))
        self.check_constraints(bound)
        return bound

    def check_constraints(self, bound: Mapping[str, int], *, skip_unbound: bool = False) -> None:
        """Raise ValueError naming the values when a constraint fails. ``skip_unbound``:
        ignore constraints over axes not in ``bound`` (e.g. var axes of a config)."""
        for expression, why in self.constraints:
            names = sorted({n.id for n in ast.walk(ast.parse(expression, mode="eval"))
                            if isinstance(n, ast.Name)})
            if skip_unbound and not set(names) <= set(bound):
                continue
            if not evaluate_expression(expression, bound):
                values = ", ".join(f"{n}={bound[n]}" for n in names)
                raise ValueError(f"{self.name}: constraint {expression!r} violated ({values}): {why}")

    def derived_value(self, key: str, bound: Mapping[str, int]) -> Any:
        return evaluate_expression(self.derived[key], bound)

    def shape_of(self, spec: TensorSpec, bound: Mapping[str, int]) -> tuple[int, ...] | None:
        if spec.shape is None:
            return None
        return tuple(int(evaluate_expression(d, bound)) for d in spec.shape)

    def input_index(self, name: str) -> int:
        for i, s in enumerate(self.inputs):
            if s.name == name:
                return i
        raise KeyError(f"{self.name} has no input {name!r}")

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [s.name for s in self.outputs]

    @property
    def stage_names(self) -> list[str]:
        return [s.name for s in self.stages]

    # ---- cases
    def cases(self, selection: Sequence[int] | str | None = None) -> list[Case]:
        """The benchmark cases of this configuration (scaled down for small configs).

        ``selection``: None/"all", a list of indices, or a string "0,3,5-7".
        Each case carries its tolerance: the seed case's own (SOL-ExecBench gives one per
        workload), which a scaled-down configuration keeps unchanged."""
        scale = self.configs.get(self.case_config, {}).get("case_scale")
        out = []
        for i, values in enumerate(self.seed_cases):
            axes = dict(zip(self.case_axes, values))
            if scale:
                lo = int(scale.get("min", 1))
                axes = {k: max(lo, math.ceil(v / scale.get(k, 1))) for k, v in axes.items()}
            override = self.case_tolerances[i] if i < len(self.case_tolerances) else {}
            out.append(Case(i, axes, replace(self.tolerance, **override)))
        idx = parse_selection(selection, len(out))
        return [out[i] for i in idx]

    def nearest_case(self, var_axes: Mapping[str, int]) -> Case:
        """The case binding exactly ``var_axes``, else the nearest one (see
        :func:`nearest_binding`): whose tolerance a binding no case has is judged under."""
        cases = self.cases()
        if not cases:
            raise ValueError(f"{self.name}: has no cases")
        return cases[nearest_binding([c.axes for c in cases], var_axes)]

    # ---- variants
    @property
    def variant_names(self) -> list[str]:
        return [DEFAULT_VARIANT, *self.variants]

    def with_variant(self, variant: str | None) -> "Definition":
        """The same operator under a named semantic variant (``"sol"``: the benchmark's).

        A variant replaces implementations by name (``reference`` included, so every
        component that resolves implementations through the definition honours it) and
        may drop stages the variant does not have."""
        variant = variant or DEFAULT_VARIANT
        if variant == self.variant:
            return self
        if self.variant != DEFAULT_VARIANT:
            raise ValueError(f"{self.name}: already under variant {self.variant!r}")
        if variant not in self.variants:
            raise ValueError(f"{self.name}: unknown variant {variant!r}; expected one of "
                             f"{', '.join(self.variant_names)}")
        spec = self.variants[variant]
        dropped = set(spec.get("drop_stages", ()))
        return replace(self, variant=variant,
                       implementations={**self.implementations, **spec.get("implementations", {})},
                       stages=tuple(st for st in self.stages if st.name not in dropped))

    # ---- configs
    def with_config(self, config: str | Mapping[str, int]) -> "Definition":
        """The same operator with its const axes overridden.

        ``config`` is one of:

        * a name of the definition's ``configs`` ("seed", "small", "tiny"): its const axes,
          and its ``case_scale`` for the cases;
        * a named configuration with a JSON object of const-axis overrides on top, written
          ``NAME+{...}``, e.g. ``'small+{"hidden_size": 96}'``: the cases are scaled as NAME's;
        * a JSON object alone (a mapping, or its text ``'{"hidden_size": 96}'``): these
          overrides on top of this definition's axes (the seed's, when loaded plainly), the
          cases kept as they are (full-size on the seed).

        The result's ``config`` names the configuration as given (a mapping: its JSON text;
        overrides on a definition already configured: ``"<its config>+<JSON>"``)."""
        base, overrides, name = self._parse_config(config)
        if base is not None:
            named = {k: v for k, v in self.configs[base].items() if k != "case_scale"}
            overrides = {**named, **overrides}
        axes = dict(self.axes)
        for k, v in overrides.items():
            if k not in axes or axes[k].kind != "const":
                consts = sorted(a for a in axes if axes[a].kind == "const")
                raise ValueError(f"{self.name}: config {name!r}: override {k!r} is not a const axis "
                                 f"(const axes: {consts})")
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{self.name}: config {name!r}: const axis {k!r} must be a positive int, "
                                 f"got {v!r}")
            axes[k] = replace(axes[k], value=v)
        d = replace(self, axes=axes, config=name, case_config=self.case_config if base is None else base)
        d.check_constraints(d.const_axes, skip_unbound=True)
        return d

    def _parse_config(self, config: str | Mapping[str, int]) -> tuple[str | None, dict[str, Any], str]:
        """(named base or None, const-axis overrides, the configuration's name) of a config
        argument of :meth:`with_config`; a ValueError names what is wrong with it."""
        if isinstance(config, Mapping):
            overrides = dict(config)
            text = json.dumps(overrides, default=repr)
            return None, overrides, text if self.config == "seed" else f"{self.config}+{text}"
        if not isinstance(config, str):
            raise ValueError(f"{self.name}: config: expected a configuration name, 'NAME+{{JSON}}' or a "
                             f"mapping of const-axis overrides, got {type(config).__name__} {config!r}")
        text = config.strip()
        base, plus, tail = text.partition("+")
        if text.startswith("{"):
            base, tail = None, text
        elif not plus:
            if text not in self.configs:
                raise ValueError(f"{self.name}: unknown config {text!r}; expected one of {sorted(self.configs)}, "
                                 "'NAME+{JSON}' or a JSON object of const-axis overrides")
            return text, {}, text
        elif base.strip() not in self.configs:
            raise ValueError(f"{self.name}: config {text!r}: unknown base configuration {base.strip()!r} "
                             f"before '+'; expected one of {sorted(self.configs)}")
        else:
            base = base.strip()
        try:
            overrides = json.loads(tail)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{self.name}: config {text!r}: {tail.strip()!r} is not valid JSON ({exc}); "
                             "expected an object of const-axis overrides such as {\"hidden_size\": 96}") from None
        if not isinstance(overrides, dict):
            raise ValueError(f"{self.name}: config {text!r}: expected a JSON object of const-axis overrides, "
                             f"got a JSON {type(overrides).__name__}")
        if base is None and self.config != "seed":
            text = f"{self.config}+{text}"
        return base, overrides, text

    @property
    def full_size_cases(self) -> bool:
        """Whether the cases are the benchmark's own sizes (no case scaling applies)."""
        return not self.configs.get(self.case_config, {}).get("case_scale")

    # ---- export to SOL-ExecBench layout
    def to_solexec_definition(self) -> dict[str, Any]:
        axes: dict[str, Any] = {}
        for a in self.axes.values():
            if a.kind == "const":
                axes[a.name] = {"type": "const", "value": a.value}
            elif a.kind == "var":
                axes[a.name] = {"type": "var"}
            else:
                axes[a.name] = {"type": "expr", "expression": a.expression}
        tensors = lambda specs: {s.name: {"shape": None if s.shape is None else list(s.shape), "dtype": s.dtype}
                                 for s in specs}
        return {
            "name": self.name,
            "op_type": self.op_type,
            "description": self.description,
            "axes": axes,
            "constraints": [e for e, _ in self.constraints],
            "inputs": tensors(self.inputs),
            "outputs": tensors(self.outputs),
            "reference": f"{self.implementations['reference']}",
            "tolerance": tolerance_json(self.tolerance),
        }

    def to_solexec_workloads(self, seed: int = 0) -> list[dict[str, Any]]:
        rows = []
        for case in self.cases():
            inputs = {}
            for s in self.inputs:
                if s.is_scalar and s.value is not None:
                    inputs[s.name] = {"type": "scalar", "value": s.value}
                else:
                    inputs[s.name] = {"type": "random"}
            rows.append({
                "definition": self.name,
                "uuid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"fuseval/{self.name}/{self.config}/{case.index}")),
                "axes": dict(case.axes),
                "inputs": inputs,
                "seed": seed + case.index,
                "tolerance": tolerance_json(case.tolerance),
            })
        return rows


def nearest_binding(candidates: Sequence[Mapping[str, int]], want: Mapping[str, int]) -> int:
    """The index of the candidate binding equal to ``want``, else of the nearest one: the
    least sum over the axes of |log2(1 + a) - log2(1 + b)| (sizes compared by ratio, so 4
    is as far from 8 as 512 from 1024), the first of equals."""
    def distance(c: Mapping[str, int]) -> float:
        return sum(abs(math.log2(1 + int(c.get(k, 0))) - math.log2(1 + int(v))) for k, v in want.items())
    return min(range(len(candidates)), key=lambda i: (distance(candidates[i]), i))


def tolerance_json(tol: Tolerance) -> dict[str, Any]:
    """A tolerance under the key names SOL-ExecBench's evaluator reads."""
    return {"max_atol": tol.atol, "max_rtol": tol.rtol,
            "required_matched_ratio": tol.min_matched_ratio, "max_error_cap": tol.max_abs_error}


def parse_selection(selection: Sequence[int] | str | None, n: int) -> list[int]:
    """Indices from None/"all", a list of ints, or "0,3,5-7"."""
    if selection is None or selection == "all" or selection == "":
        return list(range(n))
    if isinstance(selection, str):
        idx: list[int] = []
        for part in selection.split(","):
            part = part.strip()
            # each part is an index "3" or an inclusive range "5-7"; anything else (a typo,
            # a reversed range) would otherwise select nothing or fail with int()'s message
            lo, sep, hi = part.partition("-")
            if not part:
                continue
            if not lo.strip().isdigit() or (sep and not hi.strip().isdigit()) or \
                    (sep and int(lo) > int(hi)):
                raise ValueError(f"case selection {selection!r}: {part!r} is not a case index "
                                 f"or an increasing range lo-hi (cases are 0..{n - 1})")
            idx.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
        if not idx:
            raise ValueError(f"case selection {selection!r} selects no case (cases are 0..{n - 1})")
    else:
        idx = [int(i) for i in selection]
    bad = [i for i in idx if not 0 <= i < n]
    if bad:
        raise ValueError(f"case indices {bad} are out of range: there are {n} cases (0..{n - 1})")
    return idx


# --------------------------------------------------------------------------- loading


def qualify(reference: str, package: str) -> str:
    """``".fast:forward"`` in ``package`` -> ``"package.fast:forward"`` (absolute names unchanged)."""
    module, sep, attr = reference.partition(":")
    if module.startswith("."):
        module = importlib.util.resolve_name(module, package)
    return f"{module}{sep}{attr}"


def own_bounds(raw: Mapping[str, Any]) -> dict[str, float | None]:
    """fuseval's own bounds of a definition (its "own_bounds", else the defaults), checked."""
    given = dict(raw.get("own_bounds") or {})
    unknown = set(given) - set(DEFAULT_OWN_BOUNDS)
    if unknown:
        raise ValueError(f"{raw.get('name')}: own_bounds: unknown key(s) {sorted(unknown)}; expected "
                         f"{', '.join(DEFAULT_OWN_BOUNDS)}")
    out = {**DEFAULT_OWN_BOUNDS, **given}
    for key, value in out.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
                                  or value != value):
            raise ValueError(f"{raw.get('name')}: own_bounds.{key}: expected a number > 0 or null, got {value!r}")
    return out


def parse(raw: Mapping[str, Any], package: str) -> Definition:
    absolute = lambda table: {k: qualify(v, package) for k, v in table.items()}
    variants = {name: {**v, "implementations": absolute(v.get("implementations", {}))}
                for name, v in raw.get("variants", {}).items()}
    axes = {}
    for name, a in raw["axes"].items():
        axes[name] = AxisSpec(name, a["type"], a.get("value"), a.get("expression"))
    # "shape": null is a Python scalar, [] a 0-d tensor
    tensor = lambda t: TensorSpec(t["name"], None if t.get("shape") is None else tuple(t["shape"]),
                                  t["dtype"], t.get("value"), t.get("init"))
    tol = raw["tolerance"]
    # a case is a list of its case_axes values, or {"axes": [...], "tolerance": {...}}
    cases = [c if isinstance(c, Mapping) else {"axes": c} for c in raw["cases"]]
    return Definition(
        name=raw["name"], op_type=raw["op_type"], description=raw["description"],
        source=raw.get("source", ""), package=package,
        implementations=absolute(raw["implementations"]), axes=axes,
        constraints=tuple((c["expression"], c.get("why", "")) for c in raw.get("constraints", [])),
        derived=dict(raw.get("derived", {})),
        inputs=tuple(tensor(t) for t in raw["inputs"]),
        outputs=tuple(tensor(t) for t in raw["outputs"]),
        stages=tuple(StageSpec(s["name"], s["what"], tuple(s["shape"]), s.get("parent"))
                     for s in raw["stages"]),
        tolerance=Tolerance(tol["atol"], tol["rtol"], tol["min_matched_ratio"], tol.get("max_abs_error"),
                            **own_bounds(raw)),
        case_axes=tuple(raw["case_axes"]),
        seed_cases=tuple(tuple(c["axes"]) for c in cases),
        case_tolerances=tuple(dict(c.get("tolerance", {})) for c in cases),
        variants=variants,
        configs={"seed": {}, **raw.get("configs", {})},
        realistic=dict(raw.get("realistic", {})),
        raw=raw,
    )
