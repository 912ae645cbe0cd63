"""The NVFP4 QKV projection's mutant catalogue: the reference with one real, subtle bug
each (see :mod:`fuseval.operators.mutants`), in the activation quantizer, the NVFP4 codec,
the projection, the q/k norm, RoPE and the output layout. The property suite must reject
every one in the ``ci`` profile; the table is in docs/properties.md."""
from __future__ import annotations

import torch

from ..mutants import Mutant, copy_input, first_batch_item, make, namespace, swap_inputs
from ...refimpl import nvfp4
from ...refimpl import stages as st

__all__ = ["catalogue", "rope_half_swapped", "rope_interleaved", "rms_norm_eps_outside", "rms_norm_no_eps",
           "dequant_with", "block_off_by_one", "decode_e4m3_nan_as_zero"]

NAME = "nvfp4_qkv_rope"


# --------------------------------------------------------------------------- broken stage functions
def rope_half_swapped(t, cos, sin):
    """RoPE with rotate_half = concat(t[D/2:], -t[:D/2]): the minus sign on the wrong half
    (a rotation by -theta)."""
    half = t.shape[-1] // 2
    return t * cos + torch.cat([t[..., half:], -t[..., :half]], dim=-1) * sin


def rope_interleaved(t, cos, sin):
    """GPT-J style RoPE (pairs (2i, 2i+1)) applied to rotate_half tables."""
    rot = torch.stack([-t[..., 1::2], t[..., 0::2]], dim=-1).flatten(-2)
    return t * cos + rot * sin


def rms_norm_eps_outside(x, weight, eps):
    """x / (sqrt(mean(x^2)) + eps) * weight: eps outside the square root."""
    return x / (x.pow(2).mean(dim=-1, keepdim=True).sqrt() + eps) * weight


def rms_norm_no_eps(x, weight, eps):
    """x * rsqrt(mean(x^2)) * weight: eps dropped."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True)) * weight


def _rms_norm_over_heads(x, weight, eps):
    """Normalises over every head of the token ([..., heads, D] -> last two axes)."""
    return x * torch.rsqrt(x.pow(2).mean(dim=(-2, -1), keepdim=True) + eps) * weight


def _linear_drops_last_block(x, weight, bias=None):
    """x W^T with the reduction loop stopping one 16-column block early (a K-tail bug)."""
    y = x[..., :-16] @ weight[:, :-16].transpose(-1, -2)
    return y if bias is None else y + bias


def _identity_quantizer(x: torch.Tensor) -> "nvfp4.ActivationQuant":
    """The activations used as they are (weight-only NVFP4), dressed as a quantizer output."""
    class Unquantized(nvfp4.ActivationQuant):
        def dequantize(self, dtype=torch.float64):
            return x.to(dtype)
    aq = nvfp4.quantize_activations(x)
    return Unquantized(aq.codes, aq.scales, aq.global_decode, aq.global_encode)


def _quantizer_per_token_amax(x: torch.Tensor) -> "nvfp4.ActivationQuant":
    return nvfp4.quantize_activations(x, amax_over="token")


# NVFP4 codec pieces ---------------------------------------------------------
def dequant_with(*, unpack=None, decode_codes=None, decode_scales=None, column_block=None, use_global=True):
    """dequantize_nvfp4 with one piece replaced (all else as the bit-level codec)."""
    def dequantize(packed, scales, global_decode_scale, dtype=torch.float64):
        codes = (unpack or nvfp4.unpack_fp4)(packed)
        values = (decode_codes or (lambda c: nvfp4.decode_e2m1(c)))(codes)
        bs = (decode_scales or (lambda s: nvfp4.decode_e4m3fn(s)))(scales)
        k = values.shape[-1]
        blocks = column_block(k, bs.shape[-1]) if column_block else torch.arange(k, device=packed.device) // 16
        per_column = bs[..., blocks]
        g = float(global_decode_scale) if use_global else 1.0
        return (values * per_column * g).to(dtype)
    return dequantize


def _unpack_high_first(packed):
    return torch.stack((packed >> 4, packed & 0xF), dim=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def block_off_by_one(k: int, n_blocks: int) -> torch.Tensor:
    """Column k uses block (k + 1) // 16: the last column of every block reads the next scale."""
    return ((torch.arange(k) + 1) // 16).clamp(max=n_blocks - 1)


def _decode_e2m1_unsigned(codes):
    return nvfp4.decode_e2m1(codes & 0x7)


def _decode_e4m3_subnormal_as_normal(bits):
    """Exponent field 0 decoded as a normal number (1 + m/8) * 2^-7 instead of m/8 * 2^-6."""
    b = bits.view(torch.uint8) if bits.dtype == torch.float8_e4m3fn else bits
    value = nvfp4.decode_e4m3fn(b)
    b = b.to(torch.int32)
    exp, mant, sign = (b >> 3) & 0xF, (b & 7).to(torch.float64), torch.where((b >> 7) == 1, -1.0, 1.0)
    wrong = sign * (1 + mant / 8) * 2.0 ** -7
    return torch.where(exp == 0, wrong.to(value.dtype), value)


def decode_e4m3_nan_as_zero(bits):
    """A NaN e4m3 code decoded as 0."""
    return nvfp4.decode_e4m3fn(bits).nan_to_num(0.0)


def _decode_e4m3_abs(bits):
    return nvfp4.decode_e4m3fn(bits).abs()


# --------------------------------------------------------------------------- layout rewrites
def _parts(taps, v):
    """(q_rot, k_rot, v_proj) [B, S, n] from the taps, and the head_dim."""
    d = v["cos"].shape[-1]
    rows = [v["q_proj_weight_fp4"].shape[0], v["k_proj_weight_fp4"].shape[0], v["v_proj_weight_fp4"].shape[0]]
    qr, kr = torch.split(taps["rope"], rows[:2], dim=-1)
    vv = torch.split(taps["proj"], rows, dim=-1)[2]
    return qr, kr, vv, d


def _layout(parts, d, transpose=True):
    b, s, _ = parts[0].shape
    if transpose:
        heads = [t.reshape(b, s, -1, d).transpose(1, 2) for t in parts]
    else:
        heads = [t.reshape(b, -1, s, d) for t in parts]
    return torch.cat(heads, dim=1).contiguous()


def _layout_no_transpose(taps, v):
    qr, kr, vv, d = _parts(taps, v)
    return _layout([qr, kr, vv], d, transpose=False)


def _rope_on_v(taps, v):
    qr, kr, vv, d = _parts(taps, v)
    b, s, _ = vv.shape
    c, sn = v["cos"].float()[:, :, None], v["sin"].float()[:, :, None]
    vr = st.rope(vv.reshape(b, s, -1, d), c, sn).flatten(2)
    return _layout([qr, kr, vr], d)


def _norm_on_v(taps, v):
    qr, kr, vv, d = _parts(taps, v)
    b, s, _ = vv.shape
    vn = st.rms_norm(vv.reshape(b, s, -1, d), v["k_norm_weight"].float(), float(v["rms_norm_eps"])).flatten(2)
    return _layout([qr, kr, vn], d)


def catalogue() -> list[Mutant]:
    """Every mutant of the NVFP4 QKV projection (21, over all six stages)."""
    S = lambda **kw: {"stages": namespace(st, **kw)}
    C = lambda **kw: {"codec": namespace(nvfp4, dequantize_nvfp4=dequant_with(**kw))}
    Q = lambda quantizer: {"codec": namespace(nvfp4, quantize_activations=quantizer)}
    m = lambda *args, **kw: make(NAME, *args, **kw)
    return [
        m("activations_not_quantized", "act_quant",
          "the bf16 activations multiply the weights as they are (weight-only W4A16) instead of "
          "their NVFP4 quantization", reference_kwargs=Q(_identity_quantizer)),
        m("act_amax_per_token", "act_quant",
          "the activation quantizer takes one global amax per token instead of one per tensor",
          reference_kwargs=Q(_quantizer_per_token_amax)),
        m("nibble_order_swapped", "dequant", "the high nibble is taken as the even column",
          reference_kwargs=C(unpack=_unpack_high_first)),
        m("scale_block_off_by_one", "dequant",
          "column k uses scale block (k + 1) // 16 (the last column of each block reads the next scale)",
          reference_kwargs=C(column_block=block_off_by_one)),
        m("global_scale_missing", "dequant", "the global decode scale is never applied",
          reference_kwargs=C(use_global=False)),
        m("e2m1_sign_ignored", "dequant", "e2m1 sign bit ignored (codes 8..15 decode positive)",
          reference_kwargs=C(decode_codes=_decode_e2m1_unsigned)),
        m("e4m3_subnormal_as_normal", "dequant", "e4m3 exponent 0 decoded as (1 + m/8) 2^-7 instead of m/8 2^-6",
          reference_kwargs=C(decode_scales=_decode_e4m3_subnormal_as_normal)),
        m("nan_scale_decoded_as_zero", "dequant", "a NaN e4m3 scale code decodes to 0",
          reference_kwargs=C(decode_scales=decode_e4m3_nan_as_zero)),
        m("negative_scale_as_positive", "dequant", "negative e4m3 scales lose their sign",
          reference_kwargs=C(decode_scales=_decode_e4m3_abs)),
        m("proj_k_loop_drops_last_block", "proj", "the projection's reduction over hidden_size skips the last 16 columns",
          reference_kwargs=S(linear=_linear_drops_last_block)),
        m("qk_norm_over_heads", "qk_norm", "q/k RMSNorm over all heads of a token instead of per head over head_dim",
          reference_kwargs=S(rms_norm=_rms_norm_over_heads)),
        m("qk_norm_eps_outside_sqrt", "qk_norm", "q/k RMSNorm divides by sqrt(mean(t^2)) + eps",
          reference_kwargs=S(rms_norm=rms_norm_eps_outside)),
        m("qk_norm_eps_dropped", "qk_norm", "q/k RMSNorm without eps", reference_kwargs=S(rms_norm=rms_norm_no_eps)),
        m("q_uses_k_norm_weight", "qk_norm", "q is normalised with k_norm_weight",
          transform=copy_input("q_norm_weight", "k_norm_weight")),
        m("rope_half_swap", "rope", "rotate_half puts the minus sign on the first half (concat(t2, -t1))",
          reference_kwargs=S(rope=rope_half_swapped)),
        m("rope_interleaved", "rope", "GPT-J style RoPE on pairs (2i, 2i+1) instead of (i, i + D/2)",
          reference_kwargs=S(rope=rope_interleaved)),
        m("cos_sin_swapped", "rope", "cos and sin inputs exchanged", transform=swap_inputs("cos", "sin")),
        m("cos_sin_of_first_batch_item", "rope", "every batch item uses batch item 0's cos/sin",
          transform=first_batch_item("cos", "sin", axis=0)),
        m("layout_without_transpose", "layout", "[B,S,h,D] reshaped to [B,h,S,D] instead of transposed",
          rewrite=_layout_no_transpose),
        m("rope_applied_to_v", "layout", "RoPE also applied to value_states", rewrite=_rope_on_v),
        m("norm_applied_to_v", "layout", "value_states normalised with k_norm_weight", rewrite=_norm_on_v),
    ]
