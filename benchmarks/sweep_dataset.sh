#!/usr/bin/env bash
# Sweep fuseval over SOL-ExecBench's problem folders on a GPU host: import, the benchmark
# reference's check and the gate (--profile ci by default, the acceptance criterion, on CUDA) per problem, one job per GPU.
#
#   benchmarks/sweep_dataset.sh DATA_DIR OUT_DIR [extra fuseval sweep options]
#
# DATA_DIR holds the problem folders (each with definition.json, workload.jsonl,
# reference.py), e.g. the problems/ folder of the dataset's GitHub mirror; it is read,
# never written. OUT_DIR gets sweep.md / sweep.json / sweep.csv and each step's output.
# Environment: PROFILE (ci), SMALLEST (1 workload per problem), TIMEOUT (900 s per
# problem), MEMORY_GB (host address space per step, default none), JOBS (one per GPU).
set -euo pipefail
if [[ $# -lt 2 ]]; then
    sed -n '2,12p' "$0"; exit 2
fi
data=$1; out=$2; shift 2
gpus=$(python -c 'import torch; print(torch.cuda.device_count())')
if [[ "$gpus" -lt 1 ]]; then
    echo "sweep_dataset.sh: no CUDA device; for a CPU sweep run fuseval sweep --device cpu" >&2; exit 6
fi
args=(--out "$out" --device cuda --profile "${PROFILE:-ci}" --smallest "${SMALLEST:-1}"
      --timeout "${TIMEOUT:-900}" --jobs "${JOBS:-$gpus}" --gpus "$gpus")
[[ -n "${MEMORY_GB:-}" ]] && args+=(--memory-gb "$MEMORY_GB")
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/device.txt" || true
git -C "$(dirname "$0")/.." rev-parse HEAD > "$out/commit.txt" 2>/dev/null || true
exec fuseval sweep "$data" "${args[@]}" "$@" 2> >(tee "$out/progress.txt" >&2)
