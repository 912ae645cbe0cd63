#!/usr/bin/env bash
# The GPU verification of a change, from the repository root on the GPU machine:
#
#   bash benchmarks/gpu_suite.sh            (through the device tool: writes under $OUT)
#
# 1. the GPU tests (pytest -m gpu), 2. the full GPU gate of every operator's fast path
# (`fuseval gate --op all --impl fast --profile gpu --device cuda`) with its timing
# breakdown, 3. nvidia-smi before and after. Prints a short table last; exit status: the
# worst of the two.
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$here/benchmarks/out}/gpu_suite"
mkdir -p "$out"
export PYTHONPATH="$here/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=ci
py="${PYTHON:-python3}"
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > "$out/smi_before.csv" 2>&1
t0=$(date +%s)
(cd "$here" && "$py" -m pytest -q -m gpu tests -p no:cacheprovider) > "$out/pytest_gpu.txt" 2>&1
tests_rc=$?
t1=$(date +%s)
"$py" -m fuseval.cli gate --op all --impl fast --profile gpu --device cuda --out "$out/gate" > "$out/gate.txt" 2>&1
gate_rc=$?
t2=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > "$out/smi_after.csv" 2>&1
echo "gpu tests: rc=$tests_rc in $((t1 - t0)) s: $(tail -1 "$out/pytest_gpu.txt")"
grep -E "^time |GATE" "$out/gate.txt"
echo "gate: rc=$gate_rc in $((t2 - t1)) s"
exit $(( tests_rc > gate_rc ? tests_rc : gate_rc ))
