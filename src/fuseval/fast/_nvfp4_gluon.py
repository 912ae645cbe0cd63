"""Op B's main kernel for Hopper, written in Gluon (Triton's explicit-layout dialect).

Why a second kernel: in the Triton kernel (``nvfp4_qkv_rope._nvfp4_qkv_rope_kernel``) the
compiler picks the layouts. The decoded weight tile comes out of the FP4 decode in one
register layout, the tensor cores want another, and the compiler bridges them with a
round trip through shared memory in every K step. Here the layouts are ours:

* x tiles [BM, BK] arrive by TMA into a ring of ``STAGES`` shared-memory slots (mbarrier
  per slot), ``STAGES - 3`` steps ahead of the MMA.
* Each K step every thread loads 16 contiguous code bytes (four 32-bit words) and the two
  e4m3 scales of one weight row straight from global memory, two steps ahead, decodes
  them in registers with the Triton kernel's own exact bit arithmetic (``code * scale *
  2^-8`` in fp32, then bf16) and writes 32 contiguous bf16 values into one of three
  weight slots, already in the swizzled layout the tensor cores read.
* The wgmma of step k is issued asynchronously and waited for (at most one in flight)
  after the decode of step k + 1 has been written, so decode and MMAs can overlap.
* ``W_AS_A`` computes the product transposed (acc^T = W x^T): the wgmma's N is then the
  BM tokens instead of one head's 128 columns, which lowers the shared-memory traffic per
  FLOP (the production setting on the H200).
* One program = BM tokens x ``HPT`` whole heads; the epilogue applies the global scale,
  the q/k RMS norm and RoPE, and stores bf16 rows of [B, heads, S, D].

Scope: head_dim 128, hidden_size a multiple of 64, sm_90, production calls. Everything
else (the interpreter, mutants, stage taps) runs the Triton kernel; ``nvfp4_qkv_rope``
decides. Where the time goes, and what was tried: benchmarks/notes_nvfp4_qkv_rope.md.
"""
from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

# the same bit-level decode and head selection as the Triton kernel (triton.jit helpers)
from .nvfp4_qkv_rope import _e4m3_f32, _head_weights, _nibble_f32



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


@gluon.constexpr_function
def _reg_a_layout(NB, num_warps):
    """The register layout of one K step's codes for ``REG_A``, on the 6-D view
    [BN/16 row groups, 2, 8, NB blocks, 2 words, 4 byte lanes] of the weight tile, where
    weight row = 16 g + 8 r + l and k = 16 b + 8 w + 2 q + (nibble). It is the wgmma
    A-operand fragment spelled out: lane = 4 l + q (a quad of lanes shares a row and
    lane q takes byte q of every code word, i.e. the k pairs 2q, 2q+1 of each 8), the
    row halves r and the words of a row live in registers, warp = row group."""
    return gl.BlockedLayout([1, 2, 1, int(NB), 2, 1], [1, 1, 8, 1, 1, 4], [int(num_warps), 1, 1, 1, 1, 1],
                            [5, 4, 3, 2, 1, 0])


@gluon.constexpr_function
def _reg_a_codes_layout(NB, num_warps):
    """``_reg_a_layout`` for the code words as loaded: [BN/16, 2, 8, 2 NB], the four lanes
    of a quad holding the same words."""
    return gl.BlockedLayout([1, 2, 1, 2 * int(NB)], [1, 1, 8, 4], [int(num_warps), 1, 1, 1], [3, 2, 1, 0])


@gluon.jit
def _reg_a_pointers(w_base, s_base, row0, K: gl.constexpr, BN: gl.constexpr, NB: gl.constexpr,
                    num_warps: gl.constexpr):
    """Addresses of the first K step for ``REG_A``: code words [BN/16, 2, 8, NB, 2] (all
    eight words of a row in one thread: two 16-byte loads, the same for the four lanes of
    a quad) and scale bytes [BN/16, 2, 8, NB] (one 4-byte load per row)."""
    L6: gl.constexpr = _reg_a_layout(NB, num_warps)
    LW: gl.constexpr = gl.SliceLayout(5, L6)
    LS: gl.constexpr = gl.SliceLayout(4, LW)
    LR: gl.constexpr = gl.SliceLayout(3, LS)                 # [G, 2, 8] rows
    g = gl.arange(0, BN // 16, layout=gl.SliceLayout(1, gl.SliceLayout(2, LR)))
    r = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(2, LR)))
    l = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, LR)))
    rows = gl.expand_dims(gl.expand_dims(g * 16, 1), 2) + gl.expand_dims(gl.expand_dims(r * 8, 0), 2) \
        + gl.expand_dims(gl.expand_dims(l, 0), 1)
    rows = (row0 + rows).to(gl.int64)
    blk = gl.arange(0, NB, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, LS))))
    blk4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(blk, 0), 1), 2)      # [1, 1, 1, NB]
    s_offs = gl.expand_dims(rows * (K // 16), 3) + blk4
    # the codes are loaded as [G, 2, 8, 2 NB] (the row's words in one register run, so the
    # loads are 16 bytes wide) and viewed as [G, 2, 8, NB, 2] by the decode
    LC: gl.constexpr = _reg_a_codes_layout(NB, num_warps)
    rows_c = gl.convert_layout(rows, gl.SliceLayout(3, LC))
    word = gl.arange(0, 2 * NB, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, LC))))
    c_offs = gl.expand_dims(rows_c * (K // 8), 3) + gl.expand_dims(gl.expand_dims(gl.expand_dims(word, 0), 1), 2)
    return w_base.to(gl.pointer_type(gl.uint32)) + c_offs, s_base + s_offs


@gluon.jit
def _decode_step_regs(codes, sbits, DOT: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                      num_warps: gl.constexpr):
    """One K step's weight tile [BN, BK] bf16 = code * scale * 2^-8 (exactly, as
    ``_decode_step``), decoded straight into the wgmma A-operand registers ``DOT``: lane q
    of a quad shifts each word right by 8q and decodes nibbles 0 and 1, which are its
    k = 2q, 2q+1 of those 8. The final conversion only renames registers (no shared memory)."""
    NB: gl.constexpr = BK // 16
    L6: gl.constexpr = _reg_a_layout(NB, num_warps)
    q = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(
        3, gl.SliceLayout(4, L6))))))
    shift = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(q * 8, 0), 1), 2), 3), 4)
    codes = gl.convert_layout(gl.reshape(codes, [BN // 16, 2, 8, NB, 2]), gl.SliceLayout(5, L6))
    v = gl.expand_dims(codes, 5) >> shift.to(gl.uint32)                      # [G, 2, 8, NB, 2, 4]
    scale = gl.expand_dims(gl.expand_dims(_e4m3_f32(sbits.to(gl.int32)), 4), 5)
    lo = (_nibble_f32(v, 0) * scale).to(gl.bfloat16)
    hi = (_nibble_f32(v, 1) * scale).to(gl.bfloat16)
    w = gl.reshape(gl.join(lo, hi), [BN, BK])                   # row 16g+8r+l, k 16b+8w+2q+nib
    return gl.convert_layout(w, DOT)


@gluon.jit
def _reg_a_step(kk, acc, a, a_other, codes, sbits, c_ptrs, s_ptrs, x_desc, x_smem, bars, off_m,
                DOT: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
                AHEAD: gl.constexpr, NK: gl.constexpr, num_warps: gl.constexpr):
    """Step kk of ``_main_loop_reg_a``: ``a`` holds its decoded weights, ``a_other`` those
    of step kk-1 (still read by that step's wgmma). Returns step kk+1's weights in
    ``a_other``'s place and the codes of step kk+2."""
    gl.thread_barrier()                           # both warpgroups retired step kk-2
    nxt = kk + AHEAD
    if nxt < NK:
        mbarrier.expect(bars.index(nxt % STAGES), x_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(x_desc, [off_m, nxt * BK], bars.index(nxt % STAGES),
                                        x_smem.index(nxt % STAGES))
    mbarrier.wait(bars.index(kk % STAGES), phase=(kk // STAGES) & 1)
    acc = warpgroup_mma(a, x_smem.index(kk % STAGES).permute((1, 0)), acc, is_async=True)
    # retire step kk-1: only then may its A registers take new values
    acc, a_other = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_other))
    # decode step kk+1 while the wgmma of step kk runs (the last step decodes a copy)
    a_next = _decode_step_regs(codes, sbits, DOT, BN, BK, num_warps)
    ahead = gl.minimum(kk + 2, NK - 1)
    codes = gl.load(c_ptrs + ahead * (BK // 8))
    sbits = gl.load(s_ptrs + ahead * (BK // 16))
    return acc, a_next, codes, sbits


@gluon.jit
def _main_loop_reg_a(acc, MMA: gl.constexpr, x_desc, off_m, w_base, s_base, row0,
                     K: gl.constexpr, BM: gl.constexpr, BK: gl.constexpr,
                     STAGES: gl.constexpr, HPT: gl.constexpr, num_warps: gl.constexpr):
    """``REG_A``: the K loop of acc^T = W x^T with the decoded weights as the wgmma's A
    operand in registers. Step k: wait for x tile k, issue its wgmma, retire the wgmma
    of step k-1, then decode step k+1 into fresh registers while the tensor cores work on
    step k. No weight tile goes through shared memory, so there is no store, no fence
    and no barrier between the decode and the MMA; one CTA barrier per step only keeps
    the two warpgroups from refilling an x slot the other still reads."""
    BN: gl.constexpr = HPT * 128
    NK: gl.constexpr = K // BK
    NB: gl.constexpr = BK // 16
    # a slot is refilled at the start of step k with tile k + AHEAD; its last reader was
    # the wgmma of step k + AHEAD - STAGES, which must be retired in both warpgroups:
    # at the start of step k, each has retired step k-2.
    AHEAD: gl.constexpr = STAGES - 2
    DOT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    c_ptrs, s_ptrs = _reg_a_pointers(w_base, s_base, row0, K, BN, NB, num_warps)
    x_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], x_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    for i in gl.static_range(AHEAD):
        mbarrier.expect(bars.index(i), x_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(x_desc, [off_m, i * BK], bars.index(i), x_smem.index(i))
    # step 0 is decoded before the loop, the codes of step 1 are loading
    a0 = _decode_step_regs(gl.load(c_ptrs), gl.load(s_ptrs), DOT, BN, BK, num_warps)
    codes = gl.load(c_ptrs + gl.minimum(1, NK - 1) * (BK // 8))
    sbits = gl.load(s_ptrs + gl.minimum(1, NK - 1) * NB)
    a1 = a0
    # two steps per iteration, so that the A registers alternate between two sets: ptxas
    # serializes every wgmma if a register an in-flight wgmma reads is written before
    # the wait that retires it, which a loop-carried operand would be at the back edge
    for kk in range(0, NK, 2):
        acc, a1, codes, sbits = _reg_a_step(kk, acc, a0, a1, codes, sbits, c_ptrs, s_ptrs, x_desc, x_smem, bars,
                                            off_m, DOT, BN, BK, STAGES, AHEAD, NK, num_warps)
        acc, a0, codes, sbits = _reg_a_step(kk + 1, acc, a1, a0, codes, sbits, c_ptrs, s_ptrs, x_desc, x_smem,
                                            bars, off_m, DOT, BN, BK, STAGES, AHEAD, NK, num_warps)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))
    return acc


@gluon.jit
def _main_loop_smem_w(acc, x_desc, off_m, w_base, s_base, row0, K: gl.constexpr, BM: gl.constexpr,
                      BK: gl.constexpr, STAGES: gl.constexpr, HPT: gl.constexpr, W_AS_A: gl.constexpr,
                      PROBE: gl.constexpr, num_warps: gl.constexpr):
    """The K loop with the decoded weights staged in shared memory: every warp decodes
    its share of the weight tile into a slot, then every warpgroup issues its MMA."""
    BN: gl.constexpr = HPT * 128
    NK: gl.constexpr = K // BK
    NB: gl.constexpr = BK // 16                   # scale blocks per K step
    # x tiles in flight ahead of the MMA. A slot is refilled three steps after its MMA
    # was issued: warps wait for their own MMAs only, and one barrier per step keeps them
    # within one step of each other, so step k may only reuse what step k-3 read.
    AHEAD: gl.constexpr = STAGES - 3
    WSLOTS: gl.constexpr = 3
    W_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BK], gl.bfloat16)
    W_PROBE: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    c_ptrs, s_ptrs = _weight_pointers(w_base, s_base, row0, K, BN, NB, num_warps)
    # ---- shared memory: x ring (TMA), three decoded-weight slots, one barrier per x slot
    x_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], x_desc.layout)
    w_smem = gl.allocate_shared_memory(gl.bfloat16, [WSLOTS, BN, BK], W_SMEM)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    for i in gl.static_range(AHEAD):
        mbarrier.expect(bars.index(i), x_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(x_desc, [off_m, i * BK], bars.index(i), x_smem.index(i))

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
        else:
            w_smem.index(kk % WSLOTS).store(_decode_step(codes, sbits, BN, BK))
        nxt = kk + AHEAD
        if nxt < NK:
            mbarrier.expect(bars.index(nxt % STAGES), x_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(x_desc, [off_m, nxt * BK], bars.index(nxt % STAGES),
                                            x_smem.index(nxt % STAGES))
        fence_async_shared()
        gl.thread_barrier()                       # every warp's part of the tile is written
        mbarrier.wait(bars.index(kk % STAGES), phase=(kk // STAGES) & 1)
        if PROBE != 2:          # timing probe 2: no tensor-core work
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
    return acc


@gluon.jit
def nvfp4_qkv_rope_gluon_kernel(
        x_desc, cos_ptr, sin_ptr,
        wq_ptr, sq_ptr, wk_ptr, sk_ptr, wv_ptr, sv_ptr,
        gs_ptr, gs_q, gs_k, gs_v, qn_ptr, kn_ptr, eps,
        q_out, k_out, v_out, M, S,
        K: gl.constexpr, HQ: gl.constexpr, HKV: gl.constexpr,
        BM: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, HPT: gl.constexpr,
        W_AS_A: gl.constexpr, GS_FROM_PTR: gl.constexpr, num_warps: gl.constexpr, PROBE: gl.constexpr = 0,
        REG_A: gl.constexpr = False):
    """Every warp decodes its share of the weight tile, then every warpgroup issues its
    MMA. W_AS_A: the product is computed transposed, acc^T [BN, BM] = W x^T, so that the
    wgmma's N is the BM tokens (256) rather than one head (128): per FLOP the tensor
    cores then read fewer operand bytes from shared memory, whose bandwidth the x copies,
    the weight stores and the MMA operands share."""
    BN: gl.constexpr = HPT * 128                  # HPT whole heads per program
    if W_AS_A:
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                      instr_shape=[16, BM, 16])
        acc = gl.zeros([BN, BM], gl.float32, layout=MMA)
    else:
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                      instr_shape=[16, BN, 16])
        acc = gl.zeros([BM, BN], gl.float32, layout=MMA)
    h, off_m, w_base, s_base, row0 = _tile(gl.program_id(0), wq_ptr, sq_ptr, wk_ptr, sk_ptr, wv_ptr, sv_ptr,
                                           HQ, HKV, BM, HPT)
    if REG_A:
        acc = _main_loop_reg_a(acc, MMA, x_desc, off_m, w_base, s_base, row0, K, BM, BK, STAGES, HPT, num_warps)
    else:
        acc = _main_loop_smem_w(acc, x_desc, off_m, w_base, s_base, row0, K, BM, BK, STAGES, HPT, W_AS_A, PROBE,
                                num_warps)
    if W_AS_A:
        acc = gl.permute(acc, (1, 0))
    _epilogue(acc, h, off_m, cos_ptr, sin_ptr, gs_ptr, gs_q, gs_k, gs_v, qn_ptr, kn_ptr, eps,
              q_out, k_out, v_out, M, S, HQ, HKV, BM, HPT, GS_FROM_PTR, num_warps)

def launch(x2d, cos, sin, w, s, gs_args, gs_from_ptr, qn, kn, eps, outs, m, seq, hq, hkv, *,
           block_m: int, block_k: int, stages: int, heads_per_tile: int = 1, w_as_a: bool = False,
           num_warps: int = 8, probe: int = 0, reg_a: bool = False):
    """One launch over (token tiles x heads). ``w``/``s``: the q, k, v codes and scales as
    uint8 tensors; ``gs_args``: (tensor or dummy, gq, gk, gv). ``w_as_a``: the transposed
    product (weights as the wgmma's A operand, tokens as its N). ``probe`` (timing
    experiments only, wrong outputs): 1 replaces the decode by a constant tile, 2 skips
    the tensor-core products."""
    layout = gl.NVMMASharedLayout.get_default_for([block_m, block_k], gl.bfloat16)
    x_desc = TensorDescriptor.from_tensor(x2d, [block_m, block_k], layout)
    grid = (triton.cdiv(m, block_m) * ((hq + 2 * hkv) // heads_per_tile),)
    nvfp4_qkv_rope_gluon_kernel[grid](
        x_desc, cos, sin, w[0], s[0], w[1], s[1], w[2], s[2], *gs_args, qn, kn, float(eps),
        outs[0], outs[1], outs[2], m, seq,
        K=x2d.shape[1], HQ=hq, HKV=hkv, BM=block_m, BK=block_k, STAGES=stages, HPT=heads_per_tile,
        W_AS_A=w_as_a, GS_FROM_PTR=gs_from_ptr, num_warps=num_warps, PROBE=probe, REG_A=reg_a)
