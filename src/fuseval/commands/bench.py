"""Benchmark implementations of an operator on the GPU.

For each benchmark case: the median latency of every implementation (CUDA events, warm-up,
many repetitions, L2 flushed before each), the floor max(FLOPs / matmul ceiling,
bytes / bandwidth ceiling) from ceilings measured in the same run, the fraction of the
floor reached, and the suite mean (mean of the case latencies). Prints a table; with --out
writes bench.json, bench.txt and bench.png there. --check also checks every timed
implementation on every case against the float64 oracle (fresh random inputs, NaN-poisoned
allocator) in the same run. The GPU's SM clock and power are sampled while timing
(nvidia-smi), and the report shows the clock of the ceilings and of each case.

Every implementation runs and is timed in its own confined worker (fuseval.runner.clock); fuseval's
process judges the numbers (fuseval.runner.timing): a timing below the floor, with a timed call's
outputs not the operator's, with work outside the timed interval or a patched timer is refused
and the command exits 19.

Without a CUDA device the command prints that it skipped and exits 0 (--require-gpu: exit 6);
--device cpu times on the CPU's perf_counter (for tests: no floor, no L2 flush).

Example:
  fuseval bench --op nvfp4_qkv_rope --impls fast,torch,torch_cached --cases all --check --out out/
"""
from __future__ import annotations

import json
import os
import sys

from . import add_common_arguments, as_number


def add_arguments(p) -> None:
    add_common_arguments(p, config_default="seed", impl=False)
    p.set_defaults(device="cuda", seed=None)
    p.add_argument("--impls", default=None,
                   help="comma-separated implementations to time (default: every entry of the "
                        "operator's implementations table except reference*)")
    p.add_argument("--out", metavar="DIR", help="write bench.json, bench.txt and bench.png into DIR")
    p.add_argument("--check", action="store_true",
                   help="also check each timed implementation on each case against the float64 oracle")
    p.add_argument("--no-hygiene", action="store_true",
                   help="with --check: skip the mutation/aliasing/caching rules for the fast path")
    p.add_argument("--no-flush", action="store_true", help="do not flush the L2 cache between repetitions")
    p.add_argument("--warmup-ms", type=as_number, default=30.0, help="warm-up per implementation and case")
    p.add_argument("--rep-ms", type=as_number, default=150.0, help="timed repetitions fill about this long")
    p.add_argument("--min-reps", type=as_number, default=10)
    p.add_argument("--max-reps", type=as_number, default=500)
    p.add_argument("--no-plot", action="store_true", help="do not write bench.png")
    p.add_argument("--no-clocks", action="store_true",
                   help="do not sample the GPU's SM clock and power (nvidia-smi) while timing")
    p.add_argument("--sustained-s", type=as_number, default=4.0, metavar="S",
                   help="also measure the matmul ceiling of the operator's dtype sustained for S seconds "
                        "(its last half, at whatever clock the power cap leaves) and report the floor at "
                        "that rate next to the burst floor; 0 turns it off (default 4)")
    p.add_argument("--no-parts", action="store_true",
                   help="do not time the fast path's parts apart (where the operator declares them)")
    p.add_argument("--require-gpu", action="store_true",
                   help="exit with code 6 instead of skipping when there is no CUDA device")


def run(args) -> int:
    from ..check import draw_seed
    from ..bench import BenchSkipped, print_bench_report, run_request, write_outputs
    from ..bench.request import BenchRequest
    from ..errors import EXIT_NO_DEVICE, EXIT_OK, exit_code_for
    from . import writable_folder

    impls = [s.strip() for s in args.impls.split(",") if s.strip()] if args.impls else None
    # every option checked, once, before any work (the configuration and cases as the operator loads)
    request = BenchRequest(args.op, impls, cases=args.cases, config=args.config, device=args.device,
                           seed=draw_seed() if args.seed is None else args.seed, mode=args.mode,
                           check=args.check, hygiene=not args.no_hygiene, flush=not args.no_flush,
                           warmup_ms=args.warmup_ms, rep_ms=args.rep_ms, min_reps=args.min_reps,
                           max_reps=args.max_reps, monitor_clocks=not args.no_clocks,
                           sustained_s=args.sustained_s, parts=not args.no_parts,
                           progress=lambda msg: print(msg, file=sys.stderr, flush=True),
                           cli=True).validated()
    writable_folder(args.out, "--out")
    try:
        report = run_request(request)
    except BenchSkipped as exc:
        print(f"fuseval bench: skipped: {exc}", file=sys.stderr)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "bench.json"), "w") as f:
                json.dump({"op": args.op, "skipped": str(exc)}, f, indent=1)
        return EXIT_NO_DEVICE if args.require_gpu else EXIT_OK
    print_bench_report(report)
    if args.out:
        for path in write_outputs(report, args.out, plot=not args.no_plot):
            print(f"wrote {path}", file=sys.stderr)
    refused = sorted({impl for c in report.cases for impl in c.refused})
    if refused:
        from ..errors import EXIT_TIMING_REFUSED
        print(f"fuseval bench: timing refused for {', '.join(refused)} (see the lines above)", file=sys.stderr)
        return EXIT_TIMING_REFUSED
    if args.check:
        # the verdict is the fast path's when it was timed (a baseline failing the
        # tolerance is a finding about the baseline), else every checked implementation's
        judged = [report.fast] if report.fast else report.impls
        violations = [v for c in report.cases for name, r in c.check.items()
                      if name in judged and not r["passed"] for v in (r["violations"] or ["tolerance"])]
        return exit_code_for(violations)
    return EXIT_OK
