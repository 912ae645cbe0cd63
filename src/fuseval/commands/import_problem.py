"""Import a SOL-ExecBench problem folder as a fuseval operator (``fuseval import DIR``).

Reads and validates the folder (definition.json, workload.jsonl, in SOL-ExecBench's
format), prints what fuseval makes of it (axes, inputs, outputs, the
workloads it can draw, warnings such as tolerance keys the evaluator ignores, its
implementations), from definition.json and workload.jsonl alone: importing runs none of
the problem's code. --lift also runs the reference once on the smallest workload and shows
what the lifted oracle does with it (which casts were lifted to float64 and which were
kept: the quantizers). With --report, also how much of each workload's tolerance the benchmark's own reference
uses against the lifted oracle, worst workload first; --strict then exits 1 when the
reference fails its own tolerance on a workload.

Afterwards the problem is an operator like any other: pass ``--problem DIR`` wherever
``--op`` is accepted (or list the folder in FUSEVAL_PROBLEM_PATH)."""
from __future__ import annotations

import importlib
import sys

from . import parse_device, parse_seeds, writable_file


def add_arguments(p) -> None:
    p.add_argument("directory", metavar="DIR", help="the problem folder (definition.json, workload.jsonl)")
    p.add_argument("--lift", action="store_true",
                   help="run the reference on the smallest workload and show what the lifted float64 oracle does")
    p.add_argument("--report", action="store_true",
                   help="report how much of each workload's tolerance the benchmark's reference uses")
    p.add_argument("--smallest", type=parse_seeds, default=None, metavar="N",
                   help="with --report: only the N smallest workloads (default: all)")
    p.add_argument("--seeds", type=parse_seeds, default=1, metavar="N",
                   help="with --report: input seeds per workload (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="first input seed (default: %(default)s)")
    p.add_argument("--device", default="cpu", type=parse_device, help="cpu or cuda (default: %(default)s)")
    p.add_argument("--json", metavar="PATH", help="with --report: also write the report as JSON")
    p.add_argument("--markdown", metavar="PATH", help="with --report: also write the table as Markdown")
    p.add_argument("--strict", action="store_true",
                   help="with --report: exit 1 when the reference fails its own tolerance on a workload")


def _rule(t) -> str:
    from ..terminal import fmt_number
    rule = (f"|out-ref| <= {fmt_number(t['atol'], 3, 'g')} + {fmt_number(t['rtol'], 3, 'g')}*|ref|, "
            f"matched >= {t['min_matched_ratio']:.2%}")
    return rule + (f", max abs <= {fmt_number(t['max_abs_error'], 3, 'g')}" if t["max_abs_error"] is not None else "")


def _summary(problem, spec) -> list[str]:
    from ..interop.sol_problem import fuseval_tolerance
    lines = [f"problem {problem.name} ({problem.op_type}) from {problem.directory}",
             f"  registered as operator {spec.name!r} (module {spec.package})"]
    axes = ", ".join(f"{n}={a['value']}" if a["type"] == "const" else
                     (f"{n}={a['expression']}" if a["type"] == "expr" else f"{n} (var)")
                     for n, a in problem.axes.items())
    lines.append(f"  axes: {axes}")
    for kind, tensors in (("input", problem.inputs), ("output", problem.outputs)):
        for n, t in tensors.items():
            shape = "scalar" if t["shape"] is None else "[" + ", ".join(t["shape"]) + "]"
            lines.append(f"  {kind} {n}: {t['dtype']} {shape}")
    supported = problem.supported_workloads
    lines.append(f"  workloads: {len(supported)} of {len(problem.workloads)} drawable"
                 + (f", inputs from {problem.custom_inputs_entrypoint}()" if problem.custom_inputs_entrypoint else ""))
    rules = sorted({_rule(fuseval_tolerance(w.tolerance)) for w in supported})
    lines += [f"  tolerance: {r}" for r in rules[:4]] + ([f"  ... {len(rules) - 4} more"] if len(rules) > 4 else [])
    return lines


def run(args) -> int:
    from .. import operators
    from ..errors import EXIT_CHECK_FAILED
    from ..interop import sol_problem
    from ..interop.tolerance_use import select_workloads, tolerance_use

    writable_file(args.json, "--json")
    writable_file(args.markdown, "--markdown")
    spec = operators.register_problem(args.directory)
    problem = sol_problem.read_problem(args.directory)
    for line in _summary(problem, spec):
        print(line)
    module = importlib.import_module(spec.package)
    print("  implementations: " + ", ".join(["reference", "sol_reference", "torch", *module.SOLUTIONS]))
    try:
        module.DEFINITION_TEXT
    except sol_problem.ProblemError as exc:
        print(f"  not checkable by `fuseval check` yet: {exc}")
    for w in problem.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if args.lift:
        smallest = select_workloads(problem, smallest=1)[0]
        first = tolerance_use(args.directory, lines=[smallest.line], seed=0 if args.seed is None else args.seed, device=args.device)
        for line in first.lift.lines():
            print(line)
    if not args.report:
        return 0
    report = tolerance_use(args.directory, smallest=args.smallest, seeds=args.seeds, seed=0 if args.seed is None else args.seed,
                           device=args.device,
                           progress=lambda r, n, total: print(f"[{n}/{total}] workload line {r.line}: "
                                                              f"used {r.used:.1%}", file=sys.stderr, flush=True))
    print()
    print(report.to_markdown())
    for r in report.flagged:
        print(f"flagged: workload line {r.line} ({r.axes}): the benchmark's reference fails its own tolerance "
              f"against the lifted oracle on {r.failing}/{r.seeds} seeds (matched {r.matched:.4%}, "
              f"required {r.required:.2%})")
    if args.json:
        from ..jsonio import dumps
        with open(args.json, "w") as f:
            f.write(dumps(report.to_dict()) + "\n")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report.to_markdown() + "\n")
    return EXIT_CHECK_FAILED if args.strict and report.flagged else 0

