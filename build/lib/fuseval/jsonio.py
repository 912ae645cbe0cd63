"""The one JSON encoder of fuseval's reports (gate, check, budget, baseline, bench).

Reports are strict JSON (``allow_nan=False``): non-finite floats are written as the strings
"inf", "-inf" and "nan", and :func:`number` reads them back. Dataclasses, tuples, sets,
numpy and torch scalars become plain JSON values.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

__all__ = ["jsonable", "dumps", "number"]


def _float(x: float, digits: int | None) -> float | str:
    if not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x if digits is None else float(f"{x:.{digits}g}")


_PLAIN = frozenset({str, int, bool, type(None)})


def jsonable(obj: Any, digits: int | None = None) -> Any:
    """``obj`` made JSON-safe; ``digits``: round floats to that many significant digits
    (small, stable diffs for files kept in git, e.g. baselines)."""
    # the exact built-in types first: a gate report holds hundreds of thousands of them
    t = type(obj)
    if t is float:
        return _float(obj, digits)
    if t in _PLAIN:
        return obj
    if t is dict:
        return {str(k): jsonable(v, digits) for k, v in obj.items()}
    if t is list or t is tuple:
        return [jsonable(v, digits) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}, digits)
    if isinstance(obj, dict):
        return {str(k): jsonable(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [jsonable(v, digits) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return _float(obj, digits)
    item = getattr(obj, "item", None)          # numpy / torch scalars
    if callable(item):
        try:
            return jsonable(item(), digits)
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(obj)


def dumps(obj: Any, *, indent: int | None = 2, digits: int | None = None, **kwargs: Any) -> str:
    """Strict JSON text of ``obj`` (see :func:`jsonable`)."""
    return json.dumps(jsonable(obj, digits), indent=indent, allow_nan=False, **kwargs)


def number(x: Any) -> float:
    """A stored number back to float: "inf"/"-inf"/"nan" strings included, None -> NaN."""
    return math.nan if x is None else float(x)
