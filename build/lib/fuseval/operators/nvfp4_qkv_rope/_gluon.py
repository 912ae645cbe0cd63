"""Op B's GEMM kernels for Hopper, written in Gluon (Triton's explicit-layout dialect).

Why Gluon: in the Triton kernel (``_kernels._nvfp4_qkv_rope_kernel``) the compiler picks
the layouts. The decoded weight tile comes out of the FP4 decode in one register layout,
the tensor cores want another, and the compiler bridges them with a round trip through
shared memory in every K step. Here the layouts are ours.

``nvfp4_qkv_rope_gluon_kernel`` decodes the FP4 weights in its K loop:

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

``nvfp4_qkv_rope_gluon_dense_kernel`` reads weights decoded beforehand (once per call, by
``_kernels._predecode_kernel``, bf16 code * scale, exact) by TMA like x: both operands
stream through one slot ring, and the K loop holds only the barrier waits, the MMAs and
the refills, which is what a bf16 GEMM at the tensor cores' rate needs.

In both, one program = BM tokens x ``HPT`` whole heads; the epilogue applies the global
scale, the q/k RMS norm and RoPE, and stores bf16 rows of [B, heads, S, D].

Activations: the x operand is whatever the caller streams, the bf16 activations (the
``w4a16`` variant) or the quantized ones, xs = e2m1(code) * e4m3(scale) (W4A4, exact in
bf16); in the latter case the gs pointer holds both global scales' product.

Scope: head_dim 128, hidden_size a multiple of 64, sm_90, production calls. Everything
else (the interpreter, mutants, stage taps) runs the Triton kernel; ``_launch.plan``
decides. Where the time goes, and what was tried: docs/design/nvfp4_qkv_rope.md.
"""
from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

# the same bit-level decode and head selection as the Triton kernel (triton.jit helpers)
from ._kernels import _e4m3_f32, _head_weights, _nibble_f32



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
              HPT: gl.constexpr, GS_FROM_PTR: gl.constexpr, OFFSET: gl.constexpr, num_warps: gl.constexpr):
    """Global scale, q/k RMS norm and RoPE, bf16 store into [B, heads, S, D]. The tile is
    viewed as [BM, HPT heads, 2 halves, 64] with both halves of a head's row segment in
    one thread, so the RMS norm (over 128) and rotate_half are register-local. OFFSET: the
    factor the weights were decoded with (2^8 for the in-loop decode, 1 for predecoded)."""
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
    t = gl.convert_layout(gl.reshape(acc, [BM, HPT, 2, HALF]), E4) * (gs * OFFSET)
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
        W_AS_A: gl.constexpr, GS_FROM_PTR: gl.constexpr, num_warps: gl.constexpr):
    """The FP4 weights decoded in the K loop. Every warp decodes its share of the weight
    tile, then every warpgroup issues its MMA. W_AS_A: the product is computed transposed,
    acc^T [BN, BM] = W x^T, so that the wgmma's N is the BM tokens (256) rather than one
    head (128): per FLOP the tensor cores then read fewer operand bytes from shared memory,
    whose bandwidth the x copies, the weight stores and the MMA operands share."""
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
    h, off_m, w_base, s_base, row0 = _tile(gl.program_id(0), wq_ptr, sq_ptr, wk_ptr, sk_ptr, wv_ptr, sv_ptr,
                                           HQ, HKV, BM, HPT)
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
        # decode step kk while the MMA of step kk-1 runs; this weight slot and the x slot
        # refilled below were last read by the MMA of step kk-3, finished in every
        # warpgroup (see AHEAD)
        w_smem.index(kk % WSLOTS).store(_decode_step(codes, sbits, BN, BK))
        nxt = kk + AHEAD
        if nxt < NK:
            mbarrier.expect(bars.index(nxt % STAGES), x_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(x_desc, [off_m, nxt * BK], bars.index(nxt % STAGES),
                                            x_smem.index(nxt % STAGES))
        fence_async_shared()
        gl.thread_barrier()                       # every warp's part of the tile is written
        mbarrier.wait(bars.index(kk % STAGES), phase=(kk // STAGES) & 1)
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
    # 256 = 2^8: the decode's offset (see _decode_words)
    _epilogue(acc, h, off_m, cos_ptr, sin_ptr, gs_ptr, gs_q, gs_k, gs_v, qn_ptr, kn_ptr, eps,
              q_out, k_out, v_out, M, S, HQ, HKV, BM, HPT, GS_FROM_PTR, 256.0, num_warps)


@gluon.jit
def nvfp4_qkv_rope_gluon_dense_kernel(
        x_desc, w_desc, cos_ptr, sin_ptr,
        gs_ptr, gs_q, gs_k, gs_v, qn_ptr, kn_ptr, eps,
        q_out, k_out, v_out, M, S,
        K: gl.constexpr, HQ: gl.constexpr, HKV: gl.constexpr,
        BM: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, HPT: gl.constexpr,
        GS_FROM_PTR: gl.constexpr, num_warps: gl.constexpr):
    """The weights predecoded (bf16 code * scale, stacked q, k, v rows), read by TMA. Both
    tiles of a K step arrive in one slot of the ring (one mbarrier, both byte counts);
    the product is transposed (acc^T [BN, BM] = W x^T, tokens as the wgmma's N)."""
    BN: gl.constexpr = HPT * 128
    NK: gl.constexpr = K // BK
    NT: gl.constexpr = HQ + 2 * HKV
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BM, 16])
    acc = gl.zeros([BN, BM], gl.float32, layout=MMA)
    pid = gl.program_id(0)
    h = (pid % (NT // HPT)) * HPT                 # heads fastest: the tiles in flight share x in L2
    off_m = (pid // (NT // HPT)) * BM
    row0 = h * 128                                # q, k, v rows are stacked in head order

    x_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], x_desc.layout)
    w_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, BK], w_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    NBYTES: gl.constexpr = x_desc.block_type.nbytes + w_desc.block_type.nbytes
    for i in gl.static_range(STAGES - 1):
        if i < NK:
            mbarrier.expect(bars.index(i), NBYTES)
            tma.async_copy_global_to_shared(x_desc, [off_m, i * BK], bars.index(i), x_smem.index(i))
            tma.async_copy_global_to_shared(w_desc, [row0, i * BK], bars.index(i), w_smem.index(i))
    for kk in range(NK):
        slot = kk % STAGES
        mbarrier.wait(bars.index(slot), phase=(kk // STAGES) & 1)
        acc = warpgroup_mma(w_smem.index(slot), x_smem.index(slot).permute((1, 0)), acc, is_async=True)
        # this warpgroup's MMA of step kk-1 is done; after the barrier every warpgroup's
        # is, so the slot it read takes the tiles of step kk + STAGES - 1
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        gl.thread_barrier()
        nxt = kk + STAGES - 1
        if nxt < NK:
            refill = nxt % STAGES
            mbarrier.expect(bars.index(refill), NBYTES)
            tma.async_copy_global_to_shared(x_desc, [off_m, nxt * BK], bars.index(refill), x_smem.index(refill))
            tma.async_copy_global_to_shared(w_desc, [row0, nxt * BK], bars.index(refill), w_smem.index(refill))
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))
    acc = gl.permute(acc, (1, 0))
    _epilogue(acc, h, off_m, cos_ptr, sin_ptr, gs_ptr, gs_q, gs_k, gs_v, qn_ptr, kn_ptr, eps,
              q_out, k_out, v_out, M, S, HQ, HKV, BM, HPT, GS_FROM_PTR, 1.0, num_warps)


def _x_descriptor(x2d, block_m: int, block_k: int):
    layout = gl.NVMMASharedLayout.get_default_for([block_m, block_k], gl.bfloat16)
    return TensorDescriptor.from_tensor(x2d, [block_m, block_k], layout)


def launch(x2d, cos, sin, w, s, gs_args, gs_from_ptr, qn, kn, eps, outs, m, seq, hq, hkv, *,
           block_m: int, block_k: int, stages: int, heads_per_tile: int = 1, w_as_a: bool = False,
           num_warps: int = 8):
    """The in-loop decode kernel over (token tiles x heads). ``w``/``s``: the q, k, v codes
    and scales as uint8 tensors; ``gs_args``: (tensor or dummy, gq, gk, gv). ``w_as_a``: the
    transposed product (weights as the wgmma's A operand, tokens as its N)."""
    grid = (triton.cdiv(m, block_m) * ((hq + 2 * hkv) // heads_per_tile),)
    nvfp4_qkv_rope_gluon_kernel[grid](
        _x_descriptor(x2d, block_m, block_k), cos, sin, w[0], s[0], w[1], s[1], w[2], s[2], *gs_args,
        qn, kn, float(eps), outs[0], outs[1], outs[2], m, seq,
        K=x2d.shape[1], HQ=hq, HKV=hkv, BM=block_m, BK=block_k, STAGES=stages, HPT=heads_per_tile,
        W_AS_A=w_as_a, GS_FROM_PTR=gs_from_ptr, num_warps=num_warps)


def launch_dense(x2d, cos, sin, w_dense, gs_args, gs_from_ptr, qn, kn, eps, outs, m, seq, hq, hkv, *,
                 block_m: int, block_k: int, stages: int, heads_per_tile: int = 1, num_warps: int = 8):
    """The predecoded-weight kernel. ``w_dense``: bf16 [(hq + 2 hkv) * 128, K] = code * scale."""
    bn = 128 * heads_per_tile
    w_layout = gl.NVMMASharedLayout.get_default_for([bn, block_k], gl.bfloat16)
    w_desc = TensorDescriptor.from_tensor(w_dense, [bn, block_k], w_layout)
    grid = (triton.cdiv(m, block_m) * ((hq + 2 * hkv) // heads_per_tile),)
    nvfp4_qkv_rope_gluon_dense_kernel[grid](
        _x_descriptor(x2d, block_m, block_k), w_desc, cos, sin, *gs_args, qn, kn, float(eps),
        outs[0], outs[1], outs[2], m, seq,
        K=x2d.shape[1], HQ=hq, HKV=hkv, BM=block_m, BK=block_k, STAGES=stages, HPT=heads_per_tile,
        GS_FROM_PTR=gs_from_ptr, num_warps=num_warps)
