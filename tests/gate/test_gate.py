"""The CI gate (fuseval.gate, `fuseval gate`): verdicts, exit codes, isolation of
components, operators without the implementation asked for, the timing breakdown, blind
tolerances, and the JUnit / JSON / Markdown reports.

The implementations are the plain-torch path of op B (correct) and mutants of it that each
break one rule; every verdict the gate can give is produced by one of them. The scaled-down
configuration and a few cases keep each run to a second or two."""
from __future__ import annotations

import json
import os
import re
import sys
import time
import types
import xml.etree.ElementTree as ET

import pytest
import torch

from fuseval import cli
from fuseval.errors import (EXIT_BAD_FILE, EXIT_HYGIENE, EXIT_BAD_OUTPUTS, EXIT_CHECK_FAILED, EXIT_IMPL_RAISED, EXIT_IMPORT_ERROR,
                            EXIT_INTERNAL, EXIT_NO_DEVICE, EXIT_NONFINITE, EXIT_UNKNOWN_OPERATOR, BadFileError,
                            FusevalError, UsageError)
from fuseval.comparison import BlindOutput
from fuseval.gate import PROFILES, RUNNERS, ComponentResult, GateReport, run_component, run_gate
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
    def broken(ctx):
        raise RuntimeError("budget renderer exploded")
    monkeypatch.setitem(RUNNERS, "budget", broken)
    report = run_gate(OP, "torch", components=["budget", "check"], cases="0", seeds=1)
    budget, check = report.components
    assert budget.status == "error" and "budget renderer exploded" in budget.summary
    assert check.status == "pass"                          # still ran after the crash
    assert report.exit_code == EXIT_INTERNAL               # a bug in fuseval, with its traceback
    assert "Traceback" in budget.data["traceback"] and "budget renderer exploded" in budget.data["traceback"]
    xml = ET.fromstring(report.to_junit_xml())
    assert xml.get("errors") == "1"
    assert "budget renderer exploded" in report.to_markdown()


def test_a_component_that_raises_a_fuseval_error_keeps_its_exit_code(monkeypatch):
    # a failure fuseval knows (here: a report file it cannot use) is not a crash: its own
    # exit code, no traceback
    def bad_file(ctx):
        raise BadFileError("budget-x.json: not valid JSON")
    monkeypatch.setitem(RUNNERS, "budget", bad_file)
    report = run_gate(OP, "torch", components=["check", "budget"], cases="0", seeds=1)
    check, budget = report.components
    assert check.status == "pass" and budget.status == "error"
    assert budget.exit_code == EXIT_BAD_FILE == report.exit_code
    assert "traceback" not in budget.data and "not valid JSON" in budget.summary


def test_implementation_verdict_outranks_a_crashed_component(monkeypatch):
    monkeypatch.setitem(RUNNERS, "budget", lambda ctx: 1 / 0)
    report = run_gate(OP, nan_outputs, components=["budget", "check"], cases="0", seeds=1)
    assert report.exit_code == EXIT_NONFINITE


def test_operator_without_the_implementation_is_not_run_under_all(tmp_path):
    # op B (and every other operator but op A) has no 'torch_tf32': under "all" they are
    # reported as not run, op A runs, and the gate passes on what ran
    from fuseval import operators
    from fuseval.operators import load
    lacking = [op for op in operators.names() if "torch_tf32" not in load(op).implementations]
    assert OP in lacking and "qwen2vl_decoder_layer" not in lacking
    report = run_gate("all", "torch_tf32", components=["check"], cases="0", seeds=1, out=str(tmp_path))
    by_op = {c.op: c for c in report.components}
    assert by_op[OP].status == "skipped" and by_op[OP].summary == "not run: no implementation 'torch_tf32'"
    assert by_op["qwen2vl_decoder_layer"].status == "pass"
    assert report.passed and report.exit_code == 0 and report.not_run == [by_op[op] for op in lacking]
    doc = json.loads((tmp_path / "gate.json").read_text())
    assert doc["not_run"] == [{"op": op, "component": "check", "reason": "no implementation 'torch_tf32'"}
                              for op in lacking]
    root = ET.parse(tmp_path / "junit.xml").getroot()
    assert root.get("skipped") == str(len(lacking))
    skipped = root.find(f".//testsuite[@name='fuseval.{OP}.check']/testcase/skipped")
    assert skipped is not None and skipped.get("message") == "no implementation 'torch_tf32'"
    assert "not run" in report.text() and "not run" in (tmp_path / "gate.md").read_text()


def test_naming_an_operator_without_the_implementation_is_an_error():
    with pytest.raises(FusevalError) as e:
        run_gate(OP, "torch_tf32", components=["check"], cases="0", seeds=1)
    assert e.value.exit_code == EXIT_IMPORT_ERROR and "unknown implementation 'torch_tf32'" in str(e.value)
    with pytest.raises(FusevalError) as e:
        run_component("check", OP, "torch_tf32", cases="0", seeds=1)
    assert e.value.exit_code == EXIT_IMPORT_ERROR
    # an implementation no operator has is not a pass of nothing
    with pytest.raises(FusevalError) as e:
        run_gate("all", "no_such_impl_anywhere", components=["check"], cases="0", seeds=1)
    assert e.value.exit_code == EXIT_IMPORT_ERROR and "no operator has it" in str(e.value)


def test_an_operator_without_a_budget_file_skips_only_its_budget(monkeypatch):
    from dataclasses import replace

    from fuseval import operators
    registry = dict(operators.registry())
    registry[OP] = replace(registry[OP], budget=None)
    monkeypatch.setattr(operators, "_REGISTRY", registry)
    report = run_gate(OP, "torch", components=["check", "budget"], cases="0", seeds=1)
    check, budget = report.components
    assert check.status == "pass"
    assert budget.status == "skipped" and "ships no budget file" in budget.summary
    assert report.passed


def test_properties_and_budget_components_run_on_a_correct_path(tmp_path):
    # the real components (ci property profile, a one-case budget): a correct path passes
    report = run_gate(OP, "torch", components=["properties", "budget"], budget_cases="0", out=str(tmp_path))
    properties, budget = report.components
    assert properties.status == "pass" and budget.status == "pass", properties.messages + budget.messages
    assert {t.name for t in properties.tests} >= {"tolerance"}
    assert all(t.status == "pass" for t in properties.tests + budget.tests)
    assert json.loads((tmp_path / f"properties-{OP}.json").read_text())["passed"] is True
    assert json.loads((tmp_path / f"budget-{OP}.json").read_text())["passed"] is True
    assert (tmp_path / f"budget-{OP}.md").exists()
    assert {t.name for t in budget.tests} >= {"stage end_to_end"}
    assert budget.summary.startswith("1/1 cases within budget")


def test_properties_and_budget_components_fail_a_broken_path():
    report = run_gate(OP, thin_margin, components=["properties", "budget"], budget_cases="0", seeds=1)
    properties, budget = report.components
    assert properties.status == "fail" and report.exit_code == EXIT_CHECK_FAILED
    assert any("reproduce" in m for m in properties.messages)      # the failure says how to rerun it
    assert any(t.status == "fail" for t in properties.tests)
    assert budget.status == "fail" and budget.messages and "budget" in budget.messages[0]
    assert any(t.status == "fail" for t in budget.tests)       # the stage (or end to end) over budget


def test_bad_gate_input_raises_with_distinct_exit_codes():
    with pytest.raises(FusevalError) as e:
        run_gate("no_such_op", "torch", **FAST)
    assert e.value.exit_code == EXIT_UNKNOWN_OPERATOR and "known operators" in str(e.value)
    with pytest.raises(FusevalError) as e:
        run_gate(OP, "no_such_module_xyz:fn", **FAST)
    assert e.value.exit_code == EXIT_IMPORT_ERROR and "no_such_module_xyz" in str(e.value)
    with pytest.raises(FusevalError, match="profile: expected one of ci, thorough, gpu, got 'nightly'"):
        run_gate(OP, "torch", profile="nightly", **FAST)
    with pytest.raises(FusevalError, match="components: expected one of check, properties, budget, got 'lint'"):
        run_gate(OP, "torch", components=["lint"])
    for bad, needle in ((dict(device="tpu"), "cpu, cuda or cuda:N"), (dict(cases="99"), "out of range"),
                        (dict(config="bogus"), "unknown config"), (dict(warn_margin=2.0), "warn_margin"),
                        (dict(mode="weird"), "mode"), (dict(budget_cases="0,0"), "more than once")):
        with pytest.raises(FusevalError, match=needle) as e:
            run_gate(OP, "torch", **{**FAST, **bad})
        assert e.value.exit_code == 2, bad


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
    from fuseval.operators import names
    assert report.ops == names()
    assert [c.op for c in report.components] == names()
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
            "assert callable(fuseval.check) and fuseval.operators.implementations.get('nvfp4_qkv_rope').name == 'nvfp4_qkv_rope'\n"
            "assert callable(fuseval.budget.run_budget) and callable(fuseval.properties.check_implementation)\n"
            "assert callable(fuseval.run_gate) and fuseval.gate.run_gate is fuseval.run_gate\n"
            "assert callable(fuseval.baseline.compare) and callable(fuseval.stats.check_over_seeds)\n"
            "assert {'check', 'budget', 'ops', 'properties'} <= set(fuseval.__all__)\n"
            "for name in ('check', 'run_gate'):\n"
            "    assert getattr(fuseval, name).__doc__, name\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


# --------------------------------------------------------------------------- timings, blind tolerances
TIMING_KEYS = ("inputs", "oracle", "impl", "compare", "hygiene")


def _faked_check(monkeypatch, blind: dict[int, list] | None = None):
    """fuseval.check.check with known timings per case (and blind outputs on the seeds
    given: {seed: [BlindOutput]}), so the gate's sums and verdicts can be checked against
    hand arithmetic."""
    fc = sys.modules["fuseval.check"]          # the module (fuseval.check is also the function)
    real = fc.run_check

    def faked(request):
        report = real(request)
        mine = (blind or {}).get(report.seed, [])
        for c in report.cases:
            c.timings = dict(zip(TIMING_KEYS, (0.5, 0.25, 0.125, 0.0625, 1.0)))
            c.blind = [b for b in mine if b.case == c.case]
        return report
    monkeypatch.setattr(fc, "run_check", faked)
    monkeypatch.setattr("fuseval.stats.run_check", faked)   # where the gate's check over seeds looks it up


def test_timing_breakdown_per_component_and_case(monkeypatch, tmp_path, capsys):
    _faked_check(monkeypatch)
    report = run_gate(OP, "torch", out=str(tmp_path), **FAST)          # 2 seeds x 3 cases
    check = report.components[0]
    assert check.timings == {"inputs": 3.0, "oracle": 1.5, "impl": 0.75, "compare": 0.375, "hygiene": 6.0}
    rows = check.data["case_timings"]
    assert [(r["seed"], r["case"]) for r in rows] == [(s, c) for s in (0, 1000) for c in (0, 1, 2)]
    assert all(r["inputs"] == 0.5 and r["hygiene"] == 1.0 for r in rows)
    doc = json.loads((tmp_path / "gate.json").read_text())
    assert doc["components"][0]["timings"]["hygiene"] == 6.0
    assert len(doc["components"][0]["data"]["case_timings"]) == 6
    report.print_summary()
    out = capsys.readouterr().out
    assert re.search(r"check: [\d.]+ s \(inputs 3, oracle 1\.5, impl 0\.75, compare 0\.375, hygiene 6\)", out), out


def test_budget_and_properties_report_their_wall_time(capsys):
    report = run_gate(OP, "torch", components=["budget"], budget_cases="0", seeds=1)
    budget = report.components[0]
    assert budget.seconds > 0 and budget.timings and all(v >= 0 for v in budget.timings.values())
    assert sum(budget.timings.values()) <= budget.seconds * 1.05 + 0.05    # parts of the wall time
    report.print_summary()
    assert re.search(r"budget: [\d.]+ s \(", capsys.readouterr().out)


def test_the_check_reports_the_real_breakdown():
    # fuseval.check's own CaseResult.timings / CheckReport.timings, summed over the seeds
    report = run_gate(OP, "torch", **FAST)
    check = report.components[0]
    assert set(check.timings) == set(TIMING_KEYS)
    reports = check.result.reports
    for key in TIMING_KEYS:
        assert check.timings[key] == pytest.approx(sum(r.timings[key] for r in reports))
    assert len(check.data["case_timings"]) == sum(len(r.cases) for r in reports)


def test_a_blind_tolerance_fails_the_check_component(monkeypatch, tmp_path):
    _faked_check(monkeypatch, blind={1000: [BlindOutput(1, "value_states", 0.0098, 0.005)]})
    report = run_gate(OP, "torch", out=str(tmp_path), **FAST)
    check = report.components[0]
    assert check.status == "fail" and report.exit_code == EXIT_CHECK_FAILED
    assert "blind_tolerance" in check.data["violations"]
    assert any("value_states on case 1 (seed 1000)" in m for m in check.messages)
    root = ET.parse(tmp_path / "junit.xml").getroot()
    failure = root.find(".//testcase[@name='blind tolerance']/failure")
    assert failure is not None and "value_states" in failure.get("message")
    # without blind outputs the same run passes: the verdict above is the blind record's
    _faked_check(monkeypatch, blind={})
    assert run_gate(OP, "torch", **FAST).passed


def test_a_blind_tolerance_does_not_hide_a_worse_violation(monkeypatch):
    _faked_check(monkeypatch, blind={0: [BlindOutput(0, "value_states", 0.0098, 0.005)]})
    report = run_gate(OP, nan_outputs, **FAST)
    assert report.exit_code == EXIT_NONFINITE
    assert {"nonfinite", "blind_tolerance"} <= set(report.components[0].data["violations"])


def test_cli_gate_all_reports_the_operator_without_the_implementation(tmp_path, capsys):
    code = cli.main(["gate", "--op", "all", "--impl", "torch_tf32", "--skip", "properties,budget", "--cases", "0",
                     "--seeds", "1", "--quiet", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    text = " ".join(out.split())
    assert code == 0 and "GATE PASSED" in text and "not run: no implementation 'torch_tf32'" in text, out + err
    code = cli.main(["gate", "--op", OP, "--impl", "torch_tf32", "--skip", "properties,budget", "--cases", "0",
                     "--seeds", "1", "--quiet", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == EXIT_IMPORT_ERROR and "unknown implementation 'torch_tf32'" in err and "Traceback" not in err


def test_parallel_gate_gives_the_serial_report(tmp_path):
    """jobs=2 runs the components in two processes; verdicts, order, summaries and exit
    code are the serial run's, and a broken implementation still fails in its component."""
    kw = dict(components=["check", "budget", "properties"], cases="0,1", seeds=1, budget_cases="0")
    serial = run_gate(OP, "torch", **kw)
    parallel = run_gate(OP, "torch", jobs=2, out=str(tmp_path), **kw)
    assert [(c.op, c.name, c.status) for c in parallel.components] == \
        [(c.op, c.name, c.status) for c in serial.components] == \
        [(OP, "check", "pass"), (OP, "budget", "pass"), (OP, "properties", "pass")]
    assert [c.summary for c in parallel.components] == [c.summary for c in serial.components]
    assert (tmp_path / "gate.json").exists() and (tmp_path / f"check-{OP}.json").exists()
    (tmp_path / "gate_parallel_mod.py").write_text(
        "from fuseval.operators.nvfp4_qkv_rope.reference import torch_eager\n"
        "def half(*a):\n    q, k, v = torch_eager(*a)\n    return q, k, v * 0.5\n")
    import sys
    sys.path.insert(0, str(tmp_path))              # the pool processes import from the parent's path
    try:
        broken = run_gate(OP, "gate_parallel_mod:half", jobs=2, components=["check", "budget"], cases="0",
                          seeds=1, budget_cases="0")
    finally:
        sys.path.remove(str(tmp_path))
    assert [c.status for c in broken.components] == ["fail", "fail"] and broken.exit_code == EXIT_CHECK_FAILED


def test_gate_of_several_operators_runs_one_thread_per_operator(tmp_path, monkeypatch):
    """On the CPU, with several operators, jobs=2 runs each operator's components in a
    thread of its own, through the workers that validation started: no pool process. The
    report is the serial run's, and two properties components never run at once."""
    from fuseval.gate import parallel
    ops = [OP, "residual_rmsnorm"]
    kw = dict(components=["check", "properties", "budget"], cases="0,1", seeds=1, budget_cases="0", isolate=True)
    serial = run_gate(ops, "torch", **kw)
    monkeypatch.setattr(parallel, "run_units", lambda *a, **k: pytest.fail("the process pool ran"))
    events: list[tuple[float, str]] = []
    threaded = run_gate(ops, "torch", jobs=2, out=str(tmp_path), progress=lambda m: events.append(
        (time.perf_counter(), m)), **kw)
    assert [(c.op, c.name, c.status) for c in threaded.components] == \
        [(c.op, c.name, c.status) for c in serial.components]
    assert all(c.status == "pass" for c in threaded.components)
    assert [c.summary for c in threaded.components] == [c.summary for c in serial.components]
    assert threaded.exit_code == serial.exit_code == 0
    spans = {}
    for t, m in events:
        for op in ops:
            if m.startswith(f"{op} properties: "):
                spans.setdefault(op, []).append(t)
    (a0, a1), (b0, b1) = spans[ops[0]], spans[ops[1]]
    assert a1 <= b0 or b1 <= a0, spans
    # both operators' checks ran side by side: each started before either ended
    messages = [m for _, m in events]
    starts = [i for i, m in enumerate(messages) if m.endswith(" check: started")]
    ends = [i for i, m in enumerate(messages) if " check: " in m and not m.endswith("started")]
    assert len(starts) == 2 and len(ends) == 2 and max(starts) < min(ends), messages


def test_the_threaded_gate_is_not_used_where_it_cannot_help():
    from fuseval.gate import parallel
    a, b = (types.SimpleNamespace(op=op) for op in (OP, "residual_rmsnorm"))
    two, one = [(a, "check"), (b, "check")], [(a, "check"), (a, "budget")]
    assert parallel.by_operator(two, "cpu", isolated=True, jobs=2)
    assert not parallel.by_operator(one, "cpu", isolated=True, jobs=2)          # one operator: the pool
    assert not parallel.by_operator(two, "cpu", isolated=False, jobs=2)         # calls in this process
    assert not parallel.by_operator(two, "cpu", isolated=True, jobs=3)  # more processes than operators


def test_one_gpu_runs_one_thread_per_operator_and_several_gpus_a_process_each(monkeypatch):
    """On one GPU the operators' threads share it (a pool process would load its own CUDA
    context and kernels); with a GPU for each job the pool gives each process its own."""
    from fuseval.gate import parallel
    a, b = (types.SimpleNamespace(op=op) for op in (OP, "residual_rmsnorm"))
    two = [(a, "check"), (b, "check"), (a, "budget")]
    monkeypatch.setattr(parallel, "_gpu_ids", lambda device: None)            # one GPU
    assert parallel.default_jobs("cuda", 3, operators=2, isolated=True) == 2
    assert parallel.default_jobs("cuda", 3, operators=2, isolated=False) == 1
    assert parallel.default_jobs("cuda", 3, operators=1, isolated=True) == 1
    assert parallel.by_operator(two, "cuda", isolated=True, jobs=2)
    assert not parallel.by_operator(two, "cuda", isolated=False, jobs=2)
    from fuseval.torch_flags import matmul_flags
    with matmul_flags(tf32=True):       # another thread's block could turn it off under a reference
        assert not parallel.by_operator(two, "cuda", isolated=True, jobs=2)
        assert parallel.by_operator(two, "cpu", isolated=True, jobs=2)
    monkeypatch.setattr(parallel, "_gpu_ids", lambda device: ["0", "1"])      # two GPUs
    assert parallel.default_jobs("cuda", 3, operators=2, isolated=True) == 2
    assert not parallel.by_operator(two, "cuda", isolated=True, jobs=2)


def test_worker_key_does_not_change_when_the_working_folder_is_put_on_the_path(monkeypatch):
    """ops._import_callable puts the working folder on sys.path at the first import of a
    'module:function': the implementation's worker must stay the same (a second worker
    would import torch again mid-run)."""
    import sys
    from fuseval.runner import isolation
    from fuseval.operators import load
    defn = load(OP)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    before = isolation._key("fast", defn, "cpu")
    sys.path.insert(0, os.getcwd())
    assert isolation._key("fast", defn, "cpu") == before
    sys.path.insert(0, "/some/other/folder")
    assert isolation._key("fast", defn, "cpu") != before


@pytest.mark.parametrize("jobs", [0, -1, True, "two", 1.5])
def test_bad_jobs_is_a_usage_error(jobs):
    with pytest.raises(UsageError, match="jobs: expected"):
        run_gate(OP, "torch", jobs=jobs, **FAST)


def _weights_cache_module() -> str:
    """The source of test_hostile's implementation that caches its answer under the
    weights only (correct once, then stale when only the activations change)."""
    import runpy
    import textwrap
    hostile = runpy.run_path(os.path.join(os.path.dirname(os.path.dirname(__file__)), "runner", "test_hostile.py"))
    return textwrap.dedent(hostile["COMMON"]) + textwrap.dedent(hostile["HOSTILE"]["hostile_weights_cache"][0])


def test_budget_leaves_the_partial_cache_calls_to_the_check_of_the_same_run(tmp_path, monkeypatch):
    """With the check in the same gate on the budget's cases, the budget makes no
    partial-cache calls (they would repeat the check's), and a result cached on the
    weights is still caught, by the check; a gate of the budget alone makes them itself."""
    from fuseval import budget as budget_pkg
    (tmp_path / "gate_cache_mod.py").write_text(_weights_cache_module())
    monkeypatch.syspath_prepend(str(tmp_path))
    calls = []
    real = budget_pkg.runner.run_request

    def spy(request):
        calls.append(request.hygiene)
        return real(request)
    monkeypatch.setattr("fuseval.gate.components.run_budget_request", spy)   # where the gate looks it up
    both = run_gate(OP, "gate_cache_mod:impl", components=["check", "budget"], cases="0,1", seeds=1,
                    budget_cases="0", isolate=False)
    assert calls == [False]
    check, bud = both.components
    assert check.status == "fail" and "returned identical outputs" in " ".join(check.messages)
    assert both.exit_code == EXIT_HYGIENE
    # the budget takes the check's finding on its case: it passes nothing the rules reject
    assert bud.status == "fail" and bud.exit_code == EXIT_HYGIENE
    assert "the check of this run found cached_result on budget case(s) 0" in bud.messages[0]
    honest = run_gate(OP, "torch", components=["check", "budget"], cases="0,1", seeds=1, budget_cases="0")
    assert [c.status for c in honest.components] == ["pass", "pass"] and calls[-1] is False
    alone = run_gate(OP, "gate_cache_mod:impl", components=["budget"], cases="0,1", seeds=1, budget_cases="0",
                     isolate=False)
    assert calls == [False, False, True]
    assert alone.components[0].status == "fail"
    assert "cached_result" in json.dumps(alone.components[0].data) + " ".join(alone.components[0].messages)
    # budget cases the check does not run: the budget makes the calls itself
    run_gate(OP, "torch", components=["check", "budget"], cases="1", seeds=1, budget_cases="0")
    assert calls[-1] is True


def test_workers_of_several_operators_are_spawned_side_by_side():
    """prespawn starts one bare process per operator whose worker is not alive (none for a
    live one), and worker_for takes them instead of spawning its own."""
    from fuseval.runner import isolation
    from fuseval.operators import load
    isolation.close_all()
    defns = [load(OP, "small"), load("qwen2vl_decoder_layer", "small")]
    try:
        assert isolation.prespawn("torch", defns, "cpu") == 2
        assert len(isolation._spare) == 2
        isolation.worker_for("torch", defns[0], "cpu")
        assert len(isolation._spare) == 1
        assert isolation.prespawn("torch", defns, "cpu") == 0      # one live, one spare waiting
    finally:
        isolation.close_all()


def test_pool_processes_get_a_gpu_each_when_there_is_one_for_each(monkeypatch):
    """With a GPU for every process, pool process k runs on the (k+1)-th visible GPU (the
    gate's own process keeps the first); with fewer GPUs, an explicit cuda:N or the CPU
    they share."""
    import multiprocessing
    from fuseval.gate import parallel
    assert parallel.gpu_assignment("cuda", 3, ["0", "1", "2", "3"]) == ["1", "2"]
    assert parallel.gpu_assignment("cuda", 2, ["4", "6"]) == ["6"]
    assert parallel.gpu_assignment("cuda", 3, ["0", "1"]) is None         # fewer GPUs than processes
    assert parallel.gpu_assignment("cuda:1", 2) is None and parallel.gpu_assignment("cpu", 2) is None
    counter = multiprocessing.get_context("spawn").Value("i", 0)
    seen, threads = [], torch.get_num_threads()
    try:
        for _ in range(3):
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
            parallel._init(None, 1, list(sys.path), os.getcwd(), ["1", "2"], counter)
            seen.append(os.environ["CUDA_VISIBLE_DEVICES"])
    finally:
        torch.set_num_threads(threads)
    assert seen == ["1", "2", "1"]
    if not torch.cuda.is_available():
        assert parallel.default_jobs("cuda", 6) == 1 and parallel.default_jobs("cpu", 1) == 1


# --------------------------------------------------------------------------- warm-up (CUDA)
def test_warmup_takes_every_case_shape_of_check_and_budget_once(tmp_path):
    from fuseval.gate import warmup
    from fuseval.gate.context import context, settings
    from fuseval.gate.request import GateRequest
    s = settings(GateRequest(OP, "torch", profile="ci", device="cpu", cases="0-3", seeds=1, budget_cases="1,2",
                             isolate=False, components=["check", "budget"]).validated())
    ctx = context(OP, "torch", s)
    items = warmup.shapes([ctx])
    from fuseval.operators import load
    defn = load(OP, "small")
    want = []
    for c in defn.cases([0, 1, 2, 3]):
        if dict(c.axes) not in want:
            want.append(dict(c.axes))
    assert [axes for _, _, axes in items] == want and all(op == OP for op, _, _ in items)
    # two operators: their shapes taken in turn (the threaded gate starts both at once)
    other = context("residual_rmsnorm", "torch", s)
    mine = warmup.shapes([other])
    both = warmup.shapes([ctx, other])
    assert [op for op, _, _ in both[:4]] == [OP, "residual_rmsnorm"] * 2
    assert [i for i in both if i[0] == OP] == items and [i for i in both if i[0] != OP] == mine
    assert warmup.shapes([ctx], components=["check"]) == [(OP, "small", a) for a in want]
    assert warmup.shapes([ctx], components=["properties"]) == []
    # the plan: the first case shapes, then each operator's property run, then the rest
    work = warmup.plan([ctx, other], ["check", "properties", "budget"], processes=3)
    assert work[:3] == [("case", *i) for i in both[:3]]
    assert work[3:5] == [("properties", OP, "ci", None), ("properties", "residual_rmsnorm", "ci", None)]
    assert work[5:] == [("case", *i) for i in both[3:]]
    assert all(k == "case" for k, *_ in warmup.plan([ctx, other], ["check", "budget"], processes=3))
    # nothing starts where it cannot help
    assert warmup.start([ctx], "torch", "cpu", "benchmark", isolated=True, progress=print) is None
    assert warmup.start([ctx], torch_eager, "cuda", "benchmark", isolated=True, progress=print) is None
    assert warmup.start([ctx], "torch", "cuda", "benchmark", isolated=False, progress=print) is None


def test_warmup_processes_call_each_shape_and_its_stage_taps(tmp_path, monkeypatch):
    """The processes call the implementation once per shape, and its .staged where it has
    one; a call that raises is skipped, not fatal."""
    from fuseval.gate import warmup
    log = tmp_path / "calls.txt"
    (tmp_path / "warm_mod.py").write_text(
        "import os\n"
        f"LOG = {str(log)!r}\n"
        "def fn(*inputs):\n"
        "    with open(LOG, 'a') as f:\n"
        "        f.write(f'call {tuple(inputs[0].shape)}\\n')\n"
        "    if inputs[0].shape[1] == 16:\n"
        "        raise RuntimeError('planted failure')\n"
        "def _staged(*inputs, taps=None, override=None):\n"
        "    with open(LOG, 'a') as f:\n"
        "        f.write(f'staged {tuple(inputs[0].shape)}\\n')\n"
        "fn.staged = _staged\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    items = [("case", OP, "small", {"seq_len": 8, "batch_size": 1}),
             ("case", OP, "small", {"seq_len": 16, "batch_size": 2}),
             ("properties", OP, "ci", None),
             ("case", OP, "small", {"seq_len": 32, "batch_size": 1})]
    calls = []
    monkeypatch.setattr(warmup, "check_implementation",
                        lambda op, impl, profile, device: calls.append((op, impl, profile, device)))
    for item in items[2:3]:                       # the property run, here (spawned processes import afresh)
        warmup._warm_one(item, "warm_mod:fn", "cpu", "benchmark")
    assert calls == [(OP, "warm_mod:fn", "ci", "cpu")]
    warm = warmup.spawn([i for i in items if i[0] == "case"], "warm_mod:fn", "cpu", "benchmark", 2)
    for p in warm.procs:
        p.join(120)
    assert len(warm.procs) == 2 and warm.done == 3
    lines = sorted(log.read_text().splitlines())
    assert lines == sorted(["call (1, 8, 64)", "staged (1, 8, 64)", "call (2, 16, 64)",
                            "call (1, 32, 64)", "staged (1, 32, 64)"]), lines
    assert warm.stop().startswith("warm-up: 3 of 3 items compiled beside the gate, the last ")


def test_matmul_flag_blocks_in_two_threads_restore_the_flags_they_found():
    """Two threads' flag blocks never interleave their save and restore: after both, the
    flags are as before (interleaved, the second block would restore the first's value)."""
    import threading
    from fuseval.torch_flags import matmul_flags
    m = torch.backends.cuda.matmul
    before = (m.allow_tf32, torch.backends.cudnn.allow_tf32, m.allow_fp16_reduced_precision_reduction)
    inside = threading.Event()
    seen = []

    def second():
        inside.wait()
        with matmul_flags(tf32=False):
            seen.append(m.allow_tf32)

    t = threading.Thread(target=second)
    t.start()
    with matmul_flags(tf32=True, fp16_reduction=False):
        inside.set()
        t.join(0.2)                    # the second block waits for this one to end
        assert t.is_alive() and m.allow_tf32 and not m.allow_fp16_reduced_precision_reduction
    t.join()
    assert seen == [False]
    assert (m.allow_tf32, torch.backends.cudnn.allow_tf32, m.allow_fp16_reduced_precision_reduction) == before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_each_operator_thread_queues_its_kernels_on_a_stream_of_its_own():
    """The threaded gate on a GPU: each operator's thread has a CUDA stream of its own (on
    the shared default stream one operator's kernels wait behind the other's), and a
    result computed there is complete after the block."""
    import threading
    from fuseval.gate import parallel
    seen, results = [], {}

    def work(name):
        with parallel._own_stream("cuda"):
            seen.append(torch.cuda.current_stream().cuda_stream)
            x = torch.full((1 << 20,), 2.0, device="cuda")
            results[name] = x @ x
    threads = [threading.Thread(target=work, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    default = torch.cuda.default_stream().cuda_stream
    assert len(set(seen)) == 2 and default not in seen
    assert torch.cuda.current_stream().cuda_stream == default
    assert float(results["a"]) == float(results["b"]) == 4.0 * (1 << 20)


def test_the_threads_own_stream_is_nothing_on_the_cpu():
    from fuseval.gate import parallel
    with parallel._own_stream("cpu"):
        assert torch.ones(3).sum() == 3
