"""The decoder layer's mutant catalogue: the reference with one real, subtle bug each (see
:mod:`fuseval.operators.mutants`), one or more per stage. The property suite must reject
every one in the ``ci`` profile; the table is in docs/properties.md."""
from __future__ import annotations

from typing import Callable

import torch

from ..mutants import Mutant, copy_input, first_batch_item, make, namespace, ones_input, swap_inputs, zero_input
from ...refimpl import stages as st

__all__ = ["catalogue", "rope_half_swapped", "mrope_select_with", "attention_with", "rms_norm_eps_outside",
           "rms_norm_no_eps"]

NAME = "qwen2vl_decoder_layer"


# --------------------------------------------------------------------------- broken stage functions
def rope_half_swapped(t, cos, sin):
    """RoPE with rotate_half = concat(t[D/2:], -t[:D/2]): the minus sign on the wrong half
    (a rotation by -theta)."""
    half = t.shape[-1] // 2
    return t * cos + torch.cat([t[..., half:], -t[..., :half]], dim=-1) * sin


def mrope_select_with(axis_of_chunk: Callable[[int], int], widths=None, rows: str = "first"):
    """mrope_select with one change: chunk i takes position axis ``axis_of_chunk(i)``,
    the chunk widths ``widths(d, layout)``, or the *last* seq_len rows of the tables."""
    def select(table: torch.Tensor, seq_len: int | None = None, layout: str = "sol") -> torch.Tensor:
        n_axes, _, n_rows, d = table.shape
        seq_len = n_rows if seq_len is None else seq_len
        table = table[:, :, :seq_len] if rows == "first" else table[:, :, n_rows - seq_len:]
        w = widths(d, layout) if widths else [width for _, width in st.mrope_chunks(d, layout)]
        chunks = torch.split(table, w, dim=-1)
        return torch.cat([chunk[axis_of_chunk(i) % n_axes] for i, chunk in enumerate(chunks)], dim=-1)
    return select


def attention_with(*, future: int = 0, head_map: str = "div", scale_power: float = 0.5):
    """causal_gqa_attention with one change: query s sees keys 0..s+future, query head i
    reads kv head i % Hkv ("mod") instead of i // group, or scale D^-scale_power."""
    def attention(q, k, v, query_chunk: int = 2048):
        b, hq, s, d = q.shape
        hkv = k.shape[1]
        group = hq // hkv
        kv_of = (lambda i: i // group) if head_map == "div" else (lambda i: i % hkv)
        scale = d ** -scale_power
        out = torch.empty_like(q)
        rows = torch.arange(s, device=q.device)[:, None]
        cols = torch.arange(s, device=q.device)[None, :]
        for i in range(hq):
            scores = (q[:, i] @ k[:, kv_of(i)].transpose(-1, -2)) * scale
            scores = scores.masked_fill(cols > rows + future, float("-inf"))
            out[:, i] = torch.softmax(scores, dim=-1) @ v[:, kv_of(i)]
        return out
    return attention


def rms_norm_eps_outside(x, weight, eps):
    """x / (sqrt(mean(x^2)) + eps) * weight: eps outside the square root."""
    return x / (x.pow(2).mean(dim=-1, keepdim=True).sqrt() + eps) * weight


def rms_norm_no_eps(x, weight, eps):
    """x * rsqrt(mean(x^2)) * weight: eps dropped (an all-zero row gives NaN)."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True)) * weight


def _swiglu_wrong_branch(gate, up):
    return gate * st.silu(up)


def _swiglu_sigmoid(gate, up):
    return torch.sigmoid(gate) * up


# --------------------------------------------------------------------------- stage rewrites
def _input_norm_eps_outside(taps, v):
    x = v["hidden_states"].float()
    return rms_norm_eps_outside(x, v["input_layernorm_weight"].float(), float(v["rms_norm_eps"]))


def _attn_residual_dropped(taps, v):
    return st.linear(taps["attention"], v["o_proj_weight"].float())


def _post_norm_eps_dropped(taps, v):
    return rms_norm_no_eps(taps["o_proj"], v["post_attention_layernorm_weight"].float(), 0.0)


def _final_residual_dropped(taps, v):
    return taps["down"]


def catalogue() -> list[Mutant]:
    """Every mutant of the decoder layer (20, over all ten stages)."""
    S = lambda **kw: {"stages": namespace(st, **kw)}
    chunk_widths = lambda d, layout: [w for _, w in st.mrope_chunks(d, layout)][::-1]
    m = lambda *args, **kw: make(NAME, *args, **kw)
    return [
        m("input_norm_eps_outside_sqrt", "input_norm",
          "input RMSNorm divides by sqrt(mean(x^2)) + eps instead of sqrt(mean(x^2) + eps)",
          rewrite=_input_norm_eps_outside),
        m("input_norm_weight_ignored", "input_norm", "input RMSNorm never multiplies by input_layernorm_weight",
          transform=ones_input("input_layernorm_weight")),
        m("q_bias_missing", "qkv_proj", "q projection without its bias", transform=zero_input("q_proj_bias")),
        m("k_v_bias_swapped", "qkv_proj", "k projection adds v's bias and v adds k's",
          transform=swap_inputs("k_proj_bias", "v_proj_bias")),
        m("rope_half_swap", "mrope",
          "rotate_half puts the minus sign on the first half (concat(t2, -t1)): rotation by -theta",
          reference_kwargs=S(rope=rope_half_swapped)),
        m("mrope_axis_order_reversed", "mrope", "mRoPE chunks take position axes (w, h, t) instead of (t, h, w)",
          reference_kwargs=S(mrope_select=mrope_select_with(lambda i: 2 - i % 3))),
        m("mrope_temporal_only", "mrope", "every mRoPE chunk takes the temporal position axis (plain 1-D RoPE)",
          reference_kwargs=S(mrope_select=mrope_select_with(lambda i: 0))),
        m("rope_tables_of_first_batch_item", "mrope", "every batch item rotated with batch item 0's cos/sin tables",
          transform=first_batch_item("rope_cos", "rope_sin", axis=1)),
        m("mrope_section_reversed", "mrope", "mRoPE chunks (3D/8, 3D/8, D/4) instead of (D/4, 3D/8, 3D/8)",
          reference_kwargs=S(mrope_select=mrope_select_with(lambda i: i, widths=chunk_widths))),
        m("mrope_hf_layout", "mrope",
          "HF Qwen2-VL's mRoPE layout (16, 24, 24) x2 over axes t,h,w,t,h,w instead of the "
          "benchmark's contiguous (32, 48, 48)", reference_kwargs={"mrope_layout": "hf"}),
        m("mrope_last_rows", "mrope",
          "the last seq_len rows of longer rope tables instead of the first (only visible when "
          "kv_seq_len > seq_len)", reference_kwargs=S(mrope_select=mrope_select_with(lambda i: i, rows="last"))),
        m("causal_mask_off_by_one", "attention", "causal mask lets query s see key s + 1",
          reference_kwargs=S(causal_gqa_attention=attention_with(future=1))),
        m("gqa_head_map_modulo", "attention", "query head i reads kv head i % num_kv_heads instead of i // group",
          reference_kwargs=S(causal_gqa_attention=attention_with(head_map="mod"))),
        m("attention_scale_1_over_d", "attention", "attention scores scaled by 1/head_dim instead of 1/sqrt(head_dim)",
          reference_kwargs=S(causal_gqa_attention=attention_with(scale_power=1.0))),
        m("attn_residual_dropped", "o_proj", "x1 = attn Wo^T without the residual x", rewrite=_attn_residual_dropped),
        m("post_norm_eps_dropped", "post_norm", "post-attention RMSNorm without eps (rsqrt(mean(x^2)))",
          rewrite=_post_norm_eps_dropped),
        m("post_norm_uses_input_weight", "post_norm", "post-attention RMSNorm multiplies by input_layernorm_weight",
          transform=copy_input("post_attention_layernorm_weight", "input_layernorm_weight")),
        m("silu_on_up_branch", "act", "SwiGLU applies SiLU to the up branch: g * silu(u)",
          reference_kwargs=S(swiglu=_swiglu_wrong_branch)),
        m("sigmoid_instead_of_silu", "act", "SwiGLU gate uses sigmoid(g) instead of g * sigmoid(g)",
          reference_kwargs=S(swiglu=_swiglu_sigmoid)),
        m("final_residual_dropped", "residual", "output = m without the residual x1", rewrite=_final_residual_dropped),
    ]
