"""Operators joined with their implementations.

An operator is its definition (``definition.json`` of its package, see
:mod:`fuseval.operators`) plus the callables its ``implementations`` table names
(``reference`` is the float64 oracle). An implementation is any callable taking the
inputs in definition order and returning the outputs in definition order; it is named
either by a key of that table (``fast``, ``torch``...), by ``"package.module:function"``,
or passed as a callable. A name that cannot be resolved is an :class:`ImplementationError`
(exit code ``EXIT_IMPORT_ERROR``).
"""
from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

from .. import operators
from ..definitions import Definition
from . import load
from ..errors import ImplementationError

__all__ = ["Operator", "get", "names", "resolve_impl", "impl_label", "missing_implementation",
           "ImplementationError"]


def _import_callable(path: str) -> Callable:
    if ":" not in path:
        raise ImplementationError(f"implementation {path!r} is neither a known name nor 'module:function'")
    module_name, _, attr = path.partition(":")
    # a module in the working folder can be named (in a worker, the folder is first on its
    # path already); here it comes after everything else, so it never shadows a module
    # fuseval's process imports
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - report any import failure the same way
        raise ImplementationError(f"cannot import module {module_name!r} for implementation "
                                  f"{path!r}: {type(exc).__name__}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ImplementationError(f"module {module_name!r} has no attribute {attr!r} "
                                      f"(implementation {path!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ImplementationError(f"implementation {path!r} is not callable ({type(obj).__name__})")
    return obj


@dataclass(frozen=True)
class Operator:
    """A view of one configured operator: its definition (data, configuration, variant)
    and, through it, its record (``record``: hooks, cost model, mutants, budget file),
    with its implementations resolved by name."""
    definition: Definition

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def record(self) -> "operators.OperatorRecord":
        return self.definition.operator

    @property
    def implementation_names(self) -> list[str]:
        return list(self.definition.implementations)

    def implementation(self, impl: str | Callable) -> Callable:
        return resolve_impl(self.definition, impl)

    @property
    def reference(self) -> Callable:
        return resolve_impl(self.definition, "reference")

    def with_config(self, config) -> "Operator":
        return Operator(self.definition.with_config(config))

    def with_variant(self, variant: str | None) -> "Operator":
        return Operator(self.definition.with_variant(variant))


def names() -> list[str]:
    return operators.names()


def get(name: str | Operator | Definition, config: str | dict = "seed",
        variant: str | None = None) -> Operator:
    """The operator ``name`` in ``config``, under ``variant`` (None: the benchmark's
    semantics, or the variant the given definition already has)."""
    if isinstance(name, Operator):
        name = name.definition
    if isinstance(name, Definition):
        d = name if config == "seed" else name.with_config(config)
        return Operator(d if variant is None else d.with_variant(variant))
    return Operator(load(name, config, variant))


def resolve_impl(defn: Definition, impl: str | Callable) -> Callable:
    """A callable for ``impl``: a name of the definition's table, 'module:function', or a callable."""
    if callable(impl):
        return impl
    if not isinstance(impl, str):
        raise ImplementationError(f"implementation must be a name, 'module:function' or a callable, "
                                  f"got {type(impl).__name__}")
    if impl in defn.implementations:
        return _import_callable(defn.implementations[impl])
    if ":" not in impl:
        raise ImplementationError(f"{defn.name}: unknown implementation {impl!r}; known: "
                                  f"{', '.join(defn.implementations)} (or give 'module:function')")
    return _import_callable(impl)


def missing_implementation(defn: Definition, impl: str | Callable) -> str | None:
    """Why ``defn`` has no implementation ``impl`` ("no implementation 'fast'"), or None when
    it has one: a callable or a "module:function" path applies to every operator, a name
    only to the operators whose table has it."""
    if callable(impl) or not isinstance(impl, str) or ":" in impl or impl in defn.implementations:
        return None
    return f"no implementation {impl!r}"


def impl_label(impl: str | Callable) -> str:
    if isinstance(impl, str):
        return impl
    return f"{getattr(impl, '__module__', '?')}:{getattr(impl, '__qualname__', repr(impl))}"
