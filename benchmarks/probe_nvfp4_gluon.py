"""Where the time of op B's Gluon kernels goes, at M tokens (GPU only).

For the single-partition kernel ('BM,BK,STAGES'): the launch as is, with the FP4 decode
replaced by a constant tile (probe 1) and without the tensor-core products (probe 2);
if the full kernel takes about probe 1 + probe 2, decode and MMAs do not overlap. For
the warp-specialized kernel ('BM,BK,STAGES,HPT,DECODE_WARPS,DECODE_REGS'): its time,
and whether its outputs equal the single-partition kernel's bit for bit (same products
in the same order, so they must).

    PYTHONPATH=src python3 benchmarks/probe_nvfp4_gluon.py [--m 8192] [--configs '256,64,5;256,64,4,1,8,80']
"""
from __future__ import annotations

import argparse

import torch

from fuseval.bench import time_call
from fuseval.definitions import load
from fuseval.fast import _nvfp4_gluon as G
from fuseval.inputs import generate_inputs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=8192)
    ap.add_argument("--configs", default="256,64,5;256,64,4,1,8,80")
    args = ap.parse_args()
    defn = load("nvfp4_qkv_rope")
    inputs = generate_inputs(defn, {"seq_len": args.m, "batch_size": 1}, seed=1, device="cuda")
    (x, cos, sin, wq, sq, gq, wk, sk, gk, wv, sv, gv, qn, kn, eps) = inputs
    u8 = lambda t: t.view(torch.uint8)          # noqa: E731
    flops = 2 * args.m * 6144 * 4096

    def run(bm, bk, stages, hpt=1, dw=0, dr=80, probe=0):
        outs = [torch.full((1, h, args.m, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
                for h in (32, 8, 8)]
        fn = lambda: G.launch(x.view(args.m, -1), cos, sin, [u8(wq), u8(wk), u8(wv)],  # noqa: E731
                              [u8(sq), u8(sk), u8(sv)], (x, float(gq), float(gk), float(gv)), False,
                              qn, kn, float(eps), outs, args.m, args.m, 32, 8, block_m=bm, block_k=bk,
                              stages=stages, heads_per_tile=hpt, decode_warps=dw, decode_regs=dr, probe=probe)
        fn()
        torch.cuda.synchronize()
        return fn, outs

    reference = None
    for text in args.configs.split(";"):
        cfg = [int(v) for v in text.split(",")]
        ws = len(cfg) > 4 and cfg[4] > 0
        for probe in ((0,) if ws else (0, 1, 2)):
            fn, outs = run(*cfg, probe=probe) if not ws else run(*cfg)
            if probe == 0 and reference is None and not ws:
                reference = [o.clone() for o in outs]
            same = "" if reference is None or probe else \
                f"  equal to the single-partition kernel: {all(torch.equal(a, b) for a, b in zip(outs, reference))}"
            t = time_call(fn, warmup_ms=20, rep_ms=100)
            print(f"{text:18s} probe {probe}: {t.median_ms:.4f} ms  ({flops / t.median_ms / 1e9:.0f} TFLOP/s "
                  f"equivalent){same}", flush=True)


if __name__ == "__main__":
    main()
