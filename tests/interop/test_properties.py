"""Generic properties and end-to-end budgets of imported problems (fuseval.interop.properties,
fuseval.interop.budget): var axes drawn from the workloads, constraints respected, the
benchmark and adversarial recipes, fast-vs-reference under each workload's tolerance, and
the derived budget. Each check has a broken implementation here that it rejects.

Expected values come from the problem folders' own files (read here as JSON) and from a
float64 RMSNorm written in this file, never from the code under test."""
import json
import math
import os
import shutil

import pytest
import torch
from hypothesis import given, settings

import fuseval
from fuseval.budget import run_budget
from fuseval.properties import check_implementation, hooks_of
from fuseval.properties.satisfiable import UnsatisfiableAxes
from fuseval.properties.strategies import axis_bindings

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "sol_problems")
RMSNORM = os.path.join(DATA, "rmsnorm")
INT_BOOL = os.path.join(DATA, "int_bool_0d")


def _workloads(folder):
    with open(os.path.join(folder, "workload.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]




def _rmsnorm64(hidden_states, weight, eps):
    x = hidden_states.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def _rmsnorm(hidden_states, weight, eps):
    """A correct float32 RMSNorm (the mutants below break it in one way each)."""
    x = hidden_states.float()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(torch.bfloat16)


WORKLOAD_BINDINGS = {(w["axes"]["batch_size"], w["axes"]["seq_len"]) for w in _workloads(RMSNORM)}


def wrong_off_the_workloads(hidden_states, weight, eps):
    """Mutant: exact on the workloads' own bindings, 10% off on every other size."""
    out = _rmsnorm(hidden_states, weight, eps)
    return out if tuple(hidden_states.shape[:2]) in WORKLOAD_BINDINGS else (out.float() * 1.1).to(out.dtype)


def no_eps(hidden_states, weight, eps):
    """Mutant: drops eps (invisible with the benchmark's eps 1e-6 and randn rows)."""
    x = hidden_states.float()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)) * weight.float()).to(torch.bfloat16)


# --------------------------------------------------------------------------- the axis space
def test_var_axes_come_from_the_workloads(register):
    spec = register(RMSNORM)
    rows = _workloads(RMSNORM)
    space = hooks_of(fuseval.operators.load(spec.name)).var_space["small"]
    for axis in ("batch_size", "seq_len"):
        values = [w["axes"][axis] for w in rows]
        assert space.ranges[axis] == (min(values), max(values))
    assert {(b["batch_size"], b["seq_len"]) for b in space.bindings} == WORKLOAD_BINDINGS


def test_the_strategy_draws_in_range_and_the_exact_bindings(register):
    spec = register(RMSNORM)
    lo_b, hi_b = min(b for b, _ in WORKLOAD_BINDINGS), max(b for b, _ in WORKLOAD_BINDINGS)
    lo_s, hi_s = min(s for _, s in WORKLOAD_BINDINGS), max(s for _, s in WORKLOAD_BINDINGS)
    seen = []

    @settings(max_examples=80, database=None, derandomize=True)
    @given(axis_bindings(spec.name, "small"))
    def collect(binding):
        seen.append((binding.axes["batch_size"], binding.axes["seq_len"]))
    collect()
    assert all(lo_b <= b <= hi_b and lo_s <= s <= hi_s for b, s in seen), seen
    assert set(seen) & WORKLOAD_BINDINGS and set(seen) - WORKLOAD_BINDINGS


def _constrained(tmp_path, constraint, seq_lens):
    folder = tmp_path / "constrained"
    shutil.copytree(RMSNORM, folder)
    d = json.loads((folder / "definition.json").read_text())
    d["name"] = "test_rmsnorm_constrained"
    d["constraints"] = [constraint]
    (folder / "definition.json").write_text(json.dumps(d))
    rows = _workloads(RMSNORM)[:1]
    lines = [json.dumps({**rows[0], "uuid": f"u{s}", "axes": {"batch_size": 1 + i, "seq_len": s}})
             for i, s in enumerate(seq_lens)]
    (folder / "workload.jsonl").write_text("\n".join(lines) + "\n")
    return str(folder)


def test_draws_respect_the_definitions_constraints(tmp_path, register):
    spec = register(_constrained(tmp_path, "seq_len % 2 == 0", [2, 9, 12]))
    seen = []

    @settings(max_examples=60, database=None, derandomize=True)
    @given(axis_bindings(spec.name, "small"))
    def collect(binding):
        seen.append(binding.axes["seq_len"])
    collect()
    assert seen and all(s % 2 == 0 for s in seen) and len(set(seen)) > 2


def test_an_unsatisfiable_axis_space_is_a_clear_error(tmp_path, register):
    spec = register(_constrained(tmp_path, "seq_len > 100", [4, 8]))
    with pytest.raises(UnsatisfiableAxes, match=r"no binding of its var axes.*'seq_len > 100'.*expected at least "
                                                 r"one valid binding; tried"):
        check_implementation(spec.name, "sol_reference", profile="ci")


# --------------------------------------------------------------------------- fast vs reference
def test_the_benchmarks_reference_holds_every_property(register):
    spec = register(RMSNORM)
    report = check_implementation(spec.name, "sol_reference", profile="ci")
    assert report.passed, str(report)
    assert report.properties == ["tolerance", "metamorphic"]


def test_a_kernel_wrong_off_the_workloads_passes_the_check_and_fails_the_property(register):
    spec = register(RMSNORM)
    assert fuseval.check(spec.name, wrong_off_the_workloads, isolate=False).passed
    report = check_implementation(spec.name, wrong_off_the_workloads, profile="ci")
    assert not report.passed
    failing = report.failures[0].example.binding.axes
    assert (failing["batch_size"], failing["seq_len"]) not in WORKLOAD_BINDINGS


def test_the_adversarial_recipes_catch_a_kernel_without_eps(register):
    spec = register(RMSNORM)
    assert hooks_of(fuseval.operators.load(spec.name)).eps_input == "eps"
    assert fuseval.check(spec.name, no_eps, isolate=False).passed
    report = check_implementation(spec.name, no_eps, profile="ci")
    assert not report.passed and report.failures[0].example.mode == "adversarial"


def test_imported_problems_draw_the_benchmark_and_adversarial_recipes_only(register):
    spec = register(RMSNORM)
    report = check_implementation(spec.name, "sol_reference", profile="ci", metamorphic=False)
    assert report.passed
    from fuseval.properties.strategies import explicit_examples, input_modes
    assert input_modes(spec.name) == ["benchmark", "adversarial"]
    assert {e.mode for e in explicit_examples(spec.name)} >= {"benchmark", "adversarial"}


def off_by_a_thousandth(x, offsets, mask, gate, scale):
    """Mutant of the int/bool problem: y off by 1e-3, inside the evaluator's default
    tolerance (1e-2) and outside the workloads' own (1e-4)."""
    from fuseval.interop.problem_code import reference_module
    from fuseval.interop.sol_problem import read_problem
    y, count, any_masked, total = reference_module(read_problem(INT_BOOL)).run(x, offsets, mask, gate, scale)
    return y + 1e-3, count, any_masked, total


def test_each_example_is_judged_under_its_workloads_tolerance(register):
    spec = register(INT_BOOL)
    tolerances = {w["tolerance"]["max_atol"] for w in _workloads(INT_BOOL)}
    assert tolerances == {1e-4}
    report = check_implementation(spec.name, off_by_a_thousandth, profile="ci", metamorphic=False)
    assert not report.passed and report.failures[0].property == "tolerance"
    assert any("y" in m for m in report.failures[0].messages)


def test_batch_independence_is_checked_only_where_the_oracle_has_it(tmp_path, register):
    spec = register(RMSNORM)
    # batch_size leads every input that has it and the output: its items are checked
    assert [c.__name__ for c in hooks_of(fuseval.operators.load(spec.name)).invariants] == ["independent_along_batch_size"]
    # a problem that centres over the batch: its oracle is not batch independent, so the check
    # is not made (no false alarm on its own reference)
    folder = tmp_path / "centred"
    shutil.copytree(RMSNORM, folder)
    d = json.loads((folder / "definition.json").read_text())
    d["name"] = "test_centred_over_batch"
    d["reference"] = ("import torch\n\n\ndef run(hidden_states, weight, eps):\n"
                      "    x = hidden_states.to(torch.float32)\n"
                      "    return (x - x.mean(0, keepdim=True)).to(torch.bfloat16)\n")
    (folder / "definition.json").write_text(json.dumps(d))
    centred = register(str(folder))
    report = check_implementation(centred.name, "sol_reference", profile="ci")
    assert report.passed, str(report)


# --------------------------------------------------------------------------- budget
def _tolerance_use(out, ref, atol, rtol, ratio):
    """The required-ratio quantile of |out - ref| / (atol + rtol |ref|) (written here)."""
    e = ((out.double() - ref).abs() / (atol + rtol * ref.abs())).flatten().sort().values
    return float(e[max(1, math.ceil(ratio * e.numel())) - 1])


def test_the_derived_budget_reports_what_the_reference_and_the_implementation_spend(register):
    spec = register(RMSNORM)
    rows = _workloads(RMSNORM)
    report = run_budget(spec.name, "sol_reference", cases="0,1,2", isolate=False)
    assert report.passed and report.stages == [] and report.torch_baseline == "sol_reference"
    assert report.budget["end_to_end"]["allowance"][0]["metric"] == "tolerance_used"
    d = fuseval.operators.implementations.get(spec.name).definition
    for case, row in zip(report.cases, rows):
        inputs = fuseval.generate_inputs(d, case.axes, seed=case.seed)
        tol = row["tolerance"]
        expected = _tolerance_use(_rmsnorm(*inputs), _rmsnorm64(*inputs), tol["max_atol"], tol["max_rtol"],
                                  tol["required_matched_ratio"])
        assert 0 < expected < 1
        assert math.isclose(case.end_to_end.checks[0]["value"], expected, rel_tol=1e-9)
        assert math.isclose(case.end_to_end.baseline_checks["torch"][0]["value"], expected, rel_tol=1e-9)
    text = report.to_markdown()
    assert "`sol_reference` used" in text and "no stages" in text


def ten_percent_off(hidden_states, weight, eps):
    """Mutant: 10% too large everywhere."""
    return (_rmsnorm(hidden_states, weight, eps).float() * 1.1).to(torch.bfloat16)


def test_the_derived_budget_rejects_a_wrong_kernel(register):
    spec = register(RMSNORM)
    report = run_budget(spec.name, ten_percent_off, cases="0", isolate=False)
    case = report.cases[0]
    assert not report.passed and case.first_over_budget == "end_to_end"
    assert case.end_to_end.checks[0]["value"] > 1 and not case.end_to_end.checks[0]["passed"]
    assert case.end_to_end.baseline_checks["torch"][0]["passed"]      # the benchmark's reference is within


def test_the_gate_runs_the_budget_of_a_problem_without_a_budget_file(register, tmp_path):
    spec = register(RMSNORM)
    assert not os.path.exists(os.path.join(RMSNORM, "budget.json"))
    gate = fuseval.run_gate(spec.name, "sol_reference", profile="ci", components=("budget",), isolate=False)
    budget = next(r for r in gate.components if r.name == "budget")
    assert budget.status == "pass" and "within budget" in budget.summary
    bad = fuseval.run_gate(spec.name, ten_percent_off, profile="ci", components=("budget",), isolate=False)
    assert next(r for r in bad.components if r.name == "budget").status == "fail"


def test_a_budget_file_in_the_folder_wins(tmp_path, register):
    folder = tmp_path / "own_budget"
    shutil.copytree(RMSNORM, folder)
    name = json.loads((folder / "definition.json").read_text())["name"]
    own = {"schema_version": 1, "op": name, "stages": {},
           "end_to_end": {"tolerance": True, "allowance": [{"kind": "abs", "max": 1e-9}]}}
    (folder / "budget.json").write_text(json.dumps(own))
    spec = register(str(folder))
    report = run_budget(spec.name, "sol_reference", cases="0", isolate=False)
    assert not report.passed       # a 1e-9 max-abs allowance is below the bf16 reference's error
    assert report.budget["end_to_end"]["allowance"] == own["end_to_end"]["allowance"]
