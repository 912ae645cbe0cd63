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
budget, properties, CLI) reads operators only through this module: the boundary resolves a
name once (:func:`load`, :func:`record`) and the layers below read the operator's
:class:`OperatorRecord` off the definition they are given (``defn.operator``).

Operators come from three places: the subpackages of this package, the entry points of
the ``fuseval.operators`` group (other distributions), and SOL-ExecBench problem folders
(:func:`register_problem`, or the folders listed in ``FUSEVAL_PROBLEM_PATH``; the variable
is how a spawned worker process sees the same problems as its parent).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import json
import os
import pkgutil
import threading
from dataclasses import dataclass, replace
from importlib import metadata, resources
from typing import Any, Callable, Mapping

from ..definitions import Definition, parse, qualify
from ..errors import UnknownOperatorError, UsageError

__all__ = ["OperatorSpec", "OperatorRecord", "spec", "record", "names", "resolve", "qualify", "register",
           "register_problem", "ENTRY_POINT_GROUP", "PROBLEM_PATH_ENV",
           "load", "variant_scope"]

ENTRY_POINT_GROUP = "fuseval.operators"
PROBLEM_PATH_ENV = "FUSEVAL_PROBLEM_PATH"


@dataclass(frozen=True)
class OperatorSpec:
    """What an operator package declares. ``package`` is the operator's package; the other
    strings are files in it or ``".module:attr"`` references (None: not provided). The
    registry builds the operator's :class:`OperatorRecord` from it, which resolves them.

    * ``inputs``: {mode: hook} for the input modes the operator draws itself
      (``benchmark``, ``realistic``); a hook is ``hook(defn, axes, seed, device=) -> {name: value}``.
      Modes without a hook use the generic rules of :mod:`fuseval.inputs`.
    * ``cost_model``: ``cost_model(axes) -> {"flops", "bytes", "matmul_dtype", ...}`` for the bench floor
      (an optional ``"floors_also_at": [dtype, ...]`` makes the bench report the floor at those
      matmul rates too).
    * ``bench_impls`` / ``bench_fast``: what ``fuseval bench`` times by default, and which of
      them is the operator's own fast path (``bench_fast`` None: none).
    * ``properties``: a module with the operator's property hooks (see :mod:`fuseval.properties`).
    * ``mutants``: ``"module:attr"`` of the operator's mutant catalogue (a callable giving the
      list of :class:`fuseval.operators.mutants.Mutant`).
    * ``fast_options``: ``"module:attr"`` of a callable giving the fast path's options in force
      (tile tables, precision policy) as a JSON-able dict, which ``fuseval bench`` records.
    * ``fast_parts``: ``"module:attr"`` of ``parts(*inputs) -> {name: Part}``
      (:class:`fuseval.bench.Part`): the fast path's pieces of work on these inputs (its
      launches, run as the production call runs them), which ``fuseval bench`` times apart,
      each against its own floor.
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
    fast_parts: str | None = None
    # ``"module:attr"`` of ``hints(bound_axes) -> fuseval.diagnosis.hints.Hints``: how the
    # diagnosis names this operator's axes, their parts and tiles, and its input groups
    diagnosis: str | None = None
    # the definition as JSON text, for operators that are not packages with data files
    # (an imported problem folder); None: read ``definition`` from the package
    definition_json: str | None = None

    # ------------------------------------------------------------------ package data
    def read_text(self, filename: str) -> str:
        return resources.files(self.package).joinpath(filename).read_text()

    def data_path(self, filename: str) -> str:
        return str(resources.files(self.package).joinpath(filename))

    def definition_text(self) -> str:
        return self.definition_json if self.definition_json is not None else self.read_text(self.definition)

    def budget_path(self) -> str | None:
        return None if self.budget is None else self.data_path(self.budget)

    # ------------------------------------------------------------------ code
    def resolve(self, reference: str) -> Any:
        """The object a ``".module:attr"`` or ``"package.module:attr"`` string names
        (what the code references name is resolved once, by the operator's record)."""
        return resolve(reference, self.package)


@dataclass(frozen=True, eq=False)
class OperatorRecord:
    """One operator as the harness receives it: built once by the registry from its
    :class:`OperatorSpec`, immutable, and attached to every :class:`Definition` the registry
    loads (``defn.operator``), so the layers below the interfaces read an operator's
    oracle, hooks, cost model, mutants and budget file off the definition they were given,
    never by looking its name up.

    ``definition`` is the operator's data (seed configuration, the benchmark's semantics);
    ``variants`` its semantic variants, the benchmark's first; ``directory`` the problem
    folder of an imported problem (None: a package); ``budget_path`` its budget file (None:
    it ships none). The code the spec names is imported on first use, once (listing
    operators imports no oracle); what is called on each use (the mutant catalogue, the
    fast path's options in force) is called anew each time, so it sees the variant and
    options in force then."""
    spec: OperatorSpec
    variants: tuple[str, ...]
    directory: str | None = None

    @property
    def definition(self) -> Definition:
        # set once by the registry; not a dataclass field, so that dataclasses.asdict of a
        # definition (which holds its record) does not loop back through it
        return self.__dict__["_definition"]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def budget_path(self) -> str | None:
        """The budget file the operator ships (None: none). Asked anew each time: an
        imported problem derives its budget from its workloads when its folder has none."""
        return self.spec.budget_path()

    @property
    def package(self) -> str:
        return self.spec.package

    def load(self, config: str | Mapping[str, int] = "seed", variant: str | None = None) -> Definition:
        """Its definition with a named or custom configuration, under ``variant`` (None: the
        one :func:`variant_scope` sets now, else the benchmark's semantics): what
        ``fuseval.operators.load(name, config, variant)`` gives, for a layer that holds the
        record. ``load()``, the seed configuration under the variant in force, is what its
        mutant catalogue is built on."""
        d = self.definition if config == "seed" else self.definition.with_config(config)
        variant = variant if variant is not None else _VARIANT_SCOPE.get().get(self.name)
        return d if variant is None else d.with_variant(variant)

    def _resolved(self, reference: str | None) -> Any:
        return None if reference is None else self.spec.resolve(reference)

    @functools.cached_property
    def module(self) -> Any:
        """The operator's package, imported (an imported problem's holds its diagnosis hooks)."""
        return importlib.import_module(self.spec.package)

    @functools.cached_property
    def input_hooks(self) -> Mapping[str, Callable]:
        """{mode: hook} of the input modes the operator draws itself."""
        return {mode: self.spec.resolve(ref) for mode, ref in (self.spec.inputs or {}).items()}

    def input_hook(self, mode: str) -> Callable | None:
        return self.input_hooks.get(mode)

    @functools.cached_property
    def cost_model(self) -> Callable | None:
        return self._resolved(self.spec.cost_model)

    @functools.cached_property
    def property_hooks(self) -> Any | None:
        """What the spec's ``properties`` names (None: the engine's defaults); the property
        engine checks its type."""
        return self._resolved(self.spec.properties)

    @functools.cached_property
    def _catalogue(self) -> Callable | None:
        return self._resolved(self.spec.mutants)

    def mutant_catalogue(self) -> list:
        return [] if self._catalogue is None else list(self._catalogue())

    @functools.cached_property
    def _fast_options(self) -> Callable | None:
        return self._resolved(self.spec.fast_options)

    def fast_options(self) -> dict:
        """The fast path's options in force now (empty: it reports none)."""
        return {} if self._fast_options is None else dict(self._fast_options())

    @functools.cached_property
    def fast_parts(self) -> Callable | None:
        return self._resolved(self.spec.fast_parts)

    @functools.cached_property
    def diagnosis_hints(self) -> Callable | None:
        return self._resolved(self.spec.diagnosis)

    def __repr__(self) -> str:
        return f"OperatorRecord({self.name!r}, package={self.package!r})"


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
    # SOL-ExecBench problem folders named by the environment
    for directory in _problem_path():
        _register(found, _problem_spec(directory), f"{PROBLEM_PATH_ENV} folder {directory}")
    return dict(sorted(found.items()))


def _problem_path() -> list[str]:
    return [d for d in os.environ.get(PROBLEM_PATH_ENV, "").split(os.pathsep) if d]


# Problem folders are a source of operators above this layer (fuseval.interop reads them),
# declared here as a plug-in reference, as entry points and operator packages are: the
# registry resolves it by name when a folder is registered, and never imports it otherwise.
PROBLEM_SOURCE = "fuseval.interop.problems:operator_spec"


def _problem_spec(directory: str) -> OperatorSpec:
    return resolve(PROBLEM_SOURCE)(directory)


def register(candidate: OperatorSpec) -> OperatorSpec:
    """Add an operator to the registry of this process (a name already taken by another
    operator is a ValueError)."""
    _register(registry(), candidate, f"register({candidate.name!r})")
    return candidate


def register_problem(directory: str | os.PathLike) -> OperatorSpec:
    """Register a SOL-ExecBench problem folder as an operator and list it in
    ``FUSEVAL_PROBLEM_PATH``, so worker processes started later register it too."""
    directory = os.path.abspath(os.fspath(directory))
    candidate = _problem_spec(directory)
    taken = registry().get(candidate.name)
    if taken is not None and taken != candidate:
        where = getattr(taken, "directory", "") or taken.package
        raise UsageError(f"problem folder {directory}: its name {candidate.name!r} is already the name of the "
                         f"operator from {where}; register one of them per process")
    found = register(candidate)
    if directory not in _problem_path():
        os.environ[PROBLEM_PATH_ENV] = os.pathsep.join([*_problem_path(), directory])
    return found


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


# ---------------------------------------------------------------------- records by name
# {name: record}; a record is rebuilt when the registry holds another spec under its name
_CACHE: dict[str, OperatorRecord] = {}
_BUILDING = threading.Lock()        # the gate's threads load operators side by side: one record each


def _build(spec_: OperatorSpec) -> OperatorRecord:
    raw = json.loads(spec_.definition_text())
    if raw.get("name") != spec_.name:
        raise ValueError(f"{spec_.package}/{spec_.definition}: names operator {raw.get('name')!r}, "
                         f"its spec {spec_.name!r}")
    base = parse(raw, spec_.package)
    rec = OperatorRecord(spec=spec_, variants=tuple(base.variant_names),
                         directory=getattr(spec_, "directory", None) or None)
    # the record holds its definition and the definition its record (both immutable)
    object.__setattr__(rec, "_definition", replace(base, operator=rec))
    return rec


def record(name: str) -> OperatorRecord:
    """The record of operator ``name``, built once; an unknown name is an
    :class:`UnknownOperatorError`. This is the boundary's resolver: the layers below it
    are given a definition (``defn.operator``) or a record, never a name."""
    spec_ = spec(name)          # UnknownOperatorError names the known ones
    found = _CACHE.get(name)
    if found is None or found.spec is not spec_:
        with _BUILDING:
            found = _CACHE.get(name)
            if found is None or found.spec is not spec_:
                found = _CACHE[name] = _build(spec_)
    return found


# {operator name: variant} in force for ``load`` calls that name no variant (see variant_scope)
_VARIANT_SCOPE: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "fuseval_variant_scope", default={})


@contextlib.contextmanager
def variant_scope(variants: Mapping[str, str]):
    """Within the block, ``load(name)`` gives operator ``name`` under ``variants[name]``.

    This is the one switch a command sets (``--variant``) so that every component it runs
    (check, gate, budget, bench, export, the properties) loads the same semantics."""
    for op, variant in variants.items():
        record(op).definition.with_variant(variant)     # unknown operator or variant: fail here
    token = _VARIANT_SCOPE.set({**_VARIANT_SCOPE.get(), **variants})
    try:
        yield
    finally:
        _VARIANT_SCOPE.reset(token)


def load(name: str, config: str | Mapping[str, int] = "seed", variant: str | None = None) -> Definition:
    """Load an operator definition, optionally with a named or custom configuration and a
    named semantic variant (None: the one ``variant_scope`` sets, else the benchmark's
    semantics; a given Definition keeps its own)."""
    if isinstance(name, Definition):
        d = name if config == "seed" and name.config == "seed" else name.with_config(config)
        return d if variant is None else d.with_variant(variant)
    return record(name).load(config, variant)
