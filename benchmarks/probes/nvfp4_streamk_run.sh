#!/usr/bin/env bash
# One device call for op B's stream-K schedule (2026-12-02): its GPU tests, then
# `fuseval bench --check` of production beside the stream-K candidate tables of
# nvfp4_tables.py on the cases up to 2048 tokens. Outputs under $OUT. Usage:
#   bash benchmarks/probes/nvfp4_streamk_run.sh [IMPLS] [CASES]
set -u
OUT=${OUT:-streamk_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:$PWD/benchmarks/probes:$PWD/tests
IMPLS=${1:-fast,nvfp4_tables:sk1024,nvfp4_tables:sk2048,nvfp4_tables:sk1024s5,nvfp4_tables:sk1024m128}
CASES=${2:-0,1,5,6,8,3}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv > "$OUT/smi.csv" 2>&1
t0=$(date +%s)
python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fast_nvfp4_qkv_rope.py -k "stream_k or gluon_kernel" \
    > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? ($(( $(date +%s) - t0 )) s): $(tail -1 "$OUT/gpu_tests.txt")"
grep -E "^(FAILED|ERROR)|Error" "$OUT/gpu_tests.txt" | head -20 | cut -c1-300
t0=$(date +%s)
python3 -m fuseval.cli bench --op nvfp4_qkv_rope --impls "$IMPLS" --cases "$CASES" --check --sustained-s 0 \
    --no-plot --out "$OUT/bench" > "$OUT/bench.txt" 2> "$OUT/bench.err"
echo "bench rc=$? ($(( $(date +%s) - t0 )) s)"
tail -5 "$OUT/bench.err" | cut -c1-300
head -30 "$OUT/bench.txt" | cut -c1-250
grep -A12 "suite mean over" "$OUT/bench.txt" | cut -c1-400
