#!/usr/bin/env bash
# One device call: the GPU gate of both fast paths, first with an empty Triton cache, then
# again on that cache, once per RUN given as NAME:FLAGS (default: the warm-up comparison,
# "cold: warm: warm_no_warmup:--no-warmup"; FLAGS may hold several options, joined by
# '+'). Terminal output under $OUT/gate_NAME.txt, the reports under /tmp.
# Usage: bash benchmarks/probes/gpu_gate_warmup.sh [RUN...]
set -u
OUT=${OUT:-session_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src
export TRITON_CACHE_DIR=$(mktemp -d)
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(cold: warm: warm_no_warmup:--no-warmup)
for run in "${runs[@]}"; do
    name=${run%%:*}; flags=${run#*:}; flags=${flags//+/ }
    t0=$(date +%s)
    python3 -m fuseval.cli gate --op all --impl fast --profile gpu --device cuda $flags --out "/tmp/gate_$name" \
        > "$OUT/gate_$name.txt" 2>&1
    echo "$name ($flags) rc=$? wall $(( $(date +%s) - t0 )) s: $(grep GATE "$OUT/gate_$name.txt")"
    grep -E "^time |warm-up" "$OUT/gate_$name.txt" | cut -c1-200
done
