"""The error budget of an imported problem that ships none: end to end, each workload's
own tolerance.

A SOL-ExecBench problem names no stages (its reference is one ``run`` function), so its
budget has none either: one allowance on the final outputs, ``tolerance_used <= 1``, where
``tolerance_used`` is the share of the case's own tolerance (the workload's ``max_atol``,
``max_rtol`` and ``required_matched_ratio``) the outputs spend against the lifted float64
oracle (:func:`fuseval.budget.metrics.tolerance_use`). The budget report then gives, per
case, how much of it the implementation spends and how much the benchmark's own
reference (``sol_reference``, the budget's ``torch`` baseline) spends.

A folder that ships a ``budget.json`` of its own (the format of docs/budget.md, with
``"op"`` the problem's name) is used instead. Per-stage budgets need stage taps, which a
problem folder cannot provide today (docs/interop.md says why and how it could).
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from .sol_problem import Problem

__all__ = ["derived_budget", "budget_file", "BUDGET_FILE"]

BUDGET_FILE = "budget.json"


def derived_budget(problem: Problem) -> dict[str, Any]:
    """The budget of the module docstring, as the JSON a budget file holds."""
    return {
        "schema_version": 1,
        "op": problem.name,
        "description": ("derived by fuseval for an imported SOL-ExecBench problem without a budget file: end to "
                        "end, each workload's own tolerance (no stages: the problem provides no stage taps)"),
        "stages": {},
        "end_to_end": {
            "tolerance": True,
            "allowance": [{"kind": "abs", "metric": "tolerance_used", "max": 1,
                           "note": "the share of the workload's tolerance spent against the lifted float64 oracle"}],
            "note": "each case is judged under its own workload's tolerance",
        },
    }


def budget_file(problem: Problem) -> str:
    """The problem's budget file: its folder's ``budget.json``, else the derived budget
    written to a file of fuseval's temporary folder (rewritten when it differs)."""
    own = os.path.join(problem.directory, BUDGET_FILE)
    if os.path.exists(own):
        return own
    folder = os.path.join(tempfile.gettempdir(), f"fuseval-budgets-{os.getuid() if hasattr(os, 'getuid') else 0}")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, problem.module.rpartition(".")[2] + ".json")
    text = json.dumps(derived_budget(problem), indent=1) + "\n"
    try:
        with open(path) as f:
            if f.read() == text:
                return path
    except OSError:
        pass
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".json")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path
