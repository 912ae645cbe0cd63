"""Axis values from the equations the inputs' shapes give.

An input dimension named by an expression axis (``proj_dim = num_heads * head_dim``) is
an equation: the expression equals the size seen. :func:`solve` binds every axis such
equations determine, one unknown at a time, and takes the value the definition gives
(a const axis) or the caller knows (a var axis, from the binding the inputs were drawn
for) only where the equations leave it open: first wherever that value satisfies the
equation it appears in, then, once no equation has a single unknown left, for every axis
still unbound. So ``num_proj_blocks = proj_dim // sf_vec_size`` seen as 512 with
``proj_dim`` seen as 8192 gives ``sf_vec_size = 16``; ``num_heads * head_dim`` seen as
8192 with neither seen elsewhere gives the definition's two values (and is then checked).

An equation with one unknown is solved exactly: by inverting + - * // and unary minus
along the path to the unknown (an interval of solutions: ``head_dim // 3 == 42`` holds
for 126..128), else by trying every value up to a bound. An axis no equation determines
and no given value fills is an :class:`AxisUndetermined` naming the axis and why.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Mapping, Sequence
from . import evaluate_expression

__all__ = ["Equation", "AxisUndetermined", "solve", "solutions", "names_in"]

# the largest value tried for an unknown when an equation cannot be inverted
_SCAN_LIMIT = 1 << 20


@dataclass(frozen=True)
class Equation:
    expression: str      # over axis names
    value: int           # what the input's shape shows
    source: str          # which input, for messages


class AxisUndetermined(ValueError):
    """An axis the inputs' shapes do not determine (the message says which and why)."""


def names_in(expression: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(expression, mode="eval")) if isinstance(n, ast.Name)}


def _evaluate(node: ast.AST, bound: Mapping[str, int]) -> int:
    return int(evaluate_expression(ast.unparse(node), bound))


def _value_at(tree: ast.AST, bound: Mapping[str, int], unknown: str, x: int) -> int | None:
    try:
        return _evaluate(tree, {**bound, unknown: x})
    except ZeroDivisionError:
        return None


def _holds(unknown: str, node: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and n.id == unknown for n in ast.walk(node))


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


def _invert(node: ast.AST, lo: int, hi: int | None, unknown: str,
            bound: Mapping[str, int]) -> tuple[int, int | None] | None:
    """The values of ``unknown`` (appearing once under ``node``) for which ``node`` lies in
    [lo, hi] (hi None: unbounded), as an interval; None where this form is not inverted."""
    if isinstance(node, ast.Name):
        return lo, hi
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        if hi is None:
            return None
        return _invert(node.operand, -hi, -lo, unknown, bound)
    if not isinstance(node, ast.BinOp):
        return None
    left_has = _holds(unknown, node.left)
    inner, other = (node.left, node.right) if left_has else (node.right, node.left)
    c = _evaluate(other, bound)
    op = node.op
    if isinstance(op, ast.Add):
        return _invert(inner, lo - c, None if hi is None else hi - c, unknown, bound)
    if isinstance(op, ast.Sub):
        if left_has:                                      # inner - c
            return _invert(inner, lo + c, None if hi is None else hi + c, unknown, bound)
        if hi is None:                                    # c - inner
            return None
        return _invert(inner, c - hi, c - lo, unknown, bound)
    if isinstance(op, ast.Mult):
        if c <= 0 or hi is None:
            return None
        return _invert(inner, _ceil_div(lo, c), hi // c, unknown, bound)
    if isinstance(op, ast.FloorDiv) and left_has and c > 0:    # inner // c in [lo, hi]
        return _invert(inner, lo * c, None if hi is None else hi * c + c - 1, unknown, bound)
    return None


def solutions(expression: str, value: int, unknown: str, bound: Mapping[str, int]) -> tuple[int, int] | None:
    """The values >= 0 of ``unknown`` for which ``expression == value`` (the other names
    bound), as an inclusive interval (lo > hi: none); None when they cannot be found
    (more than ``2**20`` values to try)."""
    tree = ast.parse(expression, mode="eval").body
    count = sum(isinstance(n, ast.Name) and n.id == unknown for n in ast.walk(tree))
    interval = _invert(tree, value, value, unknown, bound) if count == 1 else None
    if interval is not None and interval[1] is not None:
        lo, hi = max(0, interval[0]), interval[1]
        return lo, hi
    # not inverted: try every value (axis expressions are cheap); a contiguous run is kept
    limit = min(_SCAN_LIMIT, 4 * max([abs(value), *map(abs, bound.values())] or [0]) + 64)
    found = [x for x in range(limit + 1) if _value_at(tree, bound, unknown, x) == value]
    if not found:
        return (1, 0) if limit < _SCAN_LIMIT else None
    if found[-1] - found[0] + 1 != len(found) or found[-1] == limit:
        return None
    return found[0], found[-1]


def _follow_definitions(definitions: dict[str, str], equations: list[Equation], bound: dict[str, int]) -> bool:
    """Evaluate the expression axes whose names are bound, and turn the bound ones whose
    names are not into equations (each definition is used once); whether any was."""
    progress = False
    for axis, expression in list(definitions.items()):
        names = names_in(expression)
        if axis not in bound and names <= set(bound):
            bound[axis] = int(evaluate_expression(expression, bound))
        elif axis in bound and not names <= set(bound):
            equations.append(Equation(expression, bound[axis], f"axis {axis}"))
        else:
            continue
        del definitions[axis]
        progress = True
    return progress


def solve(equations: Sequence[Equation], bound: dict[str, int], given: Mapping[str, int],
          definitions: Mapping[str, str] | None = None) -> dict[str, int]:
    """Extend ``bound`` (the axes read directly off the shapes) with every axis the
    equations determine, and with ``given`` values (the definition's consts, the known var
    axes) where they leave one open (module docstring). ``definitions``: {expression axis:
    its expression}: an unbound one is evaluated once its names are bound, and a bound one
    whose names are not is one more equation. Returns ``bound``; checking the equations
    against the result is the caller's (its messages name the inputs)."""
    equations = list(equations)
    definitions = dict(definitions or {})
    open_ranges: dict[str, tuple[str, tuple[int, int]]] = {}
    impossible: dict[str, Equation] = {}
    while True:
        progress = _follow_definitions(definitions, equations, bound)
        for eq in equations:
            unknown = sorted(names_in(eq.expression) - set(bound))
            if len(unknown) != 1:
                continue
            x = unknown[0]
            if x in given and _value_at(ast.parse(eq.expression, mode="eval").body, bound, x, given[x]) == eq.value:
                bound[x] = int(given[x])            # the definition's (or the caller's) value fits
                progress = True
                continue
            found = solutions(eq.expression, eq.value, x, bound)
            if found is None:
                continue
            if found[0] > found[1]:
                impossible.setdefault(x, eq)          # no value fits: said below, unless a given one is checked
                continue
            if found[0] == found[1]:
                bound[x] = found[0]
            else:
                open_ranges[x] = (eq.expression, found)
                continue
            progress = True
        if progress:
            continue
        fill = [x for x in given if x not in bound]
        if not fill:
            if _follow_definitions(definitions, equations, bound):
                continue
            break
        for x in fill:
            bound[x] = int(given[x])
    left = sorted({x for eq in equations for x in names_in(eq.expression)} - set(bound))
    if left:
        x = left[0]
        if x in impossible:
            eq = impossible[x]
            why = f"input {eq.source!r} shows {eq.expression} = {eq.value}, which no value of {x} gives"
        elif x in open_ranges:
            expression, (lo, hi) = open_ranges[x]
            why = f"{expression!r} holds for every {x} in {lo}..{hi}"
        else:
            seen = [f"{eq.expression!r} (= {eq.value} in input {eq.source!r})"
                    for eq in equations if x in names_in(eq.expression)]
            why = f"it appears only in {', '.join(seen)}, with other unknowns"
        raise AxisUndetermined(f"axis {x!r} cannot be determined from the inputs' shapes: {why}")
    return bound
