"""Op A's MLP and O-projection GEMMs on one GPU: how much the tile order (GROUP_M, the
number of row tiles that walk the weight tiles together) matters, next to cuBLAS on the
same shape, with the SM clock and power logged while it runs.

Why: in the third session's exploration the same Triton kernel for gate/up measured
6.76 ms with GROUP_M=8 and 6.14 ms with GROUP_M=16 at 8192 tokens, so L2 reuse moves
these kernels by 10%, and no other group size had been tried.

    PYTHONPATH=src python3 benchmarks/probes/qwen2vl_group.py [--sizes 2048,8192] [--rounds 2]

Variants are compiled first in worker processes (qwen2vl_breakdown.precompile), then
timed in interleaved rounds (every variant once per round, L2 flushed, median of each
round; the table shows the median over rounds), so a clock that drifts during the run
moves every variant alike. Writes group_probe.json and clocks.csv (the SM clock, power and
temperature every 500 ms, from fuseval.clocks) to $OUT (or ./out).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import qwen2vl_breakdown as B  # noqa: E402


def variants():
    from fuseval.operators.qwen2vl_decoder_layer.fast import GemmConfig as G
    ws128 = {f"W128x128s3g{g}": G(128, 128, 32, 8, 3, True, True, True, GROUP_M=g) for g in (8, 16, 32, 64)}
    gl128 = {f"g128x128s3g{g}": G(128, 128, 32, 8, 3, GROUP_M=g, gluon=True) for g in (16, 32)}
    gl256 = {f"g128x256s3g{g}": G(128, 256, 32, 8, 3, GROUP_M=g, gluon=True) for g in (4, 8, 16, 32)}
    ws256 = {f"W128x256s3g{g}": G(128, 256, 32, 8, 3, True, True, True, GROUP_M=g) for g in (16, 32)}
    return {"gate_up": {**ws128, **gl128}, "down": {**gl256, **ws256}, "o_proj": gl256}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="2048,4096,8192")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rep-ms", type=int, default=100)
    ap.add_argument("--workers", type=int, default=14)
    args = ap.parse_args()
    out_dir = B.OUT
    os.makedirs(out_dir, exist_ok=True)
    from fuseval.bench import measure_ceilings
    from fuseval.clocks import ClockMonitor
    from fuseval.operators.qwen2vl_decoder_layer import fast as F
    sizes = [int(s) for s in args.sizes.split(",")]
    space = variants()
    seen, jobs = {}, []
    for kind, rows in space.items():
        for cfg in rows.values():
            jobs += B.plan_jobs(1, 512, "tf32", B.tuning_for(kind, cfg), seen)
    B.precompile(jobs, args.workers)
    clocks = ClockMonitor("cuda", interval_ms=500)
    clocks.start()
    try:
        ceil = measure_ceilings(torch.device("cuda"))
        tf32 = ceil.matmul_flops_per_s["tf32"]
        print(f"tf32 ceiling {tf32 / 1e12:.0f} TFLOP/s", flush=True)
        torch.backends.cuda.matmul.allow_tf32 = True
        W = B.make_weights("cuda")
        c = B.consts()
        H, I = c["hidden_size"], c["intermediate_size"]
        QD = c["num_heads"] * c["head_dim"]
        w_gu = torch.cat([W["wg"], W["wu"]])
        results = {"tf32_ceiling": tf32, "device": torch.cuda.get_device_name(), "rows": []}
        for M in sizes:
            act = B.make_activations(1, M, "cuda")
            sh = F.shape_of(B.inputs_of(W, act))
            x2 = act[0].view(M, H)
            a_attn = torch.randn(M, QD, device="cuda")
            a_act = torch.randn(M, I, device="cuda")
            calls = {}
            for kind, rows in space.items():
                for name, cfg in rows.items():
                    plan = F.plan_for(sh, x2.device, "tf32", tuning=B.tuning_for(kind, cfg))
                    if kind == "gate_up":
                        o = torch.empty(M, I, device="cuda")
                        fn = (lambda p=plan, o=o: F.launch_gate_up(x2, W["wg"], W["wu"], o, p.gate_up, "tf32",
                                                                   fuse_act=True, round_out=True))
                    elif kind == "down":
                        o = torch.empty(M, H, device="cuda")
                        fn = lambda p=plan, o=o: F.launch_residual_gemm(a_act, W["wd"], x2, o, p.down, "tf32")
                    else:
                        o = torch.empty(M, H, device="cuda")
                        fn = lambda p=plan, o=o: F.launch_residual_gemm(a_attn, W["wo"], x2, o, p.o_proj, "tf32")
                    calls[(kind, name)] = fn
                calls[(kind, "cuBLAS")] = {"gate_up": lambda: x2 @ w_gu.T, "down": lambda: a_act @ W["wd"].T,
                                           "o_proj": lambda: a_attn @ W["wo"].T}[kind]
            flops = {"gate_up": 2 * M * H * 2 * I, "down": 2 * M * I * H, "o_proj": 2 * M * QD * H}
            times = B.bench_rounds(calls, args.rounds, args.rep_ms, label=f"M={M}")
            for (kind, name), ts in times.items():
                ms = statistics.median(ts)
                floor = flops[kind] / tf32 * 1e3
                results["rows"].append(dict(kind=kind, M=M, variant=name, ms=ms, rounds=ts, floor_ms=floor))
            del a_attn, a_act
        with open(os.path.join(out_dir, "group_probe.json"), "w") as f:
            json.dump(results, f, indent=1)
    finally:
        clocks.stop()
        with open(os.path.join(out_dir, "clocks.csv"), "w") as f:
            f.write("time,sm_mhz,power_w,temp_c\n")
            f.writelines(f"{c.t:.3f},{c.sm_mhz:.0f},{c.power_w},{c.temp_c}\n" for c in clocks.samples())
        clocks.close()
    print(f"{'kind':8s} {'M':>5s} {'variant':>16s} {'ms':>8s} {'%floor':>7s}  rounds")
    for r in results["rows"]:
        print(f"{r['kind']:8s} {r['M']:5d} {r['variant']:>16s} {r['ms']:8.3f} {100 * r['floor_ms'] / r['ms']:6.1f}%  "
              + " ".join(f"{t:.3f}" for t in r["rounds"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
