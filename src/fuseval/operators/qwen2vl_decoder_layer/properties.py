"""The decoder layer's facts for the property engine (:mod:`fuseval.properties`): its axis
space, its special inputs, its tight bound and its causality invariant.

Axis space. The layer takes any hidden size, the tiles of a fast path are powers of two,
so the hidden sizes mix multiples of 16/32/64 with sizes that are not (40, 72, 100);
head_dim must be a multiple of 16 (the mRoPE chunks D/4, 3D/8, 3D/8) and is a power of two
(the sizes ``tl.arange`` covers). The rope tables may be longer than the tokens
(kv_seq_len = seq_len + 0, 1 or 3; the first seq_len rows are used).

Magnitudes: "tiny" (2^-12) puts mean(x^2) ~ 6e-8 well below eps = 1e-6, so the norm is
eps-dominated; "huge" (2^12) is harmless to fp32.

Tight bound: fp32 outputs against the float64 oracle, working precision TF32. Hopper
tensor cores read an fp32 operand as TF32 by dropping its 13 low mantissa bits
(chopping: relative error < 2^-10, twice the 2^-11 unit roundoff of round-to-nearest);
a TF32 path perturbs both operands of every product, and the output is dominated by the
exact residual, so normwise <= 2 x 2^-10 = 4 x unit_roundoff("tf32") = 1.95e-3. (The
factor is 4 on fuseval.precision's unit roundoff 2^-11; the bound is the same number as
the earlier "factor 2 on u = 2^-10".) The errors the implementations reach under it:
docs/properties.md.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from ...definitions import Definition, Tolerance
from .. import load
from ...properties import invariants as inv
from ...properties.hooks import Magnitudes, PropertyHooks, TightBound

__all__ = ["HOOKS", "future_token_independence"]

NAME = "qwen2vl_decoder_layer"


def future_token_independence(inputs: Sequence[Any], t: int, impl: Callable | None = None,
                              seed: int = 0, tolerance: Tolerance | None = None) -> dict:
    """The layer is causal: changing hidden_states and the RoPE tables at tokens >= t leaves
    the output at tokens < t unchanged."""
    defn = load(NAME)
    impl, oracle = inv.impl_or_oracle(NAME, impl)
    values = dict(inv.named_inputs(defn, inputs))
    g = torch.Generator().manual_seed(seed)
    x = values["hidden_states"].clone()
    x[:, t:] = (torch.randn(x[:, t:].shape, generator=g) * 2).to(x.device, x.dtype)
    values["hidden_states"] = x
    for name in ("rope_cos", "rope_sin"):
        table = values[name].clone()
        table[:, :, t:] = (torch.rand(table[:, :, t:].shape, generator=g) * 2 - 1).to(table.device, table.dtype)
        values[name] = table
    before, after = inv.call(impl, inputs)[0], inv.call(impl, inv.ordered_inputs(defn, values))[0]
    tol = tolerance or Tolerance(atol=defn.tolerance.atol * 1e-3, rtol=1e-6, min_matched_ratio=1.0)
    inv.same_outputs(f"outputs at tokens < {t} after changing tokens >= {t}", defn,
                     [after[:, :t]], [before[:, :t]], oracle, tol)
    return {"t": t}


def _causality(example, inputs: Sequence[Any], impl: Callable, defn: Definition):
    """The metamorphic check: tokens before a seed-chosen t are independent of the later ones."""
    s = example.binding.axes["seq_len"]
    if s <= 1:
        return None
    t = 1 + example.seed % (s - 1)
    return (f"tokens < {t} independent of tokens >= {t}",
            lambda: future_token_independence(inputs, t, impl=impl, seed=example.seed))


_C1 = dict(hidden_size=40, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=48, num_rope_dims=3)
_C2 = dict(hidden_size=72, num_heads=7, num_kv_heads=1, head_dim=32, intermediate_size=80, num_rope_dims=3)

HOOKS = PropertyHooks(
    gqa_axes=("num_heads", "num_kv_heads"),
    axis_values={
        "small": {"head_dim": (16, 32, 64), "hidden_size": (32, 40, 48, 64, 72, 100),
                  "intermediate_size": (32, 48, 80, 96)},
        "medium": {"head_dim": (16, 32, 64, 128), "hidden_size": (32, 40, 48, 64, 72, 100, 128, 200, 256),
                   "intermediate_size": (32, 48, 80, 96, 200, 344)},
    },
    var_offsets={"kv_seq_len": ("seq_len", (0, 0, 1, 3))},
    # GQA 2 over 2 kv heads (i // group and i % kv_heads differ), longer rope tables, a
    # hidden size off the tiles; GQA 7 over 1
    explicit_bindings=((_C1, {"batch_size": 2, "seq_len": 6, "kv_seq_len": 9}),
                       (_C2, {"batch_size": 1, "seq_len": 9, "kv_seq_len": 9})),
    activation_input="hidden_states",
    eps_input="rms_norm_eps",
    rotary_inputs=("rope_cos", "rope_sin"),
    magnitudes=Magnitudes(tiny=-12, huge=12, mixed=(-20, -10, 0, 6, 12)),
    tight_bound=TightBound("tf32", 4.0),
    invariants=(_causality,),
)
