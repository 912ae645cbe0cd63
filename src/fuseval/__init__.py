"""fuseval: reference-first numerical validation of fused GPU kernels.

Public API::

    import fuseval
    report = fuseval.check("nvfp4_qkv_rope", "mypkg.kernels:qkv_rope", config="small")
    report.passed, report.to_dataframe()

    fuseval.ops.get("qwen2vl_decoder_layer").definition      # the operator as data
    fuseval.generate_inputs(defn, {"batch_size": 1, "seq_len": 128}, seed=0)
"""
from __future__ import annotations

__version__ = "0.1.0"

from . import definitions, ops
from .check import CheckReport, check, compare
from .definitions import load as load_definition
from .inputs import generate_inputs

__all__ = ["check", "compare", "CheckReport", "ops", "definitions", "load_definition",
           "generate_inputs", "__version__"]
