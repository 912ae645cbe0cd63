"""The fused residual add + RMSNorm's facts for the property engine (:mod:`fuseval.properties`).

Axis space: any hidden size works (a kernel's tiles are powers of two, so the sizes mix
multiples of 16 with sizes that are not). Magnitudes: "tiny" (2^-12) puts mean(r^2) ~ 6e-8
below eps = 1e-6, so the norm is eps-dominated; "huge" (2^12) stays far inside bf16's range.

Tight bound: both outputs are bf16, so one rounding to bf16 (unit roundoff 2^-8 x 1/2 =
2^-9) bounds a correct implementation's normwise error; fp32 arithmetic before it adds
far less. Factor 2 on unit_roundoff("bfloat16") leaves room for the double rounding of a
kernel that stores the bf16 sum and normalises it.
"""
from __future__ import annotations

from ...properties.hooks import Magnitudes, PropertyHooks, TightBound

__all__ = ["HOOKS"]

HOOKS = PropertyHooks(
    axis_values={"small": {"hidden_size": (32, 48, 64, 80, 100)},
                 "medium": {"hidden_size": (32, 48, 64, 80, 100, 128, 200, 256)}},
    activation_input="hidden_states",
    eps_input="rms_norm_eps",
    magnitudes=Magnitudes(tiny=-12, huge=12, mixed=(-20, -10, 0, 6, 12)),
    tight_bound=TightBound("bfloat16", 2.0),
)
