"""``residual_rmsnorm``: the float64 oracle, its float32 twin and the torch baseline.

Stages: ``residual_add`` (r = x + residual) and ``rms_norm`` (y = r rsqrt(mean r^2 + eps) w).
The oracle normalises the exact sum; a kernel that rounds r to bf16 before normalising
pays one more bf16 rounding, which the tolerance (1%) covers."""
from __future__ import annotations

import functools
from typing import Mapping, MutableMapping

import torch

from .. import load
from ...refimpl import stages as st
from ...validate import bind_axes

NAME = "residual_rmsnorm"

__all__ = ["reference", "reference_fp32", "torch_eager", "cost_model"]


def reference(hidden_states, residual, rms_norm_weight, rms_norm_eps, *,
              taps: MutableMapping[str, torch.Tensor] | None = None,
              override: Mapping[str, torch.Tensor] | None = None,
              dtype: torch.dtype = torch.float64, validate: bool = True, stages=st):
    """The oracle in ``dtype`` (float64 by default), unrounded outputs (output, residual_out).

    ``taps`` receives each stage's output under its stage name; ``override`` replaces a
    stage's output and the pipeline continues from it; ``stages`` is the namespace of
    stage functions (the budget's naive and the mutants swap one out)."""
    if validate:
        bind_axes(load(NAME), (hidden_states, residual, rms_norm_weight, rms_norm_eps))
    override = override or {}

    def stage(name, compute):
        value = override[name].to(dtype) if name in override else compute()
        if taps is not None:
            taps[name] = value
        return value

    r = stage("residual_add", lambda: hidden_states.to(dtype) + residual.to(dtype))
    y = stage("rms_norm", lambda: stages.rms_norm(r, rms_norm_weight.to(dtype), float(rms_norm_eps)))
    return y, r


reference_fp32 = functools.partial(reference, dtype=torch.float32)
reference_fp32.__doc__ = "The reference computed in float32 (same formulas)."


def torch_eager(hidden_states, residual, rms_norm_weight, rms_norm_eps):
    """What a user would write: the bf16 sum kept as the new residual, the norm in float32."""
    r = hidden_states + residual
    x = r.float()
    y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + float(rms_norm_eps))
    return (y * rms_norm_weight.float()).to(torch.bfloat16), r


def cost_model(axes: Mapping[str, int]) -> dict:
    """The least work of one call: three bf16 tensors read or written per token row twice
    over (x, residual in; output, residual_out out; the weight once), about 6 FLOPs an
    element; memory bound by far."""
    elements = axes["batch_size"] * axes["seq_len"] * axes["hidden_size"]
    return {"flops": 6 * elements, "bytes": 2 * (4 * elements + axes["hidden_size"]),
            "matmul_dtype": "fp32"}
