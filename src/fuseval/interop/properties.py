"""The property engine's facts about an imported problem: its :class:`PropertyHooks`.

Everything here is read off the problem folder, never off the problem's name:

* **var axes from the workloads** (:func:`var_spaces`): in each axis space of the
  profiles, each var axis is drawn between the smallest and the largest value the
  space's workloads bind it to, or one of the workloads' exact bindings; draws that break
  the definition's constraints are rejected (and a space where nothing can satisfy them is
  an error naming the constraints, :func:`fuseval.properties.strategies.check_satisfiable`).
  The ``full`` space (the ``gpu`` profile) takes every supported workload. The scaled-down
  spaces take the workloads whose tensor inputs hold at most ``SPACE_SCALE[space]`` times
  the elements of the smallest workload (at least ``SPACE_FLOOR[space]``), and reject draws
  larger than that: a CPU profile stays within a few times the smallest workload.
* **input modes**: the benchmark recipe (the workload's own descriptors) and the
  adversarial recipes; no "realistic" mode (a problem folder says nothing about real
  models' inputs).
* **adversarial features** that its inputs allow: row magnitudes and zero rows of its
  first floating-point activation (the first float tensor input whose shape names a var
  axis), a drawn eps (a scalar float input named ``eps`` or ``*_eps``), arbitrary rotary
  tables (inputs the benchmark draws as cos/sin), norm weights away from 1 (inputs the
  benchmark draws as ones). No non-contiguous views: the evaluator passes contiguous
  tensors and solutions may rely on it.
* **the domain the workloads show** (:func:`var_spaces`): an axis every workload binds to a
  multiple of some step is drawn as a multiple of it; an axis every workload binds to
  ``factor * other + offset`` is computed, not drawn; orderings (``a <= b``) and
  divisibility (``b % a == 0``) that every workload shows between two axes reject the
  draws that break them.
* **the domain the problem's code shows**: a draw its reference or its input generator
  refuses (raises, :class:`~fuseval.interop.problem_code.ProblemCodeError`) is outside
  its domain and rejected, not a failure (``outside_domain``).
* **tolerance**: every example is judged under the tolerance of the workload nearest its
  binding (``case_tolerance``); adversarial draws scaled up (huge, mixed magnitudes) with
  its absolute parts times the factor the oracle's outputs grew by
  (``scale_atol_with_magnitude``): a workload's atol is written for the benchmark's
  magnitudes. Where the benchmark's own reference, in its own precision, misses that
  tolerance on a draw too (``precision_baseline``), the draw is judged by the reference's
  error there instead (within twice it), and reported.
* **batch independence**, per var axis that leads every float input it appears in and
  every output, checked only where the lifted oracle itself has it on the example's
  inputs: the engine cannot know whether a problem reduces over a batch-like axis, but
  its oracle can show it.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from ..oracles import SOL_REFERENCE
from ..properties.hooks import PropertyHooks, VarSpace
from . import workload_inputs as problem_inputs
from .tolerance_use import workload_size
from .problem_code import ProblemCodeError
from .sol_problem import Problem
from ..properties import invariants as inv

__all__ = ["problem_hooks", "var_spaces", "SPACE_SCALE", "SPACE_FLOOR"]

# scaled-down spaces: workloads (and draws) up to this many times the smallest workload's
# input elements, and never fewer than the floor
SPACE_SCALE = {"small": 4, "medium": 16}
SPACE_FLOOR = {"small": 1 << 14, "medium": 1 << 18}
_FLOATS = ("float64", "float32", "float16", "bfloat16")
_ROTARY = ("cos", "cos_cached", "rope_cos", "sin", "sin_cached", "rope_sin")


def _steps(axes, workloads: list) -> dict[str, int]:
    """Per var axis the largest step every workload's value is a multiple of (only where
    the workloads show at least two values, and the step is above 1)."""
    out = {}
    for a in axes:
        values = {w.axes[a] for w in workloads}
        step = math.gcd(*values) if len(values) > 1 else 0
        if step > 1:
            out[a] = step
    return out


def _ties(axes, workloads: list) -> dict[str, tuple[str, int, int]]:
    """Axes every workload binds to ``factor * base + offset`` of an earlier axis (factor
    an integer >= 1), read off two workloads with different base values and held by all."""
    ties: dict[str, tuple[str, int, int]] = {}
    for i, a in enumerate(axes):
        for base in axes[:i]:
            if base in ties:
                continue
            points = {(w.axes[base], w.axes[a]) for w in workloads}
            bases = sorted({x for x, _ in points})
            if len(bases) < 2 or len(points) != len(bases):
                continue
            (x1, y1), (x2, y2) = sorted(points)[:2]
            factor, rest = divmod(y2 - y1, x2 - x1)
            if rest or factor < 1:
                continue
            offset = y1 - factor * x1
            if all(y == factor * x + offset for x, y in points):
                ties[a] = (base, factor, offset)
                break
    return ties


def _relations(axes, workloads: list, ties) -> tuple[str, ...]:
    """Orderings (``a <= b``) and divisibility (``b % a == 0``) between two free var axes
    that every workload shows, where the workloads show the pair in at least two ways."""
    free = [a for a in axes if a not in ties]
    out = []
    for i, a in enumerate(free):
        for b in free[i + 1:]:
            pairs = {(w.axes[a], w.axes[b]) for w in workloads}
            if len(pairs) < 2:
                continue
            for x, y, (p, q) in ((a, b, (0, 1)), (b, a, (1, 0))):
                if all(pr[p] <= pr[q] for pr in pairs) and any(pr[p] < pr[q] for pr in pairs):
                    out.append(f"{x} <= {y}")
                if all(pr[p] >= 1 and pr[q] % pr[p] == 0 for pr in pairs) and any(pr[p] > 1 for pr in pairs):
                    out.append(f"{y} % {x} == 0")
    return tuple(out)


def _space(problem: Problem, workloads: list, limit: int | None) -> VarSpace:
    axes = list(problem.var_axes)
    ranges = {a: (min(w.axes[a] for w in workloads), max(w.axes[a] for w in workloads)) for a in axes}
    # exact bindings, smallest first (the explicit examples take the first two), no repeats
    seen, bindings = set(), []
    for w in sorted(workloads, key=lambda w: (workload_size(problem, w), w.line)):
        key = tuple(w.axes[a] for a in axes)
        if key not in seen:
            seen.add(key)
            bindings.append(dict(w.axes))
    ties = _ties(axes, workloads)
    return VarSpace(ranges, tuple(bindings), limit, steps=_steps(axes, workloads), ties=ties,
                    relations=_relations(axes, workloads, ties))


def var_spaces(problem: Problem) -> dict[str, VarSpace]:
    """The var-axis space of each profile space, from the problem's supported workloads."""
    pool = problem.drawable()
    sizes = {w.line: workload_size(problem, w) for w in pool}
    smallest = min(sizes.values())
    out = {"full": _space(problem, pool, None)}
    for name, scale in SPACE_SCALE.items():
        limit = max(scale * smallest, SPACE_FLOOR[name])
        chosen = [w for w in pool if sizes[w.line] <= limit] or [min(pool, key=lambda w: sizes[w.line])]
        out[name] = _space(problem, chosen, max(limit, max(sizes[w.line] for w in chosen)))
    return out


def _var_axis_names(problem: Problem, shape: list[str] | None) -> set[str]:
    """The var axes a shape names (directly: expression axes are not followed)."""
    return {d for d in shape or () if d in problem.var_axes}


def _activation(problem: Problem) -> str | None:
    for name, t in problem.inputs.items():
        if t["dtype"] in _FLOATS and t["shape"] and _var_axis_names(problem, t["shape"]):
            return name
    return None


def _leading_axes(problem: Problem) -> list[str]:
    """Var axes that are dim 0 of every input that has them and of every output."""
    out = []
    for axis in problem.var_axes:
        holders = [t for t in problem.inputs.values() if t["shape"] and axis in t["shape"]]
        if holders and all(t["shape"][0] == axis for t in holders) and \
                all(t["shape"] and t["shape"][0] == axis for t in problem.outputs.values()):
            out.append(axis)
    return out


def _batch_invariant(axis: str) -> Callable:
    """A metamorphic check: items along ``axis`` are independent, where the oracle's are."""
    def check(example, inputs, impl, defn) -> tuple[str, Callable[[], Any]] | None:
        if example.binding.axes.get(axis, 1) <= 1:
            return None
        tol = defn.nearest_case(example.binding.axes).tolerance
        try:
            inv.batch_independence(defn, inputs, impl=None, tolerance=tol, batch_axis=axis)
        except inv.InvariantViolation:
            return None          # the oracle itself is not independent along this axis
        except ProblemCodeError:
            return None          # the problem's code refuses one item alone (M % 128 == 0): no such check
        return (f"items along {axis} independent",
                lambda: inv.batch_independence(defn, inputs, impl=impl, tolerance=tol, batch_axis=axis))
    check.__name__ = f"independent_along_{axis}"
    return check


def problem_hooks(problem: Problem) -> PropertyHooks:
    """The :class:`PropertyHooks` of an imported problem (the module docstring)."""
    eps = [n for n, t in problem.inputs.items()
           if t["shape"] is None and t["dtype"] in _FLOATS and (n == "eps" or n.endswith("_eps"))]
    norm_weights = tuple(n for n, t in problem.inputs.items()
                         if t["shape"] and t["dtype"] in _FLOATS and problem_inputs._is_norm_param(n, "_weight"))
    rotary = tuple(n for n, t in problem.inputs.items() if n in _ROTARY and t["shape"] and t["dtype"] in _FLOATS)
    return PropertyHooks(
        batch_axis="",                                  # batch independence: the invariants below
        var_space=var_spaces(problem),
        input_modes=("benchmark", "adversarial"),
        activation_input=_activation(problem),
        eps_input=eps[0] if eps else None,
        rotary_inputs=rotary if len(rotary) >= 2 else (),
        norm_weight_inputs=norm_weights,
        noncontiguous=False,
        case_tolerance=True,
        scale_atol_with_magnitude=True,
        outside_domain=(ProblemCodeError,),
        precision_baseline=SOL_REFERENCE,
        invariants=tuple(_batch_invariant(a) for a in _leading_axes(problem)),
    )

