"""Localization: every single-stage mutant of the property catalogue (each exposes stage
taps) is named by the budget as the first stage over budget, at its own stage.

A mutant is run in benchmark mode and, when that leaves it within budget, in realistic
mode (benchmark inputs hide some bugs: norm weights are all ones, fp8 scales are never
NaN; realistic inputs hide others: one rope table for every batch item). Whenever the
report flags anything, the first stage over budget must be the mutant's own stage (or
the group it belongs to). A mutant whose outputs equal the correct float32 pipeline's
on both input sets cannot be flagged by any budget and is skipped, naming the reason.
"""
from __future__ import annotations

import pytest
import torch

from fuseval import operators
from fuseval.budget import run_budget
from fuseval.operators import load
from fuseval.inputs import generate_inputs
from fuseval.operators.implementations import resolve_impl
from fuseval.operators.mutants import catalogue

OPS = [op for op in operators.names() if catalogue(op)]
# per operator, two cases of the small config: several batch items with a short sequence
# (bugs that mix up batch items), one item with a long sequence
CASES = {"qwen2vl_decoder_layer": "4,12", "nvfp4_qkv_rope": "2,12"}   # others: cases 0 and 5
MODES = ("benchmark", "realistic")


def _mutants():
    return [pytest.param(m, id=f"{m.op}-{m.name}") for op in OPS for m in catalogue(op)]


def _visible(m, mode: str) -> bool:
    """Do the mutant's outputs differ from the correct float32 pipeline's on these cases?"""
    defn = load(m.op, "small")
    good = resolve_impl(defn, "reference_fp32")
    for case in defn.cases(CASES.get(m.op, "0,5")):
        inputs = generate_inputs(defn, case.axes, seed=case.index, mode=mode)
        for a, b in zip(m.fn(*inputs), good(*inputs)):
            if not torch.equal(a.float().nan_to_num(7.0), b.float().nan_to_num(7.0)):
                return True
    return False


@pytest.mark.parametrize("mutant", _mutants())
def test_catalogue_mutant_is_localized_to_its_stage(mutant):
    assert callable(mutant.fn.staged), f"{mutant.name} exposes no stage taps"
    defn = load(mutant.op)
    own = {mutant.stage} | {s.parent for s in defn.stages if s.name == mutant.stage and s.parent}
    flagged = []
    for mode in MODES:
        r = run_budget(mutant.op, mutant.fn, config="small", cases=CASES.get(mutant.op, "0,5"), mode=mode, baselines=False)
        if r.first_over_budget is not None:
            assert r.first_over_budget in own, (
                f"{mutant.name} breaks {mutant.stage}, but the budget ({mode} inputs) names "
                f"{r.first_over_budget} first: {r.first_over_budget_by_case}")
            flagged.append(mode)
            break
    if not flagged:
        if not any(_visible(mutant, mode) for mode in MODES):
            pytest.skip(f"{mutant.name}: outputs identical to the correct pipeline on benchmark and realistic "
                        "inputs (needs special inputs), so no error budget can see it")
        pytest.fail(f"{mutant.name} changes the outputs but no stage is over budget")
