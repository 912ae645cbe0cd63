"""The CI gate (fuseval.gate, `fuseval gate`): verdicts, exit codes, isolation of
components, and the JUnit / JSON / Markdown reports.

The implementations are the plain-torch path of op B (correct) and mutants of it that each
break one rule; every verdict the gate can give is produced by one of them. The scaled-down
configuration and a few cases keep each run to a second or two."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
import torch

from fuseval import cli
from fuseval.errors import (EXIT_BAD_OUTPUTS, EXIT_CHECK_FAILED, EXIT_IMPL_RAISED, EXIT_IMPORT_ERROR,
                            EXIT_INTERNAL, EXIT_NO_DEVICE, EXIT_NONFINITE, EXIT_UNKNOWN_OPERATOR, FusevalError)
from fuseval.gate import PROFILES, ComponentResult, GateReport, run_component, run_gate
from fuseval.operators.nvfp4_qkv_rope.reference import torch_eager

OP = "nvfp4_qkv_rope"
FAST = dict(components=["check"], cases="0-2", seeds=2)


def nan_outputs(*inputs):
    q, k, v = torch_eager(*inputs)
    return q, k, torch.full_like(v, float("nan"))


def raises(*inputs):
    raise RuntimeError("kernel launch failed: invalid argument")


def two_outputs(*inputs):
    return torch_eager(*inputs)[:2]


def thin_margin(*inputs):
    """~0.7% of query elements off: passes the 99% rule with under half its allowance left."""
    q, k, v = torch_eager(*inputs)
    q = q.clone()
    q.view(-1)[::150] += 0.25
    return q, k, v


def test_correct_implementation_passes_and_writes_reports(tmp_path):
    report = run_gate(OP, "torch", out=str(tmp_path), **FAST)
    assert report.passed and report.exit_code == 0
    assert [c.status for c in report.components] == ["pass"]
    root = ET.parse(tmp_path / "junit.xml").getroot()
    assert root.tag == "testsuites" and root.get("failures") == "0" and root.get("errors") == "0"
    names = [tc.get("name") for tc in root.iter("testcase")]
    assert any(n.startswith("case 0 ") for n in names)
    assert "margin query_states matched_ratio" in names
    assert int(root.get("tests")) == len(names)
    doc = json.loads((tmp_path / "gate.json").read_text())
    assert doc["passed"] is True and doc["exit_code"] == 0 and doc["ops"] == [OP]
    assert doc["components"][0]["data"]["verdict"] == "pass"
    assert "PASSED" in (tmp_path / "gate.md").read_text()
    check = json.loads((tmp_path / f"check-{OP}.json").read_text())
    assert len(check["reports"]) == 2                      # one check report per seed


@pytest.mark.parametrize("impl, code, violation", [
    (nan_outputs, EXIT_NONFINITE, "nonfinite"),
    (raises, EXIT_IMPL_RAISED, "raised"),
    (two_outputs, EXIT_BAD_OUTPUTS, "bad_outputs"),
])
def test_broken_implementations_fail_with_their_exit_code(tmp_path, impl, code, violation):
    report = run_gate(OP, impl, out=str(tmp_path), **FAST)
    assert not report.passed and report.exit_code == code
    check = report.components[0]
    assert check.status == "fail" and violation in check.result.violations
    root = ET.parse(tmp_path / "junit.xml").getroot()
    failures = list(root.iter("failure"))
    assert failures and all("reproduce: fuseval check" in (f.text or "") for f in failures
                            if f.get("message", "").startswith("seed"))
    assert "FAILED" in (tmp_path / "gate.md").read_text()


def test_raised_message_reaches_the_summary():
    report = run_gate(OP, raises, **FAST)
    assert "kernel launch failed" in report.text()


def test_thin_margin_is_a_warning_and_strict_makes_it_fail():
    relaxed = run_gate(OP, thin_margin, **FAST)
    assert relaxed.passed and relaxed.exit_code == 0
    assert relaxed.components[0].status == "warn"
    assert any("matched_ratio" in m and "warn" in m for m in relaxed.components[0].messages)
    strict = run_gate(OP, thin_margin, strict=True, **FAST)
    assert not strict.passed and strict.exit_code == EXIT_CHECK_FAILED
    xml = strict.to_junit_xml()
    assert "<failure" in xml and "margin query_states matched_ratio" in xml


def test_a_component_that_raises_is_reported_and_does_not_stop_the_others(monkeypatch):
    import fuseval.gate as gate

    def broken(ctx):
        raise RuntimeError("budget renderer exploded")
    monkeypatch.setitem(gate._RUNNERS, "budget", broken)
    monkeypatch.setattr(gate, "component_available", lambda name: (True, ""))
    report = run_gate(OP, "torch", components=["budget", "check"], cases="0", seeds=1)
    budget, check = report.components
    assert budget.status == "error" and "budget renderer exploded" in budget.summary
    assert check.status == "pass"                          # still ran after the crash
    assert report.exit_code == EXIT_INTERNAL
    xml = ET.fromstring(report.to_junit_xml())
    assert xml.get("errors") == "1"
    assert "budget renderer exploded" in report.to_markdown()


def test_implementation_verdict_outranks_a_crashed_component(monkeypatch):
    import fuseval.gate as gate
    monkeypatch.setitem(gate._RUNNERS, "budget", lambda ctx: 1 / 0)
    monkeypatch.setattr(gate, "component_available", lambda name: (True, ""))
    report = run_gate(OP, nan_outputs, components=["budget", "check"], cases="0", seeds=1)
    assert report.exit_code == EXIT_NONFINITE


def test_missing_component_module_is_skipped_not_failed(monkeypatch):
    import fuseval.gate as gate
    monkeypatch.setattr(gate, "component_available",
                        lambda name: (False, "fuseval.budget is not part of this installation"))
    result = run_component("budget", OP, "torch")
    assert result.status == "skipped" and "not part of this installation" in result.summary
    report = GateReport([OP], "torch", "ci", "cpu", False, [result], 0.0, "now")
    assert report.passed
    assert ET.fromstring(report.to_junit_xml()).get("skipped") == "1"


def test_properties_and_budget_components_run_on_a_correct_path(tmp_path):
    # the real components (ci property profile, a one-case budget): a correct path passes
    report = run_gate(OP, "torch", components=["properties", "budget"], budget_cases="0", out=str(tmp_path))
    properties, budget = report.components
    for c in (properties, budget):
        assert c.status in ("pass", "skipped"), c.messages     # skipped only if the module is absent
    if properties.status == "pass":
        assert {t.name for t in properties.tests} >= {"tolerance"}
        assert json.loads((tmp_path / f"properties-{OP}.json").read_text())["passed"] is True
    if budget.status == "pass":
        assert json.loads((tmp_path / f"budget-{OP}.json").read_text())["passed"] is True
        assert (tmp_path / f"budget-{OP}.md").exists()


def test_properties_and_budget_components_fail_a_broken_path():
    pytest.importorskip("fuseval.budget.runner")
    pytest.importorskip("fuseval.properties.fast_vs_reference")
    report = run_gate(OP, thin_margin, components=["properties", "budget"], budget_cases="0", seeds=1)
    properties, budget = report.components
    assert properties.status == "fail" and report.exit_code == EXIT_CHECK_FAILED
    assert any("reproduce" in m for m in properties.messages)      # the failure says how to rerun it
    assert any(t.status == "fail" for t in properties.tests)
    assert budget.status == "fail" and budget.messages and "budget" in budget.messages[0]


def test_bad_gate_input_raises_with_distinct_exit_codes():
    with pytest.raises(FusevalError) as e:
        run_gate("no_such_op", "torch", **FAST)
    assert e.value.exit_code == EXIT_UNKNOWN_OPERATOR and "known operators" in str(e.value)
    with pytest.raises(FusevalError) as e:
        run_gate(OP, "no_such_module_xyz:fn", **FAST)
    assert e.value.exit_code == EXIT_IMPORT_ERROR and "no_such_module_xyz" in str(e.value)
    with pytest.raises(FusevalError, match="unknown gate profile"):
        run_gate(OP, "torch", profile="nightly", **FAST)
    with pytest.raises(FusevalError, match="unknown gate component"):
        run_gate(OP, "torch", components=["lint"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_gpu_profile_without_a_gpu_is_a_clear_error():
    with pytest.raises(FusevalError) as e:
        run_gate(OP, "torch", profile="gpu", components=["check"])
    assert e.value.exit_code == EXIT_NO_DEVICE and "CUDA" in str(e.value)


def test_profiles_match_the_documented_table():
    assert PROFILES["ci"].device == "cpu" and PROFILES["ci"].config == "small" and PROFILES["ci"].seeds >= 3
    assert PROFILES["gpu"].device == "cuda" and PROFILES["gpu"].config == "seed"
    assert PROFILES["thorough"].seeds > PROFILES["ci"].seeds


def test_all_runs_every_operator():
    report = run_gate("all", "torch", components=["check"], cases="0", seeds=1)
    from fuseval.definitions import list_operators
    assert report.ops == list_operators()
    assert [c.op for c in report.components] == list_operators()
    assert report.passed


def test_cli_gate_prints_a_summary_and_exits_by_verdict(tmp_path, capsys, monkeypatch):
    code = cli.main(["gate", "--op", OP, "--impl", "torch", "--skip", "properties,budget", "--cases", "0-1",
                     "--seeds", "1", "--out", str(tmp_path / "rep")])
    out, err = capsys.readouterr()
    assert code == 0 and "GATE PASSED" in out
    assert "[gate" in err                                  # progress on stderr
    assert (tmp_path / "rep" / "junit.xml").exists()
    # a mutant reached by module path fails with its own exit code
    (tmp_path / "gate_mutant_mod.py").write_text(
        "import torch\nfrom fuseval.operators.nvfp4_qkv_rope.reference import torch_eager\n"
        "def nan(*a):\n    q, k, v = torch_eager(*a)\n    return q * float('nan'), k, v\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code = cli.main(["gate", "--op", OP, "--impl", "gate_mutant_mod:nan", "--skip", "properties,budget",
                     "--cases", "0", "--seeds", "1", "--out", str(tmp_path / "rep2"), "--quiet"])
    out, err = capsys.readouterr()
    assert code == EXIT_NONFINITE and "GATE FAILED" in out and "nonfinite" in out
    assert err == ""                                       # --quiet: no progress
    assert "Traceback" not in out + err


def test_junit_xml_escapes_and_strips_control_characters():
    c = ComponentResult(OP, "check", "fail", "bad <tag> & \x07bell", messages=["x < y"])
    xml = GateReport([OP], "impl", "ci", "cpu", False, [c], 1.0, "now").to_junit_xml()
    root = ET.fromstring(xml)                              # parses: escaped, no control chars
    assert root.find(".//failure").get("message") == "bad <tag> & bell"


def test_public_api_is_lazy_and_complete():
    # `import fuseval` must not import Triton; the documented names resolve on first use
    import subprocess
    import sys
    code = ("import sys, fuseval\n"
            "assert 'triton' not in sys.modules, 'import fuseval imported triton'\n"
            "assert callable(fuseval.check) and fuseval.ops.get('nvfp4_qkv_rope').name == 'nvfp4_qkv_rope'\n"
            "assert callable(fuseval.budget.run_budget) and callable(fuseval.properties.check_implementation)\n"
            "assert callable(fuseval.run_gate) and fuseval.gate.run_gate is fuseval.run_gate\n"
            "assert callable(fuseval.baseline.compare) and callable(fuseval.stats.check_over_seeds)\n"
            "assert {'check', 'budget', 'ops', 'properties'} <= set(fuseval.__all__)\n"
            "for name in ('check', 'run_gate'):\n"
            "    assert getattr(fuseval, name).__doc__, name\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
