"""The fast-vs-reference property (fuseval.properties.check_implementation) on every
implementation of each operator, its failure reports and their reproduction commands.

``fast`` runs in the Triton interpreter on the CPU (tests/conftest.py sets
TRITON_INTERPRET=1 without a GPU). The ``gpu`` tests run the ``gpu`` profile (full-size
axes) on CUDA."""
from __future__ import annotations

import shlex

import pytest
import torch

from fuseval.properties import check_implementation, profiles
from fuseval.operators import mutants
from fuseval.properties import strategies as S
from fuseval.cli import main as cli_main
from fuseval.properties.fast_vs_reference import _metamorphic, evaluate, tight_bound


OP_A, OP_B = "qwen2vl_decoder_layer", "nvfp4_qkv_rope"


def reproduce_main(argv) -> int:
    """The reproduce command a property failure prints (``fuseval property ARGS``), run."""
    return cli_main(["property", *argv])


def _cpu_profile() -> str:
    name = profiles.active_profile()
    return name if name in ("ci", "dev", "thorough") else "ci"


IMPLS = [(OP_A, "reference_fp32"), (OP_A, "torch"), (OP_A, "torch_tf32"), (OP_A, "fast"),
         (OP_B, "reference_fp32"), (OP_B, "torch"), (OP_B, "torch_cached"), (OP_B, "fast")]


@pytest.mark.parametrize("op,impl", IMPLS, ids=[f"{o}-{i}" for o, i in IMPLS])
def test_implementation_satisfies_properties(op, impl):
    """tolerance rule on every drawn example, tight bound on well-conditioned ones,
    batch / causal / NaN-poisoning invariants: the correct implementations pass (the gpu
    test below runs the same on CUDA with full-size axes)."""
    report = check_implementation(op, impl, profile=_cpu_profile(), device="cpu")
    assert report.passed, str(report)
    assert report.examples_run >= len(S.explicit_examples(op))


def _stale_cache_impl():
    """A mutant of the torch_cached baseline: bf16 weights cached per packed-weight tensor
    object only, so a call with the same packed tensor but a changed scale tensor reuses
    stale weights (the bug torch_cached once had)."""
    from fuseval.operators.nvfp4_qkv_rope import reference as ref_b
    cache = {}

    def impl(x, cos, sin, qw, qs, qg, kw, ks, kg, vw, vs, vg, qn, kn, eps):
        ws = []
        for packed, scale, gs in ((qw, qs, qg), (kw, ks, kg), (vw, vs, vg)):
            key = id(packed)
            if key not in cache:
                cache[key] = (packed, ref_b.dequantize_torch(packed, scale, 1.0))
            ws.append((cache[key][1], gs))
        return ref_b._project_norm_rope(x, cos, sin, ws, qn, kn, float(eps))
    return impl


def test_stale_weight_cache_is_caught_by_the_nan_scale_property():
    """The NaN-scale metamorphic property calls the implementation again with the same
    packed weights and a poisoned scale tensor: a cache keyed on the packed tensor alone
    returns the stale answer and is rejected (torch_cached, keyed on weight, scale and their
    version counters, passes the same property above)."""
    report = check_implementation(OP_B, _stale_cache_impl(), profile="ci", shrink=False, max_examples=2)
    assert not report.passed and report.failures[0].property == "metamorphic"
    assert "NaN scale code" in report.failures[0].messages[0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("op,impl", IMPLS, ids=[f"{o}-{i}" for o, i in IMPLS])
def test_implementation_satisfies_properties_gpu(op, impl):
    """The gpu profile: full-size const axes, CUDA, fewer var-axis values."""
    report = check_implementation(op, impl, profile="gpu")
    assert report.passed, str(report)


def test_failure_report_has_reproduction_info_and_shrinks():
    """A failing implementation is reported with its axis binding, input mode, seed and a
    command; shrinking leaves a small example; the command reproduces the failure."""
    m = mutants.get(OP_A, "causal_mask_off_by_one")
    report = check_implementation(OP_A, m, profile="ci", explicit=False, metamorphic=False)
    assert not report.passed
    (failure,) = report.failures
    text = str(report)
    for needle in ("axis binding:", "input mode:", "seed:", "reproduce: fuseval property",
                   "--seed", "closest fuseval check: fuseval check --op qwen2vl_decoder_layer"):
        assert needle in text, text
    axes = failure.example.binding.axes
    assert axes["batch_size"] == 1 and axes["seq_len"] == 2, failure.example   # minimal: one future key
    assert failure.example.seed == 0
    argv = shlex.split(failure.command)[2:]
    assert argv[argv.index("--impl") + 1] == "mutant:causal_mask_off_by_one"
    assert reproduce_main(argv) == 1
    argv[argv.index("--impl") + 1] = "torch"
    assert reproduce_main(argv) == 0


def test_reproduce_command_for_adversarial_custom_config(capsys):
    ex = S.explicit_examples(OP_B)[5]                  # every code, special + NaN scales
    cmd = ex.command("mutant:nan_scale_decoded_as_zero")
    assert "--recipe" in cmd and "--config" in cmd
    assert reproduce_main(shlex.split(cmd)[2:]) == 1
    assert "FAILED" in capsys.readouterr().out
    assert reproduce_main(shlex.split(ex.command("reference_fp32"))[2:]) == 0


def test_tight_bound_catches_what_the_rule_lets_through():
    """op B's rule allows 2% relative error per element: value_states scaled by 1.018 passes
    it on a benchmark draw, but not the tight normwise bound (2^-6 relative L2)."""
    from fuseval.operators.nvfp4_qkv_rope import reference as ref_b

    def v_scaled(*inputs):
        q, k, v = ref_b.reference_fp32(*inputs)
        return q, k, (v.float() * 1.018).to(torch.bfloat16)
    ex = S.explicit_examples(OP_B)[0]
    verdict, messages, _ = evaluate(ex, v_scaled)
    assert verdict == "tight_bound", messages
    assert evaluate(ex, v_scaled, tight=False)[0] is None
    # op A: twice the TF32 chopping error 2^-10 (4 unit roundoffs of tf32); op B: 4 u(bf16)
    assert tight_bound(OP_A) == 2 * 2.0 ** -10 and tight_bound(OP_B) == 4 * 2.0 ** -8
    assert tight_bound(OP_B, "fp32") == 4 * 2.0 ** -24 == tight_bound(OP_B, "float32")
    with pytest.raises(ValueError, match="precision"):
        tight_bound(OP_A, "int8")
    with pytest.raises(ValueError, match="precision"):
        check_implementation(OP_A, "torch", precision="int8")


@pytest.mark.parametrize("op,name", [(OP_A, "rope_tables_of_first_batch_item"),
                                     (OP_B, "nan_scale_decoded_as_zero"), (OP_A, "causal_mask_off_by_one")])
def test_metamorphic_invariants_catch(op, name):
    ex = S.explicit_examples(op)[0]
    problems = _metamorphic(ex, mutants.get(op, name), torch.device("cpu"))
    assert problems, name
    assert not _metamorphic(ex, _reference_fp32(op), torch.device("cpu"))


def _reference_fp32(op):
    from fuseval.operators import load
    from fuseval.operators.implementations import resolve_impl
    return resolve_impl(load(op), "reference_fp32")


def test_accepts_callables_and_module_paths():
    r1 = check_implementation(OP_B, "fuseval.operators.nvfp4_qkv_rope.reference:reference_fp32", max_examples=2,
                              metamorphic=False)
    r2 = check_implementation(OP_B, _reference_fp32(OP_B), max_examples=2, metamorphic=False)
    assert r1.passed and r2.passed
    assert r1.to_dict()["passed"] and "reference_fp32" in r2.impl


def test_implementation_that_raises_is_a_failure():
    def broken(*inputs):
        raise RuntimeError("kernel launch failed")
    report = check_implementation(OP_A, broken, profile="ci", shrink=False)
    assert not report.passed and "raised" in " ".join(report.failures[0].messages)



# --------------------------------------------------------------------------- the operator it is given
def test_a_definition_under_a_variant_is_checked_under_that_variant():
    """A Definition carries its variant into the run: the W4A16 variant's own torch baseline
    passes when given that Definition, and fails the benchmark's W4A4 semantics (the name)."""
    from fuseval.operators import load, resolve
    w4a16 = load(OP_B, variant="w4a16")
    impl = resolve(w4a16.implementations["torch"])
    options = dict(profile="ci", device="cpu", max_examples=2, metamorphic=False, shrink=False)
    under_variant = check_implementation(w4a16, impl, **options)
    assert under_variant.passed, str(under_variant)
    assert not check_implementation(OP_B, impl, **options).passed


def test_the_engine_given_a_record_looks_no_name_up(monkeypatch):
    """Given the operator's record (or a Definition), the strategies, the bindings they make
    and the examples' inputs never go back to the registry; a name resolves once."""
    from fuseval import operators
    from fuseval.properties import hooks
    record = operators.record(OP_A)
    by_name = S.explicit_examples(OP_A)
    looked_up = []
    monkeypatch.setattr(hooks, "load", lambda *a, **k: looked_up.append(a) or operators.load(*a, **k))
    for op in (record, record.definition):
        examples = S.explicit_examples(op)
        assert examples == by_name and all(e.binding.operator is record for e in examples)
        assert examples[0].binding.definition().const_axes == examples[0].binding.config
        assert S.named_config(op, record.definition.with_config("small").const_axes) == "small"
        assert len(examples[0].tensors()) == len(record.definition.inputs)
    assert looked_up == []
    S.explicit_examples(OP_A)
    assert looked_up == [(OP_A,)]
