"""Time the float64 oracles at full benchmark size on a GPU (issue 2's acceptance).

For each operator: input generation, then the float64 reference on the smallest and
largest benchmark cases (median of several runs after one warm-up), plus a GPU check of
the plain-torch implementations on those cases. Prints a table last; writes JSON to
$OUT (or ./out) if set.

    PYTHONPATH=src python3 benchmarks/oracle_timing.py [--cases 0,15] [--reps 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from fuseval import check as run_check
from fuseval.definitions import load
from fuseval.inputs import generate_inputs
from fuseval.ops import resolve_impl


def timed(fn, reps):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="0,15")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--impls", default="qwen2vl_decoder_layer=torch_tf32,nvfp4_qkv_rope=torch")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a GPU"
    rows = []
    impls = dict(kv.split("=") for kv in args.impls.split(","))
    for op in ("qwen2vl_decoder_layer", "nvfp4_qkv_rope"):
        defn = load(op)
        ref = resolve_impl(defn, "reference")
        for case in defn.cases(args.cases):
            t0 = time.perf_counter()
            inputs = generate_inputs(defn, case.axes, seed=case.index, device="cuda")
            torch.cuda.synchronize()
            gen_s = time.perf_counter() - t0
            ref_s = timed(lambda: ref(*inputs), args.reps)
            del inputs
            torch.cuda.empty_cache()
            report = run_check(op, impls[op], config="seed", cases=[case.index], device="cuda")
            c = report.cases[0]
            rows.append(dict(op=op, case=case.index, axes=case.label, gen_s=gen_s, oracle_f64_s=ref_s,
                             impl=impls[op], impl_passed=c.passed, violations=c.violations,
                             max_abs=[m.max_abs for m in c.outputs],
                             matched=[m.matched_ratio for m in c.outputs]))
            torch.cuda.empty_cache()
    out = os.environ.get("OUT", "out")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "oracle_timing.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), f, indent=1)
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    print(f"{'op':24s} {'case':>4s} {'axes':38s} {'gen s':>7s} {'oracle f64 s':>12s}  impl check")
    for r in rows:
        errs = ", ".join(f"{e:.2e}" for e in r["max_abs"])
        match = ", ".join(f"{m:.4f}" for m in r["matched"])
        print(f"{r['op']:24s} {r['case']:4d} {r['axes']:38s} {r['gen_s']:7.2f} {r['oracle_f64_s']:12.3f}  "
              f"{r['impl']}: {'pass' if r['impl_passed'] else 'FAIL ' + ','.join(r['violations'])} "
              f"max_abs [{errs}] matched [{match}]")


if __name__ == "__main__":
    main()
