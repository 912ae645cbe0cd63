"""Why does op A's layer take longer end to end than its kernels alone? (GPU only)

For a few cases this times, with the benchmark's own timer (``fuseval.bench.time_call``,
L2 flushed, CUDA events, median):

  e2e        ``forward(*inputs)``, as ``fuseval bench`` times it
  in situ    the same call with an event recorded after every launcher call: each kernel's
             share of the end-to-end time, and the gap between the start event and the
             first kernel (host work before the first launch)
  alone      each launcher call of that call replayed on its own (same arguments)
  host       wall time of the Python call without waiting for the GPU

    PYTHONPATH=src python3 benchmarks/probes/qwen2vl_gap.py [--cases 4,15,0]

Writes $OUT/qwen2vl_gap.json (or ./out) and prints a short table last.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from fuseval import ops
from fuseval.bench import time_call
from fuseval.inputs import generate_inputs
import fuseval.operators.qwen2vl_decoder_layer.fast as F

OUT = os.environ.get("OUT") or "out"
os.environ.setdefault("FUSEVAL_NO_GRAPHS", "1")     # time the launches themselves, not a graph replay


LAUNCHERS = ("launch_norm", "launch_qkv", "launch_attention", "launch_residual_gemm", "launch_gate_up")


class Recorder:
    """Wraps the layer's public launchers (``fast.launch_*``, each one kernel, split-K
    GEMMs two): records (name, launcher, args, kwargs) and, when ``events`` is a list, an
    event after each launcher call."""

    def __init__(self):
        self.launches: list | None = None
        self.events: list | None = None
        for name in LAUNCHERS:
            setattr(F, name, self._wrap(name, getattr(F, name)))

    def _wrap(self, name, launcher):
        def recorded(*args, **kwargs):
            out = launcher(*args, **kwargs)
            if self.launches is not None:
                self.launches.append((name, launcher, args, kwargs))
            if self.events is not None:
                ev = torch.cuda.Event(enable_timing=True)
                ev.record()
                self.events.append((name, ev))
            return out
        return recorded


class _Flusher:
    """Overwrites a buffer larger than the L2 cache (the H200's is 60 MB) before a timed call."""

    def __init__(self, device):
        self.buf = torch.empty(64 * 2 ** 20, dtype=torch.int32, device=device)

    def __call__(self):
        self.buf.zero_()


def in_situ(fn, rec: Recorder, reps: int = 20):
    flusher = _Flusher(torch.device("cuda"))
    runs = []
    for _ in range(3):        # warm-up
        fn()
    torch.cuda.synchronize()
    for _ in range(reps):
        flusher()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        rec.events = []
        start.record()
        fn()
        end.record()
        runs.append((start, rec.events, end))
        rec.events = None
    torch.cuda.synchronize()
    per = {}
    totals = []
    for start, evs, end in runs:
        prev = start
        names = []
        for i, (name, ev) in enumerate(evs):
            key = f"{i}:{name}"
            per.setdefault(key, []).append(prev.elapsed_time(ev))
            names.append(key)
            prev = ev
        per.setdefault("tail", []).append(prev.elapsed_time(end))
        totals.append(start.elapsed_time(end))
    return {k: statistics.median(v) for k, v in per.items()}, statistics.median(totals)


def host_profile(idx: int) -> None:
    import cProfile
    import pstats
    defn = ops.get("qwen2vl_decoder_layer", "seed").definition
    case = defn.cases([idx])[0]
    inputs = generate_inputs(defn, case.axes, seed=1000 + idx, mode="benchmark", device="cuda")
    for _ in range(5):
        F.forward(*inputs)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(200):
        F.forward(*inputs)
    prof.disable()
    print(f"host: {(time.perf_counter() - t0) / 200 * 1e3:.3f} ms per call (profiled)")
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="4,15,0,8")
    ap.add_argument("--host-profile", type=int, default=-1, metavar="CASE",
                    help="only profile the host side (cProfile) of 200 calls of this case")
    args = ap.parse_args()
    if args.host_profile >= 0:
        host_profile(args.host_profile)
        return
    os.makedirs(OUT, exist_ok=True)
    defn = ops.get("qwen2vl_decoder_layer", "seed").definition
    rec = Recorder()
    results = []
    for idx in [int(c) for c in args.cases.split(",")]:
        case = defn.cases([idx])[0]
        inputs = generate_inputs(defn, case.axes, seed=1000 + idx, mode="benchmark", device="cuda")
        fn = lambda: F.forward(*inputs)
        e2e = [time_call(fn).median_ms for _ in range(2)]
        e2e_noflush = time_call(fn, flush=False).median_ms
        situ, situ_total = in_situ(fn, rec)
        # host time of one call, GPU not awaited
        torch.cuda.synchronize()
        host = []
        for _ in range(10):
            t0 = time.perf_counter()
            fn()
            host.append((time.perf_counter() - t0) * 1e3)
            torch.cuda.synchronize()
        # each launch alone
        rec.launches = []
        fn()
        launches, rec.launches = rec.launches, None
        torch.cuda.synchronize()
        alone = {}
        for i, (name, launcher, a, kw) in enumerate(launches):
            alone[f"{i}:{name}"] = time_call(lambda: launcher(*a, **kw)).median_ms
        row = dict(case=idx, axes=dict(case.axes), e2e=e2e, e2e_noflush=e2e_noflush, in_situ=situ,
                   in_situ_total=situ_total, host_ms=statistics.median(host), alone=alone,
                   alone_sum=sum(alone.values()))
        results.append(row)
        print(json.dumps(row), flush=True)
        del inputs, launches
        torch.cuda.empty_cache()
    with open(os.path.join(OUT, "qwen2vl_gap.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("\ncase | e2e (2 runs) | no flush | in-situ total | alone sum | host | per kernel in situ / alone")
    for r in results:
        ks = " ".join(f"{k.split(':')[1][:10]}={r['in_situ'][k]:.3f}/{r['alone'].get(k, float('nan')):.3f}"
                      for k in r["in_situ"])
        print(f"{r['case']:2d} | {r['e2e'][0]:.3f} {r['e2e'][1]:.3f} | {r['e2e_noflush']:.3f} | "
              f"{r['in_situ_total']:.3f} | {r['alone_sum']:.3f} | {r['host_ms']:.3f} | {ks}")


if __name__ == "__main__":
    main()
