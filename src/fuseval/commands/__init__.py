"""Subcommands of the ``fuseval`` CLI, one module each (see fuseval.cli).

A command validates what the user gave before any work. ``check``, ``gate``, ``budget``
and ``bench`` build the request of their entry point from their options (``cli=True``:
its errors name the options) and hand it to the entry point, which validates it once
(:mod:`fuseval.requests`, :mod:`fuseval.options`): argparse here only reads the text
of a number as a number (:func:`as_number`), so that a bad value gets the same message as
from the Python API. The other commands check their options in argparse (``parse_*``
below, through the same :mod:`fuseval.options` helpers), the operator, configuration
and cases through :func:`operator_definition`, paths through :func:`writable_file` /
:func:`writable_folder`. A mistake is raised as a :class:`~fuseval.errors.FusevalError`
with its exit code; a library function that says "bad input" with a ValueError is called
inside :class:`~fuseval.errors.user_input`, which converts it. Nothing else is converted:
any other exception is a bug (exit 70).
"""
from __future__ import annotations

from ..errors import user_input  # noqa: F401 - the commands' one conversion of ValueErrors


def operator_definition(op: str, config="seed", cases=None, what_config: str = "--config",
                        what_cases: str = "--cases"):
    """The definition of ``op`` in ``config``, with the case selection ``cases`` checked
    against its cases: an unknown operator is its own error, a bad configuration or
    selection a usage error naming the option."""
    from ..operators import load
    from ..options import check_cases_in, check_selection
    with user_input(what_config):
        defn = load(op, config)
    check_cases_in(check_selection(cases, what_cases), len(defn.seed_cases), what_cases)
    return defn


def add_common_arguments(p, *, impl_default: str | None = None, config_default: str = "small",
                         impl: bool = True) -> None:
    """The options most commands share: --op, --impl, --config, --cases, --device, --seed,
    --mode, --variant, and the isolation options. ``impl_default`` None: --impl is required."""
    from ..operators import names
    p.add_argument("--op", default=None, help=f"operator name ({', '.join(names())}); with --problem, "
                                              "the problem's operator by default")
    add_problem_argument(p)
    if impl:
        if impl_default is None:
            p.add_argument("--impl", required=True,
                           help="the implementation to check: 'module:function' (your kernel) or a name of "
                                "the operator's table (fast, torch, reference_fp32...; `fuseval list --op NAME`)")
        else:
            p.add_argument("--impl", default=impl_default,
                           help="implementation: a name of the operator's table (reference, torch, fast...) "
                                "or 'module:function' (default: %(default)s)")
    p.add_argument("--config", default=config_default, type=parse_config,
                   help="'seed' for the full benchmark sizes, a scaled-down configuration such as "
                        "'small', NAME+{JSON} (overrides on a named configuration, its cases scaled as "
                        "NAME's, e.g. 'small+{\"hidden_size\": 96}'), or a JSON object of const-axis "
                        "overrides on the seed sizes (full-size cases) (default: %(default)s)")
    p.add_argument("--cases", default=None,
                   help="subset of cases, e.g. '0,3,5-7' (default: all 16)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: %(default)s)")
    p.add_argument("--seed", type=as_number, default=None,
                   help="input seed; case i uses seed + i (default: drawn at random and printed, so that no "
                        "run's inputs can be known before it)")
    p.add_argument("--mode", default="benchmark", help="input distribution: benchmark or realistic "
                                                       "(default: %(default)s)")
    add_variant_argument(p)
    if impl:
        add_isolation_arguments(p)


def add_isolation_arguments(p) -> None:
    from ..runner import DEFAULT_TIMEOUT
    p.add_argument("--timeout", type=as_number, default=None, metavar="SECONDS",
                   help=f"seconds each case may spend in the implementation, all its calls together "
                        f"(default: {DEFAULT_TIMEOUT:g}; 0: none); past it the case is 'timeout'")
    p.add_argument("--in-process", action="store_true",
                   help="run the implementation in fuseval's own process instead of a worker process of its "
                        "own: for debugging (breakpoints, profilers). It then trusts the implementation, "
                        "which could change the comparison, read the oracle or end the process, and has "
                        "no timeout")


def as_number(value: str):
    """The text of an option read as an int, else a float, where it is one; otherwise the
    text itself. Only reading: whether the value fits is the request's check, which names
    the option, what it expected and what it got, as it does for the Python API."""
    for kind in (int, float):
        try:
            return kind(value.strip())
        except ValueError:
            pass
    return value


def _argparse_check(check, value, *args):
    """``check(value, *args)`` of :mod:`fuseval.options` as an argparse type, for the
    commands that check their options in argparse (the message is the helper's)."""
    import argparse
    from ..errors import UsageError
    try:
        return check(value, *args)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc).partition(": ")[2] or str(exc)) from None


def parse_seed(value: str) -> int:
    from ..options import check_seed
    return _argparse_check(check_seed, as_number(value), "seed")


def parse_device(value: str) -> str:
    """'cpu', 'cuda' or 'cuda:N': anything else (tpu, meta, a typo) is a usage error here,
    before any work (:func:`fuseval.options.check_device`)."""
    from ..options import check_device
    return _argparse_check(check_device, value, "device")


def parse_cases(value: str) -> str:
    """A case selection ('0,3,5-7', 'all'): empty selections and cases selected twice are
    usage errors (the range against the operator's cases is checked when it is loaded)."""
    from ..options import check_selection
    return _argparse_check(check_selection, value.strip(), "cases")


def at_least(low: float, kind: type = float):
    """An argparse type: a number of ``kind`` >= ``low`` (NaN rejected;
    :func:`fuseval.options.check_at_least`)."""
    from ..options import check_at_least

    def parse(value: str):
        return kind(_argparse_check(check_at_least, as_number(value), low, "value", kind))
    parse.__name__ = f"{kind.__name__} >= {low:g}"
    return parse


def parse_seeds(value: str) -> int:
    from ..options import check_seeds
    return _argparse_check(check_seeds, as_number(value), "seeds")


def writable_file(path: str | None, what: str) -> None:
    """Fail before any work when ``path`` cannot be written (FusevalError, exit 2): the file
    is opened for appending (and removed again when it did not exist)."""
    if not path:
        return
    import os
    from ..errors import FusevalError
    if os.path.isdir(path):
        raise FusevalError(f"{what} {path!r} is a folder, expected a file path")
    existed = os.path.exists(path)
    try:
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        with open(path, "a"):
            pass
        if not existed:
            os.remove(path)
    except OSError as exc:
        raise FusevalError(f"{what} {path!r} cannot be written: {exc.strerror or exc}") from None


def writable_folder(path: str | None, what: str) -> None:
    """Fail before any work when the folder ``path`` cannot be created or written to (a
    probe file is created in it and removed)."""
    if not path:
        return
    import os
    import tempfile
    from ..errors import FusevalError
    if os.path.exists(path) and not os.path.isdir(path):
        raise FusevalError(f"{what} {path!r} exists and is not a folder")
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".fuseval-probe-", dir=path)
        os.close(fd)
        os.remove(probe)
    except OSError as exc:
        raise FusevalError(f"{what} {path!r} cannot be written: {exc.strerror or exc}") from None


def add_problem_argument(p) -> None:
    """``--problem DIR``: a SOL-ExecBench problem folder registered as an operator for this
    command (repeatable); the CLI registers it before the command runs (fuseval import)."""
    p.add_argument("--problem", dest="problems", action="append", default=[], metavar="DIR",
                   help="a SOL-ExecBench problem folder to register as an operator (repeatable; "
                        "`fuseval import DIR` shows what it becomes)")


def add_variant_argument(p) -> None:
    p.add_argument("--variant", default=None,
                   help="a named semantic variant of the operator (`fuseval list --op NAME` lists "
                        "each operator's variants); default: the benchmark's semantics ('sol')")


def parse_config(value: str):
    """A configuration as typed: a name, ``NAME+{JSON}`` or a JSON object of const-axis
    overrides (what the property suite prints when it drew a custom configuration). The text
    is passed on unchanged, so reports name the configuration exactly as given; only JSON
    that does not parse is refused here (the definition checks names and axes)."""
    import argparse
    import json
    text = value.strip()
    json_part = text if text.startswith("{") else text.partition("+")[2]
    if json_part:
        try:
            mapping = json.loads(json_part)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"--config {value!r}: the overrides are not valid JSON: {exc}") from exc
        if not isinstance(mapping, dict):
            raise argparse.ArgumentTypeError(f"--config {value!r}: the overrides must be a JSON object, "
                                             f"got {type(mapping).__name__}")
    return text
