"""Mistakes written for the diagnosis tests, independently of the operators' mutant
catalogues: each is an implementation with one bug a kernel author could make, built from
the float64 oracle (the bug applied to its inputs or its outputs), outputs in the
definition's dtypes. Importable by name ('diagnosis_mistakes:NAME') from the tests folder."""
from __future__ import annotations

import torch

from fuseval.operators import load
from fuseval.inputs import TORCH_DTYPES
from fuseval.operators.implementations import resolve_impl

B_OP, A_OP, R_OP = "nvfp4_qkv_rope", "qwen2vl_decoder_layer", "residual_rmsnorm"


def _oracle(op, inputs):
    defn = load(op)
    outs = resolve_impl(defn, "reference")(*inputs)
    return [o for o in outs]


def _cast(op, outs):
    defn = load(op)
    return tuple(o.to(TORCH_DTYPES[s.dtype]).contiguous() for o, s in zip(outs, defn.outputs))


def _named(op, inputs):
    return dict(zip(load(op).input_names, inputs))


# ---------------------------------------------------------------- op B: [B, heads, S, D] outputs
def b_tile_tail_unwritten(*inputs):
    """The last token row of every tile of 8 tokens is never stored (a tile-boundary bug): 0."""
    q, k, v = _oracle(B_OP, inputs)
    for t in (q, k, v):
        t[:, :, 7::8] = 0
    return _cast(B_OP, (q, k, v))


def b_head_uses_other_weights(*inputs):
    """Query head 1 is projected with query head 0's weight rows (a wrong head offset)."""
    x = list(inputs)
    names = load(B_OP).input_names
    d = inputs[names.index("cos")].shape[-1]
    for name in ("q_proj_weight_fp4", "q_proj_scale"):
        i = names.index(name)
        w = x[i].clone()
        w[d:2 * d] = w[:d]
        x[i] = w
    return _cast(B_OP, _oracle(B_OP, x))


def b_kv_heads_rolled(*inputs):
    """The kv heads written one slot further (head j stored at j+1 mod Hkv): a wrong head grouping."""
    q, k, v = _oracle(B_OP, inputs)
    return _cast(B_OP, (q, k.roll(1, dims=1), v.roll(1, dims=1)))


def b_rope_on_values(*inputs):
    """RoPE also applied to the value heads (the k code path reused for v)."""
    v_in = _named(B_OP, inputs)
    q, k, v = _oracle(B_OP, inputs)
    cos, sin = v_in["cos"].double()[:, None], v_in["sin"].double()[:, None]
    half = v.shape[-1] // 2
    rotated = torch.cat([-v[..., half:], v[..., :half]], dim=-1)
    return _cast(B_OP, (q, k, v * cos + rotated * sin))


def b_batch_item_zero_everywhere(*inputs):
    """Every batch item's outputs are batch item 0's (a batch stride of 0 on the store)."""
    outs = _oracle(B_OP, inputs)
    return _cast(B_OP, [o[:1].expand_as(o) for o in outs])


def b_head_sign_flipped(*inputs):
    """Query head 2 comes out negated (a sign bug in one head's epilogue)."""
    q, k, v = _oracle(B_OP, inputs)
    q[:, 2] = -q[:, 2]
    return _cast(B_OP, (q, k, v))


def b_keys_doubled(*inputs):
    """The key heads scaled by 2 (a norm weight applied twice as 1 + w with w = 1)."""
    q, k, v = _oracle(B_OP, inputs)
    return _cast(B_OP, (q, 2 * k, v))


def b_last_token_nan(*inputs):
    """The last token of every sequence left unwritten (the poisoned allocator's NaN)."""
    q, k, v = _oracle(B_OP, inputs)
    for t in (q, k, v):
        t[:, :, -1] = float("nan")
    return _cast(B_OP, (q, k, v))


def b_second_half_unrotated(*inputs):
    """RoPE's second half of head_dim left unrotated in the query heads (a half-width loop)."""
    v_in = _named(B_OP, inputs)
    taps: dict = {}
    defn = load(B_OP)
    resolve_impl(defn, "reference")(*inputs, taps=taps)
    q, k, v = _oracle(B_OP, inputs)
    d = v_in["cos"].shape[-1]
    b, s = v_in["hidden_states"].shape[:2]
    hq = q.shape[1]
    normed = taps["qk_norm"][..., :hq * d].reshape(b, s, hq, d).transpose(1, 2)
    q[..., d // 2:] = normed[..., d // 2:]
    return _cast(B_OP, (q, k, v))


def b_values_transposed(*inputs):
    """value_states stored with token and head-dim exchanged (square tiles: S == D)."""
    q, k, v = _oracle(B_OP, inputs)
    return _cast(B_OP, (q, k, v.transpose(-1, -2)))


def b_values_offset(*inputs):
    """value_states + 0.25 (a stray bias): the error is the same whatever the inputs."""
    q, k, v = _oracle(B_OP, inputs)
    return _cast(B_OP, (q, k, v + 0.25))


# ---------------------------------------------------------------- op A: [B, S, hidden] output
def a_extra_bias(*inputs):
    """An extra bias over the hidden axis (the q projection's bias, added to the output too)."""
    (out,) = _oracle(A_OP, inputs)
    bias = _named(A_OP, inputs)["q_proj_bias"].double()[:out.shape[-1]]
    return _cast(A_OP, (out + bias,))


def a_q_weight_transposed(*inputs):
    """The q projection multiplies by W instead of W^T (a square weight read in the wrong order)."""
    x = list(inputs)
    i = load(A_OP).input_names.index("q_proj_weight")
    x[i] = x[i].t().contiguous()
    return _cast(A_OP, _oracle(A_OP, x))


def a_no_causal_mask(*inputs):
    """Attention without the causal mask: every query sees every key."""
    from fuseval.operators.mutants import namespace
    from fuseval.refimpl import stages as st

    def attention(q, k, v, query_chunk=2048):
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        return torch.softmax((q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5, dim=-1) @ v
    ref = resolve_impl(load(A_OP), "reference")
    return _cast(A_OP, ref(*inputs, stages=namespace(st, causal_gqa_attention=attention)))


def a_all_heads_read_kv0(*inputs):
    """Every query head reads kv head 0 (a GQA group size taken as num_heads)."""
    from fuseval.operators.mutants import namespace
    from fuseval.refimpl import stages as st

    def attention(q, k, v, query_chunk=2048):
        s = q.shape[2]
        mask = torch.ones(s, s, dtype=torch.bool).triu(1)
        scores = (q @ k[:, :1].transpose(-1, -2)) / q.shape[-1] ** 0.5
        return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v[:, :1]
    ref = resolve_impl(load(A_OP), "reference")
    return _cast(A_OP, ref(*inputs, stages=namespace(st, causal_gqa_attention=attention)))


def a_bf16_operands(*inputs):
    """The layer in float32 with every float input rounded to bf16 first (bf16 operands)."""
    x = [t.to(torch.bfloat16).float() if isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.dim() > 0
         else t for t in inputs]
    ref = resolve_impl(load(A_OP), "reference")
    return _cast(A_OP, ref(*x, dtype=torch.float32))


def a_correct(*inputs):
    """A correct implementation: the layer in float32."""
    ref = resolve_impl(load(A_OP), "reference")
    return _cast(A_OP, ref(*inputs, dtype=torch.float32))


def a_token_tile_stale(*inputs):
    """Tokens 16.. (the second tile of 16) get the first tile's results (a tile index not advanced)."""
    (out,) = _oracle(A_OP, inputs)
    out[:, 16:32] = out[:, 0:16]
    return _cast(A_OP, (out,))


# ---------------------------------------------------------------- residual_rmsnorm: two outputs
def r_outputs_swapped(*inputs):
    """The two outputs returned in the wrong order."""
    out, res = _oracle(R_OP, inputs)
    return _cast(R_OP, (res, out))
