"""Direct tests of the hygiene rules' pieces (fuseval.hygiene), outside ``check``: the
bitwise fingerprint, storage overlap, the grouping of inputs into activations and weights,
the later calls of a case and the cached-result judge. Each piece is given a good and a
deliberately bad input (the mutant is written here) and must tell them apart. The operator
is the hookless test operator (tests/helpers/hookless_operator) at its ``small`` size."""
from __future__ import annotations

from types import SimpleNamespace

import hookless_operator as toy
import pytest
import torch

from fuseval import hygiene
from fuseval.inputs import generate_inputs


@pytest.fixture
def defn():
    from fuseval import operators
    registry = operators.registry()
    registry[toy.NAME] = toy.SPEC
    yield operators.load(toy.NAME, config="small")
    registry.pop(toy.NAME, None)
    operators._CACHE.pop(toy.NAME, None)


# --------------------------------------------------------------------------- tensors
def test_fingerprint_sees_one_bit_that_equality_does_not():
    t = torch.zeros(64)
    flipped = t.clone()
    flipped[17] = -0.0                  # == 0.0, one bit apart
    assert torch.equal(t, flipped)
    assert hygiene.fingerprint(t) == hygiene.fingerprint(t.clone())
    assert hygiene.fingerprint(t) != hygiene.fingerprint(flipped)
    # two swapped elements keep the plain sum: the weighted one tells them apart
    a = torch.arange(8, dtype=torch.float32)
    assert hygiene.fingerprint(a) != hygiene.fingerprint(a.flip(0))
    assert hygiene.fingerprint(3) == 3              # not a tensor: itself


def test_overlaps_is_about_storage_not_the_view():
    x = torch.arange(32.0)
    assert hygiene.overlaps(x[:8], x[24:])          # disjoint views of one storage
    assert hygiene.overlaps(x, x.view(4, 8))
    assert not hygiene.overlaps(x, x.clone())
    assert not hygiene.overlaps(x, torch.empty(0))


def test_same_outputs_counts_nan_as_equal_and_anything_else_as_different():
    a = [torch.tensor([1.0, float("nan")]), torch.tensor([2.0])]
    assert hygiene.same_outputs(a, [t.clone() for t in a])
    assert not hygiene.same_outputs(a, [torch.tensor([1.0, 0.0]), torch.tensor([2.0])])
    assert not hygiene.same_outputs(a, [a[0], torch.tensor([2.0 + 2 ** -20])])


def test_same_value_is_bitwise_and_typed():
    t = torch.zeros(4)
    assert hygiene._same_value(t, t.clone())
    assert not hygiene._same_value(t, -t)                      # -0.0: equal, other bits
    assert not hygiene._same_value(t, t.double())
    assert hygiene._same_value(1e-6, 1e-6) and not hygiene._same_value(1, 1.0)


# --------------------------------------------------------------------------- later calls
def test_input_groups_split_activations_from_weights(defn):
    # x, residual: shapes over the var axes; norm_weight: hidden only; eps: a fixed value
    assert hygiene.input_groups(defn) == {"activations": [0, 1], "weights": [2]}


def _first(defn, seed=0):
    case = defn.cases()[0]
    return case, list(generate_inputs(defn, case.axes, seed=seed, mode="realistic"))


def test_partial_calls_change_one_group_each(defn):
    case, inputs = _first(defn)
    calls = hygiene.partial_calls(defn, case, 12345, inputs, "realistic", torch.device("cpu"))
    assert [c.repeat for c in calls] == [True, False, False]
    assert all(a is b for a, b in zip(calls[0].inputs, inputs))        # the very first inputs
    act, weights = calls[1], calls[2]
    assert "activations" in act.what and "weights" in weights.what
    changed = [[not hygiene._same_value(a, b) for a, b in zip(c.inputs, inputs)] for c in (act, weights)]
    assert changed == [[True, True, False, False], [False, False, True, False]]
    assert act.inputs[2] is inputs[2] and weights.inputs[0] is inputs[0]


def test_a_group_drawn_the_same_again_gets_no_call(defn):
    """Norm weights of ones (benchmark mode) come out the same: no weights call."""
    case, inputs = _first(defn)
    inputs = list(generate_inputs(defn, case.axes, seed=0, mode="benchmark"))
    calls = hygiene.partial_calls(defn, case, 12345, inputs, "benchmark", torch.device("cpu"), repeat=False)
    assert [c.what for c in calls] == ["only the activations changed"]


class _Runner:
    """A stand-in for the worker: answers each call with ``answer(inputs)``."""

    def __init__(self, answer):
        self.answer = answer

    def call(self, inputs, **_):
        return SimpleNamespace(violations=[], messages=[], outputs=list(self.answer(*inputs)))


def _judge(defn, implementation):
    """(violations, messages) of the later calls of one case for ``implementation(first
    inputs)``, a function of the inputs, whose answer to the first inputs is the first."""
    case, inputs = _first(defn)
    answer = implementation(inputs)
    calls = hygiene.partial_calls(defn, case, 12345, inputs, "realistic", torch.device("cpu"))
    first = list(answer(*inputs))
    violations, messages = [], []
    hygiene.judge_partial_calls(defn, _Runner(answer), calls, first, toy.reference, defn.tolerance, "fuseval",
                                True, False, None, None, lambda out: [], violations, messages,
                                first_refs=toy.reference(*inputs))
    return violations, messages


def honest(first_inputs):
    return toy.torch_impl


def stale(first_inputs):
    """The first call's answer, whatever is asked."""
    first_answer = toy.torch_impl(*first_inputs)
    return lambda *inputs: first_answer


def keyed_on_weights(first_inputs):
    """A cache keyed on the weights: stale when only the activations change."""
    first_answer = toy.torch_impl(*first_inputs)
    return lambda *inputs: first_answer if inputs[2] is first_inputs[2] else toy.torch_impl(*inputs)


def wrong_later(first_inputs):
    """Not a cache: right for the first inputs, wrong for any other."""
    return lambda *inputs: toy.torch_impl(*inputs) if all(a is b for a, b in zip(inputs, first_inputs)) else \
        tuple(o + 1 for o in toy.torch_impl(*inputs))


def test_judge_passes_an_honest_answer_and_names_each_kind_of_cache(defn):
    assert _judge(defn, honest) == ([], [])
    v, m = _judge(defn, stale)
    assert v == ["cached_result", "cached_result"] and "identical outputs" in m[0], m
    v, m = _judge(defn, keyed_on_weights)
    assert v == ["cached_result"] and "only the activations changed" in m[0], m
    v, m = _judge(defn, wrong_later)
    assert v == ["tolerance", "tolerance"], m
