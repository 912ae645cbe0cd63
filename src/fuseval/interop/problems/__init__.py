"""One module per imported problem folder: ``fuseval.interop.problems.<name>_<hash>``.

The module is made on import (a finder on ``sys.meta_path``) from a folder this process
was given (:func:`remember`) or one listed in ``FUSEVAL_PROBLEM_PATH``, so a worker process
spawned to run an implementation imports the same module by name. It holds:

* ``reference(*inputs)``: the oracle, the problem's reference lifted to float64
  (:mod:`fuseval.interop.lift`); ``last_lift`` is the :class:`LiftReport` of its last call,
  and ``reference.oracle_notes`` gets, per call that could not be lifted, why that call's
  oracle is the reference in its own precision (:func:`fuseval.check.oracle_note` reads
  and clears it);
* ``sol_reference(*inputs)``: the reference as written (what the benchmark compares
  against; ``torch._scaled_mm`` emulated only where the machine cannot run it);
* ``benchmark_inputs(defn, axes, seed, device=)``: the input hook (the workload's own
  descriptors, :mod:`fuseval.interop.workload_inputs`);
* ``solution_<i>``: the implementations of the folder's ``solution*.json`` files;
* ``PROBLEM`` and ``DEFINITION_TEXT`` (the definition in fuseval's format);
* ``PROPERTY_HOOKS``: its :class:`~fuseval.properties.PropertyHooks`
  (:mod:`fuseval.interop.properties`).

The spec's budget is the folder's ``budget.json``, else one derived from its workloads
(:mod:`fuseval.interop.budget`).

Making the module runs none of the problem's code (``fuseval list``, ``import`` and
``export`` read the folder as data): its code runs only when one of the functions above
is called, through :mod:`fuseval.interop.problem_code`, which runs it in a confined
worker of the problem's own unless fuseval runs in-process.

Inputs arrive and outputs leave in fuseval's format (fp4 tensors as their uint8 bytes);
the problem's code sees them as the benchmark passes them.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import types
from dataclasses import dataclass
from typing import Any

import torch

from ...operators import OperatorSpec
from ..sol_problem import PROBLEM_PATH_VARIABLE, Problem, ProblemError, module_name, read_problem
from .. import problem_code, solution, workload_inputs as problem_inputs
from ..budget import budget_file
from ..properties import problem_hooks

__all__ = ["remember", "spec_of", "operator_spec", "ProblemSpec"]

_PREFIX = __name__ + "."
_FOLDERS: dict[str, str] = {}          # module name -> problem folder


def remember(directory: str) -> str:
    """Make the problem folder ``directory`` importable here; returns its module name."""
    problem = read_problem(directory)
    _FOLDERS[problem.module] = problem.directory
    return problem.module


def _folder_of(fullname: str) -> str | None:
    if fullname in _FOLDERS:
        return _FOLDERS[fullname]
    for folder in os.environ.get(PROBLEM_PATH_VARIABLE, "").split(os.pathsep):
        if folder and os.path.isdir(folder):
            try:
                if remember(folder) == fullname:
                    return _FOLDERS[fullname]
            except ProblemError:
                continue
    return None


@dataclass(frozen=True)
class ProblemSpec(OperatorSpec):
    """The spec of an imported problem: data from its folder, code from its module."""
    directory: str = ""

    def read_text(self, filename: str) -> str:
        if filename == self.definition:
            return importlib.import_module(self.package).DEFINITION_TEXT
        with open(self.data_path(filename)) as f:
            return f.read()

    def data_path(self, filename: str) -> str:
        if filename == self.budget:
            # the folder's own budget file, else the budget derived from its workloads
            return budget_file(read_problem(self.directory))
        return os.path.join(self.directory, filename)


def spec_of(problem: Problem) -> ProblemSpec:
    hooks = {"benchmark": f"{problem.module}:benchmark_inputs"}
    if problem.custom_inputs_entrypoint:
        # inputs with structure (indices, lengths) come from the problem's generator in any mode
        hooks["realistic"] = hooks["benchmark"]
    return ProblemSpec(name=problem.name, package=problem.module, budget="budget.json", inputs=hooks,
                       bench_impls=("sol_reference",), bench_fast=None, directory=problem.directory,
                       properties=f"{problem.module}:PROPERTY_HOOKS")


def operator_spec(directory: str):
    """The :class:`~fuseval.operators.OperatorSpec` of the problem folder ``directory``.

    Its code (oracles, input hook, definition text) is a module made for it,
    ``fuseval.interop.problems.<name>_<hash>``; the folder is added to the environment
    variable ``FUSEVAL_PROBLEM_PATH`` so that worker processes spawned from this one
    import that module too. Raises :class:`ProblemError` for a malformed folder."""
    problem = read_problem(directory)
    remember(problem.directory)
    folders = [p for p in os.environ.get(PROBLEM_PATH_VARIABLE, "").split(os.pathsep) if p]
    if problem.directory not in {os.path.realpath(p) for p in folders}:
        os.environ[PROBLEM_PATH_VARIABLE] = os.pathsep.join(folders + [problem.directory])
    return spec_of(problem)


def _outputs_to_fuseval(outputs) -> tuple:
    return tuple(o.view(torch.uint8) if isinstance(o, torch.Tensor) and o.dtype == torch.float4_e2m1fn_x2 else o
                 for o in outputs)


def _populate(module: types.ModuleType, problem: Problem) -> None:

    solutions = solution.find_solutions(problem.directory)
    table = {}
    for index, (impl_name, _path) in enumerate(solutions):
        table[impl_name] = f"{problem.module}:solution_{index}"

    def reference(*inputs):
        """The oracle: the problem's reference lifted to float64 (fuseval.interop.lift)."""
        result = problem_code.run_reference(problem, problem_inputs.to_benchmark(problem, inputs), lifted=True)
        module.last_lift = result.report
        # a reference that could not be lifted says so to whoever compares against it
        if not result.report.lifted:
            reference.oracle_notes.append(result.report.note)
        return _outputs_to_fuseval(result.lifted)

    def sol_reference(*inputs):
        """The problem's reference as written (what the benchmark compares against)."""
        return _outputs_to_fuseval(problem_code.run_reference(problem, problem_inputs.to_benchmark(problem, inputs),
                                                              lifted=False))

    def reference_under_mode(inputs, mode):
        """(the oracle's outputs, what the mode said) with the torch function mode ``mode``
        (``("module:Class", args)``, one of fuseval's own) active around the lifted reference,
        run where the problem's code runs (the diagnosis's generic mistakes)."""
        result, said = problem_code.run_reference(problem, problem_inputs.to_benchmark(problem, list(inputs)),
                                                  lifted=True, mode=mode)
        return _outputs_to_fuseval(result.lifted), said

    def benchmark_inputs(defn, axes, seed, device="cpu"):
        """The workload's inputs as its descriptors say (fuseval.interop.workload_inputs)."""
        workload = problem.workload_for({a: axes[a] for a in problem.var_axes})
        values = problem_inputs.draw_inputs(problem, workload, seed, device)
        return problem_inputs.to_fuseval(problem, values)

    def __getattr__(attr: str):
        if attr == "PROPERTY_HOOKS":       # the property engine's facts (fuseval.interop.properties)
            module.PROPERTY_HOOKS = problem_hooks(problem)
            return module.PROPERTY_HOOKS
        if attr == "DEFINITION_TEXT":      # built on first use: it raises for what fuseval cannot check
            text = json.dumps(problem.fuseval_definition(table), indent=1)
            module.DEFINITION_TEXT = text
            return text
        if attr.startswith("solution_") and attr[len("solution_"):].isdigit():
            index = int(attr[len("solution_"):])
            if index < len(solutions):
                fn = solution.load_solution(solutions[index][1], problem)
                setattr(module, attr, fn)
                return fn
        raise AttributeError(f"module {module.__name__!r} has no attribute {attr!r}")

    module.PROBLEM = problem
    module.last_lift = None
    module.reference = reference
    module.sol_reference = sol_reference
    module.benchmark_inputs = benchmark_inputs
    module.reference_under_mode = reference_under_mode
    module.SOLUTIONS = dict(table)
    module.__getattr__ = __getattr__
    for fn in (reference, sol_reference, reference_under_mode, benchmark_inputs):
        fn.__module__ = module.__name__
        fn.__qualname__ = fn.__name__
    reference.oracle_notes = []


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(_PREFIX) or "." in fullname[len(_PREFIX):]:
            return None
        folder = _folder_of(fullname)
        if folder is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, origin=folder)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        problem = read_problem(module.__spec__.origin)
        _populate(module, problem)


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.append(_Finder())
