#!/usr/bin/env bash
# One device call (2026-12-01, fifth session): op A's GPU tests of the conversion on a
# second stream, the kernels precompiled, then the suite bench of the production path
# beside the overlapped conversion (benchmarks/probes/qwen2vl_overlap.py).
# Outputs under $OUT. Usage: bash benchmarks/probes/gpu_session_e.sh [impls]
set -u
OUT=${OUT:-session_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:$PWD/benchmarks:$PWD/benchmarks/probes HYPOTHESIS_PROFILE=ci
IMPLS=${1:-fast,qwen2vl_overlap:overlap,torch_fp16}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv > "$OUT/smi.csv" 2>&1
t0=$(date +%s)
python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fast_qwen2vl_decoder_layer.py -k overlap \
    > "$OUT/gpu_tests_overlap.txt" 2>&1
echo "overlap gpu tests rc=$? ($(( $(date +%s) - t0 )) s): $(tail -1 "$OUT/gpu_tests_overlap.txt")"
grep -E "^(FAILED|ERROR|E )" "$OUT/gpu_tests_overlap.txt" | head -10
t0=$(date +%s)
cat > "$OUT/precompile.py" <<'PY'
import qwen2vl_breakdown as B
if __name__ == "__main__":
    seen, jobs = {}, []
    for _, b, s in B.case_list():
        jobs += B.plan_jobs(b, s, "fp16", None, seen)
    B.precompile(jobs, 14, deadline_s=200)
PY
python3 "$OUT/precompile.py" > "$OUT/precompile.txt" 2>&1
echo "precompile rc=$? ($(( $(date +%s) - t0 )) s): $(grep precompiled "$OUT/precompile.txt")"
t0=$(date +%s)
python3 -m fuseval.cli bench --op qwen2vl_decoder_layer --impls "$IMPLS" --cases all --check --no-plot \
    --sustained-s 0 --rep-ms 100 --out "$OUT/bench_a" > "$OUT/bench_a.txt" 2> "$OUT/bench_a.err"
echo "bench rc=$? ($(( $(date +%s) - t0 )) s)"
cp "$OUT/bench_a/"*.json "$OUT/" 2>/dev/null
tail -45 "$OUT/bench_a.txt" | cut -c1-200
