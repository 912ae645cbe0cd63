#!/bin/bash
# One device call for op A's precision policies (issue 16): compile, per-kernel times of
# "tf32" and "fp16" against their floors (EXPLORE=1: also fp16 tile candidates), the suite
# bench with the check, then (PYTEST_S > 0) op A's GPU tests. Run from the repository root
# (or a copy of src/, tests/ and benchmarks/):
#   OUT=out bash benchmarks/probes/qwen2vl_gpu_policies.sh [probe-s] [bench-s] [pytest-s] [impls]
export PYTHONPATH=$PWD/src
OUT=${OUT:-out}
mkdir -p "$OUT"
PROBE_S=${1:-150}
BENCH_S=${2:-170}
PYTEST_S=${3:-0}
IMPLS=${4:-fast,fast_fp16,torch,torch_tf32,torch_fp16}
SIZES=${SIZES:-1x8192,1x1024,1x128}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
t0=$(date +%s)
timeout "$PROBE_S" python3 benchmarks/probes/qwen2vl_policies.py ${EXPLORE:+--explore} --precompile-cases \
    --sizes "$SIZES" > "$OUT/policies.log" 2>&1
echo "probe rc=$? after $(( $(date +%s) - t0 )) s"
timeout "$BENCH_S" python3 -m fuseval.cli bench --op qwen2vl_decoder_layer --impls "$IMPLS" --cases all \
    --check --out "$OUT/bench" --no-plot --sustained-s 3 --rep-ms 100 > "$OUT/bench.log" 2>&1
echo "bench rc=$? after $(( $(date +%s) - t0 )) s"
if [ "$PYTEST_S" -gt 0 ]; then
    timeout "$PYTEST_S" python3 -m pytest -q -p no:cacheprovider -m gpu tests/fast/test_fast_qwen2vl_decoder_layer.py \
        > "$OUT/pytest_gpu.log" 2>&1
    echo "pytest rc=$? after $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/pytest_gpu.log")"
    grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu.log" | head -10
fi
grep -E "^explore|compile failure|precompiled" "$OUT/policies.log" | cut -c1-400
sed -n '/kernel group/,$p' "$OUT/policies.log"
tail -42 "$OUT/bench.log" | cut -c1-240
