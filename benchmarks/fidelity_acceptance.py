"""Three verdicts per benchmark case, on one draw of its inputs (GPU, full size):

1. the implementation against the float64 oracle, fuseval's rules (with hygiene);
2. the predicted benchmark verdict: the implementation against ``sol_reference`` (the
   benchmark's reference in its own precision) under the benchmark's rules;
3. ``sol_reference`` itself against the float64 oracle (how much of the tolerance the
   benchmark's own reference spends).

    PYTHONPATH=src python3 benchmarks/fidelity_acceptance.py [--impl fast] [--ops a,b] [--cases all]

Writes fidelity.json and fidelity.txt into $OUT (or benchmarks/out); prints the table last.
Exit status 0 only when every verdict passes."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from fuseval.check import SOL_REFERENCE, compare, run_case
from fuseval.definitions import list_operators
from fuseval.inputs import generate_inputs
from fuseval.ops import get


def _ratios(metrics) -> str:
    return " ".join(f"{m.name.split('_')[0]}={m.matched_ratio:.4%}" for m in metrics)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", default="fast")
    p.add_argument("--ops", default="all")
    p.add_argument("--cases", default="all")
    p.add_argument("--config", default="seed")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    out = os.environ.get("OUT") or os.path.join("benchmarks", "out")
    os.makedirs(out, exist_ok=True)
    device = torch.device(args.device)
    ops = list_operators() if args.ops == "all" else args.ops.split(",")
    rows, lines, ok = [], [], True
    for op in ops:
        operator = get(op, args.config)
        defn = operator.definition
        if SOL_REFERENCE not in defn.implementations:
            print(f"{op}: no {SOL_REFERENCE}, skipped", file=sys.stderr)
            continue
        impl, sol, oracle = (operator.implementation(n) for n in (args.impl, SOL_REFERENCE, "reference"))
        for case in defn.cases(args.cases):
            t0 = time.perf_counter()
            inputs = generate_inputs(defn, case.axes, seed=args.seed + case.index, device=device)
            res = run_case(defn, impl, case, seed=args.seed, device=device, inputs=inputs, predictor=sol)
            refs, sols = oracle(*inputs), sol(*inputs)
            sol_vs_oracle = [compare(s, r, case.tolerance, spec.name)
                             for s, r, spec in zip(sols, refs, defn.outputs)]
            del refs, sols, inputs
            torch.cuda.empty_cache() if device.type == "cuda" else None
            pred = res.predicted
            row = {"op": op, "case": case.index, "axes": dict(case.axes), "atol": case.tolerance.atol,
                   "impl_vs_oracle": {"passed": res.passed, "violations": res.violations,
                                      "matched": {m.name: m.matched_ratio for m in res.outputs},
                                      "max_abs": {m.name: m.max_abs for m in res.outputs}},
                   "predicted_benchmark": {"passed": pred.passed, "violations": pred.violations,
                                           "matched": {m.name: m.matched_ratio for m in pred.outputs}},
                   "sol_reference_vs_oracle": {"passed": all(m.passed for m in sol_vs_oracle),
                                               "matched": {m.name: m.matched_ratio for m in sol_vs_oracle},
                                               "max_abs": {m.name: m.max_abs for m in sol_vs_oracle}},
                   "seconds": time.perf_counter() - t0}
            rows.append(row)
            ok &= res.passed and pred.passed and row["sol_reference_vs_oracle"]["passed"]
            line = (f"{op[:8]} {case.index:2d} {case.label:44s} | {args.impl}: "
                    f"{'pass' if res.passed else 'FAIL ' + ','.join(res.violations)} {_ratios(res.outputs)} "
                    f"max {max(m.max_abs for m in res.outputs):.2e} | bench: "
                    f"{'pass' if pred.passed else 'FAIL'} {_ratios(pred.outputs)} | sol_ref: "
                    f"{_ratios(sol_vs_oracle)}")
            lines.append(line)
            print(line, file=sys.stderr, flush=True)
    with open(os.path.join(out, "fidelity.json"), "w") as f:
        json.dump({"impl": args.impl, "config": args.config, "device": str(device),
                   "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                   "torch": torch.__version__, "rows": rows}, f, indent=1, default=str)
    summary = []
    for op in ops:
        mine = [r for r in rows if r["op"] == op]
        if not mine:
            continue
        summary.append(f"{op}: {args.impl} vs oracle {sum(r['impl_vs_oracle']['passed'] for r in mine)}/{len(mine)}, "
                       f"predicted benchmark {sum(r['predicted_benchmark']['passed'] for r in mine)}/{len(mine)}, "
                       f"sol_reference vs oracle {sum(r['sol_reference_vs_oracle']['passed'] for r in mine)}/{len(mine)}")
    with open(os.path.join(out, "fidelity.txt"), "w") as f:
        f.write("\n".join(lines + [""] + summary) + "\n")
    print("\n".join(lines + [""] + summary))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
