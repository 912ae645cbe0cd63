"""Op A under sustained load: rate, SM clock, power and energy per FLOP of its two big
GEMMs (ours and cuBLAS on the same shapes), of the TF32 ceiling's own product and of the
whole fast layer, each run back to back for some seconds (GPU only).

Why: the fourth session found op A's large cases at the H200's power cap (700 W) with
the SM clock at 1440-1900 MHz, while the floor of the benchmark comes from ceilings
measured in short bursts at 1980 MHz. At the cap a kernel that spends E joules per FLOP
cannot run faster than P_cap / E FLOP/s, whatever its schedule. This probe measures E
for our kernels and for cuBLAS, so that the note can say how fast the layer can be at
the cap and whether a kernel of ours would have to spend less energy per FLOP than
cuBLAS to meet the target.

For every workload: one call, 1.5 s idle, then calls back to back for ``--seconds``
(``fuseval.bench.sustained_rate``: CUDA events around each call, no L2 flush, a steady
state rather than a latency). "burst" is the rate over the calls that finish within the
first 100 ms; "steady" is the rate over the second half, with the median SM clock and
power that nvidia-smi reported in that half (``fuseval.clocks``, 100 ms samples).
``fuseval bench`` reports the same steady rate for the ceiling's product
(``--sustained-s``). Writes power_probe.json and clocks.csv to $OUT.

    PYTHONPATH=src python3 benchmarks/probes/qwen2vl_power.py [--m 8192] [--seconds 4]
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


def sustained(fn, flops: float, seconds: float, monitor) -> dict:
    """``fuseval.bench.sustained_rate`` of ``fn``, with the clock and power of its second half."""
    from fuseval.bench import sustained_rate
    r = sustained_rate(fn, flops, seconds, idle_s=1.5)
    window = monitor.window(*r.steady_interval) or {}
    power = window.get("power_w_median")
    return {"calls": r.calls, "burst_tflops": r.burst_flops_per_s / 1e12, "steady_tflops": r.steady_flops_per_s / 1e12,
            "sm_mhz": window.get("sm_mhz_median"), "power_w": power,
            "pj_per_flop": (power / r.steady_flops_per_s * 1e12) if power else None, "window": window}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=8192)
    ap.add_argument("--seconds", type=float, default=4.0)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("qwen2vl_power: no GPU here, nothing to measure")
        return 0
    os.makedirs(B.OUT, exist_ok=True)
    from fuseval.bench import measure_ceilings, square_matmul
    from fuseval.clocks import ClockMonitor
    from fuseval.operators.qwen2vl_decoder_layer import fast as F
    from fuseval.operators.qwen2vl_decoder_layer.reference import cost_model

    torch.backends.cuda.matmul.allow_tf32 = True
    monitor = ClockMonitor("cuda", interval_ms=100)
    monitor.start()
    rows = {}
    try:
        t0 = time.time()
        tf32 = measure_ceilings(torch.device("cuda")).matmul_flops_per_s["tf32"]
        ceiling_clock = monitor.window(t0, time.time()) or {}
        M = args.m
        c = B.consts()
        H, I = c["hidden_size"], c["intermediate_size"]
        W = B.make_weights("cuda")
        act = B.make_activations(1, M, "cuda")
        inputs = B.inputs_of(W, act)
        sh = F.shape_of(inputs)
        plan = F.plan_for(sh, torch.device("cuda"), "tf32")
        x2 = act[0].view(M, H)
        a_act = torch.randn(M, I, device="cuda")
        w_gu = torch.cat([W["wg"], W["wu"]])
        gu_out, gu_cublas = torch.empty(M, I, device="cuda"), torch.empty(M, 2 * I, device="cuda")
        down_out, down_cublas = torch.empty(M, H, device="cuda"), torch.empty(M, H, device="cuda")
        ceiling_product = square_matmul("tf32", 8192, torch.device("cuda"))   # the bench's ceiling product
        layer_flops = cost_model(dict(c, batch_size=1, seq_len=M, kv_seq_len=M))["flops"]
        work = {
            "gate/up ours": (lambda: F.launch_gate_up(x2, W["wg"], W["wu"], gu_out, plan.gate_up, "tf32",
                                                      fuse_act=True, round_out=True), 4 * M * H * I),
            "gate/up cuBLAS": (lambda: torch.matmul(x2, w_gu.T, out=gu_cublas), 4 * M * H * I),
            "down ours": (lambda: F.launch_residual_gemm(a_act, W["wd"], x2, down_out, plan.down, "tf32"),
                          2 * M * I * H),
            "down cuBLAS": (lambda: torch.matmul(a_act, W["wd"].T, out=down_cublas), 2 * M * I * H),
            "8192^3 cuBLAS (ceiling shape)": (ceiling_product, 2 * 8192 ** 3),
            f"layer ours (1 x {M})": (lambda: F.forward(*inputs), layer_flops),
        }
        for name, (fn, flops) in work.items():
            rows[name] = sustained(fn, flops, args.seconds, monitor)
            r = rows[name]
            print(f"{name:32s} burst {r['burst_tflops']:6.1f}  steady {r['steady_tflops']:6.1f} TFLOP/s  "
                  f"{r['sm_mhz'] or 0:5.0f} MHz  {r['power_w'] or 0:5.0f} W", flush=True)
    finally:
        monitor.stop()
        samples = monitor.samples()
        with open(os.path.join(B.OUT, "clocks.csv"), "w") as f:
            f.write("time,sm_mhz,power_w,temp_c\n")
            f.writelines(f"{s.t:.3f},{s.sm_mhz:.0f},{s.power_w},{s.temp_c}\n" for s in samples)
        monitor.close()
    result = {"device": torch.cuda.get_device_name(), "m": args.m, "seconds": args.seconds,
              "tf32_ceiling_tflops": tf32 / 1e12, "ceiling_clock": ceiling_clock,
              "power_limit_w": monitor.power_limit_w, "rows": rows}
    with open(os.path.join(B.OUT, "power_probe.json"), "w") as f:
        json.dump(result, f, indent=1)
    cap = monitor.power_limit_w
    print(f"\nTF32 ceiling (burst) {tf32 / 1e12:.0f} TFLOP/s at {ceiling_clock.get('sm_mhz_median', 0):.0f} MHz; "
          f"power limit {cap} W")
    print(f"{'workload':32s} {'burst TF/s':>10s} {'steady TF/s':>11s} {'MHz':>5s} {'W':>5s} {'pJ/FLOP':>8s}"
          f" {'% burst ceiling':>15s}")
    for name, r in rows.items():
        pj = f"{r['pj_per_flop']:8.3f}" if r["pj_per_flop"] else f"{'-':>8s}"
        print(f"{name:32s} {r['burst_tflops']:10.1f} {r['steady_tflops']:11.1f} {r['sm_mhz'] or 0:5.0f} "
              f"{r['power_w'] or 0:5.0f} {pj} {100 * r['steady_tflops'] * 1e12 / tf32:14.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
