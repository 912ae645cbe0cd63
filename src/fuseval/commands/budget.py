"""Per-stage error-budget report of an implementation against the float64 oracle.

Each named stage of the implementation (through its ``forward.staged`` taps, see
docs/budget.md) is measured three ways (local, propagated, downstream impact) next to a
naive implementation in the same precision and the float32 / plain-torch baselines, and
judged against the operator's budget file. Prints the Markdown report; exits 0 when
every case is within budget, 1 (check failed) otherwise, 5 for a malformed budget file,
12 when the implementation raised."""
from __future__ import annotations

import os
import sys
from dataclasses import replace

from . import add_common_arguments


def add_arguments(p) -> None:
    add_common_arguments(p, impl_default="fast")
    p.add_argument("--budget", metavar="FILE", default=None,
                   help="budget file (JSON); default: the operator's packaged budget")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="write budget.json there (and budget.md / budget.html with --markdown / --html)")
    p.add_argument("--html", action="store_true", help="also write a self-contained HTML page with plots")
    p.add_argument("--markdown", action="store_true", help="also write the Markdown report to a file")
    p.add_argument("--no-baselines", action="store_true",
                   help="skip the float32-reference and plain-torch baselines (the naive still runs)")


class _Progress:
    """One line per case on stderr: when it starts and how it ended, so long runs show life."""

    def __init__(self, stream=None):
        self._stream = stream

    @property
    def stream(self):
        return self._stream or sys.stderr      # looked up late: tests and tools swap sys.stderr

    def start(self, case, done: int, total: int) -> None:
        print(f"[{done + 1}/{total}] case {case.index} ({case.label}) ...", file=self.stream, flush=True)

    def __call__(self, result, done: int, total: int) -> None:
        if result.passed:
            verdict = "within budget"
        elif result.raised:
            verdict = "RAISED"
        else:
            verdict = f"OVER BUDGET, first at {result.first_over_budget}"
        e2e = result.end_to_end.impl
        final = f", final max abs {e2e['max_abs']:.3g}, matched {e2e['matched_ratio']:.4%}" if e2e else ""
        secs = sum(result.seconds.values())
        print(f"[{done}/{total}] case {result.case}: {verdict}{final} ({secs:.2f}s)", file=self.stream, flush=True)


def run(args) -> int:
    from ..check import draw_seed
    from ..budget import load_budget
    from ..budget.request import BudgetRequest
    from ..budget.runner import run_request
    from ..operators import load
    from ..errors import EXIT_BAD_FILE, budget_exit_code

    from . import user_input, writable_folder
    # every option checked, once, before any work (the configuration and cases as the operator loads)
    request = BudgetRequest(args.op, args.impl, config=args.config, cases=args.cases, device=args.device,
                            seed=draw_seed() if args.seed is None else args.seed, mode=args.mode,
                            progress=_Progress(), baselines=not args.no_baselines,
                            isolate=False if args.in_process else None, timeout=args.timeout, cli=True).validated()
    writable_folder(args.out or ("." if (args.html or args.markdown) else None), "--out")
    defn = load(args.op)
    with user_input("--budget", EXIT_BAD_FILE):
        budget = load_budget(args.budget if args.budget else defn.name, defn)
    report = run_request(replace(request, budget=budget))
    print(report.to_markdown())
    out = args.out
    if out is None and (args.html or args.markdown):
        out = "."
    if out is not None:
        os.makedirs(out, exist_ok=True)
        written = [report.save_json(os.path.join(out, "budget.json"))]
        if args.markdown:
            written.append(report.save_markdown(os.path.join(out, "budget.md")))
        if args.html:
            written.append(report.save_html(os.path.join(out, "budget.html")))
        print("wrote " + ", ".join(written), file=sys.stderr)
    return budget_exit_code(report.passed, [c.messages for c in report.cases if c.raised])
