"""Probe: where an fp16-operand GEMM with fp32 weights should convert the weights.

The "fp16" policy's GEMMs read fp32 weight tiles and fp16 activation tiles. Converting the
weight tile in registers and using it as wgmma's B operand (``convert_b``, what the
production kernels do) sends it back through shared memory each K step (wgmma reads B
from shared memory only). wgmma may take its A operand from registers: computing
out^T = W X^T (``weights_as_a``) lets the converted weight tile feed the tensor cores
straight from the registers. This probe times both on one GEMM shape (default: the gate
projection at 8192 tokens) against the fp16 and TF32 rates, checks both against a float64
product of the fp16-rounded operands, and, with ``--ptx`` (no GPU needed: compiled for
sm_90 with benchmarks/sm90_compile.py's stand-in driver), prints which wgmma forms the
compiler emitted.

    PYTHONPATH=src python3 benchmarks/probes/qwen2vl_fp16_gemm.py [--shapes 8192x18944x3584,...]
    PYTHONPATH=src python benchmarks/probes/qwen2vl_fp16_gemm.py --ptx
"""
from __future__ import annotations

import argparse
import os
import re
import sys

if "--ptx" in sys.argv:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import sm90_compile as SM                 # sets TRITON_CACHE_DIR, drops the interpreter

import torch
import triton
import triton.language as tl


@triton.jit
def _tile(pid, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    num_m = tl.cdiv(M, BM)
    per_group = GROUP_M * tl.cdiv(N, BN)
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % size_m, (pid % per_group) // size_m


@triton.jit
def fp16_gemm_kernel(a_desc, w_desc, out_ptr, M, N, K, stride_out, BM: tl.constexpr, BN: tl.constexpr,
                     BK: tl.constexpr, GROUP_M: tl.constexpr, WEIGHTS_AS_A: tl.constexpr):
    """out = A W^T, A [M, K] fp16, W [N, K] fp32 (converted to fp16 here), fp32 accumulation."""
    pid_m, pid_n = _tile(tl.program_id(0), M, N, BM, BN, GROUP_M)
    off_m = pid_m * BM
    off_n = pid_n * BN
    if WEIGHTS_AS_A:
        acc = tl.zeros([BN, BM], dtype=tl.float32)
        for k in range(0, K, BK):
            w = w_desc.load([off_n, k]).to(tl.float16)
            a = a_desc.load([off_m, k])
            acc = tl.dot(w, a.T, acc)
        acc = tl.trans(acc)
    else:
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for k in range(0, K, BK):
            a = a_desc.load([off_m, k])
            w = w_desc.load([off_n, k]).to(tl.float16)
            acc = tl.dot(a, w.T, acc)
    rows = off_m + tl.arange(0, BM)
    cols = off_n + tl.arange(0, BN)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], acc,
             mask=(rows[:, None] < M) & (cols[None, :] < N))


CONFIGS = {  # name: (BM, BN, BK, warps, stages, weights_as_a); weights_as_a: the accumulator is BN x BM
    "convert_b 128x128x64 s3": (128, 128, 64, 8, 3, False),
    "convert_b 128x256x32 s3": (128, 256, 32, 8, 3, False),
    "weights_as_a 128x128x64 s3": (128, 128, 64, 8, 3, True),
    "weights_as_a 256x128x32 s3": (256, 128, 32, 8, 3, True),
    "weights_as_a 128x256x64 s2": (128, 256, 64, 8, 2, True),
    "weights_as_a 128x128x32 s4": (128, 128, 32, 8, 4, True),
    "weights_as_a 128x64x64 s4 w4": (128, 64, 64, 4, 4, True),
}


def launch(a, w, out, cfg, compile_only=False):
    from triton.tools.tensor_descriptor import TensorDescriptor
    bm, bn, bk, warps, stages, w_as_a = cfg
    M, K = a.shape
    N = w.shape[0]
    a_d = TensorDescriptor.from_tensor(a, [bm, bk])
    w_d = TensorDescriptor.from_tensor(w, [bn, bk])
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    args = (a_d, w_d, out, M, N, K, out.stride(0))
    meta = dict(BM=bm, BN=bn, BK=bk, GROUP_M=16, WEIGHTS_AS_A=w_as_a, num_warps=warps, num_stages=stages)
    if compile_only:
        fp16_gemm_kernel.warmup(*args, grid=grid, **meta)
    else:
        fp16_gemm_kernel[grid](*args, **meta)


def ptx_report():
    SM._install_driver()
    a = torch.empty(512, 512, dtype=torch.float16)
    w = torch.empty(512, 512)
    out = torch.empty(512, 512)
    for name, cfg in CONFIGS.items():
        before = set(os.listdir(SM.CACHE))
        try:
            launch(a, w, out, cfg, compile_only=True)
        except Exception as exc:  # noqa: BLE001 - a failed config is a result
            print(f"{name:28s} FAILED {type(exc).__name__}: {str(exc)[:300]}")
            continue
        for d in set(os.listdir(SM.CACHE)) - before:
            for f in os.listdir(os.path.join(SM.CACHE, d)):
                if f.endswith(".ptx"):
                    ptx = open(os.path.join(SM.CACHE, d, f)).read()
                    forms = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(\S+)\s+\{[^}]*\},\s*(\S)", ptx)
                    kinds = sorted({f"{shape} A={'regs' if a0 == '{' else 'smem'}" for shape, a0 in forms})
                    print(f"{name:28s} wgmma: {len(forms)} {kinds} st.shared: {ptx.count('st.shared')}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8192x18944x3584,8192x3584x18944,128x18944x3584",
                    help="M x N x K, comma-separated (default: gate/up and down at 8192 tokens, gate/up at 128)")
    ap.add_argument("--ptx", action="store_true")
    args = ap.parse_args()
    if args.ptx:
        ptx_report()
        return
    for shape in args.shapes.split(","):
        time_shape(*(int(v) for v in shape.split("x")))


def time_shape(m: int, n: int, k: int) -> None:
    import triton.testing
    dev = torch.device("cuda")
    a = torch.randn(m, k, device=dev).half()
    w = torch.randn(n, k, device=dev) / k ** 0.5
    rows = torch.randperm(m, device=dev)[:64]
    want = a[rows].double() @ w.half().double().T
    flops = 2 * m * n * k
    print(f"GEMM {m} x {n} x {k}: fp16 rate 748 TFLOP/s -> {flops / 748e9:.3f} ms, "
          f"TF32 403 -> {flops / 403e9:.3f} ms, weights at 4.28 TB/s -> {4 * n * k / 4.28e9:.3f} ms")
    for name, cfg in CONFIGS.items():
        out = torch.full((m, n), float("nan"), device=dev)
        try:
            launch(a, w, out, cfg)
            err = float((out[rows].double() - want).abs().max())
            ms = triton.testing.do_bench(lambda: launch(a, w, out, cfg), warmup=10, rep=60, return_mode="median")
            print(f"{name:28s} {ms:7.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s  max abs err {err:.2e}", flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"{name:28s} FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)


if __name__ == "__main__":
    main()
