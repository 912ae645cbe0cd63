"""Three verdicts per benchmark case, on one draw of its inputs (GPU, full size by default):

1. the implementation against the float64 oracle, fuseval's rules (with hygiene);
2. the predicted benchmark verdict: the implementation against ``sol_reference`` (the
   benchmark's reference in its own precision) under the benchmark's rules;
3. ``sol_reference`` itself against the float64 oracle (how much of the tolerance the
   benchmark's own reference spends).

    PYTHONPATH=src python3 benchmarks/fidelity_acceptance.py [--impl fast] [--ops all] [--cases all]
        [--config seed] [--device cuda] [--seed 0] [--out DIR]

Operators without a ``sol_reference`` are skipped (said on stderr). The implementation
runs in this process (trusted: this is an acceptance run, not a check of untrusted code).
Writes fidelity.json and fidelity.txt into --out (default $OUT, else benchmarks/out) and
prints the table last. Exit status 0 only when every verdict passes, 1 otherwise, 2 for
bad arguments. CPU smoke test: ``--impl torch --config tiny --cases 0 --device cpu``."""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from fuseval import operators
from fuseval.check import compare, run_case
from fuseval.oracles import SOL_REFERENCE
from fuseval.inputs import generate_inputs
from fuseval.jsonio import dumps
from fuseval.operators.implementations import get
from fuseval.terminal import fmt_number


def _ratios(metrics) -> str:
    return " ".join(f"{m.name.split('_')[0]}={m.matched_ratio:.4%}" for m in metrics)


def _verdict(passed: bool, violations=()) -> str:
    return "pass" if passed else "FAIL " + ",".join(violations)


def verdicts_of_case(operator, impl_name: str, impl, case, seed: int, device: torch.device) -> tuple[dict, str]:
    """The three verdicts of one case: its JSON row and its table line."""
    defn = operator.definition
    sol, oracle = operator.implementation(SOL_REFERENCE), operator.implementation("reference")
    t0 = time.perf_counter()
    inputs = generate_inputs(defn, case.axes, seed=seed + case.index, device=device)
    res = run_case(defn, impl, case, seed=seed, device=device, inputs=inputs, predictor=sol)
    tol = case.tolerance or defn.tolerance
    refs, sols = oracle(*inputs), sol(*inputs)
    sol_vs_oracle = [compare(s, r, tol, spec.name) for s, r, spec in zip(sols, refs, defn.outputs)]
    del refs, sols, inputs
    if device.type == "cuda":
        torch.cuda.empty_cache()
    pred = res.predicted
    row = {"op": defn.name, "case": case.index, "axes": dict(case.axes), "atol": tol.atol,
           "impl_vs_oracle": {"passed": res.passed, "violations": res.violations,
                              "matched": {m.name: m.matched_ratio for m in res.outputs},
                              "max_abs": {m.name: m.max_abs for m in res.outputs}},
           "predicted_benchmark": {"passed": pred.passed, "violations": pred.violations,
                                   "matched": {m.name: m.matched_ratio for m in pred.outputs}},
           "sol_reference_vs_oracle": {"passed": all(m.passed for m in sol_vs_oracle),
                                       "matched": {m.name: m.matched_ratio for m in sol_vs_oracle},
                                       "max_abs": {m.name: m.max_abs for m in sol_vs_oracle}},
           "seconds": time.perf_counter() - t0}
    worst = max((m.max_abs for m in res.outputs), default=None)
    line = (f"{defn.name} {case.index:2d} {case.label:44s} | {impl_name}: "
            f"{_verdict(res.passed, res.violations)} {_ratios(res.outputs)} max {fmt_number(worst, 2)} | "
            f"bench: {_verdict(pred.passed, pred.violations)} {_ratios(pred.outputs)} | "
            f"sol_ref: {_verdict(row['sol_reference_vs_oracle']['passed'])} {_ratios(sol_vs_oracle)}")
    return row, line


def summary(rows: list[dict], ops: list[str], impl_name: str) -> list[str]:
    lines = []
    for op in ops:
        mine = [r for r in rows if r["op"] == op]
        if mine:
            count = lambda key: f"{sum(r[key]['passed'] for r in mine)}/{len(mine)}"
            lines.append(f"{op}: {impl_name} vs oracle {count('impl_vs_oracle')}, predicted benchmark "
                         f"{count('predicted_benchmark')}, sol_reference vs oracle {count('sol_reference_vs_oracle')}")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", default="fast", help="implementation: a name of the operator's table or module:function")
    p.add_argument("--ops", default="all", help="comma-separated operator names, or all (default)")
    p.add_argument("--cases", default="all", help="case selection, e.g. 0,3,5-7 or all (default)")
    p.add_argument("--config", default="seed", help="seed (full size, default) or a scaled-down config")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0, help="input seed; case i draws with seed + i")
    p.add_argument("--out", default=None, help="output folder (default $OUT, else benchmarks/out)")
    args = p.parse_args(argv)
    known = operators.names()
    ops = known if args.ops == "all" else [o.strip() for o in args.ops.split(",") if o.strip()]
    if not ops or any(o not in known for o in ops):
        p.error(f"--ops: expected operator names from {', '.join(known)} (or all), got {args.ops!r}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device: {args.device} was asked for, but torch {torch.__version__} sees no CUDA device")
    out = args.out or os.environ.get("OUT") or os.path.join("benchmarks", "out")
    os.makedirs(out, exist_ok=True)
    rows, lines = [], []
    for op in ops:
        operator = get(op, args.config)
        if SOL_REFERENCE not in operator.definition.implementations:
            print(f"{op}: no {SOL_REFERENCE}, skipped", file=sys.stderr)
            continue
        impl = operator.implementation(args.impl)
        for case in operator.definition.cases(args.cases):
            row, line = verdicts_of_case(operator, args.impl, impl, case, args.seed, device)
            rows.append(row)
            lines.append(line)
            print(line, file=sys.stderr, flush=True)
    ok = bool(rows) and all(r[k]["passed"] for r in rows
                            for k in ("impl_vs_oracle", "predicted_benchmark", "sol_reference_vs_oracle"))
    with open(os.path.join(out, "fidelity.json"), "w") as f:
        f.write(dumps({"impl": args.impl, "config": args.config, "device": str(device),
                       "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                       "torch": torch.__version__, "seed": args.seed, "rows": rows}) + "\n")
    text = "\n".join(lines + [""] + summary(rows, ops, args.impl))
    with open(os.path.join(out, "fidelity.txt"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
