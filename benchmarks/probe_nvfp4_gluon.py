"""Where the time of op B's Gluon kernels goes, at M tokens (GPU only).

For each config 'BM,BK,STAGES[,HPT[,W_AS_A]]' every probe of ``_nvfp4_gluon.launch``:
0 the launch as is, 1 the FP4 decode replaced by a constant tile, 2 no tensor-core
products, 3 only the stream of x tiles (TMA from L2/HBM into the slot ring), 4 only the
decode (no x, no products), 5 only the products (slots filled once), 6 = 5 without the
per-step fence and CTA barrier, 7 = 6 without the epilogue, 8 = 4 without the per-step
fence and barrier. Last, cuBLAS's bf16 product of x with dequantized weights of the same
shape (no decode, no epilogue), the rate a plain GEMM reaches here. If the full kernel
takes about the sum of two parts, those parts do not overlap; if it takes about one
part alone, that part is the limit. Probe 3 also reports the rate at which x arrives
(each of the 48 / HPT head tiles of a token tile reads the same x rows again). The first
config's outputs are the reference the others' must match bit for bit where they
compute the same products in the same order (same BK), and match within bf16 rounding
otherwise.

    PYTHONPATH=src python3 benchmarks/probe_nvfp4_gluon.py [--m 8192] [--configs '256,64,4,1,1;256,64,5,1,1:0,3'] [--probes 0,1,2,3,4,5,6,7,8]
"""
from __future__ import annotations

import argparse

import torch

from fuseval.bench import time_call
from fuseval.definitions import load
from fuseval.operators.nvfp4_qkv_rope import _gluon as G
from fuseval.inputs import generate_inputs


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
        fn = lambda: G.launch(x.view(args.m, -1), cos, sin, [u8(wq), u8(wk), u8(wv)],  # noqa: E731
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
