"""Cross-check a built-in operator's float64 oracle against a SOL-ExecBench problem's
reference (``fuseval crosscheck --op NAME --problem DIR``).

On every selected case of the operator (full size by default), on the operator's own
inputs: the built-in oracle and the problem's reference lifted to float64 must agree to
float64 roundoff, and the problem's reference as written must pass the case's tolerance
against the built-in oracle. Exits 0 when every case agrees, 1 naming the first case that
does not (see fuseval.interop.crosscheck)."""
from __future__ import annotations

import sys

from . import add_variant_argument, parse_cases, parse_device, writable_file


def add_arguments(p) -> None:
    p.add_argument("--op", required=True, help="the built-in operator")
    p.add_argument("--problem", required=True, metavar="DIR", help="the SOL-ExecBench problem folder")
    p.add_argument("--config", default="seed",
                   help="the operator's configuration (default: %(default)s, the problem's own sizes)")
    p.add_argument("--cases", default=None, type=parse_cases, help="subset of cases, e.g. '0,5' (default: all)")
    p.add_argument("--seed", type=int, default=0, help="input seed; case i uses seed + i (default: %(default)s)")
    p.add_argument("--device", default="cpu", type=parse_device, help="cpu or cuda (default: %(default)s)")
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    add_variant_argument(p)


def run(args) -> int:
    from ..errors import EXIT_CHECK_FAILED
    from ..interop.crosscheck import ORACLE_RTOL, crosscheck
    from ..terminal import fmt_number

    writable_file(args.json, "--json")

    def progress(c, n, total):
        verdict = "agree" if c.passed else "DISAGREE"
        print(f"[{n}/{total}] case {c.case}: {verdict}", file=sys.stderr, flush=True)

    result = crosscheck(args.op, args.problem, cases=args.cases, config=args.config, seed=0 if args.seed is None else args.seed,
                        device=args.device, variant=args.variant, progress=progress)
    print(f"{result.op} [{result.config}] variant={result.variant} against problem {result.problem} "
          f"({result.directory})")
    print(f"oracles agree: max |builtin - lifted| <= {ORACLE_RTOL:g} * max |lifted| per output; "
          "the benchmark's reference within the case's tolerance of the built-in oracle")
    for c in result.cases:
        for name in c.oracle_rel_diff:
            print(f"case {c.case} {name}: oracle diff {fmt_number(c.oracle_rel_diff[name])} of max, "
                  f"sol_reference matched {c.sol_matched[name]:.4%} (max abs {fmt_number(c.sol_max_abs[name])})"
                  + ("" if c.lifted else " [not lifted]"))
        if c.note:
            print(f"case {c.case}: note: {c.note}")
    if result.lift is not None:
        for line in result.lift.lines():
            print(line)
    if args.json:
        from ..jsonio import dumps
        with open(args.json, "w") as f:
            f.write(dumps(result.to_dict()) + "\n")
    failure = result.first_failure
    if failure is None:
        print(f"crosscheck passed: {len(result.cases)} case(s) agree")
        return 0
    print(f"crosscheck FAILED: case {failure.case} ({failure.axes}) disagrees: " + "; ".join(failure.messages))
    return EXIT_CHECK_FAILED
