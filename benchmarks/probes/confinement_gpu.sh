#!/usr/bin/env bash
# The confined worker on a GPU machine (issue 30): what the machine offers, hostile
# implementations on CUDA, and the per-case cost of the confinement against the tree before
# it (old-src/, carried: `git archive cd703ae src`), at seed size.
#   bash benchmarks/probes/confinement_gpu.sh            (writes $OUT/confinement-*.txt)
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1
log="$OUT/confinement-log.txt"
{
  uname -r; ldconfig -p | grep -c seccomp
  python3 -c "from fuseval.runner.isolation import confinement; print('probe:', confinement().describe())"
} 2>&1 | tee "$log"

# hostile implementations on CUDA (written to a folder of their own)
H=/tmp/hostile; mkdir -p $H
cat > $H/common.py <<'EOF'
import torch
from fuseval.operators.nvfp4_qkv_rope.reference import torch_eager
def cuda_eager(*a):
    return torch_eager(*a)
EOF
cat > $H/g_mutate.py <<'EOF'
from common import cuda_eager
def impl(*a):
    out = cuda_eager(*a)
    a[0].mul_(0.5)
    return out
EOF
cat > $H/g_scribble.py <<'EOF'
from common import cuda_eager
def impl(*a):
    saved = a[0].clone(); a[0].mul_(0.5); out = cuda_eager(*a); a[0].copy_(saved)
    return tuple(o * 2 for o in out)
EOF
cat > $H/g_child.py <<'EOF'
import os, time
from common import cuda_eager
def impl(*a):
    if os.fork() == 0:
        time.sleep(60); os._exit(0)
    return cuda_eager(*a)
EOF
cat > $H/g_signal.py <<'EOF'
import os, signal, ctypes
from common import cuda_eager
def impl(*a):
    for t in (os.getppid(), -1):
        try: os.kill(t, signal.SIGSTOP); print("SENT", t)
        except OSError as e: print("denied", t, e)
    print("ptrace", ctypes.CDLL(None, use_errno=True).ptrace(16, os.getppid(), 0, 0))
    return tuple(o * 2 for o in cuda_eager(*a))
EOF
cat > $H/g_spin.py <<'EOF'
import threading, time
from common import cuda_eager
def spin():
    t = time.time()
    while time.time() - t < 30: pass
def impl(*a):
    threading.Thread(target=spin, daemon=True).start()
    return cuda_eager(*a)
EOF
cat > $H/g_good.py <<'EOF'
from common import cuda_eager
def impl(*a):
    return cuda_eager(*a)
EOF
for h in g_good g_mutate g_scribble g_child g_signal g_spin; do
  (cd $H && PYTHONPATH=$PYTHONPATH:$H timeout 120 python3 -m fuseval.cli check --op nvfp4_qkv_rope --impl $h:impl \
     --cases 0,1 --device cuda --no-predict --timeout 60 > "$OUT/confinement-$h.txt" 2>&1; echo "$h rc=$?") | tee -a "$log"
  grep -E "^case|passed|worker" "$OUT/confinement-$h.txt" | head -6 | tee -a "$log"
done

# the cost at seed size: the same check, new tree and old tree, with and without hygiene
time_check() {  # tree op impl cases extra...
  local tree=$1 op=$2 impl=$3 cases=$4; shift 4
  local t0=$(date +%s.%N)
  PYTHONPATH=$PWD/$tree:/tmp/site python3 -m fuseval.cli check --op $op --impl $impl --config seed --cases $cases \
    --device cuda --seed 7 --no-predict "$@" > "$OUT/confinement-time.txt" 2>&1
  local rc=$?
  local t1=$(date +%s.%N)
  local line=$(grep "^time:" "$OUT/confinement-time.txt" | head -1)
  echo "$tree $op $impl cases=$cases $* rc=$rc wall=$(python3 -c "print(round($t1-$t0,2))") | $line"
}
# OLD=1 also times the tree before the confinement (old-src/, carried)
trees="src"; [ "${OLD:-0}" = 1 ] && trees="old-src src"
{
  for args in "nvfp4_qkv_rope fast 0,9,15" "qwen2vl_decoder_layer fast 0,11,15"; do
    set -- $args
    echo "cold (fills each tree's Triton cache)"
    for t in $trees; do time_check $t $1 $2 $3; done
    echo "warm"
    for t in $trees; do time_check $t $1 $2 $3; time_check $t $1 $2 $3; time_check $t $1 $2 $3 --no-hygiene; done
    for t in $trees; do time_check $t $1 $2 $3 --in-process; done
  done
} 2>&1 | tee -a "$log"
