#!/usr/bin/env bash
# Benchmark (and check) one operator on the GPU machine:
#
#   bash benchmarks/run_gpu.sh OP [more `fuseval bench` options]
#   RECORD=1 bash benchmarks/run_gpu.sh OP [...]     # and make it the operator's official run
#
# e.g. through the device tool:  bash benchmarks/run_gpu.sh nvfp4_qkv_rope
# Runs `fuseval bench --op OP --cases all --check --out DIR` (options given later win) from
# this checkout's src/ (fuseval need not be installed) with $PYTHON (default python3).
# Writes bench.json, bench.txt, bench.png and bench.log to DIR = $OUT/OP (the device tool's
# output folder) or benchmarks/out/OP. bench.log's first line is
# `# run_gpu.sh <UTC start time>: <this command>`, which the record step reads.
#
# RECORD=1: after a successful bench (exit 0), `benchmarks/results_index.py record DIR` copies
# bench.json (with a `record` entry: date, command, device) and bench.txt to
# $RESULTS/<device>-<date>-<op>/ (RESULTS default: benchmarks/results), removes the operator's
# previous official run there (history is in git) and rewrites the index's table
# ($RESULTS/README.md). Where the checkout does not come back (the device tool), run the same
# step here on the fetched folder: `python3 benchmarks/results_index.py record FETCHED/OP`.
#
# Exit status: that of `fuseval bench` (without a GPU it skips and exits 0, or 6 with
# --require-gpu); with RECORD=1 and a bench that exited 0, that of the record step (1 when it
# refuses, e.g. a skipped bench).
set -uo pipefail
op="${1:?usage: [RECORD=1] benchmarks/run_gpu.sh OP [fuseval bench options]}"
shift
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT:-$root/benchmarks/out}/${op}"
mkdir -p "$out"
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
command="bash benchmarks/run_gpu.sh $(printf '%q ' "$op" "$@")"
printf '# run_gpu.sh %s: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "${command% }" > "$out/bench.log"
"${PYTHON:-python3}" -m fuseval.cli bench --op "$op" --cases all --check --out "$out" "$@" 2>&1 \
    | tee -a "$out/bench.log"
status="${PIPESTATUS[0]}"
if [ "${RECORD:-0}" = 1 ] && [ "$status" = 0 ]; then
    "${PYTHON:-python3}" "$root/benchmarks/results_index.py" --results "${RESULTS:-$root/benchmarks/results}" \
        record "$out"
    status=$?
fi
exit "$status"
