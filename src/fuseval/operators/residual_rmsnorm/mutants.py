"""The fused residual add + RMSNorm's mutant catalogue: the reference with one real bug each
(see :mod:`fuseval.operators.mutants`). The property suite must reject every one."""
from __future__ import annotations

import torch

from ..mutants import Mutant, make, namespace
from ...refimpl import stages as st

__all__ = ["catalogue"]

NAME = "residual_rmsnorm"


def _rms_norm_eps_outside(x, weight, eps):
    """x / (sqrt(mean(x^2)) + eps) * weight: eps outside the square root."""
    return x / (x.pow(2).mean(dim=-1, keepdim=True).sqrt() + eps) * weight


def _rms_norm_mean_abs(x, weight, eps):
    """Normalised by mean |x| instead of the root mean square."""
    return x / (x.abs().mean(dim=-1, keepdim=True) + eps) * weight


def _norm_of_input_only(taps, values):
    """The norm taken of hidden_states instead of the sum (the residual add skipped for the norm)."""
    x = values["hidden_states"].to(taps["residual_add"].dtype)
    return st.rms_norm(x, values["rms_norm_weight"].to(x.dtype), float(values["rms_norm_eps"]))


def _residual_doubled(taps, values):
    """The residual stream added twice."""
    return taps["residual_add"] + values["residual"].to(taps["residual_add"].dtype)


def _weight_ignored(taps, values):
    """The norm weight never applied."""
    r = taps["residual_add"]
    return st.rms_norm(r, torch.ones_like(r[0, 0]), float(values["rms_norm_eps"]))


def catalogue() -> list[Mutant]:
    return [
        make(NAME, "eps_outside_sqrt", "rms_norm", "x / (sqrt(mean x^2) + eps) * w",
             reference_kwargs={"stages": namespace(st, rms_norm=_rms_norm_eps_outside)}),
        make(NAME, "mean_abs_norm", "rms_norm", "normalised by mean |x| instead of the RMS",
             reference_kwargs={"stages": namespace(st, rms_norm=_rms_norm_mean_abs)}),
        make(NAME, "norm_of_input_only", "rms_norm", "the norm of hidden_states, not of the sum",
             rewrite=_norm_of_input_only),
        make(NAME, "residual_added_twice", "residual_add", "r = x + 2 * residual", rewrite=_residual_doubled),
        make(NAME, "norm_weight_ignored", "rms_norm", "the norm weight never applied", rewrite=_weight_ignored),
    ]
