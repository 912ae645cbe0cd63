"""Op B: ``nvfp4_qkv_rope`` (SOL-ExecBench Quant/028), reference and plain-torch paths.

Stages (SPEC.md):

1. ``dequant``  W[n, k] = e2m1(code[n, k]) * e4m3(scale[n, k // 16]) * global_decode_scale
2. ``proj``     q, k, v = x W^T
3. ``qk_norm``  per token and head over head_dim: t * rsqrt(mean(t^2) + eps) * norm_weight
4. ``rope``     t*cos + rotate_half(t)*sin, cos/sin [B, S, D] broadcast over heads (q, k only)
5. ``layout``   [B, S, h, D] -> [B, h, S, D] (the oracle keeps it unrounded; outputs are bf16)
"""
from __future__ import annotations

import weakref
from typing import Mapping, MutableMapping

import torch

from ..definitions import load
from . import nvfp4
from . import stages as st

NAME = "nvfp4_qkv_rope"

__all__ = ["reference", "reference_fp32", "torch_eager", "torch_cached_bf16", "dequantize_torch"]


def reference(hidden_states, cos, sin,
              q_proj_weight_fp4, q_proj_scale, q_proj_global_decode_scale,
              k_proj_weight_fp4, k_proj_scale, k_proj_global_decode_scale,
              v_proj_weight_fp4, v_proj_scale, v_proj_global_decode_scale,
              q_norm_weight, k_norm_weight, rms_norm_eps, *,
              taps: MutableMapping[str, torch.Tensor] | None = None,
              override: Mapping[str, torch.Tensor] | None = None,
              dtype: torch.dtype = torch.float64, validate: bool = True,
              stages=st, codec=nvfp4):
    """The oracle: exact dequantization (bit-level codec), every stage in ``dtype``.

    Returns (query_states, key_states, value_states) in ``dtype``, unrounded.
    ``taps`` receives each stage's output: ``dequant`` [q+2kv, H], ``proj`` [B,S,q+2kv],
    ``qk_norm`` and ``rope`` [B,S,q+kv], ``layout`` [B, Hq+2Hkv, S, D].
    ``override``: {stage: tensor} replaces that stage's output and continues from it.
    ``stages`` / ``codec``: namespaces of stage functions and of the NVFP4 codec
    (mutation tests swap one function out)."""
    args = (hidden_states, cos, sin, q_proj_weight_fp4, q_proj_scale, q_proj_global_decode_scale,
            k_proj_weight_fp4, k_proj_scale, k_proj_global_decode_scale, v_proj_weight_fp4,
            v_proj_scale, v_proj_global_decode_scale, q_norm_weight, k_norm_weight, rms_norm_eps)
    if validate:
        from ..validate import bind_axes
        bind_axes(load(NAME), args)
    override = override or {}

    def stage(name, compute):
        value = override[name].to(dtype) if name in override else compute()
        if taps is not None:
            taps[name] = value
        return value

    d = cos.shape[-1]
    eps = float(rms_norm_eps)
    rows = [q_proj_weight_fp4.shape[0], k_proj_weight_fp4.shape[0], v_proj_weight_fp4.shape[0]]

    # 1. dequant: exact in float64 (every e2m1 x e4m3 x fp32 product is representable)
    w = stage("dequant", lambda: torch.cat([
        codec.dequantize_nvfp4(q_proj_weight_fp4, q_proj_scale, float(q_proj_global_decode_scale), dtype),
        codec.dequantize_nvfp4(k_proj_weight_fp4, k_proj_scale, float(k_proj_global_decode_scale), dtype),
        codec.dequantize_nvfp4(v_proj_weight_fp4, v_proj_scale, float(v_proj_global_decode_scale), dtype)]))

    # 2. proj: one matmul against the stacked [Wq; Wk; Wv]
    x = hidden_states.to(dtype)
    b, s, _ = x.shape
    qkv = stage("proj", lambda: stages.linear(x, w))
    q, k, v = torch.split(qkv, rows, dim=-1)

    # 3. qk_norm over head_dim (the last axis of [B, S, heads, D]), per token and head
    def norm():
        qn = stages.rms_norm(q.reshape(b, s, -1, d), q_norm_weight.to(dtype), eps)
        kn = stages.rms_norm(k.reshape(b, s, -1, d), k_norm_weight.to(dtype), eps)
        return torch.cat([qn.flatten(2), kn.flatten(2)], dim=-1)
    qk = stage("qk_norm", norm)
    qn, kn = torch.split(qk, rows[:2], dim=-1)

    # 4. rope: cos/sin [B, S, D] -> [B, S, 1, D] broadcast over heads
    def rotate():
        c, sn = cos.to(dtype)[:, :, None], sin.to(dtype)[:, :, None]
        return torch.cat([stages.rope(qn.reshape(b, s, -1, d), c, sn).flatten(2),
                          stages.rope(kn.reshape(b, s, -1, d), c, sn).flatten(2)], dim=-1)
    qk = stage("rope", rotate)
    qr, kr = torch.split(qk, rows[:2], dim=-1)

    # 5. layout [B, S, h, D] -> [B, h, S, D]
    heads = [r // d for r in rows]
    out = stage("layout", lambda: torch.cat(
        [t.reshape(b, s, -1, d).transpose(1, 2) for t in (qr, kr, v)], dim=1).contiguous())
    return tuple(t.contiguous() for t in torch.split(out, heads, dim=1))


def reference_fp32(*inputs, taps=None):
    """The reference computed in float32 (exact dequantization, fp32 math), outputs
    rounded to bf16 like any implementation's: the "same formulas, naive order" baseline."""
    return tuple(t.to(torch.bfloat16) for t in reference(*inputs, taps=taps, dtype=torch.float32))


# --------------------------------------------------------------------------- plain torch
_E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def dequantize_torch(packed: torch.Tensor, scale: torch.Tensor, global_scale, dtype=torch.bfloat16):
    """Dequantize the way a user would in torch: a 16-entry lookup table for the e2m1
    codes, torch's own float8 cast for the scales, then one multiply, rounded to ``dtype``."""
    lut = torch.tensor(_E2M1_MAGNITUDES + tuple(-m for m in _E2M1_MAGNITUDES),
                       dtype=torch.float32, device=packed.device)
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2).long()
    values = lut[codes]                                              # [N, K]
    scales = scale.to(torch.float32).repeat_interleave(16, dim=-1)   # [N, K]
    return (values * scales * float(global_scale)).to(dtype)


def _project_norm_rope(x, cos, sin, wq, wk, wv, q_norm_weight, k_norm_weight, eps):
    """bf16 matmuls (fp32 accumulate), q/k norm and RoPE in fp32, bf16 outputs."""
    d = cos.shape[-1]
    b, s, _ = x.shape
    q = (x @ wq.T).view(b, s, -1, d).float()
    k = (x @ wk.T).view(b, s, -1, d).float()
    v = (x @ wv.T).view(b, s, -1, d)

    def norm(t, w):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w.float()

    c, sn = cos.float()[:, :, None], sin.float()[:, :, None]
    q = st.rope(norm(q, q_norm_weight), c, sn)
    k = st.rope(norm(k, k_norm_weight), c, sn)
    return tuple(t.to(torch.bfloat16).transpose(1, 2).contiguous() for t in (q, k, v))


def torch_eager(hidden_states, cos, sin,
                q_proj_weight_fp4, q_proj_scale, q_proj_global_decode_scale,
                k_proj_weight_fp4, k_proj_scale, k_proj_global_decode_scale,
                v_proj_weight_fp4, v_proj_scale, v_proj_global_decode_scale,
                q_norm_weight, k_norm_weight, rms_norm_eps):
    """Plain torch, dequantizing the weights to bf16 on every call."""
    wq = dequantize_torch(q_proj_weight_fp4, q_proj_scale, q_proj_global_decode_scale)
    wk = dequantize_torch(k_proj_weight_fp4, k_proj_scale, k_proj_global_decode_scale)
    wv = dequantize_torch(v_proj_weight_fp4, v_proj_scale, v_proj_global_decode_scale)
    return _project_norm_rope(hidden_states, cos, sin, wq, wk, wv, q_norm_weight, k_norm_weight,
                              float(rms_norm_eps))


# bf16 weights cached per (packed weight, scale, global scale), dropped when the weight
# tensor dies; tensor version counters detect in-place changes of either tensor
_BF16_CACHE: dict[tuple, tuple[tuple[int, int], torch.Tensor]] = {}


def _cached_weight(packed, scale, global_scale):
    key = (id(packed), id(scale), float(global_scale))
    versions = (packed._version, scale._version)
    entry = _BF16_CACHE.get(key)
    if entry is None or entry[0] != versions:
        if entry is None:
            weakref.finalize(packed, _BF16_CACHE.pop, key, None)
        entry = (versions, dequantize_torch(packed, scale, global_scale))
        _BF16_CACHE[key] = entry
    return entry[1]


def torch_cached_bf16(hidden_states, cos, sin,
                      q_proj_weight_fp4, q_proj_scale, q_proj_global_decode_scale,
                      k_proj_weight_fp4, k_proj_scale, k_proj_global_decode_scale,
                      v_proj_weight_fp4, v_proj_scale, v_proj_global_decode_scale,
                      q_norm_weight, k_norm_weight, rms_norm_eps):
    """Plain torch with the bf16 weights dequantized once per weight tensor and cached
    (the "weights already dequantized" baseline of the benchmark)."""
    wq = _cached_weight(q_proj_weight_fp4, q_proj_scale, q_proj_global_decode_scale)
    wk = _cached_weight(k_proj_weight_fp4, k_proj_scale, k_proj_global_decode_scale)
    wv = _cached_weight(v_proj_weight_fp4, v_proj_scale, v_proj_global_decode_scale)
    return _project_norm_rope(hidden_states, cos, sin, wq, wk, wv, q_norm_weight, k_norm_weight,
                              float(rms_norm_eps))


def cost_model(axes) -> dict:
    """The least work one call must do, for the benchmark floor (``fuseval.bench``).

    FLOPs: the three projections, 2 * tokens * (q + 2 kv) * hidden, at the bf16 matmul rate
    (norm and RoPE add about 10 FLOPs per q/k element, under 0.1% of that, and run on other
    units, so they are left out). Bytes: every input read once (bf16 activations and cos/sin,
    packed FP4 weights at half a byte per element, one e4m3 byte per 16 elements, the norm
    weights) and every bf16 output written once."""
    m = axes["batch_size"] * axes["seq_len"]
    hidden, d = axes["hidden_size"], axes["head_dim"]
    n = (axes["num_attention_heads"] + 2 * axes["num_key_value_heads"]) * d
    flops = 2 * m * n * hidden
    bytes_ = (m * hidden * 2            # hidden_states
              + 2 * m * d * 2           # cos, sin
              + n * hidden // 2         # packed e2m1 weights
              + n * hidden // 16        # e4m3 block scales
              + 2 * d * 2               # q/k norm weights
              + m * n * 2)              # the three outputs
    return {"flops": flops, "bytes": bytes_, "matmul_dtype": "bf16"}
