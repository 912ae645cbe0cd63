"""A catalogue of deliberately broken implementations (mutants) of each operator.

Each mutant is the reference pipeline with exactly one real, subtle bug, run the way an
implementation runs: in float32 (``dtype=torch.float32``), outputs cast to the
definition's dtypes (bf16 for op B). Most swap one function of the ``stages`` namespace
or of the NVFP4 ``codec`` that the references accept; the others wrap the reference:
they change an input (a missing bias, a wrong norm weight, swapped cos/sin) or rewrite
one stage's output from the stage taps (a dropped residual, a wrong layout).

The property suite must reject every mutant in the ``ci`` profile
(``tests/test_mutants.py`` asserts it, so weakening a property fails CI).

Every mutant follows the stage-tap protocol: ``mutant.fn.staged(*inputs, taps=, override=)``
records every SPEC stage output (float32) and continues from overridden stage outputs,
and ``mutant.stage`` names the first stage whose output the bug changes, so the error
budget can be tested to blame the right stage. ``catalogue(op)`` lists them; the table is
in docs/properties.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Mapping

import torch

from ..definitions import load
from ..inputs import TORCH_DTYPES
from ..ops import resolve_impl
from ..refimpl import nvfp4 as _nvfp4
from ..refimpl import stages as _st
from .strategies import OP_A, OP_B

__all__ = ["Mutant", "catalogue", "get"]


@dataclass(frozen=True)
class Mutant:
    """A broken implementation: ``fn(*inputs)`` returns outputs in the definition dtypes;
    ``fn.staged`` is its stage-tap version; ``stage`` is the first stage it breaks."""
    name: str
    op: str
    stage: str
    description: str
    fn: Callable

    def __call__(self, *inputs):
        return self.fn(*inputs)

    @property
    def staged(self) -> Callable:
        return self.fn.staged


# --------------------------------------------------------------------------- plumbing
def _namespace(module, **replace) -> SimpleNamespace:
    ns = SimpleNamespace(**{n: getattr(module, n) for n in module.__all__})
    for k, v in replace.items():
        if not hasattr(ns, k):
            raise AttributeError(f"{module.__name__} has no function {k!r} to replace")
        setattr(ns, k, v)
    return ns


def _make(op: str, name: str, stage: str, description: str, *, stages=None, codec=None,
          transform: Callable[[dict], None] | None = None,
          rewrite: Callable[[dict, dict], torch.Tensor] | None = None,
          semantics: Mapping[str, Any] | None = None) -> Mutant:
    """Build a mutant from the reference: ``stages`` / ``codec`` namespaces with one broken
    function, ``transform(values)`` editing the named inputs in place,
    ``rewrite(taps, values) -> tensor`` replacing the output of ``stage``, or
    ``semantics``: keyword arguments of the reference that select another operator's
    semantics (e.g. the HF mRoPE layout), which is a bug against the benchmark's."""
    defn = load(op)
    if stage not in defn.stage_names:
        raise ValueError(f"mutant {name}: unknown stage {stage!r} of {op} ({defn.stage_names})")
    ref = resolve_impl(defn, "reference")
    out_dtypes = [TORCH_DTYPES[spec.dtype] for spec in defn.outputs]
    kwargs: dict[str, Any] = {"dtype": torch.float32, "validate": False, "stages": stages or _st,
                              **(semantics or {})}
    if op == OP_B:
        kwargs["codec"] = codec or _nvfp4
    elif codec is not None:
        raise ValueError("only op B has a codec")

    def staged(*inputs, taps: dict | None = None, override: Mapping[str, torch.Tensor] | None = None):
        values = dict(zip(defn.input_names, inputs))
        if transform is not None:
            transform(values)
        args = [values[n] for n in defn.input_names]
        override = dict(override or {})
        if rewrite is not None and stage not in override:
            first: dict = {}
            ref(*args, taps=first, override=override, **kwargs)
            override[stage] = rewrite(first, values)
        outs = ref(*args, taps=taps, override=override, **kwargs)
        return tuple(o.to(dtype).contiguous() for o, dtype in zip(outs, out_dtypes))

    def forward(*inputs):
        return staged(*inputs)

    forward.staged = staged
    forward.stage = stage
    forward.mutant_name = name
    forward.description = description
    forward.__name__ = forward.__qualname__ = f"mutant_{name}"
    return Mutant(name, op, stage, description, forward)


# --------------------------------------------------------------------------- broken stage functions
def _rotate_half_swapped(t: torch.Tensor) -> torch.Tensor:
    """concat(t[D/2:], -t[:D/2]): the minus sign on the wrong half (rotates by -theta)."""
    half = t.shape[-1] // 2
    return torch.cat([t[..., half:], -t[..., :half]], dim=-1)


def _rope_half_swapped(t, cos, sin):
    return t * cos + _rotate_half_swapped(t) * sin


def _rope_interleaved(t, cos, sin):
    """GPT-J style RoPE (pairs (2i, 2i+1)) applied to rotate_half tables."""
    rot = torch.stack([-t[..., 1::2], t[..., 0::2]], dim=-1).flatten(-2)
    return t * cos + rot * sin


def _mrope_select_with(axis_of_chunk: Callable[[int], int], widths=None, rows: str = "first"):
    """mrope_select with one change: chunk i takes position axis ``axis_of_chunk(i)``,
    the chunk widths ``widths(d, layout)``, or the *last* seq_len rows of the tables."""
    def select(table: torch.Tensor, seq_len: int | None = None, layout: str = "sol") -> torch.Tensor:
        n_axes, _, n_rows, d = table.shape
        seq_len = n_rows if seq_len is None else seq_len
        table = table[:, :, :seq_len] if rows == "first" else table[:, :, n_rows - seq_len:]
        w = widths(d, layout) if widths else [width for _, width in _st.mrope_chunks(d, layout)]
        chunks = torch.split(table, w, dim=-1)
        return torch.cat([chunk[axis_of_chunk(i) % n_axes] for i, chunk in enumerate(chunks)], dim=-1)
    return select


def _identity_quantizer(x: torch.Tensor) -> "_nvfp4.ActivationQuant":
    """The activations used as they are (weight-only NVFP4), dressed as a quantizer output."""
    class Unquantized(_nvfp4.ActivationQuant):
        def dequantize(self, dtype=torch.float64):
            return x.to(dtype)
    aq = _nvfp4.quantize_activations(x)
    return Unquantized(aq.codes, aq.scales, aq.global_decode, aq.global_encode)


def _quantizer_per_token_amax(x: torch.Tensor) -> "_nvfp4.ActivationQuant":
    return _nvfp4.quantize_activations(x, amax_over="token")


def _attention_with(*, future: int = 0, head_map: str = "div", scale_power: float = 0.5):
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


def _rms_norm_eps_outside(x, weight, eps):
    return x / (x.pow(2).mean(dim=-1, keepdim=True).sqrt() + eps) * weight


def _rms_norm_no_eps(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True)) * weight


def _rms_norm_over_heads(x, weight, eps):
    """Normalises over every head of the token ([..., heads, D] -> last two axes)."""
    return x * torch.rsqrt(x.pow(2).mean(dim=(-2, -1), keepdim=True) + eps) * weight


def _linear_drops_last_block(x, weight, bias=None):
    """x W^T with the reduction loop stopping one 16-column block early (a K-tail bug)."""
    y = x[..., :-16] @ weight[:, :-16].transpose(-1, -2)
    return y if bias is None else y + bias


def _swiglu_wrong_branch(gate, up):
    return gate * _st.silu(up)


def _swiglu_sigmoid(gate, up):
    return torch.sigmoid(gate) * up


# NVFP4 codec pieces ---------------------------------------------------------
def _dequant_with(*, unpack=None, decode_codes=None, decode_scales=None, column_block=None,
                  use_global=True):
    """dequantize_nvfp4 with one piece replaced (all else as the bit-level codec)."""
    def dequantize(packed, scales, global_decode_scale, dtype=torch.float64):
        codes = (unpack or _nvfp4.unpack_fp4)(packed)
        values = (decode_codes or (lambda c: _nvfp4.decode_e2m1(c)))(codes)
        bs = (decode_scales or (lambda s: _nvfp4.decode_e4m3fn(s)))(scales)
        k = values.shape[-1]
        blocks = column_block(k, bs.shape[-1]) if column_block else torch.arange(k, device=packed.device) // 16
        per_column = bs[..., blocks]
        g = float(global_decode_scale) if use_global else 1.0
        return (values * per_column * g).to(dtype)
    return dequantize


def _unpack_high_first(packed):
    return torch.stack((packed >> 4, packed & 0xF), dim=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def _block_off_by_one(k: int, n_blocks: int) -> torch.Tensor:
    """Column k uses block (k + 1) // 16: the last column of every block reads the next scale."""
    return ((torch.arange(k) + 1) // 16).clamp(max=n_blocks - 1)


def _decode_e2m1_unsigned(codes):
    return _nvfp4.decode_e2m1(codes & 0x7)


def _decode_e4m3_subnormal_as_normal(bits):
    """Exponent field 0 decoded as a normal number (1 + m/8) * 2^-7 instead of m/8 * 2^-6."""
    b = bits.view(torch.uint8) if bits.dtype == torch.float8_e4m3fn else bits
    value = _nvfp4.decode_e4m3fn(b)
    b = b.to(torch.int32)
    exp, mant, sign = (b >> 3) & 0xF, (b & 7).to(torch.float64), torch.where((b >> 7) == 1, -1.0, 1.0)
    wrong = sign * (1 + mant / 8) * 2.0 ** -7
    return torch.where(exp == 0, wrong.to(value.dtype), value)


def _decode_e4m3_nan_as_zero(bits):
    return _nvfp4.decode_e4m3fn(bits).nan_to_num(0.0)


def _decode_e4m3_abs(bits):
    return _nvfp4.decode_e4m3fn(bits).abs()


# --------------------------------------------------------------------------- op A rewrites
def _a_input_norm_eps_outside(taps, v):
    x = v["hidden_states"].float()
    return _rms_norm_eps_outside(x, v["input_layernorm_weight"].float(), float(v["rms_norm_eps"]))


def _a_attn_residual_dropped(taps, v):
    return _st.linear(taps["attention"], v["o_proj_weight"].float())


def _a_post_norm_eps_dropped(taps, v):
    return _rms_norm_no_eps(taps["o_proj"], v["post_attention_layernorm_weight"].float(), 0.0)


def _a_final_residual_dropped(taps, v):
    return taps["down"]


def _a_swap(a: str, b: str):
    def transform(values):
        values[a], values[b] = values[b], values[a]
    return transform


def _a_zero(name: str):
    def transform(values):
        values[name] = torch.zeros_like(values[name])
    return transform


def _a_ones(name: str):
    def transform(values):
        values[name] = torch.ones_like(values[name])
    return transform


def _first_batch_item(*names: str, axis: int):
    """The tables of batch item 0 broadcast to every item (a stride-0 / indexing bug)."""
    def transform(values):
        for n in names:
            t = values[n]
            values[n] = t.narrow(axis, 0, 1).expand_as(t).contiguous()
    return transform


def _a_copy(dst: str, src: str):
    def transform(values):
        values[dst] = values[src]
    return transform


# --------------------------------------------------------------------------- op B rewrites
def _b_parts(taps, v):
    """(q_rot, k_rot, v_proj) [B, S, n] from the taps and the head_dim."""
    d = v["cos"].shape[-1]
    rows = [v["q_proj_weight_fp4"].shape[0], v["k_proj_weight_fp4"].shape[0], v["v_proj_weight_fp4"].shape[0]]
    qr, kr = torch.split(taps["rope"], rows[:2], dim=-1)
    vv = torch.split(taps["proj"], rows, dim=-1)[2]
    return qr, kr, vv, d


def _b_layout(parts, d, transpose=True):
    b, s, _ = parts[0].shape
    if transpose:
        heads = [t.reshape(b, s, -1, d).transpose(1, 2) for t in parts]
    else:
        heads = [t.reshape(b, -1, s, d) for t in parts]
    return torch.cat(heads, dim=1).contiguous()


def _b_layout_no_transpose(taps, v):
    qr, kr, vv, d = _b_parts(taps, v)
    return _b_layout([qr, kr, vv], d, transpose=False)


def _b_rope_on_v(taps, v):
    qr, kr, vv, d = _b_parts(taps, v)
    b, s, _ = vv.shape
    c, sn = v["cos"].float()[:, :, None], v["sin"].float()[:, :, None]
    vr = _st.rope(vv.reshape(b, s, -1, d), c, sn).flatten(2)
    return _b_layout([qr, kr, vr], d)


def _b_norm_on_v(taps, v):
    qr, kr, vv, d = _b_parts(taps, v)
    b, s, _ = vv.shape
    vn = _st.rms_norm(vv.reshape(b, s, -1, d), v["k_norm_weight"].float(), float(v["rms_norm_eps"])).flatten(2)
    return _b_layout([qr, kr, vn], d)


# --------------------------------------------------------------------------- the catalogue
def _catalogue_a() -> list[Mutant]:
    op = OP_A
    S = lambda **kw: _namespace(_st, **kw)
    return [
        _make(op, "input_norm_eps_outside_sqrt", "input_norm",
              "input RMSNorm divides by sqrt(mean(x^2)) + eps instead of sqrt(mean(x^2) + eps)",
              rewrite=_a_input_norm_eps_outside),
        _make(op, "input_norm_weight_ignored", "input_norm",
              "input RMSNorm never multiplies by input_layernorm_weight",
              transform=_a_ones("input_layernorm_weight")),
        _make(op, "q_bias_missing", "qkv_proj", "q projection without its bias",
              transform=_a_zero("q_proj_bias")),
        _make(op, "k_v_bias_swapped", "qkv_proj", "k projection adds v's bias and v adds k's",
              transform=_a_swap("k_proj_bias", "v_proj_bias")),
        _make(op, "rope_half_swap", "mrope",
              "rotate_half puts the minus sign on the first half (concat(t2, -t1)): rotation by -theta",
              stages=S(rope=_rope_half_swapped)),
        _make(op, "mrope_axis_order_reversed", "mrope",
              "mRoPE chunks take position axes (w, h, t) instead of (t, h, w)",
              stages=S(mrope_select=_mrope_select_with(lambda i: 2 - i % 3))),
        _make(op, "mrope_temporal_only", "mrope",
              "every mRoPE chunk takes the temporal position axis (plain 1-D RoPE)",
              stages=S(mrope_select=_mrope_select_with(lambda i: 0))),
        _make(op, "rope_tables_of_first_batch_item", "mrope",
              "every batch item rotated with batch item 0's cos/sin tables",
              transform=_first_batch_item("rope_cos", "rope_sin", axis=1)),
        _make(op, "mrope_section_reversed", "mrope",
              "mRoPE chunks (3D/8, 3D/8, D/4) instead of (D/4, 3D/8, 3D/8)",
              stages=S(mrope_select=_mrope_select_with(
                  lambda i: i, widths=lambda d, layout: [w for _, w in _st.mrope_chunks(d, layout)][::-1]))),
        _make(op, "mrope_hf_layout", "mrope",
              "HF Qwen2-VL's mRoPE layout (16, 24, 24) x2 over axes t,h,w,t,h,w instead of the "
              "benchmark's contiguous (32, 48, 48)", semantics={"mrope_layout": "hf"}),
        _make(op, "mrope_last_rows", "mrope",
              "the last seq_len rows of longer rope tables instead of the first (only visible when "
              "kv_seq_len > seq_len)", stages=S(mrope_select=_mrope_select_with(lambda i: i, rows="last"))),
        _make(op, "causal_mask_off_by_one", "attention",
              "causal mask lets query s see key s + 1",
              stages=S(causal_gqa_attention=_attention_with(future=1))),
        _make(op, "gqa_head_map_modulo", "attention",
              "query head i reads kv head i % num_kv_heads instead of i // group",
              stages=S(causal_gqa_attention=_attention_with(head_map="mod"))),
        _make(op, "attention_scale_1_over_d", "attention",
              "attention scores scaled by 1/head_dim instead of 1/sqrt(head_dim)",
              stages=S(causal_gqa_attention=_attention_with(scale_power=1.0))),
        _make(op, "attn_residual_dropped", "o_proj", "x1 = attn Wo^T without the residual x",
              rewrite=_a_attn_residual_dropped),
        _make(op, "post_norm_eps_dropped", "post_norm",
              "post-attention RMSNorm without eps (rsqrt(mean(x^2)))", rewrite=_a_post_norm_eps_dropped),
        _make(op, "post_norm_uses_input_weight", "post_norm",
              "post-attention RMSNorm multiplies by input_layernorm_weight",
              transform=_a_copy("post_attention_layernorm_weight", "input_layernorm_weight")),
        _make(op, "silu_on_up_branch", "act", "SwiGLU applies SiLU to the up branch: g * silu(u)",
              stages=S(swiglu=_swiglu_wrong_branch)),
        _make(op, "sigmoid_instead_of_silu", "act", "SwiGLU gate uses sigmoid(g) instead of g * sigmoid(g)",
              stages=S(swiglu=_swiglu_sigmoid)),
        _make(op, "final_residual_dropped", "residual", "output = m without the residual x1",
              rewrite=_a_final_residual_dropped),
    ]


def _catalogue_b() -> list[Mutant]:
    op = OP_B
    S = lambda **kw: _namespace(_st, **kw)
    C = lambda **kw: _namespace(_nvfp4, dequantize_nvfp4=_dequant_with(**kw))
    return [
        _make(op, "activations_not_quantized", "act_quant",
              "the bf16 activations multiply the weights as they are (weight-only W4A16) instead of "
              "their NVFP4 quantization", codec=_namespace(_nvfp4, quantize_activations=_identity_quantizer)),
        _make(op, "act_amax_per_token", "act_quant",
              "the activation quantizer takes one global amax per token instead of one per tensor",
              codec=_namespace(_nvfp4, quantize_activations=_quantizer_per_token_amax)),
        _make(op, "nibble_order_swapped", "dequant", "the high nibble is taken as the even column",
              codec=C(unpack=_unpack_high_first)),
        _make(op, "scale_block_off_by_one", "dequant",
              "column k uses scale block (k + 1) // 16 (the last column of each block reads the next scale)",
              codec=C(column_block=_block_off_by_one)),
        _make(op, "global_scale_missing", "dequant", "the global decode scale is never applied",
              codec=C(use_global=False)),
        _make(op, "e2m1_sign_ignored", "dequant", "e2m1 sign bit ignored (codes 8..15 decode positive)",
              codec=C(decode_codes=_decode_e2m1_unsigned)),
        _make(op, "e4m3_subnormal_as_normal", "dequant",
              "e4m3 exponent 0 decoded as (1 + m/8) 2^-7 instead of m/8 2^-6",
              codec=C(decode_scales=_decode_e4m3_subnormal_as_normal)),
        _make(op, "nan_scale_decoded_as_zero", "dequant", "a NaN e4m3 scale code decodes to 0",
              codec=C(decode_scales=_decode_e4m3_nan_as_zero)),
        _make(op, "negative_scale_as_positive", "dequant", "negative e4m3 scales lose their sign",
              codec=C(decode_scales=_decode_e4m3_abs)),
        _make(op, "proj_k_loop_drops_last_block", "proj",
              "the projection's reduction over hidden_size skips the last 16 columns",
              stages=S(linear=_linear_drops_last_block)),
        _make(op, "qk_norm_over_heads", "qk_norm",
              "q/k RMSNorm over all heads of a token instead of per head over head_dim",
              stages=S(rms_norm=_rms_norm_over_heads)),
        _make(op, "qk_norm_eps_outside_sqrt", "qk_norm",
              "q/k RMSNorm divides by sqrt(mean(t^2)) + eps", stages=S(rms_norm=_rms_norm_eps_outside)),
        _make(op, "qk_norm_eps_dropped", "qk_norm", "q/k RMSNorm without eps",
              stages=S(rms_norm=_rms_norm_no_eps)),
        _make(op, "q_uses_k_norm_weight", "qk_norm", "q is normalised with k_norm_weight",
              transform=_a_copy("q_norm_weight", "k_norm_weight")),
        _make(op, "rope_half_swap", "rope",
              "rotate_half puts the minus sign on the first half (concat(t2, -t1))",
              stages=S(rope=_rope_half_swapped)),
        _make(op, "rope_interleaved", "rope", "GPT-J style RoPE on pairs (2i, 2i+1) instead of (i, i + D/2)",
              stages=S(rope=_rope_interleaved)),
        _make(op, "cos_sin_swapped", "rope", "cos and sin inputs exchanged", transform=_a_swap("cos", "sin")),
        _make(op, "cos_sin_of_first_batch_item", "rope", "every batch item uses batch item 0's cos/sin",
              transform=_first_batch_item("cos", "sin", axis=0)),
        _make(op, "layout_without_transpose", "layout",
              "[B,S,h,D] reshaped to [B,h,S,D] instead of transposed", rewrite=_b_layout_no_transpose),
        _make(op, "rope_applied_to_v", "layout", "RoPE also applied to value_states", rewrite=_b_rope_on_v),
        _make(op, "norm_applied_to_v", "layout", "value_states normalised with k_norm_weight",
              rewrite=_b_norm_on_v),
    ]


_CATALOGUES = {OP_A: _catalogue_a, OP_B: _catalogue_b}


def catalogue(op: str) -> list[Mutant]:
    """Every mutant of ``op``."""
    if op not in _CATALOGUES:
        raise ValueError(f"no mutant catalogue for operator {op!r}; known: {sorted(_CATALOGUES)}")
    return _CATALOGUES[op]()


def get(op: str, name: str) -> Mutant:
    for m in catalogue(op):
        if m.name == name:
            return m
    raise ValueError(f"{op} has no mutant {name!r}; known: {[m.name for m in catalogue(op)]}")
