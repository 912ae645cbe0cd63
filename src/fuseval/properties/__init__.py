"""Property-based tests of fused operators (Hypothesis), usable from any test suite.

* :mod:`.strategies` - axis bindings (``axis_bindings(op)``) and inputs (``inputs(op,
  binding, mode)``) in benchmark, realistic and adversarial modes, drawn as small readable
  :class:`~.strategies.Example` values that shrink well;
* :mod:`.invariants` - metamorphic properties of the references and of any implementation;
* :mod:`.bounds` - derived bounds of the float32 reference against the float64 oracle;
* :func:`check_implementation` - the fast-vs-reference property for any implementation;
* :mod:`.mutants` - the catalogue of broken implementations the suite must reject;
* :mod:`.profiles` - the ``ci``, ``dev``, ``thorough`` and ``gpu`` Hypothesis profiles.

Example::

    from fuseval.properties import check_implementation
    report = check_implementation("nvfp4_qkv_rope", "mypkg.kernels:qkv_rope", profile="ci")
    assert report.passed, str(report)      # failures print the axis binding, mode, seed
                                           # and a command that reproduces them

See docs/properties.md.
"""
from __future__ import annotations

from . import invariants, profiles, strategies
from .fast_vs_reference import (PRECISIONS, TIGHT_BOUNDS, Failure, PropertyReport, check_implementation,
                                evaluate, tight_bound)
from .strategies import Binding, Example, Recipe, axis_bindings, examples, inputs

__all__ = ["check_implementation", "evaluate", "PropertyReport", "Failure", "tight_bound", "TIGHT_BOUNDS",
           "PRECISIONS", "Binding", "Example", "Recipe", "axis_bindings", "inputs", "examples",
           "strategies", "invariants", "profiles", "mutants", "bounds"]


def __getattr__(name):
    # the mutant catalogue and the bounds are imported on first use
    if name in ("mutants", "bounds"):
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(name)
