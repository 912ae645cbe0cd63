"""A fused residual add + RMSNorm (the ``fused_add_rms_norm`` of LLM serving stacks), bf16.

Given the layer's output ``hidden_states`` and the running ``residual`` stream, it returns
the new residual stream ``residual_out = hidden_states + residual`` and its normalised
value ``output = rms_norm(residual_out) * weight``, both in bf16. Not a SOL-ExecBench
problem: fuseval's third operator, small enough to show what an operator package is.

``reference.py``: the float64 oracle with stage taps and the torch baseline a user would
write; ``properties.py``: its property hooks; ``mutants.py``: its broken variants. It has
no fast path: the gate reports that and checks the rest."""
from .. import OperatorSpec

SPEC = OperatorSpec(
    name="residual_rmsnorm",
    package=__name__,
    cost_model=".reference:cost_model",
    bench_fast=None,
    properties=".properties:HOOKS",
    mutants=".mutants:catalogue",
    diagnosis=".diagnosis:hints",
)
