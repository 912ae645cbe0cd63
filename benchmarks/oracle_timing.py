"""How long do the float64 oracles take at full benchmark size? (issue 2's acceptance)

For every registered operator (or ``--ops``) and each selected case: the time to draw the
inputs on the device, the median time of the float64 oracle (``reference``) over
``--reps`` calls after one warm-up call, and a check of one implementation (``--impls``,
default ``torch``) against the oracle on the same inputs (in this process, without the
hygiene rules: a sanity check of the baseline, not a verdict on a fast path).

    PYTHONPATH=src python3 benchmarks/oracle_timing.py [--ops all] [--cases 0,15] [--reps 3]
        [--impls torch | --impls qwen2vl_decoder_layer=torch_tf32,nvfp4_qkv_rope=torch]
        [--config seed] [--device cuda] [--out DIR]

Writes oracle_timing.json into --out (default $OUT, else benchmarks/out) and prints the
table last. Exit status 0 when every checked implementation passed, 1 otherwise, 2 for
bad arguments. CPU smoke test: ``--device cpu --config tiny --cases 0 --reps 1``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from fuseval import operators
from fuseval.check import run_case
from fuseval.inputs import generate_inputs
from fuseval.jsonio import dumps
from fuseval.operators.implementations import get
from fuseval.terminal import fmt_number

DEFAULT_IMPL = "torch"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn, reps: int, device: torch.device) -> float:
    """Median wall time of ``fn()`` over ``reps`` calls, after one warm-up call."""
    fn()
    _sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def parse_impls(text: str, ops: list[str]) -> dict[str, str]:
    """``"torch"`` (every operator) or ``"op=impl,op=impl"`` (operators not named: torch)."""
    if "=" not in text:
        return {op: text for op in ops}
    chosen = {op: DEFAULT_IMPL for op in ops}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        op, sep, impl = pair.partition("=")
        if not sep or not impl:
            raise ValueError(f"--impls: expected 'op=impl' pairs or one implementation name, got {pair!r}")
        if op not in chosen:
            raise ValueError(f"--impls: operator {op!r} is not among the timed operators ({', '.join(ops)})")
        chosen[op] = impl
    return chosen


def time_case(operator, case, impl_name: str, reps: int, device: torch.device) -> dict:
    defn = operator.definition
    oracle = operator.implementation("reference")
    impl = operator.implementation(impl_name)
    t0 = time.perf_counter()
    inputs = generate_inputs(defn, case.axes, seed=case.index, device=device)
    _sync(device)
    gen_s = time.perf_counter() - t0
    oracle_s = median_seconds(lambda: oracle(*inputs), reps, device)
    res = run_case(defn, impl, case, seed=0, device=device, inputs=inputs, hygiene=False)
    del inputs
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return dict(op=defn.name, case=case.index, axes=case.label, gen_s=gen_s, oracle_f64_s=oracle_s,
                impl=impl_name, impl_passed=res.passed, violations=res.violations,
                max_abs={m.name: m.max_abs for m in res.outputs},
                matched={m.name: m.matched_ratio for m in res.outputs})


def table(rows: list[dict]) -> list[str]:
    lines = [f"{'op':24s} {'case':>4s} {'axes':44s} {'gen s':>9s} {'oracle f64 s':>12s}  impl check"]
    for r in rows:
        verdict = "pass" if r["impl_passed"] else "FAIL " + ",".join(r["violations"])
        errs = ", ".join(fmt_number(e, 2) for e in r["max_abs"].values())
        match = ", ".join(f"{m:.4%}" for m in r["matched"].values())
        lines.append(f"{r['op']:24s} {r['case']:4d} {r['axes']:44s} {fmt_number(r['gen_s'], 2, 'g'):>9s} "
                     f"{fmt_number(r['oracle_f64_s'], 3, 'g'):>12s}  {r['impl']}: {verdict} "
                     f"max_abs [{errs}] matched [{match}]")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default="all", help="comma-separated operator names, or all (default)")
    p.add_argument("--cases", default="0,15", help="case selection, e.g. 0,15 or 0-3 or all (default 0,15)")
    p.add_argument("--reps", type=int, default=3, help="timed oracle calls per case (default 3)")
    p.add_argument("--impls", default=DEFAULT_IMPL,
                   help="implementation checked: one name for every operator, or op=impl pairs (default torch)")
    p.add_argument("--config", default="seed", help="seed (full size, default) or a scaled-down config")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=None, help="output folder (default $OUT, else benchmarks/out)")
    args = p.parse_args(argv)
    known = operators.names()
    ops = known if args.ops == "all" else [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = [o for o in ops if o not in known]
    if unknown or not ops:
        p.error(f"--ops: expected operator names from {', '.join(known)} (or all), got {args.ops!r}")
    if args.reps < 1:
        p.error(f"--reps: expected a count >= 1, got {args.reps}")
    try:
        impls = parse_impls(args.impls, ops)
    except ValueError as exc:
        p.error(str(exc))
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device: {args.device} was asked for, but torch {torch.__version__} sees no CUDA device")
    rows = []
    for op in ops:
        operator = get(op, args.config)
        for case in operator.definition.cases(args.cases):
            rows.append(time_case(operator, case, impls[op], args.reps, device))
            print(table(rows[-1:])[1], file=sys.stderr, flush=True)
    out = args.out or os.environ.get("OUT") or os.path.join("benchmarks", "out")
    os.makedirs(out, exist_ok=True)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    with open(os.path.join(out, "oracle_timing.json"), "w") as f:
        f.write(dumps(dict(device=device_name, config=args.config, reps=args.reps, torch=torch.__version__,
                           rows=rows)) + "\n")
    print(f"device: {device_name}  torch {torch.__version__}  config {args.config}")
    print("\n".join(table(rows)))
    return 0 if all(r["impl_passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
