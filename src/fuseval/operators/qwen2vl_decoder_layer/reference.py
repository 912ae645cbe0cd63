"""Op A: ``qwen2vl_decoder_layer`` (SOL-ExecBench L2/019), reference and plain-torch paths.

Stages (SPEC.md), x = hidden_states:

1. ``input_norm``  h  = rms_norm(x, input_layernorm_weight)
2. ``qkv_proj``    q, k, v = h W^T + b, split head-major into [B, heads, S, D]
3. ``mrope``       q, k rotated with cos/sin rows 0..S-1, head-dim chunks (D/4, 3D/8, 3D/8)
                   from axes t, h, w (the benchmark's layout; ``mrope_layout="hf"``: HF
                   Qwen2-VL's (D/8, 3D/16, 3D/16) x2 from axes t, h, w, t, h, w)
4. ``attention``   causal GQA softmax attention (query head i reads kv head i // group)
5. ``o_proj``      x1 = x + attn Wo^T
6. ``post_norm``   h2 = rms_norm(x1, post_attention_layernorm_weight)
7. ``mlp``         ``gate_up`` (g, u), ``act`` (silu(g) * u), ``down`` (m = a Wd^T)
8. ``residual``    output = x1 + m
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, MutableMapping

import torch
import torch.nn.functional as F

from .. import load
from ...refimpl import stages as st
from ...torch_flags import matmul_flags
from ...inputs import default_realistic_inputs, positions_to_cos_sin
from ...validate import bind_axes

NAME = "qwen2vl_decoder_layer"

__all__ = ["reference", "reference_fp32", "reference_hf_mrope", "torch_eager", "torch_eager_tf32",
           "torch_eager_fp16", "torch_eager_hf_mrope", "sol_reference", "realistic_inputs", "mrope_positions"]


def _split_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, S, heads*D] -> [B, heads, S, D] (column j belongs to head j // D)."""
    b, s, n = t.shape
    return t.view(b, s, heads, n // heads).transpose(1, 2)


def _merge_heads(t: torch.Tensor) -> torch.Tensor:
    """[B, heads, S, D] -> [B, S, heads*D]."""
    b, h, s, d = t.shape
    return t.transpose(1, 2).reshape(b, s, h * d)


def reference(hidden_states, input_layernorm_weight, q_proj_weight, q_proj_bias,
              k_proj_weight, k_proj_bias, v_proj_weight, v_proj_bias, o_proj_weight,
              rope_cos, rope_sin, post_attention_layernorm_weight, gate_proj_weight,
              up_proj_weight, down_proj_weight, rms_norm_eps, *,
              taps: MutableMapping[str, torch.Tensor] | None = None,
              override: Mapping[str, torch.Tensor] | None = None,
              dtype: torch.dtype = torch.float64, validate: bool = True,
              stages=st, mrope_layout: str = "sol") -> tuple[torch.Tensor]:
    """The oracle: every stage in ``dtype`` (float64 by default), unrounded output.

    ``taps``: a dict that receives each stage's output under its SPEC name (layouts:
    ``qkv_proj`` [B,S,qkv+2kv], ``mrope`` [B,S,qkv+kv], ``gate_up`` [B,S,2I], the rest as
    the stage table in the definition says).
    ``override``: {stage: tensor} replaces that stage's output (same layout) and the
    pipeline continues from it; the budget uses it to run "fast up to stage k, oracle after".
    ``stages``: the namespace of stage functions (mutation tests swap one out).
    ``mrope_layout``: "sol" (SOL-ExecBench L2/019, the default) or "hf" (HF Qwen2-VL).
    rope_cos / rope_sin may have more rows (kv_seq_len) than hidden_states has tokens
    (seq_len): rows 0..seq_len-1 are used; keys come only from this call's tokens."""
    args = (hidden_states, input_layernorm_weight, q_proj_weight, q_proj_bias, k_proj_weight,
            k_proj_bias, v_proj_weight, v_proj_bias, o_proj_weight, rope_cos, rope_sin,
            post_attention_layernorm_weight, gate_proj_weight, up_proj_weight, down_proj_weight,
            rms_norm_eps)
    if validate:
        bind_axes(load(NAME), args)
    up = lambda t: t.to(dtype)
    override = override or {}

    def stage(name, compute):
        """Run one stage (or take its overridden output) and record the tap."""
        value = up(override[name]) if name in override else compute()
        if taps is not None:
            taps[name] = value
        return value

    eps = float(rms_norm_eps)
    d = rope_cos.shape[-1]
    hq, hkv = q_proj_weight.shape[0] // d, k_proj_weight.shape[0] // d
    qkv_dim, kv_dim = hq * d, hkv * d

    x = up(hidden_states)
    seq_len = x.shape[1]
    h = stage("input_norm", lambda: stages.rms_norm(x, up(input_layernorm_weight), eps))
    qkv = stage("qkv_proj", lambda: torch.cat([
        stages.linear(h, up(q_proj_weight), up(q_proj_bias)),
        stages.linear(h, up(k_proj_weight), up(k_proj_bias)),
        stages.linear(h, up(v_proj_weight), up(v_proj_bias))], dim=-1))
    q, k, v = torch.split(qkv, [qkv_dim, kv_dim, kv_dim], dim=-1)

    def rotate():
        cos = stages.mrope_select(up(rope_cos), seq_len, mrope_layout)[:, None]   # [B, 1, S, D]
        sin = stages.mrope_select(up(rope_sin), seq_len, mrope_layout)[:, None]   # over heads
        return torch.cat([_merge_heads(stages.rope(_split_heads(q, hq), cos, sin)),
                          _merge_heads(stages.rope(_split_heads(k, hkv), cos, sin))], dim=-1)
    qk = stage("mrope", rotate)
    q_rot, k_rot = torch.split(qk, [qkv_dim, kv_dim], dim=-1)

    attn = stage("attention", lambda: _merge_heads(stages.causal_gqa_attention(
        _split_heads(q_rot, hq), _split_heads(k_rot, hkv), _split_heads(v, hkv))))
    x1 = stage("o_proj", lambda: x + stages.linear(attn, up(o_proj_weight)))
    h2 = stage("post_norm", lambda: stages.rms_norm(x1, up(post_attention_layernorm_weight), eps))
    gu = stage("gate_up", lambda: torch.cat([stages.linear(h2, up(gate_proj_weight)),
                                             stages.linear(h2, up(up_proj_weight))], dim=-1))
    g, u = torch.split(gu, [gu.shape[-1] // 2] * 2, dim=-1)
    a = stage("act", lambda: stages.swiglu(g, u))
    del gu, g, u
    m = stage("down", lambda: stages.linear(a, up(down_proj_weight)))
    out = stage("residual", lambda: x1 + m)
    return (out,)


reference_fp32 = functools.partial(reference, dtype=torch.float32)
reference_fp32.__doc__ = "The reference computed in float32 (same formulas, naive order)."
reference_hf_mrope = functools.partial(reference, mrope_layout="hf")
reference_hf_mrope.__doc__ = "The oracle with HF Qwen2-VL's mRoPE layout (the ``hf_mrope`` variant)."


def _torch_layer(inputs, mrope_layout: str, linear: Callable, attention_dtype: torch.dtype | None = None):
    """The decoder layer in plain torch ops, the body of the torch baselines: fp32 norms,
    RoPE, SiLU and residual adds; ``linear(a, w, bias=None)`` does every projection; SDPA
    for attention on operands cast to ``attention_dtype`` (None: as they are)."""
    (hidden_states, input_layernorm_weight, q_proj_weight, q_proj_bias, k_proj_weight, k_proj_bias,
     v_proj_weight, v_proj_bias, o_proj_weight, rope_cos, rope_sin, post_attention_layernorm_weight,
     gate_proj_weight, up_proj_weight, down_proj_weight, rms_norm_eps) = inputs
    eps = float(rms_norm_eps)
    d = rope_cos.shape[-1]
    hq, hkv = q_proj_weight.shape[0] // d, k_proj_weight.shape[0] // d

    def norm(t, w):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w

    def attend(t):
        return t if attention_dtype is None else t.to(attention_dtype)

    x = hidden_states
    h = norm(x, input_layernorm_weight)
    q = _split_heads(linear(h, q_proj_weight, q_proj_bias), hq)
    k = _split_heads(linear(h, k_proj_weight, k_proj_bias), hkv)
    v = _split_heads(linear(h, v_proj_weight, v_proj_bias), hkv)
    seq_len = hidden_states.shape[1]
    cos = st.mrope_select(rope_cos, seq_len, mrope_layout)[:, None]
    sin = st.mrope_select(rope_sin, seq_len, mrope_layout)[:, None]
    q = q * cos + st.rotate_half(q) * sin
    k = k * cos + st.rotate_half(k) * sin
    group = hq // hkv
    attn = F.scaled_dot_product_attention(attend(q), attend(k.repeat_interleave(group, 1)),
                                          attend(v.repeat_interleave(group, 1)), is_causal=True)
    x1 = x + linear(_merge_heads(attn), o_proj_weight)
    h2 = norm(x1, post_attention_layernorm_weight)
    m = linear(F.silu(linear(h2, gate_proj_weight)) * linear(h2, up_proj_weight), down_proj_weight)
    return (x1 + m,)


def torch_eager(hidden_states, input_layernorm_weight, q_proj_weight, q_proj_bias,
                k_proj_weight, k_proj_bias, v_proj_weight, v_proj_bias, o_proj_weight,
                rope_cos, rope_sin, post_attention_layernorm_weight, gate_proj_weight,
                up_proj_weight, down_proj_weight, rms_norm_eps, *, mrope_layout: str = "sol"):
    """What a user would write in plain torch: float32 ops, SDPA for attention.

    Matmul precision follows torch's global setting (see ``torch_eager_tf32``)."""
    inputs = (hidden_states, input_layernorm_weight, q_proj_weight, q_proj_bias, k_proj_weight, k_proj_bias,
              v_proj_weight, v_proj_bias, o_proj_weight, rope_cos, rope_sin, post_attention_layernorm_weight,
              gate_proj_weight, up_proj_weight, down_proj_weight, rms_norm_eps)
    return _torch_layer(inputs, mrope_layout, F.linear)


torch_eager_hf_mrope = functools.partial(torch_eager, mrope_layout="hf")
torch_eager_hf_mrope.__doc__ = "``torch_eager`` with HF Qwen2-VL's mRoPE layout (the ``hf_mrope`` variant)."


def torch_eager_tf32(*inputs, mrope_layout: str = "sol"):
    """``torch_eager`` with TF32 tensor-core matmuls (the SOL-ExecBench torch baseline)."""
    with matmul_flags(tf32=True):
        return torch_eager(*inputs, mrope_layout=mrope_layout)


torch_eager_tf32_hf_mrope = functools.partial(torch_eager_tf32, mrope_layout="hf")


def torch_eager_fp16(hidden_states, input_layernorm_weight, q_proj_weight, q_proj_bias,
                     k_proj_weight, k_proj_bias, v_proj_weight, v_proj_bias, o_proj_weight,
                     rope_cos, rope_sin, post_attention_layernorm_weight, gate_proj_weight,
                     up_proj_weight, down_proj_weight, rms_norm_eps, *, mrope_layout: str = "sol"):
    """What a user would write in torch with fp16 operands: every matmul on fp16 copies of
    its operands made in the call (weights included: nothing is kept across calls), fp32
    accumulation, fp16 results; SDPA in fp16; norms, RoPE, biases, SiLU and the residual
    adds in fp32 (the baseline the "fp16" policy of the fast path is measured against)."""
    half = torch.float16

    def linear(a, w, bias=None):
        out = F.linear(a.to(half), w.to(half)).float()
        return out if bias is None else out + bias

    inputs = (hidden_states, input_layernorm_weight, q_proj_weight, q_proj_bias, k_proj_weight, k_proj_bias,
              v_proj_weight, v_proj_bias, o_proj_weight, rope_cos, rope_sin, post_attention_layernorm_weight,
              gate_proj_weight, up_proj_weight, down_proj_weight, rms_norm_eps)
    with matmul_flags(fp16_reduction=False):
        return _torch_layer(inputs, mrope_layout, linear, attention_dtype=half)


torch_eager_fp16_hf_mrope = functools.partial(torch_eager_fp16, mrope_layout="hf")


# --------------------------------------------------------------------------- the benchmark's reference
@torch.no_grad()
def sol_reference(hidden_states, input_layernorm_weight, q_proj_weight, q_proj_bias,
                  k_proj_weight, k_proj_bias, v_proj_weight, v_proj_bias, o_proj_weight,
                  rope_cos, rope_sin, post_attention_layernorm_weight, gate_proj_weight,
                  up_proj_weight, down_proj_weight, rms_norm_eps, *, mrope_layout: str = "sol"):
    """What SOL-ExecBench L2/019 compares against, in its own precision (SPEC.md):
    float32 eager torch with TF32 off, attention as an explicit matmul / softmax /
    matmul over the whole causal score matrix (no SDPA), the kv heads repeated for the
    groups, the norm weight applied after the normalisation. Written from SPEC.md;
    ``fuseval check --against sol_reference --rules sol`` predicts the benchmark's
    verdict with it."""
    eps = float(rms_norm_eps)
    d = rope_cos.shape[-1]
    hq, hkv = q_proj_weight.shape[0] // d, k_proj_weight.shape[0] // d
    b, s, hidden = hidden_states.shape

    def norm(t, w):
        t = t.to(torch.float32)
        return w * (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps))

    with matmul_flags(tf32=False):
        x = hidden_states
        h = norm(x, input_layernorm_weight)
        q = _split_heads(F.linear(h, q_proj_weight, q_proj_bias), hq)
        k = _split_heads(F.linear(h, k_proj_weight, k_proj_bias), hkv)
        v = _split_heads(F.linear(h, v_proj_weight, v_proj_bias), hkv)
        cos = st.mrope_select(rope_cos, s, mrope_layout)[:, None]
        sin = st.mrope_select(rope_sin, s, mrope_layout)[:, None]
        q = q * cos + st.rotate_half(q) * sin
        k = k * cos + st.rotate_half(k) * sin
        group = hq // hkv
        k = k[:, :, None].expand(b, hkv, group, s, d).reshape(b, hq, s, d)
        v = v[:, :, None].expand(b, hkv, group, s, d).reshape(b, hq, s, d)
        scores = torch.matmul(q, k.transpose(2, 3)) * (d ** -0.5)
        scores = scores + torch.full((s, s), float("-inf"), device=x.device).triu(1)
        p = torch.softmax(scores, dim=-1, dtype=torch.float32)
        del scores
        attn = torch.matmul(p, v)
        del p
        x1 = x + F.linear(_merge_heads(attn), o_proj_weight)
        h2 = norm(x1, post_attention_layernorm_weight)
        m = F.linear(F.silu(F.linear(h2, gate_proj_weight)) * F.linear(h2, up_proj_weight),
                     down_proj_weight)
        return (x1 + m,)


sol_reference_hf_mrope = functools.partial(sol_reference, mrope_layout="hf")


# --------------------------------------------------------------------------- realistic inputs
def mrope_positions(batch: int, seq_len: int) -> torch.Tensor:
    """[3, B, S] position ids (t, h, w) of a text / image / text sequence, the way
    Qwen2-VL numbers them: text tokens advance all three axes together; an image of
    gh x gw patches keeps t fixed and walks h over rows and w over columns; the text
    after it continues from the largest id used so far plus one."""
    pos = torch.empty(3, seq_len, dtype=torch.int64)
    n_img = seq_len // 2
    gh = max(1, int(n_img ** 0.5))
    gw = max(1, n_img // gh)
    n_img = gh * gw if seq_len >= 4 else 0
    pre = (seq_len - n_img) // 2
    pos[:, :pre] = torch.arange(pre)
    if n_img:
        rows = torch.arange(gh).repeat_interleave(gw)
        cols = torch.arange(gw).repeat(gh)
        pos[0, pre:pre + n_img] = pre
        pos[1, pre:pre + n_img] = pre + rows
        pos[2, pre:pre + n_img] = pre + cols
    nxt = int(pos[:, :pre + n_img].max()) + 1 if pre + n_img else 0
    post = seq_len - pre - n_img
    pos[:, pre + n_img:] = nxt + torch.arange(post)
    return pos[:, None, :].expand(3, batch, seq_len)


def realistic_inputs(defn, axes, seed, device="cpu") -> dict[str, Any]:
    """Benchmark-style weights and activations; norm weights near 1; cos/sin of real
    multimodal position ids (rope_theta from the definition)."""
    values = default_realistic_inputs(defn, axes, seed, device)
    pos = mrope_positions(axes["batch_size"], axes["kv_seq_len"])
    cos, sin = positions_to_cos_sin(pos, axes["head_dim"], float(defn.realistic.get("rope_theta", 1e6)))
    values["rope_cos"], values["rope_sin"] = cos.contiguous().to(device), sin.contiguous().to(device)
    return values


# --------------------------------------------------------------------------- cost model
def cost_model(axes: Mapping[str, int]) -> dict[str, Any]:
    """Minimal work of one call, for the roofline floor.

    ``axes``: the full axis binding of a case (``defn.resolve_axes(case.axes)``); const
    axes it lacks are taken from the seed definition. FLOPs count the matrix products only
    (QKV, O, gate+up, down, and attention's QK^T and PV with the causal mask counted as
    half of the square); element-wise work is negligible next to them. Bytes: every input
    read once and the output written once, in float32. ``matmul_dtype``: the tensor-core
    rate the floor uses, fp16: the fastest operand precision whose products still pass the
    benchmark's tolerance (on the H200 fp16 operands pass 16/16 cases, bf16 0/16), so no
    passing implementation runs its products faster; ``floors_also_at``: the bench also
    reports the floor at the TF32 rate (that of the float32 inputs' own tensor-core path)."""
    a = dict(load(NAME).const_axes)
    a.update({k: int(v) for k, v in axes.items()})
    b, s, h = a["batch_size"], a["seq_len"], a["hidden_size"]
    hq, hkv, d, i = a["num_heads"], a["num_kv_heads"], a["head_dim"], a["intermediate_size"]
    m, qd, kd = b * s, hq * d, hkv * d
    gemm = 2 * m * h * (qd + 2 * kd) + 2 * m * qd * h + 2 * m * h * 2 * i + 2 * m * i * h
    attention = 2 * b * hq * s * s * d          # (QK^T + PV) = 4*B*Hq*S^2*D, halved by causality
    elements = (2 * m * h                       # hidden_states in, output out
                + 2 * h                         # the two norm weights
                + (qd + 2 * kd) * h + (qd + 2 * kd)  # QKV weights and biases
                + h * qd                        # o_proj
                + 2 * 3 * b * s * d             # rope_cos, rope_sin
                + 3 * i * h)                    # gate, up, down
    return dict(flops=int(gemm + attention), bytes=int(4 * elements), matmul_dtype="fp16", floors_also_at=["tf32"])
