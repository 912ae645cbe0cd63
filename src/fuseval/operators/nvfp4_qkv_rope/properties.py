"""The NVFP4 QKV projection's facts for the property engine (:mod:`fuseval.properties`):
its axis space, its special inputs, its NVFP4 adversarial features, its tight bound and its
NaN-poisoning invariant.

Axis space. hidden_size must be a multiple of the NVFP4 block (16); 48, 80, 112 are not
multiples of 32 or 64. head_dim must be even; the drawn values are powers of two.

Magnitudes are relative to what the benchmark's NVFP4 weights (randn * 0.02) make of x:
"tiny" (2^-10) gives q ~ 1e-4 at the small configs, so mean(q^2) << eps and v sits far
under atol; "huge" (2^8) is what bf16 v outputs can carry once the v global scale is
adapted (below).

Adversarial features of its own: every e2m1 code (including -0), e4m3 block scales that
are subnormal, negative, zero, +-448 or NaN (mixed, or every block subnormal so that their
decoding is what decides the result). Adversarial draws stay inside the range where the
tolerance rule is meaningful for a correct implementation in the output precision:
value_states pass the input magnitude through x W^T, and a bf16 output of magnitude ~100
carries rounding errors beyond the rule's absolute 5e-3, so the global decode scale of the
v weights is lowered by a power of two until the typical |v| is at most 1 (q and k are
normalised and need no such care).

Tight bound: bf16 outputs, working precision bf16 (u = 2^-8), factor 4 -> 0.0156: a bf16
output carries at least its own rounding (normwise <= u), and a bf16 path also rounds the
dequantized weights and the pre-norm projection (each <= u normwise; the norm and an
orthogonal RoPE do not amplify), so any correct bf16 implementation is below 3u.
The errors the implementations reach under it: docs/properties.md.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch
from hypothesis import strategies as st

from ...definitions import Definition, Tolerance
from .. import load
from ...properties import invariants as inv
from ...properties.hooks import ExtraExample, Magnitudes, PropertyHooks, RecipeFeature, TightBound
from ...properties.strategies import Recipe, feature_generator
from ...refimpl import nvfp4

__all__ = ["HOOKS", "nan_scale_output_pattern", "adversarial_nvfp4"]

NAME = "nvfp4_qkv_rope"
PROJECTIONS = ("q", "k", "v")


def nan_scale_output_pattern(inputs: Sequence[Any], proj: str, row: int, block: int,
                             impl: Callable | None = None, nan_code: int = 0x7F,
                             tolerance: Tolerance | None = None) -> dict:
    """One NaN scale code in ``proj``'s weight at [row, block]: the NaN reaches exactly the
    outputs that use that weight row. For v: value_states[:, row // D, :, row % D] (every
    token); for q or k: the whole head row // D (the per-head norm mixes the row into every
    element of its head). Everything else equals the run without the NaN."""
    defn = load(NAME)
    impl, oracle = inv.impl_or_oracle(NAME, impl)
    values = dict(inv.named_inputs(defn, inputs))
    d = values["cos"].shape[-1]
    bits = values[f"{proj}_proj_scale"].view(torch.uint8).clone()
    bits[row, block] = nan_code
    values[f"{proj}_proj_scale"] = bits.view(torch.float8_e4m3fn)
    base = inv.call(impl, inputs)
    poisoned = inv.call(impl, inv.ordered_inputs(defn, values))
    index = PROJECTIONS.index(proj)
    for i, (spec, p, o) in enumerate(zip(defn.outputs, poisoned, base)):
        want = torch.isnan(o)
        if i == index:
            if proj == "v":
                want[:, row // d, :, row % d] = True
            else:
                want[:, row // d] = True
        got = torch.isnan(p)
        if not torch.equal(got, want):
            raise inv.InvariantViolation(
                f"NaN scale code in {proj}_proj_scale[{row}, {block}]: {spec.name} has "
                f"{int(got.sum())} NaN elements, expected {int(want.sum())} "
                f"({int((got & ~want).sum())} unexpected, {int((want & ~got).sum())} missing)")
        keep = ~want
        inv.same_outputs(f"{spec.name} outside the poisoned elements", defn,
                         [torch.where(keep, p, torch.zeros_like(p))],
                         [torch.where(keep, o, torch.zeros_like(o))], oracle, tolerance)
    return {}


def _nan_poisoning(example, inputs: Sequence[Any], impl: Callable, defn: Definition):
    """The metamorphic check: a NaN scale code at a seed-chosen block of q, k or v."""
    proj = PROJECTIONS[example.seed % 3]
    rows = inputs[defn.input_index(f"{proj}_proj_scale")].shape
    row, block = example.seed % rows[0], (example.seed // 3) % rows[1]
    return (f"NaN scale code in {proj}_proj_scale[{row}, {block}]",
            lambda: nan_scale_output_pattern(inputs, proj, row, block, impl=impl, tolerance=defn.tolerance))


# e4m3fn codes of the special block scales: +-subnormal (2^-9 .. 7 * 2^-9), +-0, +-448,
# negative normals; 0x7F / 0xFF are the NaN codes
_SPECIAL_SCALE_CODES = (0x01, 0x03, 0x07, 0x81, 0x85, 0x00, 0x80, 0x7E, 0xFE, 0xB8, 0xC4)
_NAN_CODES = (0x7F, 0xFF)


def _special_scales(scale: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Every special code at least once (when there is room), then half the other blocks."""
    flat = scale.view(-1)
    specials = torch.tensor(_SPECIAL_SCALE_CODES, dtype=torch.uint8)
    order = torch.randperm(flat.numel(), generator=g)
    n_each = min(len(specials), flat.numel())
    flat[order[:n_each]] = specials[:n_each]
    rest = order[n_each:]
    pick = rest[torch.rand(rest.numel(), generator=g) < 0.5]
    flat[pick] = specials[torch.randint(0, len(specials), (pick.numel(),), generator=g)]
    return scale


def adversarial_nvfp4(values: dict[str, Any], recipe: Recipe, seed: int, defn: Definition) -> None:
    """The recipe's NVFP4 features: weights of every e2m1 code, special, subnormal and NaN
    block scales; then v's global scale lowered (by powers of two) until typical |v| <= 1."""
    codes, scales = recipe.get("codes", "benchmark"), recipe.get("scales", "benchmark")
    for p in PROJECTIONS:
        packed = values[f"{p}_proj_weight_fp4"]
        g = feature_generator(seed, f"codes/{p}")
        if codes == "every":
            values[f"{p}_proj_weight_fp4"] = torch.randint(0, 256, packed.shape, generator=g,
                                                           dtype=torch.int64).to(torch.uint8)
        elif codes != "benchmark":
            raise ValueError(f"recipe codes must be benchmark or every, got {codes!r}")
        scale = values[f"{p}_proj_scale"].view(torch.uint8).clone()
        g = feature_generator(seed, f"scales/{p}")
        if scales == "special":
            scale = _special_scales(scale, g)
        elif scales == "subnormal":
            # mantissa 1..7 with exponent field 0, random sign: m/8 * 2^-6
            mant = torch.randint(1, 8, scale.shape, generator=g, dtype=torch.int64)
            sign = torch.randint(0, 2, scale.shape, generator=g, dtype=torch.int64) << 7
            scale = (mant | sign).to(torch.uint8)
        elif scales != "benchmark":
            raise ValueError(f"recipe scales must be benchmark, special or subnormal, got {scales!r}")
        values[f"{p}_proj_scale"] = scale
    g = feature_generator(seed, "nan_scales")
    for _ in range(recipe.get("nan_scales", 0)):
        p = PROJECTIONS[int(torch.randint(0, 3, (), generator=g))]
        scale = values[f"{p}_proj_scale"]
        r = int(torch.randint(0, scale.shape[0], (), generator=g))
        c = int(torch.randint(0, scale.shape[1], (), generator=g))
        scale[r, c] = _NAN_CODES[int(torch.randint(0, 2, (), generator=g))]
    for p in PROJECTIONS:
        values[f"{p}_proj_scale"] = values[f"{p}_proj_scale"].view(torch.float8_e4m3fn)

    # typical |v[n]| ~ sqrt(sum_k x_k^2 W_nk^2) (random signs); keep its max <= 1
    x = values["hidden_states"].to(torch.float64).reshape(-1, values["hidden_states"].shape[-1])
    w = nvfp4.dequantize_nvfp4(values["v_proj_weight_fp4"], values["v_proj_scale"],
                               float(values["v_proj_global_decode_scale"])).nan_to_num(0.0)
    typical = float(((x * x) @ (w * w).t()).max().sqrt()) if x.numel() else 0.0
    if typical > 1.0:
        shift = math.ceil(math.log2(typical))
        values["v_proj_global_decode_scale"] = float(
            torch.tensor(float(values["v_proj_global_decode_scale"]) * 2.0 ** -shift, dtype=torch.float32))


_C1 = dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
_C2 = dict(hidden_size=80, num_attention_heads=14, num_key_value_heads=2, head_dim=8)

HOOKS = PropertyHooks(
    gqa_axes=("num_attention_heads", "num_key_value_heads"),
    axis_values={
        "small": {"head_dim": (16, 8, 32, 64), "hidden_size": (32, 48, 64, 80, 112)},
        "medium": {"head_dim": (16, 8, 32, 64, 128), "hidden_size": (32, 48, 64, 80, 112, 128, 208, 256)},
    },
    # GQA 2 over 2 kv heads and a hidden size off the 32/64 tiles; GQA 7 with head_dim 8
    explicit_bindings=((_C1, {"batch_size": 2, "seq_len": 5}), (_C2, {"batch_size": 1, "seq_len": 3})),
    extra_examples=(
        ExtraExample(1, "adversarial", 6, {"codes": "every", "scales": "special", "nan_scales": 1, "zero_rows": 1}),
        ExtraExample(0, "adversarial", 7, {"scales": "subnormal", "magnitude": "huge"}),
    ),
    activation_input="hidden_states",
    eps_input="rms_norm_eps",
    rotary_inputs=("cos", "sin"),
    magnitudes=Magnitudes(tiny=-10, huge=8, mixed=(-12, -6, 0, 4, 8)),
    recipe_features={
        "codes": RecipeFeature("benchmark", st.sampled_from(["benchmark", "every"]),
                               "every: the packed weights uniform over all 16 e2m1 codes"),
        "scales": RecipeFeature("benchmark", st.sampled_from(["benchmark", "special", "subnormal"]),
                                "special: subnormal, zero, -0, +-448, negative block scales; "
                                "subnormal: every block scale subnormal, either sign"),
        "nan_scales": RecipeFeature(0, st.integers(0, 2), "number of NaN e4m3 block-scale codes"),
    },
    adversarial=adversarial_nvfp4,
    tight_bound=TightBound("bfloat16", 4.0),
    invariants=(_nan_poisoning,),
)
