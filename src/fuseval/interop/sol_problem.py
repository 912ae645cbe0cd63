"""A SOL-ExecBench problem folder read as a fuseval operator.

A problem folder holds ``definition.json`` (axes, inputs, outputs, optional constraints,
the reference source under ``reference`` and an optional ``custom_inputs_entrypoint``),
``workload.jsonl`` (one workload a line: var axes, an input descriptor per input, a
tolerance) and optionally ``reference.py``, ``metadata.json`` and ``solution*.json``
files (SOL-ExecBench's docs/definition.md, workload.md and solution.md describe the
format). :func:`read_problem` validates it; every error names
the file, the field, what was expected and what was given.
:func:`fuseval.interop.problems.operator_spec` turns it into an
:class:`~fuseval.operators.OperatorSpec` whose definition is built from the folder (one case per supported workload, with the workload's tolerance) and whose code
lives in a module made for it (:mod:`fuseval.interop.problems`).

The tolerance keys are read as the benchmark's evaluator reads them: ``max_atol``,
``max_rtol``, ``required_matched_ratio``, ``max_error_cap`` and ``allow_negative_inf``,
each with the evaluator's default; any other key (``required_match_ratio``, the spelling
of all 82 L2 problems) is ignored, as the evaluator ignores it, with a warning.
"""
from __future__ import annotations

import ast
import difflib
import hashlib
import json
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from ..errors import BadFileError
from ..definitions import nearest_binding
from ..inputs import TORCH_DTYPES
from .blobs import unreadable

__all__ = ["Problem", "Workload", "ProblemError", "read_problem", "module_name",
           "fuseval_tolerance", "TOLERANCE_DEFAULTS", "PROBLEM_PATH_VARIABLE"]

# the environment variable listing problem folders (os.pathsep-separated) that every
# fuseval process, spawned workers included, registers as operators
PROBLEM_PATH_VARIABLE = "FUSEVAL_PROBLEM_PATH"

# the evaluator's tolerance keys and defaults (SOL-ExecBench docs/workload.md)
TOLERANCE_DEFAULTS: dict[str, Any] = {"max_atol": 1e-2, "max_rtol": 1e-2, "required_matched_ratio": 0.99,
                                      "max_error_cap": None, "allow_negative_inf": False}
_DTYPES = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1",
           "float4_e2m1fn_x2", "int64", "int32", "int16", "int8", "bool")
_INPUT_TYPES = ("random", "scalar", "custom", "safetensors")
_SUPPORTED_INPUT_TYPES = ("random", "scalar", "custom")
# operators of axis expressions fuseval's definitions evaluate (integer arithmetic)
_EXPRESSION_NODES = (ast.Expression, ast.BinOp, ast.Name, ast.Constant, ast.Load, ast.Add, ast.Sub,
                     ast.Mult, ast.FloorDiv, ast.Mod, ast.UnaryOp, ast.USub)


class ProblemError(BadFileError):
    """A problem folder that is malformed or uses what fuseval does not support."""


@dataclass(frozen=True)
class Workload:
    line: int                         # 1-based line of workload.jsonl
    uuid: str
    axes: Mapping[str, int]           # var axes
    inputs: Mapping[str, Mapping[str, Any]]
    tolerance: Mapping[str, Any]      # the evaluator's keys, defaults filled in
    unsupported: str | None = None    # why fuseval cannot draw this workload's inputs
    # axes the workload binds that are not var axes (the evaluator passes them on)
    extra_axes: Mapping[str, int] = field(default_factory=dict)

    def scalar(self, name: str) -> Any:
        spec = self.inputs.get(name, {})
        return spec.get("value") if spec.get("type") == "scalar" else None


@dataclass
class Problem:
    directory: str
    name: str
    op_type: str
    description: str
    axes: dict[str, dict[str, Any]]
    constraints: list[str]
    inputs: dict[str, dict[str, Any]]     # name -> {"shape": list | None, "dtype", "description"}
    outputs: dict[str, dict[str, Any]]
    reference: str
    reference_file: str
    custom_inputs_entrypoint: str | None
    workloads: list[Workload]
    warnings: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def var_axes(self) -> list[str]:
        return [n for n, a in self.axes.items() if a["type"] == "var"]

    @property
    def supported_workloads(self) -> list[Workload]:
        return [w for w in self.workloads if w.unsupported is None]

    def drawable(self) -> list[Workload]:
        """The supported workloads, for whatever runs one: a folder without any (blobs not
        present, say) still imports and lists, and is refused here, with the reason."""
        pool = self.supported_workloads
        if not pool:
            raise ProblemError(f"{self.directory}/workload.jsonl: no workload fuseval can draw "
                               f"({self.workloads[0].unsupported})")
        return pool

    @property
    def module(self) -> str:
        return module_name(self.directory, self.name)

    def workload_for(self, var_axes: Mapping[str, int]) -> Workload:
        """The first supported workload binding the var axes to ``var_axes``; for a binding no
        workload has (a property test's draw), the descriptors (random, scalar, custom
        inputs) and tolerance of the nearest supported workload
        (:func:`fuseval.definitions.nearest_binding`) with these axes."""
        missing = [k for k in self.var_axes if k not in var_axes]
        if missing:
            raise ValueError(f"problem {self.name!r}: var axes {missing} are not bound (given {dict(var_axes)})")
        want = {k: int(var_axes[k]) for k in self.var_axes}
        for w in self.supported_workloads:
            if dict(w.axes) == want:
                return w
        pool = self.supported_workloads
        nearest = pool[nearest_binding([w.axes for w in pool], want)]
        return replace(nearest, axes=want, line=0, uuid="drawn")

    def fuseval_definition(self, implementations: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The problem in fuseval's definition format (``fuseval.definitions``)."""
        return _fuseval_definition(self, dict(implementations or {}))


def module_name(directory: str, name: str) -> str:
    """The module that holds a problem's code: ``fuseval.interop.problems.<name>_<hash>``,
    the hash of the folder's real path (two folders of one name do not collide)."""
    safe = re.sub(r"\W", "_", name)
    safe = safe if safe[:1].isalpha() else f"p_{safe}"
    digest = hashlib.sha1(os.path.realpath(directory).encode()).hexdigest()[:10]
    return f"fuseval.interop.problems.{safe}_{digest}"


# --------------------------------------------------------------------------- reading
def _load_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise ProblemError(f"{path}: not found (a problem folder needs definition.json and workload.jsonl)") from None
    except json.JSONDecodeError as exc:
        raise ProblemError(f"{path}: not valid JSON ({exc})") from None


def _need(mapping: Mapping[str, Any], key: str, kind: type | tuple, where: str) -> Any:
    if key not in mapping:
        raise ProblemError(f"{where}: missing field {key!r}")
    value = mapping[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise ProblemError(f"{where}: field {key!r} must be {names}, got {type(value).__name__} {value!r:.60}")
    return value


def _check_expression(expression: str, where: str) -> None:
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        raise ProblemError(f"{where}: {expression!r} is not an expression") from None
    for node in ast.walk(tree):
        if not isinstance(node, _EXPRESSION_NODES):
            raise ProblemError(f"{where}: {expression!r} uses {type(node).__name__}, which fuseval does not "
                               "evaluate (supported: + - * // % and unary -)")


def _read_axes(raw: Mapping[str, Any], where: str) -> dict[str, dict[str, Any]]:
    axes = {}
    for name, a in _need(raw, "axes", dict, where).items():
        at = f"{where}: axis {name!r}"
        if not isinstance(a, dict):
            raise ProblemError(f"{at}: expected an object, got {type(a).__name__}")
        kind = a.get("type")
        if kind == "const":
            value = _need(a, "value", int, at)
            if value < 0:
                raise ProblemError(f"{at}: value must be >= 0, got {value}")
            axes[name] = {"type": "const", "value": value}
        elif kind == "var":
            axes[name] = {"type": "var"}
        elif kind == "expr":
            expression = _need(a, "expression", str, at)
            _check_expression(expression, at)
            axes[name] = {"type": "expr", "expression": expression}
        else:
            raise ProblemError(f"{at}: type must be 'const', 'var' or 'expr', got {kind!r}")
    return axes


def _read_tensors(raw: Mapping[str, Any], key: str, axes: Mapping[str, Any], where: str) -> dict[str, dict]:
    tensors = {}
    for name, t in _need(raw, key, dict, where).items():
        at = f"{where}: {key[:-1]} {name!r}"
        if not isinstance(t, dict):
            raise ProblemError(f"{at}: expected an object, got {type(t).__name__}")
        if "shape" not in t:
            raise ProblemError(f"{at}: missing field 'shape' (a list of axis names, [] for a 0-d tensor, "
                               "null for a Python scalar)")
        shape = t["shape"]
        if shape is not None:
            if not isinstance(shape, list) or not all(isinstance(d, str) and d for d in shape):
                raise ProblemError(f"{at}: shape must be a list of axis names or null, got {shape!r}")
            unknown = [d for d in shape if not d.isdigit() and d not in axes]
            if unknown:
                raise ProblemError(f"{at}: shape {shape} names undefined axes {unknown} "
                                   f"(axes: {', '.join(axes)})")
        dtype = _need(t, "dtype", str, at)
        if dtype not in _DTYPES:
            raise ProblemError(f"{at}: unknown dtype {dtype!r}; expected one of {', '.join(_DTYPES)}")
        tensors[name] = {"shape": shape, "dtype": "float4_e2m1fn_x2" if dtype == "float4_e2m1" else dtype,
                         "description": t.get("description") or ""}
    return tensors


def _reference_entry(source: str, inputs: Mapping[str, Any], entry: str | None, where: str) -> None:
    """The reference parses, defines ``run`` with the inputs as parameters, in order, and
    defines the custom input entry point it names."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ProblemError(f"{where}: the reference is not valid Python ({exc.msg}, line {exc.lineno})") from None
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    if "run" not in functions:
        raise ProblemError(f"{where}: the reference defines no top-level function 'run'")
    args = functions["run"].args
    params = [a.arg for a in args.posonlyargs + args.args]
    if params != list(inputs):
        raise ProblemError(f"{where}: run() takes ({', '.join(params)}), expected the inputs in order "
                           f"({', '.join(inputs)})")
    if entry is not None and entry not in functions:
        raise ProblemError(f"{where}: custom_inputs_entrypoint {entry!r} is not a top-level function of the "
                           f"reference (it defines {', '.join(functions)})")


def _read_tolerance(raw: Any, where: str, ignored: dict[str, list]) -> dict[str, Any]:
    tol = dict(TOLERANCE_DEFAULTS)
    if raw is None:
        return tol
    if not isinstance(raw, dict):
        raise ProblemError(f"{where}: tolerance must be an object, got {type(raw).__name__}")
    for key, value in raw.items():
        if key not in TOLERANCE_DEFAULTS:
            ignored.setdefault(key, []).append(value)
            continue
        if key == "allow_negative_inf":
            if not isinstance(value, bool):
                raise ProblemError(f"{where}: tolerance allow_negative_inf must be true or false, got {value!r}")
        elif value is None and key == "max_error_cap":
            pass
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ProblemError(f"{where}: tolerance {key} must be a number >= 0, got {value!r}")
        tol[key] = value
    if tol["required_matched_ratio"] > 1:
        raise ProblemError(f"{where}: tolerance required_matched_ratio must be at most 1, "
                           f"got {tol['required_matched_ratio']}")
    return tol


def _read_workloads(path: str, problem_inputs: Mapping[str, Any], axes_spec: Mapping[str, Any],
                    warnings: list[str]) -> list[Workload]:
    var_axes = [n for n, a in axes_spec.items() if a["type"] == "var"]
    const_axes = {n: a["value"] for n, a in axes_spec.items() if a["type"] == "const"}
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise ProblemError(f"{path}: not found (a problem folder needs definition.json and workload.jsonl)") from None
    out: list[Workload] = []
    ignored: dict[str, list] = {}
    notes: dict[str, list] = {"extra_axes": [], "unknown_inputs": [], "random_inputs": []}
    for n, text in enumerate(lines, 1):
        if not text.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ProblemError(f"{where}: not valid JSON ({exc})") from None
        if not isinstance(row, dict):
            raise ProblemError(f"{where}: expected a JSON object, got {type(row).__name__}")
        axes = _need(row, "axes", dict, where)
        missing = [a for a in var_axes if a not in axes]
        if missing:
            raise ProblemError(f"{where}: axes {axes} do not bind the var axes {missing}")
        extra = sorted(set(axes) - set(var_axes))
        overridden = [a for a in extra if a in const_axes and axes[a] != const_axes[a]]
        if overridden:
            raise ProblemError(f"{where}: axes {overridden} override const axes of the definition "
                               f"({', '.join(f'{a}={const_axes[a]}' for a in overridden)}), which fuseval does not "
                               "support")
        if extra:
            notes["extra_axes"].append((n, extra))
        for a, v in axes.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ProblemError(f"{where}: axis {a!r} must be an integer >= 0, got {v!r}")
        described = _need(row, "inputs", dict, where)
        # as the evaluator reads them: descriptors of unknown inputs are ignored, inputs without
        # one are random
        unknown = [i for i in described if i not in problem_inputs]
        absent = [i for i in problem_inputs if i not in described]
        if unknown:
            notes["unknown_inputs"].append((n, unknown))
        if absent:
            notes["random_inputs"].append((n, absent))
        inputs = {i: described.get(i, {"type": "random"}) for i in problem_inputs}
        unsupported = None
        for name, spec in inputs.items():
            kind = spec.get("type") if isinstance(spec, dict) else None
            if kind not in _INPUT_TYPES:
                raise ProblemError(f"{where}: input {name!r} must have type one of {', '.join(_INPUT_TYPES)}, "
                                   f"got {spec!r:.80}")
            if kind == "scalar" and "value" not in spec:
                raise ProblemError(f"{where}: scalar input {name!r} has no 'value'")
            if kind == "scalar" and problem_inputs[name]["shape"] is not None:
                raise ProblemError(f"{where}: input {name!r} is a tensor in the definition, the workload "
                                   "gives a scalar")
            if kind == "safetensors" and unsupported is None:
                unsupported = unreadable(os.path.dirname(path), name, spec)
            elif kind not in _SUPPORTED_INPUT_TYPES and unsupported is None:
                unsupported = f"input {name!r} is {kind} (fuseval draws random, scalar and custom inputs only)"
        tolerance = _read_tolerance(row.get("tolerance"), where, ignored)
        out.append(Workload(n, str(row.get("uuid", f"line-{n}")), {a: int(axes[a]) for a in var_axes},
                            inputs, tolerance, unsupported, {a: axes[a] for a in extra}))
    if not out:
        raise ProblemError(f"{path}: holds no workload")
    for key, values in ignored.items():
        guess = difflib.get_close_matches(key, list(TOLERANCE_DEFAULTS), n=1)
        hint = f" (did you mean {guess[0]!r}?)" if guess else ""
        applies = (f"; {guess[0]} applies as the workload gives it (its default "
                   f"{TOLERANCE_DEFAULTS[guess[0]]} where the workload gives none)") if guess else ""
        shown = sorted({json.dumps(v) for v in values})
        warnings.append(f"workload.jsonl: {len(values)} workload(s) give tolerance key {key!r} "
                        f"({', '.join(shown[:3])}), which the evaluator ignores{hint}: ignored{applies}")
    said = {"extra_axes": "bind axes that are not var axes of the definition (ignored)",
            "unknown_inputs": "describe inputs the definition does not have (ignored, as the evaluator does)",
            "random_inputs": "give no descriptor for some inputs (drawn at random, as the evaluator does)"}
    for kind, found in notes.items():
        if found:
            names = sorted({x for _, xs in found for x in xs})
            warnings.append(f"workload.jsonl: {len(found)} workload(s) {said[kind]}: {', '.join(names)} "
                            f"(first at line {found[0][0]})")
    skipped = [w for w in out if w.unsupported]
    if skipped:
        warnings.append(f"workload.jsonl: {len(skipped)} of {len(out)} workloads are not supported and are "
                        f"left out (line {skipped[0].line}: {skipped[0].unsupported})")
    return out


_PROBLEMS: dict[str, tuple[float, Problem]] = {}


def read_problem(directory: str) -> Problem:
    """Read and validate the problem folder ``directory`` (cached until its files change)."""
    if not isinstance(directory, (str, os.PathLike)) or not os.path.isdir(directory):
        raise ProblemError(f"problem folder {directory!r}: not a folder")
    real = os.path.realpath(directory)
    files = [os.path.join(real, f) for f in ("definition.json", "workload.jsonl", "reference.py")]
    stamp = sum(os.path.getmtime(f) for f in files if os.path.exists(f))
    cached = _PROBLEMS.get(real)
    if cached and cached[0] == stamp:
        return cached[1]
    problem = _read(real)
    _PROBLEMS[real] = (stamp, problem)
    return problem


def _read(real: str) -> Problem:
    where = os.path.join(real, "definition.json")
    raw = _load_json(where)
    if not isinstance(raw, dict):
        raise ProblemError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    warnings: list[str] = []
    name = _need(raw, "name", str, where)
    axes = _read_axes(raw, where)
    constraints = raw.get("constraints") or []
    if not isinstance(constraints, list) or not all(isinstance(c, str) for c in constraints):
        raise ProblemError(f"{where}: constraints must be a list of expression strings, got {constraints!r:.80}")
    inputs = _read_tensors(raw, "inputs", axes, where)
    outputs = _read_tensors(raw, "outputs", axes, where)
    clash = sorted(set(inputs) & set(outputs)) + sorted(set(inputs) & set(axes))
    if clash:
        raise ProblemError(f"{where}: names {clash} are used twice (inputs, outputs and axes must differ)")
    entry = raw.get("custom_inputs_entrypoint")
    if entry is not None and (not isinstance(entry, str) or not entry.isidentifier()):
        raise ProblemError(f"{where}: custom_inputs_entrypoint must be a function name, got {entry!r}")
    source = _need(raw, "reference", str, where)
    reference_file = os.path.join(real, "reference.py")
    if os.path.exists(reference_file):
        with open(reference_file) as f:
            if f.read().strip() != source.strip():
                warnings.append("reference.py differs from definition.json's reference: the definition's "
                                "is used (the benchmark runs that one)")
                reference_file = where
    else:
        reference_file = where
    _reference_entry(source, inputs, entry, where)
    workloads = _read_workloads(os.path.join(real, "workload.jsonl"), inputs, axes, warnings)
    custom = [w.line for w in workloads if any(s.get("type") == "custom" for s in w.inputs.values())]
    if custom and entry is None:
        raise ProblemError(f"{real}/workload.jsonl:{custom[0]}: custom inputs, but definition.json names no "
                           "custom_inputs_entrypoint")
    if any(w.tolerance["allow_negative_inf"] for w in workloads):
        warnings.append("workload.jsonl: allow_negative_inf is set: fuseval's rules accept a -inf the oracle "
                        "has too; the 'sol' rules of fuseval do not model this flag")
    metadata_path = os.path.join(real, "metadata.json")
    metadata = _load_json(metadata_path) if os.path.exists(metadata_path) else {}
    return Problem(real, name, str(raw.get("op_type") or "sol_problem"), str(raw.get("description") or ""),
                   axes, constraints, inputs, outputs, source, reference_file, entry, workloads, warnings,
                   metadata if isinstance(metadata, dict) else {})


# --------------------------------------------------------------------------- fuseval's format
def fuseval_tolerance(tol: Mapping[str, Any]) -> dict[str, Any]:
    """A workload's tolerance (the evaluator's keys) as fuseval's ``Tolerance`` fields."""
    return {"atol": float(tol["max_atol"]), "rtol": float(tol["max_rtol"]),
            "min_matched_ratio": float(tol["required_matched_ratio"]),
            "max_abs_error": None if tol["max_error_cap"] is None else float(tol["max_error_cap"])}


def _fixed_scalar(problem: Problem, name: str) -> Any:
    """The value every supported workload gives a scalar input, or None (drawn, or varying)."""
    values = {json.dumps(w.scalar(name)) for w in problem.supported_workloads}
    kinds = {w.inputs[name]["type"] for w in problem.supported_workloads}
    return problem.supported_workloads[0].scalar(name) if kinds == {"scalar"} and len(values) == 1 else None


def _representable(problem: Problem) -> None:
    """Raise for a tensor dtype fuseval's checks do not know (every dtype the reader
    accepts is known today: this guards the two tables against drifting apart)."""
    where = f"{problem.directory}/definition.json"
    for kind, tensors in (("input", problem.inputs), ("output", problem.outputs)):
        for name, t in tensors.items():
            if t["shape"] is not None and t["dtype"] not in TORCH_DTYPES:
                raise ProblemError(f"{where}: {kind} {name!r} has dtype {t['dtype']}; fuseval's check handles "
                                   f"tensors of {', '.join(TORCH_DTYPES)} only")


def _fuseval_definition(problem: Problem, implementations: dict[str, str]) -> dict[str, Any]:
    _representable(problem)
    workloads = problem.drawable()
    module = problem.module
    tensors = []
    for name, t in problem.inputs.items():
        entry = {"name": name, "shape": t["shape"], "dtype": t["dtype"]}
        value = _fixed_scalar(problem, name) if t["shape"] is None else None
        if value is not None:
            entry["value"] = value
        tensors.append(entry)
    outputs = []
    for name, t in problem.outputs.items():
        if t["shape"] is None:
            raise ProblemError(f"{problem.directory}/definition.json: output {name!r} is a Python scalar; "
                               "fuseval checks tensor outputs")
        outputs.append({"name": name, "shape": t["shape"], "dtype": t["dtype"]})
    table = {"reference": f"{module}:reference", "sol_reference": f"{module}:sol_reference",
             "torch": f"{module}:sol_reference", **implementations}
    return {
        "name": problem.name,
        "op_type": problem.op_type,
        "description": problem.description,
        "source": f"SOL-ExecBench problem folder {problem.directory}",
        "implementations": table,
        "axes": problem.axes,
        "constraints": [{"expression": c, "why": "a constraint of the problem's definition"}
                        for c in problem.constraints],
        "derived": {},
        "inputs": tensors,
        "outputs": outputs,
        "stages": [],
        "tolerance": {**fuseval_tolerance(TOLERANCE_DEFAULTS),
                      "note": "the evaluator's defaults; every case has its workload's own tolerance"},
        "case_axes": problem.var_axes,
        "cases": [{"axes": [w.axes[a] for a in problem.var_axes], "tolerance": fuseval_tolerance(w.tolerance)}
                  for w in workloads],
        # one size: the problem's workloads (the named scaled-down configuration is the same)
        "configs": {"small": {}},
        "sol_problem": {"directory": problem.directory, "workload_lines": [w.line for w in workloads],
                        "workload_uuids": [w.uuid for w in workloads]},
    }
