"""Where the time of op B's Gluon kernel goes: the same launch at M tokens timed as is,
with the FP4 decode replaced by a constant tile (probe 1) and without the tensor-core
products (probe 2). If the full kernel takes about probe 1 + probe 2, the decode and the
MMAs do not overlap. GPU only; prints one line per variant.

    PYTHONPATH=src python3 benchmarks/probe_nvfp4_gluon.py [--m 8192] [--configs 256,64,5;128,64,5]
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
    ap.add_argument("--configs", default="256,64,5;128,64,5")
    args = ap.parse_args()
    defn = load("nvfp4_qkv_rope")
    inputs = generate_inputs(defn, {"seq_len": args.m, "batch_size": 1}, seed=1, device="cuda")
    (x, cos, sin, wq, sq, gq, wk, sk, gk, wv, sv, gv, qn, kn, eps) = inputs
    outs = [torch.empty(1, h, args.m, 128, dtype=torch.bfloat16, device="cuda") for h in (32, 8, 8)]
    u8 = lambda t: t.view(torch.uint8)          # noqa: E731
    flops = 2 * args.m * 6144 * 4096
    for text in args.configs.split(";"):
        bm, bk, stages = (int(v) for v in text.split(","))
        for probe in (0, 1, 2):
            fn = lambda: G.launch(x.view(args.m, -1), cos, sin, [u8(wq), u8(wk), u8(wv)],  # noqa: E731
                                  [u8(sq), u8(sk), u8(sv)], (x, float(gq), float(gk), float(gv)), False,
                                  qn, kn, float(eps), outs, args.m, args.m, 32, 8, block_m=bm, block_k=bk,
                                  stages=stages, probe=probe)
            t = time_call(fn, warmup_ms=20, rep_ms=100)
            print(f"{text:10s} probe {probe}: {t.median_ms:.4f} ms  ({flops / t.median_ms / 1e9:.0f} TFLOP/s "
                  f"equivalent)", flush=True)


if __name__ == "__main__":
    main()
