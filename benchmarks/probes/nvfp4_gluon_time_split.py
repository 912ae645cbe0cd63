"""Timing probes of op B's in-loop-decode Gluon kernel (2026-11-30): where the time of the
GEMM goes, at M tokens (GPU only).

This file holds its own copy of the kernel (as it was shipped on 2026-12-01, with the
``PROBE`` switch that the production kernel in ``fuseval.operators.nvfp4_qkv_rope._gluon``
does not carry) and of the decode helpers it uses. Probe variants compute wrong outputs:
they exist to time parts of the loop.

For each config 'BM,BK,STAGES[,HPT[,W_AS_A]]' every probe of ``launch``: 0 the launch as
is, 1 the FP4 decode replaced by a constant tile, 2 no tensor-core products, 3 only the
stream of x tiles (TMA from L2/HBM into the slot ring), 4 only the decode (no x, no
products), 5 only the products (slots filled once), 6 = 5 without the per-step fence and
CTA barrier, 7 = 6 without the epilogue, 8 = 4 without the per-step fence and barrier.
Last, cuBLAS's bf16 product of x with dequantized weights of the same shape (no decode,
no epilogue), the rate a plain GEMM reaches here. If the full kernel takes about the sum
of two parts, those parts do not overlap; if it takes about one part alone, that part is
the limit. Probe 3 also reports the rate at which x arrives (each of the 48 / HPT head
tiles of a token tile reads the same x rows again). The first config's outputs are the
reference the others' must match bit for bit where they compute the same products in the
same order (same BK), and match within bf16 rounding otherwise.

    PYTHONPATH=src python3 benchmarks/probes/nvfp4_gluon_time_split.py [--m 8192] [--configs '256,64,4,1,1;256,64,5,1,1:0,3'] [--probes 0,1,2,3,4,5,6,7,8]

Measured (H200, 2026-11-30): docs/design/nvfp4_qkv_rope.md, "where the time goes".
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from fuseval.bench import time_call
from fuseval.operators import load
from fuseval.inputs import generate_inputs


# --------------------------------------------------------------------------- the kernel's copy
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



@gluon.jit
def _decode_words(v, scale):
    """uint32 words v [R, NB, 2] (8 codes each, low nibble first) times their block scale
    [R, NB, 1] (value * 2^118) -> bf16 [R, NB, 2, 8] = code * scale * 2^-8, exactly.
    Nested joins put code j of a word last in the order j = 4a + 2b + c (a: innermost)."""
    n0 = (_nibble_f32(v, 0) * scale).to(gl.bfloat16)
    n1 = (_nibble_f32(v, 1) * scale).to(gl.bfloat16)
    n2 = (_nibble_f32(v, 2) * scale).to(gl.bfloat16)
    n3 = (_nibble_f32(v, 3) * scale).to(gl.bfloat16)
    n4 = (_nibble_f32(v, 4) * scale).to(gl.bfloat16)
    n5 = (_nibble_f32(v, 5) * scale).to(gl.bfloat16)
    n6 = (_nibble_f32(v, 6) * scale).to(gl.bfloat16)
    n7 = (_nibble_f32(v, 7) * scale).to(gl.bfloat16)
    even = gl.join(gl.join(n0, n4), gl.join(n2, n6))
    odd = gl.join(gl.join(n1, n5), gl.join(n3, n7))
    return gl.join(even, odd)


@gluon.jit
def _tile(pid, wq_ptr, sq_ptr, wk_ptr, sk_ptr, wv_ptr, sv_ptr, HQ: gl.constexpr, HKV: gl.constexpr,
          BM: gl.constexpr, HPT: gl.constexpr):
    """The program's tile: first head h (heads vary fastest, so the tiles in flight share
    their x rows in L2), first token, and where its weights' codes and scales start."""
    NT: gl.constexpr = HQ + 2 * HKV
    h = (pid % (NT // HPT)) * HPT
    off_m = (pid // (NT // HPT)) * BM
    w_base, s_base, row0 = _head_weights(h, wq_ptr, sq_ptr, wk_ptr, sk_ptr, wv_ptr, sv_ptr, HQ, HKV, 128, False)
    return h, off_m, w_base, s_base, row0


@gluon.jit
def _weight_pointers(w_base, s_base, row0, K: gl.constexpr, BN: gl.constexpr, NB: gl.constexpr,
                     num_warps: gl.constexpr):
    """Addresses of the first K step of the tile's BN weight rows: codes as uint32 words
    [BN, NB, 2] and scale bytes [BN, NB]. Layout: a thread holds 2 blocks x 2 words of
    one row = 16 contiguous bytes (one vector load) = 32 contiguous decoded values."""
    L3: gl.constexpr = gl.BlockedLayout([1, 2, 2], [16, NB // 2, 1], [num_warps, 1, 1], [2, 1, 0])
    LS: gl.constexpr = gl.SliceLayout(2, L3)
    r = gl.arange(0, BN, layout=gl.SliceLayout(1, LS))
    bq = gl.arange(0, NB, layout=gl.SliceLayout(0, LS))
    word = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    rows = (row0 + r).to(gl.int64)
    c_offs = gl.expand_dims(gl.expand_dims(rows * (K // 8), 1) + gl.expand_dims(bq * 2, 0), 2) \
        + gl.expand_dims(gl.expand_dims(word, 0), 1)
    s_offs = gl.expand_dims(rows * (K // 16), 1) + gl.expand_dims(bq, 0)
    return w_base.to(gl.pointer_type(gl.uint32)) + c_offs, s_base + s_offs


@gluon.jit
def _epilogue(acc, h, off_m, cos_ptr, sin_ptr, gs_ptr, gs_q, gs_k, gs_v, qn_ptr, kn_ptr, eps,
              q_out, k_out, v_out, M, S, HQ: gl.constexpr, HKV: gl.constexpr, BM: gl.constexpr,
              HPT: gl.constexpr, GS_FROM_PTR: gl.constexpr, num_warps: gl.constexpr):
    """Global scale, q/k RMS norm and RoPE, bf16 store into [B, heads, S, D]. The tile is
    viewed as [BM, HPT heads, 2 halves, 64] with both halves of a head's row segment in
    one thread, so the RMS norm (over 128) and rotate_half are register-local."""
    D: gl.constexpr = 128
    HALF: gl.constexpr = 64
    if GS_FROM_PTR:
        gs = gl.load(gs_ptr + (h >= HQ).to(gl.int32) + (h >= HQ + HKV).to(gl.int32))
    elif h < HQ:
        gs = gs_q
    elif h < HQ + HKV:
        gs = gs_k
    else:
        gs = gs_v
    E4: gl.constexpr = gl.BlockedLayout([1, HPT, 2, 32], [16, 1, 1, 2], [num_warps, 1, 1, 1], [3, 2, 1, 0])
    # 2^8: the decode's offset (see _decode_words)
    t = gl.convert_layout(gl.reshape(acc, [BM, HPT, 2, HALF]), E4) * (gs * 256.0)
    # index vectors, each expanded to a broadcastable 4-D shape
    tok = off_m + gl.arange(0, BM, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, E4))))
    hd = gl.arange(0, HPT, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, E4))))
    half = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, E4))))
    j = gl.arange(0, HALF, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, E4))))
    tok4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(tok, 1), 2), 3)      # [BM, 1, 1, 1]
    hd4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(hd, 0), 2), 3)        # [1, HPT, 1, 1]
    half4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(half, 0), 1), 3)    # [1, 1, 2, 1]
    j4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(j, 0), 1), 2)          # [1, 1, 1, 64]
    col = half4 * HALF + j4                                                  # d within the head
    tok_ok = tok4 < M
    is_lo = (half4 == 0).to(gl.float32)
    if h < HQ + HKV:
        if h < HQ:
            nw_ptr = qn_ptr
        else:
            nw_ptr = kn_ptr
        nw = gl.load(nw_ptr + col).to(gl.float32)
        ss = gl.sum(gl.sum(t * t, axis=3), axis=2)                           # [BM, HPT]
        rinv = gl.rsqrt(ss * (1.0 / D) + eps)
        t = t * gl.expand_dims(gl.expand_dims(rinv, 2), 3) * nw
        cs = tok4.to(gl.int64) * D + col
        c = gl.load(cos_ptr + cs, mask=tok_ok, other=0.0).to(gl.float32)
        sn = gl.load(sin_ptr + cs, mask=tok_ok, other=0.0).to(gl.float32)
        # rotate_half([lo | hi]) = [-hi | lo]: the partner of each value is the other half
        lo = gl.expand_dims(gl.sum(t * is_lo, axis=2), 2)
        hi = gl.expand_dims(gl.sum(t * (1.0 - is_lo), axis=2), 2)
        t = t * c + (hi * (-is_lo) + lo * (1.0 - is_lo)) * sn
    if h < HQ:
        out_ptr = q_out
        hl = h
        nh = h * 0 + HQ                           # run-time values: the branches yield one type
    elif h < HQ + HKV:
        out_ptr = k_out
        hl = h - HQ
        nh = h * 0 + HKV
    else:
        out_ptr = v_out
        hl = h - HQ - HKV
        nh = h * 0 + HKV
    b = tok4 // S
    s = tok4 - b * S
    dst = ((b * nh + hl + hd4) * S + s).to(gl.int64) * D + col
    gl.store(out_ptr + dst, t.to(gl.bfloat16), mask=tok_ok)


@gluon.jit
def _decode_step(codes, sbits, BN: gl.constexpr, BK: gl.constexpr):
    """One K step's weight tile [BN, BK] bf16 = code * scale * 2^-8, exactly (k = 16 block
    + 8 word + code)."""
    scale = gl.expand_dims(_e4m3_f32(sbits.to(gl.int32)), 2)
    return gl.reshape(_decode_words(codes, scale), [BN, BK])


@gluon.jit
def nvfp4_qkv_rope_gluon_kernel(
        x_desc, cos_ptr, sin_ptr,
        wq_ptr, sq_ptr, wk_ptr, sk_ptr, wv_ptr, sv_ptr,
        gs_ptr, gs_q, gs_k, gs_v, qn_ptr, kn_ptr, eps,
        q_out, k_out, v_out, M, S,
        K: gl.constexpr, HQ: gl.constexpr, HKV: gl.constexpr,
        BM: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, HPT: gl.constexpr,
        W_AS_A: gl.constexpr, GS_FROM_PTR: gl.constexpr, num_warps: gl.constexpr, PROBE: gl.constexpr = 0):
    """Every warp decodes its share of the weight tile, then every warpgroup issues its
    MMA. W_AS_A: the product is computed transposed, acc^T [BN, BM] = W x^T, so that the
    wgmma's N is the BM tokens (256) rather than one head (128): per FLOP the tensor
    cores then read fewer operand bytes from shared memory, whose bandwidth the x copies,
    the weight stores and the MMA operands share."""
    BN: gl.constexpr = HPT * 128                  # HPT whole heads per program
    NK: gl.constexpr = K // BK
    NB: gl.constexpr = BK // 16                   # scale blocks per K step
    # x tiles in flight ahead of the MMA. A slot is refilled three steps after its MMA
    # was issued: warps wait for their own MMAs only, and one barrier per step keeps them
    # within one step of each other, so step k may only reuse what step k-3 read.
    AHEAD: gl.constexpr = STAGES - 3
    WSLOTS: gl.constexpr = 3
    if W_AS_A:
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                      instr_shape=[16, BM, 16])
        acc = gl.zeros([BN, BM], gl.float32, layout=MMA)
    else:
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                      instr_shape=[16, BN, 16])
        acc = gl.zeros([BM, BN], gl.float32, layout=MMA)
    W_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BK], gl.bfloat16)
    W_PROBE: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    # timing probes (see ``launch``): which parts of the loop run. 0 runs them all.
    X_STREAM: gl.constexpr = PROBE <= 3           # x tiles refilled by TMA in the loop
    X_RESIDENT: gl.constexpr = PROBE >= 5 and PROBE <= 7    # x slots filled once, reused
    DECODE_ONCE: gl.constexpr = PROBE >= 5 and PROBE <= 7   # weight slots decoded once, reused
    STEP_SYNC: gl.constexpr = PROBE <= 5          # fence + CTA barrier every step
    MMA_ON: gl.constexpr = PROBE <= 1 or (PROBE >= 5 and PROBE <= 7)
    h, off_m, w_base, s_base, row0 = _tile(gl.program_id(0), wq_ptr, sq_ptr, wk_ptr, sk_ptr, wv_ptr, sv_ptr,
                                           HQ, HKV, BM, HPT)
    c_ptrs, s_ptrs = _weight_pointers(w_base, s_base, row0, K, BN, NB, num_warps)

    # ---- shared memory: x ring (TMA), three decoded-weight slots, one barrier per x slot
    x_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], x_desc.layout)
    w_smem = gl.allocate_shared_memory(gl.bfloat16, [WSLOTS, BN, BK], W_SMEM)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    # the first x tiles: AHEAD of them when x streams, every slot once for probes 5-7
    PROLOGUE: gl.constexpr = STAGES if X_RESIDENT else (AHEAD if X_STREAM else 0)
    for i in gl.static_range(PROLOGUE):
        mbarrier.expect(bars.index(i), x_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(x_desc, [off_m, i * BK], bars.index(i), x_smem.index(i))
    if X_RESIDENT:
        for i in gl.static_range(STAGES):
            mbarrier.wait(bars.index(i), phase=0)

    # codes and scales are loaded two steps before their decode (registers carried by
    # the loop), so that their global-memory latency hides behind two steps of work
    codes_1 = gl.load(c_ptrs)
    sbits_1 = gl.load(s_ptrs)
    codes_2 = gl.load(c_ptrs + gl.minimum(1, NK - 1) * (BK // 8))
    sbits_2 = gl.load(s_ptrs + gl.minimum(1, NK - 1) * NB)
    for kk in range(NK):
        codes = codes_1
        sbits = sbits_1
        codes_1 = codes_2
        sbits_1 = sbits_2
        ahead = gl.minimum(kk + 2, NK - 1)        # the last steps reload the last tile
        codes_2 = gl.load(c_ptrs + ahead * (BK // 8))
        sbits_2 = gl.load(s_ptrs + ahead * NB)
        # decode step kk while the MMA of step kk-1 runs
        # this weight slot and the x slot refilled below were last read by the MMA of
        # step kk-3, finished in every warpgroup (see AHEAD)
        if PROBE == 1:          # timing probe: the decode replaced by a constant tile
            w_smem.index(kk % WSLOTS).store(gl.full([BN, BK], 1.0, gl.bfloat16, layout=W_PROBE))
        elif DECODE_ONCE:
            if kk < WSLOTS:
                w_smem.index(kk % WSLOTS).store(_decode_step(codes, sbits, BN, BK))
        elif PROBE != 3:
            w_smem.index(kk % WSLOTS).store(_decode_step(codes, sbits, BN, BK))
        if X_STREAM:
            nxt = kk + AHEAD
            if nxt < NK:
                mbarrier.expect(bars.index(nxt % STAGES), x_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(x_desc, [off_m, nxt * BK], bars.index(nxt % STAGES),
                                                x_smem.index(nxt % STAGES))
        if STEP_SYNC:
            fence_async_shared()
            gl.thread_barrier()                   # every warp's part of the tile is written
        elif DECODE_ONCE:
            if kk < WSLOTS:
                fence_async_shared()
                gl.thread_barrier()
        if X_STREAM:
            mbarrier.wait(bars.index(kk % STAGES), phase=(kk // STAGES) & 1)
        if MMA_ON:
            if W_AS_A:
                acc = warpgroup_mma(w_smem.index(kk % WSLOTS), x_smem.index(kk % STAGES).permute((1, 0)), acc,
                                    is_async=True)
            else:
                acc = warpgroup_mma(x_smem.index(kk % STAGES), w_smem.index(kk % WSLOTS).permute((1, 0)), acc,
                                    is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))
    if W_AS_A:
        acc = gl.permute(acc, (1, 0))
    if PROBE == 7:              # timing probe 7: an epilogue that never runs keeps the MMAs
        if M < 0:
            _epilogue(acc, h, off_m, cos_ptr, sin_ptr, gs_ptr, gs_q, gs_k, gs_v, qn_ptr, kn_ptr, eps,
                      q_out, k_out, v_out, M, S, HQ, HKV, BM, HPT, GS_FROM_PTR, num_warps)
    else:
        _epilogue(acc, h, off_m, cos_ptr, sin_ptr, gs_ptr, gs_q, gs_k, gs_v, qn_ptr, kn_ptr, eps,
                  q_out, k_out, v_out, M, S, HQ, HKV, BM, HPT, GS_FROM_PTR, num_warps)


def launch(x2d, cos, sin, w, s, gs_args, gs_from_ptr, qn, kn, eps, outs, m, seq, hq, hkv, *,
           block_m: int, block_k: int, stages: int, heads_per_tile: int = 1, w_as_a: bool = False,
           num_warps: int = 8, probe: int = 0):
    """One launch over (token tiles x heads). ``w``/``s``: the q, k, v codes and scales as
    uint8 tensors; ``gs_args``: (tensor or dummy, gq, gk, gv). ``w_as_a``: the transposed
    product (weights as the wgmma's A operand, tokens as its N). ``probe`` (timing
    experiments only, wrong outputs): 1 replaces the decode by a constant tile, 2 skips
    the tensor-core products, 3 only streams the x tiles (no decode, no products), 4 only
    decodes (no x, no products), 5 only multiplies (x and weight slots filled once and
    reused, so neither the x stream nor the decode is in the loop), 6 is 5 without the
    per-step fence and CTA barrier, 7 is 6 without the epilogue, 8 is 4 without the
    per-step fence and barrier."""
    layout = gl.NVMMASharedLayout.get_default_for([block_m, block_k], gl.bfloat16)
    x_desc = TensorDescriptor.from_tensor(x2d, [block_m, block_k], layout)
    grid = (triton.cdiv(m, block_m) * ((hq + 2 * hkv) // heads_per_tile),)
    nvfp4_qkv_rope_gluon_kernel[grid](
        x_desc, cos, sin, w[0], s[0], w[1], s[1], w[2], s[2], *gs_args, qn, kn, float(eps),
        outs[0], outs[1], outs[2], m, seq,
        K=x2d.shape[1], HQ=hq, HKV=hkv, BM=block_m, BK=block_k, STAGES=stages, HPT=heads_per_tile,
        W_AS_A=w_as_a, GS_FROM_PTR=gs_from_ptr, num_warps=num_warps, PROBE=probe)


# --------------------------------------------------------------------------- the probe
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=8192)
    ap.add_argument("--configs", default="256,64,4,1,1;128,64,4,2,1")
    ap.add_argument("--probes", default="0,1,2,3,4,5,6,7,8")
    args = ap.parse_args()
    defn = load("nvfp4_qkv_rope")
    inputs = generate_inputs(defn, {"seq_len": args.m, "batch_size": 1}, seed=1, device="cuda")
    (x, cos, sin, wq, sq, gq, wk, sk, gk, wv, sv, gv, qn, kn, eps) = inputs
    u8 = lambda t: t.view(torch.uint8)          # noqa: E731
    flops = 2 * args.m * 6144 * 4096

    def run(bm, bk, stages, hpt=1, w_as_a=0, probe=0):
        outs = [torch.full((1, h, args.m, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
                for h in (32, 8, 8)]
        fn = lambda: launch(x.view(args.m, -1), cos, sin, [u8(wq), u8(wk), u8(wv)],  # noqa: E731
                              [u8(sq), u8(sk), u8(sv)], (x, float(gq), float(gk), float(gv)), False,
                              qn, kn, float(eps), outs, args.m, args.m, 32, 8, block_m=bm, block_k=bk,
                              stages=stages, heads_per_tile=hpt, w_as_a=bool(w_as_a), probe=probe)
        fn()
        torch.cuda.synchronize()
        return fn, outs

    w_deq = torch.randn(6144, x.shape[-1], device="cuda", dtype=torch.bfloat16)
    x2d = x.view(args.m, -1)
    t = time_call(lambda: x2d @ w_deq.T, warmup_ms=20, rep_ms=100)
    print(f"{'cuBLAS bf16 GEMM':28s}: {t.median_ms:.4f} ms  ({flops / t.median_ms / 1e9:.0f} TFLOP/s)", flush=True)
    del w_deq
    reference = None
    for text in args.configs.split(";"):
        text, _, only = text.partition(":")           # 'cfg:probes' limits that config's probes
        cfg = [int(v) for v in text.split(",")]
        for probe in [int(p) for p in (only or args.probes).split(",")]:
            fn, outs = run(*cfg, probe=probe)
            note = ""
            if probe == 0:
                if reference is None:
                    reference = [o.clone() for o in outs]
                else:
                    diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(outs, reference))
                    nans = sum(int(o.isnan().sum()) for o in outs)
                    note = f"  max |difference| to the first config: {diff:.3g}, NaN left: {nans}"
            t = time_call(fn, warmup_ms=20, rep_ms=100)
            if probe == 3:
                hpt = cfg[3] if len(cfg) > 3 else 1
                x_bytes = args.m * x.shape[-1] * x.element_size() * (48 // hpt)
                note += f"  x stream {x_bytes / 1e9:.2f} GB at {x_bytes / t.median_ms / 1e9:.2f} TB/s"
            print(f"{text:18s} probe {probe}: {t.median_ms:.4f} ms  ({flops / t.median_ms / 1e9:.0f} TFLOP/s "
                  f"equivalent){note}", flush=True)

if __name__ == "__main__":
    main()
