#!/usr/bin/env bash
# One device call (2026-12-01, fifth session): the GPU gate of both fast paths with an
# empty Triton cache and the warm-up (fuseval.gate.warmup), then again on that cache with
# and without it. Outputs under $OUT. Usage: bash benchmarks/probes/gpu_gate_warmup.sh
set -u
OUT=${OUT:-session_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src
export TRITON_CACHE_DIR=$(mktemp -d)
for run in cold:"" warm:"" warm_no_warmup:--no-warmup; do
    name=${run%%:*}; flag=${run#*:}
    t0=$(date +%s)
    python3 -m fuseval.cli gate --op all --impl fast --profile gpu --device cuda $flag --out "$OUT/gate_$name" \
        > "$OUT/gate_$name.txt" 2>&1
    echo "$name rc=$? wall $(( $(date +%s) - t0 )) s: $(grep GATE "$OUT/gate_$name.txt")"
    grep -E "^time |warm-up" "$OUT/gate_$name.txt" | cut -c1-200
done
