"""Statistical verdicts (fuseval.stats): margins to thresholds over several seeds.

The judge is tested on numbers chosen by hand against the rule's arithmetic; the repeated
check is tested on the plain-torch path of op B (which passes with a wide margin) and on
two mutants of it: one that breaks just enough elements to pass with a thin margin (must
warn, not pass) and one that breaks too many (must fail)."""
from __future__ import annotations

import json
import math

import pytest
import torch

from fuseval.jsonio import jsonable
from fuseval.operators.nvfp4_qkv_rope.reference import torch_eager
from fuseval.stats import check_over_seeds, judge, seed_list, stats_from_reports

OP = "nvfp4_qkv_rope"   # tolerance: >= 95% matched, max abs <= 1.0


# --------------------------------------------------------------------------- judge
def test_issue_example_matched_989_against_98_is_a_warning():
    # 98.9% matched against a 98% rule uses 1.1 of the 2 allowed points: 45% left < 50%
    m = judge([0.999, 0.989, 0.995], direction="min", threshold=0.98)
    assert m.verdict == "warn"
    assert m.worst == pytest.approx(0.989)
    assert m.margin == pytest.approx(0.009)
    assert m.margin_fraction == pytest.approx(0.45)


def test_wide_margin_passes_and_breach_fails():
    assert judge([0.9995, 0.9999], direction="min", threshold=0.98).verdict == "pass"
    failing = judge([0.999, 0.979], direction="min", threshold=0.98)
    assert failing.verdict == "fail" and failing.margin < 0


def test_warn_margin_is_configurable():
    assert judge([0.989], direction="min", threshold=0.98, warn_margin=0.25).verdict == "pass"
    assert judge([0.989], direction="min", threshold=0.98, warn_margin=0.9).verdict == "warn"


def test_max_direction_margin_is_relative_to_the_bound():
    assert judge([0.1, 0.6], direction="max", threshold=1.0).verdict == "warn"     # 40% left
    assert judge([0.1, 0.3], direction="max", threshold=1.0).verdict == "pass"     # 70% left
    assert judge([0.1, 1.2], direction="max", threshold=1.0).verdict == "fail"


def test_nan_sample_is_the_worst_and_fails():
    assert judge([0.99, math.nan], direction="min", threshold=0.95).verdict == "fail"
    assert judge([0.1, math.nan], direction="max", threshold=1.0).verdict == "fail"


def test_distribution_and_worst_location():
    m = judge([0.97, 0.99, 0.96, 0.999], direction="min", threshold=0.95,
              where=[(0, 0), (1, 0), (2, 1000), (3, 1000)], output="q", metric="matched_ratio")
    assert (m.min, m.max, m.n) == (0.96, 0.999, 4)
    assert m.median == pytest.approx(0.98)
    assert (m.worst_case, m.worst_seed) == (2, 1000)
    assert "case 2, seed 1000" in m.describe()


def test_informational_metric_has_no_verdict():
    m = judge([1e-3, 2e-3], direction="max", threshold=None)
    assert m.verdict == "info" and m.margin is None


def test_judge_rejects_bad_arguments():
    with pytest.raises(ValueError, match="direction"):
        judge([1.0], direction="up", threshold=1.0)
    with pytest.raises(ValueError, match="warn_margin"):
        judge([1.0], direction="min", threshold=0.9, warn_margin=2.0)
    with pytest.raises(ValueError, match="no samples"):
        judge([], direction="min", threshold=0.9)
    with pytest.raises(ValueError, match="seeds"):
        seed_list(0)


# --------------------------------------------------------------------------- repeated check
def _corrupt_fraction(fraction: float):
    """A mutant of the torch path that pushes ``fraction`` of query_states far off."""
    stride = round(1 / fraction)

    def mutant(*inputs):
        q, k, v = torch_eager(*inputs)
        q = q.clone()
        flat = q.view(-1)
        flat[::stride] += 0.25      # far outside the element tolerance, inside the max-abs bound
        return q, k, v
    return mutant


def test_torch_path_passes_with_distribution_over_seeds():
    report = check_over_seeds(OP, "torch", config="small", cases="0-2", seeds=3)
    assert report.seeds == [0, 1000, 2000]
    assert report.verdict == "pass", report.lines()
    assert report.n_runs == 9
    names = {(m.output, m.metric) for m in report.metrics}
    for out in ("query_states", "key_states", "value_states"):
        assert (out, "matched_ratio") in names and (out, "max_abs") in names
    for m in report.metrics:
        assert m.n == 9 and m.min <= m.median <= m.max
    # different seeds draw different inputs: the max errors are not all identical
    q_abs = next(m for m in report.metrics if m.output == "query_states" and m.metric == "max_abs")
    assert q_abs.min < q_abs.max
    json.dumps(jsonable(report.to_dict()))          # the report serialises
    assert len(report.to_dataframe()) == len(report.metrics)


def test_thin_margin_mutant_warns_instead_of_passing():
    # ~0.7% of query elements wrong against a 99% rule: passes every case, but with less
    # than half of the 1% allowance left
    report = check_over_seeds(OP, _corrupt_fraction(0.007), config="small", cases="0-2", seeds=2)
    assert not report.failures
    q = next(m for m in report.metrics if m.output == "query_states" and m.metric == "matched_ratio")
    assert q.verdict == "warn" and 0 <= q.margin_fraction < 0.5
    assert report.verdict == "warn" and report.passed
    assert "near the threshold" in report.summary()


def test_breaking_mutant_fails_with_the_case_and_seed():
    report = check_over_seeds(OP, _corrupt_fraction(0.10), config="small", cases="0-1", seeds=2)
    assert report.verdict == "fail" and not report.passed
    assert "tolerance" in report.violations
    assert {(f.seed, f.case) for f in report.failures} == {(0, 0), (0, 1), (1000, 0), (1000, 1)}
    assert any("seed 0 case 0" in line for line in report.lines())


def test_hygiene_runs_on_the_first_seed_only():
    calls = {"n": 0}

    def counting(*inputs):
        calls["n"] += 1
        return torch_eager(*inputs)
    check_over_seeds(OP, counting, config="small", cases="0", seeds=3, hygiene="first")
    # first seed: the call plus the hygiene's later calls (the same inputs again, only the
    # activations, only the weights drawn anew); then one call per seed
    from fuseval.hygiene import CALLS_PER_CASE
    assert CALLS_PER_CASE == 4
    assert calls["n"] == CALLS_PER_CASE + 1 + 1


def test_extra_seed_cases_limit_the_later_seeds():
    report = check_over_seeds(OP, "torch", config="small", cases="0-3", seeds=2, extra_seed_cases="0")
    assert [len(r.cases) for r in report.reports] == [4, 1]
    assert report.n_runs == 5


def test_stats_from_reports_needs_a_report():
    with pytest.raises(ValueError):
        stats_from_reports([])


def test_timings_and_blind_outputs_are_gathered_over_the_seeds():
    report = check_over_seeds(OP, "torch", config="small", cases="0-1", seeds=2)
    keys = ("inputs", "oracle", "impl", "compare", "hygiene")
    assert set(report.timings) == set(keys)
    for key in keys:
        assert report.timings[key] == pytest.approx(sum(c.timings[key] for r in report.reports for c in r.cases))
    rows = report.case_timings()
    assert [(r["seed"], r["case"]) for r in rows] == [(0, 0), (0, 1), (1000, 0), (1000, 1)]
    assert all(r[k] >= 0 for r in rows for k in keys) and report.timings["impl"] > 0
    assert report.blind == [] and report.to_dict()["blind"] == []      # small: every output visible
    json.dumps(jsonable(report.to_dict()))
