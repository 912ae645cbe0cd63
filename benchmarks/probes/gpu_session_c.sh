#!/usr/bin/env bash
# One device call (2026-12-01, third session): the GPU tests of the parts and the bench,
# op B's bench with its parts and the quantizer candidate, and the GPU gate's wall time
# serial and in two processes. Outputs under $OUT. Usage: bash benchmarks/probes/gpu_session_c.sh [bench|gate]
set -u
OUT=${OUT:-session_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:$PWD/benchmarks/probes:$PWD/tests
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv > "$OUT/smi.csv" 2>&1
if [ "${1:-bench}" = bench ]; then
    t0=$(date +%s)
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/fast/test_fast_nvfp4_qkv_rope.py tests/bench/test_bench.py \
        -k "parts or bench" > "$OUT/gpu_tests.txt" 2>&1
    echo "gpu tests rc=$? ($(( $(date +%s) - t0 )) s): $(tail -1 "$OUT/gpu_tests.txt")"
    t0=$(date +%s)
    python3 -m fuseval.cli bench --op nvfp4_qkv_rope --impls fast,torch,torch_cached,nvfp4_tables:quant4096 \
        --cases all --check --sustained-s 0 --no-plot --out "$OUT/bench_b" > "$OUT/bench_b.txt" 2> "$OUT/bench_b.err"
    echo "bench rc=$? ($(( $(date +%s) - t0 )) s)"
    sed -n '/parts timed apart/,$p' "$OUT/bench_b.txt" | cut -c1-160 | head -30
    grep -A6 "suite mean over" "$OUT/bench_b.txt" | cut -c1-300
else
    for jobs in ${2:-1 2}; do
        t0=$(date +%s)
        python3 -m fuseval.cli gate --op all --impl fast --profile gpu --device cuda --jobs "$jobs" \
            --out "$OUT/gate_jobs$jobs" > "$OUT/gate_jobs$jobs.txt" 2> "$OUT/gate_jobs$jobs.err"
        echo "gate --jobs $jobs rc=$? wall $(( $(date +%s) - t0 )) s"
        grep -E "^time |GATE" "$OUT/gate_jobs$jobs.txt" | cut -c1-250
    done
fi
