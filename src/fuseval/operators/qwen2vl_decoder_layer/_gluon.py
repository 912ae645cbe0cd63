"""Op A's kernels for Hopper written in Gluon (Triton's explicit-layout dialect): a
persistent, warp-specialized kernel for the large TF32 GEMMs, the fused gate/up product
(SiLU * up in the epilogue) and the residual GEMMs (out = res + A W^T); and, at the end of
the file, the causal GQA attention with its products overlapped with the softmax
(``attention_kernel``, see its docstring).

Why: the Triton kernels' main loop synchronises all eight warps of a program several
times per K step (one thread issues the copies, every warp must know the slot is free),
so the tensor cores wait for the slowest warp at every step. Here the roles are split:

* one producer warp walks the program's tiles and K steps and starts the TMA copies of
  the A tile and the weight tile(s) into a ring of ``STAGES`` shared-memory slots, each
  slot with a "ready" barrier (the copy engine completes it) and a "free" barrier (the
  consumers complete it);
* the kernel's own warps (two warpgroups, 64 rows of the 128-row tile each) wait for a
  slot, issue the asynchronous TF32 wgmma(s), and hand the slot of the previous step back
  as soon as its products have finished, so the copies of later steps (and of the next
  tile, during this tile's epilogue) run ahead by up to ``STAGES`` slots;
* the epilogue applies silu(g) * u (rounded to TF32 when it feeds the next product) or
  adds the residual, and stores fp32 from the accumulator's registers.

Tiles are visited in the grouped order of the Triton kernels (the same ``_tile_coords``
helper), so that the programs in flight share their weight tiles in L2. Scope: sm_90, the
"tf32" policy, no mutants; ``qwen2vl_decoder_layer`` decides (for the attention too),
and runs the Triton kernels otherwise.
"""
from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ._attention import _online_softmax
from ._kernels import _round_tf32, _tile_coords


@gluon.jit
def _producer(a_desc, b1_desc, b2_desc, a_smem, b1_smem, b2_smem, ready, free, M, N, num_m, num_n, K,
              BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
              GROUP_M: gl.constexpr, TWO: gl.constexpr):
    """Worker partition (one warp): the copies of every K step of every tile of this
    program, each into the next slot once the consumers have freed it."""
    A_BYTES: gl.constexpr = a_desc.block_type.nbytes
    B_BYTES: gl.constexpr = b1_desc.block_type.nbytes
    NBYTES: gl.constexpr = A_BYTES + (2 * B_BYTES if TWO else B_BYTES)
    it = 0
    for tile in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_coords(tile, M, N, BM, BN, GROUP_M)
        for k in range(0, K, BK):
            slot = it % STAGES
            # slot reuse number it // STAGES waits for the consumers' release of the last one
            mbarrier.wait(free.index(slot), ((it // STAGES) + 1) & 1, pred=it >= STAGES)
            mbarrier.expect(ready.index(slot), NBYTES)
            tma.async_copy_global_to_shared(a_desc, [pid_m * BM, k], ready.index(slot), a_smem.index(slot))
            tma.async_copy_global_to_shared(b1_desc, [pid_n * BN, k], ready.index(slot), b1_smem.index(slot))
            if TWO:
                tma.async_copy_global_to_shared(b2_desc, [pid_n * BN, k], ready.index(slot), b2_smem.index(slot))
            it += 1


@gluon.jit
def _consumer(a_smem, b1_smem, b2_smem, ready, free, res_ptr, out_ptr, M, N, K, stride_res, stride_out,
              num_m, num_n, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
              GROUP_M: gl.constexpr, GATE_UP: gl.constexpr, ADD_RESIDUAL: gl.constexpr,
              ROUND_OUT: gl.constexpr, num_warps: gl.constexpr):
    """Default partition: the products and the epilogue of every tile of this program."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BN, 8])
    ROWS: gl.constexpr = gl.SliceLayout(1, MMA)
    COLS: gl.constexpr = gl.SliceLayout(0, MMA)
    PER_STEP: gl.constexpr = 2 if GATE_UP else 1          # wgmma groups issued per K step
    it = 0
    for tile in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_coords(tile, M, N, BM, BN, GROUP_M)
        acc1 = gl.zeros([BM, BN], gl.float32, layout=MMA)
        acc2 = gl.zeros([BM, BN], gl.float32, layout=MMA)
        for k in range(0, K, BK):
            slot = it % STAGES
            mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
            acc1 = warpgroup_mma(a_smem.index(slot), b1_smem.index(slot).permute((1, 0)), acc1, is_async=True)
            if GATE_UP:
                acc2 = warpgroup_mma(a_smem.index(slot), b2_smem.index(slot).permute((1, 0)), acc2,
                                     is_async=True)
                acc1, acc2 = warpgroup_mma_wait(num_outstanding=PER_STEP, deps=(acc1, acc2))
            else:
                acc1 = warpgroup_mma_wait(num_outstanding=PER_STEP, deps=(acc1,))
            # the previous step's products are done in both warpgroups: its slot is free
            gl.thread_barrier()
            mbarrier.arrive(free.index((it + STAGES - 1) % STAGES), pred=k > 0)
            it += 1
        if GATE_UP:
            acc1, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc1, acc2))
        else:
            acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc1,))
        gl.thread_barrier()
        mbarrier.arrive(free.index((it + STAGES - 1) % STAGES))

        rows = pid_m * BM + gl.arange(0, BM, layout=ROWS)
        cols = pid_n * BN + gl.arange(0, BN, layout=COLS)
        mask = gl.expand_dims(rows < M, 1) & gl.expand_dims(cols < N, 0)
        if GATE_UP:
            val = (acc1 / (1.0 + gl.exp(-acc1))) * acc2
            if ROUND_OUT:
                val = _round_tf32(val)
        else:
            val = acc1
            if ADD_RESIDUAL:
                res_offs = gl.expand_dims(rows.to(gl.int64) * stride_res, 1) + gl.expand_dims(cols, 0)
                val += gl.load(res_ptr + res_offs, mask=mask, other=0.0)
        out_offs = gl.expand_dims(rows.to(gl.int64) * stride_out, 1) + gl.expand_dims(cols, 0)
        gl.store(out_ptr + out_offs, val, mask=mask)


@gluon.jit
def gemm_ws_kernel(a_desc, b1_desc, b2_desc, res_ptr, out_ptr, M, N, K, stride_res, stride_out,
                   BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
                   GROUP_M: gl.constexpr, GATE_UP: gl.constexpr, ADD_RESIDUAL: gl.constexpr,
                   ROUND_OUT: gl.constexpr, num_warps: gl.constexpr):
    """GATE_UP: out = silu(A B1^T) * (A B2^T); else out = (res +) A B1^T. A [M, K], B [N, K]
    fp32 (TF32 products, fp32 accumulation); one program per SM."""
    a_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BM, BK], a_desc.layout)
    b1_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BN, BK], b1_desc.layout)
    if GATE_UP:
        b2_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BN, BK], b2_desc.layout)
    else:
        b2_smem = b1_smem
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(free.index(i), count=1)
    num_m = gl.cdiv(M, BM)
    num_n = gl.cdiv(N, BN)
    gl.warp_specialize([
        (_consumer, (a_smem, b1_smem, b2_smem, ready, free, res_ptr, out_ptr, M, N, K, stride_res, stride_out,
                     num_m, num_n, BM, BN, BK, STAGES, GROUP_M, GATE_UP, ADD_RESIDUAL, ROUND_OUT, num_warps)),
        (_producer, (a_desc, b1_desc, b2_desc, a_smem, b1_smem, b2_smem, ready, free, M, N, num_m, num_n, K,
                     BM, BN, BK, STAGES, GROUP_M, GATE_UP)),
    ], [1], [24])


def _descriptor(t, block):
    return TensorDescriptor.from_tensor(t, block, gl.NVMMASharedLayout.get_default_for(block, gl.float32))


def launch(a, b1, b2, res, out, *, block_m: int, block_n: int, block_k: int, stages: int, group_m: int,
           num_warps: int, n_programs: int, gate_up: bool, round_out: bool, compile_only: bool = False) -> None:
    """out = silu(a b1^T) * (a b2^T) (gate_up) or (res +) a b1^T, fp32, on ``n_programs``
    persistent programs."""
    M, K = a.shape
    N = b1.shape[0]
    a_d = _descriptor(a, [block_m, block_k])
    b1_d = _descriptor(b1, [block_n, block_k])
    b2_d = _descriptor(b2, [block_n, block_k]) if b2 is not None else b1_d
    res_arg = res if res is not None else out
    tiles = triton.cdiv(M, block_m) * triton.cdiv(N, block_n)
    grid = (max(1, min(n_programs, tiles)),)
    args = (a_d, b1_d, b2_d, res_arg, out, M, N, K, res_arg.stride(0), out.stride(0))
    meta = dict(BM=block_m, BN=block_n, BK=block_k, STAGES=stages, GROUP_M=group_m, GATE_UP=gate_up,
                ADD_RESIDUAL=res is not None, ROUND_OUT=round_out, num_warps=num_warps)
    if compile_only:
        gemm_ws_kernel.warmup(*args, grid=grid, **meta)
    else:
        gemm_ws_kernel[grid](*args, **meta)


# --------------------------------------------------------------------------- attention
@gluon.jit
def _softmax_tile(s, m_i, l_i, n, keys0, tok_c, S, qk_scale, MASKED, live):
    """Online-softmax update for the scores ``s`` of key tile ``n`` (fp32, log2 domain):
    masked keys (past S or past the row's token; every key unless ``live``) get -inf.
    Returns p, alpha and the new running max and sum."""
    s = s * qk_scale
    if MASKED:
        keys = n + keys0
        visible = gl.expand_dims((keys < S) & live, 0) & (gl.expand_dims(keys, 0) <= gl.expand_dims(tok_c, 1))
        s = gl.where(visible, s, float("-inf"))
    return _online_softmax(s, m_i, l_i)


@gluon.jit
def _load_k(k_desc, k_smem, k_ready, t, k_row0, k_col, BN: gl.constexpr, STAGES: gl.constexpr):
    """Start the TMA copy of key tile t (rows of [q'|k'], this kv head's columns)."""
    mbarrier.expect(k_ready.index(t % STAGES), k_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [k_row0 + t * BN, k_col], k_ready.index(t % STAGES),
                                    k_smem.index(t % STAGES))


@gluon.jit
def _load_v(vt_desc, v_smem, v_ready, t, vt_row0, BN: gl.constexpr, STAGES: gl.constexpr):
    """Start the TMA copy of V^T tile t ([D, BN]; keys >= S arrive as zeros)."""
    mbarrier.expect(v_ready.index(t % STAGES), vt_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(vt_desc, [vt_row0, t * BN], v_ready.index(t % STAGES), v_smem.index(t % STAGES))


@gluon.jit
def attention_kernel(qk_ptr, k_desc, vt_desc, o_ptr, S, stride_qk, stride_o, qk_scale,
                     QD: gl.constexpr, G: gl.constexpr, HKV: gl.constexpr, D: gl.constexpr,
                     BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, ROUND_P: gl.constexpr,
                     ROUND_OUT: gl.constexpr, num_warps: gl.constexpr):
    """Causal GQA flash attention for one (batch, kv head) and BM query rows, one
    warpgroup; the same tiles, row order and arithmetic as the Triton
    ``attention_kernel`` (rows are (token, head) pairs of the kv head's G query heads,
    token-major), with the products overlapped with the softmax:

    * K and V^T tiles arrive by TMA into rings of STAGES slots each;
    * each iteration queues the scores of tile j+1 and then P V of tile j on the tensor
      cores, waits for the scores only, and runs their softmax while P V runs (the order
      of FlashAttention-3's intra-warpgroup overlap). Triton's own kernel waits for each
      product before the softmax, so there the two kinds of work take turns.

    P stays in registers: it is the A operand of P V. For 32-bit operands the scores'
    accumulator layout holds keys (2q, 2q+1) of every 8 in lane q of a quad, the A
    operand wants keys (q, q+4), so ``convert_layout`` exchanges values within each quad
    by warp shuffles (PTX checked: no shared memory in the loop). P through shared memory
    instead (store, fence, barrier per tile) was slower (figures: docs/design/qwen2vl_decoder_layer.md#4-figures-behind-the-code).

    With 64-row tiles and one K and one V^T slot (STAGES=1) a program needs 96 KB of
    shared memory and 213 registers per thread, so two programs share an SM and one's
    softmax fills the other's gaps on the tensor cores; the copies of the next tiles are
    issued as soon as a slot is free and wait behind the other program's work."""
    MMA_S: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                    instr_shape=[16, BN, 8])
    MMA_O: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                    instr_shape=[16, D, 8])
    ROWS_S: gl.constexpr = gl.SliceLayout(1, MMA_S)
    ROWS_O: gl.constexpr = gl.SliceLayout(1, MMA_O)
    LQ: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
    pid_r = gl.num_programs(0) - 1 - gl.program_id(0)    # longest (latest) tiles first
    bh = gl.program_id(1)
    b = bh // HKV
    kvh = bh % HKV

    # ---- Q rows of this tile, into shared memory once
    r = pid_r * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, LQ))
    tok_q = r // G
    tok_q = gl.where(tok_q < S, tok_q, S - 1)
    d = gl.arange(0, D, layout=gl.SliceLayout(0, LQ))
    q_offs = gl.expand_dims((b * S + tok_q).to(gl.int64) * stride_qk + (kvh * G + r % G) * D, 1) \
        + gl.expand_dims(d, 0)
    q_smem = gl.allocate_shared_memory(gl.float32, [BM, D], gl.NVMMASharedLayout.get_default_for([BM, D], gl.float32),
                                       gl.load(qk_ptr + q_offs))
    k_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.float32, [STAGES, D, BN], vt_desc.layout)
    DOT_P: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA_O, k_width=1)
    # K and V^T have rings of their own: K of tile t is done with once the scores of t are,
    # V^T only once P V of t is, one softmax later
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)

    # ---- which key tiles: all of them up to the tile's last token; those below its first
    # token's tile boundary need no mask
    t_first = (pid_r * BM) // G
    t_last = gl.minimum((pid_r * BM + BM - 1) // G, S - 1)
    n_tiles = gl.cdiv(t_last + 1, BN)
    n_unmasked = (t_first + 1) // BN
    k_row0 = b * S
    k_col = QD + kvh * D
    vt_row0 = bh * D
    for i in gl.static_range(STAGES):
        if i < n_tiles:
            _load_k(k_desc, k_smem, k_ready, i, k_row0, k_col, BN, STAGES)
            _load_v(vt_desc, v_smem, v_ready, i, vt_row0, BN, STAGES)
    fence_async_shared()                                   # q, written by the threads, read by wgmma
    gl.thread_barrier()

    rows_s = pid_r * BM + gl.arange(0, BM, layout=ROWS_S)
    tok_c = gl.where(rows_s // G < S, rows_s // G, S - 1)
    keys0 = gl.arange(0, BN, layout=gl.SliceLayout(0, MMA_S))
    m_i = gl.full([BM], float("-inf"), gl.float32, layout=ROWS_S)
    l_i = gl.zeros([BM], gl.float32, layout=ROWS_S)
    o = gl.zeros([BM, D], gl.float32, layout=MMA_O)
    # ---- tile 0: scores and softmax
    mbarrier.wait(k_ready.index(0), 0)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), gl.zeros([BM, BN], gl.float32, layout=MMA_S),
                      is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, 0, keys0, tok_c, S, qk_scale, n_unmasked == 0, True)
    if ROUND_P:
        p = _round_tf32(p)
    p = gl.convert_layout(p, DOT_P)
    if STAGES < n_tiles:
        _load_k(k_desc, k_smem, k_ready, STAGES, k_row0, k_col, BN, STAGES)
    # ---- tile j: P V of tile j overlaps the softmax of tile j+1. Every product is
    # finished at the end of an iteration: ptxas serializes all wgmmas of a kernel in
    # which a product still running at the loop's back edge has its accumulator read
    # in the next iteration, even after a wait that retires it.
    for j in range(n_tiles):
        has_next = j + 1 < n_tiles
        # (a) scores of tile j+1 (past the last tile: a spare product over tile j's keys,
        # never used, which keeps the waits below static)
        nslot = (j + 1) % STAGES
        if has_next:
            mbarrier.wait(k_ready.index(nslot), ((j + 1) // STAGES) & 1)
        else:
            nslot = j % STAGES
        s = warpgroup_mma(q_smem, k_smem.index(nslot).permute((1, 0)), gl.zeros([BM, BN], gl.float32, layout=MMA_S),
                          is_async=True)
        # (b) P V of tile j, queued behind the scores
        mbarrier.wait(v_ready.index(j % STAGES), (j // STAGES) & 1)
        o = warpgroup_mma(p, v_smem.index(j % STAGES).permute((1, 0)), o, is_async=True)
        # (c) the scores are done; their softmax runs while P V does
        s, o = warpgroup_mma_wait(num_outstanding=1, deps=(s, o))
        p_next, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, (j + 1) * BN, keys0, tok_c, S, qk_scale,
                                                (j + 1 >= n_unmasked) | (~has_next), has_next)
        if ROUND_P:
            p_next = _round_tf32(p_next)
        # (d) P V done: its V^T slot and the K slot of tile j+1 are free, and so are the
        # registers of P
        o, p = warpgroup_mma_wait(num_outstanding=0, deps=(o, p))
        gl.thread_barrier()
        if j + 1 + STAGES < n_tiles:
            _load_k(k_desc, k_smem, k_ready, j + 1 + STAGES, k_row0, k_col, BN, STAGES)
        if j + STAGES < n_tiles:
            _load_v(vt_desc, v_smem, v_ready, j + STAGES, vt_row0, BN, STAGES)
        # (e) rescale the output to the new running max; P of tile j+1 for the next product
        o = o * gl.expand_dims(gl.convert_layout(alpha, ROWS_O), 1)
        p = gl.convert_layout(p_next, DOT_P)
    o = warpgroup_mma_wait(num_outstanding=0, deps=(o,))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_ready.index(i))
        mbarrier.invalidate(v_ready.index(i))
    o = o / gl.expand_dims(gl.convert_layout(l_i, ROWS_O), 1)
    if ROUND_OUT:
        o = _round_tf32(o)
    rows_o = pid_r * BM + gl.arange(0, BM, layout=ROWS_O)
    tok_o = rows_o // G
    d_o = gl.arange(0, D, layout=gl.SliceLayout(0, MMA_O))
    o_offs = gl.expand_dims((b * S + tok_o).to(gl.int64) * stride_o + (kvh * G + rows_o % G) * D, 1) \
        + gl.expand_dims(d_o, 0)
    gl.store(o_ptr + o_offs, o, mask=gl.expand_dims(tok_o < S, 1))


def launch_attention(qk, vt, out, *, S: int, B: int, HKV: int, G: int, QD: int, D: int, qk_scale: float,
                     block_m: int, block_n: int, stages: int, round_p: bool, round_out: bool,
                     num_warps: int = 4, compile_only: bool = False) -> None:
    """out [B*S, QD] = causal GQA attention of q' (qk[:, :QD]) over k' (qk[:, QD:]) and V^T
    (vt [B, HKV, D, S_pad]), with the same tiles as the Triton kernel."""
    k_desc = _descriptor(qk, [block_n, D])
    # V^T seen as [B*HKV*D, S] with row stride S_pad: keys >= S read as zeros
    vt_desc = TensorDescriptor(vt, [B * HKV * D, S], [vt.stride(2), 1], [D, block_n],
                               gl.NVMMASharedLayout.get_default_for([D, block_n], gl.float32))
    grid = (triton.cdiv(S * G, block_m), B * HKV)
    args = (qk, k_desc, vt_desc, out, S, qk.stride(0), out.stride(0), qk_scale)
    meta = dict(QD=QD, G=G, HKV=HKV, D=D, BM=block_m, BN=block_n, STAGES=stages, ROUND_P=round_p,
                ROUND_OUT=round_out, num_warps=num_warps)
    if compile_only:
        attention_kernel.warmup(*args, grid=grid, **meta)
    else:
        attention_kernel[grid](*args, **meta)
