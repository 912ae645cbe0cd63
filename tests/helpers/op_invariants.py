"""Metamorphic properties of the two operators' references and of their stages: test-only
(tests/properties/test_invariants.py), moved out of the library since nothing in fuseval
calls them. The invariants ``check_implementation`` runs live in the library
(fuseval.properties.invariants: the machinery and batch independence) and in the operator
packages (causality of the decoder layer, NaN poisoning of the NVFP4 projection); they are
re-exported here so the tests reach every invariant as ``op_invariants.<name>``.

Each function checks one property on given tensors and raises :class:`InvariantViolation`
(an ``AssertionError``) with a message that says what differed and by how much; it returns
a small dict of measurements otherwise. Two kinds:

* stage-level properties take a ``stages`` namespace (default: the reference stages of
  :mod:`fuseval.refimpl.stages`) or an NVFP4 ``codec``, so a broken stage function can be
  put to the same property (the mutation tests do);
* operator-level properties take an implementation ``impl`` (any callable in definition
  order; default: the float64 oracle). For the oracle they are checked to float64
  round-off; for other implementations with the tolerance given (default: the
  definition's rule between the two runs of the implementation).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import torch

from fuseval.check import compare
from fuseval.definitions import Tolerance
from fuseval.operators import load
from fuseval.operators.nvfp4_qkv_rope.properties import nan_scale_output_pattern
from fuseval.operators.qwen2vl_decoder_layer.properties import future_token_independence
from fuseval.precision import dtype_precision, unit_roundoff
from fuseval.properties.invariants import (InvariantViolation, assert_close, batch_independence, call,
                                           impl_or_oracle, named_inputs, oracle_for, ordered_inputs,
                                           same_outputs)
from fuseval.refimpl import nvfp4 as _nvfp4
from fuseval.refimpl import stages as _st

__all__ = [
    "InvariantViolation",
    # stage level
    "rms_norm_scale_invariance", "rope_preserves_pair_norms", "rope_relative_position",
    "mrope_relative_position", "attention_future_independence", "attention_convex_hull",
    "gqa_equals_mha", "dequant_linear_in_global_scale", "dequant_block_local",
    "nan_scale_poisons_its_block",
    # operator level (the first three are the library's, re-exported)
    "batch_independence", "future_token_independence", "nan_scale_output_pattern",
    "layer_gqa_equals_mha", "token_permutation_equivariance", "value_states_plain_projection",
    "norm_scale_equivariance", "layer_input_norm_scale_invariance", "layer_rope_pair_norms",
    "layer_relative_position", "angles_table", "named_inputs", "ordered_inputs",
]


def angles_table(positions: torch.Tensor, head_dim: int, theta: float = 1e6) -> torch.Tensor:
    """RoPE angles [..., D] (half-duplicated, the rotate_half layout) of integer positions."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions.to(torch.float64)[..., None] * inv_freq
    return torch.cat([angles, angles], dim=-1)


# =========================================================================== stage level
def rms_norm_scale_invariance(x: torch.Tensor, weight: torch.Tensor, eps: float, c: float,
                              stages=_st) -> dict:
    """rms_norm(c x, w, c^2 eps) = rms_norm(x, w, eps) for c > 0, and with eps = 0 the
    norm is exactly scale invariant. (A norm with eps outside the sqrt, over the wrong
    axis, with sum instead of mean... breaks the first form.)"""
    x, w = x.to(torch.float64), weight.to(torch.float64)
    ref = stages.rms_norm(x, w, eps)
    d1 = assert_close("rms_norm(c x, w, c^2 eps) vs rms_norm(x, w, eps)",
                       stages.rms_norm(c * x, w, c * c * eps), ref, rtol=1e-11, atol=1e-12)
    nonzero = x.abs().amax(dim=-1) > 0
    d0 = assert_close("rms_norm(c x, w, 0) vs rms_norm(x, w, 0) (nonzero rows)",
                       stages.rms_norm(c * x, w, 0.0)[nonzero], stages.rms_norm(x, w, 0.0)[nonzero],
                       rtol=1e-11, atol=1e-12)
    return {"max_diff_eps": d1, "max_diff_no_eps": d0}


def rope_preserves_pair_norms(t: torch.Tensor, angles: torch.Tensor, stages=_st) -> dict:
    """With cos = cos(angles), sin = sin(angles) and angles duplicated over the halves
    (cos^2 + sin^2 = 1 pairwise), RoPE rotates each pair (t_i, t_{i+D/2}) and preserves its
    Euclidean norm."""
    t = t.to(torch.float64)
    d = t.shape[-1]
    if not torch.equal(angles[..., : d // 2], angles[..., d // 2:]):
        raise ValueError("angles: expected the same angle for index i and i + D/2 (rotate_half layout)")
    out = stages.rope(t, torch.cos(angles), torch.sin(angles))
    pair = lambda u: (u[..., : d // 2] ** 2 + u[..., d // 2:] ** 2).sqrt()
    return {"max_diff": assert_close("RoPE pair norms", pair(out), pair(t), rtol=1e-12, atol=1e-12)}


def rope_relative_position(q: torch.Tensor, k: torch.Tensor, pos_q: torch.Tensor,
                           pos_k: torch.Tensor, shift: int, theta: float = 1e6, stages=_st) -> dict:
    """q.k after RoPE depends only on the position difference: the Gram matrix
    rope(q, p_q) . rope(k, p_k)^T is unchanged when every position is shifted by ``shift``.
    q: [Sq, D], k: [Sk, D], positions integer [Sq], [Sk]."""
    d = q.shape[-1]
    q, k = q.to(torch.float64), k.to(torch.float64)

    def gram(pq, pk):
        aq, ak = angles_table(pq, d, theta), angles_table(pk, d, theta)
        rq = stages.rope(q, torch.cos(aq), torch.sin(aq))
        rk = stages.rope(k, torch.cos(ak), torch.sin(ak))
        return rq @ rk.t()
    g0, g1 = gram(pos_q, pos_k), gram(pos_q + shift, pos_k + shift)
    scale = float(q.abs().sum() * k.abs().sum()) + 1.0
    return {"max_diff": assert_close(f"RoPE q.k Gram matrix under a position shift of {shift}",
                                      g1, g0, rtol=0, atol=1e-9 * scale)}


def mrope_relative_position(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                            shifts: Sequence[int], theta: float = 1e6, stages=_st,
                            layout: str = "hf") -> dict:
    """Multimodal RoPE: q.k depends only on the differences of the (t, h, w) positions, so
    shifting each of the three position axes by its own constant leaves every q.k
    unchanged. q, k: [S, D]; positions: integer [3, S].

    This holds for HF's layout only (``layout="hf"``), where head-dim indices d and d + D/2
    (a rotate_half pair) read the same position axis. The benchmark's contiguous chunks
    (32, 48, 48) pair d in [0, 32) (axis t) with d + 64 (axes h and w): each pair is turned
    by two different angles, so q.k is not a function of position differences there."""
    d = q.shape[-1]
    q, k = q.to(torch.float64), k.to(torch.float64)

    def gram(pos):
        ang = angles_table(pos[:, None, :], d, theta)                   # [3, 1, S, D]
        cos = stages.mrope_select(torch.cos(ang), None, layout)[0]
        sin = stages.mrope_select(torch.sin(ang), None, layout)[0]
        return stages.rope(q, cos, sin) @ stages.rope(k, cos, sin).t()
    shift = torch.tensor(list(shifts), dtype=positions.dtype)[:, None]
    g0, g1 = gram(positions), gram(positions + shift)
    scale = float(q.abs().sum() * k.abs().sum()) + 1.0
    return {"max_diff": assert_close(f"mRoPE q.k Gram matrix under position shifts {list(shifts)}",
                                      g1, g0, rtol=0, atol=1e-9 * scale)}


def attention_future_independence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, t: int,
                                  generator: torch.Generator | None = None, stages=_st) -> dict:
    """Causal attention: replacing q, k, v at tokens >= t leaves outputs at tokens < t
    unchanged. q: [B, Hq, S, D]; k, v: [B, Hkv, S, D]."""
    out = stages.causal_gqa_attention(q, k, v)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    for u in (q2, k2, v2):
        u[:, :, t:] = torch.randn(u[:, :, t:].shape, generator=generator, dtype=u.dtype) * 3
    out2 = stages.causal_gqa_attention(q2, k2, v2)
    return {"max_diff": assert_close(f"attention outputs before token {t} after changing tokens >= {t}",
                                      out2[:, :, :t], out[:, :, :t])}


def attention_convex_hull(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, stages=_st) -> dict:
    """Each attention output is a convex combination of the values it may see: coordinate
    by coordinate, out[s] lies in [min_{j<=s} v_j, max_{j<=s} v_j] of its kv head."""
    out = stages.causal_gqa_attention(q, k, v)
    group = q.shape[1] // k.shape[1]
    vv = v.repeat_interleave(group, dim=1).to(torch.float64)        # [B, Hq, S, D]
    lo = torch.cummin(vv, dim=2).values
    hi = torch.cummax(vv, dim=2).values
    slack = 1e-12 * (1 + vv.abs().amax(dim=2, keepdim=True))
    below = float((lo - slack - out).clamp(min=0).max())
    above = float((out - hi - slack).clamp(min=0).max())
    if below > 0 or above > 0:
        bad = ((out < lo - slack) | (out > hi + slack)).nonzero()[0].tolist()
        raise InvariantViolation(f"attention output leaves the convex hull of the visible values "
                                 f"by {max(below, above):.3g} (first at [b, head, s, d] = {bad})")
    return {"max_outside": max(below, above)}


def gqa_equals_mha(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, stages=_st) -> dict:
    """Grouped-query attention equals multi-head attention with each kv head repeated
    group = Hq / Hkv times (query head i reads kv head i // group)."""
    group = q.shape[1] // k.shape[1]
    gqa = stages.causal_gqa_attention(q, k, v)
    mha = stages.causal_gqa_attention(q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1))
    return {"max_diff": assert_close("GQA vs MHA with repeated kv heads", gqa, mha)}


def dequant_linear_in_global_scale(packed: torch.Tensor, scales: torch.Tensor, g: float, c: float,
                                   codec=_nvfp4) -> dict:
    """dequantize(codes, scales, c g) = c dequantize(codes, scales, g): exact for c a power
    of two, within float64 round-off otherwise."""
    a = codec.dequantize_nvfp4(packed, scales, c * g)
    b = c * codec.dequantize_nvfp4(packed, scales, g)
    exact = c != 0 and math.frexp(abs(c))[0] == 0.5
    return {"max_diff": assert_close(f"dequant with global scale {c}*g vs {c}*dequant",
                                      a, b, rtol=0 if exact else 4e-16, atol=0)}


def dequant_block_local(packed: torch.Tensor, scales: torch.Tensor, g: float, row: int, block: int,
                        new_code: int, codec=_nvfp4) -> dict:
    """Changing the scale of block (row, block) changes at most W[row, 16 block : 16 block + 16],
    and those columns by exactly the ratio of the new to the old scale."""
    bits = scales.view(torch.uint8) if scales.dtype == torch.float8_e4m3fn else scales
    w0 = codec.dequantize_nvfp4(packed, bits, g)
    changed = bits.clone()
    changed[row, block] = new_code
    w1 = codec.dequantize_nvfp4(packed, changed, g)
    cols = slice(16 * block, 16 * block + 16)
    outside = torch.ones_like(w0, dtype=torch.bool)
    outside[row, cols] = False
    diff_out = (w1 - w0)[outside]
    if diff_out.numel() and bool((diff_out != 0).any()):
        where = ((w1 != w0) & outside).nonzero()[0].tolist()
        raise InvariantViolation(f"changing scale [{row}, {block}] changed W outside its 16 columns "
                                 f"(first at {where})")
    old = float(_nvfp4.decode_e4m3fn(bits[row, block]))
    new = float(_nvfp4.decode_e4m3fn(torch.tensor(new_code, dtype=torch.uint8)))
    if math.isfinite(old) and math.isfinite(new):
        # w1 * old == w0 * new exactly: both sides are e2m1 x e4m3 x e4m3 x fp32 products
        # (at most 2 + 4 + 4 + 24 significant bits), exact in float64
        assert_close(f"W[{row}, block {block}] after the scale changed {old} -> {new}",
                      w1[row, cols] * old, w0[row, cols] * new, rtol=0, atol=0)
    return {"old_scale": old, "new_scale": new}


def nan_scale_poisons_its_block(packed: torch.Tensor, scales: torch.Tensor, g: float, row: int,
                                block: int, nan_code: int = 0x7F, codec=_nvfp4) -> dict:
    """A NaN scale code makes exactly W[row, 16 block : 16 block + 16] NaN, nothing else."""
    bits = (scales.view(torch.uint8) if scales.dtype == torch.float8_e4m3fn else scales).clone()
    bits[row, block] = nan_code
    w = codec.dequantize_nvfp4(packed, bits, g)
    want = torch.zeros_like(w, dtype=torch.bool)
    want[row, 16 * block: 16 * block + 16] = True
    got = torch.isnan(w)
    if not torch.equal(got, want):
        raise InvariantViolation(f"NaN scale code at [{row}, {block}]: {int(got.sum())} NaN weights, "
                                 f"expected exactly its 16 columns ({int((got & want).sum())} of them NaN)")
    return {"nan": int(got.sum())}



# =========================================================================== operator level
def layer_gqa_equals_mha(inputs: Sequence[Any], impl: Callable | None = None,
                         tolerance: Tolerance | None = None) -> dict:
    """Op A with GQA equals op A with num_kv_heads = num_heads and every kv head's
    k/v projection rows (and biases) repeated group times (multi-head attention)."""
    op = "qwen2vl_decoder_layer"
    defn = load(op)
    impl, oracle = impl_or_oracle(op, impl)
    values = dict(named_inputs(defn, inputs))
    d = values["rope_cos"].shape[-1]
    hq, hkv = values["q_proj_weight"].shape[0] // d, values["k_proj_weight"].shape[0] // d
    group = hq // hkv
    for name in ("k_proj_weight", "v_proj_weight", "k_proj_bias", "v_proj_bias"):
        t = values[name]
        values[name] = t.reshape(hkv, d, *t.shape[1:]).repeat_interleave(group, dim=0) \
            .reshape(hq * d, *t.shape[1:]).contiguous()
    gqa, mha = call(impl, inputs), call(impl, ordered_inputs(defn, values))
    same_outputs(f"GQA (group {group}) vs MHA with repeated kv heads", defn, gqa, mha, oracle, tolerance)
    return {"group": group}


def token_permutation_equivariance(inputs: Sequence[Any], perm: torch.Tensor, impl: Callable | None = None,
                                   tolerance: Tolerance | None = None) -> dict:
    """Op B treats tokens independently: permuting the tokens (hidden_states, cos, sin)
    permutes the outputs along seq_len the same way."""
    op = "nvfp4_qkv_rope"
    defn = load(op)
    impl, oracle = impl_or_oracle(op, impl)
    values = dict(named_inputs(defn, inputs))
    p = perm.to(values["hidden_states"].device)
    for name in ("hidden_states", "cos", "sin"):
        values[name] = values[name][:, p].contiguous()
    base = call(impl, inputs)
    permuted = call(impl, ordered_inputs(defn, values))
    same_outputs("outputs of permuted tokens vs permuted outputs", defn, permuted,
                  [o[:, :, p] for o in base], oracle, tolerance)
    return {"perm": perm.tolist()}


def _decode_independent(packed: torch.Tensor, scales: torch.Tensor, g: float) -> torch.Tensor:
    """NVFP4 weights decoded without the bit-level codec: an e2m1 value table and torch's
    own float8 -> float64 conversion (a second, independent route to the same numbers)."""
    table = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                          -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.float64,
                         device=packed.device)
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2).long()
    s = scales.view(torch.float8_e4m3fn).to(torch.float64).repeat_interleave(16, dim=-1)
    return table[codes] * s * float(g)


def value_states_plain_projection(inputs: Sequence[Any], impl: Callable | None = None,
                                  tolerance: Tolerance | None = None) -> dict:
    """Op B: value_states = x_hat W_v^T split into heads, with no norm and no RoPE (the
    weights decoded here independently of the reference's stages and codec; x_hat the
    activations through the benchmark's quantizer, or x itself where the variant has no
    ``act_quant`` stage)."""
    op = "nvfp4_qkv_rope"
    defn = load(op)
    impl, oracle = impl_or_oracle(op, impl)
    v = named_inputs(defn, inputs)
    d = v["cos"].shape[-1]
    w = _decode_independent(v["v_proj_weight_fp4"], v["v_proj_scale"], v["v_proj_global_decode_scale"])
    x = v["hidden_states"].to(torch.float64)
    if "act_quant" in defn.stage_names:
        x = _nvfp4.quantize_activations(v["hidden_states"]).dequantize().to(x.device)
    b, s, _ = x.shape
    want = (x @ w.t()).reshape(b, s, -1, d).transpose(1, 2)
    got = call(impl, inputs)[2]
    if oracle:
        # summation order differs from the oracle's: allow 1e-12 of the sum of |terms|
        scale = float((x.abs() @ w.abs().t()).max()) if x.numel() and w.numel() else 0.0
        assert_close("value_states vs x_hat W_v^T", got, want, rtol=1e-12, atol=1e-12 * scale + 1e-300)
    else:
        m = compare(got, want, tolerance or defn.tolerance, "value_states")
        if not m.passed:
            raise InvariantViolation(f"value_states vs x_hat W_v^T: {', '.join(m.reasons)} "
                                     f"(max |difference| {m.max_abs:.3g})")
    return {}


def norm_scale_equivariance(inputs: Sequence[Any], k: int, impl: Callable | None = None,
                            tolerance: Tolerance | None = None) -> dict:
    """Op B: scaling hidden_states by 2^k and rms_norm_eps by 4^k leaves query_states and
    key_states unchanged (the per-head norm divides the scale out) and scales
    value_states by 2^k. Powers of two keep every rounding identical."""
    op = "nvfp4_qkv_rope"
    defn = load(op)
    impl, oracle = impl_or_oracle(op, impl)
    values = dict(named_inputs(defn, inputs))
    c = 2.0 ** k
    values["hidden_states"] = (values["hidden_states"] * c).to(values["hidden_states"].dtype)
    values["rms_norm_eps"] = float(values["rms_norm_eps"]) * c * c
    base = call(impl, inputs)
    scaled = call(impl, ordered_inputs(defn, values))
    want = [base[0], base[1], (base[2].to(torch.float64) * c)]
    same_outputs(f"outputs with x*2^{k}, eps*4^{k} vs (q, k, 2^{k} v)", defn,
                  scaled, want, oracle, tolerance)
    return {"k": k}


def layer_input_norm_scale_invariance(inputs: Sequence[Any], c: float, staged: Callable | None = None,
                                      rtol: float = 1e-11) -> dict:
    """Op A: the input_norm stage output is unchanged by x -> c x together with
    eps -> c^2 eps (read through the stage taps of ``staged``, default the oracle). c must
    be a power of two (hidden_states is float32: c x must stay exact); use ``rtol`` ~ 1e-5
    for a float32 implementation."""
    if c <= 0 or math.frexp(c)[0] != 0.5:
        raise ValueError(f"c: expected a power of two (c * hidden_states must be exact), got {c}")
    defn = load("qwen2vl_decoder_layer")
    reference = staged or oracle_for(defn.name)
    values = dict(named_inputs(defn, inputs))
    t0: dict = {}
    reference(*inputs, taps=t0)
    values["hidden_states"] = values["hidden_states"] * c
    values["rms_norm_eps"] = float(values["rms_norm_eps"]) * c * c
    t1: dict = {}
    reference(*ordered_inputs(defn, values), taps=t1)
    return {"max_diff": assert_close("input_norm(c x, c^2 eps) vs input_norm(x, eps)",
                                      t1["input_norm"], t0["input_norm"], rtol=rtol, atol=rtol * 0.1)}


def _unit_roundoff(dtype: torch.dtype) -> float:
    return unit_roundoff(dtype_precision(dtype))


def _position_tables(op: str, values: Mapping[str, Any], theta: float = 1e6) -> None:
    """Replace the cos/sin inputs by RoPE tables of positions 0..S-1 (all three mRoPE axes
    equal, as for text tokens), rounded to the inputs' dtype."""
    names = ("rope_cos", "rope_sin") if op == "qwen2vl_decoder_layer" else ("cos", "sin")
    table = values[names[0]]
    d, s = table.shape[-1], table.shape[-2]
    ang = angles_table(torch.arange(s), d, theta).expand(*table.shape)
    values[names[0]] = torch.cos(ang).to(table.device, table.dtype).contiguous()
    values[names[1]] = torch.sin(ang).to(table.device, table.dtype).contiguous()


def layer_rope_pair_norms(op: str, inputs: Sequence[Any], staged: Callable | None = None) -> dict:
    """Through the reference's stage taps, with cos/sin tables of real positions
    (cos^2 + sin^2 = 1 up to the tables' rounding): the RoPE stage scales the norm of every
    (i, i + D/2) pair of every q and k head by sqrt(cos^2 + sin^2), i.e. preserves it up to
    the measured deviation of the rounded tables from the unit circle."""
    defn = load(op)
    values = dict(named_inputs(defn, inputs))
    _position_tables(op, values)
    taps: dict = {}
    (staged or oracle_for(op))(*ordered_inputs(defn, values), taps=taps)
    names = ("rope_cos", "rope_sin") if op == "qwen2vl_decoder_layer" else ("cos", "sin")
    c, sn = (values[n].to(torch.float64) for n in names)
    deviation = float(((c * c + sn * sn).sqrt() - 1).abs().max())
    d = c.shape[-1]
    if op == "qwen2vl_decoder_layer":
        before = taps["qkv_proj"][..., : taps["mrope"].shape[-1]]
        after = taps["mrope"]
    else:
        before, after = taps["qk_norm"], taps["rope"]
    b, s, n = after.shape
    pair = lambda u: (u.reshape(b, s, n // d, d)[..., : d // 2] ** 2
                      + u.reshape(b, s, n // d, d)[..., d // 2:] ** 2).sqrt()
    precision = 1e-12 if after.dtype == torch.float64 else 16 * _unit_roundoff(after.dtype)
    return {"max_diff": assert_close(f"{op}: RoPE pair norms (stage taps)", pair(after), pair(before),
                                      rtol=deviation + precision, atol=precision),
            "table_deviation": deviation}


def layer_relative_position(op: str, inputs: Sequence[Any], staged: Callable | None = None) -> dict:
    """Through the reference's stage taps, with every token of a batch item identical and
    cos/sin of positions 0..S-1: q_i . k_j depends only on i - j (the Gram matrix of each
    (q head, kv head) pair is Toeplitz), up to the rounding of the cos/sin tables
    (bf16 for op B): each entry is within 8 u_table |q| |k| of its exact value, so
    |G[i,j] - G[i+1,j+1]| <= 16 u_table |q| |k|."""
    defn = load(op)
    values = dict(named_inputs(defn, inputs))
    x = values["hidden_states"]
    values["hidden_states"] = x[:, :1].expand_as(x).contiguous()
    _position_tables(op, values)
    taps: dict = {}
    (staged or oracle_for(op))(*ordered_inputs(defn, values), taps=taps)
    table = values["rope_cos" if op == "qwen2vl_decoder_layer" else "cos"]
    d = table.shape[-1]
    if op == "qwen2vl_decoder_layer":
        hq = values["q_proj_weight"].shape[0] // d
        rot = taps["mrope"]
    else:
        hq = values["q_proj_weight_fp4"].shape[0] // d
        rot = taps["rope"]
    b, s, n = rot.shape
    heads = rot.reshape(b, s, n // d, d).transpose(1, 2)            # [B, Hq+Hkv, S, D]
    q, k = heads[:, :hq], heads[:, hq:]
    q, k = q.to(torch.float64), k.to(torch.float64)
    gram = q[:, :, None] @ k[:, None].transpose(-1, -2)             # [B, Hq, Hkv, S, S]
    scale = float(q.norm(dim=-1).amax() * k.norm(dim=-1).amax())
    u = _unit_roundoff(table.dtype) + (0.0 if rot.dtype == torch.float64 else 4 * _unit_roundoff(rot.dtype))
    atol = 16 * u * scale + 1e-12 * (1 + scale)
    return {"max_diff": assert_close(f"{op}: q_i.k_j along diagonals (Toeplitz)",
                                      gram[..., 1:, 1:], gram[..., :-1, :-1], rtol=0, atol=atol)}
