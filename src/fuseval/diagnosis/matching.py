"""The nearest known mistake: the operator's mutants (and, for imported problems, generic
mistakes) run on the case's inputs, ranked by how well each agrees with the failing output.

A mutant is the oracle with one stage replaced (:mod:`fuseval.operators.mutants`). The
stages before a mutant's ``stage`` are exactly the unmutated pipeline's, so they run once,
in float32, and every mutant continues from their taps (the stage-tap protocol's
``override``): a mutant costs the part of the pipeline from its own stage on.

Agreement is the tolerance's own measure with the mutant in the oracle's place: the share
of all output elements where |out - mutant| <= atol + rtol*|mutant|. A mutant whose output
itself passes against the oracle on these inputs cannot be told apart from a correct
implementation here (``visible`` False): it is listed, never named.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from .anatomy import agreement, failing_mask
from ..definitions import Definition
from ..operators.implementations import resolve_impl
from ..operators.mutants import catalogue as read_catalogue

__all__ = ["MutantMatch", "rank_mutants", "agreement_all", "passes"]


@dataclass
class MutantMatch:
    name: str
    stage: str                # the first stage it changes ("" for a generic mistake)
    description: str
    agreement: float          # share of all output elements agreeing under the case's tolerance
    per_output: dict[str, float]
    rel_l2: float             # ||out - mutant|| / ||mutant|| over all outputs (ties broken by it)
    visible: bool             # the mutant's own output fails against the oracle on these inputs
    kind: str = "mutant"      # "mutant" (the operator's catalogue) or "generic"
    seconds: float = 0.0
    error: str | None = None  # the mutant could not run on these inputs


def _finite64(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().to("cpu", torch.float64)
    return torch.where(torch.isfinite(t), t, torch.zeros_like(t))


def agreement_all(outputs: Sequence[torch.Tensor], models: Sequence[torch.Tensor], tol, names) -> tuple[float, dict, float]:
    """(overall agreement, per output, relative L2 distance) of ``outputs`` against ``models``."""
    per, ok, total, num, den = {}, 0.0, 0, 0.0, 0.0
    for o, m, n in zip(outputs, models, names):
        a = agreement(o.detach().cpu(), m.detach().cpu(), tol)
        per[n] = a
        ok += a * o.numel()
        total += o.numel()
        of, mf = _finite64(o), _finite64(m)
        num += float((of - mf).pow(2).sum())
        den += float(mf.pow(2).sum())
    return (ok / total if total else 1.0), per, (num ** 0.5) / (den ** 0.5) if den > 0 else float(num > 0)


def passes(outputs, refs, tol) -> bool:
    """Whether ``outputs`` pass against ``refs`` on every output (matched ratio, finite)."""
    for o, r in zip(outputs, refs):
        bad = failing_mask(o.detach().cpu(), r.detach().cpu(), tol)
        if bad.numel() and float(bad.double().mean()) > 1 - tol.min_matched_ratio:
            return False
        if not bool(torch.isfinite(o).all()) and bool(torch.isfinite(r).all()):
            return False
    return True


def _prefix_taps(defn: Definition, inputs) -> tuple[dict, list[str]]:
    """The unmutated pipeline's stage taps in float32 (the mutants' own reference: the
    operator under the variant in force, which its catalogue is built on), and the
    definition's stage order."""
    defn = defn.operator.load()
    taps: dict = {}
    ref = resolve_impl(defn, "reference")
    ref(*inputs, taps=taps, override={}, dtype=torch.float32, validate=False)
    return taps, defn.stage_names


def rank_mutants(defn: Definition, inputs: Sequence[Any], outputs: Sequence[torch.Tensor], refs: Sequence[torch.Tensor],
                 tol, output_names: Sequence[str], *, catalogue: Sequence | None = None,
                 progress: Callable[[str], None] | None = None) -> list[MutantMatch]:
    """Every mutant of ``defn``'s catalogue on ``inputs``, ranked (best first, visible first)."""
    mutants = list(read_catalogue(defn) if catalogue is None else catalogue)
    if not mutants:
        return []
    taps, order = _prefix_taps(defn, inputs)
    found = []
    for k, m in enumerate(mutants):
        if progress:
            progress(f"mutant {k + 1}/{len(mutants)}: {m.name}")
        t0 = time.perf_counter()
        before = order[:order.index(m.stage)] if m.stage in order else []
        override = {s: taps[s] for s in before if s in taps}
        try:
            with torch.no_grad():
                produced = m.fn.staged(*inputs, override=override)
        except Exception as exc:  # noqa: BLE001 - a mutant that cannot run here is reported, not fatal
            found.append(MutantMatch(m.name, m.stage, m.description, 0.0, {}, float("inf"), False,
                                     error=f"{type(exc).__name__}: {exc}"[:200]))
            continue
        a, per, l2 = agreement_all(outputs, produced, tol, output_names)
        visible = not passes(produced, refs, tol)
        found.append(MutantMatch(m.name, m.stage, m.description, a, per, l2, visible,
                                 seconds=time.perf_counter() - t0))
    return sort_matches(found)


def sort_matches(found: list[MutantMatch]) -> list[MutantMatch]:
    return sorted(found, key=lambda x: (not x.visible, x.error is not None, -x.agreement, x.rel_l2))


def rank_of(matches: Sequence[MutantMatch], name: str) -> int | None:
    """1-based rank of mutant ``name``; mutants agreeing exactly as well (same agreement and
    distance) share the best rank of their tie."""
    target = next((m for m in matches if m.name == name), None)
    if target is None:
        return None
    better = [m for m in matches if m.visible and m.error is None and
              (m.agreement > target.agreement + 1e-12 or
               (abs(m.agreement - target.agreement) <= 1e-12 and m.rel_l2 < target.rel_l2 - 1e-12))]
    return len(better) + 1


__all__ += ["rank_of", "sort_matches"]
