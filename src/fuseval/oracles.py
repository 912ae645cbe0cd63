"""The oracles a check runs beside the implementation, and what they say about themselves.

* :func:`side_oracles`: the benchmark's own reference as the predictor of its verdict, and
  as the witness of a blind output (does the benchmark's reference show the same?);
* :func:`oracle_note`: why the calls of an oracle were not the float64 oracle they claim
  to be (an imported problem's reference that could not be lifted);
* :func:`reference_refusal`: why 'reference' is not an implementation to check.
"""
from __future__ import annotations

from typing import Any, Callable

from .definitions import Definition

__all__ = ["SOL_REFERENCE", "side_oracles", "oracle_note", "reference_refusal"]

# what the benchmark compares against: the implementation name of its reference
SOL_REFERENCE = "sol_reference"


def side_oracles(operator: Any, impl: Any, against: str, rules: str, predict: bool,
                 blind_witness: bool) -> tuple[Callable | None, Callable | None]:
    """(the predictor, the blind witness): the benchmark's reference where the operator
    has one, the predictor only when asked for (``predict``) and not already what the
    check is (the implementation, or the comparison under the benchmark's rules), the
    witness only when asked for (``blind_witness``)."""
    has = SOL_REFERENCE in operator.definition.implementations
    predictor = operator.implementation(SOL_REFERENCE) \
        if predict and has and impl != SOL_REFERENCE and (against, rules) != (SOL_REFERENCE, "sol") else None
    witness = operator.implementation(SOL_REFERENCE) if blind_witness and has else None
    return predictor, witness


def oracle_note(reference: Callable) -> str | None:
    """Why the calls of ``reference`` since the last question were not the oracle they claim
    to be, and forget it: an oracle says so in its ``oracle_notes`` (an imported problem's
    reference that could not be lifted to float64 appends the lift's reason per call; the
    comparison was then against the reference in its own precision). None: nothing said."""
    notes = getattr(reference, "oracle_notes", None)
    if not notes:
        return None
    said = "; ".join(dict.fromkeys(notes))
    notes.clear()
    return said


def reference_refusal(defn: Definition) -> str:
    """Why 'reference' is not an implementation to check, naming the ones that are."""
    others = [name for name in defn.implementations if name != "reference"]
    return ("'reference' is the float64 oracle itself (its outputs are float64, unrounded); check another "
            f"of {defn.name}'s implementations ({', '.join(others) or 'none'}) or 'module:function'")
