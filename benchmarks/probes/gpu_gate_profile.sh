#!/usr/bin/env bash
# One device call: where the GPU gate's own process spends its time (cProfile of
# `fuseval gate --op all --impl fast --profile gpu --device cuda`; the implementation runs in
# worker processes and is not in the profile). Prints the gate's timing lines and the
# fuseval functions with the largest cumulative time. Usage: bash benchmarks/probes/gpu_gate_profile.sh
set -u
OUT=${OUT:-session_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src HYPOTHESIS_PROFILE=ci
t0=$(date +%s)
python3 -m cProfile -o "$OUT/gate.prof" -m fuseval.cli gate --op all --impl fast --profile gpu --device cuda \
    --out "$OUT/gate" > "$OUT/gate.txt" 2> "$OUT/gate.err"
echo "profiled gate rc=$? wall $(( $(date +%s) - t0 )) s"
grep -E "^time |GATE" "$OUT/gate.txt" | cut -c1-250
python3 - "$OUT/gate.prof" > "$OUT/gate_profile.txt" <<'PY'
import pstats, sys
st = pstats.Stats(sys.argv[1])
st.sort_stats("cumulative")
rows = [(v[3], v[2], f"{k[0].split('/src/')[-1]}:{k[1]}({k[2]})", v[1]) for k, v in st.stats.items()
        if "/fuseval/" in k[0] or "torch/" in k[0] and k[2] in ("quantile", "kthvalue")]
rows.sort(reverse=True)
for cum, tot, name, n in rows[:70]:
    print(f"{cum:8.2f} {tot:8.2f} {n:7d} {name}")
PY
head -70 "$OUT/gate_profile.txt"
