"""Writing small SOL-ExecBench problem folders for a test, in a folder the test made.

Every folder is written by the tests themselves (none is copied from the benchmark's
dataset): ``write_problem(tmp_path / "p", axes=..., inputs=..., outputs=..., reference=...,
workloads=[...])`` writes ``definition.json`` and ``workload.jsonl`` in the benchmark's
format and returns the folder's path.
"""
from __future__ import annotations

import json
import os
import textwrap
from typing import Any, Mapping, Sequence

__all__ = ["write_problem", "tensor", "workload"]


def tensor(shape: Sequence[str] | None, dtype: str, description: str = "") -> dict[str, Any]:
    """An input or output of a definition: its shape in axis names (None: a Python scalar)."""
    return {"shape": None if shape is None else list(shape), "dtype": dtype, "description": description}


def workload(axes: Mapping[str, int], inputs: Mapping[str, Any] | None = None, *, atol: float = 1e-3,
             rtol: float = 1e-3, ratio: float = 0.99, uuid: str | None = None) -> dict[str, Any]:
    """One line of workload.jsonl; inputs not named are drawn at random (the evaluator's rule)."""
    return {"uuid": uuid or "w-" + "-".join(f"{k}{v}" for k, v in axes.items()), "axes": dict(axes),
            "inputs": dict(inputs or {}),
            "tolerance": {"max_atol": atol, "max_rtol": rtol, "required_matched_ratio": ratio}}


def write_problem(folder, *, name: str, axes: Mapping[str, Any], inputs: Mapping[str, Any],
                  outputs: Mapping[str, Any], reference: str, workloads: Sequence[Mapping[str, Any]],
                  constraints: Sequence[str] = (), custom_inputs_entrypoint: str | None = None,
                  op_type: str = "test") -> str:
    """Write the problem folder ``folder`` (created); ``reference`` is dedented."""
    folder = str(folder)
    os.makedirs(folder, exist_ok=True)
    definition: dict[str, Any] = {"name": name, "op_type": op_type, "description": f"{name}, written for a test",
                                  "axes": dict(axes), "inputs": dict(inputs), "outputs": dict(outputs),
                                  "reference": textwrap.dedent(reference).lstrip("\n")}
    if constraints:
        definition["constraints"] = list(constraints)
    if custom_inputs_entrypoint:
        definition["custom_inputs_entrypoint"] = custom_inputs_entrypoint
    with open(os.path.join(folder, "definition.json"), "w") as f:
        json.dump(definition, f, indent=1)
    with open(os.path.join(folder, "workload.jsonl"), "w") as f:
        for row in workloads:
            f.write(json.dumps(row) + "\n")
    return folder
