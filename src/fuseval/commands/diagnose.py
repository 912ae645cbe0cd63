"""Why one case fails: the anatomy of its error and the known mistake that explains it.

Runs the implementation on one case (in its worker process, as `fuseval check` does),
dissects the error of every output (where it lives along each axis, its structure, its
rounding level), ranks the operator's known mistakes (mutants; generic mistakes for an
imported problem) by agreement with the output, and calls the implementation again with
only the activations, only the weights, only the rope tables drawn anew to say which
inputs the error depends on. Prints the diagnosis in full and writes the error over each
axis as a PNG and an HTML page into --out."""
from __future__ import annotations

import os
import sys

from . import add_common_arguments, at_least, operator_definition, user_input, writable_file


def add_arguments(p) -> None:
    add_common_arguments(p)
    p.add_argument("--case", type=at_least(0, int), required=True, metavar="N", help="the case to diagnose (an index)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="folder for the plots (diagnosis.png, diagnosis.html; default: diagnosis-OP-caseN)")
    p.add_argument("--json", metavar="PATH", help="also write the diagnosis as JSON")
    p.add_argument("--no-plots", action="store_true", help="print only (no PNG / HTML)")


def run(args) -> int:
    from ..check import check
    from ..requests import CheckRequest
    from ..errors import EXIT_USAGE, FusevalError
    from ..jsonio import dumps
    from ..terminal import print_check_report

    defn = operator_definition(args.op, args.config)
    if args.case >= len(defn.seed_cases):
        raise FusevalError(f"--case: expected a case index of {args.op} in 0..{len(defn.seed_cases) - 1}, "
                           f"got {args.case}", EXIT_USAGE)
    if args.impl == "reference":
        raise FusevalError("--impl 'reference' is the float64 oracle itself: nothing to diagnose", EXIT_USAGE)
    writable_file(args.json, "--json")
    out_dir = args.out or f"diagnosis-{args.op}-case{args.case}"

    def progress(result, done, total):
        print(f"case {result.case}: {'ok' if result.passed else 'FAIL ' + ','.join(result.violations)}; diagnosed",
              file=sys.stderr, flush=True)
    with user_input("--impl"):
        report = check(CheckRequest(args.op, args.impl, config=args.config, cases=[args.case], device=args.device,
                                    seed=args.seed, mode=args.mode, hygiene=False, progress=progress, predict=False,
                                    isolate=False if args.in_process else None, timeout=args.timeout,
                                    diagnose="full", cli=True))
    print_check_report(report)
    case = report.cases[0]
    d = case.diagnosis
    if report.seed_drawn:
        print(f"the seed was drawn at random: {report.seed} (--seed {report.seed} diagnoses the same inputs)",
              file=sys.stderr)
    if d is None:
        print(f"case {case.case}: no outputs to diagnose ({', '.join(case.violations) or 'no violation'})")
        return 0 if case.passed else 1
    print()
    for line in d.full_lines():
        print(line)
    if not args.no_plots:
        from ..diagnosis.render import write_html, write_png
        os.makedirs(out_dir, exist_ok=True)
        png = write_png(d, os.path.join(out_dir, "diagnosis.png"))
        page = write_html(d, os.path.join(out_dir, "diagnosis.html"), png)
        print(f"plots: {png}, {page}")
    if args.json:
        with open(args.json, "w") as f:
            f.write(dumps(d.to_dict(), indent=1) + "\n")
    return 0 if case.passed else 1
