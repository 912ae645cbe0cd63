"""Subcommands of the ``fuseval`` CLI, one module each (see fuseval.cli).

A command validates what the user gave before any work: options in argparse (``parse_*``
below), the operator, configuration and cases through :func:`operator_definition`, paths
through :func:`writable_file` / :func:`writable_folder`. A mistake is raised as a
:class:`~fuseval.errors.FusevalError` with its exit code; a library function that says
"bad input" with a ValueError is called inside :class:`~fuseval.errors.user_input`, which
converts it. Nothing else is converted: any other exception is a bug (exit 70).
"""
from __future__ import annotations

from ..errors import user_input  # noqa: F401 - the commands' one conversion of ValueErrors


def operator_definition(op: str, config="seed", cases=None, what_config: str = "--config",
                        what_cases: str = "--cases"):
    """The definition of ``op`` in ``config``, with the case selection ``cases`` checked
    against its cases: an unknown operator is its own error, a bad configuration or
    selection a usage error naming the option."""
    from ..check import validate_selection
    from ..operators import load
    with user_input(what_config):
        defn = load(op, config)
    with user_input(what_cases):
        validate_selection(cases, len(defn.seed_cases))
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
    p.add_argument("--cases", default=None, type=parse_cases,
                   help="subset of cases, e.g. '0,3,5-7' (default: all 16)")
    p.add_argument("--device", default="cpu", type=parse_device, help="cpu or cuda (default: %(default)s)")
    p.add_argument("--seed", type=parse_seed, default=None,
                   help="input seed; case i uses seed + i (default: drawn at random and printed, so that no "
                        "run's inputs can be known before it)")
    p.add_argument("--mode", default="benchmark", choices=["benchmark", "realistic"],
                   help="input distribution (default: %(default)s)")
    add_variant_argument(p)
    if impl:
        add_isolation_arguments(p)


def add_isolation_arguments(p) -> None:
    from ..runner import DEFAULT_TIMEOUT
    p.add_argument("--timeout", type=parse_timeout, default=None, metavar="SECONDS",
                   help=f"seconds each case may spend in the implementation, all its calls together "
                        f"(default: {DEFAULT_TIMEOUT:g}; 0: none); past it the case is 'timeout'")
    p.add_argument("--in-process", action="store_true",
                   help="run the implementation in fuseval's own process instead of a worker process of its "
                        "own: for debugging (breakpoints, profilers). It then trusts the implementation, "
                        "which could change the comparison, read the oracle or end the process, and has "
                        "no timeout")


def parse_timeout(value: str) -> float:
    import argparse
    import math
    try:
        t = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if t < 0 or not math.isfinite(t):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds >= 0 (0: none), got {value!r}")
    return t


def parse_seed(value: str) -> int:
    import argparse
    text = value.strip()
    if not text.isdigit() or int(text) >= 2 ** 63:
        raise argparse.ArgumentTypeError(f"expected an integer seed in [0, 2**63), got {value!r}")
    return int(text)


def parse_device(value: str) -> str:
    """'cpu', 'cuda' or 'cuda:N': anything else (tpu, meta, a typo) is a usage error here,
    before any work (the gate's rule, :func:`fuseval.gate.device_name`)."""
    import argparse
    from ..errors import UsageError
    from ..gate.profiles import device_name
    try:
        return device_name(value)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_cases(value: str) -> str:
    """A case selection ('0,3,5-7', 'all'): empty selections and cases selected twice are
    usage errors (the range against the operator's cases is checked when it is loaded)."""
    import argparse
    text = value.strip()
    if text == "all":
        return text
    if not text.strip(" ,"):
        raise argparse.ArgumentTypeError(f"empty case selection {value!r}; give indices such as '0,3,5-7' or 'all'")
    from ..definitions import parse_selection
    try:
        idx = parse_selection(text, 1 << 30)
    except ValueError:
        return text            # malformed: the operator's loader names the cases it has
    dup = sorted({i for i in idx if idx.count(i) > 1})
    if dup:
        raise argparse.ArgumentTypeError(f"case selection {value!r} selects case(s) {dup} more than once")
    return text


def at_least(low: float, kind: type = float):
    """An argparse type: a number of ``kind`` >= ``low`` (NaN rejected)."""
    import argparse
    import math

    def parse(value: str):
        try:
            x = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'} >= {low:g}, "
                                             f"got {value!r}") from None
        if math.isnan(x) or x < low:
            raise argparse.ArgumentTypeError(f"expected a number >= {low:g}, got {value!r}")
        return x
    parse.__name__ = f"{kind.__name__} >= {low:g}"
    return parse


def parse_seeds(value: str) -> int:
    import argparse
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seeds, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a number of seeds >= 1, got {n}")
    return n


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
