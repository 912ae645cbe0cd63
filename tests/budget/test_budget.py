"""Tests of the error budget (fuseval.budget): metrics, the naive's precision emulation,
budget files, the runner's three kinds of per-stage error, verdicts, reports and the CLI.

Implementations under test are the references themselves (float32, and float64 with
one stage function swapped for a broken one), so every check here has a mutant that
fails it. The property catalogue's mutants and the fast paths are in
test_budget_mutants.py and test_budget_fast.py."""
from __future__ import annotations

import functools
import json
import math
import types

import numpy as np
import pytest
import torch

from fuseval import cli
from fuseval.budget import load_budget, run_budget, run_until
from fuseval.budget.budgetfile import Allowance, Number
from fuseval.budget.metrics import error_metrics, storage_precision
from fuseval.budget.naive import emulated_stages
from fuseval.budget.report import load_report, render_markdown
from fuseval.errors import EXIT_BAD_FILE, EXIT_CHECK_FAILED, EXIT_IMPL_RAISED, EXIT_OK
from fuseval.precision import round_to
from fuseval.refimpl import nvfp4
from fuseval.operators.nvfp4_qkv_rope import reference as op_b
from fuseval.operators.qwen2vl_decoder_layer import reference as op_a
from fuseval.refimpl import stages as st

OP_A, OP_B = "qwen2vl_decoder_layer", "nvfp4_qkv_rope"
CASES = "0,6,12"      # three shapes of the small config (seq 8, 16 and 99 for op A)


# --------------------------------------------------------------------------- helpers
def namespace(**replace) -> types.SimpleNamespace:
    """refimpl.stages with some functions replaced (a stage-swapped mutant)."""
    ns = types.SimpleNamespace(**{n: getattr(st, n) for n in st.__all__})
    for k, v in replace.items():
        assert hasattr(ns, k), k
        setattr(ns, k, v)
    return ns


def eps_outside_sqrt(x, w, eps):
    return x / (torch.sqrt(x.pow(2).mean(-1, keepdim=True)) + eps) * w


def rope_minus(t, cos, sin):
    return t * cos - st.rotate_half(t) * sin


def attention_noncausal(q, k, v, query_chunk=2048):
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1) @ v


def linear_drops_bias(x, w, b=None):
    return x @ w.transpose(-1, -2)


def fp32(ref, **kw):
    """A reference pipeline run in float32 (taps and override via its signature)."""
    return functools.partial(ref, dtype=torch.float32, **kw)


# --------------------------------------------------------------------------- metrics
def _tf32_numpy(x: np.ndarray) -> np.ndarray:
    """Independent TF32 rounding: scale each value so that its 10-bit mantissa is the
    integer part, round half to even (numpy's rint), scale back."""
    m, e = np.frexp(x.astype(np.float64))           # x = m 2^e, |m| in [0.5, 1)
    return np.ldexp(np.rint(np.ldexp(m, 11)), e - 11)


def test_error_metrics_count_ulps_and_flag_nonfinite():
    ref = torch.linspace(1.0, 1.9, 1000, dtype=torch.float64)
    three_ulp = ref + 3 * 2.0 ** -23
    m = error_metrics(three_ulp, ref, "float32", hist=True)
    assert m["ulp_median"] == pytest.approx(3) and m["ulp_max"] == pytest.approx(3)
    assert m["max_abs"] == pytest.approx(3 * 2.0 ** -23) and m["max_abs_ulp"] == pytest.approx(3)
    assert sum(m["hist"]) + m["hist_zero"] == 1000 and m["nonfinite"] == 0
    bad = three_ulp.clone()
    bad[5] = float("nan")
    m = error_metrics(bad, ref, "float32")
    assert m["nonfinite"] == 1 and m["max_abs"] == math.inf
    with pytest.raises(ValueError, match="shape"):
        error_metrics(ref[:10], ref, "float32")


def test_storage_precision_reads_the_grid_the_values_lie_on():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    assert storage_precision(x) == "float32"
    assert storage_precision(round_to(x, "tf32")) == "tf32"
    assert storage_precision(round_to(x, "bfloat16")) == "bfloat16"
    assert storage_precision(x.to(torch.bfloat16)) == "bfloat16"
    assert storage_precision(torch.ones(8)) == "float32"     # too few values to say anything
    with pytest.raises(ValueError, match="stage tap: expected a floating-point dtype.*int32"):
        storage_precision(torch.ones(8, dtype=torch.int32))


# --------------------------------------------------------------------------- naive and early stop
def test_emulated_stages_round_matmul_operands():
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(4, 64, generator=g), torch.randn(32, 64, generator=g)
    exact = x.double() @ w.double().T
    tf32 = emulated_stages("tf32").linear(x, w)
    expect = torch.tensor(_tf32_numpy(x.numpy())) @ torch.tensor(_tf32_numpy(w.numpy())).T
    assert torch.allclose(tf32.double(), expect, atol=1e-5)
    assert (tf32.double() - exact).abs().max() > 100 * (x @ w.T - exact).abs().max()
    assert emulated_stages("float32").linear is st.linear


def test_run_until_stops_right_after_the_stage():
    calls = []

    def spy_linear(*a, **k):
        calls.append("linear")
        return st.linear(*a, **k)

    def spy_attention(*a, **k):
        calls.append("attention")
        return st.causal_gqa_attention(*a, **k)

    from fuseval.operators import load
    from fuseval.inputs import generate_inputs
    defn = load(OP_A, "small")
    inputs = generate_inputs(defn, defn.cases("0")[0].axes, seed=0)
    fn = functools.partial(op_a.reference, stages=namespace(linear=spy_linear, causal_gqa_attention=spy_attention))
    taps, out = run_until(fn, inputs, override={}, stop="qkv_proj")
    assert list(taps) == ["input_norm", "qkv_proj"] and out is None
    assert calls == ["linear"] * 3                     # q, k, v; nothing after the stage
    full_taps, out = run_until(fn, inputs, override={}, stop=None)
    assert out is not None and len(full_taps) == len(defn.stages)


# --------------------------------------------------------------------------- budget files
def test_packaged_budgets_cover_every_stage():
    for op in (OP_A, OP_B):
        b = load_budget(op)
        from fuseval.operators import load
        assert list(b.stages) == load(op).stage_names
        assert all(s.allowances for s in b.stages.values()) and b.end_to_end.tolerance


def _draft(op=OP_A) -> dict:
    return json.loads(json.dumps(load_budget(op).raw))


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.pop("schema_version"), "schema_version"),
    (lambda d: d.update(op="nope"), "op"),
    (lambda d: d.update(extra=1), "extra"),
    (lambda d: d["stages"].update(attn={"dtype": "float32"}), "stages.attn"),
    (lambda d: d["stages"]["mrope"].update(dtype="fp8"), "stages.mrope.dtype"),
    (lambda d: d["stages"]["mrope"].update(allowance={"kind": "ratio", "max": 1}), "stages.mrope.allowance.kind"),
    (lambda d: d["stages"]["mrope"].update(allowance={"kind": "relative_to_naive"}), "factor"),
    (lambda d: d["stages"]["mrope"].update(allowance={"kind": "ulp", "max": 2, "metric": "max_abs"}), "metric"),
    (lambda d: d["stages"]["mrope"].update(allowance={"kind": "abs", "max": "2 * hiden_size"}), "hiden_size"),
    (lambda d: d["stages"]["mrope"].update(allowance={"kind": "abs", "max": "__import__('os')"}), "allowance.max"),
    (lambda d: d["stages"]["mrope"].update(allowance={"kind": "abs", "max": -1}), "allowance.max"),
    (lambda d: d["stages"]["mrope"].update(allowance=[{"kind": "abs", "max": 1, "applies": "local"}]),
     r"allowance\[0\]"),
    (lambda d: d["end_to_end"].update(tolerance="yes"), "end_to_end.tolerance"),
])
def test_malformed_budgets_name_the_bad_key(edit, message):
    d = _draft()
    edit(d)
    with pytest.raises(ValueError, match=message):
        load_budget(d)


def test_budget_for_another_operator_is_rejected(tmp_path):
    from fuseval.operators import load
    with pytest.raises(ValueError, match="the budget is for"):
        load_budget(_draft(OP_B), load(OP_A))
    bad = tmp_path / "b.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_budget(str(bad))
    with pytest.raises(ValueError, match="no such file"):
        load_budget(str(tmp_path / "missing.json"))


def test_group_entry_applies_to_its_sub_stages():
    d = _draft()
    for k in ("gate_up", "act", "down"):
        d["stages"].pop(k, None)
    d["stages"]["mlp"] = {"dtype": "float32", "allowance": {"kind": "abs", "max": 1e-3}}
    b = load_budget(d)
    assert [a.describe() for a in b.stages["act"].allowances] == ["max_abs <= 0.001"]
    assert b.stages["residual"].allowances != b.stages["act"].allowances


def test_allowance_limits():
    axes = {"hidden_size": 64}
    floor = Number("2 + log2(hidden_size) / 2", None)
    a = Allowance("relative_to_naive", "max_abs", factor=Number("2", 2.0), floor_ulp=floor)
    # 2 x naive + 5 ulps of float32 at the scale 3.0 (ulp 2^-22)
    assert a.limit(axes, {"max_abs": 1e-6}, 3.0, "float32") == pytest.approx(2e-6 + 5 * 2.0 ** -22)
    u = Allowance("relative_to_naive", "ulp_median", factor=Number("2", 2.0), floor_ulp=Number("1", 1.0))
    assert u.limit(axes, {"ulp_median": 0.25}, 3.0, "float32") == pytest.approx(1.5)
    assert math.isnan(u.limit(axes, None, 3.0, "float32"))      # no naive: never passes
    assert Allowance("ulp", "ulp_p99", max=Number("4", 4.0)).limit(axes, None, 1.0, "float32") == 4


# --------------------------------------------------------------------------- runs
@pytest.fixture(scope="module")
def fp32_reports():
    return {op: run_budget(op, "reference_fp32", config="small", cases=CASES) for op in (OP_A, OP_B)}


def test_float32_reference_is_within_budget(fp32_reports):
    for op, r in fp32_reports.items():
        assert r.passed and r.first_over_budget is None and r.staged, op
        for c in r.cases:
            assert c.end_to_end.tolerance_passed and c.end_to_end.naive and c.end_to_end.torch
            for s in c.stages:
                assert s.passed and s.local and s.propagated and s.downstream and s.naive_local, (op, s.stage)
                # the float32 reference is the naive's own formula: its local error is the naive's
                if s.precision == "float32" and s.dtype == "float32":
                    assert s.local["max_abs"] <= 2 * s.naive_local["max_abs"] + 1e-30, (op, s.stage)


def test_downstream_impact_grows_along_the_pipeline(fp32_reports):
    c = fp32_reports[OP_A].cases[-1]
    rel = [s.downstream["rel_l2"] for s in c.stages]
    assert rel[-1] == pytest.approx(c.end_to_end.impl["rel_l2"], rel=0.05)
    assert rel[0] < rel[-1] / 2          # the first stage alone causes a fraction of the final error


@pytest.mark.parametrize("op, stage, impl", [
    (OP_A, "input_norm", fp32(op_a.reference, stages=namespace(rms_norm=eps_outside_sqrt))),
    (OP_A, "qkv_proj", functools.partial(op_a.reference, stages=namespace(linear=linear_drops_bias))),
    (OP_A, "mrope", fp32(op_a.reference, stages=namespace(rope=rope_minus))),
    (OP_A, "attention", functools.partial(op_a.reference, stages=namespace(causal_gqa_attention=attention_noncausal))),
    (OP_B, "qk_norm", fp32(op_b.reference, stages=namespace(rms_norm=eps_outside_sqrt))),
    (OP_B, "rope", functools.partial(op_b.reference, stages=namespace(rope=rope_minus))),
    (OP_B, "dequant", fp32(op_b.reference, codec=types.SimpleNamespace(
        quantize_activations=nvfp4.quantize_activations,
        dequantize_nvfp4=lambda p, s, g, dtype: nvfp4.dequantize_nvfp4(p, s, 1.0, dtype)))),
])
def test_stage_swapped_mutant_is_named_first_over_budget(op, stage, impl):
    r = run_budget(op, impl, config="small", cases="0,12", baselines=False)
    assert not r.passed and r.first_over_budget == stage
    assert all(c.first_over_budget == stage for c in r.cases)
    for c in r.cases:
        s = c.stage(stage)
        assert not s.passed and any(ch["usage"] > 1 for ch in s.checks)


def test_local_error_isolates_a_stage_from_upstream_damage():
    """qkv_proj without biases wrecks everything after it in the pipeline (propagated),
    yet the later stages' local errors, fed the oracle's inputs, stay within budget."""
    impl = fp32(op_a.reference, stages=namespace(linear=linear_drops_bias))
    r = run_budget(OP_A, impl, config="small", cases="6", baselines=False)
    c = r.cases[0]
    assert c.first_over_budget == "qkv_proj"
    mrope, attention = c.stage("mrope"), c.stage("attention")
    assert mrope.propagated["max_abs"] > 1e3 * mrope.local["max_abs"]
    assert attention.propagated["max_abs"] > 1e3 * attention.local["max_abs"]
    # linear also runs o_proj, gate_up and down (no bias there): those stay within budget
    assert [s.stage for s in c.stages if s.passed is False] == ["qkv_proj"]
    assert c.stage("qkv_proj").downstream["tolerance_passed"] is False


def test_end_to_end_only_without_taps_and_the_verdict_still_bites():
    r = run_budget(OP_B, "torch", config="small", cases="0,5")
    assert r.passed and not r.staged and all(s.passed is None for s in r.cases[0].stages)
    assert "exposes no stage taps" in r.to_markdown()
    assert r.to_html().count("data:image/png;base64,") == 1        # only the across-cases plot

    def off_by_a_bit(*inputs):
        return tuple((o.float() * 1.02).to(o.dtype) for o in op_b.torch_eager(*inputs))
    r = run_budget(OP_B, off_by_a_bit, config="small", cases="0,5", baselines=False)
    assert not r.passed and r.first_over_budget == "end_to_end"


def test_production_bug_with_correct_taps_fails_end_to_end():
    """Taps from a correct staged path, outputs from a broken forward: the stages pass,
    the final verdict does not, and the report says staged and forward disagree."""
    def forward(*inputs):
        (out,) = op_a.reference_fp32(*inputs)
        return (out + 0.01,)
    forward.staged = fp32(op_a.reference)
    r = run_budget(OP_A, forward, config="small", cases="0", baselines=False)
    c = r.cases[0]
    assert all(s.passed for s in c.stages) and c.first_over_budget == "end_to_end"
    assert c.end_to_end.staged_vs_forward == pytest.approx(0.01, rel=1e-3)
    assert any("disagree" in m for m in c.messages)


def test_an_implementation_that_raises_is_reported_not_fatal():
    def broken(*inputs):
        raise RuntimeError("kernel launch failed")
    r = run_budget(OP_B, broken, config="small", cases="0", baselines=False)
    assert not r.passed and r.cases[0].raised
    assert "kernel launch failed" in " ".join(r.cases[0].messages)
    assert "raised in cases 0" in r.to_markdown() and "kernel launch failed" in r.to_html()


def test_budget_argument_dict_and_stricter_budget(fp32_reports):
    d = _draft(OP_B)
    d["stages"]["rope"]["allowance"] = {"kind": "abs", "max": 1e-12}
    r = run_budget(OP_B, "reference_fp32", config="small", cases="0", budget=d)
    assert r.first_over_budget == "rope"


# --------------------------------------------------------------------------- reports
def test_json_report_is_strict_versioned_and_renders_again(fp32_reports, tmp_path):
    r = fp32_reports[OP_A]
    path = r.save_json(tmp_path / "r.json")
    text = open(path).read()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    d = load_report(path)
    assert d["schema_version"] == 1 and d["kind"] == "fuseval.budget"
    assert d["stages"] == [s.stage for s in r.cases[0].stages]
    assert {"local", "propagated", "downstream", "naive_local", "checks", "precision"} <= set(d["cases"][0]["stages"][0])
    assert render_markdown(d) == r.to_markdown()
    (tmp_path / "bad.json").write_text(json.dumps({"kind": "other"}))
    with pytest.raises(ValueError, match="not a fuseval budget report"):
        load_report(tmp_path / "bad.json")


def test_json_report_writes_non_finite_numbers_as_strings_and_reads_them_back(fp32_reports, tmp_path):
    import copy
    from fuseval.budget.markdown import _e
    from fuseval.jsonio import number
    r = copy.deepcopy(fp32_reports[OP_B])
    r.cases[0].end_to_end.staged_vs_forward = math.inf
    r.cases[0].stages[0].local["max_abs"] = math.nan
    text = r.to_json()
    d = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert d["cases"][0]["end_to_end"]["staged_vs_forward"] == "inf"
    assert math.isnan(number(d["cases"][0]["stages"][0]["local"]["max_abs"]))
    assert number(d["cases"][0]["end_to_end"]["staged_vs_forward"]) == math.inf
    assert [_e(v) for v in ("inf", "nan", None, 0.0, 1.23456e-5)] == ["inf", "-", "-", "0", "1.23e-05"]


def test_markdown_is_short_and_names_stages(fp32_reports):
    md = fp32_reports[OP_A].to_markdown()
    assert md.count("\n") < 40 and "within budget" in md
    for name in ("input_norm", "mlp.gate_up", "mlp.down", "residual", "End to end"):
        assert name in md


def test_html_is_self_contained_with_plots(fp32_reports, tmp_path):
    path = fp32_reports[OP_B].save_html(tmp_path / "r.html")
    page = open(path).read()
    assert page.count("data:image/png;base64,") == 3
    assert "http://" not in page and "https://" not in page and "<script" not in page


def test_html_histograms_label_the_first_panel_with_curves(fp32_reports):
    """A first stage without error histograms (every element exact) leaves its panel
    empty: the legend goes to the first panel that has curves, with no matplotlib warning."""
    import warnings
    from fuseval.budget import html as budget_html
    d = json.loads(fp32_reports[OP_B].to_json())
    first = d["stages"][0]
    for c in d["cases"]:
        for s in c["stages"]:
            if s["stage"] == first:
                for kind in ("local", "propagated"):
                    if s.get(kind):
                        s[kind]["hist"] = [0] * len(s[kind]["hist"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert budget_html._histograms(d).startswith("data:image/png;base64,")


def test_dataframe_has_a_row_per_case_stage_and_kind(fp32_reports):
    df = fp32_reports[OP_B].to_dataframe()
    local = df[(df.kind == "local")]
    assert len(local) == 3 * 6 and set(local.stage) == {"act_quant", "dequant", "proj", "qk_norm", "rope",
                                                        "layout"}
    assert {"seq_len", "batch_size", "max_abs", "ulp_p99", "stage_usage"} <= set(df.columns)
    assert set(df[df.stage == "end_to_end"].kind) == {"impl", "naive", "reference_fp32", "torch"}


# --------------------------------------------------------------------------- CLI
def test_cli_writes_reports_and_exits_by_verdict(tmp_path, capsys):
    out = tmp_path / "o"
    code = cli.main(["budget", "--op", OP_B, "--impl", "reference_fp32", "--cases", "0,1", "--out", str(out),
                     "--html", "--markdown"])
    assert code == EXIT_OK
    assert {p.name for p in out.iterdir()} == {"budget.json", "budget.md", "budget.html"}
    assert "within budget" in capsys.readouterr().out
    strict = tmp_path / "strict.json"
    d = _draft(OP_B)
    d["end_to_end"]["allowance"] = {"kind": "abs", "max": 1e-9}
    strict.write_text(json.dumps(d))
    assert cli.main(["budget", "--op", OP_B, "--impl", "reference_fp32", "--cases", "0",
                     "--budget", str(strict)]) == EXIT_CHECK_FAILED


def test_cli_malformed_budget_file_exit_code(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    d = _draft(OP_B)
    d["stages"]["qk_nrom"] = {}
    bad.write_text(json.dumps(d))
    assert cli.main(["budget", "--op", OP_B, "--impl", "torch", "--budget", str(bad)]) == EXIT_BAD_FILE
    assert "stages.qk_nrom" in capsys.readouterr().err


def test_cli_user_module_without_taps_and_raising(tmp_path, monkeypatch, capsys):
    (tmp_path / "user_impl.py").write_text(
        "from fuseval.operators.nvfp4_qkv_rope.reference import torch_eager as plain\n"
        "def broken(*inputs):\n    raise RuntimeError('boom')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["budget", "--op", OP_B, "--impl", "user_impl:plain", "--cases", "0"]) == EXIT_OK
    assert "exposes no stage taps" in capsys.readouterr().out
    assert cli.main(["budget", "--op", OP_B, "--impl", "user_impl:broken", "--cases", "0",
                     "--no-baselines"]) == EXIT_IMPL_RAISED


def test_prefetched_inputs_give_the_same_report():
    """Inputs drawn ahead on worker threads (the GPU default) are the very inputs of the
    case: the per-stage errors are identical to a run that draws them in turn."""
    plain = run_budget(OP_B, "reference_fp32", config="small", cases="0,3,9", baselines=False, prefetch=0)
    ahead = run_budget(OP_B, "reference_fp32", config="small", cases="0,3,9", baselines=False, prefetch=2)
    for a, b in zip(plain.cases, ahead.cases):
        assert a.axes == b.axes
        for sa, sb in zip(a.stages, b.stages):
            assert sa.local == sb.local and sa.propagated == sb.propagated


@pytest.mark.parametrize("select", [False, True], ids=["kthvalue", "threshold_select"])
def test_kth_smallest_is_exact_with_zeros_and_infinities(select):
    """The k-th smallest tolerance ratio, by torch.kthvalue or by the threshold select
    (the path for large CUDA tensors): the same value as a full sort, at every rank."""
    from fuseval.budget.metrics import kth_smallest
    gen = torch.Generator().manual_seed(3)
    x = torch.rand(5000, generator=gen, dtype=torch.float64) * 7
    x[::9] = math.inf
    x[::13] = 0.0
    x[5:40] = 1.25                                       # ties
    ordered = x.sort().values
    for k in (1, 2, 38, 2500, 2501, 4444, 4950, 4999, 5000):
        assert kth_smallest(x, k, select=select) == float(ordered[k - 1]), k
        assert kth_smallest(x, k, select=select, sample=64) == float(ordered[k - 1]), k


def _misjudged_values() -> torch.Tensor:
    """6400 values whose stride-100 sample (64 values, all 0.5) holds none of the 128 large
    ones: a sample-based threshold alone misjudges them."""
    gen = torch.Generator().manual_seed(4)
    x = torch.rand(6400, generator=gen, dtype=torch.float64)
    x[1::100] += 10.0
    x[2::100] = math.inf
    x[::100] = 0.5
    return x


def _wrong_ranks(select, x: torch.Tensor) -> list[int]:
    ordered = x.sort().values
    return [k for k in (1, 10, 3000, 6300, 6336, 6337, 6390, 6400) if select(x, k) != float(ordered[k - 1])]


def _trusts_the_sample(x, k):
    """Mutant: the k-th smallest read off the sorted strided sample (no count of the
    candidates beyond its threshold)."""
    ordered = x[::100].sort().values
    return float(ordered[min(len(ordered) - 1, (k - 1) * len(ordered) // x.numel())])


def _rank_off_by_one(x, k):
    """Mutant: the select asked for the rank below."""
    from fuseval.budget.metrics import kth_smallest
    return kth_smallest(x, max(1, k - 1), select=True, sample=64)


@pytest.mark.parametrize("mutant", [_rank_off_by_one, _trusts_the_sample])
def test_kth_smallest_exactness_check_rejects_broken_selects(mutant):
    """The rank check of the next test fails a select that is off by one rank or answers
    from the sample alone."""
    assert _wrong_ranks(mutant, _misjudged_values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_kth_smallest_on_cuda_takes_the_select_and_is_exact():
    """Above a million elements on CUDA (the threshold select by default): the value a
    full sort gives, at the ranks a matched ratio asks for and in the lower half."""
    from fuseval.budget.metrics import kth_smallest
    gen = torch.Generator(device="cuda").manual_seed(5)
    x = torch.rand(3_000_001, generator=gen, device="cuda", dtype=torch.float64) ** 3
    x[::1001] = math.inf
    x[7::97] = 0.0
    ordered = x.sort().values
    n = x.numel()
    for k in (1, 1000, n // 2, n // 2 + 1, int(0.99 * n), int(0.999 * n), n - 2999, n):
        assert kth_smallest(x, k) == float(ordered[k - 1]), k


def test_kth_smallest_is_exact_when_the_sample_misjudges_the_values():
    """Values whose strided sample holds none of the large ones: the sample's threshold
    keeps too few candidates, the threshold moves, and the last resort is a full sort;
    the answer stays exact (and k outside 1..n is refused)."""
    from fuseval.budget.metrics import kth_smallest
    x = _misjudged_values()
    assert _wrong_ranks(lambda v, k: kth_smallest(v, k, select=True, sample=64), x) == []
    for k in (0, 6401):
        with pytest.raises(ValueError, match="k: expected"):
            kth_smallest(x, k)


def test_tolerance_used_is_infinite_when_a_required_element_is_not_finite():
    """An output whose element at the required ratio is a NaN the oracle does not have
    spends an infinite share of the tolerance (not the largest float64)."""
    from fuseval.budget.metrics import tolerance_use
    from fuseval.definitions import Tolerance
    ref = torch.ones(10, dtype=torch.float64)
    out = ref.clone()
    out[:2] = float("nan")
    assert tolerance_use(out, ref, Tolerance(atol=1e-3, rtol=0, min_matched_ratio=0.9)) == math.inf
    assert tolerance_use(out, ref, Tolerance(atol=1e-3, rtol=0, min_matched_ratio=0.8)) == 0.0
