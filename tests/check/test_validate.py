"""Tests for fuseval.validate: bind_axes reads every axis off the inputs and rejects bad
inputs with a ValueError naming the input, what was expected and what was given;
check_outputs_shape lists problems with an implementation's outputs."""
from __future__ import annotations

import pytest
import torch

from fuseval.operators import load
from fuseval.inputs import generate_inputs
from fuseval.validate import bind_axes, check_outputs_shape

OP_A = "qwen2vl_decoder_layer"
OP_B = "nvfp4_qkv_rope"


CUDA = torch.cuda.is_available()

AXES_A = {"batch_size": 2, "seq_len": 6, "kv_seq_len": 6}
AXES_B = {"batch_size": 2, "seq_len": 6}


def fresh(op, axes, config="small"):
    d = load(op, config)
    return d, generate_inputs(d, axes, seed=0)


def raises_naming(defn, inputs, *needles, **kw):
    """bind_axes must raise ValueError whose message contains every needle."""
    with pytest.raises(ValueError) as e:
        bind_axes(defn, inputs, **kw)
    msg = str(e.value)
    for needle in needles:
        assert needle in msg, f"{needle!r} missing from: {msg}"
    return msg


# ------------------------------------------------------------------ valid inputs
def test_valid_inputs_bind_every_axis_op_a():
    d, x = fresh(OP_A, AXES_A)
    assert bind_axes(d, x) == {"batch_size": 2, "seq_len": 6, "kv_seq_len": 6, "hidden_size": 64,
                               "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
                               "intermediate_size": 96, "num_rope_dims": 3, "qkv_dim": 64, "kv_dim": 32}


def test_valid_inputs_bind_every_axis_op_b():
    d, x = fresh(OP_B, AXES_B)
    assert bind_axes(d, x) == {"batch_size": 2, "seq_len": 6, "hidden_size": 64,
                               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                               "q_size": 64, "kv_size": 32, "hidden_blocks": 4, "hidden_size_half": 32}


def test_const_axes_are_read_off_the_shapes_of_any_config():
    """The seed definition validates a scaled-down configuration's inputs (the reference
    is always called with the seed definition)."""
    d_tiny, x = fresh(OP_A, {"batch_size": 1, "seq_len": 3, "kv_seq_len": 3}, config="tiny")
    bound = bind_axes(load(OP_A), x)
    assert (bound["hidden_size"], bound["intermediate_size"], bound["num_heads"]) == (32, 48, 4)
    # ... unless the configuration's const axes are required
    msg = raises_naming(load(OP_A, "small"), x, "hidden_states", "32", "64", expect_consts=True)
    assert "hidden_size" in msg


def test_scalar_eps_may_be_a_one_element_tensor():
    d, x = fresh(OP_A, AXES_A)
    x[-1] = torch.tensor(1e-6)
    assert bind_axes(d, x)["hidden_size"] == 64


# ------------------------------------------------------------------ errors
def test_wrong_number_of_inputs():
    d, x = fresh(OP_A, AXES_A)
    msg = raises_naming(d, x[:-1], "16", "15")
    assert "rms_norm_eps" in msg
    raises_naming(d, x + [1.0], "16", "17")


@pytest.mark.parametrize("name, bad_shape, needles", [
    ("q_proj_weight", (64, 65), ["q_proj_weight", "64", "65"]),           # hidden_size mismatch
    ("input_layernorm_weight", (63,), ["input_layernorm_weight", "64", "63"]),
    ("hidden_states", (2, 6), ["hidden_states", "3 dims", "(2, 6)"]),      # wrong rank
    ("down_proj_weight", (64, 95), ["down_proj_weight", "96", "95"]),     # intermediate mismatch
    ("q_proj_bias", (48,), ["'q_proj_bias'", "48", "64"]),                 # qkv_dim mismatch
    ("q_proj_weight", (48, 64), ["'q_proj_weight'", "48", "64"]),          # ... in the first input
    ("o_proj_weight", (64, 80), ["'o_proj_weight'", "80", "64"]),
    ("k_proj_weight", (16, 64), ["'k_proj_weight'", "16", "32"]),          # kv_dim mismatch
    ("rope_sin", (3, 2, 6, 8), ["rope_sin", "16", "8"]),                   # head_dim mismatch
])
def test_wrong_shape_names_input_expected_and_given(name, bad_shape, needles):
    d, x = fresh(OP_A, AXES_A)
    i = d.input_index(name)
    x[i] = torch.zeros(bad_shape, dtype=x[i].dtype)
    raises_naming(d, x, *needles)


def test_rope_tables_must_have_three_position_axes():
    d, x = fresh(OP_A, AXES_A)
    x[9], x[10] = x[9][:1].contiguous(), x[10][:1].contiguous()   # [1, B, S, D]
    raises_naming(d, x, "num_rope_dims", "rope_cos", "3")


@pytest.mark.parametrize("op, axes, name, bad_dtype", [
    (OP_A, AXES_A, "hidden_states", torch.float64),
    (OP_A, AXES_A, "o_proj_weight", torch.bfloat16),
    (OP_B, AXES_B, "hidden_states", torch.float32),
    (OP_B, AXES_B, "k_proj_scale", torch.uint8),
    (OP_B, AXES_B, "v_proj_weight_fp4", torch.int8),
])
def test_wrong_dtype_names_input_expected_and_given(op, axes, name, bad_dtype):
    d, x = fresh(op, axes)
    i = d.input_index(name)
    want = x[i].dtype
    x[i] = torch.zeros(x[i].shape, dtype=bad_dtype)
    raises_naming(d, x, repr(name), str(want), str(bad_dtype))


def test_non_tensor_input():
    d, x = fresh(OP_B, AXES_B)
    x[1] = x[1].tolist()
    raises_naming(d, x, "'cos'", "Tensor", "list")


def test_kv_seq_len_below_seq_len_names_both_values():
    d = load(OP_A, "small")
    x = generate_inputs(d, AXES_A, seed=0)
    other = generate_inputs(d, {"batch_size": 2, "seq_len": 4, "kv_seq_len": 4}, seed=0)
    x[9], x[10] = other[9], other[10]            # rope tables for 4 positions, tokens for 6
    raises_naming(d, x, "kv_seq_len=4", "seq_len=6")


def test_rope_tables_longer_than_the_tokens_bind():
    d = load(OP_A, "small")
    x = generate_inputs(d, AXES_A, seed=0)
    other = generate_inputs(d, {"batch_size": 2, "seq_len": 9, "kv_seq_len": 9}, seed=0)
    x[9], x[10] = other[9], other[10]            # rope tables for 9 positions, tokens for 6
    assert bind_axes(d, x)["kv_seq_len"] == 9


@pytest.mark.parametrize("name, width", [("q_proj_weight_fp4", 31), ("k_proj_weight_fp4", 64),
                                          ("v_proj_weight_fp4", 33)])
def test_fp4_packed_width_mismatch(name, width):
    d, x = fresh(OP_B, AXES_B)
    i = d.input_index(name)
    x[i] = torch.zeros((x[i].shape[0], width), dtype=torch.uint8)
    raises_naming(d, x, repr(name), str(width), "32")


def test_fp8_scale_width_mismatch():
    d, x = fresh(OP_B, AXES_B)
    i = d.input_index("q_proj_scale")
    x[i] = torch.zeros((64, 5), dtype=torch.uint8).view(torch.float8_e4m3fn)
    raises_naming(d, x, "'q_proj_scale'", "5", "4")


def test_fp4_row_count_mismatch_between_weight_and_scale():
    d, x = fresh(OP_B, AXES_B)
    i = d.input_index("k_proj_scale")
    x[i] = torch.zeros((48, 4), dtype=torch.uint8).view(torch.float8_e4m3fn)
    raises_naming(d, x, "'k_proj_scale'", "48", "32")


def test_hidden_size_not_a_multiple_of_16_is_rejected():
    d = load(OP_B, "small")
    x = generate_inputs(load(OP_B, {"hidden_size": 64, "num_attention_heads": 4,
                                    "num_key_value_heads": 2, "head_dim": 16}), AXES_B)
    # shrink hidden to 40 consistently everywhere except the 16-block rule
    x[0] = x[0][..., :40].contiguous()
    for p in range(3):
        x[3 + 3 * p] = x[3 + 3 * p][:, :20].contiguous()
        x[4 + 3 * p] = x[4 + 3 * p][:, :2].contiguous()
    with pytest.raises(ValueError) as e:
        bind_axes(d, x)
    assert "hidden" in str(e.value) and "40" in str(e.value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("op, axes, name", [(OP_A, AXES_A, "hidden_states"),
                                            (OP_A, AXES_A, "gate_proj_weight"),
                                            (OP_B, AXES_B, "cos"),
                                            (OP_B, AXES_B, "k_norm_weight")])
def test_nonfinite_float_input_names_the_input(op, axes, name, value):
    d, x = fresh(op, axes)
    i = d.input_index(name)
    x[i] = x[i].clone()
    x[i].view(-1)[3] = value
    raises_naming(d, x, repr(name), "finite", "1 NaN/Inf")
    # the check can be switched off (run_case validates shapes only)
    bind_axes(d, x, check_values=False)


def test_nan_scale_code_is_a_legal_value():
    """e4m3 has a NaN code; a scale tensor holding it is a value of the format, not bad input."""
    d, x = fresh(OP_B, AXES_B)
    i = d.input_index("q_proj_scale")
    raw = x[i].view(torch.uint8).clone()
    raw[0, 0] = 0x7F
    x[i] = raw.view(torch.float8_e4m3fn)
    assert bind_axes(d, x)["hidden_size"] == 64


@pytest.mark.parametrize("bad, needles", [
    (torch.tensor([1e-6, 1e-6]), ["rms_norm_eps", "scalar", "(2,)"]),
    (torch.zeros(1, 3), ["rms_norm_eps", "scalar", "(1, 3)"]),
    ("1e-6", ["rms_norm_eps", "scalar", "str"]),
    (None, ["rms_norm_eps", "scalar", "NoneType"]),
    (float("nan"), ["rms_norm_eps", "finite", "nan"]),
])
def test_non_scalar_eps(bad, needles):
    d, x = fresh(OP_A, AXES_A)
    x[-1] = bad
    raises_naming(d, x, *needles)


def test_non_scalar_global_decode_scale():
    d, x = fresh(OP_B, AXES_B)
    i = d.input_index("v_proj_global_decode_scale")
    x[i] = torch.ones(4)
    raises_naming(d, x, "v_proj_global_decode_scale", "scalar", "(4,)")


def test_device_mix_without_cuda_via_meta_device():
    """A second device is always available as 'meta': mixing devices is rejected naming
    both inputs and both devices."""
    d, x = fresh(OP_A, AXES_A)
    x[2] = x[2].to("meta")
    raises_naming(d, x, "'q_proj_weight'", "meta", "'hidden_states'", "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("op, axes, index", [(OP_A, AXES_A, 4), (OP_B, AXES_B, 3)])
def test_device_mix_cuda(op, axes, index):
    d, x = fresh(op, axes)
    name = d.input_names[index]
    x = [t.cuda() if isinstance(t, torch.Tensor) else t for t in x]
    x[index] = x[index].cpu()
    raises_naming(d, x, repr(name), "cpu", "cuda")
    # all on the GPU is fine
    x[index] = x[index].cuda()
    assert bind_axes(d, x)["batch_size"] == 2


# ------------------------------------------------------------------ outputs
def test_check_outputs_shape_reports_count_shape_dtype_and_type():
    d = load(OP_B, "small")
    bound = d.resolve_axes(AXES_B)
    good = [torch.zeros(2, 4, 6, 16, dtype=torch.bfloat16), torch.zeros(2, 2, 6, 16, dtype=torch.bfloat16),
            torch.zeros(2, 2, 6, 16, dtype=torch.bfloat16)]
    assert check_outputs_shape(d, tuple(good), bound) == []
    assert check_outputs_shape(d, list(good), bound) == []
    (msg,) = check_outputs_shape(d, tuple(good[:2]), bound)
    assert "2 outputs" in msg and "3" in msg
    bad = [good[0].float(), good[1][:, :1], "x"]
    msgs = check_outputs_shape(d, bad, bound)
    assert any("query_states" in m and "float32" in m and "bfloat16" in m for m in msgs)
    assert any("key_states" in m and "(2, 1, 6, 16)" in m and "(2, 2, 6, 16)" in m for m in msgs)
    assert any("value_states" in m and "str" in m for m in msgs)
    (msg,) = check_outputs_shape(d, None, bound)
    assert "NoneType" in msg
    a = load(OP_A, "small")
    ba = a.resolve_axes(AXES_A)
    assert check_outputs_shape(a, torch.zeros(2, 6, 64), ba) == []     # a bare tensor for one output
