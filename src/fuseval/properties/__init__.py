"""Property-based tests of fused operators (Hypothesis), usable from any test suite.

* :mod:`.strategies` - axis bindings (``axis_bindings(op)``) and inputs (``inputs(op,
  binding, mode)``) in benchmark, realistic and adversarial modes, drawn as small readable
  :class:`~.strategies.Example` values that shrink well;
* :mod:`.hooks` - :class:`PropertyHooks`, what an operator's package tells the engine
  (its axis space, its special inputs, its tight bound and invariants); the engine itself
  never names an operator;
* :mod:`.invariants` - the metamorphic-property machinery and batch independence;
* :func:`check_implementation` - the fast-vs-reference property for any implementation;
* :mod:`.mutants` - broken implementations built from a reference, and each operator's
  catalogue of them, which the suite must reject;
* :mod:`.profiles` - the ``ci``, ``dev``, ``thorough`` and ``gpu`` Hypothesis profiles.

Example::

    from fuseval.properties import check_implementation
    report = check_implementation("nvfp4_qkv_rope", "mypkg.kernels:qkv_rope", profile="ci")
    assert report.passed, str(report)      # failures print the axis binding, mode, seed
                                           # and a command that reproduces them

See docs/properties.md.
"""
from __future__ import annotations

import importlib

from . import hooks, invariants, profiles, strategies
from .fast_vs_reference import (Failure, PropertyReport, check_implementation, evaluate, has_tight_bound,
                                tight_bound)
from .hooks import PropertyHooks, TightBound, hooks_of
from .strategies import Binding, Example, Recipe, axis_bindings, examples, inputs

__all__ = ["check_implementation", "evaluate", "PropertyReport", "Failure", "tight_bound", "has_tight_bound",
           "PropertyHooks", "TightBound", "hooks_of", "Binding", "Example", "Recipe", "axis_bindings", "inputs",
           "examples", "strategies", "invariants", "profiles", "hooks", "mutants"]


def __getattr__(name):
    # the mutant machinery is imported on first use
    if name == "mutants":
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(name)
