"""Which Landlock right CUDA needs in a worker: CUDA is initialised in a fresh process under
variants of fuseval's ruleset (every right on chosen folders, scopes on or off), then the
failing system calls of the confined variant are listed with strace where it exists.

    python3 benchmarks/probes/landlock_cuda.py
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

CHILD = r'''
import json, os, sys
v = json.loads(sys.argv[1])
import landlockpy as ll
abi = ll.abi_version()
every = ll.fs_for_abi(abi)
read = ll.AccessFS.READ_FILE | ll.AccessFS.READ_DIR | ll.AccessFS.EXECUTE
scoped = ll.Scope(0)
if v.get("signal"): scoped |= ll.Scope.SIGNAL
if v.get("abstract"): scoped |= ll.Scope.ABSTRACT_UNIX_SOCKET
kw = {"scoped": scoped} if v.get("signal") or v.get("abstract") else {}
if v.get("fuseval"):
    from fuseval.runner import confine
    extra = []
    for path, right in v.get("extra", []):
        path = path.replace("/proc/self", f"/proc/{os.getpid()}")
        extra.append((path, every if right == "all" else getattr(ll.AccessFS, right)))
    # the extra rules join fuseval's ruleset just before it is enforced
    enforce = ll.Ruleset.restrict
    def restrict(self):
        for path, rights in extra:
            self.allow_path(path, rights)
        return enforce(self)
    ll.Ruleset.restrict = restrict
    confine._landlock(confine.Plan(v["scratch"], v["cache"]))
else:
    with ll.Ruleset(**kw) as r:
        r.allow_path("/", read)
        for d in v.get("full", []):
            if os.path.exists(d):
                r.allow_path(d, every)
        r.restrict()
import torch
try:
    x = torch.ones(4, device="cuda")
    print("OK", float((x + 1).sum()))
except Exception as e:
    print("FAIL", type(e).__name__, str(e)[:160])
'''


def run(variant, strace=None):
    cmd = [sys.executable, "-c", CHILD, json.dumps(variant)]
    if strace:
        cmd = [strace, "-f", "-Z", "-qq", "-e", "trace=all", "-s", "80"] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    last = (r.stdout.strip().splitlines() or [""])[-1]
    return last, r.stderr


def main():
    scratch, cache = tempfile.mkdtemp(), tempfile.mkdtemp()
    top = sorted("/" + d for d in os.listdir("/") if os.path.isdir("/" + d) and not os.path.islink("/" + d))
    print("top-level folders:", top)
    base = {"fuseval": True, "scratch": scratch, "cache": cache}
    rights = ["WRITE_FILE", "TRUNCATE", "IOCTL_DEV"]      # the rights an open file can need
    variants = {"fuseval ruleset": base}
    for path in ("/proc", "/proc/self", "/proc/self/task", "/proc/driver", "/proc/sys"):
        variants[f"fuseval + every right on {path}"] = {**base, "extra": [[path, "all"]]}
    for r in rights:
        variants[f"fuseval + {r} on /proc"] = {**base, "extra": [["/proc", r]]}
    for r in rights:
        variants[f"fuseval + {r} on /proc/self"] = {**base, "extra": [["/proc/self", r]]}
    for name, v in variants.items():
        print(f"{name:50s} -> {run(v)[0][:90]}", flush=True)
    tracer = shutil.which("strace")
    if tracer:
        out, err = run({"fuseval": True, "scratch": scratch, "cache": cache}, strace=tracer)
        print("strace of the fuseval ruleset:", out)
        lines = [ln for ln in err.splitlines() if "EACCES" in ln or "EPERM" in ln or "EXDEV" in ln]
        print("\n".join(lines[:60]))
    else:
        print("no strace on this machine")


if __name__ == "__main__":
    main()
