"""Mutation self-test: the property suite rejects every mutant of the catalogue in the
``ci`` profile (so a weakened property fails CI), and every mutant follows the stage-tap
protocol and breaks exactly the stage it names (for fuseval.budget's tests)."""
from __future__ import annotations

import pytest
import torch

from fuseval import operators
from fuseval.check import compare
from fuseval.operators import load
from fuseval.errors import UnknownOperatorError
from fuseval.operators.implementations import resolve_impl
from fuseval.properties import check_implementation
from fuseval.operators import mutants
from fuseval.properties import strategies as S

# every registered operator that ships a mutant catalogue (the two benchmark operators
# and residual_rmsnorm); an operator without one has nothing to reject
OPS = [op for op in operators.names() if mutants.catalogue(op)]
ALL = [(op, m.name) for op in OPS for m in mutants.catalogue(op)]


@pytest.mark.parametrize("op", OPS)
def test_catalogue_shape(op):
    cat = mutants.catalogue(op)
    stages = load(op).stage_names
    # at least two bugs per stage, up to 12 (the benchmark operators have more)
    assert len(cat) >= min(12, 2 * len(stages))
    names = [m.name for m in cat]
    assert len(set(names)) == len(names)
    for m in cat:
        assert m.stage in stages and m.description
        assert m.fn.stage == m.stage and callable(m.fn.staged)
    # the catalogue covers the stages of the operator, not only one of them
    assert len({m.stage for m in cat}) >= min(5, len(stages))


def _first_differing_stage(op, mutant, inputs):
    ref = resolve_impl(load(op), "reference")
    want: dict = {}
    ref(*inputs, taps=want, dtype=torch.float32)
    got: dict = {}
    mutant.staged(*inputs, taps=got)
    for stage in load(op).stage_names:
        a, b = got[stage], want[stage]
        if a.shape != b.shape or not torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)):
            return stage, got
    return None, got


@pytest.mark.parametrize("op,name", ALL, ids=[f"{o}-{n}" for o, n in ALL])
def test_property_suite_rejects_mutant(op, name):
    """ci profile, no shrinking (the verdict is what matters here)."""
    m = mutants.get(op, name)
    report = check_implementation(op, m, profile="ci", shrink=False)
    assert not report.passed, f"mutant {name} survived the property suite:\n{report}"
    example = report.failures[0].example
    inputs = example.tensors()

    # the first stage whose tap differs from the float32 reference's is the one named
    stage, taps = _first_differing_stage(op, m, inputs)
    assert stage == m.stage, f"{name}: first differing stage {stage}, catalogue says {m.stage}"
    assert set(load(op).stage_names) <= set(taps)

    # overriding that stage with the oracle's output repairs the mutant
    defn = example.definition()
    oracle_taps: dict = {}
    oracle = resolve_impl(defn, "reference")(*inputs, taps=oracle_taps)
    repaired = m.staged(*inputs, override={m.stage: oracle_taps[m.stage]})
    for spec, o, r in zip(defn.outputs, repaired, oracle):
        metrics = compare(o, r, defn.tolerance, spec.name)
        assert metrics.passed, (name, metrics)


def test_mutant_outputs_have_definition_dtypes():
    for op in OPS:
        ex = S.explicit_examples(op)[0]
        defn = ex.definition()
        outs = mutants.catalogue(op)[0](*ex.tensors())
        assert [str(o.dtype).replace("torch.", "") for o in outs] == [s.dtype for s in defn.outputs]


def test_every_shipped_operator_has_a_catalogue():
    shipped = [op for op in operators.names() if operators.spec(op).package.startswith("fuseval.operators.")]
    assert shipped and set(shipped) <= set(OPS), f"shipped operators without mutants: {set(shipped) - set(OPS)}"


def test_unknown_mutant_and_operator():
    with pytest.raises(ValueError, match="has no mutant 'not_a_mutant'; known: .*causal_mask_off_by_one"):
        mutants.get("qwen2vl_decoder_layer", "not_a_mutant")
    with pytest.raises(UnknownOperatorError, match="unknown operator 'gemm'"):
        mutants.catalogue("gemm")
