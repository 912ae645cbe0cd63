"""Integer, bool and float8_e5m2 inputs, 0-d tensors and exact comparison of integer and
bool outputs, on a problem folder written for these tests (tests/data/sol_problems/int_bool_0d).

Expected values are the benchmark's generic rules as its docs state them and the problem's
own files, never taken from the code under test."""
import json
import os
import shutil

import pytest
import torch

import fuseval
from fuseval.comparison import compare
from fuseval.definitions import Tolerance
from fuseval.interop.problem_code import reference_module
from fuseval.interop.sol_problem import read_problem
from fuseval.validate import bind_axes

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "sol_problems")
INT_BOOL = os.path.join(DATA, "int_bool_0d")




def _reference(*inputs):
    return reference_module(read_problem(INT_BOOL)).run(*inputs)


def test_a_zero_d_shape_is_a_zero_d_tensor_not_a_python_scalar(register):
    spec = register(INT_BOOL)
    d = fuseval.operators.implementations.get(spec.name).definition
    raw = json.load(open(os.path.join(INT_BOOL, "definition.json")))
    assert raw["inputs"]["scale"]["shape"] == [] and raw["outputs"]["total"]["shape"] == []
    scale = d.inputs[d.input_index("scale")]
    assert scale.shape == () and not scale.is_scalar
    assert d.outputs[-1].shape == ()
    x, offsets, mask, gate, value = fuseval.generate_inputs(d, {"batch_size": 4}, seed=3)
    assert isinstance(value, torch.Tensor) and value.dim() == 0 and value.dtype == torch.float32
    assert d.to_solexec_definition()["inputs"]["scale"]["shape"] == []


def test_integer_bool_and_e5m2_inputs_follow_the_benchmarks_generic_rules(register):
    spec = register(INT_BOOL)
    d = fuseval.operators.implementations.get(spec.name).definition
    x, offsets, mask, gate, scale = fuseval.generate_inputs(d, {"batch_size": 6}, seed=1)
    # int32: randint(-1024, 1024); bool: randint(0, 2); fp8: clamp(randn, -2, 2) in the format
    assert offsets.dtype == torch.int32 and offsets.shape == (16,)
    assert int(offsets.min()) >= -1024 and int(offsets.max()) < 1024 and len(set(offsets.tolist())) > 8
    assert mask.dtype == torch.bool and mask.shape == (6, 16) and 0 < int(mask.sum()) < mask.numel()
    assert gate.dtype == torch.float8_e5m2 and float(gate.float().abs().max()) <= 2.0
    again = fuseval.generate_inputs(d, {"batch_size": 6}, seed=1)
    assert torch.equal(again[1], offsets) and torch.equal(again[2], mask)


def test_validation_names_the_input_what_was_expected_and_what_was_given(register):
    spec = register(INT_BOOL)
    d = fuseval.operators.implementations.get(spec.name).definition
    inputs = fuseval.generate_inputs(d, {"batch_size": 2}, seed=0)
    assert bind_axes(d, inputs)["batch_size"] == 2
    wrong = list(inputs)
    wrong[1] = inputs[1].to(torch.int64)
    with pytest.raises(ValueError, match=r"input 'offsets' must have dtype torch.int32 \(int32\), got torch.int64"):
        bind_axes(d, wrong)
    wrong = list(inputs)
    wrong[4] = float(inputs[4])
    with pytest.raises(ValueError, match=r"input 'scale' must be a torch.Tensor of dtype float32, got float"):
        bind_axes(d, wrong)
    wrong = list(inputs)
    wrong[4] = inputs[4].reshape(1)
    with pytest.raises(ValueError, match=r"input 'scale' must have 0 dims \[\], got shape \(1,\)"):
        bind_axes(d, wrong)


def test_the_reference_passes_and_integer_outputs_are_compared_exactly(register):
    spec = register(INT_BOOL)
    report = fuseval.check(spec.name, "sol_reference")
    assert report.passed, [(c.case, c.messages) for c in report.cases]
    by_name = {m.name: m for m in report.cases[0].outputs}
    assert by_name["count"].exact and by_name["any_masked"].exact and not by_name["y"].exact


def test_exact_comparison_ignores_atol_and_rtol():
    loose = Tolerance(atol=10.0, rtol=10.0, min_matched_ratio=0.99)
    ref = torch.arange(200, dtype=torch.int64)
    off = ref.clone()
    off[7] += 1
    assert compare(ref.clone(), ref, loose).passed
    m = compare(off, ref, loose)                # one element off by 1 of 200: within atol, not equal
    assert m.exact and m.matched_ratio == pytest.approx(199 / 200) and m.passed
    off[8] += 1
    off[9] -= 1
    assert not compare(off, ref, loose).passed   # 3 of 200 differ: below 99% matched
    flags = torch.tensor([True, False, True])
    assert not compare(~flags, flags, loose).passed
    # a float oracle of an integer output (a lifted reference) is compared exactly too
    assert not compare(torch.tensor([3, 4]), torch.tensor([3.0, 4.25], dtype=torch.float64), loose).passed


def _loose_copy(tmp_path):
    """The problem with a loose tolerance (atol 100) and a 100% matched ratio: only an exact
    comparison can see an integer output off by one."""
    folder = tmp_path / "loose"
    shutil.copytree(INT_BOOL, folder)
    d = json.loads((folder / "definition.json").read_text())
    d["name"] = "test_int_bool_0d_loose"
    (folder / "definition.json").write_text(json.dumps(d))
    rows = [json.loads(line) for line in (folder / "workload.jsonl").read_text().splitlines() if line.strip()]
    for r in rows:
        r["tolerance"] = {"max_atol": 100.0, "max_rtol": 0.0, "required_matched_ratio": 1.0}
    (folder / "workload.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(folder)


def count_off_by_one(x, offsets, mask, gate, scale):
    """Mutant: one row's count is one too many."""
    y, count, any_masked, total = _reference(x, offsets, mask, gate, scale)
    count = count.clone()
    count[0] += 1
    return y, count, any_masked, total


def flag_flipped(x, offsets, mask, gate, scale):
    """Mutant: the bool output of the last row flipped."""
    y, count, any_masked, total = _reference(x, offsets, mask, gate, scale)
    any_masked = any_masked.clone()
    any_masked[-1] = ~any_masked[-1]
    return y, count, any_masked, total


@pytest.mark.parametrize("mutant, output", [(count_off_by_one, "count"), (flag_flipped, "any_masked")])
def test_an_integer_or_bool_output_off_by_one_fails_under_any_tolerance(tmp_path, register, mutant, output):
    spec = register(_loose_copy(tmp_path))
    assert fuseval.check(spec.name, "sol_reference").passed
    report = fuseval.check(spec.name, mutant, isolate=False)
    assert not report.passed
    failed = {m.name for c in report.cases for m in c.outputs if not m.passed}
    assert failed == {output}


def test_zero_d_output_of_the_wrong_shape_is_refused(register):
    spec = register(INT_BOOL)

    def total_as_vector(x, offsets, mask, gate, scale):
        y, count, any_masked, total = _reference(x, offsets, mask, gate, scale)
        return y, count, any_masked, total.reshape(1)
    report = fuseval.check(spec.name, total_as_vector, isolate=False, cases="0")
    assert not report.passed and "bad_outputs" in report.cases[0].violations


def test_a_const_axis_only_an_output_has_is_the_definitions(tmp_path, register):
    # (real problems size outputs by axes no input has, e.g. a count of experts plus one)
    definition = {"name": "test_output_only_axis", "axes": {"n": {"type": "const", "value": 5},
                                                            "m": {"type": "const", "value": 3}},
                  "inputs": {"x": {"shape": ["n"], "dtype": "int64"}},
                  "outputs": {"head": {"shape": ["m"], "dtype": "int64"}},
                  "reference": "import torch\n\n\ndef run(x):\n    return x[:3].clone()\n"}
    (tmp_path / "definition.json").write_text(json.dumps(definition))
    (tmp_path / "workload.jsonl").write_text(json.dumps({"uuid": "u", "axes": {}, "inputs": {}}) + "\n")
    spec = register(str(tmp_path))
    d = fuseval.operators.implementations.get(spec.name).definition
    assert bind_axes(d, fuseval.generate_inputs(d, {}, seed=0))["m"] == 3
    assert fuseval.check(spec.name, "sol_reference").passed
    report = fuseval.check(spec.name, lambda x: x[1:4].clone(), isolate=False)
    assert not report.passed
