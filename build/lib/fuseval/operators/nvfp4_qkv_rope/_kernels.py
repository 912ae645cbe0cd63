"""Op B's Triton device code: the FP4 weight decode, the fused GEMM kernel with its
q/k RMS norm + RoPE + layout epilogue, and the stage-tap kernels.

What the fused kernel computes, for every token m of the B*S tokens and every head tile
(32 q heads, 8 k heads, 8 v heads at seed size, one launch for all 48), with a = xs
(W4A4, see ``_quant.py``) or x (W4A16) and g = gs[p] or the weights' global decode scale:

    acc[m, :] = sum_k a[m, k] * e2m1(code[n, k]) * e4m3(scale[n, k // 16])   (fp32)
    t         = acc * g                                                       (fp32)
    q, k:       t = rope(rms_norm(t)) over the head's D columns               (fp32)
    out[b, head, s, :] = bf16(t)

Design, and why:

* **The decode is exact bit arithmetic.** Each K step loads the packed FP4 codes (as int32
  words, 8 codes each) and the e4m3 scale bytes of the tile: an e2m1 code ``s.ee.m`` moved
  to fp32 bits 31 and 24..22 is its value times 2^-126 (code 0.5 becomes the fp32
  subnormal 2^-127), an e4m3 byte ``s.eeee.mmm`` moved to fp32 bits 31 and 26..20 is its
  value times 2^-120; two exact multiplies by 2^119 and one fp32 product give
  ``code * scale * 2^-8`` exactly (``_decode_nvfp4``); the 2^8 is folded into the global
  scale.
* **bf16 MMA, exactly.** An e2m1 value has 2 significant bits and an e4m3 value 4, so their
  product (at most 6 bits, range 2^-10 .. 2688) is exact in bf16; so are the quantized
  activations xs. The only roundings are the fp32 accumulation, the fp32 epilogue and the
  final bf16 store.
* **Which operand the weights are.** ``W_AS_A`` computes acc^T = W x^T: the decoded weights
  are the dot's first operand, x streams as the second.
* **One N tile = one head** (or two, ``HPT``). The tile's columns are the head's two RoPE
  halves (``[0, HP)`` = d in [0, D/2), ``[HP, 2HP)`` = d in [D/2, D), each half padded to a
  power of two >= 8 so that tiny head dims make legal dot shapes), so the norm (over the
  whole head row) and rotate_half (same position in the other half) are register-local.
* **Layout in the store.** Token m = b*S + s of head h goes to ``((b*heads + h)*S + s)*D + d``.
* **Ragged sizes.** Token rows are masked; the K loop is masked in 16-column steps when BK
  does not divide hidden_size.
* **Interpreter.** Under ``TRITON_INTERPRET=1`` the dot runs on fp32 operands (the
  interpreter has no bf16 arithmetic) holding the same exact values; its fp32 -> bf16 cast
  truncates, so ``_to_bf16`` rounds to nearest even by hand there.

``MUTANT`` (constexpr) plants one deliberate bug for the tests; :data:`GEMM_MUTANT_CODES`
names them, and only the launcher (``_launch.py``) passes a non-zero code.
"""
from __future__ import annotations

from ... import fast as _kernel_runtime  # noqa: F401  (before triton: selects the interpreter on CPU-only machines)
import triton
import triton.language as tl

# The fused kernel's MUTANT constexpr for each planted bug (0: the production kernel).
GEMM_MUTANT_CODES = {
    "swapped_nibbles": 1,
    "scale_wrong_block": 2,
    "no_global_scale": 3,
    "norm_wrong_axis": 4,
    "rope_halves_swapped": 5,
    "layout_bshd": 6,
    "gqa_head_shift": 7,
}

# what the fused kernel's epilogue writes (MODE)
MODE_FULL = 0   # norm + rope + layout, bf16 outputs (production)
MODE_PROJ = 1   # the fp32 projection (acc * global scale) into a [M, N] buffer (stage taps)


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



@triton.jit
def _predecode_kernel(wq_ptr, sq_ptr, wk_ptr, sk_ptr, wv_ptr, sv_ptr, out_ptr,
                      NQ: tl.constexpr, NKV: tl.constexpr, K: tl.constexpr, BR: tl.constexpr,
                      BK: tl.constexpr):
    """W = code * scale as bf16 (exact: at most 6 significant bits) for the q, k and v weight
    rows stacked into [NQ + 2 NKV, K]: the weights decoded once per call, for the GEMMs that
    then read a dense bf16 operand (KernelConfig.predecode). BR divides NQ and NKV, BK divides K."""
    _predecode_tile(wq_ptr, sq_ptr, wk_ptr, sk_ptr, wv_ptr, sv_ptr, out_ptr, tl.program_id(0) * BR,
                    tl.program_id(1) * BK, NQ, NKV, K, BR, BK)


@triton.jit
def _predecode_tile(wq_ptr, sq_ptr, wk_ptr, sk_ptr, wv_ptr, sv_ptr, out_ptr, r0, k0,
                    NQ: tl.constexpr, NKV: tl.constexpr, K: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr):
    """Rows [r0, r0 + BR) x columns [k0, k0 + BK) of the stacked predecoded weights."""
    if r0 < NQ:
        w_ptr = wq_ptr
        s_ptr = sq_ptr
        first = r0
    elif r0 < NQ + NKV:
        w_ptr = wk_ptr
        s_ptr = sk_ptr
        first = r0 - NQ
    else:
        w_ptr = wv_ptr
        s_ptr = sv_ptr
        first = r0 - NQ - NKV
    rows = (first + tl.arange(0, BR)).to(tl.int64)[:, None]
    packed = tl.load(w_ptr.to(tl.pointer_type(tl.int32)) + rows * (K // 8) + k0 // 8
                     + tl.arange(0, BK // 8)[None, :])
    sbits = tl.load(s_ptr.to(tl.pointer_type(tl.uint8)) + rows * (K // 16) + k0 // 16
                    + tl.arange(0, BK // 16)[None, :])
    w = _decode_nvfp4(packed, sbits, BR, BK, False) * 256.0      # 2^8: the decode's offset
    out_rows = (r0 + tl.arange(0, BR)).to(tl.int64)[:, None]
    tl.store(out_ptr + out_rows * K + k0 + tl.arange(0, BK)[None, :], w.to(tl.bfloat16))
