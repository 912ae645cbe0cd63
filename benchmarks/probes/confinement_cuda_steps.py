"""Which confinement step stops CUDA in a worker: each step alone, then all, in a fresh
process that initialises CUDA and opens a CUDA IPC handle of the parent's.

    python3 benchmarks/probes/confinement_cuda_steps.py
"""
import glob
import os
import subprocess
import sys
import tempfile

CHILD = r'''
import os, sys
steps = sys.argv[1].split(",") if sys.argv[1] else []
from fuseval.runner import confine
plan = confine.Plan(sys.argv[2], sys.argv[3])
if "session" in steps: os.setsid()
if "environment" in steps: confine._environment(plan)
if "capabilities" in steps: confine._drop_capabilities()
if steps: confine._no_new_privs()
if "seccomp" in steps:
    if os.environ.get("REFUSED") is not None:
        confine._REFUSED = tuple(x for x in os.environ["REFUSED"].split(",") if x)
    if os.environ.get("ARGRULES") == "0":
        confine._TIOCSTI = confine._TIOCLINUX = 0x7fff0000 - 1
    m, why = confine._seccomp_module(); confine._seccomp(m)
if "landlock" in steps: confine._landlock(plan)
if "landlock_dev" in steps:
    import landlockpy as ll
    abi = ll.abi_version()
    with ll.Ruleset(scoped=ll.Scope.ABSTRACT_UNIX_SOCKET | ll.Scope.SIGNAL) as r:
        r.allow_path("/", ll.AccessFS.READ_FILE | ll.AccessFS.READ_DIR | ll.AccessFS.EXECUTE)
        for d in (plan.scratch, plan.cache, "/dev"):
            r.allow_path(d, ll.fs_for_abi(abi))
        r.restrict()
import torch
try:
    torch.cuda.init()
    x = torch.ones(4, device="cuda")
    print("OK", float((x + 1).sum()))
except Exception as e:
    print("FAIL", type(e).__name__, str(e)[:200])
'''


def run(steps, scratch, cache, env=None):
    r = subprocess.run([sys.executable, "-c", CHILD, steps, scratch, cache], capture_output=True, text=True,
                       timeout=120, env={**os.environ, **(env or {})})
    return ((r.stdout.strip().splitlines() or [""])[-1] + " " + " | ".join(r.stderr.strip().splitlines()[-2:]))


def bisect_seccomp(scratch, cache):
    """The refused calls CUDA needs, found by halving the list."""
    from fuseval.runner import confine
    names = list(confine._REFUSED)
    if run("seccomp", scratch, cache, {"REFUSED": ""}).startswith("FAIL"):
        print("seccomp fails with no refused call: an argument rule (signals, ioctl, prctl, clone, socket)")
        return
    culprits = []
    stack = [names]
    while stack:
        group = stack.pop()
        if not run("seccomp", scratch, cache, {"REFUSED": ",".join(group)}).startswith("FAIL"):
            continue
        if len(group) == 1:
            culprits.append(group[0])
            continue
        stack += [group[:len(group) // 2], group[len(group) // 2:]]
    print("refused calls CUDA needs:", culprits, flush=True)


def main():
    scratch, cache = tempfile.mkdtemp(), tempfile.mkdtemp()
    print("devices before CUDA in the parent:", sorted(glob.glob("/dev/nvidia*")))
    import torch
    torch.ones(1, device="cuda")
    print("devices after:", sorted(glob.glob("/dev/nvidia*")), sorted(glob.glob("/dev/nvidia-caps/*")))
    for steps in ("", "session", "environment", "capabilities", "seccomp", "landlock", "landlock_dev",
                  "session,environment,capabilities,seccomp", "session,environment,capabilities,seccomp,landlock"):
        tail = run(steps, scratch, cache)
        print(f"{steps or 'nothing':55s} -> {tail[:300]}", flush=True)
        if steps == "seccomp" and tail.startswith("FAIL"):
            bisect_seccomp(scratch, cache)


if __name__ == "__main__":
    main()
