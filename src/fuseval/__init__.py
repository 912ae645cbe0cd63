"""fuseval: reference-first numerical validation of fused GPU kernels.

Public API::

    import fuseval
    report = fuseval.check("nvfp4_qkv_rope", "mypkg.kernels:qkv_rope", config="small")
    report.passed, report.to_dataframe()

    fuseval.operators.implementations.get("qwen2vl_decoder_layer").definition      # the operator as data
    fuseval.generate_inputs(defn, {"batch_size": 1, "seq_len": 128}, seed=0)

    fuseval.budget.run_budget("nvfp4_qkv_rope", "fast", config="small")   # per-stage error budget
    fuseval.properties.check_implementation("nvfp4_qkv_rope", my_kernel)  # Hypothesis properties
    fuseval.run_gate("all", "fast", profile="ci")                          # the CI gate
    fuseval.stats.check_over_seeds(...), fuseval.baseline.collect(...)     # verdicts, baselines

Everything is imported on first use, so ``import fuseval`` stays quick and imports neither
torch nor Triton: a worker process (:mod:`fuseval.runner.in_worker`) must confine itself
before torch starts its first thread.
"""
from __future__ import annotations

import importlib
import sys
import types

from ._version import __version__

# attribute -> (module, attribute or None for the module itself), imported on first access
_LAZY = {
    "check": ("fuseval.check", "check"),
    "compare": ("fuseval.check", "compare"),
    "CheckReport": ("fuseval.check", "CheckReport"),
    "ops": ("fuseval.operators.implementations", None),
    "definitions": ("fuseval.definitions", None),
    "load_definition": ("fuseval.definitions", "load"),
    "generate_inputs": ("fuseval.inputs", "generate_inputs"),
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
        value = module if attr is None else getattr(module, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fuseval' has no attribute {name!r}")


class _Package(types.ModuleType):
    """``fuseval.check`` is the function, as it always was, though a submodule has that
    name too: importing the submodule (which sets the attribute to the module) leaves the
    function in place; the module stays ``sys.modules["fuseval.check"]``."""

    def __setattr__(self, name, value):
        if name in _LAZY and isinstance(value, types.ModuleType) and _LAZY[name][1] is not None:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["check", "compare", "CheckReport", "ops", "definitions", "load_definition",
           "generate_inputs", "budget", "properties", "gate", "baseline", "stats", "run_gate",
           "__version__"]
