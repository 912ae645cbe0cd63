#!/usr/bin/env bash
# Benchmark (and check) one operator on the GPU machine:
#
#   bash benchmarks/run_gpu.sh OP [more `fuseval bench` options]
#
# e.g. through the device tool:  bash benchmarks/run_gpu.sh nvfp4_qkv_rope
# Runs `fuseval bench --op OP --cases all --check --out DIR` (options given later win) from
# this checkout's src/ (fuseval need not be installed) with $PYTHON (default python3).
# Writes bench.json, bench.txt, bench.png and bench.log to DIR = $OUT/OP (the device tool's
# output folder) or benchmarks/out/OP. Exit status: that of `fuseval bench` (without a GPU
# it skips and exits 0, or 6 with --require-gpu).
set -uo pipefail
op="${1:?usage: benchmarks/run_gpu.sh OP [fuseval bench options]}"
shift
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT:-$root/benchmarks/out}/${op}"
mkdir -p "$out"
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"${PYTHON:-python3}" -m fuseval.cli bench --op "$op" --cases all --check --out "$out" "$@" 2>&1 \
    | tee "$out/bench.log"
exit "${PIPESTATUS[0]}"
