"""Whether an operator's axis space can be drawn at all: :func:`check_satisfiable`.

A property run draws axis bindings and rejects those that break the definition's
constraints (``hypothesis.assume``). When no binding can satisfy them, every draw is
rejected and Hypothesis would end with a bare ``Unsatisfiable``; this says so up front,
naming the constraints and what was tried.
"""
from __future__ import annotations

from ..definitions import Definition
from ..errors import BadFileError
from ..operators import OperatorRecord
from .hooks import hooks_of, record_of
from .profiles import Space
from .strategies import Binding, _explicit_bindings, _fits, _space, _start_consts

__all__ = ["UnsatisfiableAxes", "check_satisfiable", "smallest_valid_bytes"]


class UnsatisfiableAxes(BadFileError):
    """No binding of an operator's axis space satisfies its definition's constraints."""


def _candidates(op: OperatorRecord, sp) -> tuple[list[Binding], int | None]:
    """The bindings a space surely offers (its explicit bindings, the exact bindings and the
    corners of the ranges of the hooks' ``var_space``) and its element limit."""
    base = op.load()
    hooks = hooks_of(base)
    vs = hooks.var_space.get(sp.name)
    consts = _start_consts(base, sp)
    candidates = list(_explicit_bindings(op, base, hooks, sp))
    if vs is not None:
        candidates += [Binding.make(op, consts, dict(b)) for b in vs.bindings]
        for pick in (0, 1):
            values = {a: (vs.ranges.get(a) or (1, 1))[pick] for a in base.var_axes}
            candidates.append(Binding.make(op, consts, values))
    return candidates, (vs.max_elements if vs is not None else None)


def smallest_valid_bytes(op: str | Definition | OperatorRecord, space: Space | str = "small") -> int | None:
    """The bytes (:func:`~fuseval.memory.draw_bytes`) of the smallest candidate binding of
    the space that satisfies the constraints (None: none does)."""
    candidates, limit = _candidates(record_of(op), _space(space))
    sizes = [b.planned_bytes() for b in candidates if _fits(b, limit)]
    return min(sizes) if sizes else None


def check_satisfiable(op: str | Definition | OperatorRecord, space: Space | str = "small") -> None:
    """Raise :class:`UnsatisfiableAxes` when none of the candidate bindings of ``op``'s axis
    space (its explicit bindings, the exact bindings and the corners of the ranges of its
    hooks' ``var_space``) satisfies the definition's constraints: every draw would then be
    rejected, and a property run could say nothing."""
    sp = _space(space)
    op = record_of(op)
    base = op.load()
    vs = hooks_of(base).var_space.get(sp.name)
    candidates, limit = _candidates(op, sp)
    if any(_fits(b, limit) for b in candidates):
        return
    tried = "; ".join(dict(b.var).__repr__() for b in candidates[:6])
    rules = ", ".join(repr(e) for e, _ in base.constraints) or "none"
    size = f" and at most {limit} input elements" if limit is not None else ""
    ranges = dict(vs.ranges) if vs is not None else "the profile's"
    raise UnsatisfiableAxes(f"{op.name}: no binding of its var axes {base.var_axes} satisfies its constraints "
                            f"({rules}){size} in the {sp.name} space: every draw would be rejected (expected "
                            f"at least one valid binding; tried {tried}{'...' if len(candidates) > 6 else ''}; "
                            f"ranges {ranges})")
