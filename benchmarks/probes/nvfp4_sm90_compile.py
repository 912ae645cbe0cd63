"""Compile op B's Hopper GEMM kernels for sm_90 on a machine without a GPU and report their
shared memory, registers, spills and wgmma count (benchmarks/sm90_compile.py's stand-in
driver and report): the in-loop decode kernel, the predecoded-weight (dense) kernel and
the predecode kernel, for the given configs.

    PYTHONPATH=src python3 benchmarks/probes/nvfp4_sm90_compile.py [--dense '256,64,4;128,64,4'] [--decode '256,64,4']

Configs are 'BM,BK,STAGES[,HEADS_PER_TILE]'.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import sm90_compile as C  # noqa: E402  (sets up Triton for compile-only use first)

import torch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dense", default="256,64,4;256,64,3;128,64,4")
    ap.add_argument("--decode", default="256,64,4")
    ap.add_argument("--tokens", type=int, default=512)
    args = ap.parse_args()
    C._install_driver()
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from fuseval.operators.nvfp4_qkv_rope import _gluon as G
    from fuseval.operators.nvfp4_qkv_rope import _kernels as K
    m, hidden, hq, hkv = args.tokens, 4096, 32, 8
    x = torch.zeros(m, hidden, dtype=torch.bfloat16)
    w = torch.zeros((hq + 2 * hkv) * 128, hidden, dtype=torch.bfloat16)
    codes = torch.zeros(hq * 128, hidden // 2, dtype=torch.uint8)
    scales = torch.zeros(hq * 128, hidden // 16, dtype=torch.uint8)
    cs = torch.zeros(m, 128, dtype=torch.bfloat16)
    nw = torch.zeros(128, dtype=torch.bfloat16)
    out = torch.empty(1, dtype=torch.bfloat16)
    print(C.HEADER)

    def desc(t, rows, bk):
        layout = gl.NVMMASharedLayout.get_default_for([rows, bk], gl.bfloat16)
        return TensorDescriptor.from_tensor(t, [rows, bk], layout)

    for text in filter(None, args.dense.split(";")):
        bm, bk, stages, *rest = [int(v) for v in text.split(",")]
        hpt = rest[0] if rest else 1
        C._compile_and_report("dense", text, lambda: G.nvfp4_qkv_rope_gluon_dense_kernel.warmup(
            desc(x, bm, bk), desc(w, 128 * hpt, bk), cs, cs, x, 1.0, 1.0, 1.0, nw, nw, 1e-6,
            out, out, out, m, m, K=hidden, HQ=hq, HKV=hkv, BM=bm, BK=bk, STAGES=stages, HPT=hpt,
            GS_FROM_PTR=False, num_warps=8, grid=(1,)))
    for text in filter(None, args.decode.split(";")):
        bm, bk, stages, *rest = [int(v) for v in text.split(",")]
        hpt = rest[0] if rest else 1
        C._compile_and_report("decode", text, lambda: G.nvfp4_qkv_rope_gluon_kernel.warmup(
            desc(x, bm, bk), cs, cs, codes, scales, codes, scales, codes, scales, x, 1.0, 1.0, 1.0,
            nw, nw, 1e-6, out, out, out, m, m, K=hidden, HQ=hq, HKV=hkv, BM=bm, BK=bk, STAGES=stages,
            HPT=hpt, W_AS_A=True, GS_FROM_PTR=False, num_warps=8, grid=(1,)))
    from fuseval.operators.nvfp4_qkv_rope import _quant as Q
    x16 = x.view(torch.int16)
    C._compile_and_report("amax+pre", "32x128", lambda: Q._amax_and_predecode_kernel.warmup(
        x16, torch.zeros(8, dtype=torch.int32), x16.numel(), 64, codes, scales, codes, scales, codes, scales, w,
        CHUNK=32768, BLOCK=4096, X_BF16=True, NQ=hq * 128, NKV=hkv * 128, K=hidden, BR=32, BK=128,
        num_warps=8, grid=(1,)))
    C._compile_and_report("predecode", "32x128", lambda: K._predecode_kernel.warmup(
        codes, scales, codes, scales, codes, scales, w, NQ=hq * 128, NKV=hkv * 128, K=hidden, BR=32,
        BK=128, num_warps=4, grid=(1,)))


if __name__ == "__main__":
    main()
