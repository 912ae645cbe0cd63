#!/usr/bin/env bash
# One device call (2026-12-01, fourth session, last): op A's error budget at full size under
# the "fp16" (default) and "tf32" policies (which stages spend the tolerance), then the GPU
# tests. Outputs under $OUT. Usage: bash benchmarks/probes/gpu_session_d_final.sh
set -u
OUT=${OUT:-session_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src HYPOTHESIS_PROFILE=ci
for impl in fast fast_tf32; do
    t0=$(date +%s)
    python3 -m fuseval.cli budget --op qwen2vl_decoder_layer --impl "$impl" --config seed --cases 0,5,11,15 \
        --device cuda > "$OUT/budget_a_$impl.md" 2> "$OUT/budget_a_$impl.err"
    echo "budget $impl rc=$? ($(( $(date +%s) - t0 )) s)"
done
t0=$(date +%s)
python3 -m pytest -q -m gpu tests -p no:cacheprovider > "$OUT/pytest_gpu.txt" 2>&1
echo "gpu tests rc=$? ($(( $(date +%s) - t0 )) s): $(tail -1 "$OUT/pytest_gpu.txt")"
grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu.txt" | head -10
