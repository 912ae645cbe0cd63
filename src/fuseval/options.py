"""The checks of what a user asks fuseval for, one function per kind of option, each the
only place its rule and its message live.

Each ``check_<kind>(value, what, ...)`` returns the value (normalised where that is said)
or raises :class:`~fuseval.errors.UsageError` naming ``what`` (the option as the caller
spelled it: ``timeout`` for the Python API, ``--timeout`` on the command line), what was
expected and what was given. They are called once, where a request is built
(:mod:`fuseval.requests` and the ``request`` modules of the gate, the budget and the
bench); the code behind a request trusts it. Nothing here imports torch: the command line
may use these before it imports the harness.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any, Collection, Sequence

from .definitions import parse_selection
from .errors import UsageError

__all__ = ["check_at_least", "check_cases_in", "check_device", "check_fraction", "check_jobs", "check_one_of",
           "check_seed", "check_seeds", "check_selection", "check_timeout", "option_name"]

# the spelling of a request's field on the command line, where it is not --field-name
_OPTIONS = {"components": "--skip", "config": "--config", "budget_cases": "--budget-cases"}
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")
SEED_LIMIT = 2 ** 63


def option_name(field: str, cli: bool = False) -> str:
    """How the user named the request's ``field``: the keyword of the Python API, or the
    command line's option (``timeout`` -> ``--timeout``)."""
    if not cli:
        return field
    return _OPTIONS.get(field, "--" + field.replace("_", "-"))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_one_of(value: Any, choices: Collection[str], what: str) -> Any:
    """``value`` is one of ``choices``."""
    if not isinstance(value, str) or value not in choices:
        raise UsageError(f"{what}: expected one of {', '.join(map(str, choices))}, got {value!r}")
    return value


def check_device(value: Any, what: str = "device") -> Any:
    """'cpu', 'cuda' or 'cuda:N' (returned stripped), a torch.device (returned as is), or
    None (the caller's default); anything else (tpu, meta, a typo) is refused."""
    if value is None or (hasattr(value, "type") and hasattr(value, "index") and not isinstance(value, str)):
        return value
    text = str(value).strip() if isinstance(value, str) else None
    if text is None or not _DEVICE.fullmatch(text):
        raise UsageError(f"{what}: expected cpu, cuda or cuda:N, got {value!r}")
    return text


def check_seed(value: Any, what: str = "seed") -> Any:
    """An integer seed in [0, 2**63), or None (drawn at random by the run)."""
    if value is not None and (not _is_int(value) or not 0 <= value < SEED_LIMIT):
        raise UsageError(f"{what}: expected an integer in [0, 2**63), got {value!r}")
    return value


def check_seeds(value: Any, what: str = "seeds") -> Any:
    """A number of seeds >= 1 or a non-empty list of seeds (returned as a list), or None
    (the caller's default)."""
    if value is None:
        return value
    if _is_int(value) and value >= 1:
        return value
    if isinstance(value, (list, tuple, range)) and len(value) and all(_is_int(s) for s in value):
        return [check_seed(s, what) for s in value]
    raise UsageError(f"{what}: expected a number of seeds >= 1 or a non-empty list of seeds, got {value!r}")


def check_timeout(value: Any, what: str = "timeout") -> Any:
    """Seconds a case may spend in the implementation: a finite number >= 0 (0: none), or
    None (the default)."""
    if value is not None and (not _is_number(value) or value < 0 or not math.isfinite(value)):
        raise UsageError(f"{what}: expected a finite number of seconds >= 0 (0: none), got {value!r}")
    return value


def check_jobs(value: Any, what: str = "jobs") -> Any:
    """A number of processes >= 1, or 'auto'."""
    if value != "auto" and (not _is_int(value) or value < 1):
        raise UsageError(f"{what}: expected a number of processes >= 1 or 'auto', got {value!r}")
    return value


def check_fraction(value: Any, what: str) -> Any:
    """A number in [0, 1], or None (the default)."""
    if value is not None and (not _is_number(value) or not 0.0 <= value <= 1.0):
        raise UsageError(f"{what}: expected a fraction in [0, 1], got {value!r}")
    return value


def check_at_least(value: Any, low: float, what: str, kind: type = float, unit: str = "a number") -> Any:
    """A number (an int when ``kind`` is int) >= ``low``; NaN refused."""
    ok = _is_int(value) if kind is int else _is_number(value)
    if not ok or math.isnan(value) or value < low:
        raise UsageError(f"{what}: expected {'an integer' if kind is int else unit} >= {low:g}, got {value!r}")
    return value


def check_selection(value: Any, what: str = "cases") -> Any:
    """A case selection ('0,3,5-7', 'all', a list of indices, or None: all) that selects
    something and no case twice. Whether the cases exist is :func:`check_cases_in`'s,
    once the operator is known (a malformed text is left to it, which names the cases)."""
    if value is None or (isinstance(value, str) and value.strip() == "all"):
        return value
    if isinstance(value, str):
        if not value.strip(" ,"):
            raise UsageError(f"{what}: case selection {value!r} is empty; give indices such as '0,3,5-7' or 'all'")
    elif not isinstance(value, Sequence) or not all(_is_int(i) for i in value):
        raise UsageError(f"{what}: expected a case selection such as '0,3,5-7', 'all' or a list of indices, "
                         f"got {value!r}")
    elif not value:
        raise UsageError(f"{what}: case selection {list(value)!r} is empty; give indices such as '0,3,5-7' or 'all'")
    try:
        idx = parse_selection(value, 1 << 62)
    except ValueError:
        return value        # malformed: check_cases_in names the cases the operator has
    dup = sorted(i for i, times in Counter(idx).items() if times > 1)
    if dup:
        raise UsageError(f"{what}: case selection {value!r} selects case(s) {dup} more than once")
    return value


def check_cases_in(value: Any, n: int, what: str = "cases") -> list[int]:
    """The indices a selection (already through :func:`check_selection`) selects among an
    operator's ``n`` cases; a malformed selection or a case it does not have is refused."""
    try:
        return parse_selection(value, n)
    except ValueError as exc:
        raise UsageError(f"{what}: {exc}") from None
