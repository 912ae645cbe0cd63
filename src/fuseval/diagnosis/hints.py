"""What an operator tells the diagnosis about itself, as data registered with the operator.

The anatomy of an error works on any output from the definition alone (its axis names and
sizes). An operator can say more through ``OperatorSpec.diagnosis`` (``".diagnosis:hints"``,
a callable ``hints(bound_axes) -> Hints``): how to call each axis in a sentence ("head",
"token"), named parts of an axis (one RoPE half, one mRoPE chunk), the tile sizes its fast
path uses along an axis, and which inputs are activations, weights or rope tables (the
groups the input-dependence runs change one at a time). Nothing here is ``if op == ...``:
generic code only reads these tables.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

__all__ = ["Hints", "Part", "hints_for", "axis_label", "input_groups"]


@dataclass(frozen=True)
class Part:
    """A named range [start, stop) of an axis, e.g. ("second RoPE half", 8, 16)."""
    label: str
    start: int
    stop: int


@dataclass(frozen=True)
class Hints:
    # axis name -> how a sentence calls one slice of it ("head", "token")
    labels: Mapping[str, str] = field(default_factory=dict)
    # axis name -> its named parts, at the case's sizes
    parts: Mapping[str, Sequence[Part]] = field(default_factory=dict)
    # axis name -> tile sizes along it (the operator's fast path); powers of two are tried anyway
    tiles: Mapping[str, Sequence[int]] = field(default_factory=dict)
    # group ("activations", "weights", "rope tables") -> input names
    groups: Mapping[str, Sequence[str]] = field(default_factory=dict)


# how a sentence calls a slice of an axis, from words in the axis's name: generic, so that
# an imported problem's axes read as well as a built-in operator's
_GENERIC_LABELS = (("batch", "batch item"), ("head_dim", "head-dim index"), ("heads", "head"),
                   ("seq", "token"), ("token", "token"), ("hidden", "hidden index"), ("size", "index"))


def axis_label(name: str, hints: Hints | None = None) -> str:
    if hints is not None and name in hints.labels:
        return hints.labels[name]
    lower = name.lower()
    for word, label in _GENERIC_LABELS:
        if word in lower:
            return label
    return f"{name} index"


def hints_for(defn, bound: Mapping[str, int]) -> Hints:
    """The hints of ``defn``'s operator at the case's sizes; an empty :class:`Hints` when it
    has none (imported problems: the anatomy still works, from the definition alone)."""
    record = getattr(defn, "operator", None)
    hints = None if record is None else record.diagnosis_hints
    return Hints() if hints is None else hints(dict(bound))


def input_groups(defn, hints: Hints) -> dict[str, list[str]]:
    """Activations / weights / rope tables: the operator's groups, else a generic split of
    its tensor inputs: names with cos/sin/rope are rope tables, inputs whose shape has a
    var axis (batch, tokens) are activations, the other tensors weights."""
    if hints.groups:
        return {g: list(names) for g, names in hints.groups.items() if names}
    groups: dict[str, list[str]] = {"activations": [], "weights": [], "rope tables": []}
    var = set(defn.var_axes)
    for spec in defn.inputs:
        if spec.shape is None:
            continue
        lower = spec.name.lower()
        if any(w in lower for w in ("cos", "sin", "rope")):
            groups["rope tables"].append(spec.name)
        elif any(isinstance(a, str) and a in var for a in spec.shape):
            groups["activations"].append(spec.name)
        else:
            groups["weights"].append(spec.name)
    return {g: names for g, names in groups.items() if names}
