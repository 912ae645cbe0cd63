"""CI gate: the benchmark cases over several seeds (statistical verdicts), the property
suite and the per-stage error budget, on one operator or all of them. Exits 0 when
everything passed (a metric passing with a thin margin is a warning, not a failure, unless
--strict), otherwise with the exit code of the most telling failure (fuseval/errors.py).
Prints a one-screen summary on stdout and progress on stderr; writes junit.xml, gate.json,
gate.md and the components' reports into --out. On a CPU: 'TRITON_INTERPRET=1 fuseval gate
--op all --impl fast --profile ci'. On a GPU: 'fuseval gate --op nvfp4_qkv_rope --impl
mypkg.kernels:qkv_rope --profile gpu'. See docs/ci.md.
"""
from __future__ import annotations

import sys

from . import add_problem_argument, add_variant_argument, parse_config


def add_arguments(p) -> None:
    add_variant_argument(p)
    from ..gate.profiles import COMPONENTS, PROFILES
    from ..operators import names
    add_problem_argument(p)
    p.add_argument("--op", default=None,
                   help=f"operator name, a comma list, or 'all' ({', '.join(names())}); under 'all' an "
                        "operator without the implementation named by --impl is reported as not run")
    p.add_argument("--impl", default="fast",
                   help="implementation: a name of the operator's table (fast, torch...) or "
                        "'module:function' (default: %(default)s)")
    p.add_argument("--profile", default="ci",
                   help=f"{', '.join(PROFILES)}; ci: scaled-down configs on the CPU, 3 seeds; thorough: 5 seeds, more "
                        "properties; gpu: the benchmark sizes on CUDA (default: %(default)s)")
    p.add_argument("--out", default="gate-report",
                   help="folder for junit.xml, gate.json, gate.md and the reports (default: %(default)s)")
    p.add_argument("--config", default=None, type=parse_config,
                   help="override the profile's configuration (small, seed...)")
    from . import add_isolation_arguments, as_number
    p.add_argument("--device", default=None, help="override the profile's device (cpu, cuda, cuda:N)")
    p.add_argument("--cases", default=None, help="case subset of the check, e.g. '0,3,5-7'")
    p.add_argument("--seeds", type=as_number, default=None, help="number of seeds of the check, >= 1 (profile: 3 or 5)")
    p.add_argument("--seed", type=as_number, default=None,
                   help="the check's first seed (the others follow it by 1000); default: drawn at random and "
                        "printed, so no run's inputs can be known before it")
    add_isolation_arguments(p)
    p.add_argument("--mode", default="benchmark", help="input distribution: benchmark or realistic "
                                                       "(default: %(default)s)")
    p.add_argument("--budget", default=None, metavar="FILE",
                   help="a budget file handed to the budget component (default: its built-in budget)")
    p.add_argument("--budget-cases", default="profile",
                   help="case subset of the budget (default: the profile's; 'all' for every case)")
    p.add_argument("--skip", default="", help=f"components to skip, comma list of {', '.join(COMPONENTS)}")
    p.add_argument("--strict", action="store_true",
                   help="fail on warnings too (metrics that pass with less than --warn-margin left)")
    p.add_argument("--warn-margin", type=as_number, default=None,
                   help="warn when less than this fraction of a rule's allowance is left (default: 0.5)")
    p.add_argument("--jobs", default="auto", type=as_number,
                   help="components run side by side, this many at a time (default: one per CPU "
                        "core, at most 4, on the CPU; one per GPU with several GPUs, each on its own; on one GPU "
                        "one per operator when the implementation runs isolated, else 1): with at least as many "
                        "operators as jobs and no GPU for each, one thread per operator drives its implementation "
                        "worker, otherwise a pool of processes; the report is the same as a serial run's")
    p.add_argument("--no-warmup", action="store_true",
                   help="on CUDA, do not compile the implementation's kernels for the run's case shapes and "
                        "properties in processes beside the gate (the warm-up changes no result)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def request_of(args):
    """The :class:`~fuseval.gate.request.GateRequest` of the command line, validated
    (``--skip`` names components; the request checks that something is left to run)."""
    from ..gate import COMPONENTS, stderr_progress
    from ..gate.request import GateRequest
    from ..options import check_one_of
    skip = [check_one_of(s.strip(), COMPONENTS, "--skip") for s in args.skip.split(",") if s.strip()]
    return GateRequest(args.op, args.impl, profile=args.profile, device=args.device, config=args.config,
                       cases=args.cases, seeds=args.seeds, mode=args.mode,
                       components=[c for c in COMPONENTS if c not in skip], warn_margin=args.warn_margin,
                       strict=args.strict, budget_cases=args.budget_cases, budget=args.budget, out=args.out,
                       progress=None if args.quiet else stderr_progress(sys.stderr),
                       isolate=False if args.in_process else None, timeout=args.timeout,
                       jobs=args.jobs, warmup=not args.no_warmup, seed=args.seed, cli=True).validated()


def run(args) -> int:
    from ..gate.runner import run_request
    from . import writable_folder
    request = request_of(args)                  # every option checked, once, before any work
    writable_folder(args.out, "--out")
    report = run_request(request)
    report.print_summary()
    return report.exit_code
