"""Readable reference stages shared by the fused operators.

Every function computes in the dtype of its inputs: the operators upcast to float64
(the oracle) or float32 (the "same precision, naive order" baseline) before calling
them. They favour the plain formula over speed, except where memory forces a chunked
loop (attention over 8192 tokens).
"""
from __future__ import annotations

import math

import torch

__all__ = ["rms_norm", "linear", "rotate_half", "rope", "mrope_select", "mrope_section", "mrope_chunks", "MROPE_LAYOUTS",
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


MROPE_LAYOUTS = ("sol", "hf")


def mrope_section(head_dim: int) -> list[int]:
    """Qwen2-VL's multimodal RoPE section for head_dim D: (D/8, 3D/16, 3D/16), sum D/2
    ((16, 24, 24) at D=128)."""
    if head_dim % 16:
        raise ValueError(f"mrope needs head_dim divisible by 16, got {head_dim}")
    return [head_dim // 8, 3 * head_dim // 16, 3 * head_dim // 16]


def mrope_chunks(head_dim: int, layout: str = "sol") -> list[tuple[int, int]]:
    """(position axis, width) of the consecutive head-dim chunks of a cos/sin row.

    ``"sol"`` (SOL-ExecBench L2/019): the section doubled element-wise, one contiguous
    chunk per axis: (0, D/4), (1, 3D/8), (2, 3D/8), i.e. (32, 48, 48) at D=128.
    ``"hf"`` (HF Qwen2-VL): the section repeated for the two rotate_half halves, axes
    0,1,2,0,1,2 over (D/8, 3D/16, 3D/16, D/8, 3D/16, 3D/16)."""
    section = mrope_section(head_dim)
    if layout == "sol":
        return [(axis, 2 * width) for axis, width in enumerate(section)]
    if layout == "hf":
        return [(i % 3, width) for i, width in enumerate(section * 2)]
    raise ValueError(f"mrope layout: expected one of {MROPE_LAYOUTS}, got {layout!r}")


def mrope_select(table: torch.Tensor, seq_len: int | None = None, layout: str = "sol") -> torch.Tensor:
    """Collapse a [3, B, kv_seq_len, D] cos or sin table to [B, seq_len, D].

    Head-dim index d takes its value from the position axis of its chunk
    (``mrope_chunks``); rows 0..seq_len-1 are used (all rows when ``seq_len`` is None):
    the tables may be longer than this call's tokens."""
    _, _, rows, d = table.shape
    seq_len = rows if seq_len is None else int(seq_len)
    if seq_len > rows:
        raise ValueError(f"mrope: the cos/sin tables have kv_seq_len={rows} rows, "
                         f"fewer than seq_len={seq_len}")
    chunks = mrope_chunks(d, layout)
    parts = torch.split(table[:, :, :seq_len], [w for _, w in chunks], dim=-1)
    return torch.cat([part[axis] for (axis, _), part in zip(chunks, parts)], dim=-1)


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
