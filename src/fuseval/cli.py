"""The ``fuseval`` command.

Each subcommand lives in ``fuseval/commands/<name>.py`` and provides
``add_arguments(parser)`` and ``run(args) -> int`` (an exit code from
:mod:`fuseval.errors`). Errors a user can fix are printed as one message, never as a
bare traceback; ``FUSEVAL_DEBUG=1`` shows the traceback too.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import traceback

from .errors import (EXIT_BROKEN_PIPE, EXIT_IMPORT_ERROR, EXIT_INTERNAL, EXIT_OUT_OF_MEMORY, EXIT_USAGE,
                     FusevalError, NoDeviceError, UnknownOperatorError, is_out_of_memory)

# name -> one-line help; the module fuseval.commands.<name> implements it
COMMANDS = {
    "list": "list operators, configurations, cases and implementations",
    "check": "check an implementation against the float64 oracle on the benchmark cases",
    "export": "export an operator as SOL-ExecBench definition.json / workload.jsonl",
    "bench": "benchmark implementations on the GPU (latency, floor, suite mean)",
    "budget": "per-stage error-budget report of an implementation",
    "gate": "CI gate: check + properties + budget, JUnit XML and reports",
    "baseline": "save / compare regression baselines of error metrics and latency",
}


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = argparse.ArgumentParser(prog="fuseval", description="Reference-first numerical validation of fused GPU kernels.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    handlers = {}
    for name, help_text in COMMANDS.items():
        try:
            module = importlib.import_module(f"fuseval.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"fuseval.commands.{name}":
                continue  # command not built yet
            raise
        p = sub.add_parser(name, help=help_text, description=(module.__doc__ or help_text).strip())
        module.add_arguments(p)
        handlers[name] = module.run
    return parser, handlers


def _value_error_exit_code(exc: Exception) -> int | None:
    """The exit code of an error a user can fix (bad input), None for anything else: the
    typed ones carry their own code, any other ValueError is a usage error."""
    from .ops import ImplementationError
    if isinstance(exc, ImplementationError):
        return EXIT_IMPORT_ERROR
    if isinstance(exc, (UnknownOperatorError, NoDeviceError)):
        return exc.exit_code
    if isinstance(exc, ValueError):
        return EXIT_USAGE
    return None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _variant_scope(args):
    """The command's ``--variant`` in force for every operator it names (``--op all``: each
    operator must have that variant)."""
    import contextlib
    from .definitions import DEFAULT_VARIANT, list_operators, load, variant_scope
    variant = getattr(args, "variant", None)
    if variant in (None, DEFAULT_VARIANT):
        return contextlib.nullcontext()
    op = getattr(args, "op", None)
    names = list_operators() if op in (None, "all") else [n.strip() for n in op.split(",")]
    for name in names:
        defn = load(name)
        if variant not in defn.variants:
            raise FusevalError(f"--variant {variant!r}: operator {name!r} has no such variant; "
                               f"expected one of {', '.join(defn.variant_names)}", EXIT_USAGE)
    return variant_scope({name: variant for name in names})


def main(argv=None) -> int:
    parser, handlers = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return EXIT_USAGE
    try:
        with _variant_scope(args):
            code = int(handlers[args.command](args) or 0)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # the reader went away (`fuseval list | head`): stop quietly; stdout goes to devnull
        # so the interpreter's final flush does not complain either
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except FusevalError as exc:
        print(f"fuseval {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001 - map known error kinds to exit codes
        if os.environ.get("FUSEVAL_DEBUG"):
            traceback.print_exc()
        if is_out_of_memory(exc):
            print(f"fuseval {args.command}: error: out of memory: {_first_line(exc)} "
                  "(try a smaller --config or fewer --cases)", file=sys.stderr)
            return EXIT_OUT_OF_MEMORY
        code = _value_error_exit_code(exc)
        if code is not None:
            print(f"fuseval {args.command}: error: {exc}", file=sys.stderr)
            return code
        traceback.print_exc()
        print(f"fuseval {args.command}: internal error: {type(exc).__name__}: {exc} "
              "(this is a bug in fuseval; please report it)", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
