"""The CI gate: every check fuseval has, on one implementation, with one verdict.

``run_gate(op, impl, profile="ci")`` runs, per operator, three components:

``check``       the benchmark cases (scaled down on the CPU) against the float64 oracle,
                over several seeds, judged statistically (:mod:`fuseval.stats`): a case
                that fails on any seed fails the gate; a metric that passes with less than
                ``warn_margin`` of its allowance left is a warning; an output whose
                tolerance cannot see an error of 10% of its RMS fails ("blind_tolerance");
``properties``  the Hypothesis property suite (:mod:`fuseval.properties`);
``budget``      the per-stage error budget (:mod:`fuseval.budget`).

Everything the gate is given is validated before any component runs (:mod:`.inputs`): an
unknown operator, an implementation that does not import, ``--device cuda`` without a
GPU, a malformed budget file raise :class:`~fuseval.errors.FusevalError` with their exit
codes. Under ``--op all``, an operator without the implementation asked for (``fast``
for a new operator that has none) is reported as not run, with the reason. Each
component is guarded (:mod:`.runner`): if one raises, it is reported as a component in
error (a bug in fuseval: exit 70, with its traceback) and the others still run.

The :class:`GateReport` (:mod:`.results`) prints a one-screen summary with a timing line
per component and writes (:mod:`.render`), into ``out``: ``junit.xml`` (for CI systems),
``gate.json`` and ``gate.md``, ``check-<op>.json``, ``properties-<op>.json`` and the
budget's reports ``budget-<op>.json|md|html``.

Profiles fix how much work a run does (each operator runs the listed cases it has):

=========  =======  ======  ==========================  ==========  ==================
profile    config   device  check seeds (cases)         properties  budget (cases)
=========  =======  ======  ==========================  ==========  ==================
ci         small    cpu     3 (all on the first, 0-11)  ci          small (0,5,10,13)
thorough   small    cpu     5 (all each)                thorough    small (all)
gpu        seed     cuda    3 (all each)                gpu         seed (all)
=========  =======  ======  ==========================  ==========  ==================

Hygiene checks (which call the implementation more than once) run on the first seed only.
"""
from __future__ import annotations

import importlib

# name -> the module of the package that defines it, imported on first use: the command line
# reads the profiles (.profiles) without importing the harness behind the gate
_LAZY = {
    "RUNNERS": "components", "COMPONENTS": "profiles", "PROFILES": "profiles", "Profile": "profiles",
    "device_name": "profiles", "GateContext": "context", "resolve_ops": "context",
    "ComponentResult": "results", "GateReport": "results", "TestResult": "results", "not_run": "results",
    "run_component": "runner", "run_gate": "runner", "stderr_progress": "runner", "utc_timestamp": "runner",
}

__all__ = ["Profile", "PROFILES", "COMPONENTS", "RUNNERS", "TestResult", "ComponentResult", "GateReport",
           "GateContext", "run_gate", "run_component", "resolve_ops", "device_name", "not_run",
           "stderr_progress", "utc_timestamp"]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
