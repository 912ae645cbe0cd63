"""Metamorphic properties (invariants) of implementations: the generic machinery and the
one invariant every operator has, batch independence.

An invariant function checks one property on given tensors and raises
:class:`InvariantViolation` (an ``AssertionError``) with a message that says what differed
and by how much; it returns a small dict of measurements otherwise. Operator-level
invariants take an implementation ``impl`` (any callable in definition order; default:
the float64 oracle). For the oracle they are checked to float64 round-off; for other
implementations with the tolerance given (default: the definition's rule between the two
runs of the implementation).

The invariants of one operator (causality of a decoder layer, NaN poisoning of a
quantized projection...) live in that operator's package and are listed in its
:class:`~fuseval.properties.hooks.PropertyHooks` ``invariants``; they build on the
helpers here (:func:`same_outputs`, :func:`call`, :func:`named_inputs`...).

Exact in float64 vs "equal up to round-off": properties whose two sides perform the same
operations on the same numbers (causality, batch independence, NaN poisoning, scaling by
a power of two) hold bit-for-bit in exact arithmetic and up to a few ulp of float64 for
the oracle (BLAS blocking may differ with the batch size); the checks use
``|a - b| <= 1e-12 * (1 + |b|)`` for the oracle.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import torch

from ..check import compare
from ..definitions import Definition, Tolerance
from ..operators.implementations import resolve_impl
from .hooks import definition_of, hooks_of

__all__ = ["InvariantViolation", "ORACLE_RTOL", "assert_close", "max_excess", "named_inputs",
           "ordered_inputs", "oracle_for", "impl_or_oracle", "same_outputs", "call", "batch_slice",
           "batch_independence"]

ORACLE_RTOL = 1e-12


class InvariantViolation(AssertionError):
    """A metamorphic property does not hold."""


# --------------------------------------------------------------------------- helpers
def max_excess(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> tuple[float, float]:
    """(max |a-b|, max of |a-b| - (atol + rtol |b|)); NaN in the same places is equal."""
    a64, b64 = a.detach().to(torch.float64), b.detach().to(device=a.device, dtype=torch.float64)
    both_nan = torch.isnan(a64) & torch.isnan(b64)
    diff = torch.where(both_nan, torch.zeros_like(a64), (a64 - b64).abs())
    diff = torch.nan_to_num(diff, nan=math.inf)
    excess = diff - (atol + rtol * b64.abs().nan_to_num(0.0))
    if diff.numel() == 0:
        return 0.0, -math.inf
    return float(diff.max()), float(excess.max())


def assert_close(what: str, a: torch.Tensor, b: torch.Tensor, rtol: float = ORACLE_RTOL,
                 atol: float = ORACLE_RTOL) -> float:
    """max |a - b| when it is within ``atol + rtol |b|`` everywhere; InvariantViolation otherwise."""
    if a.shape != b.shape:
        raise InvariantViolation(f"{what}: shapes differ {tuple(a.shape)} vs {tuple(b.shape)}")
    diff, excess = max_excess(a, b, rtol, atol)
    if excess > 0:
        raise InvariantViolation(f"{what}: max |difference| {diff:.3g} exceeds "
                                 f"{atol:.1g} + {rtol:.1g}*|value|")
    return diff


def named_inputs(defn: Definition, inputs: Sequence[Any]) -> dict[str, Any]:
    return dict(zip(defn.input_names, inputs))


def ordered_inputs(defn: Definition, values: Mapping[str, Any]) -> list[Any]:
    return [values[n] for n in defn.input_names]


def oracle_for(op: str | Definition) -> Callable:
    return resolve_impl(definition_of(op), "reference")


def impl_or_oracle(op: str | Definition, impl: Callable | None) -> tuple[Callable, bool]:
    """(the implementation to run, whether it is the float64 oracle): ``impl``, or the
    oracle when None (then the properties are checked to float64 round-off)."""
    return (oracle_for(op), True) if impl is None else (impl, False)


def same_outputs(what: str, defn: Definition, got: Sequence[torch.Tensor],
                 want: Sequence[torch.Tensor], oracle: bool, tolerance: Tolerance | None) -> None:
    """Outputs of two runs that the property says are equal."""
    for spec, a, b in zip(defn.outputs, got, want):
        if oracle:
            assert_close(f"{what} ({spec.name})", a, b)
            continue
        m = compare(a, b, tolerance or defn.tolerance, spec.name)
        if not m.passed:
            raise InvariantViolation(f"{what} ({spec.name}): {', '.join(m.reasons)} "
                                     f"(max |difference| {m.max_abs:.3g}, matched {m.matched_ratio:.4%})")


def call(impl: Callable, inputs: Sequence[Any]) -> tuple[torch.Tensor, ...]:
    """The outputs of ``impl(*inputs)`` as a tuple (one tensor or a sequence of them)."""
    result = impl(*inputs)
    return (result,) if isinstance(result, torch.Tensor) else tuple(result)


# =========================================================================== batch independence
def batch_slice(defn: Definition, values: Mapping[str, Any], b: int, batch_axis: str) -> list[Any]:
    """Inputs of batch item b alone (each input narrowed along its own batch dimension)."""
    out = dict(values)
    for spec in defn.inputs:
        if spec.is_scalar or batch_axis not in spec.shape:
            continue
        axis = spec.shape.index(batch_axis)
        out[spec.name] = values[spec.name].narrow(axis, b, 1).contiguous()
    return ordered_inputs(defn, out)


def _pin_global_amax(defn: Definition, values: dict[str, Any], batch_axis: str) -> dict[str, Any]:
    """For an operator whose outputs depend on the amax of a whole input tensor (the
    definition's ``global_amax_input``, e.g. an activation quantizer that scales by the amax
    over every token of the batch), put one element of magnitude 2 * amax into every batch
    item, so that each item alone has the amax of the batch and the relation holds exactly."""
    name = defn.raw.get("global_amax_input")
    if not name:
        return values
    spec = defn.inputs[defn.input_index(name)]
    t = values[name].clone()
    pin = (2 * t.abs().amax().to(torch.float32)).to(t.dtype)     # a power-of-two multiple: exact
    dim = spec.shape.index(batch_axis)
    index: list[Any] = [0] * t.dim()
    index[dim] = slice(None)
    t[tuple(index)] = torch.where(torch.arange(t.shape[dim], device=t.device) % 2 == 0, pin, -pin)
    return {**values, name: t}


def _batch_size(defn: Definition, values: Mapping[str, Any], batch_axis: str) -> int:
    for spec in defn.inputs:
        if not spec.is_scalar and batch_axis in spec.shape:
            return int(values[spec.name].shape[spec.shape.index(batch_axis)])
    raise ValueError(f"{defn.name}: no input has the batch axis {batch_axis!r} "
                     f"(inputs: {', '.join(defn.input_names)})")


def items_alone(batch: int) -> list[int]:
    """The batch items :func:`batch_independence` runs alone: the first, the middle and the
    last (every item of a batch of up to 3), so the ends, where an implementation's tiling
    leaves a partial block, are always among them. Not every item: each is a call of its
    own (in a worker, and for an imported problem a lifted float64 run too), and the batch
    axis of a problem may be its only axis, millions of elements long."""
    return sorted({0, batch // 2, batch - 1}) if batch > 0 else []


def batch_independence(op: str | Definition, inputs: Sequence[Any], impl: Callable | None = None,
                       tolerance: Tolerance | None = None, batch_axis: str | None = None) -> dict:
    """Batch items are independent: running item b alone gives the rows b of the batched run,
    for the items :func:`items_alone` picks (with the amax of a globally scaled input pinned in every item, see _pin_global_amax).
    The batch axis: ``batch_axis``, by default the operator's hooks' ``batch_axis``."""
    defn = definition_of(op)
    batch_axis = batch_axis or hooks_of(defn).batch_axis
    impl, oracle = impl_or_oracle(defn, impl)
    values = _pin_global_amax(defn, dict(named_inputs(defn, inputs)), batch_axis)
    inputs = ordered_inputs(defn, values)
    full = call(impl, inputs)
    batch = _batch_size(defn, values, batch_axis)
    dims = [spec.shape.index(batch_axis) if spec.shape and batch_axis in spec.shape else 0
            for spec in defn.outputs]
    for b in items_alone(batch):
        alone = call(impl, batch_slice(defn, values, b, batch_axis))
        same_outputs(f"batch item {b} run alone vs in a batch of {batch}", defn, alone,
                     [o.narrow(dim, b, 1) for o, dim in zip(full, dims)], oracle, tolerance)
    return {"batch": batch}
