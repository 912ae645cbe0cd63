#!/usr/bin/env bash
# Benchmark (and check) one operator on the GPU machine, from the repository root:
#
#   benchmarks/run_gpu.sh OP [more `fuseval bench` options]
#
# e.g. through the device tool:  bash benchmarks/run_gpu.sh nvfp4_qkv_rope
# Writes bench.json, bench.txt, bench.png and bench.log to $OUT/OP (the device tool's
# output folder) or to benchmarks/out/OP. Exit status: that of `fuseval bench --check`.
set -uo pipefail
op="${1:?usage: benchmarks/run_gpu.sh OP [fuseval bench options]}"
shift
out="${OUT:-benchmarks/out}/${op}"
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -m fuseval.cli bench --op "$op" --cases all --check --out "$out" "$@" 2>&1 | tee "$out/bench.log"
exit "${PIPESTATUS[0]}"
