"""The error budget over the fast paths (``implementation "fast"``, ``forward.staged``).

On the CPU the Triton kernels run in the interpreter (tests/conftest.py sets
TRITON_INTERPRET=1), on the scaled-down ``tiny`` configuration; with a GPU, the same
checks run on the ``small`` configuration, plus (marker ``gpu``) a few seed-size cases.
The fast modules are written concurrently; these tests skip, naming the import error,
only while they are not importable."""
from __future__ import annotations

import importlib

import pytest
import torch

from fuseval.budget import run_budget

OPS = ("qwen2vl_decoder_layer", "nvfp4_qkv_rope")
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
CONFIG = "small" if CUDA else "tiny"


def _fast(op: str):
    return importlib.import_module(f"fuseval.operators.{op}.fast")


@pytest.mark.parametrize("op", OPS)
def test_fast_path_is_within_budget_with_every_stage_tapped(op):
    module = _fast(op)
    assert callable(getattr(module.forward, "staged", None)), "the fast forward must carry .staged"
    r = run_budget(op, "fast", config=CONFIG, cases="0,5", device=DEVICE)
    assert r.staged
    for c in r.cases:
        assert all(s.local is not None and s.propagated is not None for s in c.stages), c.messages
    assert r.passed, r.to_markdown()


# fast-path mutants (each operator's ``fast.variant(mutant=name)``, names from ``fast.MUTANTS``)
# and the stage each breaks. eps_outside_sqrt runs under precision "ieee": under the default
# TF32 policy the norm output is stored TF32-rounded (10-bit mantissa), and a misplaced eps (a
# relative change of about 5e-7) is far below that precision, so no budget can attribute it to
# the norm stage.
FAST_A_MUTANTS = [("noncausal_attention", "tf32", "attention"), ("kv_head_mod", "tf32", "attention"),
                  ("mrope_wrong_axis", "tf32", "mrope"), ("missing_residual", "tf32", "o_proj"),
                  ("missing_final_residual", "tf32", "residual"), ("silu_on_up", "tf32", "act"),
                  ("eps_outside_sqrt", "ieee", "input_norm")]


def test_the_mutant_tables_name_known_mutants():
    """Both operators' catalogues are dicts name -> what it breaks; the tables here use them."""
    for op in OPS:
        module = _fast(op)
        assert isinstance(module.MUTANTS, dict) and all(isinstance(v, str) and v for v in module.MUTANTS.values())
        with pytest.raises(ValueError, match="mutant"):
            module.variant(mutant="no_such_bug")
    assert {m for m, _, _ in FAST_A_MUTANTS} <= set(_fast("qwen2vl_decoder_layer").MUTANTS)
    assert "rope_halves_swapped" in _fast("nvfp4_qkv_rope").MUTANTS


@pytest.mark.parametrize("mutant, precision, stage", FAST_A_MUTANTS)
def test_fast_mutants_of_op_a_are_localized(mutant, precision, stage):
    module = _fast("qwen2vl_decoder_layer")
    impl = module.variant(mutant=mutant, precision=precision)
    r = run_budget("qwen2vl_decoder_layer", impl, config=CONFIG, cases="5", device=DEVICE, baselines=False)
    assert r.first_over_budget == stage, r.to_markdown()


def test_fast_production_only_mutant_of_op_b_fails_end_to_end():
    """Op B's planted bugs live in the fused production kernel only; its variant's staged
    path is the production arithmetic, so the stages pass and the final verdict (and the
    staged/forward disagreement note) catches them."""
    module = _fast("nvfp4_qkv_rope")
    broken = module.variant(mutant="rope_halves_swapped")
    r = run_budget("nvfp4_qkv_rope", broken, config=CONFIG, cases="5", device=DEVICE, baselines=False)
    c = r.cases[0]
    assert all(s.passed for s in c.stages) and c.first_over_budget == "end_to_end"
    assert any("disagree" in m for m in c.messages)


# Op A's TF32 path (weights truncated to TF32) is close to its end-to-end allowance (2 x the
# naive's max abs + 4 ulp) on case 0, measured on an H200 on 2026-12-01: its max abs error
# 6.91e-3 was 105% of the allowance on inputs drawn on the CPU and is 99% on the inputs drawn on
# the GPU, which the budget uses since issue 20 (the naive's error moves with the draw). The
# margin is thin; issue 16's fp16 policy (max abs 3-3.8e-3) is the way to widen it.
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("op", OPS)
def test_fast_path_within_budget_at_seed_size(op):
    _fast(op)
    r = run_budget(op, "fast", config="seed", cases="0,11", device="cuda")
    assert r.passed, r.to_markdown()
