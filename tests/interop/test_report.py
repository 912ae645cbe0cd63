"""How much of its tolerance a problem's own reference uses (fuseval.interop.tolerance_use), the
``import`` and ``crosscheck`` commands, and the crosscheck of a built-in operator against
a problem folder (tests/data/sol_problems, written for these tests)."""
import argparse
import json
import os

import pytest
import torch

from fuseval.commands import crosscheck as crosscheck_command
from fuseval.commands import import_problem
from fuseval.interop.crosscheck import ORACLE_RTOL, crosscheck
from fuseval.interop.tolerance_use import select_workloads, tolerance_use
from fuseval.interop.sol_problem import PROBLEM_PATH_VARIABLE, read_problem

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "sol_problems")
NVFP4_SMALL = os.path.join(DATA, "nvfp4_qkv_rope_small")


@pytest.fixture(autouse=True)
def _no_problem_left_registered(monkeypatch):
    from fuseval import operators
    from fuseval.operators import _CACHE
    # set (to nothing) rather than deleted, so that monkeypatch restores it after the test
    monkeypatch.setenv(PROBLEM_PATH_VARIABLE, "")
    before = set(operators.registry())
    yield
    for name in set(operators.registry()) - before:
        operators.registry().pop(name, None)
        _CACHE.pop(name, None)


def test_a_reference_that_rounds_inside_is_flagged():
    report = tolerance_use(os.path.join(DATA, "bf16_inside"))
    assert [r.line for r in report.rows] and all(not r.passed for r in report.rows)
    assert report.flagged == report.rows
    for r in report.rows:
        assert r.used > 1 and r.bound_at_ratio > 1 and r.failing == r.seeds == 1 and r.lifted
        assert r.matched < r.required == 0.99


def test_a_faithful_reference_uses_part_of_its_tolerance_worst_first():
    report = tolerance_use(os.path.join(DATA, "rmsnorm"), seeds=2)
    assert not report.flagged and len(report.rows) == 3
    assert all(r.failing == 0 and r.seeds == 2 for r in report.rows)
    # bf16 outputs: the reference's own rounding is at most half a bf16 ulp, under the bound
    assert all(0 < r.bound_at_ratio < 1 and r.max_abs > 0 for r in report.rows)
    keys = [(-r.used, -r.bound_at_ratio) for r in report.rows]
    assert keys == sorted(keys)


def test_an_exact_reference_uses_nothing():
    report = tolerance_use(os.path.join(DATA, "gemm_custom_inputs"))
    # multiples of 1/8 times multiples of 1/8, 32 terms: exact in float32 and in fp16
    assert all(r.used == 0 and r.max_abs == 0 and r.bound_at_ratio == 0 for r in report.rows)


def test_select_smallest_and_lines():
    p = read_problem(os.path.join(DATA, "rmsnorm"))
    assert [w.line for w in select_workloads(p, smallest=2)] == [1, 3]
    assert [w.line for w in select_workloads(p, lines=[2])] == [2]
    with pytest.raises(ValueError, match="no supported workload at lines \\[9\\]"):
        select_workloads(p, lines=[9])


def test_markdown_and_json_of_the_report():
    report = tolerance_use(os.path.join(DATA, "bf16_inside"), smallest=1)
    md = report.to_markdown()
    assert "| line | axes | output | matched | required | used |" in md and "batch_size=64" in md
    doc = report.to_dict()
    assert doc["rows"][0]["passed"] is False and doc["lift"]["lifted"] is True


def _run(module, argv):
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return module.run(parser.parse_args(argv))


def test_import_command_prints_the_problem_warnings_and_lift(capsys):
    code = _run(import_problem, [os.path.join(DATA, "misspelled_ratio"), "--lift"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "problem test_misspelled_ratio" in out and "input x: bfloat16 [tokens, hidden]" in out
    assert "lifted: to float32 -> bfloat16: 1" in out
    assert "required_match_ratio" in err and "its default 0.99 where the workload gives none" in err
    assert "max_atol applies as the workload gives it" in err    # max_atol is given (0.001): no default claimed


def test_import_command_report_strict_exit_code(tmp_path, capsys):
    path = tmp_path / "r.json"
    assert _run(import_problem, [os.path.join(DATA, "bf16_inside"), "--report", "--json", str(path)]) == 0
    assert _run(import_problem, [os.path.join(DATA, "bf16_inside"), "--report", "--strict"]) == 1
    assert _run(import_problem, [os.path.join(DATA, "rmsnorm"), "--report", "--strict"]) == 0
    out = capsys.readouterr().out
    assert "flagged: workload line" in out
    assert json.loads(path.read_text())["problem"] == "test_scaled_sum_bf16_inside"


# --------------------------------------------------------------------------- crosscheck
def test_crosscheck_of_the_builtin_operator_against_a_problem_folder():
    result = crosscheck("nvfp4_qkv_rope", NVFP4_SMALL, cases="0,5", config="small")
    assert result.passed, [c.messages for c in result.cases]
    assert all(v <= ORACLE_RTOL for c in result.cases for v in c.oracle_rel_diff.values())
    assert all(c.lifted for c in result.cases)
    assert result.lift.kept_calls > 0 and "hidden_states" in result.lift.quantized_inputs


def test_crosscheck_fails_on_the_old_semantics_and_names_the_case():
    # mutant: the weight-only (W4A16) oracle of the old fidelity: another function
    result = crosscheck("nvfp4_qkv_rope", NVFP4_SMALL, cases="5", config="small", variant="w4a16")
    assert not result.passed and result.first_failure.case == 5
    assert any("the oracles differ" in m for m in result.first_failure.messages)


def test_crosscheck_refuses_a_problem_with_other_inputs():
    from fuseval.errors import UsageError
    with pytest.raises(UsageError, match="inputs differ"):
        crosscheck("nvfp4_qkv_rope", os.path.join(DATA, "rmsnorm"), config="small")


def test_crosscheck_command_exit_codes(capsys):
    ok = _run(crosscheck_command, ["--op", "nvfp4_qkv_rope", "--problem", NVFP4_SMALL, "--config", "small",
                                   "--cases", "0"])
    bad = _run(crosscheck_command, ["--op", "nvfp4_qkv_rope", "--problem", NVFP4_SMALL, "--config", "small",
                                    "--cases", "0", "--variant", "w4a16"])
    out = capsys.readouterr().out
    assert ok == 0 and bad == 1
    assert "crosscheck passed: 1 case(s) agree" in out and "crosscheck FAILED: case 0" in out


def test_crosscheck_lift_fallback_is_a_note_not_a_failure(monkeypatch):
    from fuseval.interop import lift

    real = lift.run_lifted

    def not_lifted(fn, inputs, names=None, **kw):
        result = real(fn, inputs, names, **kw)
        result.report.lifted, result.report.note = False, "forced by the test"
        result.lifted = tuple(o.double() if isinstance(o, torch.Tensor) else o for o in result.native)
        return result
    monkeypatch.setattr(lift, "run_lifted", not_lifted)
    result = crosscheck("nvfp4_qkv_rope", NVFP4_SMALL, cases="0", config="small")
    assert result.passed and "forced by the test" in result.cases[0].note
