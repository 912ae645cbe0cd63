"""Op A's Gluon GEMM (operators/qwen2vl_decoder_layer/_gluon.py) against the Triton tiles of the table, on one GPU.

For the MLP and O-projection shapes at several token counts: correctness of each Gluon
variant (against a float64 product of the operands truncated to TF32 as the tensor cores
read them, on a ragged M) and its median time (fuseval.bench.time_call: CUDA events, L2
flushed) next to the table's Triton kernel.

    PYTHONPATH=src python3 benchmarks/probes/qwen2vl_gluon_gemm.py [--sizes 2048,8192]

Writes $OUT/gluon_gemm.json (or ./out) and prints a table last.
"""
from __future__ import annotations

import argparse
import json
import os

import torch

from fuseval.bench import time_call
from fuseval.operators.qwen2vl_decoder_layer import _gluon as G
from fuseval.operators.qwen2vl_decoder_layer import fast as F

OUT = os.environ.get("OUT") or "out"
H, I, QD = 3584, 18944, 3584
# (BN, STAGES, GROUP_M)
VARIANTS = {"gate_up": [(128, 4, 16), (128, 3, 16), (128, 4, 8)],
            "down": [(256, 4, 16), (256, 3, 16), (128, 4, 16)],
            "o_proj": [(256, 4, 16), (128, 4, 16)]}


def truncated(t):
    return (t.view(torch.int32) & -8192).view(torch.float32).double()


def run_gluon(kind, a, w1, w2, res, out, bn, stages, group_m, sms):
    G.launch(a, w1, w2, res, out, block_m=128, block_n=bn, block_k=32, stages=stages, group_m=group_m,
             num_warps=8, n_programs=sms, gate_up=kind == "gate_up", round_out=False)


def check(kind, bn, stages, group_m, sms, dev):
    """Ragged M, both operand orders of the residual; returns max abs error vs float64."""
    M, K, N = 300, 512, 768
    a = torch.randn(M, K, device=dev)
    w1 = torch.randn(N, K, device=dev) / K ** 0.5
    w2 = torch.randn(N, K, device=dev) / K ** 0.5 if kind == "gate_up" else None
    res = None if kind == "gate_up" else torch.randn(M, N, device=dev)
    out = torch.full((M, N), float("nan"), device=dev)
    run_gluon(kind, a, w1, w2, res, out, bn, stages, group_m, sms)
    g = truncated(a) @ truncated(w1).T
    if kind == "gate_up":
        u = truncated(a) @ truncated(w2).T
        ref = g * torch.sigmoid(g) * u
    else:
        ref = res.double() + g
    return float((out.double() - ref).abs().max())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1024,2048,4096,8192")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    rows = []
    errors = {}
    for kind, variants in VARIANTS.items():
        for bn, st, gm in variants:
            errors[f"{kind} {bn},{st},{gm}"] = check(kind, bn, st, gm, sms, dev)
    print("max abs error vs float64 of TF32-truncated operands:", json.dumps(errors), flush=True)
    w = {k: torch.randn(*s, device=dev) / s[1] ** 0.5 for k, s in
         {"wg": (I, H), "wu": (I, H), "wd": (H, I), "wo": (H, QD)}.items()}
    for M in [int(m) for m in args.sizes.split(",")]:
        sh = F.Shape(1, M, H, 28, 4, 128, I)
        plan = F.plan_for(sh, dev)
        h = torch.randn(M, H, device=dev)
        act = torch.randn(M, I, device=dev)
        attn = torch.randn(M, QD, device=dev)
        for kind in VARIANTS:
            if kind == "gate_up":
                a, w1, w2, res, N = h, w["wg"], w["wu"], None, I
                triton_fn = lambda out: F.launch_gate_up(a, w1, w2, out, plan.gate_up, "tf32", fuse_act=True)
            elif kind == "down":
                a, w1, w2, res, N = act, w["wd"], None, h, H
                triton_fn = lambda out: F.launch_residual_gemm(a, w1, res, out, plan.down, "tf32")
            else:
                a, w1, w2, res, N = attn, w["wo"], None, h, H
                triton_fn = lambda out: F.launch_residual_gemm(a, w1, res, out, plan.o_proj, "tf32")
            out_t = torch.empty(M, N, device=dev)
            t_triton = time_call(lambda: triton_fn(out_t)).median_ms
            row = dict(kind=kind, M=M, triton_ms=t_triton, triton_cfg=repr(getattr(plan, kind)))
            out_g = torch.empty(M, N, device=dev)
            for bn, st, gm in VARIANTS[kind]:
                t = time_call(lambda: run_gluon(kind, a, w1, w2, res, out_g, bn, st, gm, sms)).median_ms
                diff = float((out_g - out_t).abs().max() / out_t.abs().max())
                row[f"gluon {bn},{st},{gm}"] = (t, diff)
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(os.path.join(OUT, "gluon_gemm.json"), "w") as f:
        json.dump(dict(errors=errors, rows=rows), f, indent=1)
    print("\nkind     M      triton ms   gluon variants (BN,stages,group: ms, rel diff vs triton)")
    for r in rows:
        g = "  ".join(f"{k[6:]}: {v[0]:.3f} ({v[1]:.1e})" for k, v in r.items() if k.startswith("gluon"))
        print(f"{r['kind']:8s} {r['M']:5d}  {r['triton_ms']:.3f}   {g}")


if __name__ == "__main__":
    main()
