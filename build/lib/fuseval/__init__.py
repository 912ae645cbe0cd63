"""fuseval: reference-first numerical validation of fused GPU kernels.

Public API::

    import fuseval
    report = fuseval.check("nvfp4_qkv_rope", "mypkg.kernels:qkv_rope", config="small")
    report.passed, report.to_dataframe()

    fuseval.ops.get("qwen2vl_decoder_layer").definition      # the operator as data
    fuseval.generate_inputs(defn, {"batch_size": 1, "seq_len": 128}, seed=0)

    fuseval.budget.run_budget("nvfp4_qkv_rope", "fast", config="small")   # per-stage error budget
    fuseval.properties.check_implementation("nvfp4_qkv_rope", my_kernel)  # Hypothesis properties
    fuseval.run_gate("all", "fast", profile="ci")                          # the CI gate
    fuseval.stats.check_over_seeds(...), fuseval.baseline.collect(...)     # verdicts, baselines

``budget``, ``properties``, ``gate``, ``baseline``, ``stats``, ``fast`` and ``run_gate`` are
imported on first use, so ``import fuseval`` stays quick and never imports Triton.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

from . import definitions, ops
from .check import CheckReport, check, compare
from .definitions import load as load_definition
from .inputs import generate_inputs

# attribute -> (module, attribute or None for the module itself), imported on first access
_LAZY = {
    "budget": ("fuseval.budget", None),
    "properties": ("fuseval.properties", None),
    "gate": ("fuseval.gate", None),
    "baseline": ("fuseval.baseline", None),
    "stats": ("fuseval.stats", None),
    "fast": ("fuseval.fast", None),
    "run_gate": ("fuseval.gate", "run_gate"),
}


def __getattr__(name: str):
    if name in _LAZY:
        module_name, attr = _LAZY[name]
        module = importlib.import_module(module_name)
        return module if attr is None else getattr(module, attr)
    raise AttributeError(f"module 'fuseval' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["check", "compare", "CheckReport", "ops", "definitions", "load_definition",
           "generate_inputs", "budget", "properties", "gate", "baseline", "stats", "run_gate",
           "__version__"]
