"""Op B fast path: ``nvfp4_qkv_rope`` as one fused Triton kernel.

What the kernel computes (SPEC.md, op B), for every token m of the B*S tokens and every
head tile (32 q heads, 8 k heads, 8 v heads at seed size, one launch for all 48):

    acc[m, :] = sum_k x[m, k] * e2m1(code[n, k]) * e4m3(scale[n, k // 16])   (fp32)
    t         = acc * global_decode_scale                                     (fp32)
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
  default table, head_dim 128) runs ``fast/_nvfp4_gluon.py`` instead: the same decode and
  epilogue arithmetic, but with explicit layouts, so that the decoded tile goes straight
  into the swizzled shared-memory layout the tensor cores read (no second shuffle), x
  arrives by TMA, and the product is transposed (tokens as the wgmma's N). Mutants,
  stage taps, other head sizes and the interpreter use the Triton kernel below (the
  tests run both; ``TRITON_FOR_GLUON`` picks its config). Measured and explained in
  benchmarks/notes_nvfp4_qkv_rope.md.

The module also carries the stage-tap protocol (``forward.staged``): the same decode,
GEMM, norm and RoPE code run as separate launches that expose each SPEC stage, and
deliberately broken *mutants* of the fused kernel (constexpr ``MUTANT``) that the tests
use to prove the checks catch each kind of bug.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, MutableMapping

import torch
import triton
import triton.language as tl

from ..definitions import load

NAME = "nvfp4_qkv_rope"

__all__ = ["forward", "forward_staged", "KernelConfig", "pick_config", "MUTANTS"]

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
}

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
    if MUTANT == 3:      # mutant: the global scale forgotten (the decode's 2^8 kept)
        acc = acc * 256.0
    elif not W_DENSE:
        if GS_FROM_PTR:
            gs = tl.load(gs_ptr + (h >= HQ).to(tl.int32) + (h >= HQ + HKV).to(tl.int32))
        else:
            if h < HQ:
                gs = gs_q
            elif h < HQ + HKV:
                gs = gs_k
            else:
                gs = gs_v
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
    gluon: bool = False       # Hopper: the Gluon kernel (fast/_nvfp4_gluon.py) where it applies

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
# H200 (benchmarks/notes_nvfp4_qkv_rope.md): the Gluon kernel (fast/_nvfp4_gluon.py) with
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
    from ..validate import bind_axes
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


def _launch(inputs, *, mode: int, config: KernelConfig | None, mutant: int,
            check_values: bool, w_dense: torch.Tensor | None = None):
    plan = _plan(inputs, mode, config, mutant, w_dense is not None, check_values)
    if not plan.contiguous:
        inputs = [t.contiguous() if isinstance(t, torch.Tensor) else t for t in inputs]
    (x, cos, sin, wq, sq, gq, wk, sk, gk, wv, sv, gv, qn, kn, eps) = inputs
    b, s, hq, hkv, d, m = plan.b, plan.s, plan.hq, plan.hkv, plan.d, plan.m
    dev = x.device

    # global decode scales: Python floats go in as fp32 kernel arguments; tensors (0-d or
    # one-element, any device) are read on the device to avoid a host sync
    if isinstance(gq, torch.Tensor) or isinstance(gk, torch.Tensor) or isinstance(gv, torch.Tensor):
        gs_vec = torch.stack([torch.as_tensor(g).reshape(()).to(device=dev, dtype=torch.float32)
                              for g in (gq, gk, gv)])
        gs_args, gs_from_ptr = (gs_vec, 1.0, 1.0, 1.0), True
    else:
        gs_args, gs_from_ptr = (x, float(gq), float(gk), float(gv)), False

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
    if plan.gluon is not None and x.data_ptr() % 16 == 0:
        from . import _nvfp4_gluon
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
    """The fused NVFP4 QKV projection + q/k RMSNorm + RoPE (production path).

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
    return _launch(inputs, mode=_MODE_FULL, config=config, mutant=int(_mutant),
                   check_values=check_values)


# --------------------------------------------------------------------------- stage taps
STAGES = ("dequant", "proj", "qk_norm", "rope", "layout")


def _override(override, name, shape, dtype, device) -> torch.Tensor:
    t = override[name]
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(shape):
        got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{NAME}: override[{name!r}] must be a tensor of shape {tuple(shape)}, got {got}")
    return t.to(device=device, dtype=dtype).contiguous()


def forward_staged(*inputs, taps: MutableMapping[str, torch.Tensor] | None = None,
                   override: Mapping[str, torch.Tensor] | None = None, config=None):
    """The same computation as :func:`forward`, one launch per stage, for the error budget.

    Taps (same layouts as the reference's): ``dequant`` fp32 [q+2kv, H] (= code*scale*global),
    ``proj`` fp32 [B, S, q+2kv], ``qk_norm`` and ``rope`` fp32 [B, S, q+kv], ``layout`` bf16
    [B, Hq+2Hkv, S, D]. ``override={stage: tensor}`` replaces a stage's output, cast to its
    native dtype (bf16 for an overridden ``dequant``, whose global scale is then 1; fp32 for
    proj/qk_norm/rope; bf16 for layout), and continues from it."""
    override = dict(override or {})
    unknown = sorted(set(override) - set(STAGES))
    if unknown:
        raise ValueError(f"{NAME}: unknown stage(s) {unknown} in override; stages: {', '.join(STAGES)}")
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

    # 1. dequant
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

    # 2. proj (the fused kernel's own K loop, stopped before the epilogue)
    if "proj" in override:
        proj = _override(override, "proj", (b, s, n), torch.float32, dev).view(m, n)
    else:
        proj = _launch(inputs, mode=_MODE_PROJ, config=config, mutant=0, check_values=False,
                       w_dense=w_dense)
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

    # 3. qk_norm, 4. rope
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

    # 5. layout: [B, S, h, D] -> [B, h, S, D], bf16
    if "layout" in override:
        layout = _override(override, "layout", (b, hq + 2 * hkv, s, d), torch.bfloat16, dev)
    else:
        layout = torch.cat([roped.view(b, s, hq + hkv, d), proj[:, nqk:].reshape(b, s, hkv, d)],
                           dim=2).transpose(1, 2).to(torch.bfloat16).contiguous()
    emit("layout", layout)
    return tuple(t.contiguous() for t in torch.split(layout, [hq, hkv, hkv], dim=1))


forward.staged = forward_staged
