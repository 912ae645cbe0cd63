#!/usr/bin/env bash
# One device call for op B: the GPU checks (benchmarks/probes/nvfp4_gpu_checks.py), then
# `fuseval bench --check` of the production path, the torch baselines and the candidate
# tables of nvfp4_tables.py. Outputs under $OUT (or ./nvfp4_out). Usage:
#   bash benchmarks/probes/nvfp4_gpu_run.sh [IMPLS] [checks|nochecks] [breakdown|nobreakdown]
set -u
OUT=${OUT:-nvfp4_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:$PWD/benchmarks/probes:$PWD/tests
IMPLS=${1:-fast,torch,torch_cached,nvfp4_tables:decode256}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv > "$OUT/smi_before.csv" 2>&1
t0=$(date +%s)
python3 -m fuseval.cli bench --op nvfp4_qkv_rope --impls "$IMPLS" --cases all --check --sustained-s 0 \
    --no-plot --out "$OUT/bench" > "$OUT/bench.txt" 2> "$OUT/bench.err"
echo "bench rc=$? ($(( $(date +%s) - t0 )) s)"
if [ "${2:-checks}" = checks ]; then
    t0=$(date +%s)
    python3 benchmarks/probes/nvfp4_gpu_checks.py > "$OUT/checks.txt" 2>&1
    echo "checks rc=$? ($(( $(date +%s) - t0 )) s)"
    grep -E "^(PASS|FAIL)|failure" "$OUT/checks.txt" | cut -c1-200
fi
if [ "${3:-breakdown}" = breakdown ]; then
    python3 benchmarks/probes/nvfp4_breakdown.py --json "$OUT/breakdown.json" > "$OUT/breakdown.txt" 2>&1
    echo "breakdown rc=$?"; cat "$OUT/breakdown.txt" | tail -5 | cut -c1-300
fi
head -24 "$OUT/bench.txt" | cut -c1-250
grep -A12 "suite mean over" "$OUT/bench.txt" | cut -c1-400
