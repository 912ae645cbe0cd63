"""Named semantic variants: the benchmark's semantics are the default; the model's own
(HF Qwen2-VL's mRoPE layout for op A, weight-only NVFP4 for op B) are variants that every
component honours through one switch."""
from __future__ import annotations

import pytest

from fuseval.check import check
from fuseval.cli import main
from fuseval.definitions import DEFAULT_VARIANT
from fuseval.operators import load, variant_scope
from fuseval.errors import EXIT_CHECK_FAILED, EXIT_OK, EXIT_USAGE
from fuseval.operators.implementations import resolve_impl
from fuseval.operators.nvfp4_qkv_rope import reference as op_b
from fuseval.operators.qwen2vl_decoder_layer import reference as op_a

OP_A, OP_B = "qwen2vl_decoder_layer", "nvfp4_qkv_rope"
VARIANT_IMPL = {OP_A: ("hf_mrope", op_a.torch_eager_hf_mrope), OP_B: ("w4a16", op_b.torch_eager_w4a16)}


def test_the_default_is_the_benchmark_and_variants_are_data():
    for op, (variant, _) in VARIANT_IMPL.items():
        d = load(op)
        assert d.variant == DEFAULT_VARIANT == "sol" and d.variant_names == ["sol", variant]
        v = load(op, variant=variant)
        assert v.variant == variant and v.implementations["reference"] != d.implementations["reference"]
    assert "act_quant" in load(OP_B).stage_names
    assert "act_quant" not in load(OP_B, variant="w4a16").stage_names


def test_unknown_variant_is_named():
    with pytest.raises(ValueError, match=r"unknown variant 'hf'.*sol, hf_mrope"):
        load(OP_A, variant="hf")


def test_variant_scope_reaches_loads_by_name_and_ends_with_the_block():
    with variant_scope({OP_A: "hf_mrope"}):
        assert load(OP_A, "small").variant == "hf_mrope"
        assert resolve_impl(load(OP_A), "reference").keywords == {"mrope_layout": "hf"}
        assert load(OP_B).variant == "sol"
    assert load(OP_A).variant == "sol"


@pytest.mark.parametrize("op", [OP_A, OP_B])
def test_full_size_case_0_the_models_semantics_fail_the_default_and_pass_their_variant(op):
    """SPEC acceptance (CPU, seed config, case 0): an implementation of the model's
    semantics fails the benchmark's check and passes under its own variant."""
    variant, impl = VARIANT_IMPL[op]
    kw = dict(config="seed", cases="0", hygiene=False, predict=False)
    default = check(op, impl, **kw)
    assert not default.passed and "tolerance" in default.cases[0].violations
    assert max(1 - m.matched_ratio for m in default.cases[0].outputs) > 0.2
    own = check(op, impl, variant=variant, **kw)
    assert own.passed and own.variant == variant, [c.messages for c in own.cases]


def test_cli_variant_switch_and_its_usage_error(capsys):
    args = ["check", "--op", OP_A, "--cases", "0", "--no-hygiene"]
    assert main(args + ["--impl", "fuseval.operators.qwen2vl_decoder_layer.reference:torch_eager_hf_mrope"]) \
        == EXIT_CHECK_FAILED
    assert main(args + ["--impl", "torch", "--variant", "hf_mrope"]) == EXIT_OK
    assert "variant=hf_mrope" in capsys.readouterr().out
    assert main(args + ["--impl", "torch", "--variant", "w4a16"]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "w4a16" in err[0] and "hf_mrope" in err[0] and "Traceback" not in err[0]


def test_check_against_sol_reference_under_the_sol_rules(capsys):
    """The benchmark's reference passes the float64 oracle, and the torch path is predicted
    to pass the benchmark; the report shows both verdicts."""
    report = check(OP_B, "sol_reference", cases="0-3", hygiene=False)
    assert report.passed and report.predicted_passed is None       # itself: nothing to predict
    report = check(OP_B, "torch", cases="0-3", hygiene=False)
    assert report.passed and report.predicted_passed is True
    assert all(c.predicted.outputs[0].matched_ratio > 0.99 for c in report.cases)
    sol = check(OP_B, "torch", cases="0-3", hygiene=False, against="sol_reference", rules="sol")
    assert sol.passed and sol.against == "sol_reference" and sol.rules == "sol"
    assert main(["check", "--op", OP_B, "--impl", "torch", "--cases", "0", "--no-hygiene"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "bench verdict" in out and "the benchmark would pass 1/1 (predicted)" in out
