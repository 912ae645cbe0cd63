"""Regression baselines of an implementation's error metrics (and GPU latencies). 'save'
measures every case over several seeds (per output and, with stage taps, per stage) and
writes a small JSON file to commit. 'compare' measures again with the baseline's operator,
configuration, cases, seeds and device (or reads --current FILE) and flags any metric that
grew past max(factor x baseline, baseline + k x spread), any case that newly fails and, on
a GPU, any slowdown past --slowdown; exit code 14 on a regression. Example: 'fuseval
baseline save --op nvfp4_qkv_rope --impl fast --out baselines/', then 'fuseval baseline
compare --baseline baselines/nvfp4_qkv_rope.small.cpu.json --impl fast'. See docs/ci.md.
"""
from __future__ import annotations

import sys

from . import add_problem_argument, add_variant_argument, at_least, parse_cases, parse_config, parse_device


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = sub.add_parser("save", help="measure an implementation and write baseline file(s)",
                       description="Measure an implementation and write a baseline file per operator.")
    s.add_argument("--op", default=None, help="operator name, a comma list or 'all'")
    add_problem_argument(s)
    s.add_argument("--impl", default="fast", help="implementation name or 'module:function' (default: %(default)s)")
    s.add_argument("--config", default="small", type=parse_config, help="configuration (default: %(default)s)")
    s.add_argument("--cases", default=None, type=parse_cases, help="case subset, e.g. '0,3,5-7' (default: all)")
    s.add_argument("--device", default="cpu", type=parse_device, help="cpu or cuda (default: %(default)s)")
    s.add_argument("--seeds", type=int, default=3, help="number of seeds, >= 3 (default: %(default)s)")
    s.add_argument("--mode", default="benchmark", choices=["benchmark", "realistic"])
    add_variant_argument(s)
    s.add_argument("--no-stages", action="store_true", help="leave out the budget's per-stage metrics")
    s.add_argument("--no-latency", action="store_true", help="leave out latencies (measured on CUDA only)")
    from . import add_isolation_arguments
    add_isolation_arguments(s)
    s.add_argument("--out", default="baselines",
                   help="a .json file (one operator) or a folder for <op>.<config>.<device>.json "
                        "(default: %(default)s)")

    c = sub.add_parser("compare", help="measure again (or read --current) and flag regressions",
                       description="Compare an implementation with a baseline file; exit 14 on a regression.")
    c.add_argument("--baseline", required=True, nargs="+", help="baseline file(s) written by 'baseline save'")
    c.add_argument("--impl", default=None, help="implementation to measure (default: the baseline's)")
    c.add_argument("--current", default=None, nargs="+",
                   help="compare with saved measurement file(s) instead of measuring")
    c.add_argument("--device", default=None, type=parse_device,
                   help="measure on this device (default: the baseline's)")
    c.add_argument("--factor", type=at_least(1), default=None,
                   help="allowed error growth factor, >= 1 (default: 2)")
    c.add_argument("--k", type=at_least(0), default=None, help="allowed growth in seed spreads (default: 3)")
    c.add_argument("--slowdown", type=at_least(0), default=None, help="allowed slowdown fraction (default: 0.10)")
    c.add_argument("--markdown", default=None, metavar="PATH", help="also write the diff table as Markdown")
    c.add_argument("--json", default=None, metavar="PATH", help="also write the comparison as JSON")
    c.add_argument("--save-current", default=None, metavar="PATH",
                   help="also write the current measurement as a baseline file")
    add_isolation_arguments(c)


def _progress(message: str) -> None:
    print(f"[baseline] {message}", file=sys.stderr, flush=True)


def _save(args) -> int:
    from .. import baseline
    from ..errors import FusevalError
    from ..gate import resolve_ops
    from . import operator_definition
    names = resolve_ops(args.op)
    if args.seeds < 3:
        raise FusevalError(f"--seeds must be >= 3 so the baseline has a spread to judge noise by, got {args.seeds}")
    for name in names:
        operator_definition(name, args.config, args.cases)
    to_file = args.out.endswith(".json")
    if to_file and len(names) > 1:
        raise FusevalError(f"--out {args.out!r} is one file but {len(names)} operators were asked for; "
                           "give a folder")
    from . import writable_file, writable_folder
    (writable_file if to_file else writable_folder)(args.out, "--out")
    for name in names:
        doc = baseline.collect(name, args.impl, config=args.config, cases=args.cases, device=args.device,
                               seeds=args.seeds, mode=args.mode, stages=False if args.no_stages else None,
                               latency=False if args.no_latency else None, progress=_progress,
                               isolate=False if args.in_process else None, timeout=args.timeout)
        path = args.out if to_file else baseline.default_path(name, doc["config"], doc["device"], args.out)
        baseline.save(doc, path)
        failing = [k for k, c in doc["cases"].items() if not c["passed"]]
        print(f"wrote {path}: {name} impl={doc['impl']} config={doc['config']} device={doc['device']}, "
              f"{len(doc['cases'])} cases x {len(doc['seeds'])} seeds ({', '.join(doc['sources'])})"
              + (f"; cases failing now: {', '.join(failing)}" if failing else ""))
    return 0


def _compare(args) -> int:
    from .. import baseline
    from ..definitions import DEFAULT_VARIANT
    from ..operators import variant_scope
    from ..errors import EXIT_REGRESSION, FusevalError
    from ..jsonio import dumps
    if args.current and len(args.current) != len(args.baseline):
        raise FusevalError(f"--current needs one file per --baseline file ({len(args.baseline)}), "
                           f"got {len(args.current)}")
    options = {k: v for k, v in (("factor", args.factor), ("k", args.k), ("slowdown", args.slowdown))
               if v is not None}
    from . import writable_file
    for what, path in (("--markdown", args.markdown), ("--json", args.json), ("--save-current", args.save_current)):
        if path and not (what == "--save-current" and len(args.baseline) > 1):
            writable_file(path, what)
    comparisons = []
    for i, path in enumerate(args.baseline):
        base = baseline.load(path)
        if args.current:
            current = baseline.load(args.current[i])
        else:
            with variant_scope({base["op"]: base.get("variant", DEFAULT_VARIANT)}):
                current = baseline.collect(
                    base["op"], args.impl or base["impl"], config=base["config"],
                    cases=[int(k) for k in base["cases"]], device=args.device or base["device"],
                    seeds=base["seeds"], mode=base["mode"],
                    # per-stage metrics only when the baseline has them (and the budget is there)
                    stages=None if "budget" in base.get("sources", []) else False,
                    latency=None, progress=_progress, isolate=False if args.in_process else None, timeout=args.timeout)
            failed = _implementation_failed(current)
            if failed is not None:
                code, lines = failed
                for line in lines:
                    print(f"fuseval baseline: {line}", file=sys.stderr)
                print(f"fuseval baseline compare: the implementation failed on {base['op']} (not a regression "
                      "of its numbers); exit code {code}".replace("{code}", str(code)), file=sys.stderr)
                return code
            if args.save_current:
                baseline.save(current, args.save_current if len(args.baseline) == 1 else
                              baseline.default_path(base["op"], base["config"], current["device"], args.save_current))
        from . import user_input
        with user_input():           # a baseline of another variant than the measurement
            comparisons.append(baseline.compare(base, current, **options))
    for comp in comparisons:
        comp.print_table()
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(c.to_markdown() for c in comparisons))
    if args.json:
        with open(args.json, "w") as f:
            f.write(dumps([c.to_dict() for c in comparisons], indent=1) + "\n")
    return EXIT_REGRESSION if any(not c.passed for c in comparisons) else 0


# violations that mean the implementation gave no numbers to compare
_IMPL_FAILED = ("tampered", "lingering_thread", "exited", "crashed", "timeout", "out_of_memory", "raised",
                "bad_outputs", "wrong_device")


def _implementation_failed(doc) -> tuple[int, list[str]] | None:
    """(exit code, messages) when a case of a measurement failed because of the implementation
    itself (raised, crashed, wrong outputs...), else None."""
    from ..errors import exit_code_for
    found, lines = [], []
    for key, case in doc.get("cases", {}).items():
        bad = [v for v in case.get("violations", []) if v in _IMPL_FAILED]
        if bad:
            found += bad
            lines += [f"case {key}: {m}" for m in case.get("messages", [])[:2]] or [f"case {key}: {', '.join(bad)}"]
    return (exit_code_for(found), lines[:8]) if found else None


def run(args) -> int:
    from ..options import check_timeout
    check_timeout(args.timeout, "--timeout")        # read by add_isolation_arguments, checked here
    return _save(args) if args.action == "save" else _compare(args)
