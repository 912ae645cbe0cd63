"""Op B: ``nvfp4_qkv_rope`` (SOL-ExecBench Quant/028), reference and plain-torch paths.

Stages (SPEC.md):

1. ``act_quant`` x_hat: the activations quantized to NVFP4 by the benchmark's quantizer
                 (``nvfp4.quantize_activations``: float32 scale arithmetic), dequantized exactly
2. ``dequant``  W[n, k] = e2m1(code[n, k]) * e4m3(scale[n, k // 16]) * global_decode_scale
3. ``proj``     q, k, v = x_hat W^T
4. ``qk_norm``  per token and head over head_dim: t * rsqrt(mean(t^2) + eps) * norm_weight
5. ``rope``     t*cos + rotate_half(t)*sin, cos/sin [B, S, D] broadcast over heads (q, k only)
6. ``layout``   [B, S, h, D] -> [B, h, S, D] (the oracle keeps it unrounded; outputs are bf16)

The ``w4a16`` variant (``activations="bf16"``: the bf16 activations used as they are, what
Hopper serving kernels usually do) has no ``act_quant`` stage.
"""
from __future__ import annotations

import functools
import weakref
from typing import Any, Mapping, MutableMapping

import torch

from .. import load
from ...refimpl import nvfp4
from ...refimpl import stages as st
from ...validate import accepts_benchmark_dtypes, bind_axes
from ...inputs import input_generator

NAME = "nvfp4_qkv_rope"

__all__ = ["reference", "reference_fp32", "reference_w4a16", "torch_eager", "torch_cached_bf16",
           "dequantize_torch", "sol_reference", "benchmark_inputs", "ACTIVATIONS"]

# what the projection multiplies: the NVFP4-quantized activations (the benchmark, W4A4)
# or the bf16 activations as given (the w4a16 variant)
ACTIVATIONS = ("nvfp4", "bf16")


@accepts_benchmark_dtypes
def reference(hidden_states, cos, sin,
              q_proj_weight_fp4, q_proj_scale, q_proj_global_decode_scale,
              k_proj_weight_fp4, k_proj_scale, k_proj_global_decode_scale,
              v_proj_weight_fp4, v_proj_scale, v_proj_global_decode_scale,
              q_norm_weight, k_norm_weight, rms_norm_eps, *,
              taps: MutableMapping[str, torch.Tensor] | None = None,
              override: Mapping[str, torch.Tensor] | None = None,
              dtype: torch.dtype = torch.float64, validate: bool = True,
              stages=st, codec=nvfp4, activations: str = "nvfp4"):
    """The oracle: the benchmark's activation quantizer exactly as defined (float32 scale
    arithmetic), exact dequantization (bit-level codec), every later stage in ``dtype``.

    Returns (query_states, key_states, value_states) in ``dtype``, unrounded.
    ``taps`` receives each stage's output: ``act_quant`` [B,S,H] (x_hat; with it
    ``act_quant.codes`` uint8 [B,S,H], ``act_quant.scales`` uint8 e4m3 bits [B,S,H/16] and
    ``act_quant.global_decode`` 0-d float32), ``dequant`` [q+2kv, H], ``proj`` [B,S,q+2kv],
    ``qk_norm`` and ``rope`` [B,S,q+kv], ``layout`` [B, Hq+2Hkv, S, D].
    ``override``: {stage: tensor} replaces that stage's output and continues from it.
    ``stages`` / ``codec``: namespaces of stage functions and of the NVFP4 codec
    (mutation tests swap one function out). ``activations``: "nvfp4" (the benchmark) or
    "bf16" (the ``w4a16`` variant: no ``act_quant`` stage)."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations: expected one of {ACTIVATIONS}, got {activations!r}")
    args = (hidden_states, cos, sin, q_proj_weight_fp4, q_proj_scale, q_proj_global_decode_scale,
            k_proj_weight_fp4, k_proj_scale, k_proj_global_decode_scale, v_proj_weight_fp4,
            v_proj_scale, v_proj_global_decode_scale, q_norm_weight, k_norm_weight, rms_norm_eps)
    if validate:
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

    # 0. act_quant: codes and scales exactly as the benchmark's float32 quantizer makes
    # them, over all B*S tokens at once (one global amax); x_hat exact in float64
    if activations == "nvfp4":
        def quantize():
            aq = codec.quantize_activations(hidden_states)
            if taps is not None:
                taps["act_quant.codes"], taps["act_quant.scales"] = aq.codes, aq.scales
                taps["act_quant.global_decode"] = aq.global_decode
            return aq.dequantize(dtype)
        act = stage("act_quant", quantize)

    # 1. dequant: exact in float64 (every e2m1 x e4m3 x fp32 product is representable)
    w = stage("dequant", lambda: torch.cat([
        codec.dequantize_nvfp4(q_proj_weight_fp4, q_proj_scale, float(q_proj_global_decode_scale), dtype),
        codec.dequantize_nvfp4(k_proj_weight_fp4, k_proj_scale, float(k_proj_global_decode_scale), dtype),
        codec.dequantize_nvfp4(v_proj_weight_fp4, v_proj_scale, float(v_proj_global_decode_scale), dtype)]))

    # 2. proj: one matmul against the stacked [Wq; Wk; Wv]
    b, s, _ = hidden_states.shape
    x = act if activations == "nvfp4" else hidden_states.to(dtype)
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


@accepts_benchmark_dtypes
def reference_fp32(*inputs, taps=None, activations: str = "nvfp4"):
    """The reference computed in float32 (the benchmark's quantizer, exact dequantization,
    fp32 math), outputs rounded to bf16 like any implementation's: the "same formulas,
    naive order" baseline."""
    return tuple(t.to(torch.bfloat16)
                 for t in reference(*inputs, taps=taps, dtype=torch.float32, activations=activations))


reference_w4a16 = functools.partial(reference, activations="bf16")
reference_w4a16.__doc__ = "The oracle of the ``w4a16`` variant: bf16 activations, no act_quant stage."
reference_fp32_w4a16 = functools.partial(reference_fp32, activations="bf16")


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


def _quantize_activations_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The benchmark's activation quantizer as a torch user writes it: float32 scale
    arithmetic, torch's float8 cast, a bucketize onto the e2m1 thresholds. Returns
    (e2m1(code) * e4m3(scale) in bf16 [..., K] (exact), global_decode 0-d float32)."""
    xf = x.float()
    f32_max = torch.finfo(torch.float32).max
    # torch.div, not `2688.0 / t`: torch computes a Python number over a tensor as
    # t.reciprocal() * 2688, two roundings that flip about a quarter of the global scales
    global_encode = torch.clamp(torch.div(2688.0, xf.abs().max()), max=f32_max)
    global_encode = torch.where(global_encode == 0, torch.ones_like(global_encode), global_encode)
    global_decode = 1.0 / global_encode
    blocks = xf.unflatten(-1, (-1, 16))
    # times fl32(1/6), as torch divides by a number on the GPU (the benchmark's quantizer)
    scale = torch.clamp(blocks.abs().amax(-1) * (1.0 / 6.0) * global_encode, -448.0, 448.0)
    scale = scale.to(torch.float8_e4m3fn).float()
    encode = torch.clamp(1.0 / (scale * global_decode), max=f32_max)
    y = torch.clamp(blocks * encode[..., None], -6.0, 6.0)
    # |y| onto the e2m1 grid by its thresholds (right=True: a tie at an odd-grid boundary
    # goes down, at an even one up, as round-to-nearest-even does)
    a = y.abs()
    bounds_down = torch.tensor([0.25, 1.25, 2.5, 5.0], device=x.device)
    bounds_up = torch.tensor([0.75, 1.75, 3.5], device=x.device)
    mag = (torch.bucketize(a, bounds_down, right=False) + torch.bucketize(a, bounds_up, right=True))
    grid = torch.tensor(_E2M1_MAGNITUDES, device=x.device)
    values = torch.where(y < 0, -grid[mag], grid[mag])
    return (values * scale[..., None]).flatten(-2).to(torch.bfloat16), global_decode


def _project_norm_rope(x, cos, sin, weights, q_norm_weight, k_norm_weight, eps, quantize=True):
    """bf16 matmuls (fp32 accumulate) of the quantized activations with the weights'
    ``code * scale`` (exact in bf16), both global decode scales applied to the result in
    fp32 (as the block-scaled GEMM does), q/k norm and RoPE in fp32, bf16 outputs.
    ``weights``: ((bf16 code*scale [N, K], global decode scale) for q, k, v)."""
    d = cos.shape[-1]
    b, s, _ = x.shape
    if quantize:
        x, global_decode = _quantize_activations_torch(x)
    else:
        global_decode = torch.ones((), device=x.device)
    q, k, v = ((x @ w.T).float() * (global_decode * torch.tensor(float(g), device=x.device))
               for w, g in weights)
    q, k, v = q.view(b, s, -1, d), k.view(b, s, -1, d), v.to(torch.bfloat16).view(b, s, -1, d)

    def norm(t, w):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w.float()

    c, sn = cos.float()[:, :, None], sin.float()[:, :, None]
    q = st.rope(norm(q, q_norm_weight), c, sn)
    k = st.rope(norm(k, k_norm_weight), c, sn)
    return tuple(t.to(torch.bfloat16).transpose(1, 2).contiguous() for t in (q, k, v))


@accepts_benchmark_dtypes
def torch_eager(hidden_states, cos, sin,
                q_proj_weight_fp4, q_proj_scale, q_proj_global_decode_scale,
                k_proj_weight_fp4, k_proj_scale, k_proj_global_decode_scale,
                v_proj_weight_fp4, v_proj_scale, v_proj_global_decode_scale,
                q_norm_weight, k_norm_weight, rms_norm_eps, *, activations: str = "nvfp4"):
    """Plain torch, quantizing the activations and dequantizing the weights to bf16 on
    every call."""
    weights = [(dequantize_torch(p, sc, 1.0), g) for p, sc, g in (
        (q_proj_weight_fp4, q_proj_scale, q_proj_global_decode_scale),
        (k_proj_weight_fp4, k_proj_scale, k_proj_global_decode_scale),
        (v_proj_weight_fp4, v_proj_scale, v_proj_global_decode_scale))]
    return _project_norm_rope(hidden_states, cos, sin, weights, q_norm_weight, k_norm_weight,
                              float(rms_norm_eps), quantize=activations == "nvfp4")


# bf16 code*scale weights cached per (packed weight, scale), dropped when the weight
# tensor dies; tensor version counters detect in-place changes of either tensor
_BF16_CACHE: dict[tuple, tuple[tuple[int, int], torch.Tensor]] = {}


def _cached_weight(packed, scale):
    key = (id(packed), id(scale))
    versions = (packed._version, scale._version)
    entry = _BF16_CACHE.get(key)
    if entry is None or entry[0] != versions:
        if entry is None:
            weakref.finalize(packed, _BF16_CACHE.pop, key, None)
        entry = (versions, dequantize_torch(packed, scale, 1.0))
        _BF16_CACHE[key] = entry
    return entry[1]


@accepts_benchmark_dtypes
def torch_cached_bf16(hidden_states, cos, sin,
                      q_proj_weight_fp4, q_proj_scale, q_proj_global_decode_scale,
                      k_proj_weight_fp4, k_proj_scale, k_proj_global_decode_scale,
                      v_proj_weight_fp4, v_proj_scale, v_proj_global_decode_scale,
                      q_norm_weight, k_norm_weight, rms_norm_eps, *, activations: str = "nvfp4"):
    """Plain torch with the bf16 weights (code*scale) dequantized once per weight tensor and cached
    (the "weights already dequantized" baseline of the benchmark); the activations are
    quantized on every call."""
    weights = [(_cached_weight(q_proj_weight_fp4, q_proj_scale), q_proj_global_decode_scale),
               (_cached_weight(k_proj_weight_fp4, k_proj_scale), k_proj_global_decode_scale),
               (_cached_weight(v_proj_weight_fp4, v_proj_scale), v_proj_global_decode_scale)]
    return _project_norm_rope(hidden_states, cos, sin, weights, q_norm_weight, k_norm_weight,
                              float(rms_norm_eps), quantize=activations == "nvfp4")


torch_eager_w4a16 = functools.partial(torch_eager, activations="bf16")
torch_cached_bf16_w4a16 = functools.partial(torch_cached_bf16, activations="bf16")


# --------------------------------------------------------------------------- the benchmark's reference
@torch.no_grad()
@accepts_benchmark_dtypes
def sol_reference(hidden_states, cos, sin,
                  q_proj_weight_fp4, q_proj_scale, q_proj_global_decode_scale,
                  k_proj_weight_fp4, k_proj_scale, k_proj_global_decode_scale,
                  v_proj_weight_fp4, v_proj_scale, v_proj_global_decode_scale,
                  q_norm_weight, k_norm_weight, rms_norm_eps, *, activations: str = "nvfp4"):
    """What SOL-ExecBench Quant/028 compares against, in its own precision (SPEC.md),
    runnable anywhere (the benchmark's own needs Blackwell's FP4 GEMM):

    * the activations quantized by the benchmark's quantizer;
    * the block-scaled FP4 x FP4 GEMM computed exactly (float64 on the exact
      e2m1 x e4m3 operands) and rounded to bf16, as cuBLAS returns it;
    * times the product of the two global decode scales (a float32 product, then rounded
      to bf16 as torch does on the GPU for a bf16 tensor times a 0-d fp32 tensor), rounded
      to bf16;
    * q/k RMSNorm in float32, the weight applied in float32, the result rounded to bf16;
    * RoPE in bf16: each product and the sum rounded to bf16.
    ``activations="bf16"``: the same with the bf16 activations as the GEMM's A operand."""
    b, s, hidden = hidden_states.shape
    d = cos.shape[-1]
    eps = float(rms_norm_eps)
    x = hidden_states.reshape(b * s, hidden)
    if activations == "nvfp4":
        aq = nvfp4.quantize_activations(x)
        xs, g_act = aq.scaled_codes(torch.float64), aq.global_decode
    else:
        xs, g_act = x.to(torch.float64), torch.ones((), dtype=torch.float32, device=x.device)

    def gemm(packed, scale, global_decode):
        ws = nvfp4.dequantize_nvfp4(packed, scale, 1.0, torch.float64)
        raw = (xs @ ws.T).to(torch.bfloat16)
        g = g_act * torch.tensor(float(global_decode), dtype=torch.float32, device=x.device)
        # bf16 tensor times a 0-d fp32 tensor: on the GPU torch casts the scalar to bf16
        # first (measured on an H200; the CPU would keep it in fp32), then rounds the product
        return (raw.float() * g.to(torch.bfloat16).float()).to(torch.bfloat16)

    def norm(t, w):
        t32 = t.float()
        return (w * (t32 * torch.rsqrt(t32.pow(2).mean(-1, keepdim=True) + eps))).to(torch.bfloat16)

    def rope(t):
        c, sn = cos[:, None], sin[:, None]
        return t * c + st.rotate_half(t) * sn        # bf16 x bf16: every op rounded to bf16

    q = gemm(q_proj_weight_fp4, q_proj_scale, q_proj_global_decode_scale).view(b, s, -1, d)
    k = gemm(k_proj_weight_fp4, k_proj_scale, k_proj_global_decode_scale).view(b, s, -1, d)
    v = gemm(v_proj_weight_fp4, v_proj_scale, v_proj_global_decode_scale).view(b, s, -1, d)
    q = rope(norm(q, q_norm_weight).transpose(1, 2))
    k = rope(norm(k, k_norm_weight).transpose(1, 2))
    return q.contiguous(), k.contiguous(), v.transpose(1, 2).contiguous()


sol_reference_w4a16 = functools.partial(sol_reference, activations="bf16")


# --------------------------------------------------------------------------- the benchmark's inputs
def benchmark_inputs(defn, axes: Mapping[str, int], seed: int, device="cpu") -> dict[str, Any]:
    """The inputs Quant/028 draws with its own generator (SPEC.md), for any configuration:
    hidden_states, cos and sin plain randn in bf16 (cos and sin independent, unbounded);
    each weight matrix randn(float32) * 0.02 quantized with the benchmark's quantizer
    (``nvfp4.quantize_activations``: positive e4m3 block scales, global decode scale
    amax(W) / 2688); norm weights ones; eps 1e-6. One generator per input name, on
    ``device``."""
    out: dict[str, Any] = {}
    for spec in defn.inputs:
        if spec.name in out:
            continue
        g = input_generator(seed, spec.name, device)
        shape = defn.shape_of(spec, axes)
        if spec.is_scalar:
            out[spec.name] = float(spec.value) if spec.value is not None else None
        elif spec.dtype == "float4_e2m1fn_x2":
            prefix = spec.name[: -len("weight_fp4")]
            w = torch.randn(shape[:-1] + (shape[-1] * 2,), generator=g, dtype=torch.float32,
                            device=g.device) * 0.02
            aq = nvfp4.quantize_activations(w)
            out[spec.name] = aq.packed
            out[prefix + "scale"] = aq.scales.view(torch.float8_e4m3fn)
            out[prefix + "global_decode_scale"] = float(aq.global_decode)
        elif spec.name.endswith("norm_weight"):
            out[spec.name] = torch.ones(shape, dtype=torch.bfloat16, device=g.device)
        else:
            out[spec.name] = torch.randn(shape, generator=g, dtype=torch.float32,
                                         device=g.device).to(torch.bfloat16)
    return out


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
