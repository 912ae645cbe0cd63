"""When a case fails, say why: the anatomy of its error and the known mistake that explains it.

:func:`diagnose_case` takes what a check already holds for one case (the inputs, the
implementation's outputs as fuseval received them, the oracle's outputs, the tolerance)
and returns a :class:`Diagnosis`:

* ``outputs``: one :class:`~fuseval.diagnosis.anatomy.OutputAnatomy` per output: where the
  error lives along each axis and the structures that explain it;
* ``matches``: the operator's mutants (:mod:`fuseval.diagnosis.matching`), or for an
  operator without a catalogue the generic mistakes (:mod:`fuseval.diagnosis.generic`),
  ranked by agreement with the failing output;
* ``dependence``: (only when a ``call`` is given: extra calls of the implementation through
  the same runner the check used) whether the error changes when only the activations,
  only the weights or only the rope tables are drawn anew;
* ``verdict`` and ``summary``: "known mistake", "near a known mistake", "precision",
  "structure", "unexplained" or "passed", and one sentence.

The implementation is never called here except through ``call``; everything else reads
outputs. Nothing of this runs for a passing case in a check.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import torch

from .anatomy import Finding, OutputAnatomy, anatomy
from .hints import Hints, hints_for, input_groups
from .matching import MutantMatch, agreement_all, rank_mutants, sort_matches
from .anatomy import agreement
from .render import full_lines, short_lines
from .matching import passes
from .generic import generic_matches

__all__ = ["Diagnosis", "Dependence", "diagnose_case", "diagnose_outputs", "OutputAnatomy", "Finding",
           "MutantMatch", "Hints", "VERDICTS"]

VERDICTS = ("passed", "known mistake", "near a known mistake", "precision", "structure", "unexplained")
NEAR = 0.9            # a mistake agreeing on this share (and clearly more than the oracle) is "near"
MARGIN = 0.05         # ... clearly more: by this share of the elements


@dataclass
class Dependence:
    group: str                # "activations", "weights", "rope tables"
    inputs: list[str]
    changes: bool             # the error changed when only these inputs were drawn anew
    relative_change: float    # ||err_new - err|| / ||err||
    still_fails: bool
    text: str


@dataclass
class Diagnosis:
    op: str
    case: int
    verdict: str
    summary: str
    outputs: list[OutputAnatomy]
    matches: list[MutantMatch] = field(default_factory=list)
    best: MutantMatch | None = None
    oracle_agreement: float = 1.0     # the oracle's own agreement with the outputs (all elements)
    dependence: list[Dependence] = field(default_factory=list)
    swapped: list[str] = field(default_factory=list)   # "value_states holds key_states' values"
    notes: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def short_lines(self, top: int = 2) -> list[str]:
        """The top findings per output, for ``fuseval check``."""
        return short_lines(self, top)

    def full_lines(self) -> list[str]:
        return full_lines(self)


def diagnose_outputs(defn, outputs: Sequence[torch.Tensor], refs: Sequence[torch.Tensor], tol,
                     hints: Hints | None = None, seed: int = 0) -> tuple[list[OutputAnatomy], list[str]]:
    """The anatomy of every output, and the outputs that hold another output's values (a swap)."""
    bound = _bound(defn, outputs)
    hints = hints if hints is not None else hints_for(defn, bound)
    found = []
    for o, r, spec in zip(outputs, refs, defn.outputs):
        names = list(spec.shape) if spec.shape else []
        found.append(anatomy(o, r, tol, spec.name, names, hints, seed))
    swapped = []
    for i, (o, a) in enumerate(zip(outputs, found)):
        if not a.failing:
            continue
        for j, r in enumerate(refs):
            if j != i and tuple(r.shape) == tuple(o.shape):
                share = agreement(o.detach().cpu(), r.detach().cpu(), tol)
                if share >= max(NEAR, a.matched_ratio + 0.2):
                    text = f"{defn.outputs[i].name} holds {defn.outputs[j].name}'s values ({share:.1%} agree)"
                    swapped.append(text)
                    a.findings = [Finding("other_output", text, share, {"from": defn.outputs[j].name})] + \
                        [f for f in a.findings if f.kind != "precision"]
    return found, swapped


def _bound(defn, outputs) -> dict[str, int]:
    """The axis sizes, read off the outputs' shapes (and the definition's constants)."""
    bound = dict(defn.const_axes)
    for o, spec in zip(outputs, defn.outputs):
        for name, n in zip(spec.shape or [], o.shape):
            if isinstance(name, str):
                bound.setdefault(name, int(n))
    return bound


def diagnose_case(defn, inputs: Sequence[Any], outputs: Sequence[torch.Tensor], refs: Sequence[torch.Tensor],
                  tol, *, case: int = 0, mutants: bool = True, call: Callable | None = None,
                  reference: Callable | None = None, redraw: Callable[[int], Sequence[Any]] | None = None,
                  progress: Callable[[str], None] | None = None, seed: int = 0) -> Diagnosis:
    """The diagnosis of one case (module docstring).

    ``mutants``: rank the operator's catalogue (or the generic mistakes) on ``inputs``.
    ``call(inputs) -> outputs | None``, ``reference(*inputs)`` and ``redraw(k) -> inputs``
    (a fresh draw of all inputs, the k-th): with all three, the input-dependence runs."""
    clock: dict[str, float] = {}
    t0 = time.perf_counter()
    bound = _bound(defn, outputs)
    hints = hints_for(defn, bound)
    anatomies, swapped = diagnose_outputs(defn, outputs, refs, tol, hints, seed)
    clock["anatomy"] = time.perf_counter() - t0
    names = defn.output_names
    oracle_agreement = agreement_all(outputs, refs, tol, names)[0]
    matches: list[MutantMatch] = []
    notes: list[str] = []
    if mutants:
        t0 = time.perf_counter()
        try:
            matches = rank_mutants(defn, inputs, outputs, refs, tol, names, progress=progress)
            explained = any(m.visible and m.agreement >= NEAR for m in matches)
            if not explained:
                # no catalogue, or nothing in it near: the generic mistakes, through the oracle
                generic = generic_matches(defn, inputs, outputs, refs, tol, names)
                if generic:
                    notes.append(("no mutant catalogue" if not matches else "nothing in the catalogue is near")
                                 + ": generic mistakes tried through the oracle")
                matches = sort_matches(matches + generic)
        except Exception as exc:  # noqa: BLE001 - a broken catalogue must not hide the anatomy
            notes.append(f"the mistakes could not be run: {type(exc).__name__}: {exc}"[:300])
        clock["mistakes"] = time.perf_counter() - t0
    dependence: list[Dependence] = []
    if call is not None and reference is not None and redraw is not None and any(a.failing for a in anatomies):
        t0 = time.perf_counter()
        dependence = input_dependence(defn, hints, inputs, outputs, refs, tol, call, reference, redraw, progress)
        clock["dependence"] = time.perf_counter() - t0
    verdict, summary, best = _verdict(anatomies, matches, oracle_agreement, swapped, tol)
    return Diagnosis(defn.name, case, verdict, summary, anatomies, matches, best, oracle_agreement, dependence,
                     swapped, notes, clock)


def _verdict(anatomies, matches, oracle_agreement, swapped, tol):
    failing = [a for a in anatomies if a.failing]
    if not failing:
        levels = ", ".join(f"{a.name}: {a.level}" for a in anatomies)
        return "passed", f"every element within tolerance; error at the level of rounding ({levels})", None
    visible = [m for m in matches if m.visible and m.error is None]
    best = visible[0] if visible else None
    what = "mutant" if best is not None and best.kind == "mutant" else "generic mistake"
    if best is not None and best.agreement >= tol.min_matched_ratio and best.agreement > oracle_agreement:
        stage = f" (stage {best.stage})" if best.stage else ""
        return ("known mistake", f"the output agrees with {what} `{best.name}`{stage} on {best.agreement:.2%} of "
                                 f"elements under the case's tolerance: {best.description}", best)
    if best is not None and best.agreement >= NEAR and best.agreement >= oracle_agreement + MARGIN:
        stage = f" (stage {best.stage})" if best.stage else ""
        return ("near a known mistake", f"nearest known mistake: {what} `{best.name}`{stage}, agreeing on "
                                        f"{best.agreement:.2%} of elements (the oracle on {oracle_agreement:.2%}): "
                                        f"{best.description}", best)
    nothing = ("nothing in the catalogue matches" + (f" (closest: `{best.name}` at {best.agreement:.1%}, the oracle "
                                                      f"{oracle_agreement:.1%})" if best else "")) if matches else \
        "no known mistakes to compare with"
    structural = [(a, f) for a in failing for f in a.findings if f.kind != "precision"]
    if swapped or structural:
        a, f = structural[0] if structural else (failing[0], None)
        text = swapped[0] if swapped else f"{a.name}: {f.text} ({f.agreement:.1%} of its region agree)"
        return "structure", f"{text}; {nothing}", None
    if all(any(f.kind == "precision" for f in a.findings) for a in failing):
        levels = sorted({a.level for a in failing})
        return "precision", (f"the error is rounding-like, spread over every axis, at the level of "
                             f"{' / '.join(levels)}; no known mistake explains it better than the oracle "
                             f"({nothing})"), None
    where = "; ".join(f"{a.name}: {a.location()}" for a in failing)
    return "unexplained", f"{nothing}; the error: {where}", None


def input_dependence(defn, hints, inputs, outputs, refs, tol, call, reference, redraw, progress=None):
    """For each input group: redraw only its inputs, run the implementation (``call``) and
    the oracle again, and say whether the error changed."""
    groups = input_groups(defn, hints)
    base_err = [(_f64(o) - _f64(r)) for o, r in zip(outputs, refs)]
    base_norm = math.sqrt(sum(float(e.pow(2).sum()) for e in base_err))
    fresh = redraw(1)
    found = []
    for g, members in groups.items():
        if progress:
            progress(f"input dependence: {g} drawn anew")
        changed = list(inputs)
        for name in members:
            k = defn.input_index(name)
            changed[k] = fresh[k]
        out = call(changed)
        if out is None:
            found.append(Dependence(g, list(members), False, math.nan, False,
                                    f"changing only the {g}: the implementation gave no outputs"))
            continue
        ref = reference(*changed)
        ref = ref if isinstance(ref, (tuple, list)) else (ref,)
        err = [(_f64(o) - _f64(r)) for o, r in zip(out, ref)]
        num = math.sqrt(sum(float((e - b).pow(2).sum()) for e, b in zip(err, base_err)))
        rel = num / base_norm if base_norm > 0 else (0.0 if num == 0 else math.inf)
        fails = not passes(out, ref, tol)
        changes = rel > 0.1
        text = (f"changing only the {g} ({', '.join(members[:4])}{', ...' if len(members) > 4 else ''}) "
                f"{'changes' if changes else 'leaves'} the error ({rel:.0%} relative change)"
                f"{'' if changes else ': it does not depend on them'}; the case then "
                f"{'still fails' if fails else 'passes'}")
        found.append(Dependence(g, list(members), changes, rel, fails, text))
    return found


def _f64(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().to("cpu", torch.float64)
    return torch.where(torch.isfinite(t), t, torch.zeros_like(t))
