"""The Triton fast path of op A (qwen2vl_decoder_layer) against the float64 oracle.

On the CPU the kernels run under the Triton interpreter (tests/conftest.py sets
TRITON_INTERPRET=1), on scaled-down configurations with ragged sequence lengths:
'small' (hidden 64, 4 query heads on 2 kv heads, head_dim 16) and 'gqa7' (7 query heads
per kv head). Every check draws fresh inputs and compares with the oracle under the
benchmark's tolerance rule (fuseval.check); each planted bug (a mutant of the kernels)
must be rejected by the same check. Cases with kv_seq_len > seq_len (RoPE tables longer
than the call's tokens: the layer uses their first seq_len rows) and the "hf_mrope"
variant (HF Qwen2-VL's mRoPE layout, ``forward_hf_mrope``) have tests of their own.
"""
from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from fuseval.check import compare, run_case
from fuseval.operators import load
from fuseval.operators.qwen2vl_decoder_layer import fast as fast
from fuseval.inputs import generate_inputs
from fuseval.operators.qwen2vl_decoder_layer.reference import cost_model, reference

OP = "qwen2vl_decoder_layer"
CPU = torch.device("cpu")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _case(config: str, index: int):
    defn = load(OP, config)
    return defn, defn.cases([index])[0]


def _inputs(defn, case, seed, mode="benchmark"):
    return generate_inputs(defn, case.axes, seed=seed, mode=mode, device=CPU)


def _longer_tables(case, extra: int):
    """The case with RoPE tables ``extra`` rows longer than its tokens (kv_seq_len > seq_len)."""
    return dataclasses.replace(case, axes={**case.axes, "kv_seq_len": case.axes["seq_len"] + extra})


# --------------------------------------------------------------------------- correctness
@pytest.mark.parametrize("config,index", [("small", 5), ("small", 12), ("gqa7", 9), ("gqa7", 2)])
def test_fast_passes_the_check_on_ragged_cases(config, index):
    """Full check (tolerance and hygiene rules) on cases whose token counts fill no tile."""
    defn, case = _case(config, index)
    result = run_case(defn, fast.forward, case, seed=1234, device=CPU)
    assert result.passed, result.messages
    assert result.outputs[0].max_abs < defn.tolerance.atol


def test_fast_passes_realistic_inputs():
    """Norm weights away from 1 and cos/sin of real multimodal positions."""
    defn, case = _case("gqa7", 9)
    result = run_case(defn, fast.forward, case, seed=77, device=CPU, mode="realistic", hygiene=False)
    assert result.passed, result.messages


@pytest.mark.parametrize("config,tuning", [
    ("gqa7", dict(o_proj=fast.GemmConfig(32, 32, 32, 4, 1, use_tma=True),
                  gate_up=fast.GemmConfig(32, 32, 16, 4, 1, use_tma=True),
                  down=fast.GemmConfig(16, 32, 32, 4, 1, use_tma=True))),
    ("gqa7", dict(o_proj=fast.GemmConfig(32, 32, 32, 4, 1, use_tma=True, persistent=True),
                  gate_up=fast.GemmConfig(32, 16, 32, 4, 1, use_tma=True, persistent=True, warp_specialize=True),
                  down=fast.GemmConfig(16, 32, 32, 4, 1, use_tma=True, persistent=True, round_b=True),
                  qkv=fast.GemmConfig(16, 32, 16, 4, 1, round_b=True), qkv_heads_per_tile=1,
                  attention=fast.AttnConfig(16, 16, 4, 1))),
    # 'small' has 4 query heads on 2 kv heads, so a QKV tile can hold two whole heads
    ("small", dict(qkv=fast.GemmConfig(16, 0, 16, 4, 1, use_tma=True), qkv_heads_per_tile=2,
                   o_proj=fast.GemmConfig(16, 32, 16, 4, 1, split_k=3),
                   down=fast.GemmConfig(32, 16, 32, 4, 1, use_tma=True, split_k=2),
                   attention=fast.AttnConfig(16, 16, 4, 1, use_tma=True))),
], ids=["tma", "persistent+round_b", "tma_qkv_2heads+split_k+tma_attention"])
def test_gpu_tile_variants_pass_under_the_interpreter(config, tuning):
    """The TMA, persistent, split-K and in-kernel-rounding code paths the GPU table uses."""
    defn, case = _case(config, 9)
    assert fast.plan_for(fast.shape_of(_inputs(defn, case, seed=0)), CPU,
                         tuning=tuning).qkv_heads_per_tile == tuning.get("qkv_heads_per_tile", 2 if config == "small" else 1)
    result = run_case(defn, fast.variant(tuning=tuning), case, seed=5, device=CPU, hygiene=False)
    assert result.passed, result.messages


def test_interpreter_tiles_keep_two_row_tiles():
    """Under the interpreter the tiles grow with the call (few programs), but every call of
    more than 32 rows still runs two or more row tiles in each GEMM, norm and attention."""
    from fuseval.operators.qwen2vl_decoder_layer._plans import Shape
    for s in (1, 8, 9, 24, 33, 64, 99, 128, 256, 512, 700):
        for b in (1, 3):
            sh = Shape(B=b, S=s, H=64, Hq=4, Hkv=2, D=16, I=96)
            plan = fast.plan_for(sh, CPU, compiled=False)
            for rows, bm in ((sh.M, plan.qkv.BM), (sh.M, plan.down.BM), (sh.M, plan.norm_rows),
                             (sh.S * sh.G, plan.attention.BM)):
                assert 16 <= bm <= 256 and (rows <= 32 or -(-rows // bm) >= 2), (b, s, rows, bm)
            assert -(-sh.S // plan.attention.BN) >= (2 if sh.S > 16 else 1), (b, s, plan.attention)


@pytest.mark.parametrize("use_tma", [False, True], ids=["pointers", "tma"])
def test_attention_never_reads_the_padding_of_vt(use_tma):
    """V^T rows are padded to S_pad keys and nobody writes the padding: NaN there must not
    reach the output (pointer loads mask it; the TMA descriptor stops at S)."""
    defn, case = _case("gqa7", 9)                        # S = 24 keys, padded to 32
    sh = fast.shape_of(_inputs(defn, case, seed=0))
    assert sh.S_pad > sh.S
    gen = torch.Generator().manual_seed(21)
    qk = torch.randn(sh.M, sh.QD + sh.KD, generator=gen)
    v = torch.randn(sh.B, sh.Hkv, sh.D, sh.S, generator=gen)
    vt = torch.full((sh.B, sh.Hkv, sh.D, sh.S_pad), float("nan"))
    vt[..., :sh.S] = v
    plan = fast.plan_for(sh, CPU, "ieee", tuning={"attention": fast.AttnConfig(16, 16, 4, 1, use_tma=use_tma)})
    out = torch.full((sh.M, sh.QD), float("nan"))
    fast.launch_attention(qk, vt, out, sh, plan)
    # causal GQA attention in float64: query head i reads kv head i // G
    q = qk[:, :sh.QD].double().view(sh.B, sh.S, sh.Hq, sh.D).transpose(1, 2)
    k = qk[:, sh.QD:].double().view(sh.B, sh.S, sh.Hkv, sh.D).transpose(1, 2).repeat_interleave(sh.G, 1)
    vv = v.double().transpose(2, 3).repeat_interleave(sh.G, 1)
    scores = q @ k.transpose(2, 3) / math.sqrt(sh.D)
    scores = scores.masked_fill(torch.ones(sh.S, sh.S, dtype=torch.bool).triu(1), float("-inf"))
    want = (scores.softmax(-1) @ vv).transpose(1, 2).reshape(sh.M, sh.QD)
    assert torch.isfinite(out).all()
    assert float((out.double() - want).abs().max()) < 1e-5


def test_precision_policies():
    """"ieee" keeps fp32 operands (interpreter dots are exact: error near fp32 rounding);
    "tf32" rounds every tensor-core operand to TF32, which must show in the error."""
    defn, case = _case("small", 9)
    inputs = _inputs(defn, case, seed=3)
    ref = reference(*inputs)[0]
    err = {p: compare(fast.forward(*inputs, precision=p)[0], ref, defn.tolerance)
           for p in ("ieee", "tf32x3", "tf32")}
    assert err["ieee"].max_abs < 1e-4 and err["tf32x3"].max_abs < 1e-4
    assert 1e-5 < err["tf32"].max_abs < defn.tolerance.atol
    ieee_attention = compare(fast.forward(*inputs, attention_precision="ieee")[0], ref, defn.tolerance)
    assert ieee_attention.passed
    with pytest.raises(ValueError, match="precision must be one of"):
        fast.forward(*inputs, precision="bf16")


# --------------------------------------------------------------------------- stage taps
def test_staged_taps_match_the_oracle_and_the_fused_output():
    defn, case = _case("gqa7", 9)
    inputs = _inputs(defn, case, seed=11)
    want: dict = {}
    reference(*inputs, taps=want)
    got: dict = {}
    staged = fast.forward.staged(*inputs, taps=got, precision="ieee")[0]
    assert set(got) == set(want) == set(defn.stage_names)
    for name in want:
        assert got[name].shape == want[name].shape, name
        err = float((got[name].double() - want[name]).abs().max())
        assert err < 1e-4, (name, err)
    # the staged path runs the same kernels: identical output to the fused forward
    assert torch.equal(staged, fast.forward(*inputs, precision="ieee")[0])
    tf32_taps: dict = {}
    assert torch.equal(fast.forward.staged(*inputs, taps=tf32_taps)[0], fast.forward(*inputs)[0])


def test_staged_override_replaces_a_stage():
    defn, case = _case("small", 9)
    inputs = _inputs(defn, case, seed=12)
    taps: dict = {}
    ref = reference(*inputs, taps=taps)[0]
    # the oracle's attention fed to the fast rest of the layer: still right
    out = fast.forward.staged(*inputs, override={"attention": taps["attention"]}, precision="ieee")[0]
    assert compare(out, ref, defn.tolerance).max_abs < 1e-4
    # a wrong attention output must show downstream (the override is really used)
    bad = fast.forward.staged(*inputs, override={"attention": torch.zeros_like(taps["attention"])})[0]
    assert not compare(bad, ref, defn.tolerance).passed
    # the override is the stage's value, stored as the policy stores that stage
    seen: dict = {}
    fast.forward.staged(*inputs, taps=seen, override={"mrope": taps["mrope"]}, precision="tf32")
    assert torch.equal(seen["mrope"], taps["mrope"].float())
    fast.forward.staged(*inputs, taps=seen, override={"mrope": taps["mrope"]}, precision="fp16")
    assert torch.equal(seen["mrope"], taps["mrope"].float().half().float())
    with pytest.raises(ValueError, match="unknown stages"):
        fast.forward.staged(*inputs, override={"rope": taps["mrope"]})


# --------------------------------------------------------------------------- mutants
@pytest.fixture(scope="module")
def small_case():
    """A ragged 'small' case (2 kv heads of 2 query heads each, so i // G != i % Hkv)."""
    defn, case = _case("small", 9)
    return defn, case, _inputs(defn, case, seed=2024)


# mutants that need inputs of their own: eps_outside_sqrt (tiny activations),
# mrope_last_rows (tables longer than the tokens) and fp16_overflow_kept (values beyond fp16
# range under the fp16 policy), below
SPECIAL_INPUT_MUTANTS = ("eps_outside_sqrt", "mrope_last_rows", "fp16_overflow_kept")


@pytest.mark.parametrize("mutant", [m for m in fast.MUTANTS if m not in SPECIAL_INPUT_MUTANTS])
def test_check_rejects_each_mutant(small_case, mutant):
    defn, case, inputs = small_case
    good = run_case(defn, fast.forward, case, seed=0, device=CPU, inputs=inputs, hygiene=False)
    assert good.passed, good.messages
    bad = run_case(defn, fast.variant(mutant), case, seed=0, device=CPU, inputs=inputs, hygiene=False)
    assert not bad.passed and "tolerance" in bad.violations, (mutant, bad.outputs[0].max_abs)


def test_check_rejects_eps_outside_the_sqrt(small_case):
    """eps only matters next to mean(x^2): with activations of rms 1e-3 (mean square
    1e-6 = eps) the two formulas differ by 40%; on the correct path nothing changes."""
    defn, case, inputs = small_case
    quiet = list(inputs)
    quiet[0] = inputs[0] * 1e-3
    good = run_case(defn, fast.forward, case, seed=0, device=CPU, inputs=quiet, hygiene=False)
    assert good.passed, good.messages
    bad = run_case(defn, fast.variant("eps_outside_sqrt"), case, seed=0, device=CPU, inputs=quiet,
                   hygiene=False)
    assert not bad.passed and "tolerance" in bad.violations


def test_staged_path_carries_the_mutant_too(small_case):
    """The budget reads stages off ``.staged``: a planted bug must show there as well."""
    defn, case, inputs = small_case
    ref = reference(*inputs)[0]
    out = fast.variant("silu_on_up").staged(*inputs)[0]
    assert not compare(out, ref, defn.tolerance).passed


def test_unknown_mutant_is_rejected():
    with pytest.raises(ValueError, match="mutant must be one of"):
        fast.variant("off_by_one")
    assert all(isinstance(why, str) and why for why in fast.MUTANTS.values())


# --------------------------------------------------------------------------- input errors
def test_bad_inputs_raise_value_errors_naming_them(small_case):
    defn, case, inputs = small_case
    shorter = list(inputs)
    b, s = inputs[0].shape[:2]
    shorter[9] = inputs[9][:, :, :s - 1].contiguous()   # fewer table rows than tokens
    shorter[10] = inputs[10][:, :, :s - 1].contiguous()
    for fn in (fast.forward, fast.forward.staged, fast.forward_hf_mrope):
        with pytest.raises(ValueError, match=rf"kv_seq_len={s - 1}.*seq_len={s}"):
            fn(*shorter)
    wrong_dtype = list(inputs)
    wrong_dtype[8] = inputs[8].double()
    with pytest.raises(ValueError, match="o_proj_weight.*float32"):
        fast.forward(*wrong_dtype)
    wrong_shape = list(inputs)
    wrong_shape[14] = inputs[14][:, :-1]
    with pytest.raises(ValueError, match="down_proj_weight"):
        fast.forward(*wrong_shape)
    with pytest.raises(ValueError, match="16 inputs"):
        fast.variant()(*inputs[:-1])


# --------------------------------------------------------------------------- kv_seq_len > seq_len
@pytest.fixture(scope="module")
def long_table_case():
    """'small', 3 sequences of 11 tokens (33 rows: no tile is full) with RoPE tables 7
    rows longer than the tokens."""
    defn, case = _case("small", 9)
    case = _longer_tables(dataclasses.replace(case, axes={"seq_len": 11, "batch_size": 3}), 7)
    return defn, case, _inputs(defn, case, seed=4048)


def test_fast_reads_the_first_seq_len_rows_of_longer_tables(long_table_case):
    """kv_seq_len > seq_len: the check against the oracle passes, and the output is exactly
    the one computed from the tables cut to their first seq_len rows (the kernels read
    nothing else of them), for the fused and the staged path."""
    defn, case, inputs = long_table_case
    s = case.axes["seq_len"]
    assert inputs[9].shape[2] == s + 7
    result = run_case(defn, fast.forward, case, seed=0, device=CPU, inputs=inputs)
    assert result.passed, result.messages
    cut = list(inputs)
    cut[9], cut[10] = (t[:, :, :s].contiguous() for t in inputs[9:11])
    out = fast.forward(*inputs)[0]
    assert torch.equal(out, fast.forward(*cut)[0])
    assert torch.equal(out, fast.forward.staged(*inputs)[0])
    # the rows past seq_len really are different: the last seq_len rows give another layer
    last = list(inputs)
    last[9], last[10] = (t[:, :, -s:].contiguous() for t in inputs[9:11])
    assert not compare(fast.forward(*last)[0], reference(*inputs)[0], case.tolerance).passed


def test_staged_mrope_tap_reads_the_first_rows(long_table_case):
    defn, case, inputs = long_table_case
    want: dict = {}
    reference(*inputs, taps=want)
    got: dict = {}
    fast.forward.staged(*inputs, taps=got, precision="ieee")
    assert float((got["mrope"].double() - want["mrope"]).abs().max()) < 1e-5


def test_check_rejects_the_last_rows_mutant(long_table_case, small_case):
    """Reading the last seq_len rows is caught once the tables are longer than the tokens;
    with kv_seq_len == seq_len it is the same computation (the mutant is that bug only)."""
    defn, case, inputs = long_table_case
    for mutant in (fast.variant("mrope_last_rows"), fast.variant("mrope_last_rows").staged):
        bad = run_case(defn, mutant, case, seed=0, device=CPU, inputs=inputs, hygiene=False)
        assert not bad.passed and "tolerance" in bad.violations, bad.outputs[0].max_abs
    _, _, equal_rows = small_case
    assert torch.equal(fast.variant("mrope_last_rows")(*equal_rows)[0], fast.forward(*equal_rows)[0])


def test_generated_longer_tables_pass_the_check():
    """kv_seq_len > seq_len drawn by the input generator, on the 7-heads-per-kv-head config."""
    defn, case = _case("gqa7", 2)
    case = _longer_tables(case, 13)
    result = run_case(defn, fast.forward, case, seed=31, device=CPU)
    assert result.passed, result.messages


# --------------------------------------------------------------------------- the hf_mrope variant
def test_forward_hf_mrope_matches_the_hf_oracle(long_table_case):
    """The "hf_mrope" variant: forward_hf_mrope passes the check against
    reference(mrope_layout="hf") (the variant's oracle, resolved through the definition),
    fails against the benchmark's; forward fails against the variant's oracle."""
    defn, case, inputs = long_table_case
    hf = load(OP, "small", variant="hf_mrope")
    assert hf.implementations["fast"].endswith(":forward_hf_mrope")
    good = run_case(hf, fast.forward_hf_mrope, case, seed=0, device=CPU, inputs=inputs)
    assert good.passed, good.messages
    explicit = compare(fast.forward_hf_mrope(*inputs)[0], reference(*inputs, mrope_layout="hf")[0],
                       case.tolerance)
    assert explicit.passed and explicit.max_abs < case.tolerance.atol
    for d, impl in ((defn, fast.forward_hf_mrope), (hf, fast.forward)):
        bad = run_case(d, impl, case, seed=0, device=CPU, inputs=inputs, hygiene=False)
        assert not bad.passed and "tolerance" in bad.violations


def test_forward_hf_mrope_staged_taps_match_the_hf_oracle(long_table_case):
    defn, case, inputs = long_table_case
    want: dict = {}
    reference(*inputs, taps=want, mrope_layout="hf")
    got: dict = {}
    out = fast.forward_hf_mrope.staged(*inputs, taps=got, precision="ieee")[0]
    for name in ("mrope", "attention", "residual"):
        assert float((got[name].double() - want[name]).abs().max()) < 1e-4, name
    assert torch.equal(out, fast.forward_hf_mrope(*inputs, precision="ieee")[0])


def test_check_rejects_the_swapped_layout_in_the_hf_variant(long_table_case):
    """mrope_layout_swapped is the benchmark's layout under forward_hf_mrope: the variant's
    check rejects it (under forward, the generic mutant test covers HF's layout)."""
    defn, case, inputs = long_table_case
    hf = load(OP, "small", variant="hf_mrope")
    mutant = fast.variant("mrope_layout_swapped", mrope_layout="hf")
    bad = run_case(hf, mutant, case, seed=0, device=CPU, inputs=inputs, hygiene=False)
    assert not bad.passed and "tolerance" in bad.violations
    with pytest.raises(ValueError, match="mrope_layout"):
        fast.variant(mrope_layout="qwen")


# --------------------------------------------------------------------------- the fp16 policy
@pytest.mark.parametrize("config,index", [("small", 5), ("gqa7", 9)])
def test_fp16_policy_passes_the_check(config, index):
    defn, case = _case(config, index)
    result = run_case(defn, fast.forward_fp16, case, seed=4321, device=CPU)
    assert result.passed, result.messages


def _weights_as_a_tuning():
    wa = lambda bm, bn, bk, **kw: fast.GemmConfig(bm, bn, bk, 4, 1, weights_as_a=True, **kw)
    return dict(o_proj=wa(16, 32, 16), gate_up=wa(32, 16, 32), down=wa(16, 32, 32, split_k=2))


@pytest.mark.parametrize("config", ["small", "gqa7"])
def test_fp16_weights_as_a_tiles_pass_under_the_interpreter(config):
    """The fp16 table's GEMM kernel (weights as the tensor cores' A operand, split-K for the
    down projection) on ragged cases; planted bugs through it are rejected."""
    defn, case = _case(config, 9)
    inputs = _inputs(defn, case, seed=6)
    tuning = _weights_as_a_tuning()
    good = run_case(defn, fast.variant(precision="fp16", tuning=tuning), case, seed=0, device=CPU, inputs=inputs,
                    hygiene=False)
    assert good.passed, good.messages
    for mutant in ("silu_on_up", "missing_residual", "missing_final_residual"):
        bad = run_case(defn, fast.variant(mutant, precision="fp16", tuning=tuning), case, seed=0, device=CPU,
                       inputs=inputs, hygiene=False)
        assert not bad.passed and "tolerance" in bad.violations, mutant


def test_fp16_policy_of_the_hf_variant(long_table_case):
    """The definition's fast_fp16 of the hf_mrope variant is HF's layout under fp16."""
    defn, case, inputs = long_table_case
    hf = load(OP, "small", variant="hf_mrope")
    assert hf.implementations["fast_fp16"].endswith(":forward_hf_mrope_fp16")
    assert run_case(hf, fast.forward_hf_mrope_fp16, case, seed=0, device=CPU, inputs=inputs).passed
    bad = run_case(defn, fast.forward_hf_mrope_fp16, case, seed=0, device=CPU, inputs=inputs, hygiene=False)
    assert not bad.passed


def _fp16_operand_errors(precision: str, tuning=None) -> dict[str, tuple[float, float]]:
    """Per GEMM stage tap: (max abs against the float64 product of fp16-rounded operands,
    max abs against that of the fp32 operands), the operands being the taps that fed it."""
    defn, case = _case("small", 9)
    inputs = _inputs(defn, case, seed=8)
    taps: dict = {}
    fast.variant(precision=precision, tuning=tuning).staged(*inputs, taps=taps)
    half = lambda t: t.to(torch.float16).double()
    wq, bq, wd = inputs[2], inputs[3], inputs[14]
    i = inputs[12].shape[0]
    gemms = {"qkv_proj": (taps["input_norm"], wq, bq, taps["qkv_proj"][..., :wq.shape[0]]),
             "gate_up": (taps["post_norm"], inputs[12], None, taps["gate_up"][..., :i]),
             "down": (taps["act"], wd, None, taps["down"])}
    errors = {}
    for name, (a, w, b, got) in gemms.items():
        bias = 0 if b is None else b.double()
        fp16_product = a.double() @ half(w).T + bias
        fp32_product = a.double() @ w.double().T + bias
        errors[name] = (float((got.double() - fp16_product).abs().max()),
                        float((got.double() - fp32_product).abs().max()))
    return errors


def test_fp16_policy_converts_the_weights_to_fp16():
    """Under "fp16" each GEMM tap is the product of its (fp16) activation operand with the
    weights rounded to fp16, accumulated in fp32; the product with the fp32 weights is
    measurably different. The "tf32" policy (exact fp32 products in the interpreter) is the
    mutant: its taps are the fp32 products."""
    for name, (to_fp16, to_fp32) in _fp16_operand_errors("fp16").items():
        assert to_fp16 < 2e-5 and to_fp32 > 10 * to_fp16, (name, to_fp16, to_fp32)
    assert all(to_fp16 > 10 * to_fp32 for to_fp16, to_fp32 in _fp16_operand_errors("ieee").values())


FP16_WEIGHTS = {"fp16_weights": True}


def test_fp16_weights_converted_per_call_are_the_rounded_weights():
    """With the weights converted to fp16 by a pass of their own (the fp16 table's large
    calls), each GEMM tap is still the product with the weights rounded to nearest fp16."""
    for name, (to_fp16, to_fp32) in _fp16_operand_errors("fp16", FP16_WEIGHTS).items():
        assert to_fp16 < 2e-5 and to_fp32 > 10 * to_fp16, (name, to_fp16, to_fp32)


@pytest.mark.parametrize("config", ["small", "gqa7"])
def test_fp16_weights_converted_per_call_pass_the_check(config):
    """The converted-weights path passes the check on ragged cases (hygiene included: the
    fp16 copies are made in every call, nothing is kept), and planted bugs through it are
    rejected."""
    defn, case = _case(config, 9)
    inputs = _inputs(defn, case, seed=7)
    good = run_case(defn, fast.variant(precision="fp16", tuning=FP16_WEIGHTS), case, seed=0, device=CPU,
                    inputs=inputs, hygiene=config == "small")
    assert good.passed, good.messages
    for mutant in ("silu_on_up", "noncausal_attention", "missing_final_residual"):
        bad = run_case(defn, fast.variant(mutant, precision="fp16", tuning=FP16_WEIGHTS), case, seed=0,
                       device=CPU, inputs=inputs, hygiene=False)
        assert not bad.passed and "tolerance" in bad.violations, mutant


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # numpy: the planted overflow
def test_fp16_weights_beyond_range_are_caught_in_their_conversion(small_case):
    """A weight beyond fp16 range, converted by the weights' own pass, sets the flag there:
    the call is recomputed under "tf32"; the mutant that keeps the overflow fails."""
    defn, case, inputs = small_case
    scaled = list(inputs)
    scaled[13] = inputs[13] * 2.0 ** 20                          # up weights ~ 1e5
    converted = fast.variant(precision="fp16", tuning=FP16_WEIGHTS)
    before = fast.FP16_FALLBACK.count
    for fn in (converted, converted.staged):
        assert torch.equal(fn(*scaled)[0], fast.forward(*scaled, precision="tf32")[0])
    assert fast.FP16_FALLBACK.count == before + 2
    kept = fast.variant("fp16_overflow_kept", precision="fp16", tuning=FP16_WEIGHTS)
    assert not torch.isfinite(kept(*scaled)[0]).all()


def test_fp16_weights_only_under_the_fp16_policy():
    with pytest.raises(ValueError, match="fp16_weights"):
        fast.plan_for(SEED_SHAPE, CUDA, "tf32", tuning=FP16_WEIGHTS)


def test_the_fp16_table_converts_the_weights_of_large_calls_only():
    """GPU plans under "fp16": calls from the table's fp16_weights_from tokens up convert the
    weights and take that regime's GEMM rows; smaller calls keep the fp32 weights' rows."""
    table = fast.tables("fp16")
    start = table.fp16_weights_from
    assert start is not None
    for tokens in (128, start - 1, start, 8192):
        sh = dataclasses.replace(SEED_SHAPE, S=tokens)
        plan = fast.plan_for(sh, CUDA, "fp16")
        assert plan.fp16_weights == (tokens >= start), tokens
        rows = table.gemm_rows("down", plan.fp16_weights)
        assert plan.down in rows.values() and all((m >= start) == plan.fp16_weights for m in rows)
        assert not fast.plan_for(sh, CUDA, "tf32").fp16_weights
    raw = fast.options()["tables"]["fp16"]
    assert raw["fp16_weights_from"] == start
    raw.pop("source")
    assert fast.tables_from_json(raw).fp16_weights_from == start


def test_fp16_policy_stores_fp16_activations():
    """The stages that only feed products hold fp16 values; input_norm is the fp32 norm
    rounded to nearest fp16 (at most half an fp16 ulp away)."""
    defn, case = _case("small", 9)
    inputs = _inputs(defn, case, seed=9)
    taps: dict = {}
    fast.forward.staged(*inputs, taps=taps, precision="fp16")
    for name in ("input_norm", "mrope", "attention", "post_norm", "act"):
        assert torch.equal(taps[name], taps[name].half().float()), name
    x, w = inputs[0].double(), inputs[1].double()
    norm = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + float(inputs[-1])) * w
    half_ulp = torch.ldexp(torch.ones_like(norm), torch.frexp(norm)[1] - 12)
    assert bool(((taps["input_norm"].double() - norm).abs() <= half_ulp * 1.001).all())
    ieee: dict = {}
    fast.forward.staged(*inputs, taps=ieee, precision="ieee")
    assert not torch.equal(ieee["input_norm"], ieee["input_norm"].half().float())


def _beyond_fp16(inputs):
    """The same layer with the input norm's output beyond fp16 range: its weight times 2^16,
    the q/k/v weights times 2^-16 (powers of two: the oracle's output does not change)."""
    scaled = list(inputs)
    scaled[1] = inputs[1] * 2.0 ** 16
    for i in (2, 4, 6):
        scaled[i] = inputs[i] * 2.0 ** -16
    return scaled


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # numpy: the planted overflow
def test_fp16_values_beyond_range_recompute_the_call_under_tf32(small_case):
    defn, case, inputs = small_case
    huge = _beyond_fp16(inputs)
    ref = reference(*huge)[0]
    assert torch.equal(ref, reference(*inputs)[0])
    before = fast.FP16_FALLBACK.count
    fast.forward_fp16(*inputs)
    assert fast.FP16_FALLBACK.count == before                       # in range: no recomputation
    for fn in (fast.forward_fp16, fast.forward_fp16.staged):
        result = run_case(defn, fn, case, seed=0, device=CPU, inputs=huge, hygiene=False)
        assert result.passed, result.messages
    assert fast.FP16_FALLBACK.count == before + 2
    assert torch.equal(fast.forward_fp16(*huge)[0], fast.forward(*huge, precision="tf32")[0])
    mutant = fast.variant("fp16_overflow_kept", precision="fp16")
    for fn in (mutant, mutant.staged):
        bad = run_case(defn, fn, case, seed=0, device=CPU, inputs=huge, hygiene=False)
        assert not bad.passed and "nonfinite" in bad.outputs[0].reasons


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # numpy: the planted overflow
def test_fp16_weights_beyond_range_are_caught_in_the_gemm(small_case):
    """A weight beyond fp16 range overflows where the GEMM converts it; the accumulator is
    then not finite, which the epilogue flags."""
    defn, case, inputs = small_case
    scaled = list(inputs)
    scaled[12] = inputs[12] * 2.0 ** 20                          # gate weights ~ 1e5
    before = fast.FP16_FALLBACK.count
    assert torch.equal(fast.forward_fp16(*scaled)[0], fast.forward(*scaled, precision="tf32")[0])
    assert fast.FP16_FALLBACK.count == before + 1
    assert not torch.isfinite(fast.variant("fp16_overflow_kept", precision="fp16")(*scaled)[0]).all()


def test_the_properties_huge_inputs_stay_in_fp16_range(small_case):
    """The properties' "huge" hidden states (x 4096) are normalised before any fp16
    operand: the fp16 policy passes without recomputation."""
    defn, case, inputs = small_case
    huge = list(inputs)
    huge[0] = inputs[0] * 4096.0
    before = fast.FP16_FALLBACK.count
    result = run_case(defn, fast.forward_fp16, case, seed=0, device=CPU, inputs=huge, hygiene=False)
    assert result.passed, result.messages
    assert fast.FP16_FALLBACK.count == before


def test_torch_fp16_baseline_computes_in_fp16():
    from fuseval.operators.qwen2vl_decoder_layer.reference import torch_eager, torch_eager_fp16
    defn, case = _case("small", 9)
    inputs = _inputs(defn, case, seed=5)
    ref = reference(*inputs)[0]
    fp16 = compare(torch_eager_fp16(*inputs)[0], ref, defn.tolerance)
    fp32 = compare(torch_eager(*inputs)[0], ref, defn.tolerance)
    assert fp16.passed and fp16.max_abs > 10 * fp32.max_abs, (fp16.max_abs, fp32.max_abs)


# --------------------------------------------------------------------------- options and tables
def test_options_are_json_and_round_trip_the_tables():
    opts = json.loads(json.dumps(fast.options()))
    assert opts["precision"] == fast.DEFAULT_PRECISION and opts["precisions"] == list(fast.PRECISIONS)
    for policy in ("tf32", "fp16"):
        raw = dict(opts["tables"][policy])
        raw.pop("source")
        table = fast.tables_from_json(raw)
        want = fast.plan_for(SEED_SHAPE, CUDA, policy)
        assert fast.plan_for(SEED_SHAPE, CUDA, policy, tables=table) == want


SEED_SHAPE = fast.Shape(B=1, S=128, H=3584, Hq=28, Hkv=4, D=128, I=18944)
CUDA = torch.device("cuda")          # plan_for only reads the device type: no GPU needed


def test_with_tables_changes_the_plan_of_gpu_calls_in_the_block():
    base = fast.plan_for(SEED_SHAPE, CUDA)
    odd = fast.GemmConfig(32, 64, 32, 4, 2)
    raw = fast.options()["tables"]["tf32"]
    raw.pop("source")
    raw["o_proj"] = {"128": {"config": dataclasses.asdict(odd)}}
    with fast.with_tables(raw):
        assert fast.plan_for(SEED_SHAPE, CUDA).o_proj == odd
        assert fast.options()["tables"]["tf32"]["o_proj"] == raw["o_proj"]
        assert fast.plan_for(SEED_SHAPE, CUDA, "fp16") == fast.plan_for(SEED_SHAPE, CUDA, "fp16", tables=None)
    assert fast.plan_for(SEED_SHAPE, CUDA) == base != dataclasses.replace(base, o_proj=odd)
    del raw["down"]
    with pytest.raises(ValueError, match="down"):
        fast.tables_from_json(raw)


def test_shape_of_uses_the_definition_once_per_signature(small_case):
    defn, case, inputs = small_case
    sh = fast.shape_of(inputs)
    assert (sh.B, sh.S) == (case.axes["batch_size"], case.axes["seq_len"])
    assert (sh.H, sh.Hq, sh.Hkv, sh.D, sh.I) == tuple(defn.const_axes[k] for k in (
        "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size"))
    odd = list(inputs)
    odd[9] = inputs[9][..., :12].contiguous()                   # head_dim 12 on cos only
    with pytest.raises(ValueError, match="rope_sin|head_dim"):
        fast.shape_of(odd)


# --------------------------------------------------------------------------- cost model
def test_cost_model_counts_inputs_outputs_and_products():
    defn = load(OP, "gqa7")
    for case in defn.cases([0, 12]):
        axes = defn.resolve_axes(case.axes)
        inputs = generate_inputs(defn, case.axes, seed=0)
        cost = cost_model(axes)
        b, s, h = axes["batch_size"], axes["seq_len"], axes["hidden_size"]
        io = sum(t.numel() * t.element_size() for t in inputs if isinstance(t, torch.Tensor))
        assert cost["bytes"] == io + b * s * h * 4
        weights = sum(t.numel() for t, spec in zip(inputs, defn.inputs)
                      if spec.name.endswith("proj_weight"))
        causal = 4 * b * axes["num_heads"] * s * s * axes["head_dim"] / 2
        assert cost["flops"] == 2 * b * s * weights + causal
        assert cost["matmul_dtype"] == "fp16" and cost["floors_also_at"] == ["tf32"]


# --------------------------------------------------------------------------- GPU
@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("index", [0, 5])
def test_fast_passes_full_size_on_the_gpu(index):
    defn, case = _case("seed", index)
    result = run_case(defn, fast.forward, case, seed=99, device=torch.device("cuda"))
    assert result.passed, result.messages


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["sol", "hf_mrope"])
def test_longer_tables_and_both_layouts_on_the_gpu(variant):
    """Full size, 131 tokens with tables of 300 rows (first 131 used), each layout against
    its own oracle (the Triton QKV epilogue with the GPU table's tiles)."""
    defn, case = _case("seed", 5)
    defn = load(OP, variant=variant)
    case = _longer_tables(case, 300 - case.axes["seq_len"])
    impl = fast.forward if variant == "sol" else fast.forward_hf_mrope
    result = run_case(defn, impl, case, seed=7, device=torch.device("cuda"))
    assert result.passed, result.messages


@gpu
@pytest.mark.gpu
def test_ieee_policy_is_near_fp32_on_the_gpu():
    defn, case = _case("seed", 5)
    inputs = generate_inputs(defn, case.axes, seed=4, device="cuda")
    m = compare(fast.forward(*inputs, precision="ieee")[0], reference(*inputs)[0], defn.tolerance)
    assert m.max_abs < 1e-3 and math.isfinite(m.max_abs)


# --------------------------------------------------------------------------- CUDA graph replay
def _graph_replay_properties() -> dict[str, bool]:
    """Calls of 128 tokens go through fast.GRAPHS: eager, then captured, then replayed.
    Returns which of the replay's promises held."""
    from fuseval.fast._graphs import GraphCache
    defn, case = _case("seed", 0)
    assert case.axes["batch_size"] * case.axes["seq_len"] <= fast.GRAPH_MAX_TOKENS
    inputs = generate_inputs(defn, case.axes, seed=8, device="cuda")
    fast.GRAPHS.clear()
    first = fast.forward(*inputs)[0]
    captures = fast.GRAPHS.captures
    second = fast.forward(*inputs)[0]
    third = fast.forward(*inputs)[0]
    kept = third.clone()
    inputs[0].mul_(-0.5)                                   # changed in place: same address
    changed = fast.forward(*inputs)[0]
    other = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    other[0].normal_()                                     # a new tensor of the same shape
    fresh = fast.forward(*other)[0]
    fast.GRAPHS.clear()
    ok = lambda out, ins: compare(out, reference(*ins)[0], defn.tolerance).passed
    return {
        "captured_once": fast.GRAPHS.captures == captures + 1 and isinstance(fast.GRAPHS, GraphCache),
        "replay_equals_eager": torch.equal(first, second) and torch.equal(second, third),
        "earlier_result_kept": torch.equal(third, kept),
        "reads_changed_input": ok(changed, inputs),
        "reads_other_input": ok(fresh, other),
    }


@gpu
@pytest.mark.gpu
def test_graph_replay_is_the_eager_computation():
    assert _graph_replay_properties() == dict.fromkeys(
        ["captured_once", "replay_equals_eager", "earlier_result_kept", "reads_changed_input",
         "reads_other_input"], True)


@gpu
@pytest.mark.gpu
def test_graph_replay_mutants_are_caught(monkeypatch):
    """Mutants: outputs returned without a clone (the next replay overwrites a kept result),
    and a key without addresses (a replay reads the tensors of the captured call)."""
    from fuseval.fast._graphs import GraphCache
    monkeypatch.setattr(fast, "GRAPHS", GraphCache(clone_outputs=False))
    assert not _graph_replay_properties()["earlier_result_kept"]
    monkeypatch.setattr(fast, "GRAPHS", GraphCache())
    monkeypatch.setattr(fast, "tensor_key", lambda ts: tuple(tuple(t.shape) for t in ts))
    assert not _graph_replay_properties()["reads_other_input"]


# --------------------------------------------------------------------------- Gluon GEMM (sm_90)
def _gluon_gemm_error(kind: str, swap_gate_up: bool = False) -> float:
    """Max abs error of the Gluon kernel against a float64 product of the operands truncated
    to TF32 (as the tensor cores read them), on a ragged M; output poisoned with NaN."""
    dev = torch.device("cuda")
    M, K, N = 300, 512, 768
    a = torch.randn(M, K, device=dev)
    w1, w2 = (torch.randn(N, K, device=dev) / math.sqrt(K) for _ in range(2))
    res = torch.randn(M, N, device=dev)
    out = torch.full((M, N), float("nan"), device=dev)
    trunc = lambda t: (t.view(torch.int32) & -8192).view(torch.float32).double()
    g, u = trunc(a) @ trunc(w1).T, trunc(a) @ trunc(w2).T
    if kind == "gate_up":
        c = fast.GemmConfig(128, 128, 32, 8, 4, GROUP_M=16, gluon=True)
        first, second = (w2, w1) if swap_gate_up else (w1, w2)
        fast.launch_gate_up(a, first, second, out, c, "tf32", fuse_act=True)
        expected = g * torch.sigmoid(g) * u
    else:
        c = fast.GemmConfig(128, 256, 32, 8, 3, GROUP_M=16, gluon=True)
        fast.launch_residual_gemm(a, w1, res, out, c, "tf32")
        expected = res.double() + g
    return float((out.double() - expected).abs().max())


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["gate_up", "residual"])
def test_gluon_gemm_matches_the_truncated_product(kind):
    assert _gluon_gemm_error(kind) < 1e-4


@gpu
@pytest.mark.gpu
def test_gluon_gemm_check_catches_gate_and_up_swapped():
    assert _gluon_gemm_error("gate_up", swap_gate_up=True) > 1e-2


# --------------------------------------------------------------------------- Gluon attention (sm_90)
def _attention_errors(tuning_cfg, B=2, S=333, shift_keys=False):
    """Max abs error of one attention launch (``tuning_cfg``) against float64 causal GQA
    attention of the same q', k', V^T, on a ragged batch (tiles straddle the sequence end
    and the causal diagonal); output poisoned with NaN. ``shift_keys``: the kernel gets V^T
    with its keys rolled by one (a broken input the check must notice)."""
    dev = torch.device("cuda")
    sh = fast.Shape(B=B, S=S, H=3584, Hq=28, Hkv=4, D=128, I=18944)
    tf32 = lambda t: (t.view(torch.int32) + 0x1000 & -8192).view(torch.float32)   # exact in TF32
    qk = tf32(torch.randn(sh.M, sh.QD + sh.KD, device=dev))
    v = tf32(torch.randn(B, sh.Hkv, sh.D, S, device=dev))
    vt = torch.zeros(B, sh.Hkv, sh.D, sh.S_pad, device=dev)
    vt[..., :S] = torch.roll(v, 1, dims=-1) if shift_keys else v
    out = torch.full((sh.M, sh.QD), float("nan"), device=dev)
    plan = fast.plan_for(sh, dev, "tf32", tuning={"attention": tuning_cfg})
    fast.launch_attention(qk, vt, out, sh, plan)
    q = qk[:, :sh.QD].double().view(B, S, sh.Hq, sh.D).transpose(1, 2)
    k = qk[:, sh.QD:].double().view(B, S, sh.Hkv, sh.D).transpose(1, 2).repeat_interleave(sh.G, 1)
    vv = v.double().transpose(-1, -2).repeat_interleave(sh.G, 1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(sh.D)
    scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool, device=dev).triu(1), float("-inf"))
    expected = (torch.softmax(scores, -1) @ vv).transpose(1, 2).reshape(sh.M, sh.QD)
    return float((out.double() - expected).abs().max())


GLUON_ATTENTION = [fast.AttnConfig(64, 64, 4, 1, gluon=True), fast.AttnConfig(64, 32, 4, 2, gluon=True),
                   fast.AttnConfig(128, 64, 8, 2, gluon=True)]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", GLUON_ATTENTION, ids=lambda c: f"{c.BM}x{c.BN}w{c.num_warps}s{c.num_stages}")
@pytest.mark.parametrize("B,S", [(2, 333), (1, 1000), (3, 37)])
def test_gluon_attention_matches_float64_attention(cfg, B, S):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon kernel targets sm_90")
    err = _attention_errors(cfg, B, S)
    # the Triton kernel on the same inputs sets the scale of TF32 rounding (P is rounded)
    triton_err = _attention_errors(fast.AttnConfig(64, 64, 4, 3, True), B, S)
    assert err < 2e-3 and err <= 1.5 * triton_err + 1e-4, (err, triton_err)


@gpu
@pytest.mark.gpu
def test_gluon_attention_check_catches_shifted_keys():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon kernel targets sm_90")
    assert _attention_errors(GLUON_ATTENTION[0], shift_keys=True) > 1e-1
