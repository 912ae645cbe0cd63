"""Subcommands of the ``fuseval`` CLI, one module each (see fuseval.cli)."""
from __future__ import annotations


def add_common_arguments(p, *, impl_default: str | None = None, config_default: str = "small",
                         impl: bool = True) -> None:
    """The options most commands share: --op, --impl, --config, --cases, --device, --seed,
    --mode, --variant, and the isolation options. ``impl_default`` None: --impl is required."""
    from ..definitions import list_operators
    p.add_argument("--op", required=True, help=f"operator name ({', '.join(list_operators())})")
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
                        "'small', or a JSON mapping of const-axis overrides, e.g. "
                        "'{\"hidden_size\": 48, \"head_dim\": 16}' (default: %(default)s)")
    p.add_argument("--cases", default=None, type=parse_cases,
                   help="subset of cases, e.g. '0,3,5-7' (default: all 16)")
    p.add_argument("--device", default="cpu", type=parse_device, help="cpu or cuda (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="input seed; case i uses seed + i (default: %(default)s)")
    p.add_argument("--mode", default="benchmark", choices=["benchmark", "realistic"],
                   help="input distribution (default: %(default)s)")
    add_variant_argument(p)
    if impl:
        add_isolation_arguments(p)


def add_isolation_arguments(p) -> None:
    from ..isolation import DEFAULT_TIMEOUT
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
    if t < 0 or math.isnan(t):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0 (0: none), got {value!r}")
    return t


def parse_device(value: str) -> str:
    """'cpu', 'cuda' or 'cuda:N': anything else (tpu, meta, a typo) is a usage error here,
    before any work."""
    import argparse
    import re
    text = value.strip()
    if text == "cpu" or re.fullmatch(r"cuda(:\d+)?", text):
        return text
    raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {value!r}")


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
def add_variant_argument(p) -> None:
    p.add_argument("--variant", default=None,
                   help="a named semantic variant of the operator, e.g. hf_mrope (op A with HF "
                        "Qwen2-VL's mRoPE layout) or w4a16 (op B with bf16 activations); default: "
                        "the benchmark's semantics ('sol'). `fuseval list --op NAME` lists them")


def parse_config(value: str):
    """A configuration name, or a JSON object of const-axis overrides (what the property
    suite prints when it drew a custom configuration)."""
    import argparse
    import json
    text = value.strip()
    if not text.startswith("{"):
        return text
    try:
        mapping = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--config {value!r} is not valid JSON: {exc}") from exc
    if not isinstance(mapping, dict):
        raise argparse.ArgumentTypeError(f"--config JSON must be an object, got {type(mapping).__name__}")
    return mapping
