"""Probe (issue 16): can op A's "fp16" GEMMs read the fp32 weights themselves, converting
each tile in warps of their own, as fast as they run on weights converted beforehand?

Today a call of 512 tokens or more first converts the seven weights to fp16 in one pass
(0.35 ms a call, 1.4 GB moved) and the GEMMs then read fp16 tiles by TMA; below 512 tokens
the GEMMs convert fp32 tiles in the registers of the warps that issue the products, which
does not overlap the tensor cores (docs/design/qwen2vl_decoder_layer.md 2.7-2.9). This
kernel splits the roles (Gluon warp specialization):

* a producer warp copies the fp16 activation tile and the fp32 weight tile of each K step
  by TMA into a ring of slots (``ready``: the copy engine completes it);
* two or four converter warps read the fp32 weight tile from shared memory, round it to fp16
  (nearest even) and store it into the slot's fp16 tile (``converted``);
* the default warps (two warpgroups) issue the fp16 wgmma on the slot and, once its
  products are done, hand the slot back (``free``: converter and consumer both arrive).

The converter never waits for ``free`` itself: the producer refills a slot only after
both arrived, and the converter converts a slot only after the refill's copies landed.
out = A W^T in fp32; A [M, K] fp16, W [N, K] fp32; one program per SM, tiles in the
grouped order of op A's kernels.

Prints, per GEMM shape (M x N x K): this kernel against cuBLAS on fp16 weights, the weight
conversion pass alone, and both against the fp16 rate; and each output's max error
against a float64 product of the fp16-rounded operands (64 rows).

    PYTHONPATH=src python3 benchmarks/probes/qwen2vl_ws_convert_gemm.py [--shapes 8192x18944x3584,...]
    PYTHONPATH=src python3 benchmarks/probes/qwen2vl_ws_convert_gemm.py --compile   # sm_90, no GPU
"""
from __future__ import annotations

import argparse
import os
import sys

if "--compile" in sys.argv:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import sm90_compile as SM                 # sets TRITON_CACHE_DIR, drops the interpreter

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from fuseval.operators.qwen2vl_decoder_layer._gluon import _producer
from fuseval.operators.qwen2vl_decoder_layer._kernels import _tile_coords


@gluon.jit
def _producer_a(a_desc, a_smem, ready, free, M, N, K,
                BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    """One warp: each K step's activation tile by TMA (the converter loads the weights
    itself). The staged form's producer, which also copies the weight tile, is op A's own
    (``qwen2vl_decoder_layer._gluon._producer``)."""
    num_tiles = gl.cdiv(M, BM) * gl.cdiv(N, BN)
    it = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        pid_m, pid_n = _tile_coords(tile, M, N, BM, BN, GROUP_M)
        for k in range(0, K, BK):
            slot = it % STAGES
            mbarrier.wait(free.index(slot), ((it // STAGES) + 1) & 1, pred=it >= STAGES)
            mbarrier.expect(ready.index(slot), a_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, [pid_m * BM, k], ready.index(slot), a_smem.index(slot))
            it += 1


@gluon.jit
def _converter(w32_smem, w16_smem, ready, free, converted, M, N, K,
               BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, CW: gl.constexpr):
    """CW warps: fp32 weight tile -> fp16 (round to nearest even) in the slot's fp16 tile."""
    L: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [CW, 1], [1, 0])
    num_tiles = gl.cdiv(M, BM) * gl.cdiv(N, BN)
    it = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        for k in range(0, K, BK):
            slot = it % STAGES
            mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
            w = w32_smem.index(slot).load(L)
            w16_smem.index(slot).store(w.to(gl.float16))
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(converted.index(slot))
            mbarrier.arrive(free.index(slot))
            it += 1


@gluon.jit
def _converter_global(w_ptr, w16_smem, free, converted, M, N, K,
                      BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
                      GROUP_M: gl.constexpr, CW: gl.constexpr):
    """CW warps: the fp32 weight tile loaded from global memory (one step ahead, 16-byte
    loads), rounded to fp16 and stored into the slot's fp16 tile once the consumer freed it."""
    L: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [CW, 1], [1, 0])
    r = gl.arange(0, BN, layout=gl.SliceLayout(1, L))
    c = gl.arange(0, BK, layout=gl.SliceLayout(0, L))
    num_tiles = gl.cdiv(M, BM) * gl.cdiv(N, BN)
    it = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        pid_m, pid_n = _tile_coords(tile, M, N, BM, BN, GROUP_M)
        rows = pid_n * BN + r
        ptrs = w_ptr + gl.expand_dims(rows.to(gl.int64) * K, 1) + gl.expand_dims(c, 0)
        mask = gl.expand_dims(rows < N, 1)
        nxt = gl.load(ptrs, mask=mask, other=0.0)
        for k in range(0, K, BK):
            w = nxt
            nxt = gl.load(ptrs + gl.minimum(k + BK, K - BK), mask=mask, other=0.0)
            slot = it % STAGES
            mbarrier.wait(free.index(slot), ((it // STAGES) + 1) & 1, pred=it >= STAGES)
            w16_smem.index(slot).store(w.to(gl.float16))
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(converted.index(slot))
            it += 1


@gluon.jit
def _consumer(a_smem, w16_smem, ready, free, converted, out_ptr, M, N, K, stride_out,
              BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
              GROUP_M: gl.constexpr, num_warps: gl.constexpr):
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BN, 16])
    num_tiles = gl.cdiv(M, BM) * gl.cdiv(N, BN)
    it = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        pid_m, pid_n = _tile_coords(tile, M, N, BM, BN, GROUP_M)
        acc = gl.zeros([BM, BN], gl.float32, layout=MMA)
        for k in range(0, K, BK):
            slot = it % STAGES
            mbarrier.wait(ready.index(slot), (it // STAGES) & 1)          # the activation tile
            mbarrier.wait(converted.index(slot), (it // STAGES) & 1)      # the fp16 weight tile
            acc = warpgroup_mma(a_smem.index(slot), w16_smem.index(slot).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            gl.thread_barrier()
            mbarrier.arrive(free.index((it + STAGES - 1) % STAGES), pred=k > 0)
            it += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        gl.thread_barrier()
        mbarrier.arrive(free.index((it + STAGES - 1) % STAGES))
        rows = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, MMA))
        cols = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, MMA))
        mask = gl.expand_dims(rows < M, 1) & gl.expand_dims(cols < N, 0)
        offs = gl.expand_dims(rows.to(gl.int64) * stride_out, 1) + gl.expand_dims(cols, 0)
        gl.store(out_ptr + offs, acc, mask=mask)


@gluon.jit
def ws_convert_gemm_kernel(a_desc, w_src, out_ptr, M, N, K, stride_out,
                           BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
                           GROUP_M: gl.constexpr, CONVERT_WARPS: gl.constexpr, CONVERT_REGS: gl.constexpr,
                           FROM_GLOBAL: gl.constexpr, num_warps: gl.constexpr):
    """``w_src``: the fp32 weights' TMA descriptor (staged: the producer copies each tile
    into shared memory for the converter), or with FROM_GLOBAL their pointer (the converter
    loads the tiles itself; no fp32 tile in shared memory, whose bandwidth the staged form
    runs out of)."""
    a_smem = gl.allocate_shared_memory(gl.float16, [STAGES, BM, BK], a_desc.layout)
    W16: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BK], gl.float16)
    w16_smem = gl.allocate_shared_memory(gl.float16, [STAGES, BN, BK], W16)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    converted = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    FREE_ARRIVALS: gl.constexpr = 1 if FROM_GLOBAL else 2      # the consumer (and the staged converter)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(free.index(i), count=FREE_ARRIVALS)
        mbarrier.init(converted.index(i), count=1)
    if FROM_GLOBAL:
        gl.warp_specialize([
            (_consumer, (a_smem, w16_smem, ready, free, converted, out_ptr, M, N, K, stride_out,
                         BM, BN, BK, STAGES, GROUP_M, num_warps)),
            (_producer_a, (a_desc, a_smem, ready, free, M, N, K, BM, BN, BK, STAGES, GROUP_M)),
            (_converter_global, (w_src, w16_smem, free, converted, M, N, K, BM, BN, BK, STAGES, GROUP_M,
                                 CONVERT_WARPS)),
        ], [1, CONVERT_WARPS], [24, CONVERT_REGS])
    else:
        w32_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BN, BK], w_src.layout)
        gl.warp_specialize([
            (_consumer, (a_smem, w16_smem, ready, free, converted, out_ptr, M, N, K, stride_out,
                         BM, BN, BK, STAGES, GROUP_M, num_warps)),
            (_producer, (a_desc, w_src, w_src, a_smem, w32_smem, w32_smem, ready, free, M, N,
                         gl.cdiv(M, BM), gl.cdiv(N, BN), K, BM, BN, BK, STAGES, GROUP_M, False)),
            (_converter, (w32_smem, w16_smem, ready, free, converted, M, N, K, BM, BN, BK, STAGES,
                          CONVERT_WARPS)),
        ], [1, CONVERT_WARPS], [24, CONVERT_REGS])


# name: (BM, BN, BK, STAGES, converter warps, converter registers, converter reads global
# memory). More than 12 warps in all would cap every thread at 128 registers, too few for
# a 128 x 256 accumulator.
CONFIGS = {
    "staged 128x256x32 s4 c2": (128, 256, 32, 4, 2, 96, False),
    "global 128x128x64 s4 c4": (128, 128, 64, 4, 4, 128, True),
    "global 128x128x32 s6 c4": (128, 128, 32, 6, 4, 96, True),
    "global 128x256x32 s4 c2": (128, 256, 32, 4, 2, 152, True),
    "global 128x128x32 s8 c4": (128, 128, 32, 8, 4, 96, True),
    "global 128x128x64 s6 c4": (128, 128, 64, 6, 4, 128, True),
}


def launch(a, w, out, cfg, n_programs: int, compile_only: bool = False):
    bm, bn, bk, stages, cw, regs, from_global = cfg
    M, K = a.shape
    N = w.shape[0]
    a_d = TensorDescriptor.from_tensor(a, [bm, bk], gl.NVMMASharedLayout.get_default_for([bm, bk], gl.float16))
    w_arg = w if from_global else TensorDescriptor.from_tensor(
        w, [bn, bk], gl.NVMMASharedLayout.get_default_for([bn, bk], gl.float32))
    grid = (max(1, min(n_programs, triton.cdiv(M, bm) * triton.cdiv(N, bn))),)
    args = (a_d, w_arg, out, M, N, K, out.stride(0))
    meta = dict(BM=bm, BN=bn, BK=bk, STAGES=stages, GROUP_M=8, CONVERT_WARPS=cw, CONVERT_REGS=regs,
                FROM_GLOBAL=from_global, num_warps=8)
    if compile_only:
        ws_convert_gemm_kernel.warmup(*args, grid=grid, **meta)
    else:
        ws_convert_gemm_kernel[grid](*args, **meta)


def compile_report() -> None:
    SM._install_driver()
    a = torch.empty(512, 512, dtype=torch.float16)
    w = torch.empty(512, 512)
    out = torch.empty(512, 512)
    print(SM.HEADER)
    for name, cfg in CONFIGS.items():
        SM._compile_and_report("ws-convert", name, lambda cfg=cfg: launch(a, w, out, cfg, 132, compile_only=True))


def time_shape(m: int, n: int, k: int) -> None:
    from fuseval.bench import time_call
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    a = torch.randn(m, k, device=dev).half()
    w = torch.randn(n, k, device=dev) / k ** 0.5
    w16 = w.half()
    rows = torch.randperm(m, device=dev)[:64]
    want = a[rows].double() @ w16.double().T
    flops = 2 * m * n * k
    print(f"GEMM {m} x {n} x {k}: {flops / 765e9:.3f} ms at 765 TFLOP/s (fp16 burst)", flush=True)
    cublas = time_call(lambda: a @ w16.T, device=dev).median_ms
    convert = time_call(lambda: w.half(), device=dev).median_ms
    print(f"  cuBLAS fp16 on fp16 weights                {cublas:7.3f} ms {flops / cublas / 1e9:5.0f} TFLOP/s"
          f"  (+ the conversion of this weight {convert:.3f} ms = {cublas + convert:.3f})", flush=True)
    for name, cfg in CONFIGS.items():
        out = torch.full((m, n), float("nan"), device=dev)
        try:
            launch(a, w, out, cfg, sms)
            torch.cuda.synchronize()
            err = float((out[rows].double() - want).abs().max())
            ms = time_call(lambda: launch(a, w, out, cfg, sms), device=dev).median_ms
            print(f"  ws-convert {name:24s}  {ms:7.3f} ms {flops / ms / 1e9:5.0f} TFLOP/s  max abs err {err:.2e}",
                  flush=True)
        except Exception as exc:  # noqa: BLE001 - a config that fails is a result
            print(f"  ws-convert {name:24s}  FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8192x18944x3584,8192x3584x18944,8192x3584x3584,256x18944x3584",
                    help="M x N x K, comma-separated (default: gate/up, down and o_proj at 8192 tokens, "
                         "gate/up at 256)")
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()
    if args.compile:
        compile_report()
        return
    for shape in args.shapes.split(","):
        time_shape(*(int(v) for v in shape.split("x")))


if __name__ == "__main__":
    main()
