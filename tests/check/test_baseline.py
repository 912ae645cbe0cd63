"""Regression baselines (fuseval.baseline, `fuseval baseline save/compare`).

Acceptance: a planted error regression is flagged, a rerun of the unchanged implementation
is not. The noise model and the latency rule are tested on hand-made documents whose
numbers make the arithmetic of the rule visible."""
from __future__ import annotations

import copy
import json

import pytest
import torch

from fuseval import baseline, bench, cli
from fuseval.operators import implementations as ops
from fuseval.errors import EXIT_BAD_FILE, EXIT_REGRESSION, EXIT_UNKNOWN_OPERATOR, FusevalError, TimingRefused
from fuseval.operators.nvfp4_qkv_rope.reference import torch_eager

OP = "nvfp4_qkv_rope"
CASES = "0-3"


def less_accurate(*inputs):
    """The planted regression: query_states scaled by 1 + 2^-6, an error several times
    the bf16 rounding the path had, while every case still passes the tolerance rule
    on most elements."""
    q, k, v = torch_eager(*inputs)
    return (q.float() * (1 + 2 ** -6)).to(torch.bfloat16), k, v


def fails_batch_one_short_sequences(*inputs):
    """Correct, except NaN keys on the 8-token single-batch cases (0 and 1)."""
    q, k, v = torch_eager(*inputs)
    if q.shape[0] == 1 and q.shape[2] == 8:
        k = torch.full_like(k, float("nan"))
    return q, k, v


@pytest.fixture(scope="module")
def torch_baseline():
    return baseline.collect(OP, "torch", config="small", cases=CASES, seeds=3)


def test_baseline_document_records_cases_outputs_and_spread(torch_baseline, tmp_path):
    doc = torch_baseline
    assert doc["schema_version"] == baseline.SCHEMA_VERSION
    assert (doc["op"], doc["impl"], doc["config"], doc["device"]) == (OP, "torch", "small", "cpu")
    assert doc["seeds"] == [0, 1000, 2000]
    assert sorted(doc["cases"], key=int) == ["0", "1", "2", "3"]
    q = doc["cases"]["0"]["outputs"]["query_states"]
    assert set(q) == {"max_abs", "mean_abs", "rel_l2", "fail_fraction"}
    assert q["max_abs"]["median"] <= q["max_abs"]["max"] and q["max_abs"]["spread"] >= 0
    assert q["max_abs"]["spread"] > 0                # three input draws differ
    assert doc["cases"]["0"]["latency_ms"] is None   # no latency on the CPU
    path = baseline.save(doc, str(tmp_path / "b.json"))
    again = baseline.load(path)
    assert again["cases"]["2"]["passed"] is True
    text = (tmp_path / "b.json").read_text()
    assert '"max_abs": {"max": ' in text             # one line per distribution: short diffs


def test_rerun_of_unchanged_implementation_is_not_flagged(torch_baseline, tmp_path):
    saved = baseline.load(baseline.save(torch_baseline, str(tmp_path / "b.json")))
    rerun = baseline.collect(OP, "torch", config="small", cases=CASES, seeds=saved["seeds"])
    comparison = baseline.compare(saved, rerun)
    assert comparison.passed, comparison.to_markdown()
    assert not comparison.regressions
    assert all(f.kind == "ok" for f in comparison.findings)
    assert "no regression" in comparison.summary()


def test_planted_error_regression_is_flagged(torch_baseline):
    current = baseline.collect(OP, less_accurate, config="small", cases=CASES, seeds=torch_baseline["seeds"])
    comparison = baseline.compare(torch_baseline, current)
    assert not comparison.passed
    flagged = {(f.name, f.metric) for f in comparison.regressions if f.kind == "error_growth"}
    assert ("query_states", "mean_abs") in flagged and ("query_states", "rel_l2") in flagged
    # the outputs the regression did not touch are not flagged
    assert not any(f.name in ("key_states", "value_states") for f in comparison.regressions)
    md = comparison.to_markdown()
    assert "REGRESSION error growth" in md and "| case |" in md


def test_newly_failing_case_is_flagged(torch_baseline):
    current = baseline.collect(OP, fails_batch_one_short_sequences, config="small", cases=CASES,
                               seeds=torch_baseline["seeds"])
    comparison = baseline.compare(torch_baseline, current)
    new = [f for f in comparison.regressions if f.kind == "new_failure"]
    assert sorted(f.case for f in new) == [0, 1]
    assert "nonfinite" in new[0].note


def test_still_failing_and_fixed_cases_are_listed_not_flagged(torch_baseline):
    broken = baseline.collect(OP, fails_batch_one_short_sequences, config="small", cases="0", seeds=[0, 1000, 2000])
    base = copy.deepcopy(torch_baseline)
    base["cases"] = {"0": base["cases"]["0"]}
    still = baseline.compare(broken, broken)
    assert still.passed and [f.kind for f in still.findings if f.kind != "ok"] == ["still_failing"]
    fixed = baseline.compare(broken, base)
    assert any(f.kind == "fixed" for f in fixed.findings)
    assert not any(f.kind == "new_failure" for f in fixed.regressions)


# --------------------------------------------------------------------------- the noise model
def _doc(metric_median, spread, *, latency=None, device_name="cpu", passed=True):
    return {"schema_version": 1, "op": OP, "impl": "x", "config": "small", "device": "cpu",
            "device_name": device_name, "mode": "benchmark", "seeds": [0, 1000, 2000],
            "tolerance": {"atol": 5e-3, "rtol": 5e-3, "min_matched_ratio": 0.95, "max_abs_error": 1.0},
            "cases": {"0": {"axes": {}, "passed": passed, "outputs": {
                "q": {"max_abs": {"median": metric_median, "max": metric_median + spread, "spread": spread}}},
                "stages": {}, "latency_ms": latency}}}


def _flagged(base, cur, **kw):
    return [f.kind for f in baseline.compare(base, cur, **kw).regressions]


def test_growth_within_the_seed_spread_is_noise():
    base = _doc(1e-3, 1e-3)                         # limit: max(2e-3, 1e-3 + 3 * 1e-3) = 4e-3
    assert _flagged(base, _doc(3.9e-3, 0)) == []
    assert _flagged(base, _doc(4.1e-3, 0)) == ["error_growth"]


def test_growth_beyond_the_factor_is_flagged_when_spread_is_small():
    base = _doc(1e-3, 1e-5)                         # limit: 2e-3
    assert _flagged(base, _doc(1.9e-3, 0)) == []
    assert _flagged(base, _doc(2.1e-3, 0)) == ["error_growth"]
    assert _flagged(base, _doc(2.1e-3, 0), factor=3.0) == []


def test_floor_ignores_tiny_absolute_changes():
    # from exact (0) to 1e-9: far below a hundredth of atol (5e-5), not a regression
    assert _flagged(_doc(0.0, 0.0), _doc(1e-9, 0)) == []
    assert _flagged(_doc(0.0, 0.0), _doc(1e-4, 0)) == ["error_growth"]


def test_nonfinite_error_in_the_current_run_is_flagged():
    # collect() stores a NaN metric as inf (the worst value), which always exceeds the limit
    assert baseline.summarize([1e-3, float("nan"), 2e-3])["max"] == float("inf")
    assert _flagged(_doc(1e-3, 0), _doc(float("inf"), 0)) == ["error_growth"]


def test_latency_rule_and_device_mismatch():
    lat = lambda m, s=0.01: {"median": m, "max": m + s, "spread": s}
    base = _doc(1e-3, 0, latency=lat(1.0), device_name="H200")
    assert _flagged(base, _doc(1e-3, 0, latency=lat(1.05), device_name="H200")) == []
    assert _flagged(base, _doc(1e-3, 0, latency=lat(1.3), device_name="H200")) == ["slowdown"]
    assert _flagged(base, _doc(1e-3, 0, latency=lat(1.3), device_name="H200"), slowdown=0.5) == []
    other = baseline.compare(base, _doc(1e-3, 0, latency=lat(1.3), device_name="A100"))
    assert other.passed and any("device differs" in n or "device_name" in n for n in other.notes + [
        f.note for f in other.findings])


def test_compare_rejects_mismatched_operators_and_bad_options():
    a = _doc(1e-3, 0)
    b = copy.deepcopy(a)
    b["op"] = "qwen2vl_decoder_layer"
    with pytest.raises(FusevalError, match="operator"):
        baseline.compare(a, b)
    with pytest.raises(ValueError, match="factor"):
        baseline.compare(a, a, factor=0.5)


def test_stage_metrics_from_the_budget_are_recorded_and_compared():
    pytest.importorskip("fuseval.budget.runner")
    # the float32 reference has stage taps, so the budget measures every stage of it
    doc = baseline.collect(OP, "reference_fp32", config="small", cases="0", seeds=3)
    assert "budget" in doc["sources"]
    stages = doc["cases"]["0"]["stages"]
    assert {"proj", "qk_norm", "rope"} <= set(stages)
    assert "local.max_abs" in stages["proj"] and "propagated.rel_l2" in stages["proj"]
    assert baseline.compare(doc, doc).passed
    worse = copy.deepcopy(doc)
    entry = worse["cases"]["0"]["stages"]["proj"]["local.max_abs"]
    entry["median"] = 10 * entry["median"] + 1e-3
    flagged = baseline.compare(doc, worse).regressions
    assert [(f.group, f.name, f.metric) for f in flagged] == [("stages", "proj", "local.max_abs")]


# --------------------------------------------------------------------------- latency
def test_latency_is_timed_by_the_bench_timer(monkeypatch):
    """A baseline's latencies come from the bench's own timed runs
    (fuseval.runner.timing.time_impl, under the bench's default rules): one timer for bench
    and baseline; a refused timing is an error, never a recorded latency."""
    from fuseval.runner import timing
    calls = []

    def recording(runner, defn, case, *, rules, **kw):
        calls.append((case.index, dict(rules)))
        if case.index == 9:
            return timing.TimedRun(None, [("replayed_output", "stale")])
        return timing.TimedRun({"median_ms": 0.25 * len(calls)})

    monkeypatch.setattr(baseline, "time_impl", recording)          # where baseline looks it up
    operator = ops.get(OP, "small")
    subject = baseline._subject(operator, "torch", torch.device("cpu"), isolate=False)
    selected = operator.definition.cases("0-1")
    per_case = {c.index: {"latency_ms": []} for c in selected}
    baseline._latencies(subject, "torch", selected, 0, "benchmark", torch.device("cpu"), per_case)
    assert [per_case[c.index]["latency_ms"] for c in selected] == [[0.25], [0.5]]
    assert [r for _, r in calls] == [{"warmup_ms": bench.WARMUP_MS, "rep_ms": bench.REP_MS,
                                      "min_reps": bench.MIN_REPS, "max_reps": bench.MAX_REPS, "flush": True}] * 2
    refused = operator.definition.cases("9")
    with pytest.raises(TimingRefused, match="replayed_output"):
        baseline._latencies(subject, "torch", refused, 0, "benchmark", torch.device("cpu"),
                            {9: {"latency_ms": []}})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_latency_baseline_records_the_timer_rules():
    doc = baseline.collect(OP, "torch", config="small", cases="0", device="cuda", seeds=3, stages=False)
    assert doc["timer"] == bench.timer_rules() and doc["timer"]["l2_flush_bytes"] > 0
    lat = doc["cases"]["0"]["latency_ms"]
    assert 0 < lat["median"] <= lat["max"] and "latency" in doc["sources"]
    assert baseline.compare(doc, doc).passed


def test_compare_notes_latencies_timed_under_other_rules():
    lat = {"median": 1.0, "max": 1.01, "spread": 0.01}
    base = _doc(1e-3, 0, latency=lat, device_name="H200")
    cur = copy.deepcopy(base)
    for d, flush in ((base, 0), (cur, bench.L2_FLUSH_BYTES)):
        d["sources"] = ["check", "latency"]
        d["timer"] = {**bench.timer_rules(), "l2_flush_bytes": flush}
    assert any("different rules" in n for n in baseline.compare(base, cur).notes)
    assert not any("different rules" in n for n in baseline.compare(cur, cur).notes)


def test_saved_baseline_is_strict_json_with_non_finite_values(tmp_path):
    doc = _doc(float("inf"), float("inf"))
    doc["cases"]["0"]["outputs"]["q"]["max_abs"]["max"] = float("inf")
    doc["cases"]["0"]["outputs"]["q"]["rel_l2"] = {"median": 1.23456789e-4, "max": 2e-4, "spread": 7.654321e-5}
    path = baseline.save(doc, str(tmp_path / "b.json"))

    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")
    raw = json.loads(open(path).read(), parse_constant=refuse)
    assert raw["cases"]["0"]["outputs"]["q"]["max_abs"] == {"median": "inf", "max": "inf", "spread": "inf"}
    assert raw["cases"]["0"]["outputs"]["q"]["rel_l2"]["median"] == 1.23457e-4     # 6 significant digits
    again = baseline.load(path)
    assert _flagged(again, _doc(1.0, 0)) == []                  # inf read back as inf: nothing exceeds it


# --------------------------------------------------------------------------- files and CLI
@pytest.mark.parametrize("content, problem", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"schema_version": 99}', "newer than this fuseval"),
    ('{"schema_version": 1, "op": "nvfp4_qkv_rope"}', "missing key"),
])
def test_malformed_baseline_files_are_bad_file_errors(tmp_path, content, problem):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(FusevalError) as e:
        baseline.load(str(path))
    assert e.value.exit_code == EXIT_BAD_FILE and problem in str(e.value) and "bad.json" in str(e.value)


def test_malformed_distribution_is_named_by_its_path(tmp_path):
    doc = _doc(1e-3, 0)
    doc["cases"]["0"]["outputs"]["q"]["max_abs"]["median"] = "lots"
    (tmp_path / "b.json").write_text(json.dumps(doc))
    with pytest.raises(FusevalError, match=r"cases\.0\.outputs\.q\.max_abs\.median"):
        baseline.load(str(tmp_path / "b.json"))


def test_cli_save_and_compare(tmp_path, capsys, monkeypatch):
    (tmp_path / "baseline_mutant_mod.py").write_text(
        "import torch\nfrom fuseval.operators.nvfp4_qkv_rope.reference import torch_eager\n"
        "def worse(*a):\n    q, k, v = torch_eager(*a)\n"
        "    return (q.float() * (1 + 2 ** -6)).to(torch.bfloat16), k, v\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    folder = tmp_path / "baselines"
    assert cli.main(["baseline", "save", "--op", OP, "--impl", "torch", "--cases", "0-1", "--no-stages",
                     "--out", str(folder)]) == 0
    path = folder / f"{OP}.small.cpu.json"
    assert path.exists() and "wrote" in capsys.readouterr().out
    assert cli.main(["baseline", "compare", "--baseline", str(path)]) == 0
    assert "no regression" in capsys.readouterr().out
    md = tmp_path / "diff.md"
    code = cli.main(["baseline", "compare", "--baseline", str(path), "--impl", "baseline_mutant_mod:worse",
                     "--markdown", str(md), "--json", str(tmp_path / "diff.json")])
    out, err = capsys.readouterr()
    assert code == EXIT_REGRESSION and "REGRESSION" in out and "Traceback" not in out + err
    assert "error growth" in md.read_text()
    assert json.loads((tmp_path / "diff.json").read_text())[0]["passed"] is False


def test_cli_bad_input(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert cli.main(["baseline", "compare", "--baseline", str(bad)]) == EXIT_BAD_FILE
    assert "not valid JSON" in capsys.readouterr().err
    assert cli.main(["baseline", "save", "--op", "nope", "--out", str(tmp_path)]) == EXIT_UNKNOWN_OPERATOR
    assert cli.main(["baseline", "save", "--op", OP, "--impl", "torch", "--seeds", "2",
                     "--out", str(tmp_path)]) != 0
    assert ">= 3" in capsys.readouterr().err
