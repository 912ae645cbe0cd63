"""Op A's large TF32 GEMMs for Hopper, written in Gluon (Triton's explicit-layout dialect):
a persistent, warp-specialized kernel for the fused gate/up product (SiLU * up in the
epilogue) and the residual GEMMs (out = res + A W^T).

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
"tf32" policy, no mutants; ``qwen2vl_decoder_layer`` decides, and runs the Triton kernels
otherwise.
"""
from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ._qwen2vl_kernels import _round_tf32, _tile_coords


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
