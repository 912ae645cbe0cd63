"""The property engine without operator names: it reads every operator fact through
``fuseval.operators.spec(name)`` (PropertyHooks, the mutant catalogue), so an operator with
neither gets the generic strategies and properties, never a KeyError; and no file of
fuseval/properties names an operator, one of its inputs or one of its stages in its code."""
from __future__ import annotations

import ast
import dataclasses
import io
import pathlib
import re
import tokenize

import hookless_operator as toy
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hst

from fuseval import definitions, operators
from fuseval.properties import check_implementation, has_tight_bound, tight_bound
from fuseval.operators import mutants
from fuseval.properties import strategies as S
from fuseval.properties.fast_vs_reference import _metamorphic
from fuseval.properties.hooks import PropertyHooks, RecipeFeature, hooks_of

ENGINE = pathlib.Path(__file__).resolve().parents[2] / "src" / "fuseval" / "properties"


# --------------------------------------------------------------------------- no names in the engine
def _code_words(text: str) -> list[tuple[int, str]]:
    """(line, word) of every identifier and every identifier-like word of a string literal
    in ``text``'s code; docstrings and comments are left out (examples in docs may name
    an operator)."""
    docstrings = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                docstrings.add(body[0].lineno)
    words = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.NAME:
            words.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING and tok.start[0] not in docstrings:
            words += [(tok.start[0], w) for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", tok.string)]
        elif getattr(tokenize, "FSTRING_MIDDLE", None) == tok.type:
            words += [(tok.start[0], w) for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", tok.string)]
    return words


def _operator_words() -> dict[str, str]:
    """word -> what it is, for every registered operator: its name, its inputs' and its
    stages' names (every variant's stages included)."""
    found = {}
    # the operators of packages, not the problem folders other tests of this process imported
    shipped = [n for n, s in operators.registry().items() if not s.package.startswith("fuseval.interop.problems.")]
    for op in shipped:
        defn = operators.load(op)
        found[op] = f"operator {op}"
        for spec in defn.inputs:
            found.setdefault(spec.name, f"an input of {op}")
        for stage in defn.stage_names:
            found.setdefault(stage, f"a stage of {op}")
    return found


@pytest.mark.parametrize("path", sorted(ENGINE.glob("*.py")), ids=lambda p: p.name)
def test_the_property_engine_names_no_operator_input_or_stage(path):
    forbidden = _operator_words()
    named = [(line, word, forbidden[word]) for line, word in _code_words(path.read_text()) if word in forbidden]
    assert not named, (f"fuseval/properties/{path.name} names {named} in its code: operator facts belong in "
                       f"the operator's package (PropertyHooks, its mutant catalogue)")


def test_the_name_scan_sees_names_in_code_not_in_docs():
    text = ('"""the docs may say hidden_states"""\n# so may comments: rope_cos\n'
            'def f(values):\n    """nor here: mrope"""\n    return values["hidden_states"], rope_cos, f"{act_quant}x"\n')
    words = {w for _, w in _code_words(text)}
    assert {"hidden_states", "rope_cos", "act_quant"} <= words and "mrope" not in words
    assert {"hidden_states", "rope_cos", "mrope", "act_quant"} <= set(_operator_words())


# --------------------------------------------------------------------------- an operator without hooks
@pytest.fixture
def hookless():
    """The test operator registered for one test (and its cached definition dropped after)."""
    registry = operators.registry()
    assert toy.NAME not in registry
    registry[toy.NAME] = toy.SPEC
    yield toy.NAME
    registry.pop(toy.NAME, None)
    operators._CACHE.pop(toy.NAME, None)


def test_an_operator_without_hooks_gets_the_defaults_and_no_mutants(hookless):
    assert hooks_of(operators.load(hookless)) == PropertyHooks()
    assert mutants.catalogue(hookless) == []
    with pytest.raises(ValueError, match="has no mutant 'anything'"):
        mutants.get(hookless, "anything")
    assert not has_tight_bound(hookless)
    with pytest.raises(ValueError, match="no tight bound"):
        tight_bound(hookless)
    with pytest.raises(ValueError, match="no tight bound"):
        check_implementation(hookless, "torch", precision="fp32")
    # the generic features its inputs allow: x is the activation (the first float input
    # shaped [batch, ...]); it has no eps input and no rotary tables named by hooks
    assert S.recipe_features(hookless) == ["magnitude", "zero_rows", "noncontiguous", "norm_weights"]


def test_generic_bindings_come_from_the_definition(hookless):
    seen = []

    @settings(max_examples=60, database=None, derandomize=True, deadline=None)
    @given(S.axis_bindings(hookless))
    def draw(b):
        seen.append(b)
    draw()
    small = operators.load(hookless, "small").const_axes
    assert all(b.config == small for b in seen)                     # the small configuration
    assert {b.axes["batch_size"] for b in seen} == {1, 2, 3}          # the space's batch range
    assert min(b.axes["seq_len"] for b in seen) == 1 and max(b.axes["seq_len"] for b in seen) > 6
    full = S.explicit_examples(hookless, "full")
    assert [e.binding.axes for e in full[:3]] == [{"batch_size": 2, "seq_len": 131}] * 2 + \
        [{"batch_size": 1, "seq_len": 64}]
    assert full[0].binding.config == operators.load(hookless).const_axes
    explicit = S.explicit_examples(hookless)
    assert [e.mode for e in explicit] == ["benchmark", "realistic", "benchmark", "adversarial", "adversarial"]
    assert explicit[4].recipe == S.Recipe(magnitude="mixed", noncontiguous=True, norm_weights="random")


def test_generic_adversarial_features_act_on_the_activation(hookless):
    b = S.explicit_examples(hookless)[0].binding
    plain = S.make_inputs(b, "benchmark", 3)
    tiny = S.make_inputs(b, "adversarial", 3, S.Recipe(magnitude="tiny"))
    assert torch.equal(tiny[0], plain[0] * 2.0 ** -10)               # the default tiny exponent
    assert torch.equal(tiny[1], plain[1])                            # residual: not the activation
    zeroed = S.make_inputs(b, "adversarial", 3, S.Recipe(zero_rows=2))[0]
    assert int((zeroed.abs().amax(-1) == 0).sum()) == 2
    weights = S.make_inputs(b, "adversarial", 3, S.Recipe(norm_weights="random"))[2]
    assert not torch.equal(weights, plain[2])
    strided = S.make_inputs(b, "adversarial", 3, S.Recipe(noncontiguous=True))
    assert all(torch.equal(p, q) and not q.is_contiguous() for p, q in zip(plain[:3], strided[:3]))
    with pytest.raises(ValueError, match=r"\['eps'\] do not apply to hookless_residual_rms_norm"):
        S.make_inputs(b, "adversarial", 3, S.Recipe(eps=0.5))


def test_the_generic_properties_pass_a_correct_and_reject_a_broken_implementation(hookless):
    report = check_implementation(hookless, "torch", max_examples=4)
    assert report.passed, str(report)
    assert report.properties == ["tolerance", "metamorphic"]
    assert report.examples_run >= len(S.explicit_examples(hookless))

    def residual_dropped(x, residual, norm_weight, eps):
        return toy.torch_impl(x, torch.zeros_like(residual), norm_weight, eps)
    report = check_implementation(hookless, residual_dropped, max_examples=4, shrink=False)
    assert not report.passed and report.failures[0].property == "tolerance"


def test_generic_batch_independence_catches_items_mixed(hookless):
    def reads_item_0(x, residual, norm_weight, eps):
        (out,) = toy.torch_impl(x, residual, norm_weight, eps)
        return (out + 0.1 * x[:1],)               # every item reads item 0: alone, item 1 is its own item 0
    ex = S.explicit_examples(hookless)[0]          # batch 2
    problems = _metamorphic(ex, reads_item_0, torch.device("cpu"))
    assert problems and problems[0].startswith("batch items independent")
    assert not _metamorphic(ex, toy.torch_impl, torch.device("cpu"))


# --------------------------------------------------------------------------- the hooks' own checks
def test_hooks_that_name_something_else_are_a_type_error(hookless):
    operators.registry()[hookless] = dataclasses.replace(toy.SPEC, properties=".:torch_impl")
    with pytest.raises(TypeError, match="expected a fuseval.properties.hooks.PropertyHooks"):
        hooks_of(operators.load(hookless))


def test_hooks_reject_inconsistent_fields():
    with pytest.raises(ValueError, match="need an 'adversarial' hook"):
        PropertyHooks(recipe_features={"codes": RecipeFeature("plain", hst.just("plain"))})
    with pytest.raises(ValueError, match="generic recipe fields"):
        PropertyHooks(recipe_features={"magnitude": RecipeFeature("unit", hst.just("unit"))},
                      adversarial=lambda values, recipe, seed, defn: None)
    with pytest.raises(ValueError, match="expected two"):
        PropertyHooks(explicit_bindings=(({}, {}),))


def test_batch_independence_runs_the_first_middle_and_last_items_alone(hookless):
    """A call per item alone would cost a call per element on a problem whose only axis is
    the batch axis (L1/084, 16M elements: the gate ran out of time); the ends, where a
    tiling leaves its partial block, are always among the items run."""
    from fuseval.properties.invariants import InvariantViolation, batch_independence, items_alone
    assert items_alone(1) == [0] and items_alone(2) == [0, 1] and items_alone(3) == [0, 1, 2]
    assert items_alone(4) == [0, 2, 3] and items_alone(10) == [0, 5, 9]
    assert items_alone(16_777_216) == [0, 8_388_608, 16_777_215]
    x, residual, weight, eps = S.explicit_examples(hookless)[0].tensors()
    gen = torch.Generator().manual_seed(0)
    batch = [torch.randn(9, *x.shape[1:], generator=gen, dtype=x.dtype), None, weight, eps]
    batch[1] = torch.randn(batch[0].shape, generator=gen, dtype=x.dtype)
    calls = []

    def counted(*args):
        calls.append(args[0].shape[0])
        return toy.torch_impl(*args)
    batch_independence(hookless, batch, impl=counted)
    assert calls == [9, 1, 1, 1]

    def last_item_differs_in_a_batch(*args):
        (out,) = toy.torch_impl(*args)
        if args[0].shape[0] > 1:
            out = out.clone()
            out[-1] += 0.5
        return (out,)
    with pytest.raises(InvariantViolation, match="batch item 8 run alone"):
        batch_independence(hookless, batch, impl=last_item_differs_in_a_batch)
