"""Tests for fuseval.check: the comparison rule and every violation of ``check``.

Each rule is exercised by a deliberately broken implementation (a mutant) that must be
reported under that rule's violation name, and the correct implementations of the
operator table must pass. Expected numbers in the ``compare`` tests are worked out by
hand from the tolerance rule of SPEC.md.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

from fuseval.check import VIOLATIONS, CheckReport, check, compare, fingerprint, run_case
from fuseval.definitions import Tolerance
from fuseval.operators import load
from fuseval.errors import (EXIT_BAD_OUTPUTS, EXIT_CHECK_FAILED, EXIT_HYGIENE, EXIT_IMPL_RAISED,
                            EXIT_NONFINITE, EXIT_OK, exit_code_for)
from fuseval.operators.nvfp4_qkv_rope import reference as op_b
from fuseval.operators.qwen2vl_decoder_layer import reference as op_a

OP_A = "qwen2vl_decoder_layer"
OP_B = "nvfp4_qkv_rope"


TOL_A = Tolerance(atol=4e-3, rtol=1e-5, min_matched_ratio=0.98)                       # SPEC op A
TOL_B = Tolerance(atol=5e-3, rtol=5e-3, min_matched_ratio=0.95, max_abs_error=1.0)   # SPEC op B


def run(op, impl, cases="0", **kw):
    kw.setdefault("device", "cpu")
    return check(op, impl, config="small", cases=cases, **kw)


def violations(report: CheckReport) -> set[str]:
    return {v for c in report.cases for v in c.violations}


def messages(report: CheckReport) -> str:
    return "\n".join(m for c in report.cases for m in c.messages)


# ====================================================================== compare()
def test_compare_exact_output_passes_with_zero_error():
    ref = torch.randn(50, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    m = compare(ref.float(), ref, TOL_A, "output")
    assert m.passed and m.reasons == [] and m.matched_ratio == 1.0
    assert 0 < m.max_abs < 1e-6 and m.nonfinite == 0 and not m.all_zero and m.numel == 50


def test_compare_element_rule_is_atol_plus_rtol_times_ref():
    ref = torch.zeros(100, dtype=torch.float64)
    ref[:50] = 100.0
    out = ref.clone()
    # at |ref| = 100 the op A bound is 4e-3 + 1e-3 = 5e-3: 4.9e-3 passes, 5.2e-3 fails
    out[0] += 4.9e-3
    out[1] += 5.2e-3
    out[60] += 3.9e-3            # at ref 0 the bound is atol only
    out[61] += 4.1e-3
    m = compare(out, ref, TOL_A)
    assert m.matched_ratio == pytest.approx(0.98)
    assert m.passed                                      # 98% is enough for op A
    out[62] += 1.0
    m = compare(out, ref, TOL_A)
    assert m.matched_ratio == pytest.approx(0.97) and not m.passed and m.reasons == ["tolerance"]
    assert m.max_abs == pytest.approx(1.0)
    assert m.worst_index == (62,)


def test_compare_matched_ratio_threshold_of_op_b():
    ref = torch.ones(100, dtype=torch.float64)
    out = ref.clone()
    out[:5] += 0.02           # bound at ref 1 is 5e-3 + 5e-3 = 1e-2
    assert compare(out, ref, TOL_B).passed                     # 95% matched
    out[5] += 0.02
    m = compare(out, ref, TOL_B)
    assert not m.passed and m.reasons == ["tolerance"]


def test_compare_max_abs_rule_of_op_b():
    ref = torch.zeros(1000, dtype=torch.float64)
    out = ref.clone()
    out[7] = 1.5                                  # one element: 99.9% matched, but > 1.0 off
    m = compare(out, ref, TOL_B)
    assert m.matched_ratio == pytest.approx(0.999)
    assert not m.passed and m.reasons == ["max_abs"]
    assert compare(out, ref, TOL_A).passed       # op A has no max-abs rule
    out[7] = 0.99
    assert compare(out, ref, TOL_B).passed


def test_compare_nan_where_the_oracle_has_nan_passes():
    ref = torch.arange(20, dtype=torch.float64)
    ref[3] = math.nan
    ref[4] = math.inf
    out = ref.clone()
    m = compare(out, ref, TOL_B)
    assert m.passed and m.nonfinite == 0 and m.matched_ratio == 1.0
    assert math.isfinite(m.max_abs)


def test_compare_nan_elsewhere_fails_as_nonfinite():
    ref = torch.arange(200, dtype=torch.float64)
    out = ref.clone()
    out[10] = math.nan
    m = compare(out, ref, TOL_A)
    assert not m.passed and "nonfinite" in m.reasons and m.nonfinite == 1
    assert m.matched_ratio == pytest.approx(0.995) and m.max_abs == math.inf
    # an infinity of the wrong sign is not "the same non-finite value"
    ref2 = torch.full((10,), math.inf, dtype=torch.float64)
    out2 = ref2.clone()
    out2[0] = -math.inf
    m2 = compare(out2, ref2, TOL_A)
    assert "nonfinite" in m2.reasons and m2.nonfinite == 1
    # a finite output where the oracle is NaN is not matched either
    ref3 = torch.zeros(10, dtype=torch.float64)
    ref3[:3] = math.nan
    m3 = compare(torch.zeros(10), ref3, TOL_A)
    assert m3.matched_ratio == pytest.approx(0.7) and not m3.passed


def test_compare_finite_output_where_oracle_is_nan_is_a_nonfinite_failure():
    """A NaN scale code poisons its columns in the oracle; an implementation that decodes it
    as a number "repairs" them. One such column among many would slip under a 95% matched
    rule, so it is a named failure of its own."""
    ref = torch.ones(1000, dtype=torch.float64)
    ref[:16] = math.nan                       # one 16-column block, 1.6% of the elements
    out = ref.nan_to_num(0.5)                 # the implementation returns numbers there
    m = compare(out, ref, TOL_B)
    assert m.matched_ratio == pytest.approx(0.984)      # above the 95% rule on its own
    assert not m.passed and "nonfinite" in m.reasons and m.nonfinite == 16


def test_compare_all_zero_output_against_nonzero_oracle():
    ref = torch.full((10,), 1e-3, dtype=torch.float64)
    m = compare(torch.zeros(10), ref, TOL_A)
    # every element is inside atol, yet an all-zero output is not an answer
    assert m.matched_ratio == 1.0 and m.all_zero and not m.passed and m.reasons == ["all_zero"]
    assert compare(torch.zeros(10), torch.zeros(10), TOL_A).passed


def test_compare_bf16_output_and_rel_l2():
    ref = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    out = torch.tensor([1.0, 2.0, 3.0, 4.5], dtype=torch.bfloat16)
    m = compare(out, ref, TOL_B)
    assert m.rel_l2 == pytest.approx(0.5 / math.sqrt(30))
    assert m.mean_abs == pytest.approx(0.125)


# ====================================================================== mutants
def _correct_a(*x):
    return op_a.torch_eager(*x)


def nan_output(*x):
    (out,) = _correct_a(*x)
    out[0, 0, 0] = math.nan          # one element: the ratio alone would still pass
    return (out,)


def inf_output(*x):
    (out,) = _correct_a(*x)
    out[-1, -1, -1] = -math.inf
    return (out,)


def zero_output(*x):
    return (torch.zeros_like(x[0]),)


def mutates_input(*x):
    out = _correct_a(*x)
    x[0].mul_(2.0)                   # after computing: the output itself is right
    return out


def mutates_weight(*x):
    out = _correct_a(*x)
    x[14][0, 0] += 1.0
    return out


def returns_input(*x):
    return (x[0],)


def returns_view_of_input(*x):
    return (x[0].view(x[0].shape),)


def make_cached():
    memo = {}

    def cached(*x):
        if "out" not in memo:
            memo["out"] = _correct_a(*x)[0]
        return (memo["out"].clone(),)
    return cached


def make_buffer_reuser():
    buffers = {}

    def reuses_buffer(*x):
        (out,) = _correct_a(*x)
        buf = buffers.get(out.shape)
        if buf is None:
            buf = buffers[out.shape] = torch.empty_like(out)
        buf.copy_(out)
        return (buf,)
    return reuses_buffer


def wrong_shape(*x):
    return (_correct_a(*x)[0][..., :-1],)


def wrong_dtype(*x):
    return (_correct_a(*x)[0].double(),)


def wrong_count(*x):
    out = _correct_a(*x)[0]
    return (out, out.clone())


def returns_none(*x):
    return None


def raises(*x):
    raise RuntimeError("kernel exploded")


def make_raises_second_time():
    calls = []

    def flaky(*x):
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("second call broke")
        return _correct_a(*x)
    return flaky


def slightly_off(*x):
    return (_correct_a(*x)[0] + 5e-3,)          # just past atol 4e-3 everywhere


def within_tolerance(*x):
    return (_correct_a(*x)[0] + 3e-3,)          # inside atol 4e-3 everywhere


@pytest.mark.parametrize("impl, expected, exit_code", [
    (nan_output, "nonfinite", EXIT_NONFINITE),
    (inf_output, "nonfinite", EXIT_NONFINITE),
    (zero_output, "all_zero", EXIT_CHECK_FAILED),
    (mutates_input, "mutated_input", EXIT_HYGIENE),
    (mutates_weight, "mutated_input", EXIT_HYGIENE),
    (returns_input, "aliased_output", EXIT_HYGIENE),
    (returns_view_of_input, "aliased_output", EXIT_HYGIENE),
    (wrong_shape, "bad_outputs", EXIT_BAD_OUTPUTS),
    (wrong_dtype, "bad_outputs", EXIT_BAD_OUTPUTS),
    (wrong_count, "bad_outputs", EXIT_BAD_OUTPUTS),
    (returns_none, "bad_outputs", EXIT_BAD_OUTPUTS),
    (raises, "raised", EXIT_IMPL_RAISED),
    (slightly_off, "tolerance", EXIT_CHECK_FAILED),
], ids=lambda p: getattr(p, "__name__", str(p)))
def test_mutant_is_reported_under_its_violation(impl, expected, exit_code):
    report = run(OP_A, impl)
    assert not report.passed
    found = violations(report)
    assert expected in found, (found, messages(report))
    assert set(found) <= set(VIOLATIONS)
    assert exit_code_for(found) == exit_code


def test_all_zero_mutant_is_not_also_called_cached():
    report = run(OP_A, zero_output)
    assert violations(report) == {"all_zero", "tolerance", "worst_element", "error_rms"}


def test_nan_mutant_fails_only_for_the_nan():
    report = run(OP_A, nan_output)
    assert violations(report) == {"nonfinite"}         # 1 element of 512: ratio still passes


def test_mutated_input_message_names_the_input():
    report = run(OP_A, mutates_weight)
    assert "'down_proj_weight'" in messages(report)


def test_aliased_output_message_names_output_and_input():
    report = run(OP_A, returns_view_of_input)
    assert "'output'" in messages(report) and "'hidden_states'" in messages(report)


def test_raised_message_carries_the_exception():
    report = run(OP_A, raises)
    assert violations(report) == {"raised"} and "kernel exploded" in messages(report)
    report = run(OP_A, make_raises_second_time())
    assert "raised" in violations(report) and "second call broke" in messages(report)


def test_bad_outputs_message_says_what_was_expected():
    msg = messages(run(OP_A, wrong_shape))
    assert "(1, 8, 63)" in msg and "(1, 8, 64)" in msg
    msg = messages(run(OP_A, wrong_dtype))
    assert "float64" in msg and "float32" in msg


def test_cached_result_is_reported_on_every_case():
    report = run(OP_A, make_cached(), cases="0,1")
    assert all("cached_result" in c.violations for c in report.cases)
    # the first case's answer is right, so only the hygiene rule catches it there
    assert report.cases[0].violations == ["cached_result"]
    assert exit_code_for(violations(report)) == EXIT_HYGIENE


def test_output_buffer_reused_across_calls():
    report = run(OP_A, make_buffer_reuser())
    assert violations(report) == {"output_reused"}
    assert exit_code_for(violations(report)) == EXIT_HYGIENE


def test_hygiene_rules_can_be_switched_off():
    for impl in (make_cached(), make_buffer_reuser(), mutates_weight):
        report = run(OP_A, impl, hygiene=False)
        assert not ({"cached_result", "output_reused", "mutated_input"} & violations(report))


def test_inside_tolerance_passes_and_just_outside_fails():
    assert run(OP_A, within_tolerance).passed
    report = run(OP_A, slightly_off)
    assert violations(report) == {"tolerance"}


# ---------------------------------------------------------------------- op B mutants
def _correct_b(*x):
    return op_b.torch_eager(*x)


def b_one_huge_error(*x):
    q, k, v = _correct_b(*x)
    q = q.clone()
    q[0, 0, 0, 0] += 4.0           # one element, far beyond any tolerance
    return q, k, v


def b_scaled_query(*x):
    q, k, v = _correct_b(*x)
    return q * 1.05, k, v


def b_two_outputs(*x):
    return _correct_b(*x)[:2]


def b_fp32_outputs(*x):
    return tuple(t.float() for t in _correct_b(*x))


def b_nan_value(*x):
    q, k, v = _correct_b(*x)
    v = v.clone()
    v[..., 3] = math.nan
    return q, k, v


def b_ignores_global_scale(*x):
    x = list(x)
    for i in (5, 8, 11):
        x[i] = 1.0
    return _correct_b(*x)


@pytest.mark.parametrize("impl, expected", [
    (b_scaled_query, {"tolerance"}),
    (b_two_outputs, {"bad_outputs"}),
    (b_fp32_outputs, {"bad_outputs"}),
    (b_nan_value, {"nonfinite"}),
], ids=lambda p: getattr(p, "__name__", str(p)))
def test_op_b_mutants(impl, expected):
    report = run(OP_B, impl)
    assert expected <= violations(report), (violations(report), messages(report))


def test_op_b_mutant_ignoring_global_scale_fails():
    report = run(OP_B, b_ignores_global_scale)
    assert not report.passed and "tolerance" in violations(report)


def test_one_huge_error_passes_the_benchmarks_rule_and_fails_fusevals_own():
    """The benchmark has no max-abs cap on op B: one element off by 4 of 512 passes its
    matched ratio, and so the benchmark's rule (predicted exactly); fuseval's own verdict
    bounds the worst element and fails it."""
    report = run(OP_B, b_one_huge_error)
    assert not report.passed
    assert all(set(c.violations) == {"worst_element", "error_rms"} for c in report.cases), messages(report)
    assert all(c.predicted is None or c.predicted.passed for c in report.cases)
    sol = check(OP_B, b_one_huge_error, config="small", hygiene=False, predict=False, rules="sol")
    assert sol.passed, messages(sol)
    assert max(m.max_abs for c in sol.cases for m in c.outputs) >= 3.9
    worst = max(m.error_ratio for c in report.cases for m in c.outputs)
    assert worst > load(OP_B, "small").tolerance.max_error_ratio


def test_max_abs_cap_fails_a_case_and_the_message_names_the_output():
    from dataclasses import replace as _replace
    d = load(OP_B, "small")
    capped = _replace(d, tolerance=_replace(d.tolerance, max_abs_error=1.0), case_tolerances=())
    report = check(capped, b_one_huge_error, config="seed", cases="0", hygiene=False, predict=False)
    assert "max_abs" in violations(report)
    assert "query_states: max_abs" in messages(report)


# ====================================================================== correct implementations
@pytest.mark.parametrize("op, impl, cases", [
    (OP_A, "torch", "0,5,10"),
    (OP_A, "reference_fp32", "0,5,10"),
    (OP_A, "torch_tf32", "0,9"),
    (OP_B, "torch", "0,3,9"),
    (OP_B, "reference_fp32", "0,3,9"),
    (OP_B, "torch_cached", "all"),      # every case: the bf16 weight cache must never go stale
])
def test_correct_implementations_pass(op, impl, cases):
    report = run(op, impl, cases=cases)
    assert report.passed, messages(report)
    assert all(c.violations == [] and c.passed for c in report.cases)
    assert exit_code_for(violations(report)) == EXIT_OK


@pytest.mark.parametrize("op", [OP_A, OP_B])
def test_torch_passes_on_realistic_inputs(op):
    report = run(op, "torch", cases="0,6", mode="realistic")
    assert report.passed and report.mode == "realistic"


def test_a_user_callable_and_a_module_path_are_accepted():
    assert run(OP_A, _correct_a).passed
    report = run(OP_A, "fuseval.operators.qwen2vl_decoder_layer.reference:torch_eager")
    assert report.passed and report.impl == "fuseval.operators.qwen2vl_decoder_layer.reference:torch_eager"


# ====================================================================== report, run_case, fingerprint
def test_report_fields_dict_and_dataframe():
    report = run(OP_B, "torch", cases="0,2", seed=5)
    assert (report.op, report.impl, report.config, report.device, report.seed) == \
        (OP_B, "torch", "small", "cpu", 5)
    assert [c.case for c in report.cases] == [0, 2]
    assert [c.seed for c in report.cases] == [5, 7]          # case i uses seed + i
    assert report.cases[1].axes == {"seq_len": 8, "batch_size": 8}
    d = json.loads(json.dumps(report.to_dict(), default=str))
    assert d["passed"] is True and len(d["cases"]) == 2
    assert [o["name"] for o in d["cases"][0]["outputs"]] == ["query_states", "key_states", "value_states"]
    df = report.to_dataframe()
    assert len(df) == 6 and set(df["output"]) == {"query_states", "key_states", "value_states"}
    failed = run(OP_A, raises)
    assert failed.to_dict()["passed"] is False and len(failed.rows()) == 1


def test_progress_callback_sees_every_case():
    seen = []
    run(OP_B, "torch", cases="1,4,7", progress=lambda r, done, total: seen.append((r.case, done, total)))
    assert seen == [(1, 1, 3), (4, 2, 3), (7, 3, 3)]


def test_empty_report_does_not_pass():
    assert not CheckReport(OP_A, "x", "small", "cpu", 0, "benchmark", {}, []).passed


def test_run_case_with_given_inputs():
    from fuseval.inputs import generate_inputs
    d = load(OP_A, "small")
    case = d.cases("3")[0]
    x = generate_inputs(d, case.axes, seed=0)
    r = run_case(d, nan_output, case, seed=0, device=torch.device("cpu"), inputs=x, hygiene=False)
    assert r.violations == ["nonfinite"] and r.case == 3
    r = run_case(d, _correct_a, case, seed=0, device=torch.device("cpu"), inputs=x)
    assert r.passed


def test_fingerprint_sees_a_single_bit_flip():
    t = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    before = fingerprint(t)
    t.view(torch.int32)[500] ^= 1
    assert fingerprint(t) != before
    s = torch.zeros(4, 4, dtype=torch.uint8).view(torch.float8_e4m3fn)
    f8 = fingerprint(s)
    s.view(torch.uint8)[2, 3] = 1
    assert fingerprint(s) != f8
    # swapping two elements changes the position-weighted sum
    u = torch.arange(10.0)
    before = fingerprint(u)
    u[[2, 7]] = u[[7, 2]]
    assert fingerprint(u) != before
    assert fingerprint(1e-6) == 1e-6


def test_unknown_device_request_is_rejected():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(ValueError, match="no CUDA device"):
        run(OP_A, "torch", device="cuda")


# ====================================================================== blind tolerances
def b_half_value(*x):
    q, k, v = _correct_b(*x)
    return q, k, v * 0.5


def _rms(t) -> float:
    # independent of fuseval.comparison.rms: every element is finite here
    return float(t.double().pow(2).mean().sqrt())


def _with_atol(op, atol, config="small"):
    from dataclasses import replace as _replace
    d = load(op, config)
    return _replace(d, tolerance=_replace(d.tolerance, atol=atol), case_tolerances=())


def test_half_value_states_fails_on_the_small_config():
    """value_states * 0.5 used to pass 16/16 on small (V's magnitude under atol); the
    scaled-down inputs must make V visible on every case."""
    report = check(OP_B, b_half_value, config="small", device="cpu", hygiene=False, predict=False)
    assert all("tolerance" in c.violations for c in report.cases), [c.violations for c in report.cases]
    assert all(c.outputs[2].name == "value_states" and not c.outputs[2].passed for c in report.cases)
    assert all(c.outputs[0].passed and c.outputs[1].passed for c in report.cases)


@pytest.mark.parametrize("op", [OP_A, OP_B])
@pytest.mark.parametrize("config", ["small", "tiny"])
@pytest.mark.parametrize("mode", ["benchmark", "realistic"])
def test_no_output_is_blind_on_the_scaled_down_configs(op, config, mode):
    report = check(op, "torch", config=config, device="cpu", hygiene=False, predict=False, mode=mode)
    assert report.passed
    assert report.blind == [], [b.describe() for b in report.blind]


def test_a_blind_tolerance_is_reported_per_case_and_output():
    # on small, |value_states| has RMS about 0.16 and |query|, |key| about 1.4: atol 0.05 is
    # past 10% of V's RMS only
    d = _with_atol(OP_B, 0.05)
    report = check(d, "torch", config="seed", cases="0,5", device="cpu", hygiene=False, predict=False)
    blind = report.blind
    assert [(b.case, b.output, b.atol) for b in blind] == [(0, "value_states", 0.05), (5, "value_states", 0.05)]
    from fuseval.inputs import generate_inputs
    for b in blind:
        case = d.cases(str(b.case))[0]
        v = op_b.reference(*generate_inputs(d, case.axes, seed=b.case))[2]
        assert b.rms == pytest.approx(_rms(v), rel=1e-9)
        assert 0.1 * b.rms <= 0.05 < 0.1 * _rms(op_b.reference(*generate_inputs(d, case.axes, seed=b.case))[0])
    d_json = report.to_dict()["blind"]
    assert [r["output"] for r in d_json] == ["value_states", "value_states"]


def test_blindness_is_what_lets_a_wrong_kernel_pass():
    """The mutant the blind list exists for: with atol past every output's scale,
    value_states * 0.5 passes the tolerance, and the report says the tolerance is blind."""
    d = _with_atol(OP_B, 1.0)
    report = check(d, b_half_value, config="seed", cases="0", device="cpu", hygiene=False, predict=False)
    assert report.passed
    assert {b.output for b in report.blind} == {"query_states", "key_states", "value_states"}


def test_blind_outputs_are_warned_about_in_the_table():
    import io
    from fuseval.terminal import print_check_report
    report = check(_with_atol(OP_B, 0.05), "torch", config="seed", cases="0", device="cpu", hygiene=False,
                   predict=False)
    out = io.StringIO()
    print_check_report(report, out)
    warnings_ = [line for line in out.getvalue().splitlines() if line.startswith("warning:")]
    assert len(warnings_) == 1 and "value_states" in warnings_[0] and "atol 0.05" in warnings_[0]


# ====================================================================== timing breakdown
def make_slow(seconds):
    import time as _time

    def slow(*x):
        _time.sleep(seconds)
        return _correct_b(*x)
    return slow


def test_timings_say_where_the_time_went():
    report = check(OP_B, make_slow(0.2), config="small", cases="0,1", device="cpu", predict=False)
    assert report.passed
    for c in report.cases:
        assert set(c.timings) == {"inputs", "oracle", "impl", "compare", "hygiene"}
        assert all(v >= 0 for v in c.timings.values())
        assert 0.2 <= c.timings["impl"] < 0.2 + 1.0          # the first call only
        assert c.timings["hygiene"] >= 0.4                    # the two later calls
    totals = report.timings
    assert totals["impl"] == pytest.approx(sum(c.timings["impl"] for c in report.cases))
    assert sum(totals.values()) <= report.wall_seconds
    d = json.loads(json.dumps(report.to_dict()))
    assert d["timings"]["hygiene"] == pytest.approx(totals["hygiene"])
    assert "impl" in d["cases"][0]["timings"]
    quick = check(OP_B, make_slow(0.2), config="small", cases="0", device="cpu", predict=False, hygiene=False)
    assert quick.cases[0].timings["hygiene"] < 0.2            # no later calls without hygiene


def test_the_table_ends_with_one_timing_line():
    import io
    from fuseval.terminal import print_check_report
    out = io.StringIO()
    print_check_report(run(OP_B, "torch", cases="0"), out)
    last = out.getvalue().rstrip().splitlines()[-1]
    assert last.startswith("time: inputs ") and all(f"{k} " in last for k in ("oracle", "impl", "compare",
                                                                            "hygiene", "wall"))


# ====================================================================== the later calls' inputs
def test_later_calls_draw_only_the_inputs_they_change(monkeypatch):
    from fuseval import hygiene
    from fuseval.inputs import draw_inputs as real_draw
    drawn = []

    def recording(defn, axes, **kw):
        drawn.append(sorted(kw["names"]))
        return real_draw(defn, axes, **kw)
    monkeypatch.setattr(hygiene, "draw_inputs", recording)
    d = load(OP_A, "small")
    case = d.cases("0")[0]
    from fuseval.inputs import generate_inputs
    x = generate_inputs(d, case.axes, seed=0)
    calls = hygiene.partial_calls(d, case, 424242, x, "benchmark", torch.device("cpu"))
    groups = hygiene.input_groups(d)
    # one draw, of every drawn input once (eps is fixed and not drawn)
    assert drawn == [sorted(s.name for s in d.inputs if not (s.is_scalar and s.value is not None))]
    assert [c.what for c in calls] == ["the first call's inputs again", "only the activations changed",
                                       "only the weights changed"]
    assert calls[0].repeat and all(new is old for new, old in zip(calls[0].inputs, x))
    for call, name in zip(calls[1:], ("activations", "weights")):
        for i, (new, old) in enumerate(zip(call.inputs, x)):
            if i in groups[name]:
                assert new is not old
                if not d.inputs[i].name.endswith("norm_weight"):      # ones in benchmark mode
                    assert not torch.equal(new, old), d.inputs[i].name
            else:
                assert new is old, d.inputs[i].name           # kept: the very tensor, not a copy


def test_later_calls_never_repeat_another_cases_inputs():
    """The later calls' inputs are their own: not the next case's (which an implementation
    could then answer ahead), not another seed's."""
    from fuseval import hygiene
    from fuseval.inputs import generate_inputs
    d = load(OP_B, "small")
    case5, case6 = d.cases("5,6")                  # the same shape
    x5 = generate_inputs(d, case5.axes, seed=5)
    later = [c for c in hygiene.partial_calls(d, case5, 424242, x5, "benchmark", torch.device("cpu")) if not c.repeat]
    seen = [generate_inputs(d, case5.axes, seed=s)[0] for s in range(0, 40)]
    h = d.input_index("hidden_states")
    assert not any(torch.equal(later[0].inputs[h], t) for t in seen)


def make_bad_shape_later():
    calls = []

    def bad_shape_later(*x):
        calls.append(1)
        q, k, v = _correct_b(*x)
        return (q, k, v) if len(calls) == 1 else (q, k, v[..., :-1])
    return bad_shape_later


def test_a_later_call_with_wrong_shapes_is_bad_outputs():
    report = run(OP_B, make_bad_shape_later(), cases="0")
    assert "bad_outputs" in report.cases[0].violations, report.cases[0].messages
    assert any("call with only the" in m for m in report.cases[0].messages)


@pytest.fixture
def hookless():
    """The test operator of tests/helpers/hookless_operator (residual add + RMSNorm), registered
    for one test: its only weights are norm weights, ones in benchmark mode."""
    import hookless_operator as toy
    from fuseval import definitions, operators
    registry = operators.registry()
    registry[toy.NAME] = toy.SPEC
    yield toy.NAME
    registry.pop(toy.NAME, None)
    operators._CACHE.pop(toy.NAME, None)


def test_a_later_call_that_changes_nothing_is_not_made(hookless):
    """Drawing ones anew gives ones: a "weights changed" call would be the first call
    again, and its identical answer no cache. The correct implementation passes; an
    answer cached under no key is still caught by the activations call."""
    report = check(hookless, "torch", config="small", device="cpu", predict=False)
    assert report.passed, [c.messages for c in report.cases]
    memo = {}

    def cached(x, residual, norm_weight, eps):
        if "out" not in memo:
            memo["out"] = (x + residual).clone()
        return (memo["out"].clone(),)
    report = check(hookless, cached, config="small", cases="0", device="cpu", predict=False)
    assert "cached_result" in report.cases[0].violations
    assert any("only the activations changed" in m for m in report.cases[0].messages)


# ====================================================================== on a GPU
CUDA = torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("op, impl", [(OP_A, "torch"), (OP_A, "torch_tf32"), (OP_B, "torch"),
                                      (OP_B, "torch_cached"), (OP_B, "reference_fp32")])
def test_correct_implementations_pass_on_cuda(op, impl):
    report = run(op, impl, cases="0,5,12", device="cuda")
    assert report.device.startswith("cuda")
    assert report.passed, messages(report)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_unwritten_output_elements_show_as_nan_on_cuda():
    """The allocator is poisoned before the call: an output allocated first and only half
    written must fail as nonfinite, not pass on stale memory."""
    def half_written(*x):
        buf = torch.empty(x[0].shape, dtype=x[0].dtype, device=x[0].device)
        (out,) = _correct_a(*x)
        buf[..., : out.shape[-1] // 2] = out[..., : out.shape[-1] // 2]
        return (buf,)
    report = run(OP_A, half_written, cases="0,12", device="cuda", hygiene=False)
    assert all("nonfinite" in c.violations for c in report.cases), messages(report)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("keep_numel, frag_numel", [(1000, 100_000), (1_000_000, 2_000_000)])
def test_poison_reaches_the_free_fragments_of_live_segments(keep_numel, frag_numel):
    """A freed fragment of a segment that still holds a live tensor stays in torch's cache
    (empty_cache cannot return it) and is the best fit for the next allocation of its
    size: it must hold NaN after poison_allocator, not its old values. Small pool (400 KB
    beside 4 KB) and large pool (8 MB beside 4 MB in one 20 MB segment)."""
    from fuseval.check import poison_allocator
    keep = torch.ones(keep_numel, device="cuda")
    frag = torch.full((frag_numel,), 7.0, device="cuda")
    del frag
    poison_allocator(torch.device("cuda"), 4096)
    again = torch.empty(frag_numel, device="cuda")
    assert bool(again.isnan().all()), f"{int((~again.isnan()).sum())} of {frag_numel} elements not NaN"
    assert bool((keep == 1).all())                # live tensors are left alone
    del keep, again


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_hygiene_mutants_on_cuda():
    assert "mutated_input" in violations(run(OP_A, mutates_input, device="cuda"))
    assert "aliased_output" in violations(run(OP_A, returns_view_of_input, device="cuda"))
    assert "output_reused" in violations(run(OP_A, make_buffer_reuser(), device="cuda"))
    assert "cached_result" in violations(run(OP_A, make_cached(), device="cuda"))


def _half_v(*inputs):
    q, k, v = op_b.torch_eager(*inputs)
    return q, k, v * 0.5


def test_failing_cases_save_their_inputs_and_a_replay_sees_the_same_failure(tmp_path):
    """save_failing writes the inputs of the failing cases only, the message names the
    file and the replay command; a replay runs that case on those very inputs (the same
    error to the last bit), and a correct implementation passes on them."""
    first = check("nvfp4_qkv_rope", _half_v, cases="0-2", seed=11, save_failing=str(tmp_path), isolate=False)
    assert not first.passed
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [f"nvfp4_qkv_rope-small-case{i}-seed{11 + i}.pt" for i in range(3)]
    assert any("--replay" in m and files[1] in m for m in first.cases[1].messages)
    again = check("nvfp4_qkv_rope", _half_v, replay=str(tmp_path / files[1]), isolate=False)
    assert [c.case for c in again.cases] == [1] and again.cases[0].seed == 12
    assert [m.max_abs for m in again.cases[0].outputs] == [m.max_abs for m in first.cases[1].outputs]
    assert check("nvfp4_qkv_rope", "torch", replay=str(tmp_path / files[1])).passed
    ok = tmp_path / "ok"
    assert check("nvfp4_qkv_rope", "torch", cases="0-1", save_failing=str(ok)).passed and not ok.exists()
    with pytest.raises(ValueError, match="config 'small'.*this check runs config 'tiny'"):
        check("nvfp4_qkv_rope", "torch", config="tiny", replay=str(tmp_path / files[1]))
    with pytest.raises(ValueError, match="holds inputs of 'nvfp4_qkv_rope'"):
        check(OP_A, "torch", replay=str(tmp_path / files[1]))
