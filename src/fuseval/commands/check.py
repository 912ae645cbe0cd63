"""Check an implementation against the float64 oracle on every benchmark case.

Prints a per-case table (max abs error, matched ratio under the tolerance rule, verdict)
and exits 0 only when every case passes; see fuseval.errors for the other exit codes."""
from __future__ import annotations

import sys

from . import add_common_arguments, as_number


def add_arguments(p) -> None:
    add_common_arguments(p)
    p.add_argument("--json", metavar="PATH", help="also write the full report as JSON")
    p.add_argument("--no-hygiene", action="store_true",
                   help="skip the mutation / aliasing / caching checks (one impl call per case)")
    p.add_argument("--against", default="reference",
                   help="what the outputs are compared with: 'reference' (the float64 oracle, default) or "
                        "'sol_reference' (the benchmark's reference in its own precision)")
    p.add_argument("--rules", default="fuseval",
                   help="fuseval's rules (default) or the benchmark evaluator's ('sol': float32 comparison, "
                        "any NaN/Inf on either side fails)")
    p.add_argument("--save-failing", metavar="DIR",
                   help="save the inputs of every failing case into DIR (one file per case; the message names "
                        "the file and the command that replays it)")
    p.add_argument("--replay", metavar="FILE",
                   help="run the check on the inputs of a --save-failing file (its case, seed and mode)")
    p.add_argument("--hygiene-seed", type=as_number, default=None,
                   help="the seed of the hygiene rules' later calls (default: drawn at random per case and "
                        "recorded in the JSON report; give it to replay a case's later calls exactly)")
    p.add_argument("--no-diagnosis", action="store_true",
                   help="do not diagnose failing cases (by default each failing case's error is dissected and "
                        "the operator's known mistakes ranked on the first two; `fuseval diagnose` for one in full)")
    p.add_argument("--no-predict", action="store_true",
                   help="do not predict the benchmark's verdict (sol_reference under the sol rules) beside")


def request_of(args, progress=None):
    """The :class:`~fuseval.requests.CheckRequest` of the command line, validated (its
    errors name the options)."""
    from ..requests import CheckRequest
    return CheckRequest(args.op, args.impl, config=args.config, cases=args.cases, device=args.device,
                        seed=args.seed, mode=args.mode, hygiene=not args.no_hygiene, progress=progress,
                        against=args.against, rules=args.rules, predict=not args.no_predict,
                        isolate=False if args.in_process else None, timeout=args.timeout,
                        save_failing=args.save_failing, replay=args.replay, hygiene_seed=args.hygiene_seed,
                        diagnose=not args.no_diagnosis, cli=True).validated()


def run(args) -> int:
    from ..check import run_check
    from ..errors import EXIT_NO_FLOAT64_ORACLE, check_exit_code
    from ..jsonio import dumps
    from ..terminal import case_progress, print_check_report
    from . import writable_file

    request = request_of(args, case_progress(sys.stderr))      # every option checked, once, before any work
    writable_file(args.json, "--json")
    if args.save_failing:
        from . import writable_folder
        writable_folder(args.save_failing, "--save-failing")
    report = run_check(request)        # the operator's configuration, cases, --against checked as it loads
    print_check_report(report)
    if report.seed_drawn:
        print(f"the seed was drawn at random; to run these inputs again: {reproduce_command(args, report.seed)}",
              file=sys.stderr)
    if not report.isolated:
        print("note: the implementation ran in fuseval's own process (--in-process): the verdict trusts it",
              file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            f.write(dumps(report.to_dict(), indent=1) + "\n")
    violations = [v for c in report.cases for v in c.violations]
    code = check_exit_code(violations, float64_missing=args.against == "reference" and bool(report.oracle_notes))
    if code == EXIT_NO_FLOAT64_ORACLE:
        print(f"fuseval check: the float64 verdict asked for (--against reference) could not be given: "
              f"{report.oracle_notes[0]} (exit {EXIT_NO_FLOAT64_ORACLE})", file=sys.stderr)
    return code


def reproduce_command(args, seed: int) -> str:
    """The command line that runs the same check on the same inputs."""
    import shlex
    parts = ["fuseval", "check"]
    for folder in getattr(args, "problems", None) or ():
        parts += ["--problem", folder]
    if args.op:
        parts += ["--op", args.op]
    parts += ["--impl", args.impl, "--config", args.config if isinstance(args.config, str) else
              __import__("json").dumps(args.config), "--seed", str(seed)]
    for flag, value in (("--cases", args.cases), ("--device", args.device if args.device != "cpu" else None),
                        ("--mode", args.mode if args.mode != "benchmark" else None),
                        ("--variant", getattr(args, "variant", None))):
        if value is not None:
            parts += [flag, str(value)]
    return " ".join(shlex.quote(p) for p in parts)
