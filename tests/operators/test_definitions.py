"""Tests for fuseval.definitions (operators as data) and ``fuseval export``.

Every expected value below is copied from /work/shared/SPEC.md (the operators' semantics,
inputs, outputs, stages, tolerances and the 16 benchmark cases), never read back from the
JSON files under test.
"""
from __future__ import annotations

import json

import pytest
import torch

from fuseval import cli
from fuseval.definitions import AxisSpec, Case, Definition, StageSpec, TensorSpec, Tolerance, evaluate_expression, parse_selection
from fuseval.operators import load, names
from fuseval.refimpl import stages as st

OP_A = "qwen2vl_decoder_layer"
OP_B = "nvfp4_qkv_rope"


# ------------------------------------------------------------------ SPEC.md, transcribed
# Op A cases as (kv_seq_len, seq_len, batch), op B as (seq_len, batch).
SPEC_CASES_A = [(128, 128, 1), (128, 128, 4), (128, 128, 16), (128, 128, 32), (128, 128, 64),
                (131, 131, 1), (256, 256, 2), (256, 256, 8), (256, 256, 32), (373, 373, 8),
                (512, 512, 8), (1024, 1024, 1), (1571, 1571, 2), (2048, 2048, 1),
                (4096, 4096, 1), (8192, 8192, 1)]
SPEC_CASES_B = [(128, 2), (128, 4), (128, 32), (256, 8), (256, 16), (512, 1), (512, 2), (512, 4),
                (1024, 1), (1024, 8), (2048, 1), (2048, 2), (4096, 1), (4096, 2), (4096, 4),
                (8192, 1)]

SPEC_CONST_A = {"hidden_size": 3584, "num_heads": 28, "num_kv_heads": 4, "head_dim": 128,
                "intermediate_size": 18944, "num_rope_dims": 3}
SPEC_CONST_B = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
                "head_dim": 128}

# (name, dtype, numeric shape at the seed sizes for B=2, S=5); H=3584, qkv=28*128=3584,
# kv=4*128=512, I=18944
B_, S_ = 2, 5
SPEC_INPUTS_A = [
    ("hidden_states", "float32", (B_, S_, 3584)),
    ("input_layernorm_weight", "float32", (3584,)),
    ("q_proj_weight", "float32", (3584, 3584)),
    ("q_proj_bias", "float32", (3584,)),
    ("k_proj_weight", "float32", (512, 3584)),
    ("k_proj_bias", "float32", (512,)),
    ("v_proj_weight", "float32", (512, 3584)),
    ("v_proj_bias", "float32", (512,)),
    ("o_proj_weight", "float32", (3584, 3584)),
    ("rope_cos", "float32", (3, B_, S_, 128)),
    ("rope_sin", "float32", (3, B_, S_, 128)),
    ("post_attention_layernorm_weight", "float32", (3584,)),
    ("gate_proj_weight", "float32", (18944, 3584)),
    ("up_proj_weight", "float32", (18944, 3584)),
    ("down_proj_weight", "float32", (3584, 18944)),
    ("rms_norm_eps", "float32", None),
]
SPEC_OUTPUTS_A = [("output", "float32", (B_, S_, 3584))]
# op B: q_size = 4096, kv_size = 1024, hidden/16 = 256, hidden/2 = 2048
SPEC_INPUTS_B = [
    ("hidden_states", "bfloat16", (B_, S_, 4096)),
    ("cos", "bfloat16", (B_, S_, 128)),
    ("sin", "bfloat16", (B_, S_, 128)),
    ("q_proj_weight_fp4", "float4_e2m1fn_x2", (4096, 2048)),
    ("q_proj_scale", "float8_e4m3fn", (4096, 256)),
    ("q_proj_global_decode_scale", "float32", None),
    ("k_proj_weight_fp4", "float4_e2m1fn_x2", (1024, 2048)),
    ("k_proj_scale", "float8_e4m3fn", (1024, 256)),
    ("k_proj_global_decode_scale", "float32", None),
    ("v_proj_weight_fp4", "float4_e2m1fn_x2", (1024, 2048)),
    ("v_proj_scale", "float8_e4m3fn", (1024, 256)),
    ("v_proj_global_decode_scale", "float32", None),
    ("q_norm_weight", "bfloat16", (128,)),
    ("k_norm_weight", "bfloat16", (128,)),
    ("rms_norm_eps", "float32", None),
]
SPEC_OUTPUTS_B = [("query_states", "bfloat16", (B_, 32, S_, 128)),
                  ("key_states", "bfloat16", (B_, 8, S_, 128)),
                  ("value_states", "bfloat16", (B_, 8, S_, 128))]

SPEC_STAGES_A = ["input_norm", "qkv_proj", "mrope", "attention", "o_proj", "post_norm",
                 "gate_up", "act", "down", "residual"]
SPEC_STAGES_B = ["act_quant", "dequant", "proj", "qk_norm", "rope", "layout"]
# SPEC.md: op A's atol per (kv_seq_len, seq_len, batch) case, from the benchmark's workload file
SPEC_ATOL_A = {(128, 128, 1): 0.0040, (128, 128, 4): 0.0045, (128, 128, 16): 0.0049,
               (128, 128, 32): 0.0048, (128, 128, 64): 0.0046, (131, 131, 1): 0.0037,
               (256, 256, 2): 0.0040, (256, 256, 8): 0.0049, (256, 256, 32): 0.0045,
               (373, 373, 8): 0.0042, (512, 512, 8): 0.0045, (1024, 1024, 1): 0.0040,
               (1571, 1571, 2): 0.0038, (2048, 2048, 1): 0.0043, (4096, 4096, 1): 0.0044,
               (8192, 8192, 1): 0.0040}


def _var_binding(op: str, case: tuple[int, ...]) -> dict[str, int]:
    if op == OP_A:
        kv, s, b = case
        return {"kv_seq_len": kv, "seq_len": s, "batch_size": b}
    s, b = case
    return {"seq_len": s, "batch_size": b}


# ------------------------------------------------------------------ loading
def test_the_registry_names_both_seed_operators():
    assert set(names()) >= {OP_A, OP_B}


@pytest.mark.parametrize("op, consts, inputs, outputs, stage_names", [
    (OP_A, SPEC_CONST_A, SPEC_INPUTS_A, SPEC_OUTPUTS_A, SPEC_STAGES_A),
    (OP_B, SPEC_CONST_B, SPEC_INPUTS_B, SPEC_OUTPUTS_B, SPEC_STAGES_B),
])
def test_operator_loads_into_typed_objects_matching_spec(op, consts, inputs, outputs, stage_names):
    d = load(op)
    assert isinstance(d, Definition)
    assert d.name == op and d.config == "seed"
    assert all(isinstance(a, AxisSpec) for a in d.axes.values())
    assert all(isinstance(s, TensorSpec) for s in d.inputs + d.outputs)
    assert all(isinstance(s, StageSpec) for s in d.stages)
    assert isinstance(d.tolerance, Tolerance)
    assert d.const_axes == consts
    # inputs and outputs: names, order, dtypes and (evaluated) shapes as SPEC.md lists them
    bound = d.resolve_axes(_var_binding(op, (S_, S_, B_) if op == OP_A else (S_, B_)))
    assert [(s.name, s.dtype, d.shape_of(s, bound)) for s in d.inputs] == inputs
    assert [(s.name, s.dtype, d.shape_of(s, bound)) for s in d.outputs] == outputs
    assert d.input_names == [n for n, _, _ in inputs]
    assert d.output_names == [n for n, _, _ in outputs]
    # scalars are scalars, eps has its fixed value
    eps = d.inputs[d.input_index("rms_norm_eps")]
    assert eps.is_scalar and eps.value == pytest.approx(1e-6, rel=0, abs=0)
    assert d.stage_names == stage_names


def test_op_a_mlp_substages_have_parent_mlp():
    d = load(OP_A)
    parents = {s.name: s.parent for s in d.stages}
    assert parents["gate_up"] == parents["act"] == parents["down"] == "mlp"
    assert parents["input_norm"] is None and parents["residual"] is None


@pytest.mark.parametrize("op, expected", [
    (OP_A, dict(atol=4e-3, rtol=1e-5, min_matched_ratio=0.99, max_abs_error=None, max_error_ratio=64.0,
                max_rms_ratio=2.0)),
    (OP_B, dict(atol=5e-3, rtol=2e-2, min_matched_ratio=0.99, max_abs_error=None, max_error_ratio=64.0,
                max_rms_ratio=2.0)),
])
def test_tolerance_is_the_spec_rule(op, expected):
    """The ratio in force is the evaluator's default 0.99 (op A's workload file spells the
    key required_match_ratio, which the evaluator ignores); op B has no max-abs cap. Both
    carry fuseval's own bounds (the defaults), which the benchmark's rules never apply."""
    assert load(op).tolerance == Tolerance(**expected)
    for c in load(op).cases():
        want = dict(expected, atol=SPEC_ATOL_A[tuple(c.axes[k] for k in ("kv_seq_len", "seq_len",
                                                                          "batch_size"))]) \
            if op == OP_A else expected
        assert c.tolerance == Tolerance(**want), c


@pytest.mark.parametrize("config", ["small", "tiny"])
def test_scaled_down_cases_keep_their_seed_cases_tolerance(config):
    seed, small = load(OP_A).cases(), load(OP_A, config).cases()
    assert [c.tolerance for c in small] == [c.tolerance for c in seed]
    assert len({c.tolerance.atol for c in small}) > 1


@pytest.mark.parametrize("op, spec_cases", [(OP_A, SPEC_CASES_A), (OP_B, SPEC_CASES_B)])
def test_sixteen_cases_match_spec(op, spec_cases):
    d = load(op)
    cases = d.cases()
    assert len(cases) == 16
    assert [c.index for c in cases] == list(range(16))
    assert all(isinstance(c, Case) for c in cases)
    assert [dict(c.axes) for c in cases] == [_var_binding(op, c) for c in spec_cases]
    # every case binds exactly the var axes and satisfies the constraints
    for c in cases:
        assert set(c.axes) == set(d.var_axes)
        d.resolve_axes(c.axes)


def test_expression_axes_evaluate_to_spec_values():
    a = load(OP_A).resolve_axes({"batch_size": 1, "seq_len": 7, "kv_seq_len": 7})
    assert (a["qkv_dim"], a["kv_dim"]) == (28 * 128, 4 * 128)
    b = load(OP_B).resolve_axes({"batch_size": 1, "seq_len": 7})
    assert (b["q_size"], b["kv_size"], b["hidden_blocks"], b["hidden_size_half"]) == (4096, 1024, 256, 2048)


@pytest.mark.parametrize("op", [OP_A, OP_B])
def test_every_stage_shape_evaluates_for_a_binding(op):
    """Stage shapes are written in axis expressions; each must be computable (the budget
    and the tap layouts rely on them)."""
    for config in ("seed", "small"):
        d = load(op, config)
        bound = d.resolve_axes(d.cases()[0].axes)
        for s in d.stages:
            shape = tuple(int(evaluate_expression(e, bound)) for e in s.shape)
            assert all(n > 0 for n in shape), (s.name, shape)


def test_stage_layouts_at_seed_sizes_are_the_documented_ones():
    b, s = 2, 3
    a = load(OP_A)
    bound = a.resolve_axes({"batch_size": b, "seq_len": s, "kv_seq_len": s})
    got = {st_.name: tuple(evaluate_expression(e, bound) for e in st_.shape) for st_ in a.stages}
    H, qkv, kv, I = 3584, 3584, 512, 18944
    assert got == {"input_norm": (b, s, H), "qkv_proj": (b, s, qkv + 2 * kv), "mrope": (b, s, qkv + kv),
                   "attention": (b, s, qkv), "o_proj": (b, s, H), "post_norm": (b, s, H),
                   "gate_up": (b, s, 2 * I), "act": (b, s, I), "down": (b, s, H), "residual": (b, s, H)}
    d = load(OP_B)
    bound = d.resolve_axes({"batch_size": b, "seq_len": s})
    got = {st_.name: tuple(evaluate_expression(e, bound) for e in st_.shape) for st_ in d.stages}
    assert got == {"act_quant": (b, s, 4096), "dequant": (4096 + 2048, 4096), "proj": (b, s, 6144),
                   "qk_norm": (b, s, 5120),
                   "rope": (b, s, 5120), "layout": (b, 32 + 16, s, 128)}


def test_load_unknown_operator_names_it_and_the_known_ones():
    with pytest.raises(ValueError) as e:
        load("no_such_operator")
    assert "no_such_operator" in str(e.value)
    assert OP_A in str(e.value) and OP_B in str(e.value)


def test_load_unknown_config_names_it_and_the_known_ones():
    with pytest.raises(ValueError) as e:
        load(OP_A, "gigantic")
    assert "gigantic" in str(e.value) and "small" in str(e.value)


# ------------------------------------------------------------------ configurations
def test_small_configs_are_scaled_down_and_keep_the_structure():
    a = load(OP_A, "small")
    assert a.config == "small"
    assert a.const_axes == {"hidden_size": 64, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
                            "intermediate_size": 96, "num_rope_dims": 3}
    b = load(OP_B, "small")
    assert b.const_axes == {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                            "head_dim": 16}
    # the seed definition is not modified by building a configuration
    assert load(OP_A).const_axes == SPEC_CONST_A
    assert load(OP_B).const_axes == SPEC_CONST_B


def test_small_config_cases_are_the_spec_cases_scaled():
    # op A small: seq and kv_seq divided by 16 (rounded up), batch by 8 (rounded up), min 1
    a = load(OP_A, "small").cases()
    assert len(a) == 16
    assert dict(a[4].axes) == {"kv_seq_len": 8, "seq_len": 8, "batch_size": 8}       # (128,128,64)
    assert dict(a[5].axes) == {"kv_seq_len": 9, "seq_len": 9, "batch_size": 1}       # (131,131,1)
    assert dict(a[12].axes) == {"kv_seq_len": 99, "seq_len": 99, "batch_size": 1}    # (1571,1571,2)
    assert dict(a[15].axes) == {"kv_seq_len": 512, "seq_len": 512, "batch_size": 1}  # (8192,8192,1)
    assert all(c.axes["kv_seq_len"] == c.axes["seq_len"] for c in a)
    b = load(OP_B, "small").cases()
    assert dict(b[2].axes) == {"seq_len": 8, "batch_size": 8}      # (128, 32)
    assert dict(b[15].axes) == {"seq_len": 512, "batch_size": 1}   # (8192, 1)


@pytest.mark.parametrize("op", [OP_A, OP_B])
def test_every_named_config_satisfies_the_constraints(op):
    d = load(op)
    for name in d.configs:
        c = load(op, name)
        for case in c.cases():
            c.resolve_axes(case.axes)


def test_const_override_builds_a_custom_config():
    overrides = {"hidden_size": 48, "num_heads": 2, "num_kv_heads": 1, "head_dim": 32,
                 "intermediate_size": 40}
    a = load(OP_A, overrides)
    assert a.config == json.dumps(overrides)            # named by its overrides, as given
    assert a.const_axes == {**overrides, "num_rope_dims": 3}
    bound = a.resolve_axes({"batch_size": 2, "seq_len": 3, "kv_seq_len": 3})
    assert (bound["qkv_dim"], bound["kv_dim"]) == (64, 32)
    # a custom config does not scale the cases
    assert [dict(c.axes) for c in a.cases()] == [_var_binding(OP_A, c) for c in SPEC_CASES_A]
    # overrides compose with a named config, and the cache keeps the seed untouched
    s = load(OP_A, "small").with_config({"intermediate_size": 32})
    assert s.const_axes["intermediate_size"] == 32 and s.const_axes["hidden_size"] == 64
    assert load(OP_A).const_axes == SPEC_CONST_A


def test_a_json_object_on_a_named_base_keeps_the_base_case_scaling():
    small = load(OP_B, "small")
    text = 'small+{"hidden_size": 96}'
    d = load(OP_B, text)
    assert d.config == text                                     # named as given
    assert d.const_axes == {**small.const_axes, "hidden_size": 96}
    # the cases are small's: SPEC case 2 (seq 128, batch 32) scaled by 16 and 4
    assert [dict(c.axes) for c in d.cases()] == [dict(c.axes) for c in small.cases()]
    assert dict(d.cases("2")[0].axes) == {"seq_len": 8, "batch_size": 8}
    assert not d.full_size_cases and small.with_config("tiny+{}").case_config == "tiny"
    # the override wins over the base's own value of the same axis
    assert load(OP_B, 'tiny+{"head_dim": 16}').const_axes["head_dim"] == 16


def test_a_bare_json_object_is_the_seed_plus_overrides_with_full_size_cases():
    d = load(OP_B, '{"hidden_size": 96}')
    assert d.config == '{"hidden_size": 96}' and d.full_size_cases
    assert d.const_axes["hidden_size"] == 96 and d.const_axes["head_dim"] == 128
    assert dict(d.cases("2")[0].axes) == {"seq_len": 128, "batch_size": 32}
    # a mapping is the same configuration, named by its JSON text
    assert load(OP_B, {"hidden_size": 96}).config == '{"hidden_size": 96}'


@pytest.mark.parametrize("config, words", [
    ('smal+{"hidden_size": 96}', ["unknown base configuration 'smal'", "small", "tiny"]),
    ('+{"hidden_size": 96}', ["unknown base configuration ''"]),
    ('small+{"hidden_size": 9', ["is not valid JSON", "small+"]),
    ('small+[96]', ["expected a JSON object", "list"]),
    ('small+{"hidden": 96}', ["'hidden' is not a const axis", "hidden_size"]),
    ('small+{"hidden_size": 0}', ["'hidden_size' must be a positive int", "got 0"]),
    ('small+{"hidden_size": true}', ["must be a positive int", "True"]),
    ('small+{"hidden_size": 40}', ["hidden_size % 16 == 0", "hidden_size=40"]),
    ("smaller", ["unknown config 'smaller'", "NAME+{JSON}"]),
])
def test_bad_config_syntax_is_named_in_the_error(config, words):
    with pytest.raises(ValueError) as info:
        load(OP_B, config)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_check_table_header_names_the_config_as_given(capsys):
    rc = cli.main(["check", "--op", OP_B, "--impl", "torch", "--config", 'small+{"hidden_size": 96}',
                   "--cases", "0", "--no-hygiene", "--no-predict", "--in-process"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert 'nvfp4_qkv_rope [small+{"hidden_size": 96}]' in out


def test_check_table_header_says_a_bare_json_config_keeps_the_full_size_cases():
    import io
    from fuseval.check import check
    from fuseval.terminal import print_check_report
    tiny = {"hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8}
    report = check(OP_B, "torch", config=tiny, cases="0", hygiene=False, predict=False)
    assert report.cases[0].axes == {"seq_len": 128, "batch_size": 2}
    out = io.StringIO()
    print_check_report(report, out)
    assert f"[{json.dumps(tiny)}: seed + overrides, full-size cases]" in out.getvalue()


def test_op_b_override_scales_its_derived_axes():
    b = load(OP_B, {"hidden_size": 48, "num_attention_heads": 3, "num_key_value_heads": 1,
                    "head_dim": 8})
    bound = b.resolve_axes({"batch_size": 1, "seq_len": 2})
    assert (bound["q_size"], bound["kv_size"], bound["hidden_blocks"], bound["hidden_size_half"]) == \
        (24, 8, 3, 24)


@pytest.mark.parametrize("head_dim, section", [(128, [16, 24, 24]), (16, [2, 3, 3]), (32, [4, 6, 6]),
                                               (64, [8, 12, 12])])
def test_mrope_section_scales_with_head_dim(head_dim, section):
    """SPEC: section (D/8, 3D/16, 3D/16), summing to D/2."""
    a = load(OP_A, {"head_dim": head_dim})
    bound = a.resolve_axes({"batch_size": 1, "seq_len": 1, "kv_seq_len": 1})
    assert list(a.derived_value("mrope_section", bound)) == section
    assert st.mrope_section(head_dim) == section
    assert sum(section) == head_dim // 2


@pytest.mark.parametrize("op, overrides, constraint, value", [
    (OP_A, {"head_dim": 24}, "head_dim % 16 == 0", "head_dim=24"),
    (OP_A, {"head_dim": 8}, "head_dim % 16 == 0", "head_dim=8"),
    (OP_A, {"num_heads": 6, "num_kv_heads": 4}, "num_heads % num_kv_heads == 0", "num_heads=6"),
    (OP_B, {"hidden_size": 40}, "hidden_size % 16 == 0", "hidden_size=40"),
    (OP_B, {"head_dim": 7}, "head_dim % 2 == 0", "head_dim=7"),
    (OP_B, {"num_attention_heads": 5, "num_key_value_heads": 2},
     "num_attention_heads % num_key_value_heads == 0", "num_attention_heads=5"),
])
def test_bad_override_raises_naming_the_constraint(op, overrides, constraint, value):
    with pytest.raises(ValueError) as e:
        load(op, overrides)
    msg = str(e.value)
    assert constraint in msg and value in msg


def test_op_a_rope_tables_must_have_three_position_axes():
    """mRoPE reads three position axes (t, h, w): a config with another count is invalid."""
    with pytest.raises(ValueError, match="num_rope_dims"):
        load(OP_A, {"num_rope_dims": 2})


@pytest.mark.parametrize("overrides, needle", [
    ({"seq_len": 4}, "seq_len"),            # a var axis
    ({"qkv_dim": 64}, "qkv_dim"),           # an expression axis
    ({"no_such_axis": 1}, "no_such_axis"),
    ({"hidden_size": 0}, "hidden_size"),
    ({"hidden_size": -16}, "hidden_size"),
    ({"hidden_size": 64.0}, "hidden_size"),
])
def test_override_of_non_const_or_non_positive_axis_raises(overrides, needle):
    with pytest.raises(ValueError) as e:
        load(OP_A, overrides)
    assert needle in str(e.value)


# ------------------------------------------------------------------ resolve_axes / selection
def test_resolve_axes_rejects_kv_seq_len_below_seq_len_naming_both_values():
    a = load(OP_A, "small")
    with pytest.raises(ValueError) as e:
        a.resolve_axes({"batch_size": 1, "seq_len": 4, "kv_seq_len": 3})
    assert "kv_seq_len=3" in str(e.value) and "seq_len=4" in str(e.value)
    # longer rope tables than tokens are the benchmark's "kv_seq_len may differ" case
    assert a.resolve_axes({"batch_size": 1, "seq_len": 4, "kv_seq_len": 6})["kv_seq_len"] == 6


def test_resolve_axes_rejects_unknown_and_missing_var_axes():
    a = load(OP_A, "small")
    with pytest.raises(ValueError, match="kv_seq_len"):
        a.resolve_axes({"batch_size": 1, "seq_len": 4})
    with pytest.raises(ValueError, match="hidden_size"):
        a.resolve_axes({"batch_size": 1, "seq_len": 4, "kv_seq_len": 4, "hidden_size": 8})


def test_case_selection():
    d = load(OP_B, "small")
    assert [c.index for c in d.cases("0,3,5-7")] == [0, 3, 5, 6, 7]
    assert [c.index for c in d.cases([2, 15])] == [2, 15]
    assert [c.index for c in d.cases("all")] == list(range(16))
    assert [c.index for c in d.cases(None)] == list(range(16))
    assert parse_selection(" 1 , 4-5 ", 16) == [1, 4, 5]
    with pytest.raises(ValueError, match="16"):
        d.cases("16")
    with pytest.raises(ValueError):
        d.cases([-1])


@pytest.mark.parametrize("selection", ["5-3", "x", "1,,a", "-2"])
def test_bad_case_selection_raises_a_clear_error(selection):
    with pytest.raises(ValueError) as e:
        parse_selection(selection, 16)
    assert "case" in str(e.value)


def test_case_label_lists_the_axes():
    c = load(OP_B).cases()[3]
    assert c.label == "seq_len=256 batch_size=8"


@pytest.mark.parametrize("expression", ["__import__('os')", "head_dim.real", "[x for x in y]",
                                        "lambda: 1", "f(1)"])
def test_axis_expressions_cannot_run_code(expression):
    with pytest.raises(ValueError, match="not allowed"):
        evaluate_expression(expression, {"head_dim": 16})


def test_axis_expression_arithmetic_and_unbound_names():
    assert evaluate_expression("q + 2 * k - n // 3 % 5", {"q": 10, "k": 3, "n": 20}) == 10 + 6 - (20 // 3) % 5
    assert evaluate_expression("a == b", {"a": 2, "b": 2}) is True
    with pytest.raises(KeyError, match="missing_axis"):
        evaluate_expression("missing_axis * 2", {})


# ------------------------------------------------------------------ export
def _read_export(tmp_path, op, *extra):
    rc = cli.main(["export", "--op", op, "--out", str(tmp_path), *extra])
    assert rc == 0
    folder = tmp_path / op
    definition = json.loads((folder / "definition.json").read_text())
    lines = (folder / "workload.jsonl").read_text().splitlines()
    return definition, lines


@pytest.mark.parametrize("op, consts, inputs, outputs, spec_cases", [
    (OP_A, SPEC_CONST_A, SPEC_INPUTS_A, SPEC_OUTPUTS_A, SPEC_CASES_A),
    (OP_B, SPEC_CONST_B, SPEC_INPUTS_B, SPEC_OUTPUTS_B, SPEC_CASES_B),
])
def test_export_writes_solexecbench_definition_and_workloads(tmp_path, capsys, op, consts, inputs,
                                                            outputs, spec_cases):
    definition, lines = _read_export(tmp_path, op)
    assert "16 workloads" in capsys.readouterr().out
    # definition.json
    assert definition["name"] == op
    axes = definition["axes"]
    assert {k: v["value"] for k, v in axes.items() if v["type"] == "const"} == consts
    var_axes = {k for k, v in axes.items() if v["type"] == "var"}
    assert var_axes == set(_var_binding(op, spec_cases[0]))
    assert all("expression" in v for v in axes.values() if v["type"] == "expr")
    assert list(definition["inputs"]) == [n for n, _, _ in inputs]           # order kept
    assert {n: v["dtype"] for n, v in definition["inputs"].items()} == {n: t for n, t, _ in inputs}
    assert definition["inputs"]["rms_norm_eps"]["shape"] is None
    assert list(definition["outputs"]) == [n for n, _, _ in outputs]
    assert definition["inputs"]["hidden_states"]["shape"] == ["batch_size", "seq_len", "hidden_size"]
    assert any("kv_seq_len >= seq_len" in c for c in definition["constraints"]) == (op == OP_A)
    assert definition["tolerance"]["max_atol"] == {OP_A: 4e-3, OP_B: 5e-3}[op]
    assert definition["tolerance"]["required_matched_ratio"] == 0.99
    # workload.jsonl: 16 lines, one per SPEC case, var axes only, eps as a scalar value
    assert len(lines) == 16
    rows = [json.loads(line) for line in lines]
    assert [r["axes"] for r in rows] == [_var_binding(op, c) for c in spec_cases]
    for r in rows:
        assert r["definition"] == op
        assert set(r["axes"]) == var_axes
        assert r["inputs"]["rms_norm_eps"] == {"type": "scalar", "value": 1e-6}
        assert r["inputs"]["hidden_states"] == {"type": "random"}
        assert list(r["inputs"]) == [n for n, _, _ in inputs]
    assert len({r["uuid"] for r in rows}) == 16
    assert [r["tolerance"]["max_atol"] for r in rows] == [c.tolerance.atol for c in load(op).cases()]
    # the key names of the evaluator's ToleranceSpec (an unknown key would be ignored there)
    assert all(set(r["tolerance"]) == {"max_atol", "max_rtol", "required_matched_ratio", "max_error_cap"}
               for r in rows)


def test_export_of_a_small_config_has_scaled_axes(tmp_path):
    definition, lines = _read_export(tmp_path, OP_B, "--config", "small", "--seed", "5")
    assert definition["axes"]["hidden_size"] == {"type": "const", "value": 64}
    rows = [json.loads(line) for line in lines]
    assert rows[15]["axes"] == {"seq_len": 512, "batch_size": 1}
    # each workload records a distinct seed derived from the one given
    assert len({r["seed"] for r in rows}) == 16 and min(r["seed"] for r in rows) == 5


def test_export_unknown_operator_fails_cleanly(tmp_path, capsys):
    from fuseval.errors import EXIT_UNKNOWN_OPERATOR
    rc = cli.main(["export", "--op", "nope", "--out", str(tmp_path)])
    assert rc == EXIT_UNKNOWN_OPERATOR
    err = capsys.readouterr().err
    assert "nope" in err and "Traceback" not in err
