"""Op A, "fp16" policy with the weights converted to fp16 once per call (``Plan.fp16_weights``):
the conversion pass, every GEMM's candidate tiles on fp16 weights, the same GEMMs on fp32
weights converted inside the kernel (the table's rows below ``fp16_weights_from``), and
whole-layer calls under the explored table. One script, one device call.

    PYTHONPATH=src python3 benchmarks/probes/qwen2vl_fp16_weights.py [--sizes 512,1024,2048,4096,8192]
    TRITON_INTERPRET=1 PYTHONPATH=src python benchmarks/probes/qwen2vl_fp16_weights.py --dry-run

Timing: triton.testing.do_bench (median, L2 flushed). GEMM floors at the fp16 burst rate
(765 TFLOP/s); the conversion's floor is its bytes (4 read + 2 written per weight) at
4.2 TB/s. Writes qwen2vl_fp16_weights.json (all times) and fp16_table.json (the explored
table, ``fast.tables_from_json`` reads it) to $OUT; prints a short table last.
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

FP16_RATE = 765e12
OUT = os.environ.get("OUT") or "out"
GEMMS = ("qkv", "o_proj", "gate_up", "down")


def candidates():
    """Tiles for fp16 weights: {kind: {name: config}} (t: TMA tiles, P: persistent,
    W: persistent and warp-specialized, A: weights as the register A operand)."""
    from fuseval.operators.qwen2vl_decoder_layer.fast import GemmConfig as G
    res = {"t128x256k64s3": G(128, 256, 64, 8, 3, True), "t128x256k64s4": G(128, 256, 64, 8, 4, True),
           "t128x128k64s4": G(128, 128, 64, 8, 4, True), "t128x128k64s4k2": G(128, 128, 64, 8, 4, True, split_k=2),
           "P128x256k64s3": G(128, 256, 64, 8, 3, True, True), "W128x256k64s3": G(128, 256, 64, 8, 3, True, True, True),
           "W128x128k64s4": G(128, 128, 64, 8, 4, True, True, True),
           "A256x128k64s3": G(256, 128, 64, 8, 3, weights_as_a=True)}
    gate_up = {"t128x128k64s3": G(128, 128, 64, 8, 3, True, GROUP_M=16),
               "t128x128k64s4": G(128, 128, 64, 8, 4, True, GROUP_M=16),
               "W128x128k64s3": G(128, 128, 64, 8, 3, True, True, True, GROUP_M=16),
               "W128x128k64s4": G(128, 128, 64, 8, 4, True, True, True, GROUP_M=16),
               "P128x128k64s3": G(128, 128, 64, 8, 3, True, True, GROUP_M=16),
               "t128x64k64s4": G(128, 64, 64, 4, 4, True, GROUP_M=16),
               "A128x128k64s3": G(128, 128, 64, 8, 3, GROUP_M=16, weights_as_a=True)}
    qkv = {"h1m128k64s3": (1, G(128, 0, 64, 8, 3, True)), "h1m128k64s4": (1, G(128, 0, 64, 8, 4, True)),
           "h2m128k64s3": (2, G(128, 0, 64, 8, 3, True)), "h2m128k64s4": (2, G(128, 0, 64, 8, 4, True)),
           "h1m64k64s4": (1, G(64, 0, 64, 4, 4, True))}
    return {"qkv": qkv, "o_proj": res, "gate_up": gate_up, "down": res}


def tuning(kind, cfg, fp16_weights):
    return dict(B.tuning_for(kind, cfg), fp16_weights=fp16_weights)


def gemm_floor_ms(kind, M):
    c = B.consts()
    H, I, QD, KD = c["hidden_size"], c["intermediate_size"], c["num_heads"] * c["head_dim"], \
        c["num_kv_heads"] * c["head_dim"]
    flops = {"qkv": 2 * M * H * (QD + 2 * KD), "o_proj": 2 * M * QD * H, "gate_up": 4 * M * H * I,
             "down": 2 * M * I * H}[kind]
    return 1e3 * flops / FP16_RATE


def fp32_weight_row(F, kind, M):
    """The table's row for fp32 weights nearest M (what a call below fp16_weights_from takes)."""
    from fuseval.operators.qwen2vl_decoder_layer._plans import nearest
    return nearest(F.tables("fp16").gemm_rows(kind, False), M)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="512,1024,2048,4096,8192")
    ap.add_argument("--workers", type=int, default=14)
    ap.add_argument("--dry-run", action="store_true", help="the 'small' configuration under the interpreter")
    args = ap.parse_args()
    if args.dry_run:
        B.CONFIG, B.DEVICE = "small", "cpu"
        args.sizes = "16,40"
    from fuseval.operators.qwen2vl_decoder_layer import fast as F
    sizes = [int(v) for v in args.sizes.split(",")]
    t0 = time.time()
    dev = torch.device(B.DEVICE)
    if not args.dry_run:
        seen, jobs = {}, []
        for M in sizes:
            for kind, variants in candidates().items():
                for cfg in variants.values():
                    jobs += B.plan_jobs(1, M, "fp16", tuning(kind, cfg, True), seen)
                jobs += B.plan_jobs(1, M, "fp16", tuning(kind, fp32_weight_row(F, kind, M), False), seen)
            jobs += B.plan_jobs(1, M, "fp16", None, seen) + B.plan_jobs(1, M, "tf32", None, seen)
        B.precompile(jobs, args.workers, deadline_s=240)
    W = B.make_weights(B.DEVICE)
    results = {"sizes": sizes, "gemm": {}, "gemm_sums": {}, "convert": {}, "layer": {}}
    best: dict[str, dict[int, tuple]] = {k: {} for k in GEMMS}
    lines = []
    for M in sizes:
        act = B.make_activations(1, M, B.DEVICE)
        sh = F.shape_of(B.inputs_of(W, act))
        conv_plan = F.plan_for(sh, dev, "fp16", tuning={"fp16_weights": True})
        conv = B.bench(B.kernel_calls(W, act, conv_plan, "fp16")["convert"], rep=30)
        nbytes = 6 * sum(W[n].numel() for n in ("wq", "wk", "wv", "wo", "wg", "wu", "wd"))
        results["convert"][M] = dict(ms=conv, floor_ms=1e3 * nbytes / B.BANDWIDTH)
        row = {}
        for kind, variants in candidates().items():
            times = {}
            for name, cfg in [("fp32w", fp32_weight_row(F, kind, M))] + list(variants.items()):
                plan = F.plan_for(sh, dev, "fp16", tuning=tuning(kind, cfg, name != "fp32w"))
                times[name] = B.time_kernel(W, act, plan, kind, "fp16", label=f"{M} {name}")
            ok = {k: v for k, v in times.items() if v == v and k != "fp32w"}
            name = min(ok, key=ok.get)
            best[kind][M] = (name, variants[name])
            row[kind] = dict(times=times, best=name, floor_ms=gemm_floor_ms(kind, M))
            print(f"{M:5d} {kind:8s} floor {gemm_floor_ms(kind, M):.3f} fp32w {times['fp32w']:.3f} "
                  + " ".join(f"{k}={v:.3f}" for k, v in times.items() if k != "fp32w") + f" -> {name}", flush=True)
        results["gemm"][M] = row
        sum_fp16w = conv + sum(row[k]["times"][row[k]["best"]] for k in GEMMS)
        sum_fp32w = sum(row[k]["times"]["fp32w"] for k in GEMMS)
        results["gemm_sums"][M] = dict(fp16_weights_with_pass=sum_fp16w, fp32_weights=sum_fp32w)
        lines.append(f"{M:5d} tokens: convert {conv:.3f} ms (floor {results['convert'][M]['floor_ms']:.3f}); GEMMs "
                     f"fp16 weights + convert {sum_fp16w:.3f} ms vs fp32 weights {sum_fp32w:.3f} ms; best "
                     + ", ".join(f"{k}={row[k]['best']}" for k in GEMMS))
        del act
    # the explored table: fp32-weight rows of the table in force below the smallest size
    # where converting won, the best fp16-weight rows from there
    base = F.tables("fp16")
    sums = results["gemm_sums"]
    wins = [M for M in sizes if sums[M]["fp16_weights_with_pass"] < sums[M]["fp32_weights"]]
    start = min(wins) if wins else None
    gemm = {}
    for kind in GEMMS:
        rows = {m: e for m, e in base.gemm_rows(kind, False).items() if start is None or m < start}
        if start is not None:
            rows.update({M: best[kind][M][1] for M in sizes if M >= start})
        gemm[kind] = rows
    table = F.Tables(gemm, base.attention, "explored by qwen2vl_fp16_weights.py", start)
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "fp16_table.json"), "w") as f:
        json.dump(table.to_json(), f, indent=1)
    # whole layers: tf32 default, fp16 table in force, fp16 explored table
    layer_lines = []
    for M in sizes:
        act = B.make_activations(1, M, B.DEVICE)
        inputs = B.inputs_of(W, act)
        fns = {"tf32": F.variant(precision="tf32"), "fp16_in_force": F.variant(precision="fp16"),
               "fp16_explored": F.variant(precision="fp16", tables=table)}
        outs = {k: fn(*inputs)[0] for k, fn in fns.items()}
        times = {k: B.bench(lambda fn=fn: fn(*inputs), rep=30) for k, fn in fns.items()}
        diff = {k: float((outs[k] - outs["tf32"]).abs().max()) for k in outs}
        results["layer"][M] = dict(ms=times, max_abs_vs_tf32=diff)
        layer_lines.append(f"{M:5d} tokens layer ms: " + " ".join(f"{k}={v:.3f}" for k, v in times.items())
                           + " | max|d| vs tf32: " + " ".join(f"{k}={v:.1e}" for k, v in diff.items() if k != "tf32"))
        del act, outs
    with open(os.path.join(OUT, "qwen2vl_fp16_weights.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(f"done in {time.time() - t0:.0f}s; fp16_weights_from (explored) = {start}")
    print("\n".join(lines + layer_lines))


if __name__ == "__main__":
    main()
