"""Tile sweep of the fused nvfp4_qkv_rope kernel on one GPU, in one process.

For each kernel configuration (BM, BK, warps, stages, W as A operand or not): compile,
check against the float64 oracle on a ragged two-batch shape (and that every element is
the oracle rounded once), then time it (CUDA events, L2 flushed, median) at the token
counts M = B*S of the 16 benchmark cases. For comparison it times cuBLAS on the same GEMM
with the weights already dequantized to bf16 (no norm, no RoPE). Prints a table, the
estimated suite mean of each config and of the best config per M, and writes
``sweep.json`` and ``best_table.json`` (the best config per M as a tile table, the format of
``fast.options()["tile_table"]``, which ``fast.forward(..., config=table)`` and
``fast.variant(config=table)`` take) to --out.

  PYTHONPATH=src python3 benchmarks/sweep_nvfp4_qkv_rope.py --out /tmp/sweep
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch

from fuseval.bench import measure_ceilings, time_call
from fuseval.check import compare
from fuseval.operators import load
from fuseval.operators.nvfp4_qkv_rope import fast as fast
from fuseval.inputs import generate_inputs
from fuseval.operators.nvfp4_qkv_rope import reference as ref

CONFIGS = [
    "128,64,8,3,a", "128,128,8,3,a", "256,64,16,3,a", "256,64,8,3,a", "128,64,4,4,a",
    "64,64,4,4,a", "64,128,4,3,a", "128,64,8,3", "256,64,16,3", "64,64,4,4",
]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="sweep_out")
    p.add_argument("--configs", default=",".join(c.replace(",", "/") for c in CONFIGS),
                   help="configs as BM/BK/WARPS/STAGES[/a], comma-separated")
    p.add_argument("--rep-ms", type=float, default=40.0)
    p.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    configs = [fast.KernelConfig.parse(c.replace("/", ",")) for c in args.configs.split(",") if c]
    dev = torch.device("cuda")
    defn = load("nvfp4_qkv_rope")
    cases = defn.cases()
    case_m = [c.axes["seq_len"] * c.axes["batch_size"] for c in cases]
    sizes = sorted(set(case_m))
    t0 = time.time()
    ceil = measure_ceilings(dev)
    print(f"ceilings: copy {ceil.copy_bytes_per_s / 1e12:.2f} TB/s, "
          + ", ".join(f"{k} {v / 1e12:.0f} TFLOP/s" for k, v in ceil.matmul_flops_per_s.items()), flush=True)

    big = generate_inputs(defn, {"seq_len": max(sizes), "batch_size": 1}, seed=args.seed, device=dev)
    print(f"inputs ready ({time.time() - t0:.1f}s)", flush=True)

    def shaped(m: int, b: int = 1):
        x = big[0][:, :m].reshape(b, m // b, -1).contiguous()
        cos = big[1][:, :m].reshape(b, m // b, -1).contiguous()
        sin = big[2][:, :m].reshape(b, m // b, -1).contiguous()
        return [x, cos, sin] + list(big[3:])

    # correctness shape: 2 x 500 tokens (ragged for every tile size, tiles straddle batches)
    chk = shaped(1000, 2)
    taps, oracle = {}, {}
    fast.forward.staged(*chk, taps=taps)
    refs = ref.reference(*chk, taps=oracle)
    dequant_exact = bool(torch.equal(taps["dequant"].double(), oracle["dequant"].float().double()))
    print(f"dequant tap bit-exact vs oracle: {dequant_exact}", flush=True)
    baseline_err = {}
    for name, fn in (("torch_cached", ref.torch_cached_bf16), ("staged", fast.forward.staged)):
        outs = fn(*chk)
        baseline_err[name] = {s.name: (m.max_abs, m.matched_ratio) for s, m in zip(
            defn.outputs, [compare(o, r, defn.tolerance) for o, r in zip(outs, refs)])}
    print("errors torch_cached:", baseline_err["torch_cached"], flush=True)

    # cuBLAS on the bare GEMM, bf16 weights already dequantized
    w_all = torch.cat([ref.dequantize_torch(big[3 + 3 * i], big[4 + 3 * i], big[5 + 3 * i])
                       for i in range(3)])
    cublas = {}
    for m in sizes:
        x2 = big[0][0, :m]
        cublas[m] = time_call(lambda: x2 @ w_all.T, device=dev, rep_ms=args.rep_ms, warmup_ms=10).median_ms
    del w_all

    results = []
    for cfg in configs:
        row = {"config": cfg.label(), "times_ms": {}, "error": None}
        try:
            t = time.time()
            out = fast.forward(*chk, config=cfg)
            torch.cuda.synchronize()
            row["first_call_s"] = time.time() - t
            metrics = [compare(o, r, defn.tolerance) for o, r in zip(out, refs)]
            row["passed"] = all(mm.passed for mm in metrics)
            row["max_abs"] = [mm.max_abs for mm in metrics]
            row["matched"] = [mm.matched_ratio for mm in metrics]
            row["exact_rounding_fraction"] = [
                float(((o.double() - r).abs() <= r.abs() * 2.0 ** -8 * 1.001 + 1e-5).double().mean())
                for o, r in zip(out, refs)]
            for m in sizes:
                inp = shaped(m)
                row["times_ms"][m] = time_call(lambda: fast.forward(*inp, config=cfg), device=dev,
                                               rep_ms=args.rep_ms, warmup_ms=10).median_ms
        except Exception as exc:  # noqa: BLE001 - a config that fails is a finding
            row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            traceback.print_exc()
        results.append(row)
        times = " ".join(f"{row['times_ms'].get(m, float('nan')):.4f}" for m in sizes)
        print(f"{cfg.label():>16} pass={row.get('passed')} t1={row.get('first_call_s', 0):.1f}s "
              f"ms@M {times} {row['error'] or ''}", flush=True)

    # best config per M and estimated suite means (case latencies depend on M = B*S only)
    flops = {m: 2 * m * 6144 * 4096 for m in sizes}
    floor = {m: flops[m] / ceil.matmul_flops_per_s["bf16"] for m in sizes}
    best = {}
    for m in sizes:
        cands = [(r["times_ms"][m], r["config"]) for r in results
                 if m in r["times_ms"] and r.get("passed")]
        if cands:
            best[m] = min(cands)
    suite = lambda f: sum(f(m) for m in case_m) / len(case_m)
    lines = [f"{'M':>6} {'best ms':>9} {'config':>16} {'TFLOP/s':>8} {'%floor':>7} {'cuBLAS ms':>10}"]
    for m in sizes:
        if m in best:
            t, c = best[m]
            lines.append(f"{m:>6} {t:>9.4f} {c:>16} {flops[m] / t / 1e9:>8.0f} "
                         f"{100 * floor[m] * 1e3 / t:>6.1f}% {cublas[m]:>10.4f}")
    for r in results:
        if r["times_ms"] and len(r["times_ms"]) == len(sizes):
            lines.append(f"suite mean {r['config']:>16}: {suite(lambda m: r['times_ms'][m]):.4f} ms")
    if len(best) == len(sizes):
        lines.append(f"suite mean best-per-M: {suite(lambda m: best[m][0]):.4f} ms; cuBLAS GEMM only "
                     f"{suite(lambda m: cublas[m]):.4f} ms; floor {1e3 * suite(lambda m: floor[m]):.4f} ms")
        table = [{"max_tokens": None if m == sizes[-1] else m,
                  "config": fast.KernelConfig.parse(best[m][1]).to_dict()} for m in sizes]
        with open(os.path.join(args.out, "best_table.json"), "w") as f:
            json.dump(table, f, indent=1)
        lines.append("best table: " + "; ".join(f"{row['max_tokens'] or 'inf'}: {best[m][1]}"
                                                for row, m in zip(table, sizes)))
    with open(os.path.join(args.out, "sweep.json"), "w") as f:
        json.dump({"seed": args.seed, "ceilings": ceil.__dict__, "sizes": sizes, "case_m": case_m,
                   "cublas_ms": cublas, "results": results, "dequant_exact": dequant_exact,
                   "baseline_err": baseline_err, "device": torch.cuda.get_device_name()},
                  f, indent=1, default=str)
    print("\n".join(lines), flush=True)
    print(f"sweep took {time.time() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
