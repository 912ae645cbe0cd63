"""The ``fuseval`` command.

Each subcommand lives in ``fuseval/commands/<name>.py`` and provides
``add_arguments(parser)`` and ``run(args) -> int`` (an exit code from
:mod:`fuseval.errors`). This is the only place that prints an error and decides the exit
code of one: a :class:`~fuseval.errors.FusevalError` is printed as one message and exits
with the code it carries (``FUSEVAL_DEBUG=1`` shows its traceback too); running out of
memory exits with its own code; a closed stdout ends quietly; any other exception is a
bug in fuseval: its traceback, and exit 70.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import traceback

from .errors import (EXIT_INTERNAL, EXIT_USAGE, FusevalError, exit_code_of, is_out_of_memory,
                     resource_message)

# name -> one-line help; the module fuseval.commands.<name> implements it
COMMANDS = {
    "list": "list operators, configurations, cases and implementations",
    "check": "check an implementation against the float64 oracle on the benchmark cases",
    "export": "export an operator as SOL-ExecBench definition.json / workload.jsonl",
    "bench": "benchmark implementations on the GPU (latency, floor, suite mean)",
    "budget": "per-stage error-budget report of an implementation",
    "diagnose": "why a case fails: the anatomy of its error and the known mistake that explains it",
    "gate": "CI gate: check + properties + budget, JUnit XML and reports",
    "baseline": "save / compare regression baselines of error metrics and latency",
    "import": "import a SOL-ExecBench problem folder as an operator (and report its reference's margins)",
    "sweep": "run import, the benchmark reference's check and the gate over many problem folders: one table",
    "crosscheck": "cross-check a built-in operator's oracle against a SOL-ExecBench problem's reference",
    "property": "reproduce one example of the property suite (the command each property failure prints)",
}
# a command whose module name differs from its name ("import" is a Python keyword)
MODULES = {"import": "import_problem"}


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = argparse.ArgumentParser(prog="fuseval", description="Reference-first numerical validation of fused GPU kernels.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    handlers = {}
    for name, help_text in COMMANDS.items():
        module = importlib.import_module(f"fuseval.commands.{MODULES.get(name, name)}")
        p = sub.add_parser(name, help=help_text, description=(module.__doc__ or help_text).strip())
        module.add_arguments(p)
        handlers[name] = module.run
    return parser, handlers


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _variant_scope(args):
    """The command's ``--variant`` in force for every operator it names (``--op all``: each
    operator must have that variant)."""
    from .definitions import DEFAULT_VARIANT
    from .operators import load, variant_scope
    from .operators import names as operator_names
    # every subcommand but baseline compare has --variant; compare takes the baseline's
    variant = args.variant if "variant" in vars(args) else None
    if variant in (None, DEFAULT_VARIANT):
        return contextlib.nullcontext()
    op = args.op if "op" in vars(args) else None
    names = operator_names() if op in (None, "all") else [n.strip() for n in op.split(",") if n.strip()]
    for name in names:
        defn = load(name)
        if variant not in defn.variants:
            raise FusevalError(f"--variant {variant!r}: operator {name!r} has no such variant; "
                               f"expected one of {', '.join(defn.variant_names)}", EXIT_USAGE)
    return variant_scope({name: variant for name in names})


def _register_problems(args) -> None:
    """Register the command's ``--problem`` folders as operators; with one folder and no
    ``--op``, the command is about that problem's operator. A command that takes --op needs one."""
    from .operators import register_problem
    found = [register_problem(d).name for d in getattr(args, "problems", None) or []]
    if "op" in vars(args) and args.op is None and args.command != "list":
        if len(found) == 1:
            args.op = found[0]
        else:
            raise FusevalError("--op: expected an operator name (or one --problem DIR), got none"
                               if not found else f"--op: several --problem folders ({', '.join(found)}): "
                               "name the operator(s) with --op", EXIT_USAGE)


def seal_import_path() -> None:
    """fuseval's process imports nothing from the working folder: ``python -m`` put it
    first on the search path, where a module of the same name as one fuseval imports later
    would be taken instead. (An implementation named 'module:function' is imported by its
    worker, whose path has the folder; see fuseval.runner.in_worker.)"""
    cwd = os.path.realpath(os.getcwd())
    sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != cwd]


def main(argv=None) -> int:
    seal_import_path()
    parser, handlers = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return EXIT_USAGE
    try:
        _register_problems(args)
        if str(getattr(args, "device", None) or "").startswith("cuda"):
            # the share of the GPU a parent (the sweep) gave this process; torch is imported
            # only by the commands that run on a GPU (the command validates the device)
            from .memory import apply_cuda_share
            apply_cuda_share()
        with _variant_scope(args):
            code = int(handlers[args.command](args) or 0)
        sys.stdout.flush()
        return code
    except BrokenPipeError as exc:
        # the reader went away (`fuseval list | head`): stop quietly; stdout goes to devnull
        # so the interpreter's final flush does not complain either
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return exit_code_of(exc)
    except FusevalError as exc:
        if os.environ.get("FUSEVAL_DEBUG"):
            traceback.print_exc()
        print(f"fuseval {args.command}: error: {exc}", file=sys.stderr)
        return exit_code_of(exc)
    except OSError as exc:
        limit = resource_message(exc)
        if limit is None:
            return _internal(args, exc)
        if os.environ.get("FUSEVAL_DEBUG"):
            traceback.print_exc()
        with contextlib.suppress(OSError):
            print(f"fuseval {args.command}: error: {limit}: {_first_line(exc)}", file=sys.stderr)
        return exit_code_of(exc)
    except Exception as exc:  # noqa: BLE001 - whatever is left is out of memory or a bug
        if is_out_of_memory(exc):
            if os.environ.get("FUSEVAL_DEBUG"):
                traceback.print_exc()
            hint = ("fewer or smaller --cases: a problem folder's sizes are its workloads"
                    if getattr(args, "problems", None) or args.command in ("import", "sweep")
                    else "try a smaller --config or fewer --cases")
            print(f"fuseval {args.command}: error: out of memory: {_first_line(exc)} ({hint})", file=sys.stderr)
            return exit_code_of(exc)
        return _internal(args, exc)


def _internal(args, exc: BaseException) -> int:
    traceback.print_exc()
    print(f"fuseval {args.command}: internal error: {type(exc).__name__}: {exc} "
          "(this is a bug in fuseval; please report it)", file=sys.stderr)
    return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
