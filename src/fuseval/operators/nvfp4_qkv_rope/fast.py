"""Op B fast path: ``nvfp4_qkv_rope`` as an activation quantizer and one fused GEMM kernel.

The benchmark's semantics are W4A4 (SPEC.md, op B, stage ``act_quant``): ``forward``
first quantizes x with the benchmark's own float32 NVFP4 quantizer, then runs the fused
kernel on the quantized activations. ``forward_w4a16`` (the operator's ``w4a16`` variant)
runs the same fused kernel on the bf16 activations as given.

**The quantizer** (``act_quant``: ``_amax_partials_kernel`` then ``_act_quant_kernel``, two
launches, no host synchronisation) is bit for bit ``refimpl.nvfp4.quantize_activations``:
a global amax, per 16-block e4m3 scales and e2m1 codes, every step one IEEE float32
operation (divisions by ``tl.math.div_rn``, no product feeding an addition, e4m3 rounding
in integer arithmetic). It writes xs = e2m1(code) * e4m3(scale), exact in bf16 (2 x 4
significant bits), and gs[p] = global_decode_p(weights) * global_decode(x) (fp32, on the
device). The fused kernel then reads xs where it read x and gs where it read the weights'
global scales: no new operand, and the products xs * (code * scale) are exact in the
tensor cores, so the only roundings are the fp32 accumulation, gs and the final bf16.

What the fused kernel computes, for every token m of the B*S tokens and every head tile
(32 q heads, 8 k heads, 8 v heads at seed size, one launch for all 48), with a = xs
(W4A4) or x (W4A16) and g = gs[p] or the weights' global decode scale:

    acc[m, :] = sum_k a[m, k] * e2m1(code[n, k]) * e4m3(scale[n, k // 16])   (fp32)
    t         = acc * g                                                       (fp32)
    q, k:       t = rope(rms_norm(t)) over the head's D columns               (fp32)
    out[b, head, s, :] = bf16(t)

Design, and why:

* **No dequantized weight copy.** Each K step loads the packed FP4 codes (as int32 words,
  8 codes each) and the e4m3 scale bytes of the tile and decodes them in registers by bit
  arithmetic: an e2m1 code ``s.ee.m`` moved to fp32 bits 31 and 24..22 is its value times
  2^-126 (code 0.5 becomes the fp32 subnormal 2^-127), an e4m3 byte ``s.eeee.mmm`` moved to
  fp32 bits 31 and 26..20 is its value times 2^-120; two exact multiplies by 2^119 and one
  fp32 product give ``code * scale * 2^-8`` exactly (see ``_decode_nvfp4``), and the 2^8 is
  folded into the global scale.
* **bf16 MMA, exactly.** An e2m1 value has 2 significant bits and an e4m3 value 4, so
  their product has at most 6 and (range 2^-10 .. 2688, times 2^-8) is exactly
  representable in bf16: the bf16 weight operand is the exact ``code * scale``. The fp32
  global scale is applied once to the fp32 accumulator in the epilogue. With bf16
  activations the products in the tensor cores are exact too, so the only roundings are
  the fp32 accumulation and the final bf16 store: the fast path is *more* accurate than a
  torch path that first rounds ``code * scale * global`` to bf16 and then rounds the
  projection to bf16 before the norm (measured: benchmarks/notes_nvfp4_qkv_rope.md).
* **Which operand the weights are.** On the GPU the tile table (``H200_CONFIGS``) uses the
  transposed product ``acc^T = W x^T`` (``KernelConfig.w_as_a``): the decoded weights feed
  the tensor cores from registers (wgmma's A operand) while x streams from shared memory,
  so the decode of one K step overlaps the asynchronous MMAs of the previous one. The
  plain orientation (W^T staged through shared memory) and two heads per tile are kept as
  options for the sweep.
* **One N tile = one head** (or two, ``heads_per_tile``). The tile's columns are the
  head's two RoPE halves (``[0, HP)`` = d in [0, D/2), ``[HP, 2HP)`` = d in [D/2, D), each half padded to a power
  of two >= 8 so that tiny head dims still make legal dot shapes). The epilogue thus holds
  the whole head row (the RMS norm reduces over it) and each column's rotate_half partner
  (same position in the other half), so norm and RoPE are register-local.
* **Layout in the store.** Token m = b*S + s of head h is written at
  ``((b*heads + h)*S + s)*D + d``: the [B, S, h, D] -> [B, h, S, D] transpose costs nothing.
* **Ragged sizes.** Token rows are masked (M = B*S need not be a multiple of BM); the K
  loop is masked in 16-column steps when BK does not divide hidden_size.
* **Interpreter.** Under ``TRITON_INTERPRET=1`` (inputs on the CPU) the dot runs on fp32
  operands (the interpreter does not do bf16 arithmetic); the values are the same exact
  ``code * scale`` and bf16 activations, so both paths compute the same function. The
  interpreter's fp32 -> bf16 cast truncates, so ``_to_bf16`` rounds to nearest even there
  by hand (the compiled cast already does).

* **Hopper: a Gluon kernel.** On an sm_90 GPU the production call (``forward`` with the
  default table, head_dim 128) runs ``operators/nvfp4_qkv_rope/_gluon.py`` instead: the same decode and
  epilogue arithmetic, but with explicit layouts, so that the decoded tile goes straight
  into the swizzled shared-memory layout the tensor cores read (no second shuffle), x
  arrives by TMA, and the product is transposed (tokens as the wgmma's N). Mutants,
  stage taps, other head sizes and the interpreter use the Triton kernel below (the
  tests run both; ``TRITON_FOR_GLUON`` picks its config). Measured and explained in
  benchmarks/notes_nvfp4_qkv_rope.md.

The module also carries the stage-tap protocol (``forward.staged``, ``forward_w4a16.staged``):
the same quantizer, decode, GEMM, norm and RoPE code run as separate launches that expose
each SPEC stage, and deliberately broken *mutants* (``MUTANTS``: constexpr ``MUTANT`` of the
fused kernel, and two of the quantizer: activations not quantized, amax per token) that
the tests use to prove the checks catch each kind of bug.

Measured on the H200 (benchmarks/probe_nvfp4_act_quant.py): the quantizer's GPU time is
0.080 ms at 8192 tokens (2.5 TB/s of x, x, xs traffic) and 0.026 ms at 2048; the W4A4
forward's GPU time is within 5% of forward_w4a16's over the 16 cases (0.488 vs 0.467 ms);
called eagerly, small cases are bound by the host's launch work (about 0.12 ms more than
forward_w4a16's at 2048 tokens).
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Mapping, MutableMapping

import torch
from ... import fast as _kernel_runtime  # noqa: F401  (before triton: selects the interpreter on CPU-only machines)
import triton
import triton.language as tl

from ...definitions import load
from ...fast._graphs import GraphCache, tensor_key

NAME = "nvfp4_qkv_rope"

__all__ = ["forward", "forward_staged", "forward_w4a16", "forward_w4a16_staged", "act_quant", "ActQuant",
           "KernelConfig", "pick_config", "MUTANTS", "STAGES", "STAGES_W4A16"]

# --------------------------------------------------------------------------- mutants
# Each value breaks exactly one thing the SPEC fixes; 0 is the production kernel.
MUTANTS = {
    "swapped_nibbles": 1,      # high nibble taken as the even column
    "scale_wrong_block": 2,    # element k scaled by block (k // 16 + 1) instead of k // 16
    "no_global_scale": 3,      # fp32 global decode scale never applied
    "norm_wrong_axis": 4,      # RMS over the tile's tokens instead of head_dim
    "rope_halves_swapped": 5,  # rotate_half(t) = concat(t2, -t1) instead of concat(-t2, t1)
    "layout_bshd": 6,          # output written [B, S, h, D] instead of [B, h, S, D]
    "gqa_head_shift": 7,       # k head i computed from the weights of k head i+1
    # the activation quantizer (forward only; the GEMM kernel runs unchanged)
    "weight_only_activations": 8,   # x not quantized: the bf16 activations multiplied as given
    "per_token_amax": 9,            # the quantizer's amax (global scale) per token, not per tensor
}
_QUANT_MUTANTS = (MUTANTS["weight_only_activations"], MUTANTS["per_token_amax"])

# what the modes of the fused kernel write
_MODE_FULL = 0   # norm + rope + layout, bf16 outputs (production)
_MODE_PROJ = 1   # the fp32 projection (acc * global scale) into a [M, N] buffer (stage taps)


# --------------------------------------------------------------------------- device code
@triton.jit
def _nibble_f32(v, I: tl.constexpr):
    """Code I (bits 4I..4I+3) of uint32 words v as fp32 = e2m1 value * 2^-126: the magnitude
    bits s.ee.m go to fp32 bits 24..22 (exponent field ee, first mantissa bit m) and the sign
    to bit 31. Code 1 (0.5) becomes the fp32 subnormal 2^-127, which the compiled fp32
    multiply keeps (no flush-to-zero), as does numpy."""
    if 4 * I <= 22:
        mag = (v << (22 - 4 * I)) & 0x01C00000
    else:
        mag = (v >> (4 * I - 22)) & 0x01C00000
    sign = (v << (28 - 4 * I)) & 0x80000000
    return (mag | sign).to(tl.float32, bitcast=True)


@triton.jit
def _decode_nvfp4(words, scale_bits, R: tl.constexpr, BK: tl.constexpr, SWAP_NIBBLES: tl.constexpr):
    """Packed e2m1 codes as int32 words [R, BK/8] (code j of a word = column 8w + j, low
    nibble first, as the bytes lie in memory) and e4m3 scale bytes [R, BK/16] (int32) ->
    fp32 [R, BK] = e2m1 * e4m3 * 2^-8, exactly (the caller folds 2^8 into the global scale).

    Whole words keep the integer work at about three operations per code (two shifts and
    one three-input logic op) and one fp32 multiply, instead of unpacking bytes first."""
    v = words.to(tl.uint32, bitcast=True)
    # nested joins put code j of word w at position 8w + j: the outermost join picks bit 0
    # of j (even/odd code), the next bit 1, the innermost bit 2
    even = tl.join(tl.join(_nibble_f32(v, 0), _nibble_f32(v, 4)),
                   tl.join(_nibble_f32(v, 2), _nibble_f32(v, 6)))
    odd = tl.join(tl.join(_nibble_f32(v, 1), _nibble_f32(v, 5)),
                  tl.join(_nibble_f32(v, 3), _nibble_f32(v, 7)))
    if SWAP_NIBBLES:   # mutant: the high nibble of each byte taken as the even column
        w = tl.join(odd, even)
    else:
        w = tl.join(even, odd)
    w = tl.reshape(w, [R, BK // 16, 16])
    return tl.reshape(w * _e4m3_f32(scale_bits.to(tl.int32))[:, :, None], [R, BK])


@triton.jit
def _e4m3_f32(sb):
    """e4m3 bytes (int32) -> fp32 = value * 2^118: s.eeee.mmm goes to fp32 bits
    s.0000eeee.mmm0... (= value * 2^-120, e4m3 subnormals becoming fp32 subnormals), then
    * 2^119 * 2^119, so that the product with a nibble's value * 2^-126 (_nibble_f32) is
    value * scale * 2^-8, a normal fp32 number. s.1111.111 is e4m3's only NaN."""
    s = ((((sb & 0x7F) << 20) | ((sb & 0x80) << 24)).to(tl.uint32)).to(tl.float32, bitcast=True)
    s = (s * 6.64613997892458e+35) * 6.64613997892458e+35        # 2^119, twice
    return tl.where((sb & 0x7F) == 0x7F, float("nan"), s)


@triton.jit
def _head_weights(h, wq_ptr, sq_ptr, wk_ptr, sk_ptr, wv_ptr, sv_ptr, HQ: tl.constexpr, HKV: tl.constexpr,
                  D: tl.constexpr, KV_SHIFT: tl.constexpr):
    """Which projection global head h belongs to: the code and scale tensors and the first
    weight row of the head. KV_SHIFT (mutant): k head i takes the rows of k head i+1."""
    if h < HQ:
        w_base = wq_ptr
        s_base = sq_ptr
        row0 = h * D
    elif h < HQ + HKV:
        w_base = wk_ptr
        s_base = sk_ptr
        if KV_SHIFT:
            row0 = ((h - HQ + 1) % HKV) * D
        else:
            row0 = (h - HQ) * D
    else:
        w_base = wv_ptr
        s_base = sv_ptr
        row0 = (h - HQ - HKV) * D
    return w_base, s_base, row0


@triton.jit
def _rms_norm_halves(lo, hi, w_lo, w_hi, eps, D: tl.constexpr, WRONG_AXIS: tl.constexpr):
    """RMS norm of rows [lo | hi] (the two halves of one head) over head_dim, times weight."""
    if WRONG_AXIS:   # mutant: statistics over the tile's tokens instead of head_dim
        ss = tl.sum(lo * lo, 0) + tl.sum(hi * hi, 0)
        r = tl.math.rsqrt(ss * (1.0 / D) + eps)[None, :]
    else:
        ss = tl.sum(lo * lo, 1) + tl.sum(hi * hi, 1)
        r = tl.math.rsqrt(ss * (1.0 / D) + eps)[:, None]
    return lo * r * w_lo[None, :], hi * r * w_hi[None, :]


@triton.jit
def _rope_halves(lo, hi, c_lo, c_hi, s_lo, s_hi, SWAPPED: tl.constexpr):
    """t*cos + rotate_half(t)*sin with rotate_half([lo | hi]) = [-hi | lo]."""
    if SWAPPED:      # mutant: rotate_half = [hi | -lo]
        return lo * c_lo + hi * s_lo, hi * c_hi - lo * s_hi
    return lo * c_lo - hi * s_lo, hi * c_hi + lo * s_hi


@triton.jit
def _to_bf16(x, INTERP: tl.constexpr):
    """fp32 -> bf16, rounding to nearest even. The compiled cast does that; the interpreter's
    truncates, so there the rounding is done on the fp32 bits first (then truncation is exact)."""
    if INTERP:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(tl.bfloat16)


@triton.jit
def _store_head(out_ptr, lo, hi, tok, tok_mask, offs_d, d_mask, hl, S, NH,
                D: tl.constexpr, BSHD: tl.constexpr, INTERP: tl.constexpr):
    """Store one head's rows [lo | hi] (token-major tile) into [B, NH, S, D] bf16."""
    b = tok // S
    s = tok - b * S
    if BSHD:         # mutant: the [B, S, h, D] input layout kept
        row = ((b * S + s) * NH + hl).to(tl.int64) * D
    else:
        row = ((b * NH + hl) * S + s).to(tl.int64) * D
    mask = tok_mask[:, None] & d_mask[None, :]
    ptrs = out_ptr + row[:, None] + offs_d[None, :]
    tl.store(ptrs, _to_bf16(lo, INTERP), mask=mask)
    tl.store(ptrs + D // 2, _to_bf16(hi, INTERP), mask=mask)


@triton.jit
def _nvfp4_qkv_rope_kernel(
        x_ptr, cos_ptr, sin_ptr,
        wq_ptr, sq_ptr, wk_ptr, sk_ptr, wv_ptr, sv_ptr, wd_ptr,
        gs_ptr, gs_q, gs_k, gs_v,
        qn_ptr, kn_ptr, eps,
        q_out, k_out, v_out, proj_out,
        M, S,
        K: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HP: tl.constexpr,
        BM: tl.constexpr, BK: tl.constexpr,
        GS_FROM_PTR: tl.constexpr, W_DENSE: tl.constexpr, W_AS_A: tl.constexpr,
        HPT: tl.constexpr, SCALE_I32: tl.constexpr, INTERP: tl.constexpr, MODE: tl.constexpr,
        MUTANT: tl.constexpr):
    NT: tl.constexpr = HQ + 2 * HKV
    NTILES: tl.constexpr = NT // HPT     # HPT heads (of one projection) per N tile
    BN: tl.constexpr = HPT * 2 * HP
    HALF: tl.constexpr = D // 2
    PAD_HALF: tl.constexpr = HP != HALF
    EVEN_K: tl.constexpr = K % BK == 0
    KB: tl.constexpr = K // 16

    # heads vary fastest: the ~3 token tiles in flight share their x rows through L2
    pid = tl.program_id(0)
    h = (pid % NTILES) * HPT             # the tile's first head
    pid_m = pid // NTILES

    w_base, s_base, row0 = _head_weights(h, wq_ptr, sq_ptr, wk_ptr, sk_ptr, wv_ptr, sv_ptr, HQ, HKV, D,
                                         MUTANT == 7)
    # packed codes are read as int32 words (8 codes), scales as bytes or int32 words (4 blocks)
    w_base = w_base.to(tl.pointer_type(tl.int32))
    if SCALE_I32:
        s_base = s_base.to(tl.pointer_type(tl.int32))
    else:
        s_base = s_base.to(tl.pointer_type(tl.uint8))

    tok = pid_m * BM + tl.arange(0, BM)
    tok_mask = tok < M
    col = tl.arange(0, BN)
    half = col // HP
    cc = col % HP
    col_mask = cc < HALF
    # tile column -> offset inside the tile's heads: head j = col // (2 HP), RoPE half, index
    col_off = (half // 2) * D + (half % 2) * HALF + cc
    w_row = row0 + col_off                   # weight row of each tile column
    offs_k = tl.arange(0, BK)
    offs_kw = tl.arange(0, BK // 8)          # packed int32 words (8 codes each)
    offs_ks = tl.arange(0, BK // 16)

    x_ptrs = x_ptr + tok.to(tl.int64)[:, None] * K + offs_k[None, :]
    if W_DENSE:
        wd_ptrs = wd_ptr + (h * D + col_off).to(tl.int64)[:, None] * K + offs_k[None, :]
    w_ptrs = w_base + w_row.to(tl.int64)[:, None] * (K // 8) + offs_kw[None, :]
    if SCALE_I32:
        # scale bytes read as int32 words (4 blocks each): 4-byte accesses the pipeliner can
        # turn into asynchronous copies, where single bytes per thread stay synchronous loads
        offs_s4 = tl.arange(0, BK // 64)
        s_ptrs = s_base + w_row.to(tl.int64)[:, None] * (K // 64) + offs_s4[None, :]
    else:
        s_ptrs = s_base + w_row.to(tl.int64)[:, None] * KB + offs_ks[None, :]

    if W_AS_A:
        acc_t = tl.zeros([BN, BM], dtype=tl.float32)
    else:
        acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        if EVEN_K:
            x_mask = tok_mask[:, None]
            w_mask = col_mask[:, None]
            s_mask = col_mask[:, None]
        else:
            x_mask = tok_mask[:, None] & (offs_k[None, :] < K - k0)
            w_mask = col_mask[:, None] & (offs_kw[None, :] < (K - k0) // 8)
            s_mask = col_mask[:, None] & (offs_ks[None, :] < (K - k0) // 16)
        x = tl.load(x_ptrs, mask=x_mask, other=0.0)
        if W_DENSE:
            # stage-tap path: a dense (overridden) weight instead of the FP4 decode
            if EVEN_K:
                wd_mask = col_mask[:, None]
            else:
                wd_mask = col_mask[:, None] & (offs_k[None, :] < K - k0)
            w = tl.load(wd_ptrs, mask=wd_mask, other=0.0).to(tl.float32)
        else:
            if PAD_HALF or not EVEN_K:
                packed = tl.load(w_ptrs, mask=w_mask, other=0)
            else:
                packed = tl.load(w_ptrs)
            if SCALE_I32:
                if PAD_HALF or not EVEN_K:
                    s4 = tl.load(s_ptrs, mask=col_mask[:, None] & (offs_s4[None, :] < (K - k0) // 64),
                                 other=0)
                else:
                    s4 = tl.load(s_ptrs)
                sbits = tl.reshape((s4[:, :, None] >> (tl.arange(0, 4) * 8)[None, None, :]) & 0xFF,
                                   [BN, BK // 16])
            elif MUTANT == 2:   # the scale of the next 16-block (cyclically)
                sp = s_base + w_row.to(tl.int64)[:, None] * KB + (k0 // 16 + offs_ks[None, :] + 1) % KB
                sbits = tl.load(sp, mask=s_mask, other=0)
            elif PAD_HALF or not EVEN_K:
                sbits = tl.load(s_ptrs, mask=s_mask, other=0)
            else:
                sbits = tl.load(s_ptrs)
            w = _decode_nvfp4(packed, sbits, BN, BK, MUTANT == 1)
        if INTERP:
            # the interpreter has no bf16 arithmetic: exact fp32 operands, IEEE dot
            if W_AS_A:
                acc_t = tl.dot(w, tl.trans(x.to(tl.float32)), acc_t, input_precision="ieee")
            else:
                acc = tl.dot(x.to(tl.float32), tl.trans(w), acc, input_precision="ieee")
        else:
            # w holds exact code*scale products, exactly representable in bf16
            if W_AS_A:
                acc_t = tl.dot(w.to(tl.bfloat16), tl.trans(x), acc_t)
            else:
                acc = tl.dot(x, tl.trans(w.to(tl.bfloat16)), acc)
        x_ptrs += BK
        w_ptrs += BK // 8
        if SCALE_I32:
            s_ptrs += BK // 64
        else:
            s_ptrs += BK // 16
        if W_DENSE:
            wd_ptrs += BK
    if W_AS_A:
        acc = tl.trans(acc_t)

    # ---- epilogue: global scale (fp32), then norm + RoPE for q/k, layout for all
    # gs: the projection's global decode scale (W4A4: times x's, see act_quant); with a
    # dense (overridden) weight the whole scale of the product (1 without x's)
    if MUTANT == 3:      # mutant: the global scale forgotten (the decode's 2^8 kept)
        acc = acc * 256.0
    else:
        if GS_FROM_PTR:
            gs = tl.load(gs_ptr + (h >= HQ).to(tl.int32) + (h >= HQ + HKV).to(tl.int32))
        else:
            if h < HQ:
                gs = gs_q
            elif h < HQ + HKV:
                gs = gs_k
            else:
                gs = gs_v
        if W_DENSE:
            acc = acc * gs
        else:
            acc = acc * (gs * 256.0)     # 2^8: the decode's offset (see _decode_nvfp4)

    if MODE == 1:
        # stage tap: the projection, [M, NT*D] fp32
        ptrs = proj_out + tok.to(tl.int64)[:, None] * (NT * D) + (h * D + col_off)[None, :]
        tl.store(ptrs, acc, mask=tok_mask[:, None] & col_mask[None, :])
    elif HPT == 1:
        # split the tile into its two RoPE halves: [BM, 2, HP] -> [BM, HP, 2] -> 2 x [BM, HP]
        lo, hi = tl.split(tl.permute(tl.reshape(acc, [BM, 2, HP]), (0, 2, 1)))
        _finish_head(lo, hi, h, tok, tok_mask, S, eps, cos_ptr, sin_ptr, qn_ptr, kn_ptr,
                     q_out, k_out, v_out, HQ, HKV, D, HP, MUTANT, INTERP)
    else:
        # two heads: [BM, 2 (head), 2 (half), HP] -> [BM, HP, 2 (half), 2 (head)] -> 4 x [BM, HP]
        first, second = tl.split(tl.permute(tl.reshape(acc, [BM, 2, 2, HP]), (0, 3, 2, 1)))
        lo, hi = tl.split(first)
        _finish_head(lo, hi, h, tok, tok_mask, S, eps, cos_ptr, sin_ptr, qn_ptr, kn_ptr,
                     q_out, k_out, v_out, HQ, HKV, D, HP, MUTANT, INTERP)
        lo, hi = tl.split(second)
        _finish_head(lo, hi, h + 1, tok, tok_mask, S, eps, cos_ptr, sin_ptr, qn_ptr, kn_ptr,
                     q_out, k_out, v_out, HQ, HKV, D, HP, MUTANT, INTERP)


@triton.jit
def _finish_head(lo, hi, h, tok, tok_mask, S, eps, cos_ptr, sin_ptr, qn_ptr, kn_ptr,
                 q_out, k_out, v_out, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                 HP: tl.constexpr, MUTANT: tl.constexpr, INTERP: tl.constexpr):
    """Epilogue of one head (global head index h) held as its two RoPE halves [BM, HP]
    (global scale applied): q/k get RMS norm and RoPE; all are stored [B, heads, S, D]."""
    HALF: tl.constexpr = D // 2
    offs_d = tl.arange(0, HP)
    d_mask = offs_d < HALF
    if h < HQ + HKV:
        if h < HQ:
            nw_ptr = qn_ptr
            out_ptr = q_out
            hl = h
            nh = h * 0 + HQ      # a run-time value: both branches must yield one type
        else:
            nw_ptr = kn_ptr
            out_ptr = k_out
            hl = h - HQ
            nh = h * 0 + HKV
        w_lo = tl.load(nw_ptr + offs_d, mask=d_mask, other=0.0).to(tl.float32)
        w_hi = tl.load(nw_ptr + HALF + offs_d, mask=d_mask, other=0.0).to(tl.float32)
        lo, hi = _rms_norm_halves(lo, hi, w_lo, w_hi, eps, D, MUTANT == 4)
        cs_row = tok.to(tl.int64)[:, None] * D + offs_d[None, :]
        cs_mask = tok_mask[:, None] & d_mask[None, :]
        c_lo = tl.load(cos_ptr + cs_row, mask=cs_mask, other=0.0).to(tl.float32)
        c_hi = tl.load(cos_ptr + cs_row + HALF, mask=cs_mask, other=0.0).to(tl.float32)
        s_lo = tl.load(sin_ptr + cs_row, mask=cs_mask, other=0.0).to(tl.float32)
        s_hi = tl.load(sin_ptr + cs_row + HALF, mask=cs_mask, other=0.0).to(tl.float32)
        lo, hi = _rope_halves(lo, hi, c_lo, c_hi, s_lo, s_hi, MUTANT == 5)
        _store_head(out_ptr, lo, hi, tok, tok_mask, offs_d, d_mask, hl, S, nh, D, MUTANT == 6, INTERP)
    else:
        _store_head(v_out, lo, hi, tok, tok_mask, offs_d, d_mask, h - HQ - HKV, S, HKV, D,
                    MUTANT == 6, INTERP)


@triton.jit
def _dequant_kernel(w_ptr, s_ptr, out_ptr, gs, N, K: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr):
    """Stage tap ``dequant``: W = code * scale * global_scale as fp32 [N, K] (the same decode
    the fused kernel runs; it never materialises this in production)."""
    w_ptr = w_ptr.to(tl.pointer_type(tl.int32))     # packed codes as int32 words
    s_ptr = s_ptr.to(tl.pointer_type(tl.uint8))      # e4m3 scales as bytes
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    k0 = tl.program_id(1) * BK
    row_mask = rows < N
    r64 = rows.to(tl.int64)[:, None]
    packed = tl.load(w_ptr + r64 * (K // 8) + k0 // 8 + tl.arange(0, BK // 8)[None, :],
                     mask=row_mask[:, None], other=0)
    sbits = tl.load(s_ptr + r64 * (K // 16) + k0 // 16 + tl.arange(0, BK // 16)[None, :],
                    mask=row_mask[:, None], other=0)
    w = _decode_nvfp4(packed, sbits, BR, BK, False) * (gs * 256.0)
    tl.store(out_ptr + r64 * K + k0 + tl.arange(0, BK)[None, :], w, mask=row_mask[:, None])


@triton.jit
def _head_stage_kernel(src_ptr, dst_ptr, cos_ptr, sin_ptr, qn_ptr, kn_ptr, eps, M,
                       src_stride, dst_stride,
                       HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HP: tl.constexpr,
                       BM: tl.constexpr, OP: tl.constexpr):
    """Stage taps ``qk_norm`` (OP 0) and ``rope`` (OP 1) on fp32 [M, heads*D] rows, one
    (token tile, q/k head) per program, with the fused kernel's own epilogue functions."""
    HALF: tl.constexpr = D // 2
    NQK: tl.constexpr = HQ + HKV
    pid = tl.program_id(0)
    h = pid % NQK
    tok = (pid // NQK) * BM + tl.arange(0, BM)
    tok_mask = tok < M
    offs_d = tl.arange(0, HP)
    d_mask = offs_d < HALF
    mask = tok_mask[:, None] & d_mask[None, :]
    t64 = tok.to(tl.int64)[:, None]
    src = src_ptr + t64 * src_stride + h * D + offs_d[None, :]
    lo = tl.load(src, mask=mask, other=0.0)
    hi = tl.load(src + HALF, mask=mask, other=0.0)
    if OP == 0:
        if h < HQ:
            nw_ptr = qn_ptr
        else:
            nw_ptr = kn_ptr
        w_lo = tl.load(nw_ptr + offs_d, mask=d_mask, other=0.0).to(tl.float32)
        w_hi = tl.load(nw_ptr + HALF + offs_d, mask=d_mask, other=0.0).to(tl.float32)
        lo, hi = _rms_norm_halves(lo, hi, w_lo, w_hi, eps, D, False)
    else:
        cs = t64 * D + offs_d[None, :]
        c_lo = tl.load(cos_ptr + cs, mask=mask, other=0.0).to(tl.float32)
        c_hi = tl.load(cos_ptr + cs + HALF, mask=mask, other=0.0).to(tl.float32)
        s_lo = tl.load(sin_ptr + cs, mask=mask, other=0.0).to(tl.float32)
        s_hi = tl.load(sin_ptr + cs + HALF, mask=mask, other=0.0).to(tl.float32)
        lo, hi = _rope_halves(lo, hi, c_lo, c_hi, s_lo, s_hi, False)
    dst = dst_ptr + t64 * dst_stride + h * D + offs_d[None, :]
    tl.store(dst, lo, mask=mask)
    tl.store(dst + HALF, hi, mask=mask)


# --------------------------------------------------------------------------- activation quantizer
# SPEC.md op B, stage ``act_quant`` (the benchmark's W4A4 quantizer). Bit for bit what
# ``fuseval.refimpl.nvfp4.quantize_activations`` computes; every float step is one IEEE
# float32 operation: divisions go through ``tl.math.div_rn`` (Triton's ``/`` on fp32 is
# the approximate ``div.full.f32`` in compiled code), and no product feeds an addition,
# so FMA contraction has nothing to fuse. Magnitudes are compared and maximised as
# integers (the bit patterns of non-negative floats order as their values), and the
# rounding to e4m3 is integer arithmetic on the fp32 bits, so the interpreter and the
# compiled kernel run literally the same operations.
_F32_MAX = tl.constexpr(3.4028234663852886e38)   # largest finite float32
_AMAX_MAX_PARTIALS = 1024              # partial maxima the quantizer kernel reduces


@triton.jit
def _abs_bits(x):
    """|x| as the int32 bit pattern of its float32 value. For non-negative floats the bit
    patterns order as the values do, and a NaN (exponent all ones, mantissa non-zero) sorts
    above +inf, so an integer max of these is the float max that propagates NaN, as
    torch's amax does; it is exact whatever the input dtype (every one converts to fp32
    exactly)."""
    return x.to(tl.float32).to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def _load_f32(x_ptr, offs, mask, X_BF16: tl.constexpr):
    """x as float32. bf16 arrives as its int16 bits and is widened by hand (bits << 16):
    exact, where the interpreter's own bf16 -> fp32 conversion flushes bf16 subnormals."""
    if X_BF16:
        raw = tl.load(x_ptr + offs, mask=mask, other=0)
        return (raw.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)


# The quantizer's small outputs share one int32 scratch tensor (fewer allocations per
# call): [0, 3) gs (fp32 bits), 3 the global decode scale, [4, ...) the amax partials
# (the per-token mutant: its decode scale per row instead).
_SCRATCH_GS = 0
_SCRATCH_GD = 3
_SCRATCH_PART = 4


@triton.jit
def _amax_partials_kernel(x_ptr, scratch_ptr, N, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                          X_BF16: tl.constexpr):
    """Pass 1: max |x| over elements [pid*CHUNK, (pid+1)*CHUNK) of the flat tensor, as the
    int32 bits of a float32 (see ``_abs_bits``), one partial per program. The quantizer
    kernel reduces the partials itself: no atomics, no memset, no host round trip."""
    part_ptr = scratch_ptr + 4       # _SCRATCH_PART
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * CHUNK
    best = tl.zeros([BLOCK], dtype=tl.int32)
    for i in tl.static_range(0, CHUNK, BLOCK):
        offs = base + i + tl.arange(0, BLOCK)
        best = tl.maximum(best, _abs_bits(_load_f32(x_ptr, offs, offs < N, X_BF16)))
    tl.store(part_ptr + pid, tl.max(best, 0))


@triton.jit
def _e4m3_rne(s):
    """float32 -> e4m3fn code (int32), round to nearest even, by integer arithmetic on the
    fp32 bits; magnitudes that round above 448 saturate to 448 (0x7E), NaN gives 0x7F.

    Write |s| = Mant * 2^(Ee - 150) with the 24-bit significand Mant (hidden bit included
    unless s is an fp32 subnormal, whose Ee is 1). e4m3's binade exponent is
    ee = max(Ee - 127, -6) (its subnormals share the spacing of the lowest binade), its
    spacing 2^(ee - 3), so the rounded multiple of the spacing is n = RNE(Mant / 2^r) with
    r = ee + 147 - Ee >= 20 (capped at 25, where Mant < 2^24 rounds to 0 anyway). The code
    is 8 * (ee + 6) + n: for normals n = 8 + mantissa, for subnormals n = mantissa, and a
    carry out of the mantissa (n = 16) lands on the next binade's first code by itself."""
    bits = s.to(tl.int32, bitcast=True)
    mag = bits & 0x7FFFFFFF
    e_field = mag >> 23
    frac = mag & 0x7FFFFF
    mant = tl.where(e_field == 0, frac, frac | 0x800000)
    e_eff = tl.maximum(e_field, 1)
    ee = tl.maximum(e_eff - 127, -6)
    r = tl.minimum(ee + 147 - e_eff, 25)
    q = mant >> r
    rem = mant & ((1 << r) - 1)
    half = 1 << (r - 1)
    q += ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(tl.int32)
    code = tl.minimum(8 * (ee + 6) + q, 0x7E)
    code = code | ((bits >> 24) & 0x80)                  # the sign (+-0 keep theirs)
    return tl.where(mag > 0x7F800000, 0x7F, code)        # NaN


@triton.jit
def _e4m3_value(code):
    """e4m3fn code (int32) -> its float32 value, exactly: normal codes s.eeee.mmm become the
    fp32 bits s.(eeee + 120).mmm0..., subnormals m * 2^-9; 0x7F / 0xFF are NaN."""
    e = (code >> 3) & 0xF
    m = code & 0x7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    v = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)
    v = tl.where((code & 0x80) != 0, -v, v)
    return tl.where((code & 0x7F) == 0x7F, float("nan"), v)


@triton.jit
def _act_quant_kernel(x_ptr, scratch_ptr, n_part, gw_ptr, g_q, g_k, g_v,
                      xs_ptr, codes_ptr, scales_ptr, M,
                      K: tl.constexpr, KP: tl.constexpr, BR: tl.constexpr, PP: tl.constexpr,
                      GW_FROM_PTR: tl.constexpr, WRITE_CODES: tl.constexpr, PER_TOKEN: tl.constexpr,
                      X_BF16: tl.constexpr, INTERP: tl.constexpr):
    """Pass 2: BR whole rows of x [M, K] per program (KP = K rounded up to a power of two).

    Writes xs = e2m1(code) * e4m3(scale) as bf16 [M, K] (exact: at most 6 significant
    bits), the GEMM's activation operand, and (program 0) the per-projection scales
    gs[p] = global_decode_p(weights) * global_decode(x) that the GEMM kernels apply to
    their fp32 accumulators; with WRITE_CODES also the codes [M, K] and block scale bits
    [M, K/16] (uint8), for the taps and tests. PER_TOKEN (mutant): the amax, and so the
    global scales, per row instead of per tensor; the row's global decode scale then goes
    into xs (rounded to bf16) and gs holds the weights' scales alone."""
    part_ptr = scratch_ptr + 4                                   # see _SCRATCH_*
    gs_ptr = scratch_ptr.to(tl.pointer_type(tl.float32))
    if PER_TOKEN:
        gd_ptr = gs_ptr + 4
    else:
        gd_ptr = gs_ptr + 3
    pid = tl.program_id(0)
    rows = pid * BR + tl.arange(0, BR)
    cols = tl.arange(0, KP)
    row_ok = rows < M
    mask = row_ok[:, None] & (cols < K)[None, :]
    offs = rows.to(tl.int64)[:, None] * K + cols[None, :]
    x = _load_f32(x_ptr, offs, mask, X_BF16)
    xa = _abs_bits(x)

    # ---- 1. amax over the whole tensor: the partial maxima of pass 1 (the mutant: the row's)
    if PER_TOKEN:
        amax = tl.max(xa, 1).to(tl.float32, bitcast=True)[:, None]         # [BR, 1]
    else:
        p = tl.arange(0, PP)
        amax = tl.max(tl.load(part_ptr + p, mask=p < n_part, other=0), 0).to(tl.float32, bitcast=True)

    # ---- 2. global scales: encode = 2688 / amax (fp32), clamped to the fp32 max (amax = 0
    # gives inf -> max); an encode of 0 (amax = inf) becomes 1. decode = 1 / encode.
    # The clamps are written as selects so that a NaN passes through, as in torch.
    g_enc = tl.math.div_rn(tl.full(amax.shape, 2688.0, tl.float32), amax)
    g_enc = tl.where(g_enc > _F32_MAX, _F32_MAX, g_enc)
    g_enc = tl.where(g_enc == 0.0, 1.0, g_enc)
    g_dec = tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), g_enc)

    # ---- 3. block scales: s = (block amax / 6) * encode, two fp32 roundings, clamped to
    # +-448, then rounded to e4m3 (nearest even); s_dec is its exact fp32 value. The "/ 6"
    # is a product with fl32(1/6) (bits 0x3E2AAAAB), as the benchmark's torch code computes
    # it on the GPU (a tensor divided by a Python number: times the fp32 reciprocal)
    xa3 = tl.reshape(xa, [BR, KP // 16, 16])
    bamax = tl.max(xa3, 2).to(tl.float32, bitcast=True)                     # [BR, KP/16]
    sixth = tl.full(bamax.shape, 0x3E2AAAAB, tl.int32).to(tl.float32, bitcast=True)
    s = (bamax * sixth) * g_enc
    s = tl.where(s > 448.0, 448.0, tl.where(s < -448.0, -448.0, s))
    s_code = _e4m3_rne(s)
    s_dec = _e4m3_value(s_code)

    # ---- 4. the block's encode scale: 1 / (s_dec * decode), the product rounded to fp32
    # first (a division, so there is nothing to contract); a zero scale gives inf -> max
    b_enc = tl.math.div_rn(tl.full(s_dec.shape, 1.0, tl.float32), s_dec * g_dec)
    b_enc = tl.where(b_enc > _F32_MAX, _F32_MAX, b_enc)

    # ---- 5. y = x * encode, clamped to +-6, mapped to e2m1 codes by the thresholds of
    # round-to-nearest-even on the grid {0, .5, 1, 1.5, 2, 3, 4, 6}: a tie at .25, 1.25,
    # 2.5, 5 stays down (even code), at .75, 1.75, 3.5 goes up. y < 0 sets the sign bit,
    # so y in [-0.25, 0) is code 8 (-0) and y = -0.0 is code 0; NaN compares false: code 0.
    # The clamp is not computed: every |y| > 5 (clamped or not) is code 7, and a NaN stays
    # a NaN either way. The grid value is summed from the same comparisons (exact), so the
    # magnitude code itself is only built when it is stored.
    y = tl.reshape(x, [BR, KP // 16, 16]) * b_enc[:, :, None]
    a = tl.abs(y)
    c1 = a > 0.25
    c2 = a >= 0.75
    c3 = a > 1.25
    c4 = a >= 1.75
    c5 = a > 2.5
    c6 = a >= 3.5
    c7 = a > 5.0
    v = (tl.where(c1, 0.5, 0.0) + tl.where(c2, 0.5, 0.0) + tl.where(c3, 0.5, 0.0) + tl.where(c4, 0.5, 0.0)
         + tl.where(c5, 1.0, 0.0) + tl.where(c6, 1.0, 0.0) + tl.where(c7, 2.0, 0.0))
    neg = y < 0.0
    xs = tl.where(neg, -v, v) * s_dec[:, :, None]      # exact: 2 x 4 significant bits
    if PER_TOKEN:
        # mutant: the row's own global decode folded into the operand (rounded to bf16)
        xs = xs * g_dec[:, :, None]
    xs = tl.reshape(xs, [BR, KP])
    tl.store(xs_ptr + offs, _to_bf16(xs, INTERP), mask=mask)

    if WRITE_CODES:
        mag = (c1.to(tl.int32) + c2.to(tl.int32) + c3.to(tl.int32) + c4.to(tl.int32) + c5.to(tl.int32)
               + c6.to(tl.int32) + c7.to(tl.int32))
        code = tl.reshape(mag | (neg.to(tl.int32) << 3), [BR, KP])
        tl.store(codes_ptr + offs, code.to(tl.uint8), mask=mask)
        blk = tl.arange(0, KP // 16)
        s_offs = rows.to(tl.int64)[:, None] * (K // 16) + blk[None, :]
        tl.store(scales_ptr + s_offs, s_code.to(tl.uint8), mask=row_ok[:, None] & (blk < K // 16)[None, :])

    # ---- the scales the GEMM kernels read from their gs pointer: weights' x activations'
    if GW_FROM_PTR:
        gq = tl.load(gw_ptr)
        gk = tl.load(gw_ptr + 1)
        gv = tl.load(gw_ptr + 2)
    else:
        gq = g_q
        gk = g_k
        gv = g_v
    if PER_TOKEN:
        tl.store(gd_ptr + rows, tl.reshape(g_dec, [BR]), mask=row_ok)
        if pid == 0:
            tl.store(gs_ptr, gq * 1.0)
            tl.store(gs_ptr + 1, gk * 1.0)
            tl.store(gs_ptr + 2, gv * 1.0)
    elif pid == 0:
        tl.store(gd_ptr, g_dec)
        tl.store(gs_ptr, gq * g_dec)
        tl.store(gs_ptr + 1, gk * g_dec)
        tl.store(gs_ptr + 2, gv * g_dec)


# --------------------------------------------------------------------------- host side
@dataclass(frozen=True)
class KernelConfig:
    """Tile shape and launch parameters of the fused kernel (the N tile is always one head)."""
    block_m: int
    block_k: int
    num_warps: int = 8
    num_stages: int = 3
    w_as_a: bool = False      # compute acc^T = W x^T (decoded W as the dot's A operand)
    heads_per_tile: int = 1   # 2: one N tile spans two heads (halves the re-reads of x)
    gluon: bool = False       # Hopper: the Gluon kernel (operators/nvfp4_qkv_rope/_gluon.py) where it applies

    @classmethod
    def parse(cls, text: str) -> "KernelConfig":
        """'BM,BK,WARPS,STAGES[,a][,h2][,g]' (``a``: W as the A operand; ``h2``: two heads
        per tile; ``g``: the Gluon kernel on Hopper, with STAGES x-tile slots), e.g.
        '128,64,8,3' or '128,64,8,3,a,h2' or '128,64,8,6,g'."""
        parts = [p.strip() for p in text.split(",") if p.strip()]
        flags = parts[4:]
        if len(parts) < 4 or any(f not in ("a", "h1", "h2", "g") for f in flags) \
                or len(set(flags)) != len(flags):
            raise ValueError(f"kernel config must be 'BM,BK,WARPS,STAGES[,a][,h2][,g]', got {text!r}")
        return cls(int(parts[0]), int(parts[1]), int(parts[2]), int(parts[3]), "a" in flags,
                   2 if "h2" in flags else 1, "g" in flags)

    def label(self) -> str:
        return (f"{self.block_m},{self.block_k},{self.num_warps},{self.num_stages}"
                + (",a" if self.w_as_a else "") + (",h2" if self.heads_per_tile == 2 else "")
                + (",g" if self.gluon else ""))


# Tile table for Hopper (H200), by the number of tokens M = B*S: (largest M, config).
# Chosen by benchmarks/sweep_nvfp4_qkv_rope.py and benchmarks/probe_nvfp4_gluon.py on an
# H200 (benchmarks/notes_nvfp4_qkv_rope.md): the Gluon kernel (operators/nvfp4_qkv_rope/_gluon.py) with
# 256-token tiles, which halve the FP4 decode work per FLOP against 128-token ones, and
# the transposed product (a: tokens as the wgmma's N, less shared-memory traffic).
H200_CONFIGS: list[tuple[int, KernelConfig]] = [
    (1 << 62, KernelConfig(256, 64, 8, 4, w_as_a=True, gluon=True)),
]
# Where a Gluon config cannot run (not sm_90, head_dim != 128, a mutant or a stage tap),
# the Triton kernel takes this config of the same tile height instead.
TRITON_FOR_GLUON = {128: KernelConfig(128, 64, 4, 4, True), 256: KernelConfig(256, 64, 8, 3, True)}

CONFIG_ENV = "FUSEVAL_NVFP4_QKV_ROPE_CONFIG"      # one config for every size
TABLE_ENV = "FUSEVAL_NVFP4_QKV_ROPE_TABLE"        # 'MAXM:cfg;MAXM:cfg;...' replaces the table


def parse_table(text: str) -> list[tuple[int, KernelConfig]]:
    """'1024:64,128,4,4;inf:128,64,8,3' -> [(1024, cfg), (huge, cfg)] (sorted by M)."""
    table = []
    for part in text.split(";"):
        if not part.strip():
            continue
        bound, _, cfg = part.partition(":")
        bound = bound.strip()
        table.append((1 << 62 if bound in ("inf", "*") else int(bound), KernelConfig.parse(cfg)))
    if not table:
        raise ValueError(f"{TABLE_ENV}: empty tile table {text!r}")
    return sorted(table, key=lambda e: e[0])


def _pow2_at_least(n: int, lo: int) -> int:
    p = lo
    while p < n:
        p *= 2
    return p


def pick_config(m: int, hidden: int, head_dim: int, device: torch.device) -> KernelConfig:
    """The tile configuration for ``m`` tokens: the ``CONFIG_ENV`` override, else the H200
    table on CUDA (``TABLE_ENV`` replaces it), else small tiles for the interpreter."""
    env = os.environ.get(CONFIG_ENV)
    if env:
        return KernelConfig.parse(env)
    if device.type == "cuda":
        table = parse_table(os.environ[TABLE_ENV]) if os.environ.get(TABLE_ENV) else H200_CONFIGS
        for max_m, cfg in table:
            if m <= max_m:
                return cfg
        return table[-1][1]
    block_k = min(64, _pow2_at_least(hidden, 16))
    return KernelConfig(16 if m <= 16 else 32, block_k, 4, 1)


# --------------------------------------------------------------------------- launch plans
# Small cases run in tens of microseconds, so the host side matters: everything that
# depends only on the inputs' shapes, dtypes, devices and layout (validation, axes, tile
# choice, the kernel's constexprs, the grid) is computed once per distinct signature and
# cached; a call then only checks pointer alignment, allocates outputs and launches.
@dataclass(frozen=True)
class _Plan:
    b: int
    s: int
    hq: int
    hkv: int
    d: int
    m: int
    grid: tuple
    consts: dict
    contiguous: bool
    gluon: KernelConfig | None = None     # set: launch the Gluon kernel with this config


_DEFN = None
_PLANS: dict[tuple, _Plan] = {}


def _signature(inputs) -> tuple:
    return tuple((t.shape, t.dtype, t.get_device(), t.is_contiguous()) if isinstance(t, torch.Tensor)
                 else type(t) for t in inputs)


def _bind(inputs, check_values: bool) -> dict[str, int]:
    """Axis binding of ``inputs``; ValueError naming the input on any mismatch."""
    global _DEFN
    from ...validate import bind_axes
    if _DEFN is None:
        _DEFN = load(NAME)
    return bind_axes(_DEFN, inputs, check_values=check_values)


def _plan(inputs, mode: int, config: KernelConfig | None, mutant: int, dense: bool,
          check_values: bool) -> _Plan:
    env = (os.environ.get(CONFIG_ENV), os.environ.get(TABLE_ENV))
    key = (_signature(inputs), mode, config, mutant, dense, env)
    plan = _PLANS.get(key)
    if plan is not None and not check_values:
        return plan
    bound = _bind(inputs, check_values)     # shapes, dtypes, devices (+ NaN scan on request)
    b, s, hidden = bound["batch_size"], bound["seq_len"], bound["hidden_size"]
    hq, hkv, d = bound["num_attention_heads"], bound["num_key_value_heads"], bound["head_dim"]
    m, nt = b * s, hq + 2 * hkv
    dev = inputs[0].device
    cfg = config or pick_config(m, hidden, d, dev)
    interp = dev.type != "cuda"
    # the Gluon kernel: production calls on Hopper with head_dim 128 and whole 64-wide K steps
    gluon = (cfg.gluon and not interp and mode == _MODE_FULL and mutant == 0 and not dense and d == 128
             and hidden % 64 == 0 and cfg.block_k == 64 and cfg.num_stages >= 4 and cfg.num_warps == 8
             and cfg.block_m in (128, 256) and torch.cuda.get_device_capability(dev)[0] == 9)
    gluon_cfg = cfg if gluon else None
    if cfg.gluon and not gluon:
        cfg = TRITON_FOR_GLUON.get(cfg.block_m, KernelConfig(cfg.block_m, cfg.block_k, 4, 3, True))
    if cfg.block_k % 16 or cfg.block_k < 16 or cfg.block_m < 16:
        raise ValueError(f"kernel config: block_k must be a multiple of 16 and block_m >= 16, "
                         f"got {cfg.label()}")
    # two heads per tile only where no tile would straddle projections (even head counts)
    hpt = 2 if cfg.heads_per_tile == 2 and hq % 2 == 0 and hkv % 2 == 0 else 1
    # int32 scale words: compiled path only (the interpreter gains nothing), whole words per tile
    scale_i32 = not interp and hidden % 64 == 0 and cfg.block_k % 64 == 0 and mutant != 2 and not dense
    consts = dict(K=hidden, HQ=hq, HKV=hkv, D=d, HP=_pow2_at_least(d // 2, 8),
                  BM=cfg.block_m, BK=cfg.block_k, W_DENSE=dense, W_AS_A=cfg.w_as_a,
                  HPT=hpt, SCALE_I32=scale_i32, INTERP=interp, MODE=mode, MUTANT=mutant,
                  num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    contiguous = all(t.is_contiguous() for t in inputs if isinstance(t, torch.Tensor))
    plan = _Plan(b, s, hq, hkv, d, m, (triton.cdiv(m, cfg.block_m) * (nt // hpt),), consts, contiguous,
                 gluon_cfg)
    if len(_PLANS) > 256:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


def _word_aligned(t: torch.Tensor) -> torch.Tensor:
    """The kernel reads packed codes (and scales) as 4-byte words: a tensor that starts
    off a 16-byte boundary (a slice of a larger buffer) is copied to a fresh one."""
    return t if t.data_ptr() % 16 == 0 else t.clone()


# --------------------------------------------------------------------------- activation quantizer, host
# Tile of the quantizer kernel (elements per program: whole rows, so BR = tile // K) and
# its warps, and the amax kernel's step. benchmarks/probe_nvfp4_act_quant.py on the H200
# (GPU time, 8192 / 2048 tokens): tiles 4096:4 0.078 / 0.025 ms, 8192:8 0.080 / 0.026,
# 16384:8 0.082 / 0.026 (all bit-exact); amax steps 4096 / 8192 / 16384: 0.028 / 0.026 /
# 0.025 ms at 8192 tokens. The differences are within a few percent; these defaults are
# the ones the GPU tests ran.
QUANT_TILE = 8192
QUANT_WARPS = 8
AMAX_BLOCK = 4096          # elements per step of the amax kernel (8 warps)


@dataclass(frozen=True)
class ActQuant:
    """What :func:`act_quant` returns for x [..., K].

    ``xs``: bf16 [..., K] = e2m1(code) * e4m3(block scale), exact (at most 6 significant
    bits): the GEMM kernels' activation operand. ``gs``: fp32 [3], the q, k and v weights'
    global decode scales times x's, rounded to fp32: what the GEMM kernels read from their
    gs pointer. ``global_decode``: fp32 0-d (the per-token mutant: [..., 1], one per row).
    ``codes`` uint8 [..., K] and ``scales`` uint8 e4m3 bits [..., K/16] when asked for."""
    xs: torch.Tensor
    gs: torch.Tensor
    global_decode: torch.Tensor
    codes: torch.Tensor | None = None
    scales: torch.Tensor | None = None

    def dequantize(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """x_hat = xs * global_decode: exact in float64 (SPEC.md step 6)."""
        return (self.xs.to(torch.float64) * self.global_decode.to(torch.float64)).to(dtype)


@dataclass(frozen=True)
class _QuantPlan:
    chunk: int          # amax kernel: elements per program
    n_part: int         # amax kernel: programs (partial maxima)
    pp: int             # n_part rounded up to a power of two (the quantizer's reduction width)
    kp: int             # K rounded up to a power of two
    br: int             # quantizer: rows per program
    grid: int           # quantizer: programs


_QUANT_PLANS: dict[tuple, _QuantPlan] = {}


def _quant_plan(m: int, k: int) -> _QuantPlan:
    key = (m, k, QUANT_TILE, AMAX_BLOCK)
    plan = _QUANT_PLANS.get(key)
    if plan is None:
        n = m * k
        chunk = AMAX_BLOCK
        while triton.cdiv(n, chunk) > _AMAX_MAX_PARTIALS:
            chunk *= 2
        n_part = max(1, triton.cdiv(n, chunk))
        kp = _pow2_at_least(k, 16)
        br = max(1, QUANT_TILE // kp)
        plan = _QuantPlan(chunk, n_part, _pow2_at_least(n_part, 1), kp, br, max(1, triton.cdiv(m, br)))
        if len(_QUANT_PLANS) > 256:
            _QUANT_PLANS.clear()
        _QUANT_PLANS[key] = plan
    return plan


def _quiet_numpy(interp: bool):
    if not interp:
        return contextlib.nullcontext()
    import numpy
    return numpy.errstate(divide="ignore", over="ignore", invalid="ignore")


def act_quant(x: torch.Tensor, weight_scales=(1.0, 1.0, 1.0), *, codes: bool = False,
              per_token: bool = False) -> ActQuant:
    """The benchmark's NVFP4 activation quantizer (SPEC.md op B ``act_quant``) on the device,
    bit for bit ``fuseval.refimpl.nvfp4.quantize_activations(x)``.

    ``x`` [..., K] (any float dtype, K % 16 == 0) is viewed as [M, K]. Two launches and no
    host synchronisation: ``_amax_partials_kernel`` (max |x| per chunk), then
    ``_act_quant_kernel`` (global scales from the partials, block scales, codes, xs, and
    ``gs`` = ``weight_scales`` (three Python floats or one-element tensors) times the global
    decode scale). ``codes=True`` also returns the codes and block scale bits.
    ``per_token=True`` is the "per_token_amax" mutant (an amax per row)."""
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"act_quant: x must be a floating-point tensor [..., K], got {got}")
    if x.dim() == 0 or x.shape[-1] % 16:
        raise ValueError(f"act_quant: x must have shape [..., K] with K a multiple of 16, "
                         f"got {tuple(x.shape)}")
    k = x.shape[-1]
    x2 = x.detach().reshape(-1, k)
    if x2.dtype not in (torch.bfloat16, torch.float32):
        x2 = x2.to(torch.float32)                       # exact for every narrower float
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    x_bf16 = x2.dtype == torch.bfloat16
    if x_bf16:
        x2 = x2.view(torch.int16)                       # widened by hand (see _load_f32)
    m, dev = x2.shape[0], x.device
    xs, scratch, codes_t, scales_t = _quantize(x2, x_bf16, m, k, weight_scales, codes, per_token)
    gs = scratch[_SCRATCH_GS:_SCRATCH_GS + 3]
    lead = tuple(x.shape[:-1])
    if per_token:
        gd = scratch[_SCRATCH_PART:_SCRATCH_PART + m].view(lead + (1,))
    else:
        gd = scratch[_SCRATCH_GD]
    return ActQuant(xs.view(x.shape), gs, gd, codes_t.view(x.shape) if codes else None,
                    scales_t.view(lead + (k // 16,)) if codes else None)


def _quantize(x2, x_bf16: bool, m: int, k: int, weight_scales, codes: bool, per_token: bool):
    """The two launches of :func:`act_quant` on x2 [M, K] (bf16 as int16 bits, or fp32).
    Returns (xs bf16 [M, K], the fp32 view of the scratch tensor (gs = [0:3]), codes or
    None, scales or None)."""
    dev = x2.device
    plan = _quant_plan(m, k)
    interp = dev.type != "cuda"
    xs = torch.empty((m, k), dtype=torch.bfloat16, device=dev)
    scratch = torch.empty(_SCRATCH_PART + (m if per_token else plan.n_part), dtype=torch.int32, device=dev)
    codes_t = torch.empty((m, k), dtype=torch.uint8, device=dev) if codes else xs
    scales_t = torch.empty((m, k // 16), dtype=torch.uint8, device=dev) if codes else xs
    if any(isinstance(g, torch.Tensor) for g in weight_scales):
        gw = torch.stack([torch.as_tensor(g).reshape(()).to(device=dev, dtype=torch.float32)
                          for g in weight_scales])
        gw_args, gw_from_ptr = (gw, 1.0, 1.0, 1.0), True
    else:
        gw_args, gw_from_ptr = (scratch, *(float(g) for g in weight_scales)), False
    if not per_token:
        _amax_partials_kernel[(plan.n_part,)](x2, scratch, m * k, CHUNK=plan.chunk, BLOCK=AMAX_BLOCK,
                                              X_BF16=x_bf16, num_warps=8)
    with _quiet_numpy(interp):     # the interpreter's numpy warns of 1/0 (an intended inf)
        _act_quant_kernel[(plan.grid,)](
            x2, scratch, plan.n_part, *gw_args, xs, codes_t, scales_t, m,
            K=k, KP=plan.kp, BR=plan.br, PP=plan.pp, GW_FROM_PTR=gw_from_ptr, WRITE_CODES=codes,
            PER_TOKEN=per_token, X_BF16=x_bf16, INTERP=interp, num_warps=QUANT_WARPS)
    return xs, scratch.view(torch.float32), (codes_t if codes else None), (scales_t if codes else None)


# --------------------------------------------------------------------------- launch
def _launch(inputs, *, mode: int, config: KernelConfig | None, mutant: int,
            check_values: bool, w_dense: torch.Tensor | None = None, quant: str | None = None,
            act: tuple[torch.Tensor, torch.Tensor] | None = None):
    """One GEMM launch (with the epilogue of ``mode``). The activation operand: ``quant``
    "tensor" quantizes x first (the benchmark's W4A4; "token" is the per-token mutant),
    ``act`` = (xs, gs) gives it ready (the stage taps), neither uses x as it is (W4A16).
    ``gs`` (fp32 [3] on the device) then replaces the weights' global decode scales; with a
    dense (overridden) weight it is the whole scale of the product."""
    plan = _plan(inputs, mode, config, mutant, w_dense is not None, check_values)
    if not plan.contiguous:
        inputs = [t.contiguous() if isinstance(t, torch.Tensor) else t for t in inputs]
    (x, cos, sin, wq, sq, gq, wk, sk, gk, wv, sv, gv, qn, kn, eps) = inputs
    b, s, hq, hkv, d, m = plan.b, plan.s, plan.hq, plan.hkv, plan.d, plan.m
    dev = x.device

    if mode == _MODE_FULL:
        q_out = torch.empty((b, hq, s, d), dtype=torch.bfloat16, device=dev)
        k_out = torch.empty((b, hkv, s, d), dtype=torch.bfloat16, device=dev)
        v_out = torch.empty((b, hkv, s, d), dtype=torch.bfloat16, device=dev)
        proj = q_out
        result = (q_out, k_out, v_out)
    else:
        proj = torch.empty((m, (hq + 2 * hkv) * d), dtype=torch.float32, device=dev)
        q_out = k_out = v_out = proj
        result = proj
    if m == 0:
        return result

    if quant is not None:
        # x is bf16 and contiguous here (validated by the plan): its int16 bits, [M, H]
        xs, scratch, _, _ = _quantize(x.view(m, -1).view(torch.int16), True, m, x.shape[-1],
                                      (gq, gk, gv), False, quant == "token")
        act = (xs, scratch)          # gs = scratch[0:3]
    if act is not None:
        # x's quantized form: xs as the activation operand, the product of both global
        # decode scales (per projection) read from the device
        x = act[0]
        gs_args, gs_from_ptr = (act[1], 1.0, 1.0, 1.0), True
    elif w_dense is not None:
        gs_args, gs_from_ptr = (x, 1.0, 1.0, 1.0), False
    elif isinstance(gq, torch.Tensor) or isinstance(gk, torch.Tensor) or isinstance(gv, torch.Tensor):
        # global decode scales: Python floats go in as fp32 kernel arguments; tensors (0-d
        # or one-element, any device) are read on the device to avoid a host sync
        gs_vec = torch.stack([torch.as_tensor(g).reshape(()).to(device=dev, dtype=torch.float32)
                              for g in (gq, gk, gv)])
        gs_args, gs_from_ptr = (gs_vec, 1.0, 1.0, 1.0), True
    else:
        gs_args, gs_from_ptr = (x, float(gq), float(gk), float(gv)), False

    if plan.gluon is not None and x.data_ptr() % 16 == 0:
        from . import _gluon as _nvfp4_gluon
        cfg = plan.gluon
        u8 = lambda t: _word_aligned(t).view(torch.uint8)     # noqa: E731
        _nvfp4_gluon.launch(x.view(m, -1), cos, sin, [u8(t) for t in (wq, wk, wv)],
                            [u8(t) for t in (sq, sk, sv)], gs_args, gs_from_ptr, qn, kn, eps,
                            result, m, s, hq, hkv, block_m=cfg.block_m, block_k=cfg.block_k,
                            stages=cfg.num_stages, heads_per_tile=plan.consts["HPT"], w_as_a=cfg.w_as_a,
                            num_warps=cfg.num_warps)
        return result
    _nvfp4_qkv_rope_kernel[plan.grid](
        x, cos, sin,
        _word_aligned(wq), _word_aligned(sq), _word_aligned(wk), _word_aligned(sk),
        _word_aligned(wv), _word_aligned(sv), x if w_dense is None else w_dense,
        *gs_args, qn, kn, float(eps),
        q_out, k_out, v_out, proj, m, s, GS_FROM_PTR=gs_from_ptr, **plan.consts)
    return result


def forward(hidden_states, cos, sin,
            q_proj_weight_fp4, q_proj_scale, q_proj_global_decode_scale,
            k_proj_weight_fp4, k_proj_scale, k_proj_global_decode_scale,
            v_proj_weight_fp4, v_proj_scale, v_proj_global_decode_scale,
            q_norm_weight, k_norm_weight, rms_norm_eps, *,
            check_values: bool = False, config: KernelConfig | str | None = None,
            _mutant: int = 0):
    """The fused NVFP4 QKV projection + q/k RMSNorm + RoPE with the benchmark's semantics
    (W4A4): x is quantized to NVFP4 by the benchmark's quantizer (:func:`act_quant`, two
    small launches), then the GEMM kernel multiplies xs = code * scale (exact in bf16) by
    the decoded weights and applies both global decode scales to its fp32 accumulator.

    Inputs in definition order (SPEC.md op B); global decode scales and eps may be Python
    floats or one-element tensors. Returns (query_states, key_states, value_states), bf16
    [B, heads, S, D]. Shapes, dtypes and devices are validated (``ValueError`` naming the
    input); ``check_values=True`` also rejects NaN/Inf inputs (a full scan, off by default).
    ``config``: a :class:`KernelConfig` or 'BM,BK,WARPS,STAGES[,a]' to override the tile
    table. ``_mutant``: a value of :data:`MUTANTS` (tests only)."""
    if isinstance(config, str):
        config = KernelConfig.parse(config)
    inputs = (hidden_states, cos, sin, q_proj_weight_fp4, q_proj_scale, q_proj_global_decode_scale,
              k_proj_weight_fp4, k_proj_scale, k_proj_global_decode_scale,
              v_proj_weight_fp4, v_proj_scale, v_proj_global_decode_scale,
              q_norm_weight, k_norm_weight, rms_norm_eps)
    mutant = int(_mutant)
    if mutant == MUTANTS["weight_only_activations"]:
        quant = None            # mutant: the bf16 activations used as they are
    elif mutant == MUTANTS["per_token_amax"]:
        quant = "token"
    else:
        quant = "tensor"

    def run():
        return _launch(inputs, mode=_MODE_FULL, config=config, mutant=_gemm_mutant(mutant),
                       check_values=check_values, quant=quant)
    x = hidden_states
    if (mutant == 0 and not check_values and isinstance(x, torch.Tensor) and x.dim() == 3
            and x.shape[0] * x.shape[1] <= GRAPH_MAX_TOKENS):
        return GRAPHS((tensor_key(inputs), config), x.device, run)
    return run()


# Calls of at most this many tokens are replayed from CUDA graphs (fuseval.fast._graphs):
# the quantizer's two launches and the GEMM's take about 0.3 ms of host work per call on
# the H200 host, more than their GPU time up to 2048 tokens (0.24 ms there).
GRAPH_MAX_TOKENS = 2048
GRAPHS = GraphCache(capacity=4)


def forward_w4a16(hidden_states, cos, sin,
                  q_proj_weight_fp4, q_proj_scale, q_proj_global_decode_scale,
                  k_proj_weight_fp4, k_proj_scale, k_proj_global_decode_scale,
                  v_proj_weight_fp4, v_proj_scale, v_proj_global_decode_scale,
                  q_norm_weight, k_norm_weight, rms_norm_eps, *,
                  check_values: bool = False, config: KernelConfig | str | None = None,
                  _mutant: int = 0):
    """The operator's ``w4a16`` variant: the same fused kernel on the bf16 activations as
    they are (weight-only quantization, what Hopper serving kernels usually do). Same
    signature and outputs as :func:`forward`; the quantizer mutants do not apply."""
    if isinstance(config, str):
        config = KernelConfig.parse(config)
    inputs = (hidden_states, cos, sin, q_proj_weight_fp4, q_proj_scale, q_proj_global_decode_scale,
              k_proj_weight_fp4, k_proj_scale, k_proj_global_decode_scale,
              v_proj_weight_fp4, v_proj_scale, v_proj_global_decode_scale,
              q_norm_weight, k_norm_weight, rms_norm_eps)
    return _launch(inputs, mode=_MODE_FULL, config=config, mutant=_gemm_mutant(int(_mutant)),
                   check_values=check_values)


def _gemm_mutant(mutant: int) -> int:
    """The GEMM kernel's MUTANT constexpr: the quantizer mutants leave the GEMM alone."""
    if mutant and mutant not in MUTANTS.values():
        raise ValueError(f"{NAME}: unknown mutant {mutant}; known: {MUTANTS}")
    return 0 if mutant in _QUANT_MUTANTS else mutant


# --------------------------------------------------------------------------- stage taps
STAGES = ("act_quant", "dequant", "proj", "qk_norm", "rope", "layout")
STAGES_W4A16 = STAGES[1:]


def _override(override, name, shape, dtype, device) -> torch.Tensor:
    t = override[name]
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(shape):
        got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{NAME}: override[{name!r}] must be a tensor of shape {tuple(shape)}, got {got}")
    return t.to(device=device, dtype=dtype).contiguous()


def forward_staged(*inputs, taps: MutableMapping[str, torch.Tensor] | None = None,
                   override: Mapping[str, torch.Tensor] | None = None, config=None,
                   activations: str = "nvfp4"):
    """The same computation as :func:`forward`, one launch per stage, for the error budget.

    Taps (same layouts as the reference's): ``act_quant`` float64 [B, S, H] (x_hat = xs *
    global decode, exact), with ``act_quant.codes`` uint8 [B, S, H], ``act_quant.scales``
    uint8 [B, S, H/16] and ``act_quant.global_decode`` fp32 0-d; ``dequant`` fp32 [q+2kv, H]
    (= code*scale*global), ``proj`` fp32 [B, S, q+2kv], ``qk_norm`` and ``rope`` fp32
    [B, S, q+kv], ``layout`` bf16 [B, Hq+2Hkv, S, D]. ``override={stage: tensor}`` replaces
    a stage's output and continues from it: an ``act_quant`` x_hat is divided by this x's
    global decode scale and rounded to bf16 (which gives back xs exactly when x_hat is the
    oracle's), an overridden ``dequant`` is used as a bf16 weight whose global scale is 1,
    proj/qk_norm/rope are read as fp32, layout as bf16. ``activations="bf16"``: the
    ``w4a16`` variant (:func:`forward_w4a16`), without the ``act_quant`` stage."""
    if activations not in ("nvfp4", "bf16"):
        raise ValueError(f"{NAME}: activations must be 'nvfp4' or 'bf16', got {activations!r}")
    stages = STAGES if activations == "nvfp4" else STAGES_W4A16
    override = dict(override or {})
    unknown = sorted(set(override) - set(stages))
    if unknown:
        raise ValueError(f"{NAME}: unknown stage(s) {unknown} in override; stages: {', '.join(stages)}")
    if isinstance(config, str):
        config = KernelConfig.parse(config)
    bound = _bind(inputs, False)
    inputs = [t.contiguous() if isinstance(t, torch.Tensor) else t for t in inputs]
    (x, cos, sin, wq, sq, gq, wk, sk, gk, wv, sv, gv, qn, kn, eps) = inputs
    b, s, hidden = bound["batch_size"], bound["seq_len"], bound["hidden_size"]
    hq, hkv, d = bound["num_attention_heads"], bound["num_key_value_heads"], bound["head_dim"]
    m, n, nqk = b * s, (hq + 2 * hkv) * d, (hq + hkv) * d
    dev = x.device

    def emit(name, value):
        if taps is not None:
            taps[name] = value

    # 1. act_quant (W4A4 only)
    act = None
    if activations == "nvfp4":
        aq = act_quant(x, (gq, gk, gv), codes="act_quant" not in override)
        if "act_quant" in override:
            x_hat = _override(override, "act_quant", (b, s, hidden), torch.float64, dev)
            xs = (x_hat / aq.global_decode.to(torch.float64)).to(torch.bfloat16)
            act_tap = xs.to(torch.float64) * aq.global_decode.to(torch.float64)
        else:
            xs = aq.xs
            emit("act_quant.codes", aq.codes)
            emit("act_quant.scales", aq.scales)
            emit("act_quant.global_decode", aq.global_decode)
            act_tap = aq.dequantize(torch.float64)
        act = (xs, aq.gs, aq.global_decode)
        emit("act_quant", act_tap)

    # 2. dequant
    w_dense = None
    if "dequant" in override:
        w_dense = _override(override, "dequant", (n, hidden), torch.bfloat16, dev)
        emit("dequant", w_dense)
    elif taps is not None:
        parts = []
        for w, sc, g in ((wq, sq, gq), (wk, sk, gk), (wv, sv, gv)):
            rows = w.shape[0]
            out = torch.empty((rows, hidden), dtype=torch.float32, device=dev)
            bk = 64 if hidden % 64 == 0 else 16
            _dequant_kernel[(triton.cdiv(rows, 32), hidden // bk)](
                _word_aligned(w), sc, out, float(g), rows, K=hidden, BR=32, BK=bk)
            parts.append(out)
        emit("dequant", torch.cat(parts))

    # 3. proj (the fused kernel's own K loop, stopped before the epilogue)
    if "proj" in override:
        proj = _override(override, "proj", (b, s, n), torch.float32, dev).view(m, n)
    else:
        gemm_act = None
        if act is not None:
            # the quantized activations; with a dense weight only x's global scale remains
            xs, gs, g_dec = act
            gemm_act = (xs, gs if w_dense is None else g_dec.reshape(1).expand(3).contiguous())
        proj = _launch(inputs, mode=_MODE_PROJ, config=config, mutant=0, check_values=False,
                       w_dense=w_dense, act=gemm_act)
    emit("proj", proj.view(b, s, n))

    hp = _pow2_at_least(d // 2, 8)
    bm = 32
    grid = (triton.cdiv(m, bm) * (hq + hkv),)

    def head_stage(src, src_stride, op):
        dst = torch.empty((m, nqk), dtype=torch.float32, device=dev)
        if m:
            _head_stage_kernel[grid](src, dst, cos, sin, qn, kn,
                                     float(eps), m, src_stride, nqk,
                                     HQ=hq, HKV=hkv, D=d, HP=hp, BM=bm, OP=op)
        return dst

    # 4. qk_norm, 5. rope
    if "qk_norm" in override:
        normed = _override(override, "qk_norm", (b, s, nqk), torch.float32, dev).view(m, nqk)
    else:
        normed = head_stage(proj, n, 0)
    emit("qk_norm", normed.view(b, s, nqk))
    if "rope" in override:
        roped = _override(override, "rope", (b, s, nqk), torch.float32, dev).view(m, nqk)
    else:
        roped = head_stage(normed, nqk, 1)
    emit("rope", roped.view(b, s, nqk))

    # 6. layout: [B, S, h, D] -> [B, h, S, D], bf16
    if "layout" in override:
        layout = _override(override, "layout", (b, hq + 2 * hkv, s, d), torch.bfloat16, dev)
    else:
        layout = torch.cat([roped.view(b, s, hq + hkv, d), proj[:, nqk:].reshape(b, s, hkv, d)],
                           dim=2).transpose(1, 2).to(torch.bfloat16).contiguous()
    emit("layout", layout)
    return tuple(t.contiguous() for t in torch.split(layout, [hq, hkv, hkv], dim=1))


def forward_w4a16_staged(*inputs, taps: MutableMapping[str, torch.Tensor] | None = None,
                         override: Mapping[str, torch.Tensor] | None = None, config=None):
    """The stage-tap protocol of :func:`forward_w4a16` (``forward_staged`` without act_quant)."""
    return forward_staged(*inputs, taps=taps, override=override, config=config, activations="bf16")


forward.staged = forward_staged
forward_w4a16.staged = forward_w4a16_staged
