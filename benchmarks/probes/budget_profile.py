"""Where the GPU budget of one operator spends its time: torch.profiler over
``run_budget(op, "fast", config="seed", device="cuda", isolate=False)``, after one warm-up
case. Prints the top CUDA kernels and CPU ops by total time, and the budget's own timing
keys. One device call:

    PYTHONPATH=$PWD/src python3 benchmarks/probes/budget_profile.py [op] [cases]
"""
from __future__ import annotations

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from fuseval.budget.runner import run_budget

op = sys.argv[1] if len(sys.argv) > 1 else "qwen2vl_decoder_layer"
cases = sys.argv[2] if len(sys.argv) > 2 else "all"
run_budget(op, "fast", config="seed", cases="0", device="cuda", isolate=False, hygiene=False)
t0 = time.perf_counter()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    report = run_budget(op, "fast", config="seed", cases=cases, device="cuda", isolate=False, hygiene=False)
print(f"{op}: budget of cases {cases} in {time.perf_counter() - t0:.1f} s (profiled)")
totals: dict[str, float] = {}
for c in report.cases:
    for k, v in (getattr(c, "seconds", None) or {}).items():
        totals[k] = totals.get(k, 0.0) + v
print("timing keys:", {k: round(v, 2) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])})
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=60))
