"""Operators as plug-ins: one package per operator, registered through an :class:`OperatorSpec`.

An operator package (``fuseval/operators/<name>/``, or any importable package named by
the ``fuseval.operators`` entry-point group) holds everything specific to its operator:

* ``definition.json``: the operator as data (axes, inputs, outputs, stages, tolerance,
  cases, configurations, variants and the implementation table);
* ``budget.json``: its per-stage error budget;
* the float64 oracle and its torch baselines (``reference.py`` by convention), with
  optional input hooks (``benchmark_inputs`` / ``realistic_inputs``) and a cost model;
* its Triton fast path (``fast.py``), its property hooks and its mutant catalogue.

The package's ``__init__`` defines ``SPEC = OperatorSpec(...)``. Every reference in a spec
or a definition to code of the operator is a string ``".module:attr"`` (relative to the
package) or ``"package.module:attr"``, resolved on first use, so listing operators
imports neither Triton nor the oracles. The harness (check, gate, stats, baseline, bench,
budget, properties, CLI) reads operators only through this module.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from importlib import metadata, resources
from typing import Any, Callable, Mapping

from ..errors import UnknownOperatorError

__all__ = ["OperatorSpec", "spec", "names", "resolve", "ENTRY_POINT_GROUP"]

ENTRY_POINT_GROUP = "fuseval.operators"


@dataclass(frozen=True)
class OperatorSpec:
    """What the harness knows about one operator. ``package`` is the operator's package;
    the other strings are files in it or ``".module:attr"`` references (None: not provided).

    * ``inputs``: {mode: hook} for the input modes the operator draws itself
      (``benchmark``, ``realistic``); a hook is ``hook(defn, axes, seed, device=) -> {name: value}``.
      Modes without a hook use the generic rules of :mod:`fuseval.inputs`.
    * ``cost_model``: ``cost_model(axes) -> {"flops", "bytes", "matmul_dtype", ...}`` for the bench floor.
    * ``bench_impls`` / ``bench_fast``: what ``fuseval bench`` times by default, and which of
      them is the operator's own fast path (``bench_fast`` None: none).
    * ``properties``: a module with the operator's property hooks (see :mod:`fuseval.properties`).
    * ``mutants``: ``"module:attr"`` of the operator's mutant catalogue (a callable giving the
      list of :class:`fuseval.properties.mutants.Mutant`).
    * ``fast_options``: ``"module:attr"`` of a callable giving the fast path's options in force
      (tile tables, precision policy) as a JSON-able dict, which ``fuseval bench`` records.
    """
    name: str
    package: str
    definition: str = "definition.json"
    budget: str | None = "budget.json"
    inputs: Mapping[str, str] | None = None
    cost_model: str | None = None
    bench_impls: tuple[str, ...] | None = None
    bench_fast: str | None = "fast"
    properties: str | None = None
    mutants: str | None = None
    fast_options: str | None = None

    # ------------------------------------------------------------------ package data
    def read_text(self, filename: str) -> str:
        return resources.files(self.package).joinpath(filename).read_text()

    def data_path(self, filename: str) -> str:
        return str(resources.files(self.package).joinpath(filename))

    def definition_text(self) -> str:
        return self.read_text(self.definition)

    def budget_path(self) -> str | None:
        return None if self.budget is None else self.data_path(self.budget)

    # ------------------------------------------------------------------ code
    def resolve(self, reference: str) -> Any:
        """The object a ``".module:attr"`` or ``"package.module:attr"`` string names."""
        return resolve(reference, self.package)

    def input_hook(self, mode: str) -> Callable | None:
        hook = (self.inputs or {}).get(mode)
        return None if hook is None else self.resolve(hook)

    def cost(self) -> Callable | None:
        return None if self.cost_model is None else self.resolve(self.cost_model)

    def property_hooks(self) -> Any | None:
        return None if self.properties is None else self.resolve(self.properties)

    def options_of_fast(self) -> dict:
        return {} if self.fast_options is None else dict(self.resolve(self.fast_options)())

    def mutant_catalogue(self) -> list:
        return [] if self.mutants is None else list(self.resolve(self.mutants)())


def qualify(reference: str, package: str) -> str:
    """``".fast:forward"`` in ``package`` -> ``"package.fast:forward"`` (absolute names unchanged)."""
    module, sep, attr = reference.partition(":")
    if module.startswith("."):
        module = importlib.util.resolve_name(module, package)
    return f"{module}{sep}{attr}"


def resolve(reference: str, package: str | None = None) -> Any:
    """Import what ``"module[:attr.attr]"`` names; a leading dot is relative to ``package``."""
    module_name, _, attr = (qualify(reference, package) if package else reference).partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj


# ---------------------------------------------------------------------- the registry
_REGISTRY: dict[str, OperatorSpec] | None = None


def _register(found: dict[str, OperatorSpec], candidate: Any, where: str) -> None:
    if not isinstance(candidate, OperatorSpec):
        raise TypeError(f"{where}: expected an OperatorSpec, got {type(candidate).__name__}")
    if candidate.name in found and found[candidate.name] != candidate:
        raise ValueError(f"operator {candidate.name!r} is registered twice: by "
                         f"{found[candidate.name].package} and by {candidate.package}")
    found[candidate.name] = candidate


def _discover() -> dict[str, OperatorSpec]:
    found: dict[str, OperatorSpec] = {}
    # the operators shipped with fuseval: every subpackage of this package defines SPEC
    for info in pkgutil.iter_modules(__path__):
        if info.ispkg:
            module = importlib.import_module(f"{__name__}.{info.name}")
            _register(found, getattr(module, "SPEC", None), f"{module.__name__}.SPEC")
    # operators of other distributions: entry points naming an OperatorSpec
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        _register(found, ep.load(), f"entry point {ep.name} = {ep.value}")
    return dict(sorted(found.items()))


def registry() -> dict[str, OperatorSpec]:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = _discover()
    return _REGISTRY


def names() -> list[str]:
    """The registered operators' names, sorted."""
    return list(registry())


def spec(name: str) -> OperatorSpec:
    """The spec of operator ``name``; an unknown name is an :class:`UnknownOperatorError`."""
    known = registry()
    if name not in known:
        raise UnknownOperatorError(f"unknown operator {name!r}; known operators: {', '.join(known)}")
    return known[name]
