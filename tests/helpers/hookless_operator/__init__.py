"""A third operator for the property engine's tests: fused residual add + RMSNorm, with
no property hooks and no mutant catalogue (its spec names neither), so it gets only the
generic strategies and properties. tests/properties/test_generic.py registers ``SPEC`` for
the duration of a test."""
from __future__ import annotations

import torch

from fuseval.operators import OperatorSpec

NAME = "hookless_residual_rms_norm"

SPEC = OperatorSpec(name=NAME, package=__name__, budget=None, bench_impls=("torch",), bench_fast=None)


def reference(x, residual, norm_weight, eps, *, taps=None, override=None, dtype=torch.float64,
              validate=True):
    """The oracle (in ``dtype``), with stage taps and overrides."""
    override = override or {}
    r = override.get("add", x.to(dtype) + residual.to(dtype))
    if taps is not None:
        taps["add"] = r
    out = override.get("norm", r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.to(dtype))
    if taps is not None:
        taps["norm"] = out
    return (out,)


def reference_fp32(x, residual, norm_weight, eps):
    return tuple(o.float() for o in reference(x, residual, norm_weight, eps, dtype=torch.float32))


def torch_impl(x, residual, norm_weight, eps):
    r = x + residual
    return (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * norm_weight,)
