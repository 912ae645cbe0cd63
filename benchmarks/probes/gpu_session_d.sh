#!/usr/bin/env bash
# One device call (2026-12-01, fourth session): op A's kernels compiled in parallel for
# every case under "tf32" and "fp16", the suite bench of the policies with the check,
# then op A's GPU tests. Outputs under $OUT. Usage: bash benchmarks/probes/gpu_session_d.sh [impls]
set -u
OUT=${OUT:-session_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:$PWD/benchmarks
IMPLS=${1:-fast,fast_tf32,torch_fp16}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv > "$OUT/smi.csv" 2>&1
t0=$(date +%s)
# a file, not stdin: the compile workers are spawned processes that re-import the main module
cat > "$OUT/precompile.py" <<'PY'
import qwen2vl_breakdown as B
if __name__ == "__main__":
    seen, jobs = {}, []
    for _, b, s in B.case_list():
        for precision in ("tf32", "fp16"):
            jobs += B.plan_jobs(b, s, precision, None, seen)
    B.precompile(jobs, 14, deadline_s=200)
PY
python3 "$OUT/precompile.py" > "$OUT/precompile.txt" 2>&1
echo "precompile rc=$? ($(( $(date +%s) - t0 )) s): $(grep precompiled "$OUT/precompile.txt")"
t0=$(date +%s)
python3 -m fuseval.cli bench --op qwen2vl_decoder_layer --impls "$IMPLS" --cases all --check --no-plot \
    --sustained-s 3 --rep-ms 100 --out "$OUT/bench_a" > "$OUT/bench_a.txt" 2> "$OUT/bench_a.err"
echo "bench rc=$? ($(( $(date +%s) - t0 )) s)"
if [ "${GPU_TESTS:-1}" = 1 ]; then
    t0=$(date +%s)
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/fast/test_fast_qwen2vl_decoder_layer.py > "$OUT/gpu_tests.txt" 2>&1
    echo "op A gpu tests rc=$? ($(( $(date +%s) - t0 )) s): $(tail -1 "$OUT/gpu_tests.txt")"
    grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.txt" | head -10
fi
tail -45 "$OUT/bench_a.txt" | cut -c1-220
