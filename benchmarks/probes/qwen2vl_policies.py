"""Op A on one GPU: each kernel's time under the "tf32" and "fp16" policies against its own
floor, and (``--explore``) candidate fp16 tiles for each kernel. One script, so that one
device call does it all.

    PYTHONPATH=src python3 benchmarks/probes/qwen2vl_policies.py [--sizes 1x8192,1x1024,64x128]
        [--explore] [--precompile-cases] [--workers 14]
    TRITON_INTERPRET=1 PYTHONPATH=src python benchmarks/probes/qwen2vl_policies.py --dry-run --sizes 2x16 --explore

Kernels are compiled first, in worker processes (qwen2vl_breakdown.precompile), for the
plans timed here and, with ``--precompile-cases``, for every benchmark case under both
policies (so that a ``fuseval bench`` run after this one finds them in Triton's cache).
Timing: triton.testing.do_bench, median, L2 flushed. Floors: each kernel group's FLOPs at
the rate of its policy (TF32 411, fp16 765 TFLOP/s, burst) or its bytes (as fp32) at
4.2 TB/s.
Prints a short table last; JSON lands in $OUT (or ./out).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import qwen2vl_breakdown as B  # noqa: E402

RATES = {"tf32": 411e12, "fp16": 765e12}
OUT = os.environ.get("OUT") or "out"


def candidates():
    """fp16 tiles to try per kernel (the table's entries are timed as "table")."""
    from fuseval.operators.qwen2vl_decoder_layer.fast import AttnConfig, GemmConfig as G
    res = {"t128x128k64s3": G(128, 128, 64, 8, 3, True, GROUP_M=16), "t128x256k64s2": G(128, 256, 64, 8, 2, True, GROUP_M=16),
           "t128x256k32s3": G(128, 256, 32, 8, 3, True, GROUP_M=16),
           "W128x128k64s3": G(128, 128, 64, 8, 3, True, True, True, GROUP_M=16),
           "t64x128k64s3": G(64, 128, 64, 4, 3, True), "t64x64k64s4k2": G(64, 64, 64, 4, 4, True, split_k=2)}
    gate_up = {"t128x128k64s2": G(128, 128, 64, 8, 2, True, GROUP_M=16),
               "t128x128k32s3": G(128, 128, 32, 8, 3, True, GROUP_M=16),
               "t128x64k64s3": G(128, 64, 64, 8, 3, True, GROUP_M=16),
               "W128x128k64s2": G(128, 128, 64, 8, 2, True, True, True, GROUP_M=16),
               "t64x128k64s3": G(64, 128, 64, 4, 3, True), "p128x128k64s2": G(128, 128, 64, 8, 2, GROUP_M=16)}
    qkv = {"t1m128k64s3": (1, G(128, 0, 64, 8, 3, True)), "t2m128k64s2": (2, G(128, 0, 64, 8, 2, True)),
           "t1m64k64s3": (1, G(64, 0, 64, 4, 3, True)), "t1m128k32s4": (1, G(128, 0, 32, 8, 4, True))}
    attention = {"T128x64w8s2": AttnConfig(128, 64, 8, 2, True), "T64x64w4s2": AttnConfig(64, 64, 4, 2, True),
                 "T128x128w8s2": AttnConfig(128, 128, 8, 2, True), "T64x128w4s2": AttnConfig(64, 128, 4, 2, True),
                 "T128x64w8s3": AttnConfig(128, 64, 8, 3, True), "p128x64w8s2": AttnConfig(128, 64, 8, 2)}
    return {"o_proj": res, "down": res, "gate_up": gate_up, "qkv": qkv, "attention": attention}


def kernel_times(W, act, plan, precision):
    """{kernel: median ms} of one launch of each kernel of ``plan`` (run once in pipeline
    order first, so that every buffer holds the values the next kernel reads)."""
    calls = B.kernel_calls(W, act, plan, precision)
    for fn in calls.values():
        fn()
    return {k: B.bench(fn, rep=25) for k, fn in calls.items()}


def group_floors(b, s, precision):
    """Each group's floor: its FLOPs at the policy's burst rate, or its bytes counted as
    fp32 (qwen2vl_breakdown.stage_costs) at the copy bandwidth, whichever is larger."""
    return {k: 1e3 * max(f / RATES[precision], n / B.BANDWIDTH) for k, (f, n) in B.stage_costs(b, s).items()}


def groups(t):
    return {"norm+qkv": t["norm"] + t["qkv"], "attention": t["attention"], "o_proj": t["o_proj"],
            "mlp_up": t["post_norm"] + t["gate_up"], "down": t["down"]}


def explore_size(F, W, b, s, results):
    """fp16 candidates of every kernel at one size: {kind: {name: ms}}."""
    act = B.make_activations(b, s, B.DEVICE)
    sh = F.shape_of(B.inputs_of(W, act))
    base = F.plan_for(sh, torch.device(B.DEVICE), "fp16")
    out = {}
    for kind, variants in candidates().items():
        row = {}
        for name, cfg in [("table", None)] + list(variants.items()):
            plan = base if cfg is None else F.plan_for(sh, torch.device(B.DEVICE), "fp16",
                                                       tuning=B.tuning_for(kind, cfg))
            row[name] = B.time_kernel(W, act, plan, kind, "fp16", label=f"explore {name}")
        out[kind] = row
        ok = {k: v for k, v in row.items() if v == v}
        best = min(ok, key=ok.get) if ok else "none"
        print(f"explore {b}x{s} {kind:9s} " + " ".join(f"{k}={v:.3f}" for k, v in row.items())
              + f" -> {best}", flush=True)
    results.setdefault("explore", {})[f"{b}x{s}"] = out


def precompile_jobs(sizes, explore, all_cases):
    seen, jobs = {}, []
    pairs = list(sizes)
    if all_cases:
        pairs += [(b, s) for _, b, s in B.case_list()]
    for b, s in pairs:
        for precision in ("tf32", "fp16"):
            jobs += B.plan_jobs(b, s, precision, None, seen)
    if explore:
        for b, s in sizes:
            for kind, variants in candidates().items():
                for cfg in variants.values():
                    jobs += B.plan_jobs(b, s, "fp16", B.tuning_for(kind, cfg), seen)
    return jobs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1x8192,1x1024,64x128")
    ap.add_argument("--explore", action="store_true")
    ap.add_argument("--precompile-cases", action="store_true")
    ap.add_argument("--workers", type=int, default=14)
    ap.add_argument("--dry-run", action="store_true",
                    help="the 'small' configuration on the CPU under the Triton interpreter (a smoke test)")
    args = ap.parse_args()
    if args.dry_run:
        B.CONFIG, B.DEVICE = "small", "cpu"
    from fuseval.operators.qwen2vl_decoder_layer import fast as F
    sizes = [tuple(int(v) for v in t.split("x")) for t in args.sizes.split(",")]
    t0 = time.time()
    if not args.dry_run:
        B.precompile(precompile_jobs(sizes, args.explore, args.precompile_cases), args.workers)
    W = B.make_weights(B.DEVICE)
    results = {"sizes": sizes, "kernels": {}, "options": F.options()}
    lines = []
    for b, s in sizes:
        act = B.make_activations(b, s, B.DEVICE)
        sh = F.shape_of(B.inputs_of(W, act))
        for precision in ("tf32", "fp16"):
            plan = F.plan_for(sh, torch.device(B.DEVICE), precision)
            t = kernel_times(W, act, plan, precision)
            g, fl = groups(t), group_floors(b, s, precision)
            results["kernels"][f"{b}x{s}/{precision}"] = dict(kernels=t, groups=g, floors=fl, plan=plan.to_json())
            lines.append(f"{b}x{s:<5d} {precision:5s} total {sum(t.values()):7.3f} ms | "
                         + " ".join(f"{k}={g[k]:.3f}/{fl[k]:.3f}" for k in g))
        del act
    if args.explore:
        for b, s in sizes:
            explore_size(F, W, b, s, results)
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "qwen2vl_policies.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(f"done in {time.time() - t0:.0f}s; kernel group ms / floor ms:")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
