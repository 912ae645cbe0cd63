"""Deliberately broken implementations (mutants): the type, how one is built from an
operator's reference, and the catalogues the operators provide.

A mutant is the reference pipeline with exactly one real, subtle bug, run the way an
implementation runs: in float32 (``dtype=torch.float32``), outputs cast to the
definition's dtypes. :func:`make` builds one from the operator's reference in one of
three ways: keyword arguments of the reference that swap one of its stage functions (a
``stages`` namespace with one function replaced, see :func:`namespace`) or select other
semantics; a ``transform`` of the named inputs (a missing bias, a wrong norm weight,
swapped tables: :func:`swap_inputs`, :func:`zero_input`...); or a ``rewrite`` of one
stage's output from the stage taps (a dropped residual, a wrong layout).

Each operator lists its mutants in its package (``OperatorSpec.mutants``, e.g.
``".mutants:catalogue"``, a callable returning ``list[Mutant]``); :func:`catalogue` and
:func:`get` read them through the registry. An operator without a catalogue has no
mutants. The property suite must reject every mutant in the ``ci`` profile
(``tests/properties/test_mutants.py`` asserts it, so weakening a property fails CI).

Every mutant follows the stage-tap protocol: ``mutant.fn.staged(*inputs, taps=, override=)``
records every stage output of the definition (float32) and continues from overridden stage
outputs, and ``mutant.stage`` names the first stage whose output the bug changes, so the
error budget can be tested to blame the right stage.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from typing import Any, Callable, Mapping

import torch

from .. import operators
from ..definitions import Definition
from . import OperatorRecord, load
from ..inputs import TORCH_DTYPES
from .implementations import resolve_impl

__all__ = ["Mutant", "make", "namespace", "catalogue", "get", "swap_inputs", "zero_input", "ones_input",
           "copy_input", "first_batch_item"]


@dataclass(frozen=True)
class Mutant:
    """A broken implementation: ``fn(*inputs)`` returns outputs in the definition dtypes;
    ``fn.staged`` is its stage-tap version; ``stage`` is the first stage it breaks."""
    name: str
    op: str
    stage: str
    description: str
    fn: Callable

    def __call__(self, *inputs):
        return self.fn(*inputs)

    @property
    def staged(self) -> Callable:
        return self.fn.staged


def namespace(module: ModuleType, **replace: Callable) -> SimpleNamespace:
    """The public functions of ``module`` (its ``__all__``) with some replaced: what a
    reference's ``stages=`` (or a codec) argument takes."""
    ns = SimpleNamespace(**{n: getattr(module, n) for n in module.__all__})
    for k, v in replace.items():
        if not hasattr(ns, k):
            raise AttributeError(f"{module.__name__} has no function {k!r} to replace")
        setattr(ns, k, v)
    return ns


def make(op: str, name: str, stage: str, description: str, *,
         reference_kwargs: Mapping[str, Any] | None = None,
         transform: Callable[[dict], None] | None = None,
         rewrite: Callable[[dict, dict], torch.Tensor] | None = None) -> Mutant:
    """A mutant of ``op`` built from its reference (``resolve_impl(definition, "reference")``,
    which takes ``taps=``, ``override=``, ``dtype=`` and ``validate=``):

    * ``reference_kwargs``: more keyword arguments of the reference, e.g. ``stages=`` a
      :func:`namespace` with one broken function, or a switch to another operator's
      semantics (a bug against the benchmark's);
    * ``transform(values)``: edits the named inputs in place before the reference runs;
    * ``rewrite(taps, values) -> tensor``: replaces the output of ``stage`` (computed from
      a first run's taps and the inputs), unless the caller overrides that stage.

    ``stage`` must be a stage of the definition: the first one the bug changes."""
    defn = load(op)
    if stage not in defn.stage_names:
        raise ValueError(f"mutant {name}: unknown stage {stage!r} of {op} ({defn.stage_names})")
    ref = resolve_impl(defn, "reference")
    out_dtypes = [TORCH_DTYPES[spec.dtype] for spec in defn.outputs]
    kwargs: dict[str, Any] = {"dtype": torch.float32, "validate": False, **(reference_kwargs or {})}

    def staged(*inputs, taps: dict | None = None, override: Mapping[str, torch.Tensor] | None = None):
        values = dict(zip(defn.input_names, inputs))
        if transform is not None:
            transform(values)
        args = [values[n] for n in defn.input_names]
        override = dict(override or {})
        if rewrite is not None and stage not in override:
            first: dict = {}
            ref(*args, taps=first, override=override, **kwargs)
            override[stage] = rewrite(first, values)
        outs = ref(*args, taps=taps, override=override, **kwargs)
        return tuple(o.to(dtype).contiguous() for o, dtype in zip(outs, out_dtypes))

    def forward(*inputs):
        return staged(*inputs)

    forward.staged = staged
    forward.stage = stage
    forward.mutant_name = name
    forward.description = description
    forward.__name__ = forward.__qualname__ = f"mutant_{name}"
    return Mutant(name, op, stage, description, forward)


# --------------------------------------------------------------------------- input transforms
def swap_inputs(a: str, b: str) -> Callable[[dict], None]:
    """Inputs ``a`` and ``b`` exchanged."""
    def transform(values):
        values[a], values[b] = values[b], values[a]
    return transform


def zero_input(name: str) -> Callable[[dict], None]:
    """Input ``name`` replaced by zeros (e.g. a bias never added)."""
    def transform(values):
        values[name] = torch.zeros_like(values[name])
    return transform


def ones_input(name: str) -> Callable[[dict], None]:
    """Input ``name`` replaced by ones (e.g. a norm weight never applied)."""
    def transform(values):
        values[name] = torch.ones_like(values[name])
    return transform


def copy_input(dst: str, src: str) -> Callable[[dict], None]:
    """Input ``src`` used where ``dst`` belongs."""
    def transform(values):
        values[dst] = values[src]
    return transform


def first_batch_item(*names: str, axis: int) -> Callable[[dict], None]:
    """The inputs ``names`` of batch item 0 broadcast to every item (a stride-0 / indexing
    bug); ``axis`` is their batch dimension."""
    def transform(values):
        for n in names:
            t = values[n]
            values[n] = t.narrow(axis, 0, 1).expand_as(t).contiguous()
    return transform


# --------------------------------------------------------------------------- the catalogues
def _record(op: str | Definition | OperatorRecord) -> OperatorRecord:
    """The record of ``op``: a definition's own, a record, or (the registry's public
    resolver, for callers at the boundary) the registered operator of that name."""
    if isinstance(op, Definition):
        return op.operator
    return op if isinstance(op, OperatorRecord) else operators.record(op)


def catalogue(op: str | Definition | OperatorRecord) -> list[Mutant]:
    """Every mutant of ``op`` (its record's ``mutants``; empty when it has none). An unknown
    operator name is an ``UnknownOperatorError``."""
    record = _record(op)
    found = record.mutant_catalogue()
    for m in found:
        if not isinstance(m, Mutant) or m.op != record.name:
            raise TypeError(f"operator {record.name!r}: its mutant catalogue holds {m!r}, expected Mutants of "
                            f"{record.name!r}")
    return found


def get(op: str | Definition | OperatorRecord, name: str) -> Mutant:
    """The mutant ``name`` of ``op`` (a ValueError lists the known ones)."""
    found = catalogue(op)
    for m in found:
        if m.name == name:
            return m
    raise ValueError(f"{_record(op).name} has no mutant {name!r}; known: {[m.name for m in found]}")
