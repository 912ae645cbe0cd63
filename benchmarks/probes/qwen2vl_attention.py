"""Op A's attention kernels on one GPU: the Triton kernel's tiles against the Gluon kernel
(operators/qwen2vl_decoder_layer/_gluon.py, P V overlapped with the next tile's softmax), at the attention
shapes of the benchmark cases. Inputs are random q', k', V^T in TF32 (what the QKV
kernel writes); every variant's output is compared with the Triton table kernel's, and
timed in interleaved rounds (L2 flushed, median per round, median over rounds).

    PYTHONPATH=src python3 benchmarks/probes/qwen2vl_attention.py [--rounds 3]

Prints a table (ms, TFLOP/s of the causal products, % of the TF32 ceiling measured in the
same run, max abs difference to the Triton kernel) and writes attention_probe.json to
$OUT (or ./out).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import qwen2vl_breakdown as B  # noqa: E402

SHAPES = [(64, 128), (8, 373), (2, 1571), (1, 4096), (1, 8192)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep-ms", type=int, default=60)
    args = ap.parse_args()
    from fuseval.bench import measure_ceilings
    from fuseval.operators.qwen2vl_decoder_layer import fast as F
    dev = torch.device("cuda")
    os.makedirs(B.OUT, exist_ok=True)
    tf32_rate = measure_ceilings(dev).matmul_flops_per_s["tf32"]
    space = {k: v for k, v in B.variant_space()["attention"].items()
             if k in ("T64x32w4s2", "T64x64w4s3", "T128x64w8s2") or k.startswith("g")}
    tf32 = lambda t: ((t.view(torch.int32) + 0x1000) & -8192).view(torch.float32)   # noqa: E731
    rows = []
    for b, s in SHAPES:
        sh = F.Shape(B=b, S=s, H=3584, Hq=28, Hkv=4, D=128, I=18944)
        qk = tf32(torch.randn(sh.M, sh.QD + sh.KD, device=dev))
        vt = torch.zeros(b, sh.Hkv, sh.D, sh.S_pad, device=dev)
        vt[..., :s] = tf32(torch.randn(b, sh.Hkv, sh.D, s, device=dev))
        table = F.plan_for(sh, dev, "tf32")
        ref = torch.empty(sh.M, sh.QD, device=dev)
        F.launch_attention(qk, vt, ref, sh, table)
        flops = 4 * sh.Hq * sh.D * b * s * (s + 1) / 2
        outs, calls = {}, {}
        for name, cfg in space.items():
            plan = F.plan_for(sh, dev, "tf32", tuning={"attention": cfg})
            out = torch.full((sh.M, sh.QD), float("nan"), device=dev)
            try:
                F.launch_attention(qk, vt, out, sh, plan)
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - a failing variant is a result
                print(f"  {name} B={b} S={s}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                continue
            outs[name] = float((out - ref).abs().max()) if not out.isnan().any() else float("nan")
            calls[name] = lambda p=plan, o=out: F.launch_attention(qk, vt, o, sh, p)
        times = B.bench_rounds(calls, args.rounds, args.rep_ms, label=f"B={b} S={s}")
        for name, ts in times.items():
            ms = statistics.median(ts)
            rows.append(dict(B=b, S=s, variant=name, table=space[name] == table.attention, ms=ms, rounds=ts,
                             tflops=flops / ms / 1e9, frac=flops / ms / 1e-3 / tf32_rate, max_diff=outs[name]))
        print(f"B={b} S={s} done (table: {table.attention})", flush=True)
    with open(os.path.join(B.OUT, "attention_probe.json"), "w") as f:
        json.dump({"tf32_ceiling": tf32_rate, "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    print(f"tf32 ceiling {tf32_rate / 1e12:.0f} TFLOP/s")
    print(f"{'B x S':>9s} {'variant':>12s} {'ms':>8s} {'TFLOP/s':>8s} {'%ceil':>6s} {'max diff':>9s}  rounds")
    for r in rows:
        mark = "*" if r["table"] else " "
        print(f"{r['B']:>3d} x{r['S']:>5d} {r['variant']:>11s}{mark} {r['ms']:8.4f} {r['tflops']:8.1f} "
              f"{100 * r['frac']:5.1f}% {r['max_diff']:9.2e}  " + " ".join(f"{t:.4f}" for t in r["rounds"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
