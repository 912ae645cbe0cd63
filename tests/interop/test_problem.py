"""A SOL-ExecBench problem folder as a fuseval operator: reading, validation, inputs,
registration and checks through fuseval's normal ``check``.

The problem folders are written for these tests (tests/data/sol_problems), none copied
from the benchmark's dataset."""
import json
import math
import os
import shutil

import pytest
import torch

import fuseval
from fuseval.interop import workload_inputs as problem_inputs
from fuseval.interop.sol_problem import PROBLEM_PATH_VARIABLE, TOLERANCE_DEFAULTS, ProblemError, read_problem

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "sol_problems")
RMSNORM = os.path.join(DATA, "rmsnorm")
GEMM = os.path.join(DATA, "gemm_custom_inputs")
BF16_INSIDE = os.path.join(DATA, "bf16_inside")
MISSPELLED = os.path.join(DATA, "misspelled_ratio")




# --------------------------------------------------------------------------- reading
def test_reads_axes_inputs_outputs_and_workloads():
    p = read_problem(RMSNORM)
    assert p.name == "test_rmsnorm_h64"
    assert p.var_axes == ["batch_size", "seq_len"]
    assert list(p.inputs) == ["hidden_states", "weight", "eps"] and p.inputs["eps"]["shape"] is None
    assert [dict(w.axes) for w in p.workloads] == [{"batch_size": 1, "seq_len": 4}, {"batch_size": 2, "seq_len": 8},
                                                   {"batch_size": 3, "seq_len": 5}]
    assert p.workloads[0].tolerance["max_atol"] == 0.008 and p.warnings == []


def test_misspelled_ratio_key_is_ignored_as_the_evaluator_ignores_it_and_warned():
    p = read_problem(MISSPELLED)
    # the workloads say 0.5 under required_match_ratio: the evaluator reads its default 0.99
    assert {w.tolerance["required_matched_ratio"] for w in p.workloads} == {0.99}
    assert {w.tolerance["max_atol"] for w in p.workloads} == {1e-3}
    text = " ".join(p.warnings)
    assert "'required_match_ratio'" in text and "did you mean 'required_matched_ratio'" in text
    assert "'max_atoll'" in text
    cases = p.fuseval_definition()["cases"]
    assert {c["tolerance"]["min_matched_ratio"] for c in cases} == {0.99}


def test_evaluator_defaults_fill_missing_tolerance_keys():
    p = read_problem(GEMM)
    t = p.workloads[0].tolerance
    assert t["required_matched_ratio"] == TOLERANCE_DEFAULTS["required_matched_ratio"] == 0.99
    assert t["max_error_cap"] is None and t["max_atol"] == 1e-3


@pytest.mark.parametrize("folder, words", [
    ("no_run", ["no top-level function 'run'"]),
    ("params_out_of_order", ["run() takes (w, x)", "(x, w)"]),
    ("unknown_dtype", ["'float8'", "expected one of"]),
    ("undefined_axis", ["'width'"]),
    ("workload_not_json", ["workload.jsonl:1", "not valid JSON"]),
    ("workload_missing_var_axis", ["workload.jsonl:1", "['n']"]),
    ("custom_without_entrypoint", ["custom inputs", "custom_inputs_entrypoint"]),
    ("tolerance_not_a_number", ["max_atol", "'big'"]),
    ("division_in_axis_expression", ["'n / 2'", "Div"]),
    ("no_reference", ["missing field 'reference'"]),
])
def test_malformed_folders_are_clear_errors(folder, words):
    with pytest.raises(ProblemError) as info:
        read_problem(os.path.join(DATA, "malformed", folder))
    message = str(info.value)
    assert all(w in message for w in words), message
    assert info.value.exit_code == 5


def test_not_a_folder_is_an_error(tmp_path):
    with pytest.raises(ProblemError, match="not a folder"):
        read_problem(str(tmp_path / "nothing"))


def test_extra_workload_fields_are_read_as_the_evaluator_reads_them(tmp_path):
    folder = tmp_path / "p"
    shutil.copytree(RMSNORM, folder)
    lines = (folder / "workload.jsonl").read_text().splitlines()
    row = json.loads(lines[0])
    row["axes"]["flag"] = 1                              # not an axis of the definition
    row["inputs"]["bias"] = {"type": "random"}           # not an input of the definition
    del row["inputs"]["weight"]                          # no descriptor: random
    (folder / "workload.jsonl").write_text("\n".join([json.dumps(row)] + lines[1:]) + "\n")
    p = read_problem(str(folder))
    text = " ".join(p.warnings)
    assert "flag" in text and "bias" in text and "weight" in text
    assert p.workloads[0].inputs["weight"] == {"type": "random"} and "bias" not in p.workloads[0].inputs
    assert p.workloads[0].extra_axes == {"flag": 1}


def test_workload_overriding_a_const_axis_is_refused(tmp_path):
    folder = tmp_path / "p"
    shutil.copytree(RMSNORM, folder)
    row = json.loads((folder / "workload.jsonl").read_text().splitlines()[0])
    row["axes"]["hidden_size"] = 32
    (folder / "workload.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(ProblemError, match="override const axes.*hidden_size=64"):
        read_problem(str(folder))


# --------------------------------------------------------------------------- inputs
def test_generic_rules_by_name():
    p = read_problem(RMSNORM)
    values = problem_inputs.draw_inputs(p, p.workloads[1], seed=3)
    assert values["hidden_states"].dtype == torch.bfloat16 and values["hidden_states"].shape == (2, 8, 64)
    assert values["eps"] == 1e-6
    # 'weight' is one-dimensional: not a weight matrix, not a norm weight: plain randn
    assert not torch.all(values["weight"] == 1)
    again = problem_inputs.draw_inputs(p, p.workloads[1], seed=3)
    assert torch.equal(values["hidden_states"], again["hidden_states"])
    other = problem_inputs.draw_inputs(p, p.workloads[1], seed=4)
    assert not torch.equal(values["hidden_states"], other["hidden_states"])


@pytest.mark.parametrize("name, shape, check", [
    ("input_layernorm_weight", (64,), lambda t: bool(torch.all(t == 1))),
    ("q_norm_bias", (64,), lambda t: bool(torch.all(t == 0))),
    ("gate_proj_weight", (128, 64), lambda t: 0.07 < float(t.float().std()) < 0.18),     # randn / sqrt(64)
    ("rope_cos", (8, 64), lambda t: float(t.min()) >= -1 and float(t.max()) <= 1 and float(t.min()) < 0),
    ("rstd", (64,), lambda t: float(t.min()) >= 0.1),
    ("A_log", (64,), lambda t: -5 <= float(t.min()) and float(t.max()) <= -1),
    ("attn_weights", (4, 16), lambda t: torch.allclose(t.float().sum(-1), torch.ones(4), atol=1e-5)),
    ("causal_mask", (8, 8), lambda t: bool(torch.all(t[torch.ones(8, 8).triu(1).bool()] < -1e30))
     and bool(torch.all(t.tril() == 0))),
    ("hidden", (64, 64), lambda t: 0.8 < float(t.float().std()) < 1.2),
])
def test_generic_rules_table(tmp_path, name, shape, check):
    axes = {f"a{i}": {"type": "const", "value": n} for i, n in enumerate(shape)}
    definition = {"name": "test_rule", "axes": axes,
                  "inputs": {name: {"shape": list(axes), "dtype": "float32"}},
                  "outputs": {"y": {"shape": list(axes), "dtype": "float32"}},
                  "reference": f"def run({name}):\n    return {name}\n"}
    (tmp_path / "definition.json").write_text(json.dumps(definition))
    workload = {"uuid": "u", "axes": {}, "inputs": {name: {"type": "random"}}}
    (tmp_path / "workload.jsonl").write_text(json.dumps(workload) + "\n")
    p = read_problem(str(tmp_path))
    value = problem_inputs.draw_inputs(p, p.workloads[0], seed=0)[name]
    assert value.shape == shape and check(value), value


def test_custom_entry_point_is_used_and_seeded():
    p = read_problem(GEMM)
    state = torch.random.get_rng_state()
    a = problem_inputs.draw_inputs(p, p.workloads[1], seed=0)
    assert torch.equal(torch.random.get_rng_state(), state)          # the global generator is restored
    b = problem_inputs.draw_inputs(p, p.workloads[1], seed=0)
    c = problem_inputs.draw_inputs(p, p.workloads[1], seed=1)
    assert a["A"].shape == (7, 32) and a["B"].shape == (16, 32)
    # the problem's generator draws multiples of 1/8 in [-0.5, 0.5]: not the generic randn
    assert torch.all((a["A"] * 8).round() == a["A"] * 8) and float(a["A"].abs().max()) <= 0.5
    assert torch.equal(a["A"], b["A"]) and not torch.equal(a["A"], c["A"])


def test_custom_entry_point_missing_an_input_is_named(tmp_path):
    folder = tmp_path / "p"
    shutil.copytree(GEMM, folder)
    d = json.loads((folder / "definition.json").read_text())
    d["reference"] = d["reference"].replace('return {"A": a, "B": b}', 'return {"A": a}')
    (folder / "definition.json").write_text(json.dumps(d))
    p = read_problem(str(folder))
    with pytest.raises(ProblemError, match=r"did not return the custom inputs \['B'\]"):
        problem_inputs.draw_inputs(p, p.workloads[0], seed=0)


# --------------------------------------------------------------------------- as an operator
def test_registered_problem_is_an_operator_with_per_case_tolerances(register):
    spec = register(RMSNORM)
    op = fuseval.operators.implementations.get(spec.name)
    d = op.definition
    assert d.var_axes == ["batch_size", "seq_len"] and [s.name for s in d.inputs] == ["hidden_states", "weight", "eps"]
    assert d.inputs[2].value == 1e-6           # every workload gives eps the same value
    assert [c.axes for c in d.cases()] == [{"batch_size": 1, "seq_len": 4}, {"batch_size": 2, "seq_len": 8},
                                           {"batch_size": 3, "seq_len": 5}]
    assert all(c.tolerance.atol == 0.008 and c.tolerance.rtol == 0.016 for c in d.cases())
    assert {"reference", "sol_reference", "torch", "rmsnorm_torch_dps"} <= set(op.implementation_names)
    assert os.environ[PROBLEM_PATH_VARIABLE].split(os.pathsep)[-1] == os.path.realpath(RMSNORM)


def test_check_passes_the_reference_as_written_and_a_solution(register):
    spec = register(RMSNORM)
    for impl in ("sol_reference", "rmsnorm_torch_dps"):
        report = fuseval.check(spec.name, impl)
        assert report.passed, [(c.case, c.violations, c.messages) for c in report.cases]


def test_check_rejects_a_wrong_kernel(register):
    spec = register(RMSNORM)

    def no_eps_weight(hidden_states, weight, eps):       # forgets the weight: a wrong kernel
        x = hidden_states.float()
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(torch.bfloat16)
    report = fuseval.check(spec.name, no_eps_weight)
    assert not report.passed and all("tolerance" in c.violations for c in report.cases)


def test_check_fails_a_reference_that_rounds_inside_against_the_lifted_oracle(register):
    # the reference rounds 3x to bf16 before summing 256 terms: far outside 1e-5
    spec = register(BF16_INSIDE)
    report = fuseval.check(spec.name, "sol_reference")
    assert not report.passed and all("tolerance" in c.violations for c in report.cases)
    worst = max(m.max_abs for c in report.cases for m in c.outputs)
    assert worst > 1e-2


def test_check_of_a_custom_input_problem_in_a_worker_process(register):
    spec = register(GEMM)
    report = fuseval.check(spec.name, "sol_reference", isolate=True, cases="0")
    assert report.isolated and report.passed, [(c.violations, c.messages) for c in report.cases]


def test_integer_and_zero_d_tensors_are_held(tmp_path, register):
    # once refused ("fuseval's definitions do not represent yet"): an int64 input and a 0-d
    # tensor are now checked (tests/interop/test_dtypes.py has the details)
    definition = {"name": "test_int_and_zero_d", "axes": {"n": {"type": "const", "value": 4}},
                  "inputs": {"idx": {"shape": ["n"], "dtype": "int64"}, "s": {"shape": [], "dtype": "float32"}},
                  "outputs": {"y": {"shape": ["n"], "dtype": "float32"}},
                  "reference": "import torch\n\n\ndef run(idx, s):\n    return idx.to(torch.float32) * s\n"}
    (tmp_path / "definition.json").write_text(json.dumps(definition))
    workload = {"uuid": "u", "axes": {}, "inputs": {"idx": {"type": "random"}, "s": {"type": "random"}}}
    (tmp_path / "workload.jsonl").write_text(json.dumps(workload) + "\n")
    spec = register(str(tmp_path))
    d = fuseval.operators.implementations.get(spec.name).definition
    assert [s.shape for s in d.inputs] == [("n",), ()]
    assert fuseval.check(spec.name, "sol_reference").passed


def test_float_bounds_of_the_tolerance_are_kept():
    d = read_problem(RMSNORM).fuseval_definition()
    assert d["tolerance"]["min_matched_ratio"] == 0.99 and math.isclose(d["cases"][0]["tolerance"]["rtol"], 0.016)


def test_inputs_for_a_binding_no_workload_has(register):
    # a property test draws var axes of its own: the workloads' descriptors apply to them
    spec = register(RMSNORM)
    d = fuseval.operators.implementations.get(spec.name).definition
    inputs = fuseval.generate_inputs(d, {"batch_size": 2, "seq_len": 5}, seed=0)
    assert inputs[0].shape == (2, 5, 64) and inputs[2] == 1e-6
    with pytest.raises(ValueError, match=r"var axes \['seq_len'\] are not bound"):
        read_problem(RMSNORM).workload_for({"batch_size": 2})
