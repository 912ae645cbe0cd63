"""Readable reference stages shared by the fused operators.

Every function computes in the dtype of its inputs: the operators upcast to float64
(the oracle) or float32 (the "same precision, naive order" baseline) before calling
them. They favour the plain formula over speed, except where memory forces a chunked
loop (attention over 8192 tokens).
"""
from __future__ import annotations

import math

import torch

__all__ = ["rms_norm", "linear", "rotate_half", "rope", "mrope_select", "mrope_section",
           "causal_gqa_attention", "silu", "swiglu"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2 over the last axis) + eps) * weight (eps inside the sqrt)."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x W^T (+ b), W stored [out_features, in_features] as in torch.nn.Linear."""
    y = x @ weight.transpose(-1, -2)
    return y if bias is None else y + bias


def rotate_half(t: torch.Tensor) -> torch.Tensor:
    """concat(-t[D/2:], t[:D/2]) over the last axis (the rotate_half RoPE layout)."""
    half = t.shape[-1] // 2
    return torch.cat([-t[..., half:], t[..., :half]], dim=-1)


def rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """t*cos + rotate_half(t)*sin; cos/sin broadcast against t. Nothing assumes cos^2+sin^2=1."""
    return t * cos + rotate_half(t) * sin


def mrope_section(head_dim: int) -> list[int]:
    """Qwen2-VL's multimodal RoPE section for head_dim D: (D/8, 3D/16, 3D/16), sum D/2
    ((16, 24, 24) at D=128)."""
    if head_dim % 16:
        raise ValueError(f"mrope needs head_dim divisible by 16, got {head_dim}")
    return [head_dim // 8, 3 * head_dim // 16, 3 * head_dim // 16]


def mrope_select(table: torch.Tensor) -> torch.Tensor:
    """Collapse a [3, B, S, D] cos or sin table to [B, S, D].

    Head-dim index d takes its value from position axis a(d), where a runs 0,1,2,0,1,2
    over the consecutive chunks [s0, s1, s2, s0, s1, s2] of d (the section repeated for
    the two rotate_half halves)."""
    n_axes, _, _, d = table.shape
    section = mrope_section(d)
    chunks = torch.split(table, section * 2, dim=-1)
    return torch.cat([chunk[i % n_axes] for i, chunk in enumerate(chunks)], dim=-1)


def causal_gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         query_chunk: int = 2048) -> torch.Tensor:
    """Causal softmax attention with grouped kv heads.

    q: [B, Hq, S, D]; k, v: [B, Hkv, S, D]. Query head i reads kv head i // (Hq / Hkv).
    Scale 1/sqrt(D); query s sees keys 0..s. Returns [B, Hq, S, D].
    Loops over kv heads and query chunks so the score matrix stays a few GB at 8192 tokens."""
    b, hq, s, d = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    scale = 1.0 / math.sqrt(d)
    out = torch.empty_like(q)
    for kv_head in range(hkv):
        heads = slice(kv_head * group, (kv_head + 1) * group)
        k_h = k[:, kv_head : kv_head + 1]                      # [B, 1, S, D], shared by the group
        v_h = v[:, kv_head : kv_head + 1]
        for start in range(0, s, query_chunk):
            stop = min(s, start + query_chunk)
            q_c = q[:, heads, start:stop]                      # [B, G, C, D]
            scores = (q_c @ k_h[:, :, :stop].transpose(-1, -2)) * scale  # keys beyond stop are all masked
            rows = torch.arange(start, stop, device=q.device)[:, None]
            cols = torch.arange(stop, device=q.device)[None, :]
            scores = scores.masked_fill(cols > rows, float("-inf"))
            out[:, heads, start:stop] = torch.softmax(scores, dim=-1) @ v_h[:, :, :stop]
    return out


def silu(x: torch.Tensor) -> torch.Tensor:
    return x / (1 + torch.exp(-x))


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up (SiLU on the gate branch only)."""
    return silu(gate) * up
